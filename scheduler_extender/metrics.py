"""Every Prometheus metric of the extender, defined once on a registry that is passed in.

Shell. Per-node gauges are kept cheap: the ledger calls ``node_changed(name)`` after each
mutation, which only marks the node dirty; the gauges of dirty nodes are refreshed when
``/metrics`` is scraped. So a permit costs a set insertion, and nothing ever scans every node.
Series of nodes that disappear are removed (``node`` is the only per-object label).

Per-namespace quota gauges (``namespace`` label: as many series as namespaces with VMs or a
quota, which is low) are likewise set at scrape time from ``admission.view.queue_numbers``; a
namespace without a quota exports no quota sample, and a namespace that is gone loses its
series.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from scheduler_extender.admission.view import NamespaceNumbers
from scheduler_extender.core.ledger import Ledger

PREFIX: Final = "vmautoscale_extender_"
# A cache-mode filter or prioritize answers in well under a millisecond: the two lowest
# buckets let histogram_quantile tell 0.1 ms from 0.4 ms.
LATENCY_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
)  # fmt: skip


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.verb_duration = Histogram(
            PREFIX + "verb_duration_seconds",
            "Time to answer one call, by verb (filter, prioritize, bind, preempt, permits).",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.verb_errors = Counter(
            PREFIX + "verb_errors_total",
            "Calls answered with an HTTP error or a bind Error, by verb.",
            ["verb"],
            registry=registry,
        )
        self.permits = Counter(
            PREFIX + "permits_total",
            "Permits answered, by status (granted, partial, denied, released, steady, error).",
            ["status"],
            registry=registry,
        )
        self.permits_short = Counter(
            PREFIX + "permits_short_total",
            "Permits denied or granted in part, by status (denied, partial) and by what held"
            " them back: limit node (the node had no more room) or quota (the namespace's).",
            ["status", "limit"],
            registry=registry,
        )
        self.binds = Counter(
            PREFIX + "binds_total",
            "Bind calls, by outcome (bound, refused, failed).",
            ["outcome"],
            registry=registry,
        )
        self.answers = Counter(
            PREFIX + "answers_total",
            "Filter and prioritize calls of valid pods, by verb and by whether their answer was"
            " kept from an earlier call (result: kept, computed).",
            ["verb", "result"],
            registry=registry,
        )
        self.token_reviews = Counter(
            PREFIX + "token_reviews_total",
            "Tokens new to the extender, by outcome: authenticated, rejected, error (a"
            " TokenReview was sent); throttled, refused_locally (not a JWT for our audience, or"
            " expired: none was).",
            ["outcome"],
            registry=registry,
        )
        self.durable_writes = Counter(
            PREFIX + "durable_writes_total",
            "Writes of permits to pods, by kind (annotations, resize) and outcome.",
            ["kind", "outcome"],
            registry=registry,
        )
        self.durable_pending = Gauge(
            PREFIX + "durable_pending_pods",
            "Pods whose latest permit is not yet written to the API server.",
            registry=registry,
        )
        self.events_dropped = Counter(
            PREFIX + "kube_events_dropped_total",
            "Kubernetes Events (NODE_ALLOC, ScaleUpRecommended) not posted: queue full or API"
            " failed.",
            registry=registry,
        )
        self.synced = Gauge(
            PREFIX + "synced",
            "1 once the first node and pod lists are in (the verbs answer 503 before).",
            registry=registry,
        )
        self.leading = Gauge(
            PREFIX + "leading",
            "1 while this replica holds the extender Lease and decides (always, with one"
            " replica); 0 on the standby.",
            registry=registry,
        )
        self.node_reserved = Gauge(
            PREFIX + "node_reserved_vcpus",
            "vCPUs held on the node by this scheduler's pods.",
            ["node"],
            registry=registry,
        )
        self.node_free = Gauge(
            PREFIX + "node_free_vcpus",
            "vCPUs left on the node after the system reserve and every pod (negative: over).",
            ["node"],
            registry=registry,
        )
        self.foreign_vcpus = Gauge(
            PREFIX + "foreign_vcpus",
            "vCPUs held by pods of other schedulers, all nodes together.",
            registry=registry,
        )
        self.foreign_memory = Gauge(
            PREFIX + "foreign_memory_bytes",
            "Memory held by pods of other schedulers, all nodes together.",
            registry=registry,
        )
        self.recommended_nodes = Gauge(
            PREFIX + "recommended_nodes",
            "Nodes the latest auto-published scale-up recommendation adds, by pool and zone"
            " (0 for the configured pools and zones it leaves alone).",
            ["pool", "zone"],
            registry=registry,
        )
        self.relief_decisions = Counter(
            PREFIX + "relief_decisions_total",
            "Moves relief decided (core.relief), by reason (GrowerToRoom, NeighbourAway,"
            " AboveWatermark, Drain) and outcome: created (its VirtualMachineMigration was"
            " created), exists (one of that name was there already), failed (the create failed).",
            ["reason", "outcome"],
            registry=registry,
        )
        self.relief_drains = Counter(
            PREFIX + "relief_drains_total",
            "Nodes relief started to drain (core.relief), by outcome: tainted (the drain taint"
            " is on the node), failed (the patch failed; tried again on a later pass).",
            ["outcome"],
            registry=registry,
        )
        self.relief_evictions = Counter(
            PREFIX + "relief_evictions_total",
            "Pods a drain evicted through the Eviction API, by outcome: evicted, gone (no such"
            " pod any more), refused (429: a PodDisruptionBudget allows no disruption now),"
            " failed (any other error); refused and failed ones are tried again later.",
            ["outcome"],
            registry=registry,
        )
        self.relief_nodes_emptied = Gauge(
            PREFIX + "relief_nodes_emptied",
            "Drained nodes the last relief pass found empty (DaemonSet and mirror pods aside):"
            " the cloud's to remove.",
            registry=registry,
        )
        self.relief_unrelieved = Gauge(
            PREFIX + "relief_unrelieved_vms",
            "VMs whose grow their node cut short and that the last relief pass moved nothing for.",
            registry=registry,
        )
        self.recommendations = Counter(
            PREFIX + "recommendations_total",
            "Scale-up recommendations computed, by trigger (auto, request) and outcome"
            " (published, failed).",
            ["trigger", "outcome"],
            registry=registry,
        )
        self.quota_vcpus = Gauge(
            PREFIX + "quota_vcpus",
            "The namespace's vCPU quota for pods of this scheduler (no sample: unlimited).",
            ["namespace"],
            registry=registry,
        )
        self.quota_memory = Gauge(
            PREFIX + "quota_memory_bytes",
            "The namespace's memory quota for pods of this scheduler (no sample: unlimited).",
            ["namespace"],
            registry=registry,
        )
        self.quota_used_vcpus = Gauge(
            PREFIX + "quota_used_vcpus",
            "vCPUs the namespace's pods of this scheduler hold or have been admitted for.",
            ["namespace"],
            registry=registry,
        )
        self.quota_used_memory = Gauge(
            PREFIX + "quota_used_memory_bytes",
            "Memory the namespace's pods of this scheduler hold or have been admitted for.",
            ["namespace"],
            registry=registry,
        )
        self.queue_length = Gauge(
            PREFIX + "queue_length",
            "Pods of this scheduler waiting for their namespace's quota.",
            ["namespace"],
            registry=registry,
        )
        self._namespaces: set[str] = set()
        # The labelled children of the two verb metrics, by verb: ``labels()`` looks them up
        # under a lock on every call, and every call of every verb records both.
        self._verb_children: dict[str, tuple[Histogram, Counter]] = {}
        # ``answers``' children by (verb, is kept), bound once for the same reason.
        self.answer_children: Final = {
            (verb, is_kept): self.answers.labels(verb, "kept" if is_kept else "computed")
            for verb in ("filter", "prioritize")
            for is_kept in (True, False)
        }
        self._dirty: set[str] = set()
        self._foreign_cpu_by_node: dict[str, int] = {}
        self._foreign_mem_by_node: dict[str, int] = {}

    def observe_verb(self, verb: str, seconds: float, *, is_error: bool) -> None:
        children = self._verb_children.get(verb)
        if children is None:
            children = (self.verb_duration.labels(verb), self.verb_errors.labels(verb))
            self._verb_children[verb] = children
        children[0].observe(seconds)
        if is_error:
            children[1].inc()

    @property
    def node_changed(self) -> Callable[[str], None]:
        """A ledger listener, called on every mutation: the set's own ``add`` (C, no frame)."""
        return self._dirty.add

    def refresh(self, ledger: Ledger) -> None:
        """Bring the per-node gauges of the nodes changed since the last scrape up to date."""
        dirty = self._dirty.copy()
        self._dirty.clear()  # not rebound: ``node_changed`` is this set's ``add``
        for name in dirty:
            state = ledger.nodes.get(name)
            if state is None:
                for gauge in (self.node_reserved, self.node_free):
                    # KeyError: never exported, the node came and went between two scrapes.
                    with contextlib.suppress(KeyError):
                        gauge.remove(name)
                self._foreign_cpu_by_node.pop(name, None)
                self._foreign_mem_by_node.pop(name, None)
                continue
            self.node_reserved.labels(name).set(state.own_total.cpu_millis / 1000)
            self.node_free.labels(name).set(state.free.cpu_millis / 1000)
            self._foreign_cpu_by_node[name] = state.foreign_total.cpu_millis
            self._foreign_mem_by_node[name] = state.foreign_total.memory_bytes
        if dirty:
            self.foreign_vcpus.set(sum(self._foreign_cpu_by_node.values()) / 1000)
            self.foreign_memory.set(sum(self._foreign_mem_by_node.values()))

    def refresh_namespaces(self, numbers: list[NamespaceNumbers]) -> None:
        """Set the per-namespace gauges; drop the series of namespaces no longer listed."""
        seen: set[str] = set()
        for n in numbers:
            name = n.namespace
            seen.add(name)
            if n.quota_cpu_millis is None or n.quota_memory_bytes is None:
                for gauge in (self.quota_vcpus, self.quota_memory):
                    with contextlib.suppress(KeyError):
                        gauge.remove(name)
            else:
                self.quota_vcpus.labels(name).set(n.quota_cpu_millis / 1000)
                self.quota_memory.labels(name).set(n.quota_memory_bytes)
            self.quota_used_vcpus.labels(name).set(n.usage_cpu_millis / 1000)
            self.quota_used_memory.labels(name).set(n.usage_memory_bytes)
            self.queue_length.labels(name).set(n.waiting_pods)
        for name in self._namespaces - seen:
            for gauge in (
                self.quota_vcpus,
                self.quota_memory,
                self.quota_used_vcpus,
                self.quota_used_memory,
                self.queue_length,
            ):
                with contextlib.suppress(KeyError):
                    gauge.remove(name)
        self._namespaces = seen


class _Merged(Collector):
    def __init__(self, registry: CollectorRegistry, extra: list[Metric]) -> None:
        self._registry = registry
        self._extra = extra

    def collect(self) -> Iterable[Metric]:
        extra = {family.name: family for family in self._extra}
        for family in self._registry.collect():
            more = extra.pop(family.name, None)
            yield family if more is None else _merge(family, more)
        yield from extra.values()


def _merge(ours: Metric, theirs: Metric) -> Metric:
    """One family from two processes' samples: a series both have is summed (counters and
    histograms: each counted its own calls), except ``_created``, which keeps ours."""
    merged = Metric(ours.name, ours.documentation, ours.type, ours.unit)
    index: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    samples = list(ours.samples)
    for i, sample in enumerate(samples):
        index[(sample.name, tuple(sorted(sample.labels.items())))] = i
    for sample in theirs.samples:
        found = index.get((sample.name, tuple(sorted(sample.labels.items()))))
        if found is None:
            samples.append(sample)
        elif not sample.name.endswith("_created"):
            samples[found] = samples[found]._replace(value=samples[found].value + sample.value)
    merged.samples = samples
    return merged


def exposition(registry: CollectorRegistry, extra: list[Metric]) -> bytes:
    """``registry``'s exposition with ``extra``'s families merged in (same-named families
    become one: the text format allows each name once)."""
    merged = CollectorRegistry(auto_describe=False)
    merged.register(_Merged(registry, extra))
    return generate_latest(merged)
