"""Relief and live drain: which VM moves live to which node, and why.

Pure: no I/O, no awaits, no clock (``now`` is passed in: the wall clock's seconds, as the
API server's timestamps count them, see *The book* below), no randomness; the same ledger,
book, time and config give the same plan. ``plan_moves`` only *reads* the ledger:
the caller starts each move it returns with ``Ledger.reserve_move`` (which holds the VM's room on
the target while the source keeps its own, so no node is over-committed at any step of a move),
and ends it with the target pod's take-over and the source pod's deletion, or ``cancel_move``.

The rule, in the order a pass applies it (one pass, one budget):

1. **Budget.** At most ``max_moves_in_flight`` moves at once in the cluster, and no more than
   ``max_moves_share`` of the known nodes (at least one); at most one outbound move per node
   (a node with a move leaving it starts no other); the moves *in flight* (below) count. A
   VM is moved only if it is a bound, verified VM of ours (its agent has reported: an
   unverified VM's size is not known, so no target's room can be checked), controlled by a
   VirtualMachine (a VirtualMachineMigration names the VM; a VM pod made by hand has none, so
   nothing could move it), not moving, not opted out (``vm-autoscaling.io/never-move:
   "true"``, which the vm-controller writes from the VirtualMachine's ``spec.neverMove``,
   and which the ledger follows on a running pod), not moved in the last ``cooldown_seconds`` (no
   ping-pong; a move that failed counts too; a drain's moves wait for no cool-down, rule 4),
   and not within its **failure backoff**: after
   ``n`` failed moves in a row, ``failure_backoff_seconds * 2**(n-1)`` from the last failure's
   end, at most ``failure_backoff_max_seconds``. Kubernetes doubles the same way: the
   kubelet's CrashLoopBackOff from 10 s up to 5 minutes (``pkg/kubelet/kubelet.go``,
   ``MaxContainerBackOff``), the Job controller's pod-failure backoff from 10 s up to 10
   minutes (``pkg/controller/job/job_controller.go``, ``MaxJobPodFailureBackOff``); a move
   costs more than a restart, so the steps here are minutes. Failures older than twice the
   longest backoff are forgiven (the kubelet forgives a container that ran 10 minutes; a Job's
   deleted pods take their failures with them, as a deleted VirtualMachineMigration does here).

   *In flight* is every move the ledger holds (``ledger.moves``, reserved by the vm-controller's
   ``POST /v1/moves``) and every VirtualMachineMigration not yet ended (``ReliefBook``'s
   records, whoever created it), counted once per VM: a migration created but not yet reserved
   is in the budget, its VM moving, its source node busy and its target's room spoken for in
   this pass's view, so two passes in a row never start more than the budget allows.
2. **Relief of a VM cut short.** A VM whose last grow was cut short by its node's room (the
   permit rules' ``ShortOf.NODE``; ``ReliefBook.permits_decided`` keeps its *requested* size),
   oldest shortfall first, for as long as the VM keeps asking: the agent asks again at every
   permit retry while it still wants more (``extender.permit_retry_seconds``, 5 s) and says
   nothing once its load has gone, so a want not asked again within ``want_ttl_seconds`` is
   over (a VM cut short while its guest booted is not moved long after, when room appears).
   Either the VM itself moves, to a node with room for its full requested size now, or a
   neighbour on its node moves away, the smallest (by memory: the quickest move) whose
   leaving frees what the VM still lacks. Of the two, the one that moves
   less memory; on a tie, the VM itself. A target never lacks room for what the moving VM is
   to hold (a VM cut short: its requested size; a neighbour: its size), and never ends above
   the watermark.
3. **Watermark.** A node whose reservations (ours and foreign) exceed ``watermark`` of what it
   can give, in CPU or memory, moves one VM away per pass, the oldest (longest held there)
   first, to a node that stays under the watermark with it.
4. **Drain** (``drain.enabled``, off by default), in Karpenter's order: taint first (the
   caller puts ``DRAIN_TAINT``, NoSchedule, on each node of ``drain``: nothing new lands
   there), then the node's VMs move away, the smallest first, one at a time (rule 1, but for
   the cool-down: a drained node is never a target, so a VM that leaves it cannot come back,
   and a VM moved there a moment ago leaves at once rather than ``cooldown_seconds`` after the
   taint; a failing move still backs off), then,
   once none of ours holds anything there, its other pods are **evicted** (``evict``: each
   through the Eviction API, so their PodDisruptionBudgets decide when; a refusal, HTTP 429,
   is tried again ``EVICTION_RETRY_SECONDS`` later, as ``kubectl drain`` retries, never by
   deleting the pod), except the pods ``kubectl drain --ignore-daemonsets`` leaves
   (``Disruption``: DaemonSet pods and mirror pods). Once nothing but such pods holds
   anything there, the plan reports it ``emptied`` (removing it is the cloud's:
   cluster-autoscaler deletes a node it finds empty, DaemonSet and mirror pods aside, after
   ``scale-down-unneeded-time``; Karpenter's emptiness consolidation does the same for a
   NodeClaim). A new drain starts, at most ``drain.max_nodes`` at once, on the least used node
   (the larger of its CPU and memory shares) below ``drain.below_share``, with
   **hysteresis**: not one that received a VM (its allocation's ``allocated_at``, or a move's
   creation) or had one grow in the last ``drain.hysteresis_seconds`` (an empty node is never
   a candidate, so a node's joining needs no mark of its own; a rebuilt ledger's allocations
   are new, so a restart holds drains back a hysteresis, as cluster-autoscaler's unneeded time
   starts over when it restarts); not one with a pod kubectl drain would refuse to evict (no
   controller, or an ``emptyDir`` not named safe to evict: ``Disruption.blocks``); not one
   with a VM that cannot move; and only if every VM there fits elsewhere now (first fit on
   this pass's view, under the watermark).

Drained and ``closed`` nodes (cordoned, or the caller's own reasons) are never targets.

A move someone asks for without naming a node (a ``VirtualMachineMigration`` without
``targetNode``) goes where this rule sends a moving VM: ``choose_target``, the same target
choice as rules 3 and 4 (the open node, under the watermark with the VM, with the most room left).

The references, and where this differs:

* Neon's scheduler plugin (neondatabase/autoscaling ``pkg/plugin/state``: ``node.go``'s
  watermark, ``migration.go``): above a 0.9 watermark of a node's reservations it migrates VMs
  away, the oldest first, only VMs labelled for auto-migration (opt-in), one at a time per node.
  Here rule 3 is the same watermark rule, but moving is **opt-out** (a VM's pod names itself
  ``never-move``), because our VMs grow in place: a VM never moved cannot be relieved at all,
  and a cluster whose VMs all opted in by default is what Neon's opt-in was waiting for (their
  reason, the pod IP changing, is the network's to solve; a VM that cannot take it opts out).
  Neon has no rule 2 (its epics for automatic migration, #832, and draining, #834, are open):
  our extender knows which grow was cut short and by how much, so relief goes to that VM first,
  and its target is checked for the VM's *requested* size, not only its current one.
* Karpenter's disruption (``karpenter.sh/do-not-disrupt``, budgets of 10 % of nodes by
  default, taint first, replacement before eviction): the 10 % share is ``max_moves_share``;
  ``never-move`` is ``do-not-disrupt`` for moves; "replacement before eviction" holds by
  construction, as a move reserves the target before anything leaves the source. Karpenter
  evicts (the guest reboots); a live move keeps it running, so the budget counts moves, not
  nodes.
* KubeVirt's defaults (5 migrations per cluster, 2 outbound per node): one outbound per node
  here, as Neon, so a node's migration bandwidth goes to one VM and its room returns soonest.
* KEP-5836 (Kubernetes 1.37): kube-scheduler evicts lower-priority pods on the node for a
  *Deferred* in-place resize. Our VMs never reach Deferred (the extender grants before the agent
  resizes), so the grant cut short is our trigger, and we move rather than evict.

*The book* (``ReliefBook``) is what relief remembers between passes. Its moves are the
cluster's VirtualMachineMigrations (``MoveRecord``, ``record_of``): the shell feeds it the list
and every watch event, and records the moves it creates itself (``move_started``) before the
watch shows them. A restarted or newly leading extender lists the same objects, so it rebuilds
the same cool-downs, backoffs and moves in flight: a VM is never moved back at once because an
extender restarted. That is why ``now`` is the wall clock: the objects' times are the API
server's (``creationTimestamp``, ``status.completionTime``), and with one clock the rebuilt
book equals the live one exactly (a clock step shifts a cool-down by the step; Kubernetes'
TTL-after-finished controller judges Jobs' ``completionTime`` the same way). Not rebuilt: the
wants (the agents report again at once when the extender's epoch changes, and a cut-short
grow is a want again from that answer), the nodes' hysteresis from grows (a rebuilt ledger's
allocations are new, so a restart holds every node's drain back a hysteresis), the
evictions under way (a pod evicted is terminating, and evicting it again is harmless), and a
create that never reached the API server (nothing moved; it is a failure only to the book that
tried it). The drains are the nodes' ``DRAIN_TAINT`` as the node watch shows them, and the
ones this book tainted (``drain_started``) that the watch has not shown tainted yet
(``set_drains``): an event from before the taint may arrive after the taint's own answer, and
must not end the drain (the next pass would start another, past ``drain.max_nodes``). The
shell reports each node the watch shows tainted (``taint_seen``); a drain it never shows is
dropped after ``TAINT_SEEN_WITHIN_SECONDS`` (a re-list can skip a taint put on and taken off
between two lists).

Not here: the moves' I/O (VirtualMachineMigration objects, taints, evictions), which the shell
does with what ``plan_moves`` returns (``scheduler_extender.relief``); and reserving the
grower's *requested* size on its target (``reserve_move`` holds the VM's size now; the room for
the rest was checked in this plan, and the VM asks for it again on arrival).
"""

from __future__ import annotations

import datetime
import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from protocol.bounds import INT32_MAX, MAX_SECONDS
from protocol.permits import ResourceRequest
from protocol.virtualmachine import VirtualMachineMigration
from scheduler_extender.core.ledger import (
    Allocation,
    Ledger,
    NodeState,
    NoRoom,
    Owner,
    UnknownPod,
    held_at,
)
from scheduler_extender.core.permits import Decision, ShortOf
from scheduler_extender.core.podinfo import ZERO, Demand, Disruption

__all__ = [
    "EVICTION_RETRY_SECONDS",
    "DrainConfig",
    "Eviction",
    "MovePhase",
    "MoveReason",
    "MoveRecord",
    "PlannedMove",
    "ReliefBook",
    "ReliefConfig",
    "ReliefPlan",
    "Want",
    "in_flight",
    "plan_moves",
    "record_of",
]

# After an eviction refused (429: a PodDisruptionBudget allows no disruption now), the pod is
# tried again this much later, or the API server's Retry-After if longer: kubectl drain's 5 s
# (``staging/src/k8s.io/kubectl/pkg/drain/drain.go``, ``evictPods``).
EVICTION_RETRY_SECONDS = 5.0
# A drain this book started counts until the node watch shows its taint, or this long.
TAINT_SEEN_WITHIN_SECONDS = 60.0

Share = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
AtLeastOne = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_SECONDS)]


class DrainConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Live scale-down (the config's ``relief.drain``); off by default."""

    enabled: bool = False
    # A node whose larger share (CPU or memory) of its usable room is held below this may go.
    below_share: Share = 0.3
    # A node that received a VM, had a VM grow, or joined this recently is not drained.
    hysteresis_seconds: Seconds = 600.0
    # Nodes drained at once.
    max_nodes: AtLeastOne = 1


class ReliefConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Relief's settings (the config's ``relief``); see the module docstring for the rule."""

    # The caller's switch: off, no pass runs (``plan_moves`` itself plans whatever it is asked).
    enabled: bool = False
    # Neon's: a node above this share of its usable room, in CPU or memory, moves a VM away;
    # no target is filled above it. None: no watermark rule, targets filled up to their room.
    watermark: Share | None = 0.9
    # Moves under way at once in the cluster, and as a share of the known nodes (at least one).
    max_moves_in_flight: AtLeastOne = 2
    max_moves_share: Share = 0.1
    # A VM moved is not moved again for this long (from its move's creation).
    cooldown_seconds: Seconds = 600.0
    # A grow cut short is wanted for this long after the VM last asked for it (the agent asks
    # again every permit retry, 5 s by default, while it still wants more): keep it above the
    # agents' ``extender.permit_retry_seconds``.
    want_ttl_seconds: Annotated[float, msgspec.Meta(gt=0.0, le=MAX_SECONDS)] = 30.0
    # After a failed move, the VM waits this long from the failure's end, doubled for each
    # further failure in a row, up to the maximum (see the module docstring).
    failure_backoff_seconds: Seconds = 600.0
    failure_backoff_max_seconds: Seconds = 3600.0
    drain: DrainConfig = msgspec.field(default_factory=DrainConfig)

    def __post_init__(self) -> None:
        if self.failure_backoff_seconds > self.failure_backoff_max_seconds:
            raise ValueError(
                "relief.failure_backoff_seconds must not be above failure_backoff_max_seconds"
            )


class MoveReason(enum.StrEnum):
    GROWER = "GrowerToRoom"  # the VM cut short moves to a node with room for its request
    NEIGHBOUR = "NeighbourAway"  # a neighbour moves away so that the VM cut short grows
    WATERMARK = "AboveWatermark"  # its node is above the watermark
    DRAIN = "Drain"  # its node is being drained


class PlannedMove(msgspec.Struct, frozen=True, kw_only=True):
    """One move to start: the VM's pod (``uid``, ``pod``), from ``source`` to ``target``."""

    uid: str
    pod: str
    source: str
    target: str
    reason: MoveReason
    message: str
    # The VirtualMachine that moves, ``namespace/name`` (what its migration names).
    vm: str = ""
    # The VM cut short it is for (GROWER: itself; NEIGHBOUR: the neighbour's), else None.
    relieves: str | None = None


class Eviction(msgspec.Struct, frozen=True, kw_only=True):
    """A pod to evict (the Eviction API, with its ``uid`` as a precondition) from a drained
    node."""

    uid: str
    pod: str  # namespace/name
    node: str


class ReliefPlan(msgspec.Struct, frozen=True, kw_only=True):
    moves: list[PlannedMove]
    # Nodes this pass starts to drain (the caller taints them and adds them to the book).
    drain: list[str]
    # Nodes being drained that nothing holds anything on any more (but the pods a drain
    # leaves: ``Disruption.is_left``).
    emptied: list[str]
    # A sentence for each VM cut short that no move relieves in this pass.
    unrelieved: list[str]
    # Pods to evict now from drained nodes that none of our VMs holds anything on any more.
    evict: list[Eviction] = msgspec.field(default_factory=list)


class MovePhase(enum.StrEnum):
    """A VirtualMachineMigration's ``status.phase`` (none yet: ``PENDING``)."""

    PENDING = "Pending"  # created; the vm-controller has not started it (nor reserved, maybe)
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class MoveRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One VirtualMachineMigration as relief counts it, whoever created it: the VM it moves
    (``namespace/vmName``), its target node, its phase, when it was created
    (``metadata.creationTimestamp``) and when it ended (``status.completionTime``), in the
    book's seconds."""

    vm: str
    target_node: str | None
    phase: MovePhase
    created: float
    ended: float | None = None

    @property
    def is_active(self) -> bool:
        return self.phase is MovePhase.PENDING or self.phase is MovePhase.RUNNING

    @property
    def last(self) -> float:
        return self.ended if self.ended is not None else self.created


def _seconds(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def record_of(migration: VirtualMachineMigration, *, now: float) -> MoveRecord:
    """``migration`` as the book keeps it. Times are RFC 3339 as the API server writes them;
    one missing or unreadable counts as ``now`` (creation) or as the creation (an end)."""
    meta, status = migration.metadata, migration.status
    created = _seconds(meta.creation_timestamp)
    created = now if created is None else created
    phase = MovePhase(status.phase) if status.phase is not None else MovePhase.PENDING
    ended = None
    if phase is MovePhase.SUCCEEDED or phase is MovePhase.FAILED:
        ended = _seconds(status.completion_time)
        ended = created if ended is None else ended
    return MoveRecord(
        vm=f"{meta.namespace}/{migration.spec.vm_name}",
        target_node=migration.spec.target_node or status.target_node,
        phase=phase,
        created=created,
        ended=ended,
    )


@dataclass(slots=True)
class Want:
    """A VM's grow cut short by its node: the size it asked for, as its pod would hold it,
    since its first shortfall, and when it last asked."""

    requested: Demand
    since: float
    asked: float

    def is_live(self, *, now: float, config: ReliefConfig) -> bool:
        return now - self.asked < config.want_ttl_seconds


@dataclass(slots=True)
class ReliefBook:
    """What relief remembers between passes; mutable, pure (every method takes ``now``)."""

    wants: dict[str, Want] = field(default_factory=dict)  # by the VM pod's uid
    # The cluster's VirtualMachineMigrations, by ``namespace/name`` (module docstring).
    migrations: dict[str, MoveRecord] = field(default_factory=dict)
    touched_at: dict[str, float] = field(default_factory=dict)  # by node: a VM there grew
    draining: set[str] = field(default_factory=set)
    # By node: drains this book started whose taint the node watch has not shown yet, and when.
    tainting: dict[str, float] = field(default_factory=dict)
    # By pod uid: evictions the API server accepted (the pod is terminating: not again), and
    # when a refused one may be tried again.
    evicted: set[str] = field(default_factory=set)
    evict_retry_at: dict[str, float] = field(default_factory=dict)

    def permits_decided(
        self,
        ledger: Ledger,
        requests: Sequence[ResourceRequest],
        decisions: Sequence[Decision],
        *,
        now: float,
    ) -> None:
        """A decided batch (``core.batches.decide``, in the same order): a grow the node cut
        short is wanted at its requested size, from its first shortfall; any other answer ends
        the want (a full grant, a steady or lower request); a refused request changes nothing.
        A grant above the VM's last size marks its node as just grown (drain hysteresis)."""
        for req, decision in zip(requests, decisions, strict=True):
            if decision.refused is not None:
                continue
            uid = req.pod.uid
            entry = ledger.pods.get(uid)
            if entry is None:
                continue
            if decision.short_of is ShortOf.NODE:
                want = held_at(
                    entry, vcpus=req.requested.vcpus, memory_bytes=req.requested.memory_bytes
                )
                found = self.wants.get(uid)
                self.wants[uid] = Want(want, found.since if found is not None else now, now)
            else:
                self.wants.pop(uid, None)
            granted = decision.permit.permit
            if granted is not None and (
                granted.vcpus > req.current.vcpus or granted.memory_bytes > req.current.memory_bytes
            ):
                self.touched_at[entry.node] = now

    def move_started(self, move: PlannedMove, *, migration: str, now: float) -> None:
        """The caller creates the migration ``migration`` (``namespace/name``) for ``move``:
        in flight from now, before the watch shows the object (which then replaces this)."""
        self.migrations[migration] = MoveRecord(
            vm=move.vm, target_node=move.target, phase=MovePhase.PENDING, created=now
        )

    def move_ended(self, migration: str, *, succeeded: bool, now: float) -> None:
        """A move of this book's own ended (a simulated one, or a create the API server
        refused: a failure, which the backoff counts)."""
        found = self.migrations.get(migration)
        if found is not None and found.is_active:
            phase = MovePhase.SUCCEEDED if succeeded else MovePhase.FAILED
            self.migrations[migration] = msgspec.structs.replace(found, phase=phase, ended=now)

    def eviction_answered(
        self, uid: str, *, accepted: bool, now: float, retry_after: float | None = None
    ) -> None:
        """The API server's answer to an eviction of ``plan.evict``: accepted (or the pod was
        gone), or refused (a 429; any other failure too), to be tried again after
        ``EVICTION_RETRY_SECONDS`` or the server's ``retry_after``, whichever is longer."""
        if accepted:
            self.evicted.add(uid)
            self.evict_retry_at.pop(uid, None)
        else:
            wait = max(EVICTION_RETRY_SECONDS, retry_after or 0.0)
            self.evict_retry_at[uid] = now + wait

    def migration_seen(self, migration: str, record: MoveRecord) -> None:
        """The watch's ADDED or MODIFIED ``migration`` (``record_of``)."""
        self.migrations[migration] = record

    def migration_gone(self, migration: str) -> None:
        """DELETED: whoever deletes a failed migration lets its VM be tried again sooner."""
        self.migrations.pop(migration, None)

    def migrations_listed(self, records: Mapping[str, MoveRecord]) -> None:
        """A list: it replaces every record (a restart's rebuild, a relist's reconciliation)."""
        self.migrations = dict(records)

    def move_finished(self, source_uid: str, target_uid: str) -> None:
        """The VM runs as ``target_uid`` now: its want goes with it (its cool-down and backoff
        are the VM's, by name, and need no carrying)."""
        want = self.wants.pop(source_uid, None)
        if want is not None:
            self.wants[target_uid] = want

    def forget_gone(self, ledger: Ledger, *, now: float, config: ReliefConfig) -> None:
        """Drop what no longer matters: pods and nodes gone, wants not asked again within
        ``want_ttl_seconds``, cool-downs and hysteresis over.
        When every pod is gone and time has passed them, the book is empty again (a drained
        node stays in ``draining`` until it is removed)."""
        pods, nodes = ledger.pods, ledger.nodes
        for uid in [
            u
            for u, w in self.wants.items()
            if u not in pods or not w.is_live(now=now, config=config)
        ]:
            del self.wants[uid]
        self.evicted &= set(pods)
        for uid in [u for u in self.evict_retry_at if u not in pods]:
            del self.evict_retry_at[uid]
        # A move ended long enough ago affects nothing: not the cool-down, nor the backoff
        # (failures older than twice the longest are forgiven), nor the drain hysteresis.
        horizon = max(
            config.cooldown_seconds,
            2 * config.failure_backoff_max_seconds,
            config.drain.hysteresis_seconds,
        )
        for key in [
            k for k, r in self.migrations.items() if not r.is_active and now - r.last >= horizon
        ]:
            del self.migrations[key]
        hysteresis = config.drain.hysteresis_seconds
        for name in [
            n for n, t in self.touched_at.items() if n not in nodes or now - t >= hysteresis
        ]:
            del self.touched_at[name]
        self.draining &= set(nodes)
        for name in [n for n in self.tainting if n not in nodes]:
            del self.tainting[name]

    def drain_started(self, node: str, *, now: float) -> None:
        """The shell put the drain taint on ``node``: a drain from now on, whatever the node
        watch delivers before it shows the taint (see the module docstring)."""
        self.tainting[node] = now

    def taint_seen(self, node: str) -> None:
        """The node watch (or a list) shows ``node`` with the drain taint: from now on the
        watch alone says whether it still drains (an operator may remove the taint)."""
        self.tainting.pop(node, None)

    def set_drains(self, tainted: set[str], *, now: float) -> None:
        """The drains for this pass: the nodes the watch shows tainted, and the ones this book
        tainted that it has not shown yet (for ``TAINT_SEEN_WITHIN_SECONDS`` at most)."""
        for node in [n for n, at in self.tainting.items() if now - at >= TAINT_SEEN_WITHIN_SECONDS]:
            del self.tainting[node]
        self.draining = tainted | self.tainting.keys()

    @property
    def is_empty(self) -> bool:
        return not (
            self.wants
            or self.migrations
            or self.touched_at
            or self.draining
            or self.tainting
            or self.evicted
            or self.evict_retry_at
        )

    def by_vm(self) -> dict[str, list[tuple[float, str, MoveRecord]]]:
        """Every VM's records, oldest first."""
        out: dict[str, list[tuple[float, str, MoveRecord]]] = {}
        for key, record in self.migrations.items():
            out.setdefault(record.vm, []).append((record.created, key, record))
        for records in out.values():
            records.sort()
        return out


def _blocked(
    records: Sequence[tuple[float, str, MoveRecord]],
    *,
    now: float,
    config: ReliefConfig,
    is_drain: bool = False,
) -> str | None:
    """The cool-down (not for a drain's move: rule 4) and the failure backoff over one VM's
    records, oldest first."""
    if not records:
        return None
    last = max(r.created for _, _, r in records)
    cooldown = config.cooldown_seconds
    if not is_drain and now - last < cooldown:
        return f"it moved {now - last:.0f}s ago (cool-down {cooldown:.0f}s)"
    failures = 0
    failed_at = 0.0
    for _, _, record in records:
        if record.phase is MovePhase.SUCCEEDED:
            failures, failed_at = 0, 0.0
        elif record.phase is MovePhase.FAILED:
            failures += 1
            failed_at = max(failed_at, record.last)
    if failures:
        wait = min(
            config.failure_backoff_seconds * 2.0 ** min(failures - 1, 62),
            config.failure_backoff_max_seconds,
        )
        if now - failed_at < wait:
            return (
                f"its last {failures} move(s) failed; the next in {failed_at + wait - now:.0f}s"
                f" (backoff {wait:.0f}s)"
            )
    return None


def _vm_key(entry: Allocation) -> str:
    return f"{entry.namespace}/{entry.vm_name}" if entry.vm_name is not None else f"uid:{entry.uid}"


def in_flight(ledger: Ledger, book: ReliefBook) -> dict[str, list[MoveRecord]]:
    """The moves in flight, by VM (``namespace/name``; a pod no VirtualMachine controls by
    ``uid:<uid>``): every move the ledger holds, with no record, and every migration not yet
    ended, with its active records."""
    out: dict[str, list[MoveRecord]] = {}
    for uid in ledger.moves:
        source = ledger.pods.get(uid)
        out.setdefault(_vm_key(source) if source is not None else f"uid:{uid}", [])
    for record in book.migrations.values():
        if record.is_active:
            out.setdefault(record.vm, []).append(record)
    return out


class _View:
    """This pass's scratch view of every node's room: moves planned so far count on their
    targets (the source keeps its hold until its pod is gone, so its room does not grow)."""

    def __init__(self, ledger: Ledger, config: ReliefConfig) -> None:
        self.free: dict[str, Demand] = {}
        self.allocated: dict[str, Demand] = {}
        self.cap: dict[str, Demand] = {}  # what the watermark lets a target be filled to
        for name, state in ledger.nodes.items():
            if not state.is_known:
                continue
            self.free[name] = state.free
            self.allocated[name] = state.allocated + state.uncertain_total
            usable = state.usable
            mark = config.watermark if config.watermark is not None else 1.0
            self.cap[name] = Demand(
                math.floor(usable.cpu_millis * mark), math.floor(usable.memory_bytes * mark)
            )

    def copy(self) -> _View:
        other = _View.__new__(_View)
        other.free, other.allocated, other.cap = dict(self.free), dict(self.allocated), self.cap
        return other

    def takes(self, node: str, need: Demand) -> bool:
        free, alloc, cap = self.free[node], self.allocated[node], self.cap[node]
        return (
            need.cpu_millis <= free.cpu_millis
            and need.memory_bytes <= free.memory_bytes
            and alloc.cpu_millis + need.cpu_millis <= cap.cpu_millis
            and alloc.memory_bytes + need.memory_bytes <= cap.memory_bytes
        )

    def is_above_watermark(self, node: str) -> bool:
        alloc, cap = self.allocated[node], self.cap[node]
        return alloc.cpu_millis > cap.cpu_millis or alloc.memory_bytes > cap.memory_bytes

    def place(self, node: str, hold: Demand) -> None:
        f, a = self.free[node], self.allocated[node]
        self.free[node] = Demand(f.cpu_millis - hold.cpu_millis, f.memory_bytes - hold.memory_bytes)
        self.allocated[node] = a + hold

    def target(self, need: Demand, *, shut: set[str]) -> str | None:
        """The open node that takes ``need`` with the most room left after it (the larger of
        its two shares left: a target is least likely to need relief itself); names break
        ties."""
        best: tuple[float, str] | None = None
        for name in self.free:
            if name in shut or not self.takes(name, need):
                continue
            cap = self.cap[name]
            alloc = self.allocated[name]
            used = max(
                (alloc.cpu_millis + need.cpu_millis) / cap.cpu_millis if cap.cpu_millis else 1.0,
                (alloc.memory_bytes + need.memory_bytes) / cap.memory_bytes
                if cap.memory_bytes
                else 1.0,
            )
            if best is None or (used, name) < best:
                best = (used, name)
        return None if best is None else best[1]


def choose_target(
    ledger: Ledger,
    source_uid: str,
    *,
    config: ReliefConfig,
    closed: Iterable[str] = (),
) -> str:
    """The node a move of the VM pod ``source_uid`` goes to when its caller names none: relief's
    own choice for a VM moving away (``_View.target``: the open node that takes what the VM
    holds, stays under the watermark with it, and has the most room left), never the VM's own
    node nor a ``closed`` one (moves under way already hold their targets' room in the
    ledger). Reads the ledger, changes nothing. Raises
    ``UnknownPod`` (it holds nothing here) and ``NoRoom`` (no node takes it), as
    ``Ledger.reserve_move`` does for a named node."""
    entry = ledger.pods.get(source_uid)
    if entry is None:
        raise UnknownPod(f"pod uid {source_uid} holds nothing here")
    target = _View(ledger, config).target(entry.held, shut={*closed, entry.node})
    if target is None:
        raise NoRoom(
            f"no open node other than {entry.node} has room for VM {entry.key} "
            f"({entry.held.cpu_millis}m CPU, {entry.held.memory_bytes} B memory) under the "
            "watermark"
        )
    return target


def _share(state: NodeState) -> float:
    usable, alloc = state.usable, state.allocated + state.uncertain_total
    return max(
        alloc.cpu_millis / usable.cpu_millis if usable.cpu_millis else 1.0,
        alloc.memory_bytes / usable.memory_bytes if usable.memory_bytes else 1.0,
    )


def _lacks(need: Demand, free: Demand) -> Demand:
    return Demand(
        max(0, need.cpu_millis - max(0, free.cpu_millis)),
        max(0, need.memory_bytes - max(0, free.memory_bytes)),
    )


def _covers(hold: Demand, lack: Demand) -> bool:
    return hold.cpu_millis >= lack.cpu_millis and hold.memory_bytes >= lack.memory_bytes


def plan_moves(
    ledger: Ledger,
    book: ReliefBook,
    *,
    now: float,
    config: ReliefConfig,
    closed: Iterable[str] = (),
) -> ReliefPlan:
    """The moves to start now, and the drains to start or report empty; see the module
    docstring. Reads the ledger and the book; changes neither."""
    view = _View(ledger, config)
    shut = set(closed) | book.draining
    busy: set[str] = set()  # nodes with a move leaving them
    receiving: set[str] = set()  # nodes with a move arriving (never drained meanwhile)
    moving: set[str] = set()  # uids moving (either side)
    reserved: set[str] = set()  # VMs whose move the ledger holds
    for move in ledger.moves.values():
        moving.add(move.source_uid)
        moving.add(move.target_uid)
        receiving.add(move.target_node)
        source = ledger.pods.get(move.source_uid)
        if source is not None:
            busy.add(source.node)
            reserved.add(_vm_key(source))
    # The VMs' pods, to find a migration's VM (not a move's target pod, which is not it yet).
    targets = {m.target_uid for m in ledger.moves.values()}
    pod_of: dict[str, Allocation] = {}
    for node_state in ledger.nodes.values():
        for e in node_state.own.values():
            if e.vm_name is not None and e.uid not in targets and not e.is_tentative:
                pod_of[_vm_key(e)] = e
    flying = in_flight(ledger, book)
    for vm, records in flying.items():
        if vm in reserved:
            continue
        # Created, not (yet) in the ledger: the VM moves, its node has a move leaving it, and
        # the room its target will be asked for is spoken for in this pass.
        entry = pod_of.get(vm)
        if entry is None:
            continue
        moving.add(entry.uid)
        busy.add(entry.node)
        for record in records:
            target = record.target_node
            if record.phase is MovePhase.PENDING and target is not None and target in view.free:
                view.place(target, entry.held)
                receiving.add(target)
    budget = min(
        config.max_moves_in_flight, max(1, math.floor(config.max_moves_share * len(view.free)))
    ) - len(flying)
    history = book.by_vm()
    moves: list[PlannedMove] = []
    unrelieved: list[str] = []

    def why_not(entry: Allocation, *, is_drain: bool = False) -> str | None:
        if entry.uid in moving:
            return "it is moving"
        if entry.vm is None or entry.owner is not Owner.OWN or entry.is_tentative:
            return "it is not a bound VM of ours"
        if entry.vm_name is None:
            return "no VirtualMachine controls its pod (a migration names a VirtualMachine)"
        if not entry.vm.is_movable:
            return "it opted out (never-move)"
        if entry.is_unverified:
            return "its agent has not reported its size since this extender started"
        blocked = _blocked(
            history.get(_vm_key(entry), ()), now=now, config=config, is_drain=is_drain
        )
        if blocked is not None:
            return blocked
        if entry.node not in view.free:
            return f"its node {entry.node} is not known"
        return None

    def start(
        entry: Allocation,
        target: str,
        hold: Demand,
        *,
        reason: MoveReason,
        message: str,
        relieves: str | None = None,
    ) -> None:
        nonlocal budget
        view.place(target, hold)
        busy.add(entry.node)
        receiving.add(target)
        moving.add(entry.uid)
        budget -= 1
        moves.append(
            PlannedMove(
                uid=entry.uid,
                pod=entry.key,
                source=entry.node,
                target=target,
                reason=reason,
                message=message,
                vm=_vm_key(entry),
                relieves=relieves,
            )
        )

    # 2. VMs cut short, oldest shortfall first.
    for uid, want in sorted(book.wants.items(), key=lambda kv: (kv[1].since, kv[0])):
        entry = ledger.pods.get(uid)
        if entry is None or entry.uid in moving or not want.is_live(now=now, config=config):
            continue
        node = entry.node
        state = ledger.nodes.get(node)
        if state is None or not state.is_known:
            continue
        grow = Demand(
            max(0, want.requested.cpu_millis - entry.held.cpu_millis),
            max(0, want.requested.memory_bytes - entry.held.memory_bytes),
        )
        lack = _lacks(grow, state.free)
        if lack == ZERO:
            continue  # room came back: its next ask gets it
        if budget <= 0:
            unrelieved.append(f"{entry.key}: the budget of moves in flight is spent")
            continue
        if node in busy:
            unrelieved.append(f"{entry.key}: a move is already leaving node {node}")
            continue
        options: list[tuple[int, int, Allocation, str, Demand, MoveReason, str]] = []
        self_blocked = why_not(entry)
        if self_blocked is None:
            target = view.target(want.requested, shut=shut | {node})
            if target is not None:
                options.append(
                    (
                        entry.held.memory_bytes,
                        0,
                        entry,
                        target,
                        want.requested,
                        MoveReason.GROWER,
                        f"{entry.key} wants {want.requested.cpu_millis}m cpu and"
                        f" {want.requested.memory_bytes} bytes; node {node} lacks"
                        f" {lack.cpu_millis}m and {lack.memory_bytes} bytes; {target} has room",
                    )
                )
        neighbours = sorted(
            (
                e
                for e in state.own.values()
                if e.uid != uid and _covers(e.held, lack) and why_not(e) is None
            ),
            key=lambda e: (e.held.memory_bytes, e.held.cpu_millis, e.allocated_at, e.key),
        )
        for n in neighbours:
            n_want = book.wants.get(n.uid)
            n_need = (
                n.held
                if n_want is None or not n_want.is_live(now=now, config=config)
                else n.held.max(n_want.requested)
            )
            target = view.target(n_need, shut=shut | {node})
            if target is not None:
                options.append(
                    (
                        n.held.memory_bytes,
                        1,
                        n,
                        target,
                        n_need,
                        MoveReason.NEIGHBOUR,
                        f"{n.key} leaves node {node} for {target}, freeing what {entry.key}"
                        f" lacks ({lack.cpu_millis}m cpu, {lack.memory_bytes} bytes)",
                    )
                )
                break
        if not options:
            unrelieved.append(
                f"{entry.key}: no node has room for it"
                + (f" ({self_blocked})" if self_blocked else "")
                + " and no neighbour that frees enough can move"
            )
            continue
        _, _, mover, target, hold, reason, message = min(options, key=lambda o: (o[0], o[1]))
        start(mover, target, hold, reason=reason, message=message, relieves=entry.key)

    # 3. Nodes above the watermark: one VM away each, the oldest first.
    if config.watermark is not None:
        for name in sorted(view.free):
            if budget <= 0:
                break
            if name in busy or not view.is_above_watermark(name):
                continue
            state = ledger.nodes[name]
            for e in sorted(state.own.values(), key=lambda e: (e.allocated_at, e.key)):
                if why_not(e) is not None:
                    continue
                target = view.target(e.held, shut=shut | {name})
                if target is not None:
                    start(
                        e,
                        target,
                        e.held,
                        reason=MoveReason.WATERMARK,
                        message=f"node {name} holds more than {config.watermark:.0%} of its room;"
                        f" {e.key}, its oldest VM, moves to {target}",
                    )
                    break

    # 4. Drains.
    drain: list[str] = []
    emptied: list[str] = []
    evict: list[Eviction] = []
    if config.drain.enabled:
        for name in sorted(book.draining):
            state = ledger.nodes.get(name)
            if state is None:
                continue
            if not state.own:
                # The VMs are gone: the other pods go, through the Eviction API.
                staying = [e for e in state.foreign.values() if not e.disruption.is_left]
                if not staying:
                    emptied.append(name)
                for e in sorted(staying, key=lambda e: e.key):
                    if (
                        e.disruption is Disruption.EVICT
                        and e.uid not in book.evicted
                        and now >= book.evict_retry_at.get(e.uid, -math.inf)
                    ):
                        evict.append(Eviction(uid=e.uid, pod=e.key, node=name))
                continue
            if budget <= 0 or name in busy:
                continue
            for e in sorted(state.own.values(), key=lambda e: (e.held.memory_bytes, e.key)):
                if why_not(e, is_drain=True) is not None:
                    continue
                target = view.target(e.held, shut=shut | {name})
                if target is not None:
                    start(
                        e,
                        target,
                        e.held,
                        reason=MoveReason.DRAIN,
                        message=f"node {name} is drained",
                    )
                    break
        room = config.drain.max_nodes - len(book.draining)
        if room > 0:
            drain = _drains_to_start(
                ledger,
                book,
                view,
                now=now,
                config=config,
                shut=shut | receiving,
                moving=moving,
                count=room,
            )
    return ReliefPlan(moves=moves, drain=drain, emptied=emptied, unrelieved=unrelieved, evict=evict)


def _drains_to_start(
    ledger: Ledger,
    book: ReliefBook,
    view: _View,
    *,
    now: float,
    config: ReliefConfig,
    shut: set[str],
    moving: set[str],
    count: int,
) -> list[str]:
    """Up to ``count`` nodes to start draining, least used first (see rule 4)."""
    cfg = config.drain
    received: dict[str, float] = {}  # by node: when the last move to it was created
    for record in book.migrations.values():
        if record.target_node is not None:
            at = received.get(record.target_node)
            received[record.target_node] = record.created if at is None else max(at, record.created)
    candidates = []
    for name, state in ledger.nodes.items():
        if name in shut or name not in view.free or not state.own:
            continue
        share = _share(state)
        if share >= cfg.below_share:
            continue
        touched = max(
            book.touched_at.get(name, -math.inf),
            received.get(name, -math.inf),
            *(e.allocated_at for e in state.own.values()),  # the VMs it received
        )
        if now - touched < cfg.hysteresis_seconds:
            continue
        if any(e.disruption.blocks for e in state.foreign.values()):
            continue
        if any(
            e.uid in moving
            or e.vm is None
            or e.vm_name is None
            or e.is_tentative
            or e.is_unverified
            or not e.vm.is_movable
            for e in state.own.values()
        ):
            continue
        candidates.append((share, name))
    chosen: list[str] = []
    for _, name in sorted(candidates):
        if len(chosen) >= count:
            break
        # Every VM there must fit elsewhere now: first fit, largest first, on a copy.
        trial = view.copy()
        closed = shut | {name} | set(chosen)
        fits = True
        for e in sorted(
            ledger.nodes[name].own.values(), key=lambda e: (-e.held.memory_bytes, e.key)
        ):
            target = trial.target(e.held, shut=closed)
            if target is None:
                fits = False
                break
            trial.place(target, e.held)
        if fits:
            chosen.append(name)
    return chosen
