"""``Extender``: the ledger and everything that feeds it or acts on it, wired together.

Shell, but with no I/O of its own: the kube calls sit behind the ``Binder``, ``PermitRecorder``
and ``NodeAllocReporter`` it is given. The methods that touch the ledger never ``await`` between
reading it and writing it (see the house style); ``bind`` awaits only *after* its reservation is
in the ledger, and undoes it if the Binding fails.

Admission. Before a pod of ours is placed, its namespace's quota must admit it
(``admission``): filter asks first and rejects every node while the pod waits, bind asks again
right before reserving (an admission can expire in between). The pod list and watch feed the
queue (``observe_pending`` / ``forget``); whenever room may have grown (a pod gone, a VM shrunk,
quotas reloaded, a node added, the list replaced) the queue is re-checked and the pods it
admits are nudged (``queue_notices``).

Reserve/unreserve. kube-scheduler's extender protocol has no reserve or unreserve verb. This
extender reserves at ``bind`` (the commit point: the fit is checked again there) and releases
when the Binding fails or when the pod watch shows the pod deleted or finished. A node that
passed ``filter`` but was never bound holds nothing, so there is nothing to unreserve.
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Final, NamedTuple, Protocol

import msgspec
import structlog

from kube_io.errors import KubeError, NotFound
from protocol.annotations import DRAIN_TAINT, LEADER_TERM, parse_migration_to, vm_container_name
from protocol.annotations import MIGRATION as ANNOTATION_MIGRATION
from protocol.kube import Node, Pod, PodSpec, Taint
from protocol.moves import CancelMove, MoveAnswer, MoveRequest
from protocol.permits import PermitStatus, ResourceRequestBatch
from protocol.quantity import QuantityError, cpu_millis, memory_bytes
from protocol.versions import ProtocolVersion
from protocol.virtualmachine import VirtualMachineMigration
from scheduler_extender.admission import queue as admission
from scheduler_extender.admission.queue import AdmissionDecision, AdmissionState, PodKey
from scheduler_extender.admission.quota import QuotaConfig
from scheduler_extender.config import Config
from scheduler_extender.core import batches, verbs
from scheduler_extender.core import ledger as ledger_errors
from scheduler_extender.core.leadership import Elector
from scheduler_extender.core.ledger import Ledger
from scheduler_extender.core.parked import ParkedPods
from scheduler_extender.core.permits import Decision
from scheduler_extender.core.placement import FitIndex, ScoreIndex
from scheduler_extender.core.podinfo import (
    Demand,
    PodError,
    PodInfo,
    pod_info,
)
from scheduler_extender.core.refusals import SEQUENCE_REFUSALS, Refused
from scheduler_extender.core.relief import (
    ReliefBook,
    ReliefPlan,
    choose_target,
    plan_moves,
    record_of,
)
from scheduler_extender.core.sequences import SequenceBook
from scheduler_extender.core.verbs import BindOutcome
from scheduler_extender.errors import (
    MoveRefused,
    NotLeader,
    NotSynced,
    UnknownNode,
    UnknownPod,
)
from scheduler_extender.kube.durability import PermitRecorder, PermitWrite
from scheduler_extender.kube.node_alloc import NodeAllocReporter
from scheduler_extender.kube.queue_notices import QueueNotices
from scheduler_extender.metrics import Metrics
from scheduler_extender.recommender.capacity_waits import CapacityWaits

log = structlog.get_logger(__name__)

WallClock = Callable[[], float]
MonotonicClock = Callable[[], float]
_STATUS_NAMES: Final = {s: s.value for s in PermitStatus}
# Short of what was asked (the node or the quota had no room for the rest): a capacity wait.
_SHORT: Final = frozenset({PermitStatus.DENIED, PermitStatus.PARTIAL})


class Binder(Protocol):
    async def bind_pod(
        self, namespace: str, name: str, *, uid: str, node: str, resource_version: str | None
    ) -> None: ...

    async def list_pods(self, *, field_selector: str) -> list[Pod]: ...

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> Pod: ...


class Extender:
    def __init__(
        self,
        config: Config,
        *,
        metrics: Metrics,
        reporter: NodeAllocReporter,
        recorder: PermitRecorder | None,
        binder: Binder | None,
        notices: QueueNotices | None = None,
        wall_clock: WallClock = time.time,
        clock: MonotonicClock | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.reporter = reporter
        self.recorder = recorder
        # None: standalone mode, where a bind only records (there is no API server).
        self.binder = binder
        self.wall_clock = wall_clock
        self.ledger = Ledger(reserve=config.system_reserve.to_reserve())
        # This incarnation's id, in every permit answer: agents that see it change report all
        # their VMs at once, so a rebuilt ledger stops holding them at their maximum quickly.
        self.epoch = uuid.uuid4().hex
        # The last applied seq per VM (protocol v2), in memory only (``core.sequences``).
        self.sequences = SequenceBook()
        self.index = FitIndex(self.ledger)
        self.scores = ScoreIndex(self.ledger)
        self.ledger.subscribe(metrics.node_changed)
        # Our pods that wait for a node, by "namespace/name": bind needs their PodInfo, and
        # kube-scheduler's bind call carries only names.
        self.unbound: dict[str, PodInfo] = {}
        # What the recommender's live snapshot needs and neither the ledger nor ``PodInfo``
        # keeps: the specs of those pods (node selector, affinity, tolerations, priority class;
        # same keys), and per node its taints and whether it is cordoned.
        self.unbound_specs: dict[str, PodSpec] = {}
        self.node_taints: dict[str, list[Taint]] = {}
        self.cordoned: set[str] = set()
        # uid -> the VM's container, resized in place by the durability writer.
        self.vm_containers: dict[str, str] = {}
        # A memory-scaling VM's container memory beyond the guest's, kept by every resize.
        self.vm_memory_overheads: dict[str, int] = {}
        self.has_nodes = False
        self.has_pods = False
        # Who waits for capacity since when (fed by filter and permits): the recommender's
        # auto-publish trigger (http/recommend.py).
        self.capacity_waits = CapacityWaits()
        # The admission queue. Quotas written in the config apply from the start; a quota file
        # is loaded by the app before it serves (until then every pod waits); no quota section
        # means no limits, but pods still go through the queue.
        quota = config.quota
        initial: QuotaConfig | None = QuotaConfig()
        if quota is not None:
            initial = None if quota.file is not None else quota.inline()
        self.admission = AdmissionState(self.ledger, initial)
        self.notices = notices or QueueNotices(reporter, None, wall_clock=wall_clock)
        # Our pods that filter rejected on every node: kube-scheduler parks them, so the
        # notices nudge each one once a node it was offered has room for it again.
        self.parked = ParkedPods(self.ledger, on_change=self.notices.room_changed)
        self.binds_in_flight: set[str] = set()
        self.notices.watch_room(self.parked, binding=self.binds_in_flight)
        # Monotonic seconds for the admission core (``loop.time()``, virtual in tests).
        self.clock = clock or _loop_time
        # Pods handed to ``observe_pending``, so that a new list can forget the ones it lacks.
        self._queued: set[str] = set()
        # Two replicas: decide only while this one holds the extender's Lease (``kube/leader``
        # sets it). None: the only replica, which always decides.
        self.elector: Elector | None = None
        # The term whose fence is up (``fence``): only then does a new leader decide.
        self.fenced_term: int | None = None
        # The term this replica writes in (``may_write``): set on a gain, cleared on a loss.
        self.writing_term: int | None = None
        self._fencing: asyncio.Task[None] | None = None
        metrics.leading.set(1)
        # What relief remembers between passes (``core.relief``); fed by ``permits`` and the
        # VirtualMachineMigration watch only while ``relief.enabled``, on the wall clock.
        self.relief_book = ReliefBook()
        self.has_migrations = False
        # ``gc.freeze`` once the first lists are in (see ``_freeze_loaded_objects``); off by
        # default because it is process-wide: tests build many extenders in one process.
        self.freeze_gc_when_synced = False

    # -- readiness ---------------------------------------------------------------------------

    @property
    def is_synced(self) -> bool:
        return self.has_nodes and self.has_pods

    @property
    def is_leading(self) -> bool:
        return self.elector is None or self.elector.is_leading(self.clock())

    def may_write(self) -> bool:
        """The one gate of every write this replica sends to the API server, the Lease's
        aside (``kube/link.py`` asks it right before each): the only replica always writes;
        one of two, only while it holds the Lease in the term it began writing in."""
        if self.elector is None:
            return True
        return self.elector.may_write(self.clock(), self.writing_term)

    def require_synced(self) -> None:
        """Before every decision (the verbs, the permits): the lists are in and this replica
        holds the extender's Lease (``core/leadership.py``: at most one replica passes)."""
        if not self.is_leading:
            assert self.elector is not None
            observed = self.elector.observed
            holder = observed.holder if observed is not None and observed.holder else "nobody"
            raise NotLeader(
                f"this extender is the standby; the extender Lease is held by {holder}",
                retry_after_seconds=self.config.not_synced_retry_after_seconds,
            )
        if self.elector is not None and self.fenced_term != self.elector.term:
            raise NotLeader(
                "this extender has just taken the lead and is fencing the previous leader's binds",
                retry_after_seconds=self.config.not_synced_retry_after_seconds,
            )
        if not self.is_synced:
            missing = [
                w for w, ok in (("nodes", self.has_nodes), ("pods", self.has_pods)) if not ok
            ]
            raise NotSynced(
                f"the extender has not loaded the {' and '.join(missing)} list yet",
                retry_after_seconds=self.config.not_synced_retry_after_seconds,
            )

    def leadership_gained(self, elector: Elector) -> None:
        """This replica now decides. Before its first decision: every VM is unverified again
        (another leader may have granted it more since this ledger last heard its agent; the
        same uncertainty a restart starts from), and a new epoch makes agents report at once.
        """
        self.ledger.forget_agents()
        self.epoch = uuid.uuid4().hex
        self.writing_term = elector.term
        self.metrics.leading.set(1)
        log.info("leadership_gained", identity=elector.identity, term=elector.term)
        if self.binder is None:
            self.fenced_term = elector.term
        else:
            if self._fencing is not None:
                self._fencing.cancel()
            self._fencing = asyncio.get_running_loop().create_task(self.fence(elector))

    async def fence(self, elector: Elector) -> None:
        """Before a new leader's first decision: no Binding the previous leader sent may land.

        The previous leader stopped deciding before this one could take the Lease, but a Binding
        it sent may still be on its way (a partition holds it back). Every Binding carries the
        pod's resourceVersion as a precondition (``bind``), so writing to every pod still waiting
        for a node (``LEADER_TERM``) makes any such Binding fail with 409, and the answers show
        any that landed first, which the ledger then holds. Permits wait too: the room such a
        pod takes must be known before anything is granted on its node.
        """
        assert self.binder is not None
        term = elector.term
        selector = f"spec.schedulerName={self.config.scheduler_name},spec.nodeName="
        while elector.term == term and elector.is_leading(self.clock()):
            try:
                for pod in await self.binder.list_pods(field_selector=selector):
                    meta = pod.metadata
                    key = PodKey(namespace=meta.namespace, name=meta.name, uid=meta.uid)
                    try:
                        written = await self.notices.patch(
                            self.binder, key, {LEADER_TERM: str(term)}
                        )
                    except NotFound:
                        continue
                    self._pod_changed("MODIFIED", written)  # ours: the watch has yet to show it
            except KubeError as e:
                log.warning("fence_failed", term=term, error=e.message)
                await asyncio.sleep(1.0)
                continue
            self.fenced_term = term
            log.info("fenced", term=term)
            return

    def leadership_lost(self, elector: Elector) -> None:
        if self._fencing is not None:
            self._fencing.cancel()  # a term that ended has nothing left to fence
            self._fencing = None
        # A deposed leader writes nothing: the gate shuts (``may_write``), and what its
        # writers queued in its term is dropped, not sent should it lead again.
        self.writing_term = None
        self.notices.stand_down()
        if self.recorder is not None:
            self.recorder.stand_down()
        self.metrics.leading.set(0)
        log.warning("leadership_lost", identity=elector.identity)

    def _synced_changed(self) -> None:
        self.metrics.synced.set(1 if self.is_synced else 0)
        if self.is_synced and self.freeze_gc_when_synced:
            self.freeze_gc_when_synced = False
            _freeze_loaded_objects()

    # -- what the API server says (from sync.py or standalone.py) ---------------------------

    def nodes_listed(self, nodes: Iterable[Node]) -> None:
        listed = list(nodes)
        self.node_taints.clear()
        self.cordoned.clear()
        for node in listed:
            self._note_node_spec(node)
        self.ledger.replace_nodes(n for n in map(_node_tuple, listed) if n is not None)
        self.has_nodes = True
        self._synced_changed()

    def node_changed(self, change: str, node: Node) -> None:
        if change == "DELETED":
            self.ledger.remove_node(node.metadata.name)
            self.node_taints.pop(node.metadata.name, None)
            self.cordoned.discard(node.metadata.name)
            return
        self._note_node_spec(node)
        found = _node_tuple(node)
        if found is not None:
            name, allocatable, labels = found
            self.ledger.upsert_node(name, allocatable=allocatable, labels=labels)
            if change == "ADDED" and self.has_pods:
                # Room may come back with the node (its pods' holds are re-counted).
                self.recheck_queue()

    def _note_node_spec(self, node: Node) -> None:
        """The node's taints and cordon, for the recommender (kube-scheduler applies them
        itself, so the ledger does not keep them)."""
        name = node.metadata.name
        if node.spec.taints:
            self.node_taints[name] = list(node.spec.taints)
            if _has_drain_taint(node.spec.taints):
                self.relief_book.taint_seen(name)
        else:
            self.node_taints.pop(name, None)
        if node.spec.unschedulable:
            self.cordoned.add(name)
        else:
            self.cordoned.discard(name)

    def pods_listed(self, pods: Iterable[Pod]) -> None:
        infos: list[PodInfo] = []
        self.unbound.clear()
        self.unbound_specs.clear()
        self.vm_containers.clear()
        self.vm_memory_overheads.clear()
        self.notices.relisted()
        moving: list[tuple[PodInfo, tuple[str, str]]] = []
        for pod in pods:
            info = self._info(pod)
            if info is not None:
                infos.append(info)
                self._track(info, pod)
                to = parse_migration_to(pod.metadata.annotations)
                if to is not None and ANNOTATION_MIGRATION in (pod.metadata.annotations or {}):
                    moving.append((info, to))
        events = self.ledger.replace_pods(infos, at=self.wall_clock())
        self.reporter.report(events, is_initial=not self.has_pods)
        self._rebuild_moves(moving, {info.key for info in infos})
        listed = {info.uid for info in infos}
        for uid in self._queued - listed:
            # Deleted while the watch was down: it neither waits nor holds quota any more.
            self._forget_queued(uid)
        for info in infos:
            self._observe(info)
        self.parked.retain({info.uid for info in self.unbound.values()})
        self.has_pods = True
        self._synced_changed()
        self.recheck_queue()

    def _rebuild_moves(self, moving: list[tuple[PodInfo, tuple[str, str]]], keys: set[str]) -> None:
        """The ledger's moves are not in the API server; their reservations are, as far as
        they matter: a moving VM's source pod names its target (``MIGRATION_TO``), and while
        that target pod does not exist yet its room is held again here, as the vm-controller
        reserved it (``reserve_move``). A target pod that exists is counted as any bound pod
        (both nodes hold the VM until either pod is gone, as during the move). A reservation
        that no longer fits is logged: the controller's move then fails on its own."""
        for info, (node, name) in moving:
            if info.uid in self.ledger.moves or f"{info.namespace}/{name}" in keys:
                continue
            try:
                event = self.ledger.reserve_move(
                    info.uid, target_name=name, target_node=node, at=self.wall_clock()
                )
            except ledger_errors.LedgerError as e:
                log.warning("move_not_rebuilt", pod=info.key, target_node=node, error=str(e))
                continue
            self.reporter.report([event])
            log.info("move_rebuilt", pod=info.key, target_node=node, target_pod=name)

    def pod_changed(self, change: str, pod: Pod) -> None:
        """From the pod watch."""
        self.notices.seen(pod.metadata.uid, pod.metadata.resource_version)
        self._pod_changed(change, pod)

    def _pod_changed(self, change: str, pod: Pod) -> None:
        if change == "DELETED":
            self._forget(pod.metadata.uid, f"{pod.metadata.namespace}/{pod.metadata.name}")
            return
        info = self._info(pod)
        if info is None:
            return
        self._track(info, pod)
        self.reporter.report(self.ledger.observe_pod(info, at=self.wall_clock()))
        self._observe(info)
        if self.has_pods:
            # A pod that finished or shrank may have given quota back.
            self.recheck_queue()

    def _forget(self, uid: str, key: str) -> None:
        found = self.unbound.get(key)
        if found is not None and found.uid == uid:
            del self.unbound[key]
            self.unbound_specs.pop(key, None)
        self.vm_containers.pop(uid, None)
        self.vm_memory_overheads.pop(uid, None)
        self.parked.unpark(uid)
        if self.recorder is not None:
            self.recorder.forget(uid)
        move = self.ledger.moves.get(uid)
        if move is not None and move.is_target_observed:
            # The source of a move is gone with its target pod running: the VM is that pod
            # now, and relief's cool-down and want go with it.
            self.relief_book.move_finished(uid, move.target_uid)
        self.reporter.report(self.ledger.forget_pod(uid))
        self._forget_queued(uid)
        if self.has_pods:
            self.recheck_queue()

    # -- the admission queue ----------------------------------------------------------------

    def _observe(self, info: PodInfo) -> None:
        self.admission.observe_pending(info)
        if info.is_ours and not info.is_terminated and info.node_name is None:
            self._queued.add(info.uid)
        else:
            self._queued.discard(info.uid)

    def _forget_queued(self, uid: str) -> None:
        self._queued.discard(uid)
        self.admission.forget(uid)
        self.notices.forget(uid)

    def admit(self, info: PodInfo) -> AdmissionDecision:
        """May ``info`` be placed now (filter and bind ask)? A waiting pod gets an Event."""
        now = self.clock()
        decision = admission.admit(self.admission, info, now=now)
        if info.is_ours and not info.is_terminated and info.node_name is None:
            # Filter may see a pod before the watch does: a relist must still forget it.
            self._queued.add(info.uid)
        if not decision.is_admitted:
            key = PodKey(namespace=info.namespace, name=info.name, uid=info.uid)
            self.notices.waiting(key, decision.reason, now=now)
        else:
            # Its pass may have admitted others that were told to wait: nudge them now.
            self.recheck_queue()
        return decision

    def recheck_queue(self) -> list[PodKey]:
        """Re-run the queue where room may have grown; nudge (and return) who got in."""
        admitted = admission.recheck(self.admission, now=self.clock())
        if admitted:
            self.notices.admitted(admitted)
        return admitted

    def quotas_loaded(self, quotas: QuotaConfig) -> list[PodKey]:
        """A (re)loaded quota section: re-check every queue, nudge who got in."""
        admitted = self.admission.set_quotas(quotas, now=self.clock())
        if admitted:
            self.notices.admitted(admitted)
        log.info("quotas_loaded", namespaces=len(quotas.namespaces), admitted=len(admitted))
        return admitted

    def _info(self, pod: Pod) -> PodInfo | None:
        try:
            return pod_info(pod, scheduler_name=self.config.scheduler_name)
        except PodError as e:
            # The API server validates quantities, so this is a pod we cannot reason about;
            # counting it as zero would be a lie, but refusing the whole list would be worse.
            log.warning("pod_unreadable", error=str(e))
            return None

    def _track(self, info: PodInfo, pod: Pod) -> None:
        key = info.key
        if info.is_ours and info.node_name is None and not info.is_terminated:
            self.unbound[key] = info
            self.unbound_specs[key] = pod.spec
        else:
            found = self.unbound.get(key)
            if found is not None and found.uid == info.uid:
                del self.unbound[key]
                self.unbound_specs.pop(key, None)
            self.parked.unpark(info.uid)
        if info.is_ours and info.vm is not None and not info.is_terminated:
            container = vm_container_name(pod)
            if container is not None:
                self.vm_containers[info.uid] = container
            self.vm_memory_overheads[info.uid] = info.container_memory_overhead_bytes
            if self.recorder is not None:
                self.recorder.observed(info.uid, info.permitted_vcpus, info.permitted_memory_bytes)

    # -- bind: the commit point ------------------------------------------------------------

    async def bind(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        filtered: PodInfo | None = None,
    ) -> str:
        """Decide (``core.verbs.bind_pod``: which version of the pod, admission, the fit),
        then POST the Binding; returns "" or the error for kube-scheduler.

        ``filtered``: the pod as kube-scheduler last sent it to filter (see ``bind_pod``).
        """
        key = f"{namespace}/{name}"
        touching = self.notices.before_bind(uid)
        if touching is not None:
            # Our own wake-up patch of this pod is on its way: the Binding follows it, with
            # the version it makes (``queue_notices``: no Binding of ours fails on our patch).
            await asyncio.wait([touching])
            self.require_synced()  # the Lease is asked again after an await
        decided = verbs.bind_pod(
            self.ledger,
            key=key,
            uid=uid,
            node=node,
            known=self.unbound.get(key),
            filtered=filtered,
            is_in_flight=uid in self.binds_in_flight,
            admit=self.admit,
            at=self.wall_clock(),
        )
        if decided.outcome is BindOutcome.REFUSED:
            self.metrics.binds.labels("refused").inc()
            log.info("bind_refused", pod=key, node=node, reason=decided.error)
        if decided.outcome is not BindOutcome.RESERVED:
            return decided.error
        info, event = decided.info, decided.event
        assert info is not None
        if decided.is_before_watch:
            log.info("bind_before_watch", pod=key, node=node, uid=uid)
        self.reporter.report([event] if event is not None else [], is_announced=True)
        if self.binder is None:
            # Standalone: no API server to ask; the pod is bound as soon as it is reserved.
            self.unbound.pop(key, None)
            self.unbound_specs.pop(key, None)
            bound = msgspec.structs.replace(info, node_name=node)
            self.reporter.report(self.ledger.observe_pod(bound, at=self.wall_clock()))
            self.metrics.binds.labels("bound").inc()
            return ""
        is_bound = False
        self.binds_in_flight.add(uid)
        try:
            version = self.notices.version(uid) or info.resource_version or None
            await self.binder.bind_pod(
                namespace, name, uid=uid, node=node, resource_version=version
            )
            is_bound = True
        except KubeError as e:
            log.info("bind_failed", pod=key, node=node, error=e.message, status=e.status)
            return f"binding {key} to {node} failed: {e.message}"
        finally:
            self.binds_in_flight.discard(uid)
            if not is_bound:
                # Also on cancellation: a reservation nobody will confirm must not stay.
                self.reporter.report(self.ledger.cancel_bind(uid))
                self.metrics.binds.labels("failed").inc()
        self.metrics.binds.labels("bound").inc()
        return ""

    # -- permits -----------------------------------------------------------------------------

    def permits(
        self, batch: ResourceRequestBatch, *, token_node: str | None
    ) -> PermitsDecided | Refused:
        """Admit, negotiate, decide, record (``core.batches``). Raises ``NotLeader`` and
        ``NotSynced`` (this replica's state); returns the core's refusals; all or nothing.

        Counts how many permits got each status (for the request's log line; the sequence
        refusals as ``stale``). One pass over the decisions does the metrics, the durable
        writes and the capacity waits: every per-VM loop shows at scale.
        """
        version = batches.admit(batch, token_node=token_node)
        if isinstance(version, Refused):
            return version
        self.require_synced()
        decisions = batches.decide(
            self.ledger,
            self.sequences,
            batch,
            version,
            quota_room=partial(admission.quota_room, self.admission),
        )
        if isinstance(decisions, Refused):
            return decisions
        if self.config.relief.enabled:
            self.relief_book.permits_decided(
                self.ledger, batch.requests, decisions, now=self.wall_clock()
            )
        counts: dict[str, int] = {}
        shorts: dict[tuple[str, str], int] = {}
        stale = 0
        pods = self.ledger.pods
        recorder = self.recorder
        waits = self.capacity_waits
        now = self.clock()
        for decision in decisions:
            permit = decision.permit
            if decision.refused is not None and decision.refused.kind in SEQUENCE_REFUSALS:
                stale += 1
                continue
            status = permit.status
            name = _STATUS_NAMES[status] if status is not None else "error"
            counts[name] = counts.get(name, 0) + 1
            if decision.short_of is not None:
                key = (name, decision.short_of.value)
                shorts[key] = shorts.get(key, 0) + 1
            if status in _SHORT:
                waits.permit_answered(permit.pod.uid, permit.pod.key, is_short=True, now=now)
            elif status is not None:
                waits.permit_met(permit.pod.uid)
            if recorder is not None and permit.permit is not None:
                entry = pods[permit.pod.uid]
                assert entry.vcpus is not None and entry.memory_bytes is not None
                recorder.record(
                    entry.uid,
                    PermitWrite(
                        namespace=entry.namespace,
                        name=entry.name,
                        container=self.vm_containers.get(entry.uid),
                        vcpus=entry.vcpus,
                        memory_bytes=entry.memory_bytes,
                        resize_memory=entry.vm is not None
                        and entry.vm.max_memory_bytes > entry.vm.min_memory_bytes,
                        memory_overhead_bytes=self.vm_memory_overheads.get(entry.uid, 0),
                    ),
                )
        for name, count in counts.items():
            self.metrics.permits.labels(name).inc(count)
        for (name, limit), count in shorts.items():
            self.metrics.permits_short.labels(name, limit).inc(count)
        if "released" in counts:
            # A VM shrank: its namespace's quota has room again.
            self.recheck_queue()
        if stale:
            counts["stale"] = stale
        return PermitsDecided(version, decisions, counts)

    def move(self, request: MoveRequest) -> MoveAnswer:
        """``POST /v1/moves`` (``protocol.moves``), decided by the ledger (*Moves*): reserve a
        moving VM's room on its target node before the target pod exists (a target node left
        out: relief's own choice, ``choose_target``, cordoned nodes never), or cancel that. Only
        the leader, synced, answers (``require_synced``: at most one replica holds a move).
        The ledger refuses with nothing changed; each refusal is a 4xx here, named."""
        self.require_synced()
        uid = request.source_uid
        if isinstance(request, CancelMove):
            self.reporter.report(self.ledger.cancel_move(uid))
            log.info("move_cancelled", source_uid=uid)
            return MoveAnswer(op="cancel", source_uid=uid)
        target = request.target_node
        try:
            if target is None:
                target = choose_target(
                    self.ledger, uid, config=self.config.relief, closed=self.cordoned
                )
            event = self.ledger.reserve_move(
                uid,
                target_name=request.target_pod,
                target_node=target,
                at=self.wall_clock(),
            )
        except ledger_errors.UnknownPod as e:
            raise UnknownPod(str(e)) from e
        except ledger_errors.UnknownNode as e:
            raise UnknownNode(str(e)) from e
        except ledger_errors.NoRoom as e:
            raise MoveRefused(str(e), reason="NoRoom") from e
        except ledger_errors.Conflict as e:
            raise MoveRefused(str(e), reason="Conflict") from e
        self.reporter.report([event])
        log.info(
            "move_reserved",
            source_uid=uid,
            target_pod=request.target_pod,
            target_node=target,
            chosen=request.target_node is None,
        )
        return MoveAnswer(
            op="reserve",
            source_uid=uid,
            target_node=target,
            reserved_millicpu=event.held.cpu_millis,
            reserved_memory_bytes=event.held.memory_bytes,
        )

    # -- relief ----------------------------------------------------------------------------

    def migrations_listed(self, migrations: Iterable[VirtualMachineMigration]) -> None:
        """The VirtualMachineMigration list: relief's moves, cool-downs and backoffs are
        rebuilt from it (``ReliefBook.migrations_listed``), as after a restart or failover."""
        now = self.wall_clock()
        self.relief_book.migrations_listed({_key(m): record_of(m, now=now) for m in migrations})
        self.has_migrations = True

    def migration_changed(self, change: str, migration: VirtualMachineMigration) -> None:
        if change == "DELETED":
            self.relief_book.migration_gone(_key(migration))
        else:
            record = record_of(migration, now=self.wall_clock())
            self.relief_book.migration_seen(_key(migration), record)

    def relief_pass(self) -> ReliefPlan:
        """One relief pass (``core.relief``): the moves to start now, and the drains' taints
        and evictions (``scheduler_extender.relief``). The caller records each
        in the book (``ReliefBook.move_started``) before its first await. Cordoned nodes are
        never targets. Raises ``NotLeader`` and ``NotSynced`` as every decision does, and
        ``NotSynced`` until the VirtualMachineMigrations are listed (without them, moves in
        flight and cool-downs are unknown)."""
        self.require_synced()
        if not self.has_migrations:
            raise NotSynced(
                "the extender has not loaded the VirtualMachineMigration list yet",
                retry_after_seconds=self.config.not_synced_retry_after_seconds,
            )
        now = self.wall_clock()
        config = self.config.relief
        book = self.relief_book
        # The drains are the nodes carrying the drain taint (``scheduler_extender.relief``):
        # a restarted extender finds them again; an operator who removes it ends the drain.
        book.set_drains(
            {name for name, taints in self.node_taints.items() if _has_drain_taint(taints)},
            now=now,
        )
        book.forget_gone(self.ledger, now=now, config=config)
        return plan_moves(self.ledger, book, now=now, config=config, closed=self.cordoned)


class PermitsDecided(NamedTuple):
    """A decided batch: its version, each VM's decision in order, and the statuses counted."""

    version: ProtocolVersion
    decisions: list[Decision]
    counts: dict[str, int]


def _has_drain_taint(taints: Iterable[Taint]) -> bool:
    """The node carries relief's drain taint (``scheduler_extender.relief``)."""
    return any(t.key == DRAIN_TAINT for t in taints)


def _key(migration: VirtualMachineMigration) -> str:
    return f"{migration.metadata.namespace}/{migration.metadata.name}"


def _freeze_loaded_objects() -> None:
    """Move everything alive after the first lists out of the cyclic GC's reach (once).

    The ledger, its indexes and the decoded lists' survivors are long-lived: without this, every
    full collection walks all of them again (a pause that grows with the number of pods:
    ``scripts/bench_extender.py --no-freeze-gc`` measures it), and the pause lands on whichever
    request allocated last. ``gc.freeze`` moves them to a permanent generation; reference counting
    still frees them when they go away. Objects created later (relists, new pods) are collected as
    usual.
    """
    gc.collect()
    gc.freeze()


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def _node_tuple(node: Node) -> tuple[str, Demand, dict[str, str]] | None:
    alloc = node.status.allocatable or {}
    try:
        demand = Demand(cpu_millis(alloc.get("cpu", "0")), memory_bytes(alloc.get("memory", "0")))
    except QuantityError as e:
        log.warning("node_unreadable", node=node.metadata.name, error=str(e))
        return None
    return node.metadata.name, demand, dict(node.metadata.labels or {})
