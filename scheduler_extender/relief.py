"""Relief, acted on: each move ``core.relief`` plans becomes a VirtualMachineMigration, each
drain it starts a taint, each pod it evicts an Eviction.

Shell. Behind ``relief.enabled`` (off by default), the leader runs a pass every
``relief.interval_seconds`` (``Extender.relief_pass``: the book is fed by every decided permit
batch, the plan is the core's). For each planned move it creates one VirtualMachineMigration
(``migration_for``: ``vmName`` the VirtualMachine controlling the pod, ``targetNode`` the
plan's target) through the extender's one write gate (``kube.link``), counts the decision
(``vmautoscale_extender_relief_decisions_total{reason,outcome}``) and posts an Event on the
VM's pod with the reason and the core's sentence. The vm-controller carries the migration
out: it reserves the target's room at ``POST /v1/moves``, which the ledger may still refuse
(the room went meanwhile); then the migration fails with the ledger's reason and the VM stays.

A pass that is not the leader's, or before the lists are in, does nothing. A create that
fails (the API server unreachable, this replica deposed) is logged and counted, and is a
failed move to the book: the VM waits out its cool-down and its failure backoff, so a failing
API server does not turn every pass into the same create.

Each planned move is recorded in the book (``ReliefBook.move_started``) before the pass's
first await: a migration created but not yet reserved by the vm-controller is in flight, in the
budget. The book's moves are otherwise the VirtualMachineMigrations the extender watches
(``sync.follow_cluster``): a restarted or new leader lists them and keeps every VM's
cool-down and backoff.

Drains (``relief.drain.enabled``), in Karpenter's order, each step the core's decision and
the shell's I/O only: a node the plan starts to drain gets the NoSchedule taint
``DRAIN_TAINT`` first (``KubeClient.taint_node``: a JSON patch tested against the node's
resourceVersion; the book counts the drain from its answer on, ``ReliefBook.drain_started``,
until the node watch shows the taint); the nodes carrying that taint are the drains
(``Extender.relief_pass``: a restarted extender finds them again, and an operator who removes
the taint stops the drain). Its VMs then move as any other planned move; once none of ours is
left there, the pods the plan lists in ``evict`` are evicted through the Eviction API
(``KubeClient.evict_pod``, policy/v1, the pod's uid as a precondition), as ``kubectl drain``
does (kubernetes/kubernetes ``staging/src/k8s.io/kubectl/pkg/drain/drain.go``, ``evictPods``):
a 429 (``TooManyRequests``: the pod's PodDisruptionBudget allows no disruption now) is tried
again on a later pass, after kubectl's 5 s or the server's Retry-After, and never turned into
a delete; a 404 means the pod is gone. Counted in ``relief_drains_total`` and
``relief_evictions_total``; an Event on the node says a drain started, one on each pod evicted
says why. A node the plan reports ``emptied`` is counted (``relief_nodes_emptied``) and logged:
removing it is the cloud's (cluster-autoscaler deletes it after ``scale-down-unneeded-time``;
Karpenter's emptiness consolidation, its NodeClaim).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import structlog

from kube_io.errors import Conflict, KubeError, NotFound, TooManyRequests
from kube_io.objects import ObjectReference
from protocol.annotations import DRAIN_TAINT
from protocol.kube import Node, ObjectMeta, Taint
from protocol.virtualmachine import (
    RELIEF_LABEL,
    VirtualMachineMigration,
    VirtualMachineMigrationSpec,
)
from scheduler_extender.core.ledger import Allocation
from scheduler_extender.core.relief import Eviction, PlannedMove, ReliefPlan
from scheduler_extender.errors import Unavailable
from scheduler_extender.kube.node_alloc import NodeAllocReporter
from scheduler_extender.service import Extender

log = structlog.get_logger(__name__)

# On each migration relief creates: why (``RELIEF_LABEL``: a ``MoveReason``; the
# vm-controller refuses such a migration of a VM that opted out meanwhile), and the pod it chose.
REASON_LABEL: Final = RELIEF_LABEL
POD_ANNOTATION: Final = "vm-autoscaling.io/relief-pod"
MESSAGE_ANNOTATION: Final = "vm-autoscaling.io/relief-message"
_NAME_MAX: Final = 253  # a custom resource's name: a DNS subdomain


# What the drain taint says (NoSchedule: running pods stay; the drain evicts them itself).
DRAIN = Taint(key=DRAIN_TAINT, value="relief", effect="NoSchedule")


class MigrationWriter(Protocol):
    async def create_virtual_machine_migration(
        self, migration: VirtualMachineMigration
    ) -> None: ...

    async def taint_node(self, name: str, taint: Taint) -> Node: ...

    async def evict_pod(self, namespace: str, name: str, *, uid: str) -> None: ...


def migration_for(move: PlannedMove, *, vm_name: str, at: float) -> VirtualMachineMigration:
    """The VirtualMachineMigration that carries out ``move`` of the VM ``vm_name`` (in the
    pod's namespace), decided at wall-clock ``at`` (seconds): the time is in its name, so a
    later relief of the same VM never collides with an earlier migration object left behind."""
    namespace = move.pod.partition("/")[0]
    suffix = f"-relief-{int(at)}"
    return VirtualMachineMigration(
        metadata=ObjectMeta(
            name=vm_name[: _NAME_MAX - len(suffix)].rstrip("-.") + suffix,
            namespace=namespace,
            labels={REASON_LABEL: move.reason.value},
            annotations={POD_ANNOTATION: move.pod, MESSAGE_ANNOTATION: move.message},
        ),
        spec=VirtualMachineMigrationSpec(vm_name=vm_name, target_node=move.target),
    )


async def relief_once(
    extender: Extender,
    writer: MigrationWriter,
    reporter: NodeAllocReporter,
    *,
    wall_clock: Callable[[], float],
) -> list[tuple[PlannedMove, str]]:
    """One pass: the planned moves, each with its outcome (``created``, ``exists``,
    ``failed``); nothing on a replica that does not lead or is not synced."""
    try:
        plan = extender.relief_pass()
    except Unavailable:  # NotLeader, NotSynced: not this replica's turn
        return []
    metrics = extender.metrics
    metrics.relief_unrelieved.set(len(plan.unrelieved))
    metrics.relief_nodes_emptied.set(len(plan.emptied))
    for name in plan.emptied:
        log.info("relief_node_emptied", node=name)
    for line in plan.unrelieved:
        log.info("relief_unrelieved", why=line)
    # Before the first await: the ledger may change while a create is on its way, and the
    # next pass must count these moves (``move_started``) whatever their creates answer.
    book = extender.relief_book
    now = extender.wall_clock()
    todo: list[tuple[PlannedMove, Allocation, VirtualMachineMigration]] = []
    for move in plan.moves:
        entry = extender.ledger.pods.get(move.uid)
        if entry is None or entry.vm_name is None:  # the core never plans one; kept honest
            log.warning("relief_move_skipped", pod=move.pod, why="no VirtualMachine controls it")
            continue
        migration = migration_for(move, vm_name=entry.vm_name, at=wall_clock())
        book.move_started(move, migration=_key(migration), now=now)
        todo.append((move, entry, migration))
    # Taint first: the nodes it starts to drain take nothing new from now on.
    await _taint(extender, writer, reporter, plan)
    outcomes: list[tuple[PlannedMove, str]] = []
    for move, entry, migration in todo:
        name = migration.metadata.name
        try:
            await writer.create_virtual_machine_migration(migration)
            outcome = "created"
        except Conflict:
            outcome = "exists"
        except KubeError as e:
            outcome = "failed"
            book.move_ended(_key(migration), succeeded=False, now=extender.wall_clock())
            log.warning("relief_migration_failed", pod=move.pod, migration=name, error=e.message)
        metrics.relief_decisions.labels(move.reason.value, outcome).inc()
        outcomes.append((move, outcome))
        log.info(
            "relief_move",
            pod=move.pod,
            vm=entry.vm_name,
            source=move.source,
            target=move.target,
            reason=move.reason.value,
            migration=name,
            outcome=outcome,
        )
        if outcome != "failed":
            reporter.post(
                ObjectReference(
                    api_version="v1",
                    kind="Pod",
                    name=entry.name,
                    namespace=entry.namespace,
                    uid=entry.uid,
                ),
                reason=move.reason.value,
                message=f"relief moves VM {entry.vm_name} from {move.source} to {move.target}"
                f" (VirtualMachineMigration {name}): {move.message}",
            )
    await _evict(extender, writer, reporter, plan.evict)
    return outcomes


async def _taint(
    extender: Extender, writer: MigrationWriter, reporter: NodeAllocReporter, plan: ReliefPlan
) -> None:
    for name in plan.drain:
        try:
            node = await writer.taint_node(name, DRAIN)
        except KubeError as e:
            extender.metrics.relief_drains.labels("failed").inc()
            log.warning("relief_drain_taint_failed", node=name, error=e.message)
            continue
        # The next pass counts this drain, whatever the node watch delivers before it shows
        # the taint (an event from before it must not end the drain: ``ReliefBook``).
        extender.relief_book.drain_started(name, now=extender.wall_clock())
        extender.metrics.relief_drains.labels("tainted").inc()
        log.info("relief_drain_started", node=name, taint=DRAIN_TAINT)
        reporter.post(
            ObjectReference(api_version="v1", kind="Node", name=name, uid=node.metadata.uid),
            reason="DrainStarted",
            message=f"relief drains node {name}: tainted {DRAIN_TAINT}:NoSchedule; its VMs "
            "move away live, then its other pods are evicted (DaemonSet and mirror pods stay)",
        )


async def _evict(
    extender: Extender,
    writer: MigrationWriter,
    reporter: NodeAllocReporter,
    evictions: list[Eviction],
) -> None:
    book = extender.relief_book
    for eviction in evictions:
        namespace, _, name = eviction.pod.partition("/")
        retry_after = None
        try:
            await writer.evict_pod(namespace, name, uid=eviction.uid)
            outcome = "evicted"
        except NotFound:
            outcome = "gone"
        except TooManyRequests as e:
            outcome, retry_after = "refused", e.retry_after_seconds
            log.info("relief_eviction_refused", pod=eviction.pod, why=e.message)
        except KubeError as e:
            outcome = "failed"
            log.warning("relief_eviction_failed", pod=eviction.pod, error=e.message)
        book.eviction_answered(
            eviction.uid,
            accepted=outcome in ("evicted", "gone"),
            now=extender.wall_clock(),
            retry_after=retry_after,
        )
        extender.metrics.relief_evictions.labels(outcome).inc()
        if outcome == "evicted":
            log.info("relief_evicted", pod=eviction.pod, node=eviction.node)
            reporter.post(
                ObjectReference(
                    api_version="v1", kind="Pod", name=name, namespace=namespace, uid=eviction.uid
                ),
                reason="EvictedForDrain",
                message=f"relief drains node {eviction.node}: evicted through the Eviction API",
            )


def _key(migration: VirtualMachineMigration) -> str:
    return f"{migration.metadata.namespace}/{migration.metadata.name}"


async def run_relief(
    extender: Extender,
    writer: MigrationWriter,
    reporter: NodeAllocReporter,
    *,
    interval_seconds: float,
    wall_clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """A pass every ``interval_seconds``, for as long as the extender runs."""
    while True:
        await sleep(interval_seconds)
        await relief_once(extender, writer, reporter, wall_clock=wall_clock)
