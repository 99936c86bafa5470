"""Scale-up recommender: which nodes to add so that pending pods can run.

Pure: no I/O, no clock, no randomness, no globals. The same snapshot and config give the same
``Recommendation``, and ``encode_recommendation`` turns it into the same bytes. Timing is the
caller's business (``run_time_millis`` is passed in, not measured here), because a clock inside
would make two runs differ.

It follows the "ScaleSim" design, in memory instead of against a real scheduler (that design
waits 10 s of wall time per zone simulation; this answers in milliseconds), in numbered phases
like kueue's scheduling cycle:

1. **Snapshot.** Validate the ``ClusterSnapshot`` (every error with its ``$.path``) and compile
   it (``snapshot_model``; done once by ``load_snapshot``, whose ``PreparedSnapshot`` any number
   of calls reuse). The simulation works on its own copy of the nodes' free room; the live
   ledger is never touched (``snapshot_from_ledger`` only reads it).
2. **Existing nodes.** Pending pods, highest priority first, then oldest, then name, go onto
   existing nodes when they fit (first fit by node name, with the extender's fit rule).
   Such a pod needs no new node.
3. **Simulate.** For every eligible candidate (node pool x zone, one new node of the pool's
   template), place the still-unscheduled pods on it in the same order, first fit.
4. **Rank.** Score the candidates with the configured chain of scorers; ties fall through to
   the next link and finally to (pool, zone) names. Never random.
5. **Commit.** Add the winner's node and pods to the virtual cluster; go back to 3 until nothing
   is left or no candidate places anything. When the snapshot has priority classes, 2-5 run
   once per priority value, highest first, so high-priority pods choose the node shapes.
6. **Check.** Greedy picks one node at a time and can miss a cheaper plan (one large node
   instead of two small ones). For each pool, pack everything greedy placed on new nodes onto
   the fewest nodes of that pool alone (bounded search) and report it when it costs less.
7. **Recommend.** Group the new nodes by pool and zone; explain every pod left unscheduled.

Decisions are an enum plus a reason a human can read (``CandidateOutcome``, ``UnscheduledReason``).

Modules, one phase or concern each (all pure):

* ``cluster_snapshot``: the wire types and decoding;
* ``snapshot_model``: phase 1, the cross-field checks and the compiled model;
* ``recommender`` (this module): phases 2-5 and 7, the simulation;
* ``recommend_scoring``: phase 4's scorer chain;  ``recommend_plan``: phase 6;
* ``recommendation``: the answer and its encoding;  ``live_snapshot``: a snapshot of the ledger.

This module re-exports their public names, so ``from scheduler_extender.recommender import
...`` is the one import callers need.

Speed. The simulation does not run a ``Ledger`` with a ``FitIndex``: those are built for a
long-lived cluster (every reservation re-checks every cached size and formats rejection
strings). It keeps per-node free cpu and memory in plain arrays and applies the ledger's own fit
rule, ``need <= free`` per resource after the system reserve (``snapshot_model.usable`` goes
through ``NodeState`` for that), so its placements are exactly the extender's.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from protocol.quantity import format_cpu
from scheduler_extender.accounting import NodeState
from scheduler_extender.cluster_snapshot import (
    API_VERSION,
    HOSTNAME_LABEL,
    KIND,
    POOL_LABEL,
    ZONE_LABEL,
    Affinity,
    Capacity,
    ClusterSnapshot,
    FieldError,
    NodeAffinity,
    NodePool,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    NodeTemplate,
    PoolLimits,
    PriorityClass,
    Resources,
    SnapshotError,
    SnapshotNode,
    SnapshotPod,
    Taint,
    Toleration,
    decode_snapshot,
)
from scheduler_extender.live_snapshot import snapshot_from_ledger
from scheduler_extender.placement import rejection
from scheduler_extender.podinfo import Demand
from scheduler_extender.recommend_config import RecommenderConfig, Scorer
from scheduler_extender.recommend_plan import cheaper_plans
from scheduler_extender.recommend_scoring import RankKey, lost_reason, rank_key, score
from scheduler_extender.recommendation import (
    CandidateOutcome,
    CandidateTrial,
    CheaperPlan,
    Diagnostics,
    ExistingPlacement,
    Recommendation,
    Round,
    ScaleUp,
    Score,
    UnscheduledPod,
    UnscheduledReason,
    encode_recommendation,
)
from scheduler_extender.snapshot_model import (
    Candidate,
    Host,
    Model,
    Pending,
    PreparedSnapshot,
    admission,
    candidates,
    load_snapshot,
    prepare_snapshot,
    usable,
    validate_snapshot,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "POOL_LABEL",
    "ZONE_LABEL",
    "Affinity",
    "CandidateOutcome",
    "CandidateTrial",
    "Capacity",
    "CheaperPlan",
    "ClusterSnapshot",
    "Diagnostics",
    "ExistingPlacement",
    "FieldError",
    "NodeAffinity",
    "NodePool",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "NodeTemplate",
    "PoolLimits",
    "PreparedSnapshot",
    "PriorityClass",
    "Recommendation",
    "RecommenderConfig",
    "Resources",
    "Round",
    "ScaleUp",
    "Scorer",
    "SnapshotError",
    "SnapshotNode",
    "SnapshotPod",
    "Taint",
    "Toleration",
    "UnscheduledPod",
    "UnscheduledReason",
    "decode_snapshot",
    "encode_recommendation",
    "load_snapshot",
    "prepare_snapshot",
    "recommend",
    "snapshot_from_ledger",
    "validate_snapshot",
]


class SimulationError(AssertionError):
    """The simulation's own arithmetic disagrees with the fit rule: a bug, never bad input."""


class _Cluster:
    """The virtual cluster's nodes (the snapshot's, then the new ones) as parallel arrays.

    ``free_*`` may start negative (an over-committed node): then nothing fits there, as in the
    ledger. Only ``take`` changes them, and only downwards.
    """

    __slots__ = ("by_name", "free_cpu", "free_mem", "hosts", "names")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.hosts: list[Host] = []
        self.free_cpu: list[int] = []
        self.free_mem: list[int] = []
        self.by_name: dict[str, int] = {}

    def add(self, host: Host, free: Demand) -> int:
        i = len(self.names)
        self.names.append(host.name)
        self.hosts.append(host)
        self.free_cpu.append(free.cpu_millis)
        self.free_mem.append(free.memory_bytes)
        self.by_name[host.name] = i
        return i

    def take(self, i: int, d: Demand) -> None:
        if d.cpu_millis > self.free_cpu[i] or d.memory_bytes > self.free_mem[i]:
            raise SimulationError(f"{d} does not fit on {self.names[i]}")
        self.free_cpu[i] -= d.cpu_millis
        self.free_mem[i] -= d.memory_bytes


@dataclass(slots=True)
class _Trial:
    """One new node's simulated contents. Shared by the candidates with the same signature,
    and reused across rounds while none of its pods has been taken (see ``_Pass``)."""

    placed: list[int]  # pass-local indices, in placement order
    requested: Demand
    keys: list[str]  # the placed pods' names, built once for the diagnostics
    # Per candidate index: the rank key and the displayed score, computed once (Fractions).
    ranks: dict[int, RankKey] = field(default_factory=dict)
    scores: dict[int, Score] = field(default_factory=dict)

    def rank_key(self, config: RecommenderConfig, cand: Candidate) -> RankKey:
        found = self.ranks.get(cand.index)
        if found is None:
            found = self.ranks[cand.index] = rank_key(
                config, cand.pool, cand.zone, self.requested, len(self.placed)
            )
        return found

    def score_of(self, config: RecommenderConfig, cand: Candidate) -> Score:
        found = self.scores.get(cand.index)
        if found is None:
            found = self.scores[cand.index] = score(
                config, cand.pool, self.requested, len(self.placed)
            )
        return found


@dataclass(slots=True)
class _Group:
    """Pending pods of one pass with the same constraints and size: identical for every fit
    and feasibility question. Members taken by a winner always form a prefix (a trial takes a
    group's members in order while they fit), so ``head`` is all the bookkeeping needed."""

    cls: int
    demand: Demand
    members: list[int]
    head: int = 0


class _Pass:
    """Phase 3 for one pass, made cheap.

    Done naively, every round tries every candidate against every pending pod: rounds x
    candidates x pods (about 1 s for the benchmark). Instead:

    * pods are grouped by (constraints, size), and each candidate's feasible groups are found
      once per pass (the constraint check is per group, not per pod and round);
    * candidates with the same usable size and feasible groups (a pool's zones, when no pod
      cares about zones) share one trial: their simulations are identical;
    * a trial is a heap merge over the groups' heads in scheduling order, which is exactly
      first fit in that order, but drops a whole group the first time its size no longer fits
      (room only shrinks), so it costs O(pods placed x log groups), not O(pods pending);
    * a trial stays valid until a pod it placed is taken: removing a pod it skipped cannot
      change a first fit that skipped it.
    """

    def __init__(self, sim: _Sim, pods: list[Pending]) -> None:
        self.pods = pods
        self.done = [False] * len(pods)
        by_key: dict[tuple[int, Demand], int] = {}
        self.groups: list[_Group] = []
        self.group_of: list[int] = []  # pod -> group
        for i, p in enumerate(pods):
            n = by_key.get((p.cls, p.demand))
            if n is None:
                n = by_key[(p.cls, p.demand)] = len(self.groups)
                self.groups.append(_Group(p.cls, p.demand, []))
            self.groups[n].members.append(i)
            self.group_of.append(n)
        sigs: dict[tuple[Demand, tuple[int, ...]], int] = {}
        self.sig_groups: list[tuple[int, ...]] = []
        self.sig_usable: list[Demand] = []
        self.sig_of: list[int] = []
        for cand in sim.candidates:
            u = cand.usable
            feasible = tuple(
                n
                for n, g in enumerate(self.groups)
                if g.demand.cpu_millis <= u.cpu_millis
                and g.demand.memory_bytes <= u.memory_bytes
                and sim.admits(g.cls, cand) is None
            )
            sig = sigs.get((u, feasible))
            if sig is None:
                sig = sigs[(u, feasible)] = len(self.sig_groups)
                self.sig_groups.append(feasible)
                self.sig_usable.append(u)
            self.sig_of.append(sig)
        self.cache: dict[int, _Trial] = {}

    def trial(self, cand: Candidate) -> _Trial:
        sig = self.sig_of[cand.index]
        cached = self.cache.get(sig)
        done = self.done
        if cached is not None and not any(done[i] for i in cached.placed):
            return cached
        free_cpu, free_mem = self.sig_usable[sig].cpu_millis, self.sig_usable[sig].memory_bytes
        groups = self.groups
        heap: list[tuple[int, int, int]] = []
        for n in self.sig_groups[sig]:
            g = groups[n]
            d = g.demand
            if g.head < len(g.members) and d.cpu_millis <= free_cpu and d.memory_bytes <= free_mem:
                heap.append((g.members[g.head], n, g.head))
        heapq.heapify(heap)
        placed: list[int] = []
        while heap:
            i, n, pos = heapq.heappop(heap)
            g = groups[n]
            d = g.demand
            if d.cpu_millis > free_cpu or d.memory_bytes > free_mem:
                continue  # and never again in this trial: room only shrinks
            placed.append(i)
            free_cpu -= d.cpu_millis
            free_mem -= d.memory_bytes
            pos += 1
            if pos < len(g.members):
                heapq.heappush(heap, (g.members[pos], n, pos))
        usable = self.sig_usable[sig]
        t = _Trial(
            placed=placed,
            requested=Demand(usable.cpu_millis - free_cpu, usable.memory_bytes - free_mem),
            keys=[self.pods[i].key for i in placed],
        )
        self.cache[sig] = t
        return t

    def taken(self, t: _Trial) -> None:
        for i in t.placed:
            self.done[i] = True
        for i in t.placed:
            g = self.groups[self.group_of[i]]
            while g.head < len(g.members) and self.done[g.members[g.head]]:
                g.head += 1


@dataclass(slots=True)
class _Sim:
    """The virtual cluster of one ``recommend`` call; everything it changes is its own."""

    model: Model
    config: RecommenderConfig
    cluster: _Cluster
    candidates: list[Candidate]
    pool_label: str
    admission: dict[tuple[int, int], str | None] = field(default_factory=dict)
    # class -> indices of the schedulable nodes that admit it; built on first use, then kept
    # current as nodes are added.
    eligible: dict[int, list[int]] = field(default_factory=dict)
    schedulable: list[int] = field(default_factory=list)
    added: dict[str, int] = field(default_factory=dict)  # "pool/zone" -> nodes added
    pool_added: dict[int, int] = field(default_factory=dict)  # pool index -> nodes added
    new_nodes: dict[str, tuple[Candidate, list[str]]] = field(default_factory=dict)
    greedy_pods: list[Pending] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    placed_on_existing: list[ExistingPlacement] = field(default_factory=list)

    # -- feasibility ----------------------------------------------------------------------

    def admits(self, cls: int, cand: Candidate) -> str | None:
        key = (cls, cand.index)
        if key in self.admission:
            return self.admission[key]
        why = self.admission[key] = admission(self.model.classes[cls], cand.host)
        return why

    def eligible_nodes(self, cls: int) -> list[int]:
        found = self.eligible.get(cls)
        if found is None:
            c = self.model.classes[cls]
            hosts = self.cluster.hosts
            found = self.eligible[cls] = [
                i for i in self.schedulable if admission(c, hosts[i]) is None
            ]
        return found

    # -- phase 2 ---------------------------------------------------------------------------

    def place_on_existing(self, pods: Sequence[Pending]) -> list[Pending]:
        """First fit by node name; returns the pods that fit nowhere.

        Room only shrinks during this phase, so a node that rejected a (constraints, size)
        rejects it for the rest of the phase: each such group keeps a cursor into its
        eligible nodes in name order, and the nodes behind it are never looked at again.
        """
        left: list[Pending] = []
        cluster = self.cluster
        names, free_cpu, free_mem = cluster.names, cluster.free_cpu, cluster.free_mem
        by_name: dict[int, list[int]] = {}
        cursors: dict[tuple[int, Demand], int] = {}
        for p in pods:
            order = by_name.get(p.cls)
            if order is None:
                order = by_name[p.cls] = sorted(self.eligible_nodes(p.cls), key=names.__getitem__)
            memo = (p.cls, p.demand)
            pos = cursors.get(memo, 0)
            need_cpu, need_mem = p.demand.cpu_millis, p.demand.memory_bytes
            end = len(order)
            while pos < end:
                i = order[pos]
                if need_cpu <= free_cpu[i] and need_mem <= free_mem[i]:
                    break
                pos += 1
            cursors[memo] = pos
            if pos == end:
                left.append(p)
                continue
            i = order[pos]
            cluster.take(i, p.demand)
            node = names[i]
            added = self.new_nodes.get(node)
            if added is None:
                self.placed_on_existing.append(ExistingPlacement(pod=p.key, node=node))
            else:
                # Room an earlier pass's new node left over: this pod needs that node too,
                # so it belongs to the scale-up (and to the cheaper-plan check).
                added[1].append(p.key)
                self.greedy_pods.append(p)
        return left

    # -- phases 3-5 --------------------------------------------------------------------------

    def blocked(self, cand: Candidate) -> tuple[CandidateOutcome, str] | None:
        pool = cand.pool
        count = pool.count + self.pool_added.get(pool.index, 0)
        if count >= pool.max_count:
            return (
                CandidateOutcome.AT_MAX,
                f"pool {pool.name} has {count} of at most {pool.max_count} nodes",
            )
        cap = pool.capacity
        if pool.limit_cpu is not None and (count + 1) * cap.cpu_millis > pool.limit_cpu:
            return (
                CandidateOutcome.OVER_LIMIT,
                f"another node would take pool {pool.name} to"
                f" {format_cpu((count + 1) * cap.cpu_millis)} cpu, over its limit of"
                f" {format_cpu(pool.limit_cpu)}",
            )
        if pool.limit_memory is not None and (count + 1) * cap.memory_bytes > pool.limit_memory:
            return (
                CandidateOutcome.OVER_LIMIT,
                f"another node would take pool {pool.name} to"
                f" {(count + 1) * cap.memory_bytes} bytes of memory, over its limit of"
                f" {pool.limit_memory}",
            )
        return None

    def run_rounds(self, pods: list[Pending], pass_priority: int | None) -> list[Pending]:
        state = _Pass(self, pods)
        done = state.done
        config = self.config
        left = len(pods)
        while left:
            trials: list[tuple[RankKey, Candidate, _Trial]] = []
            entries: list[tuple[Candidate, CandidateOutcome, str, _Trial | None]] = []
            for cand in self.candidates:
                block = self.blocked(cand)
                if block is not None:
                    entries.append((cand, block[0], block[1], None))
                    continue
                t = state.trial(cand)
                if not t.placed:
                    entries.append(
                        (cand, CandidateOutcome.PLACES_NOTHING, "no unscheduled pod fits", t)
                    )
                    continue
                trials.append((t.rank_key(config, cand), cand, t))
                entries.append((cand, CandidateOutcome.LOST, "", t))
            if not trials:
                if entries:
                    self.rounds.append(self.round_record(entries, pass_priority, None, None))
                break
            best_key, winner, won = min(trials, key=lambda x: x[0])
            keys = {c.index: k for k, c, _ in trials}
            for n, (cand, outcome, _reason, tried) in enumerate(entries):
                if outcome is CandidateOutcome.LOST:
                    if cand is winner:
                        entries[n] = (cand, CandidateOutcome.WON, "best of the chain", tried)
                    else:
                        why = lost_reason(config, keys[cand.index], best_key, winner.label)
                        entries[n] = (cand, CandidateOutcome.LOST, why, tried)
            name = self.commit(winner, [pods[i] for i in won.placed])
            state.taken(won)
            left -= len(won.placed)
            self.rounds.append(self.round_record(entries, pass_priority, winner, name))
        return [p for i, p in enumerate(pods) if not done[i]]

    def round_record(
        self,
        entries: list[tuple[Candidate, CandidateOutcome, str, _Trial | None]],
        pass_priority: int | None,
        winner: Candidate | None,
        new_node: str | None,
    ) -> Round:
        config = self.config
        trials: list[CandidateTrial] = []
        for cand, outcome, reason, t in entries:
            pool = cand.pool
            if t is None:
                trials.append(
                    CandidateTrial(
                        node_pool=pool.name,
                        zone=cand.zone,
                        instance_type=pool.instance_type,
                        outcome=outcome,
                        reason=reason,
                    )
                )
                continue
            trials.append(
                CandidateTrial(
                    node_pool=pool.name,
                    zone=cand.zone,
                    instance_type=pool.instance_type,
                    outcome=outcome,
                    reason=reason,
                    score=t.score_of(config, cand) if t.placed else None,
                    pods=t.keys,
                )
            )
        return Round(
            round=len(self.rounds) + 1,
            pass_priority=pass_priority,
            winner=winner.label if winner is not None else None,
            new_node=new_node,
            candidates=trials,
        )

    def commit(self, cand: Candidate, pods: list[Pending]) -> str:
        n = self.added.get(cand.label, 0) + 1
        self.added[cand.label] = n
        self.pool_added[cand.pool.index] = self.pool_added.get(cand.pool.index, 0) + 1
        name = f"{cand.pool.name}-{cand.zone}-new-{n}"
        while name in self.cluster.by_name:  # a real node already has that name
            name += "x"
        labels = {
            **cand.pool.labels,
            self.pool_label: cand.pool.name,
            ZONE_LABEL: cand.zone,
            HOSTNAME_LABEL: name,
        }
        i = self.cluster.add(Host(name, labels, cand.pool.taints), cand.usable)
        self.schedulable.append(i)
        for cls, nodes in self.eligible.items():
            if self.admits(cls, cand) is None:
                nodes.append(i)
        for p in pods:
            # The trial's arithmetic must agree with the fit rule, or this raises.
            self.cluster.take(i, p.demand)
        self.new_nodes[name] = (cand, [p.key for p in pods])
        self.greedy_pods.extend(pods)
        return name


def recommend(
    snapshot: ClusterSnapshot | PreparedSnapshot, *, config: RecommenderConfig
) -> Recommendation:
    """Which nodes to add for the snapshot's pending pods. Pure; see the module docstring.

    A ``PreparedSnapshot`` (from ``load_snapshot``) is not checked or compiled again when it
    was prepared for ``config.scheduler_name``. Raises ``SnapshotError`` (400) for an
    inconsistent snapshot, or when the ``least-cost`` scorer is configured and a pool has no
    price.
    """
    # Phase 1: snapshot.
    if isinstance(snapshot, PreparedSnapshot):
        prepared = snapshot
        if prepared.scheduler_name != config.scheduler_name:
            prepared = prepare_snapshot(prepared.snapshot, scheduler_name=config.scheduler_name)
    else:
        prepared = prepare_snapshot(snapshot, scheduler_name=config.scheduler_name)
    model = prepared.model
    if Scorer.LEAST_COST in config.scorers:
        missing = [
            FieldError(
                path=f"$.nodePools[{p.index}].price", message="the least-cost scorer needs it"
            )
            for p in model.pools
            if p.price is None
        ]
        if missing:
            raise SnapshotError(missing)
    pool_label = prepared.snapshot.pool_label
    cluster = _Cluster()
    schedulable: list[int] = []
    for (node, host), alloc, held in zip(model.nodes, model.allocatable, model.held, strict=True):
        room = usable(alloc, config.reserve)
        i = cluster.add(
            host, Demand(room.cpu_millis - held.cpu_millis, room.memory_bytes - held.memory_bytes)
        )
        if not node.unschedulable:
            schedulable.append(i)
    cands = candidates(model, pool_label=pool_label, reserve=config.reserve)
    sim = _Sim(
        model=model,
        config=config,
        cluster=cluster,
        candidates=cands,
        pool_label=pool_label,
        schedulable=schedulable,
    )

    # Passes: one per priority value when priority classes exist.
    unscheduled: list[Pending] = []
    invalid: list[Pending] = [p for p in model.pending if p.info.vm_error is not None]
    valid = [p for p in model.pending if p.info.vm_error is None]
    passes: list[tuple[int | None, list[Pending]]] = []
    if model.has_priority_classes:
        for p in valid:
            if not passes or passes[-1][0] != p.info.priority:
                passes.append((p.info.priority, []))
            passes[-1][1].append(p)
    elif valid:
        passes.append((None, valid))
    for pass_priority, pods in passes:
        # Phase 2: existing nodes (including those added by earlier passes).
        left = sim.place_on_existing(pods)
        # Phases 3-5.
        unscheduled.extend(sim.run_rounds(left, pass_priority))

    # Phase 6: is there a cheaper plan than greedy's?
    notes: list[str] = []
    greedy_price, plans = cheaper_plans(sim, notes)

    # Phase 7: recommend.
    groups: dict[str, list[str]] = {}
    for name, (cand, _pods) in sim.new_nodes.items():
        groups.setdefault(cand.label, []).append(name)
    by_label = {c.label: c for c in cands}
    scale_up = [
        ScaleUp(
            node_pool=by_label[label].pool.name,
            zone=by_label[label].zone,
            instance_type=by_label[label].pool.instance_type,
            increment_by=len(names),
            node_names=names,
        )
        for label, names in sorted(groups.items())
    ]
    left_over = sorted([*invalid, *unscheduled], key=lambda p: p.order)
    explained = [_explain(sim, p) for p in left_over]
    return Recommendation(
        scale_up=scale_up,
        unscheduled_pods=[p.key for p in left_over],
        diagnostics=Diagnostics(
            rounds=sim.rounds,
            placed_on_existing=sim.placed_on_existing,
            new_nodes={name: pods for name, (_c, pods) in sim.new_nodes.items()},
            unscheduled=explained,
            greedy_price=greedy_price,
            cheaper_plans=plans,
            notes=notes,
        ),
    )


def _explain(sim: _Sim, p: Pending) -> UnscheduledPod:
    if p.info.vm_error is not None:
        return UnscheduledPod(
            pod=p.key,
            uid=p.info.uid,
            priority=p.info.priority,
            reason=UnscheduledReason.INVALID_VM_SPEC,
            message=f"the extender rejects this VM on every node: {p.info.vm_error}",
        )
    per: dict[str, tuple[UnscheduledReason, str]] = {}
    for cand in sim.candidates:
        why = sim.admits(p.cls, cand)
        if why is not None:
            per[cand.label] = (UnscheduledReason.NO_MATCHING_POOL, why)
            continue
        empty = NodeState(
            name=cand.label,
            is_known=True,
            allocatable=cand.pool.allocatable,
            reserve=sim.config.reserve.of(cand.pool.allocatable),
        )
        too_big = rejection(empty, p.demand)
        if too_big is not None:
            per[cand.label] = (UnscheduledReason.TOO_BIG, too_big.reason)
            continue
        block = sim.blocked(cand)
        if block is not None and block[0] is CandidateOutcome.AT_MAX:
            per[cand.label] = (UnscheduledReason.POOL_AT_MAX, block[1])
        elif block is not None:
            per[cand.label] = (UnscheduledReason.POOL_LIMIT, block[1])
        else:  # pragma: no cover - the rounds only stop when no candidate can take it
            per[cand.label] = (UnscheduledReason.POOL_LIMIT, "no candidate was left")
    found = {r for r, _ in per.values()}
    for reason in (
        UnscheduledReason.POOL_AT_MAX,
        UnscheduledReason.POOL_LIMIT,
        UnscheduledReason.TOO_BIG,
    ):
        if reason in found:
            break
    else:
        reason = UnscheduledReason.NO_MATCHING_POOL
    messages = {
        UnscheduledReason.POOL_AT_MAX: "it fits no existing node, and every pool that could"
        " take it is at its maximum node count",
        UnscheduledReason.POOL_LIMIT: "it fits no existing node, and every pool that could take"
        " it would exceed its resource limit",
        UnscheduledReason.TOO_BIG: "it fits no existing node and is bigger than every"
        " template its constraints allow",
        UnscheduledReason.NO_MATCHING_POOL: "it fits no existing node, and no pool's template"
        " matches its node selector, affinity and tolerations"
        if sim.candidates
        else "it fits no existing node, and the snapshot has no node pools",
    }
    return UnscheduledPod(
        pod=p.key,
        uid=p.info.uid,
        priority=p.info.priority,
        reason=reason,
        message=messages[reason],
        pools=_collapse_zones(sim.candidates, per),
    )


def _collapse_zones(
    candidates: Sequence[Candidate], per: Mapping[str, tuple[UnscheduledReason, str]]
) -> dict[str, str]:
    """One line per pool when its zones agree, else one per pool/zone."""
    out: dict[str, str] = {}
    by_pool: dict[str, list[Candidate]] = {}
    for c in candidates:
        by_pool.setdefault(c.pool.name, []).append(c)
    for pool, cands in by_pool.items():
        texts = [per[c.label][1] for c in cands]
        if all(t == texts[0] for t in texts):
            out[pool] = texts[0]
        else:
            for c, t in zip(cands, texts, strict=True):
                out[c.label] = t
    return out
