"""Relief in the simulated world: the moves in flight, their time and failures, and the figures.

Pure: no I/O, no clock, no randomness but a hash of the scenario's seed and the move's number
(``simulator.world.mix64``), so the same scenario moves the same VMs at the same instants. What
moves where is decided by the extender's own ``core.relief.plan_moves`` on the real ledger, and
each move is started with the ledger's ``reserve_move`` (``simulator.engine`` does both); this
module keeps what the world adds: how long a move takes (``Moves``: a fixed part plus a time per
GiB of the VM's memory), whether it fails, and the run's ``ReliefSummary``.

The figure relief is judged by is the share of *cut-short VM-seconds*: the seconds during which
a VM's last grow stood cut short by its node (the permit rules' ``ShortOf.NODE``, the wants of
``ReliefBook``), over the VMs' running seconds. A run with ``relief.enabled: false`` keeps the
book (so the figure is measured the same way) and never moves anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler_extender.core.relief import MoveReason, ReliefBook, ReliefConfig
from simulator import scenario as sc
from simulator.records import VmRecord
from simulator.report import ReliefSummary
from simulator.world import SEED_MIX, mix64

GIB = 2**30


@dataclass(slots=True)
class Flight:
    """One move under way: the VM, its pod before the move, where it goes, and whether it will
    fail (drawn when it starts)."""

    vm: int
    source_uid: str
    source: str
    target: str
    target_name: str
    epoch: int  # the extender whose ledger holds the move
    fails: bool
    reason: MoveReason


class ReliefRun:
    """Relief's state in one simulation (the extender's book survives its restarts here: its
    moves are VirtualMachineMigrations, which a restarted extender lists again, and the drains
    it started are node taints)."""

    def __init__(self, config: ReliefConfig, moves: sc.Moves, *, seed: int) -> None:
        self.config = config
        self.moves = moves
        self.seed = seed
        self.book = ReliefBook()
        self.flights: dict[int, Flight] = {}
        self.count = 0
        self.done = 0
        self.failed = 0
        self.by_reason: dict[str, int] = {}
        self.emptied: list[str] = []
        self.short_seconds = 0.0
        self._short_since = 0.0

    @property
    def closed(self) -> set[str]:
        """Nodes no pod is placed on: the ones being drained (tainted)."""
        return self.book.draining

    def account(self, now: float) -> None:
        """Add the cut-short seconds up to ``now``: called before the wants change."""
        self.short_seconds += len(self.book.wants) * (now - self._short_since)
        self._short_since = now

    def vm_gone(self, uid: str, *, now: float) -> None:
        self.account(now)
        self.book.wants.pop(uid, None)

    def seconds_for(self, memory_bytes: int) -> float:
        return self.moves.fixed_seconds + self.moves.seconds_per_gib * memory_bytes / GIB

    def started(self, flight: Flight) -> int:
        """A move started: its number (the event's argument)."""
        self.count += 1
        self.flights[self.count] = flight
        self.by_reason[flight.reason.value] = self.by_reason.get(flight.reason.value, 0) + 1
        return self.count

    def will_fail(self) -> bool:
        """Whether the next move fails: the seed's own stream, one draw per move."""
        draw = (mix64((self.seed * SEED_MIX) ^ (self.count + 1) * 0x9E3779B97F4A7C15) >> 11) / 2**53
        return draw < self.moves.failure_rate

    def summary(self, vms: Sequence[VmRecord], *, end: float) -> ReliefSummary:
        self.account(end)
        vm_seconds = 0.0
        for vm in vms:
            if vm.placed_at is not None:
                vm_seconds += (vm.deleted_at if vm.deleted_at is not None else end) - vm.placed_at
        return ReliefSummary(
            is_enabled=self.config.enabled,
            moves_started=self.count,
            moves_done=self.done,
            moves_failed=self.failed,
            moves_by_reason=dict(sorted(self.by_reason.items())),
            nodes_emptied=list(self.emptied),
            cut_short_vm_seconds=round(self.short_seconds, 3),
            vm_seconds=round(vm_seconds, 3),
        )
