"""Relief, acted on: each move ``core.relief`` plans becomes a VirtualMachineMigration.

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

Not here: drains (``relief.drain.enabled`` is refused by the config: nothing taints nodes or
evicts yet).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import structlog

from kube_io.errors import Conflict, KubeError
from kube_io.objects import ObjectReference
from protocol.kube import ObjectMeta
from protocol.virtualmachine import (
    RELIEF_LABEL,
    VirtualMachineMigration,
    VirtualMachineMigrationSpec,
)
from scheduler_extender.core.ledger import Allocation
from scheduler_extender.core.relief import PlannedMove
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


class MigrationWriter(Protocol):
    async def create_virtual_machine_migration(
        self, migration: VirtualMachineMigration
    ) -> None: ...


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
    return outcomes


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
