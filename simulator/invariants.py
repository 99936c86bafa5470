"""The simulation's invariants: what must hold, and the ``Violation`` that ends a run when not.

Pure: no I/O, no clock; these functions only read the records and the extender's ledger, and
raise ``InvariantViolation`` (the engine turns it into the report's ``Violation``). They decide
nothing and change no state, so a run with a check moved or removed makes the same decisions.

What is checked:

* **decided over-commit:** no bind or permit makes a node's reservation exceed its usable
  capacity, nor an over-committed node more so (reality, like a foreign pod, may: counted as
  over-commit seconds, never hidden); and what was decided fits in what really runs there;
* **permit exceeded:** no VM ever runs more vCPUs than the extender last permitted it;
* **leaked reservation / lost pod:** a deleted pod holds nothing; the ledger holds exactly the
  live pods, and the targets of the live moves (``simulator.relief``);
* **ledger behind reality:** a VM whose agent the ledger has heard from is held at least at
  the size it runs;
* **ledger:** ``Ledger.check_invariants()`` and the admission queue's ``check_invariants()``.

The engine also raises ``InvariantViolation`` where it calls the real cores and they refuse
(``permit batch refused``, ``permit protocol``, ``recommender snapshot``). The cheap checks run
at every step; ``check_all`` after every event time, or every
``timing.check_interval_seconds`` on fleet-sized runs, and then ``check_vms`` after every event
time for the VMs its events touched (their agents stepped, or deleted).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduler_extender.core.ledger import Ledger
from simulator.records import ExtenderLife, ForeignRecord, NodeRecord, VmRecord
from simulator.report import LogEntry, Violation


class InvariantViolation(Exception):
    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant
        self.message = message


def violation_of(
    e: InvariantViolation,
    *,
    at: float,
    recent: Iterable[tuple[float, str, str, str, tuple[object, ...]]],
) -> Violation:
    """The report's account of ``e``: the recent notes are formatted only now, as nobody reads
    them unless a run fails."""
    return Violation(
        at_seconds=round(at, 3),
        invariant=e.invariant,
        message=e.message,
        recent=[
            LogEntry(at_seconds=round(t, 3), kind=k, subject=subj, detail=fmt.format(*args))
            for t, k, subj, fmt, args in recent
        ],
    )


def check_decision(ledger: Ledger, node: str, free_before: int, what: str) -> None:
    free = ledger.nodes[node].free.cpu_millis
    if free < 0 and free < free_before:
        raise InvariantViolation(
            "decided over-commit",
            f"{what} left node {node} {-free}m over its usable cpu (was {free_before}m free)",
        )


def check_memory_decision(ledger: Ledger, node: str, free_before: int, what: str) -> None:
    free = ledger.nodes[node].free.memory_bytes
    if free < 0 and free < free_before:
        raise InvariantViolation(
            "decided over-commit",
            f"{what} left node {node} {-free} bytes over its usable memory"
            f" (was {free_before} free)",
        )


def check_reality(node: NodeRecord, ext: ExtenderLife | None, what: str) -> None:
    """What we decided (a bind, a permitted grow) must fit in what really runs there, not
    only in what the ledger believes: a stale ledger is how real over-commit happens."""
    if node.reality_millis <= node.usable.cpu_millis:
        return
    state = ext.ledger.nodes.get(node.name) if ext is not None else None
    believed = f"; the ledger holds {state.allocated.cpu_millis}m there" if state else ""
    raise InvariantViolation(
        "decided over-commit",
        f"{what} on {node.name}: {node.reality_millis}m now run on"
        f" {node.usable.cpu_millis}m usable{believed}",
    )


def check_all(
    ext: ExtenderLife | None, vms: Sequence[VmRecord], foreign: Sequence[ForeignRecord]
) -> None:
    """Every invariant, over the whole cluster: costs a pass over every pod."""
    if ext is not None:
        try:
            ext.ledger.check_invariants()
            ext.admission.check_invariants()
        except AssertionError as e:
            raise InvariantViolation("ledger", str(e)) from e
        live = {vm.uid for vm in vms if vm.node is not None and not vm.is_deleted}
        live.update(f.uid for f in foreign if f.node is not None)
        held = set(ext.ledger.pods)
        # A live move's hold on its target (``reserve_move``) is no pod yet: it is the move's.
        held.difference_update(m.target_uid for m in ext.ledger.moves.values())
        leaked = sorted(held - live)
        if leaked:
            raise InvariantViolation(
                "leaked reservation", f"the ledger holds pods that are gone: {leaked[:5]}"
            )
        missing = sorted(live - held)
        if missing:
            raise InvariantViolation("lost pod", f"running pods the ledger lost: {missing[:5]}")
        for vm in vms:
            if vm.node is not None and not vm.is_deleted:
                _check_held(ext.ledger, vm)
    for vm in vms:
        _check_permitted(vm)


def check_vms(ext: ExtenderLife | None, vms: Iterable[VmRecord]) -> None:
    """The invariants of ``vms`` alone (each VM's checks of ``check_all``): after every instant,
    for the VMs its events touched, so that a fleet-sized run whose ``check_all`` runs on an
    interval still stops at the instant one of them broke an invariant."""
    for vm in vms:
        if vm.is_deleted:
            if ext is not None and vm.uid in ext.ledger.pods:
                raise InvariantViolation(
                    "leaked reservation", f"the ledger holds pods that are gone: {[vm.uid]}"
                )
            continue
        if vm.node is None:
            continue
        if ext is not None:
            if vm.uid not in ext.ledger.pods:
                raise InvariantViolation("lost pod", f"running pods the ledger lost: {[vm.uid]}")
            _check_held(ext.ledger, vm)
        _check_permitted(vm)


def _check_held(ledger: Ledger, vm: VmRecord) -> None:
    """A live VM's ledger entry holds at least what the VM really has (once heard from)."""
    entry = ledger.pods[vm.uid]
    if entry.has_agent and (entry.vcpus or 0) < vm.vcpus:
        raise InvariantViolation(
            "ledger behind reality",
            f"{vm.spec.name} runs {vm.vcpus} vCPUs but the ledger, which has heard"
            f" from its agent, holds {entry.vcpus}",
        )
    m = vm.mem
    if m is not None and entry.held.memory_bytes + entry.uncertain.memory_bytes < m.size:
        # Memory the guest really has is never counted as free (held, or kept out of
        # free as uncertain until the agent reports after a restart).
        raise InvariantViolation(
            "ledger behind reality",
            f"{vm.spec.name} has {m.size} bytes of memory but the ledger counts"
            f" {entry.held.memory_bytes} (+{entry.uncertain.memory_bytes} uncertain)",
        )


def _check_permitted(vm: VmRecord) -> None:
    """A live VM runs no more than its permits."""
    if vm.node is None or vm.is_deleted:
        return
    if vm.vcpus > vm.granted:
        raise InvariantViolation(
            "permit exceeded", f"{vm.spec.name} runs {vm.vcpus} > permit {vm.granted}"
        )
    m = vm.mem
    if m is not None and m.size > m.granted:
        raise InvariantViolation(
            "permit exceeded",
            f"{vm.spec.name} has {m.size} bytes of memory > its permit {m.granted}",
        )
