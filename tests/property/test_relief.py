"""Relief and drain (``core.relief``): the plan's choices on hand-made ledgers, and its rules
over random histories.

The machine binds VMs (some opted out), lets their agents ask through the real permit rules
(``decide_batch``, so a grow cut short is what the extender really answered), plans, starts
every planned move with the ledger's ``reserve_move``, and ends moves as they really end
(target pod bound then source deleted; or cancelled). After every step: no node is promised
more than it has, the budgets hold, an opted-out VM never moves, no VM moves again within its
cool-down, and a planned target had room for the VM's full requested size when it started. At
the end, with every pod gone, the ledger and the book are back to zero.
"""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from protocol import annotations as ann
from protocol.kube import (
    EmptyDirVolumeSource,
    ObjectMeta,
    OwnerReference,
    Pod,
    PodSpec,
    Volume,
)
from protocol.permits import PodRef, ResourceRequest, Resources
from protocol.virtualmachine import (
    VirtualMachineMigration,
    VirtualMachineMigrationSpec,
    VirtualMachineMigrationStatus,
)
from scheduler_extender.core.ledger import Conflict, Ledger, NoRoom, SystemReserve, UnknownNode
from scheduler_extender.core.permits import decide_batch
from scheduler_extender.core.podinfo import Demand, Disruption, PodInfo, disruption_of, pod_info
from scheduler_extender.core.refusals import Refused
from scheduler_extender.core.relief import (
    EVICTION_RETRY_SECONDS,
    DrainConfig,
    MovePhase,
    MoveReason,
    MoveRecord,
    PlannedMove,
    ReliefBook,
    ReliefConfig,
    choose_target,
    in_flight,
    plan_moves,
    record_of,
)
from scheduler_extender.state import dump_state

GI = 2**30
NODES = {"n1": Demand(4000, 8 * GI), "n2": Demand(6000, 8 * GI), "n3": Demand(8000, 8 * GI)}
CONFIG = ReliefConfig(
    enabled=True,
    watermark=0.9,
    max_moves_in_flight=2,
    max_moves_share=1.0,
    cooldown_seconds=100.0,
    failure_backoff_seconds=50.0,
    failure_backoff_max_seconds=200.0,
    drain=DrainConfig(enabled=True, below_share=0.5, hysteresis_seconds=30.0),
)


def vm_pod(
    uid: str,
    name: str,
    *,
    node: str | None,
    lo: int,
    hi: int,
    movable: bool = True,
    controlled: bool = True,
    vm_name: str | None = None,
):
    """A VM pod; ``controlled``: a VirtualMachine owns it, ``vm_name`` or of the same name."""
    return PodInfo(
        uid=uid,
        namespace="ns",
        name=name,
        node_name=node,
        scheduler_name="vm-scheduler",
        requests=Demand(lo * 1000, GI),
        priority=0,
        is_ours=True,
        is_vm=True,
        is_static=False,
        is_terminated=False,
        vm=ann.VmSpec(
            min_vcpus=lo,
            max_vcpus=hi,
            min_memory_bytes=GI,
            max_memory_bytes=GI,
            is_movable=movable,
        ),
        vm_name=(vm_name or name) if controlled else None,
    )


def ledger_of(nodes: dict[str, Demand]) -> Ledger:
    ledger = Ledger(reserve=SystemReserve(cpu_fraction=0.0))
    for node, allocatable in nodes.items():
        ledger.upsert_node(node, allocatable=allocatable)
    return ledger


def bind(
    ledger: Ledger,
    uid: str,
    node: str,
    *,
    lo: int,
    hi: int,
    movable: bool = True,
    controlled: bool = True,
) -> None:
    pod = vm_pod(uid, uid, node=None, lo=lo, hi=hi, movable=movable, controlled=controlled)
    ledger.reserve_for_bind(pod, node, at=0.0)
    ledger.observe_pod(msgspec.structs.replace(pod, node_name=node), at=0.0)


def ask(ledger: Ledger, book: ReliefBook, uid: str, vcpus: int, *, now: float) -> None:
    entry = ledger.pods[uid]
    assert entry.vcpus is not None
    req = ResourceRequest(
        pod=PodRef(namespace="ns", name=entry.name, uid=uid),
        node=entry.node,
        current=Resources(vcpus=entry.vcpus, memory_bytes=GI),
        requested=Resources(vcpus=vcpus, memory_bytes=GI),
        last_permit=None,
    )
    decisions = decide_batch(ledger, entry.node, [req])
    assert not isinstance(decisions, Refused)
    book.permits_decided(ledger, [req], decisions, now=now)


# -- the choices, on hand-made ledgers --------------------------------------------------------


def test_a_vm_cut_short_moves_to_a_node_with_room_for_its_request():
    ledger = ledger_of({"full": Demand(4000, 8 * GI), "roomy": Demand(8000, 8 * GI)})
    book = ReliefBook()
    bind(ledger, "db", "full", lo=2, hi=6)
    bind(ledger, "web", "full", lo=2, hi=2)
    ask(ledger, book, "db", 6, now=1.0)
    assert book.wants["db"].requested == Demand(6000, GI)
    plan = plan_moves(ledger, book, now=2.0, config=CONFIG)
    # Moving db (1 GiB) or web (1 GiB) costs the same: db itself moves, to room for 6 vCPUs.
    assert [(m.pod, m.target, m.reason) for m in plan.moves] == [
        ("ns/db", "roomy", MoveReason.GROWER)
    ]


def test_a_neighbour_moves_away_when_the_vm_cut_short_has_nowhere_to_go():
    # No node has room for db's 6 vCPUs, but web's 2 go to "side", and then db has its room.
    ledger = ledger_of({"full": Demand(6000, 8 * GI), "side": Demand(3000, 8 * GI)})
    book = ReliefBook()
    bind(ledger, "db", "full", lo=2, hi=6)
    bind(ledger, "web", "full", lo=2, hi=2)
    bind(ledger, "bat", "full", lo=2, hi=2)
    ask(ledger, book, "db", 4, now=1.0)
    plan = plan_moves(ledger, book, now=2.0, config=CONFIG)
    assert [(m.pod, m.target, m.reason, m.relieves) for m in plan.moves] == [
        ("ns/bat", "side", MoveReason.NEIGHBOUR, "ns/db")
    ]


def test_an_opted_out_vm_and_its_opted_out_neighbours_stay():
    ledger = ledger_of({"full": Demand(4000, 8 * GI), "roomy": Demand(8000, 8 * GI)})
    book = ReliefBook()
    bind(ledger, "db", "full", lo=2, hi=6, movable=False)
    bind(ledger, "web", "full", lo=2, hi=2, movable=False)
    ask(ledger, book, "db", 6, now=1.0)
    plan = plan_moves(ledger, book, now=2.0, config=CONFIG)
    assert plan.moves == []
    assert "opted out" in plan.unrelieved[0]


def test_a_vm_pod_no_virtualmachine_controls_is_never_chosen():
    # A VM pod made by hand: no VirtualMachineMigration can name it. Alone, nothing moves;
    # beside a neighbour a VirtualMachine controls, the neighbour moves away instead.
    ledger = ledger_of({"full": Demand(4000, 8 * GI), "roomy": Demand(8000, 8 * GI)})
    book = ReliefBook()
    bind(ledger, "db", "full", lo=2, hi=4, controlled=False)
    bind(ledger, "web", "full", lo=2, hi=2, controlled=False)
    ask(ledger, book, "db", 4, now=1.0)
    plan = plan_moves(ledger, book, now=2.0, config=CONFIG)
    assert plan.moves == []
    assert "no VirtualMachine controls its pod" in plan.unrelieved[0]
    ledger = ledger_of({"full": Demand(4000, 8 * GI), "roomy": Demand(8000, 8 * GI)})
    book = ReliefBook()
    bind(ledger, "db", "full", lo=2, hi=4, controlled=False)
    bind(ledger, "web", "full", lo=2, hi=2)
    ask(ledger, book, "db", 4, now=1.0)
    plan = plan_moves(ledger, book, now=2.0, config=CONFIG)
    assert [(m.pod, m.target, m.reason) for m in plan.moves] == [
        ("ns/web", "roomy", MoveReason.NEIGHBOUR)
    ]


def test_a_node_above_the_watermark_moves_its_oldest_vm_and_a_target_stays_below():
    ledger = ledger_of({"hot": Demand(10000, 8 * GI), "a": Demand(10000, 8 * GI)})
    for i in range(5):
        bind(ledger, f"vm{i}", "hot", lo=2, hi=2)  # 100 %, all allocated at 0.0
    bind(ledger, "x", "a", lo=8, hi=8)  # 80 %: takes one more 2-vCPU VM? 100 % > 90 %: no
    plan = plan_moves(ledger, ReliefBook(), now=0.0, config=CONFIG)
    assert plan.moves == []
    ledger.forget_pod("x")
    plan = plan_moves(ledger, ReliefBook(), now=0.0, config=CONFIG)
    assert [(m.pod, m.reason) for m in plan.moves] == [("ns/vm0", MoveReason.WATERMARK)]


def test_a_quiet_node_is_drained_only_after_its_hysteresis_and_reported_empty():
    ledger = ledger_of({"quiet": Demand(8000, 8 * GI), "busy": Demand(8000, 8 * GI)})
    book = ReliefBook()
    bind(ledger, "a", "quiet", lo=1, hi=1)
    bind(ledger, "b", "busy", lo=4, hi=4)
    # It received its VM at 0.0 (the allocation's own time: nobody marks the node).
    assert plan_moves(ledger, book, now=10.0, config=CONFIG).drain == []
    plan = plan_moves(ledger, book, now=60.0, config=CONFIG)
    assert plan.drain == ["quiet"]
    book.draining.update(plan.drain)
    plan = plan_moves(ledger, book, now=61.0, config=CONFIG)
    assert [(m.pod, m.target, m.reason) for m in plan.moves] == [("ns/a", "busy", MoveReason.DRAIN)]
    ledger.forget_pod("a")
    assert plan_moves(ledger, book, now=62.0, config=CONFIG).emptied == ["quiet"]


def test_a_want_the_vm_stops_asking_for_is_over_after_its_ttl():
    """The agent asks again at every permit retry while it still wants more; once its load
    has gone it says nothing, and its last want must not move it when room appears later."""
    ledger = ledger_of({"full": Demand(4000, 8 * GI), "roomy": Demand(8000, 8 * GI)})
    book = ReliefBook()
    bind(ledger, "db", "full", lo=2, hi=6)
    bind(ledger, "web", "full", lo=2, hi=2, movable=False)
    config = msgspec.structs.replace(CONFIG, watermark=None, want_ttl_seconds=30.0)
    ask(ledger, book, "db", 6, now=0.0)
    ask(ledger, book, "db", 6, now=20.0)  # asked again: live until 50, first short at 0
    assert book.wants["db"].since == 0.0
    assert [m.pod for m in plan_moves(ledger, book, now=49.0, config=config).moves] == ["ns/db"]
    assert plan_moves(ledger, book, now=50.0, config=config).moves == []
    book.forget_gone(ledger, now=50.0, config=config)
    assert book.wants == {}


def test_drain_is_off_by_default():
    ledger = ledger_of({"quiet": Demand(8000, 8 * GI), "busy": Demand(8000, 8 * GI)})
    bind(ledger, "a", "quiet", lo=1, hi=1)
    assert ReliefConfig().drain.enabled is False
    assert plan_moves(ledger, ReliefBook(), now=1e6, config=ReliefConfig()).drain == []


def _cut_short_pair() -> tuple[Ledger, ReliefBook]:
    """Two full nodes, each with a VM cut short, and two roomy ones."""
    ledger = ledger_of({"f1": Demand(4000, 8 * GI), "f2": Demand(4000, 8 * GI),
                        "r1": Demand(8000, 8 * GI), "r2": Demand(8000, 8 * GI)})  # fmt: skip
    book = ReliefBook()
    for vm, node in (("a", "f1"), ("b", "f2")):
        bind(ledger, vm, node, lo=2, hi=6)
        bind(ledger, f"{vm}-side", node, lo=2, hi=2, movable=False)
        ask(ledger, book, vm, 6, now=1.0)
    return ledger, book


def test_a_migration_created_but_not_reserved_is_in_the_budget():
    """Budget one: the first pass's move is only a created migration (the vm-controller has
    not reserved its room) and the second pass, before the reservation, starts nothing."""
    ledger, book = _cut_short_pair()
    config = msgspec.structs.replace(CONFIG, max_moves_in_flight=1)
    first = plan_moves(ledger, book, now=2.0, config=config)
    [move] = first.moves
    assert move.vm == "ns/a"
    book.move_started(move, migration="ns/a-relief-2", now=2.0)
    assert ledger.moves == {}
    second = plan_moves(ledger, book, now=3.0, config=config)
    assert second.moves == []
    assert second.unrelieved == ["ns/b: the budget of moves in flight is spent"]
    # Budget two: b moves, and not to the node a's migration will take (both take one).
    ledger2, book2 = _cut_short_pair()
    config2 = msgspec.structs.replace(CONFIG, max_moves_in_flight=2)
    [a_move] = [m for m in plan_moves(ledger2, book2, now=2.0, config=config2).moves
                if m.vm == "ns/a"][:1]  # fmt: skip
    book2.move_started(a_move, migration="ns/a-relief-2", now=2.0)
    book2.wants.pop("a")  # only b wants now
    [b_move] = plan_moves(ledger2, book2, now=3.0, config=config2).moves
    assert b_move.vm == "ns/b" and b_move.target != a_move.target
    # Once the controller reserves it, the ledger's move and the record are one move, not two.
    ledger2.reserve_move("a", target_name="a-2", target_node=a_move.target, at=3.0)
    assert list(in_flight(ledger2, book2)) == ["ns/a"]


def test_a_failed_move_backs_off_doubling_and_is_forgiven():
    ledger, book = _cut_short_pair()
    ledger.forget_pod("b")
    config = msgspec.structs.replace(CONFIG, cooldown_seconds=10.0,
                                     failure_backoff_seconds=50.0,
                                     failure_backoff_max_seconds=150.0,
                                     want_ttl_seconds=1e6)  # a's want held throughout  # fmt: skip
    now = 2.0
    waits = []
    for n in range(5):
        [move] = plan_moves(ledger, book, now=now, config=config).moves
        book.move_started(move, migration=f"ns/a-{n}", now=now)
        book.move_ended(f"ns/a-{n}", succeeded=False, now=now + 1)
        # Not before its backoff: 50, 100, 150, 150 ... after the failure's end.
        wait = 0.0
        while plan_moves(ledger, book, now=now + 1 + wait, config=config).moves == []:
            wait += 1.0
        waits.append(wait)
        now += 1 + wait
    assert waits == [50.0, 100.0, 150.0, 150.0, 150.0]
    assert "backoff 150s" in plan_moves(ledger, book, now=now - 1, config=config).unrelieved[0]
    # A success ends the streak: the next failure waits the first step again.
    [move] = plan_moves(ledger, book, now=now, config=config).moves
    book.move_started(move, migration="ns/a-ok", now=now)
    book.move_ended("ns/a-ok", succeeded=True, now=now + 1)
    now += 20  # past the cool-down
    [move] = plan_moves(ledger, book, now=now, config=config).moves
    book.move_started(move, migration="ns/a-again", now=now)
    book.move_ended("ns/a-again", succeeded=False, now=now)
    assert "backoff 50s" in plan_moves(ledger, book, now=now + 49, config=config).unrelieved[0]
    assert plan_moves(ledger, book, now=now + 50, config=config).moves != []
    # Moves that ended twice the longest backoff ago are forgotten (and so forgiven).
    book.forget_gone(ledger, now=now + 299, config=config)
    assert list(book.migrations) == ["ns/a-again"]
    book.forget_gone(ledger, now=now + 300, config=config)
    assert book.migrations == {}


def test_a_book_rebuilt_from_the_migrations_is_the_live_one():
    """``record_of`` reads what the API server stores; the live book, once the watch has shown
    it the objects, and a book that only listed them agree."""
    made = VirtualMachineMigration(
        metadata=ObjectMeta(name="db-relief-1", namespace="ns",
                            creation_timestamp="2026-11-29T01:00:00Z"),
        spec=VirtualMachineMigrationSpec(vm_name="db", target_node="n2"),
    )  # fmt: skip
    at = 1795914000.0  # 2026-11-29T01:00:00Z
    assert record_of(made, now=0.0) == MoveRecord(
        vm="ns/db", target_node="n2", phase=MovePhase.PENDING, created=at
    )
    failed = msgspec.structs.replace(
        made,
        status=VirtualMachineMigrationStatus(
            phase="Failed", completion_time="2026-11-29T01:01:00Z"
        ),
    )
    assert record_of(failed, now=0.0).ended == at + 60
    # Without a readable time (never from the API server): created now, ended when created.
    odd = msgspec.structs.replace(
        failed, metadata=ObjectMeta(name="x", namespace="ns", creation_timestamp="yesterday"),
        status=VirtualMachineMigrationStatus(phase="Failed"),
    )  # fmt: skip
    assert (record_of(odd, now=5.0).created, record_of(odd, now=5.0).ended) == (5.0, 5.0)
    live, rebuilt = ReliefBook(), ReliefBook()
    live.move_started(
        PlannedMove(uid="u", pod="ns/db-0", source="n1", target="n2",
                    reason=MoveReason.GROWER, message="", vm="ns/db"),
        migration="ns/db-relief-1", now=at,
    )  # fmt: skip
    live.migration_seen("ns/db-relief-1", record_of(failed, now=at + 70))
    rebuilt.migrations_listed({"ns/db-relief-1": record_of(failed, now=at + 90)})
    assert live == rebuilt


def test_a_vm_that_opts_out_on_its_running_pod_stops_being_chosen():
    """The vm-controller patches a running pod when its VM's ``spec.neverMove`` changes: the
    ledger follows the pod, and the VM is no longer chosen (nor, opting in again, left out)."""
    ledger = ledger_of({"full": Demand(4000, 8 * GI), "roomy": Demand(8000, 8 * GI)})
    book = ReliefBook()
    bind(ledger, "db", "full", lo=2, hi=6)
    bind(ledger, "web", "full", lo=2, hi=2, movable=False)
    ask(ledger, book, "db", 6, now=1.0)
    assert [m.pod for m in plan_moves(ledger, book, now=2.0, config=CONFIG).moves] == ["ns/db"]
    pod = vm_pod("db", "db", node="full", lo=2, hi=6, movable=False)
    ledger.observe_pod(pod, at=2.0)
    plan = plan_moves(ledger, book, now=2.0, config=CONFIG)
    assert plan.moves == [] and "opted out" in plan.unrelieved[0]
    ledger.observe_pod(msgspec.structs.replace(pod, vm=ann.VmSpec(
        min_vcpus=2, max_vcpus=6, min_memory_bytes=GI, max_memory_bytes=GI)), at=3.0)  # fmt: skip
    assert [m.pod for m in plan_moves(ledger, book, now=3.0, config=CONFIG).moves] == ["ns/db"]
    assert ledger.pods["db"].vm == ann.VmSpec(
        min_vcpus=2, max_vcpus=6, min_memory_bytes=GI, max_memory_bytes=GI
    )


@pytest.mark.parametrize(
    ("value", "movable"), [("true", False), ("false", True), (None, True)], ids=str
)
def test_the_never_move_annotation(value, movable):
    annotations = {ann.MIN_VCPUS: "1", ann.MAX_VCPUS: "2"}
    if value is not None:
        annotations[ann.NEVER_MOVE] = value
    assert ann.parse_vm_spec(annotations, pod_memory_bytes=GI).is_movable is movable


def test_a_bad_never_move_annotation_is_named():
    with pytest.raises(ann.AnnotationError, match="never-move"):
        ann.parse_vm_spec(
            {ann.MIN_VCPUS: "1", ann.MAX_VCPUS: "2", ann.NEVER_MOVE: "yes"}, pod_memory_bytes=GI
        )


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 8), min_size=2, max_size=4),
    vms=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 3), st.integers(0, 4), st.booleans()),
        min_size=2,
        max_size=10,
    ),
    asks=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 7)), max_size=6),
    config=st.sampled_from([CONFIG, msgspec.structs.replace(CONFIG, watermark=None)]),
)
def test_every_planned_move_fits_at_every_step(sizes, vms, asks, config):
    """One pass on a random cluster: the moves, started in the plan's order with the ledger's
    ``reserve_move``, are all accepted, leave no node over, respect the budgets, never move an
    opted-out VM, and give a VM that moves for its grow a target with room for all of it."""
    nodes = {f"n{i}": Demand(cpu * 1000, 8 * GI) for i, cpu in enumerate(sizes)}
    ledger = ledger_of(nodes)
    book = ReliefBook()
    bound: list[str] = []
    for i, (node, lo, extra, movable) in enumerate(vms):
        try:
            bind(ledger, f"v{i}", f"n{node % len(nodes)}", lo=lo, hi=lo + extra, movable=movable)
        except NoRoom:
            continue
        bound.append(f"v{i}")
    for i, (which, vcpus) in enumerate(asks):
        if bound:
            uid = bound[which % len(bound)]
            vm = ledger.pods[uid].vm
            assert vm is not None
            ask(ledger, book, uid, max(vm.min_vcpus, min(vm.max_vcpus, vcpus)), now=float(i))
    plan = plan_moves(ledger, book, now=100.0, config=config)
    assert len(plan.moves) <= config.max_moves_in_flight
    assert len({m.source for m in plan.moves}) == len(plan.moves)
    for move in plan.moves:
        entry = ledger.pods[move.uid]
        assert entry.vm is not None and entry.vm.is_movable
        free = ledger.nodes[move.target].free
        if move.reason is MoveReason.GROWER:
            want = book.wants[move.uid].requested
            assert want.cpu_millis <= free.cpu_millis and want.memory_bytes <= free.memory_bytes
        ledger.reserve_move(move.uid, target_name=f"{move.uid}-2", target_node=move.target, at=0.0)
        for state in ledger.nodes.values():
            assert state.free.cpu_millis >= 0 and state.free.memory_bytes >= 0
    ledger.check_invariants()


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 8), min_size=2, max_size=4),
    vms=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3)), min_size=1, max_size=8),
    closed=st.sets(st.integers(0, 3), max_size=2),
    config=st.sampled_from([CONFIG, msgspec.structs.replace(CONFIG, watermark=None)]),
)
def test_a_move_without_a_named_target_goes_where_the_ledger_takes_it(sizes, vms, closed, config):
    """``choose_target`` (a migration naming no node): never the VM's own node nor a closed
    one, and the ledger's ``reserve_move`` takes the move there; when it says no node has room,
    no open node under the watermark would take the VM."""
    nodes = {f"n{i}": Demand(cpu * 1000, 8 * GI) for i, cpu in enumerate(sizes)}
    shut = {f"n{i}" for i in closed}
    ledger = ledger_of(nodes)
    bound = []
    for i, (node, lo) in enumerate(vms):
        with contextlib.suppress(NoRoom):
            bind(ledger, f"v{i}", f"n{node % len(nodes)}", lo=lo, hi=lo)
            bound.append(f"v{i}")
    for uid in bound:
        entry = ledger.pods[uid]
        try:
            target = choose_target(ledger, uid, config=config, closed=shut)
        except NoRoom:
            mark = 1.0 if config.watermark is None else config.watermark
            for name, state in ledger.nodes.items():
                if name in shut or name == entry.node:
                    continue
                after = state.allocated + entry.held
                assert not state.fits(entry.held) or (
                    after.cpu_millis > state.usable.cpu_millis * mark
                    or after.memory_bytes > state.usable.memory_bytes * mark
                ), (name, uid)
            continue
        assert target != entry.node and target not in shut
        ledger.reserve_move(uid, target_name=f"{uid}-2", target_node=target, at=0.0)
        ledger.check_invariants()
        ledger.cancel_move(uid)


# -- the rules, over random histories -----------------------------------------------------------


class ReliefMachine(RuleBasedStateMachine):
    """The extender's book as the shell keeps it: fed its own creates (``move_started``) and
    the API server's VirtualMachineMigrations as the watch delivers them, late (``api`` holds
    the objects, ``unseen`` the events on their way). The vm-controller reserves a created
    move's room later (``controller_reserved``), or at once; humans create migrations too."""

    def __init__(self):
        super().__init__()
        self.ledger = ledger_of(NODES)
        self.book = ReliefBook()
        self.now = 0.0
        self.counter = 0
        self.api_pods: dict[str, PodInfo] = {}
        self.vm_of: dict[str, str] = {}  # pod uid -> the VM it runs (a move changes the pod)
        self.api: dict[str, MoveRecord] = {}  # the VirtualMachineMigrations, by ns/name
        self.unseen: list[str] = []  # keys whose latest state the watch has yet to deliver
        self.known: dict[str, MoveRecord] = {}  # what the book was shown of ``api``
        self.source_of: dict[str, str] = {}  # a reserved migration's key -> its source uid

    def _uid(self) -> str:
        self.counter += 1
        return f"u{self.counter}"

    def _pick(self, data, uids) -> str | None:
        uids = sorted(uids)
        return data.draw(st.sampled_from(uids)) if uids else None

    def _write(self, key: str, record: MoveRecord) -> None:
        """The API server's object changes; the watch brings it later."""
        self.api[key] = record
        self.unseen.append(key)

    def _end(self, key: str, *, succeeded: bool) -> None:
        phase = MovePhase.SUCCEEDED if succeeded else MovePhase.FAILED
        self._write(key, msgspec.structs.replace(self.api[key], phase=phase, ended=self.now))
        self.source_of.pop(key, None)

    def _pod_of(self, vm: str) -> str | None:
        """The VM's pod (not a move's target)."""
        targets = {m.target_uid for m in self.ledger.moves.values()}
        found = [u for u, v in self.vm_of.items() if v == vm and u not in targets]
        return found[0] if found else None

    def _in_flight(self) -> set[str]:
        """Counted here from what the book was shown (a migration the watch has yet to bring
        is one nobody can count), not by the core's ``in_flight``."""
        vms = {self.vm_of[u] for u in self.ledger.moves}
        return vms | {r.vm for r in self.known.values() if r.is_active}

    @initialize(
        fleet=st.lists(
            st.tuples(st.sampled_from(sorted(NODES)), st.integers(1, 3), st.integers(0, 4),
                      st.booleans()),
            min_size=3, max_size=8,
        )
    )  # fmt: skip
    def fleet_bound(self, fleet):
        for node, lo, extra, movable in fleet:
            self.vm_bound(node, lo, extra, movable)
        for uid in sorted(self.api_pods):  # their agents report: a verified VM may move
            entry = self.ledger.pods[uid]
            assert entry.vm is not None
            ask(self.ledger, self.book, uid, entry.vm.max_vcpus, now=self.now)

    @rule(
        node=st.sampled_from(sorted(NODES)),
        lo=st.integers(1, 3),
        extra=st.integers(0, 4),
        movable=st.booleans(),
    )
    def vm_bound(self, node, lo, extra, movable):
        uid = self._uid()
        pod = vm_pod(uid, f"vm-{uid}", node=None, lo=lo, hi=lo + extra, movable=movable)
        try:
            self.ledger.reserve_for_bind(pod, node, at=self.now)
        except (NoRoom, UnknownNode):  # full, or drained and removed
            return
        self.api_pods[uid] = msgspec.structs.replace(pod, node_name=node)
        self.ledger.observe_pod(self.api_pods[uid], at=self.now)
        self.vm_of[uid] = f"ns/vm-{uid}"

    @rule(want=st.integers(1, 7), data=st.data())
    def agent_asked(self, want, data):
        uid = self._pick(data, (u for u in self.api_pods if u in self.ledger.pods))
        if uid is None:
            return
        entry = self.ledger.pods[uid]
        assert entry.vm is not None
        ask(self.ledger, self.book, uid, max(entry.vm.min_vcpus, min(entry.vm.max_vcpus, want)),
            now=self.now)  # fmt: skip

    @rule(reserve_now=st.booleans())
    def relief_ran(self, reserve_now):
        self.relief_pass(reserve_now)

    def relief_pass(self, reserve_now):
        flying = self._in_flight()
        leaving = {self.ledger.pods[u].node for u in self.ledger.moves}
        for vm in flying:
            uid = self._pod_of(vm)
            if uid is not None and uid in self.ledger.pods:
                leaving.add(self.ledger.pods[uid].node)
        plan = plan_moves(self.ledger, self.book, now=self.now, config=CONFIG)
        # The budget counts every move in flight, reserved or only created.
        assert len(plan.moves) <= max(0, CONFIG.max_moves_in_flight - len(flying)), (
            plan.moves, flying)  # fmt: skip
        assert len({m.source for m in plan.moves}) == len(plan.moves)
        for move in plan.moves:
            entry = self.ledger.pods[move.uid]
            assert entry.vm is not None and entry.vm.is_movable, "an opted-out VM moves"
            vm = self.vm_of[move.uid]
            assert move.vm == vm and vm not in flying
            assert move.source not in leaving, "two moves leave one node"
            # Its last move the book knows of (a deleted migration is forgotten on purpose).
            # A drain's moves wait for none: a draining node is never a target (below).
            since = max((r.created for r in self.known.values() if r.vm == vm), default=None)
            if move.reason is not MoveReason.DRAIN:
                assert since is None or self.now - since >= CONFIG.cooldown_seconds, "ping-pong"
            self.check_backoff(vm)
            assert move.target not in self.book.draining
            if move.reason is MoveReason.GROWER:
                # Room for its full requested size on the target, at this moment.
                want = self.book.wants[move.uid].requested
                free = self.ledger.nodes[move.target].free
                assert want.cpu_millis <= free.cpu_millis and want.memory_bytes <= free.memory_bytes
            key = f"ns/m{self._uid()}"
            self.book.move_started(move, migration=key, now=self.now)
            self.api[key] = self.known[key] = MoveRecord(
                vm=vm, target_node=move.target, phase=MovePhase.PENDING, created=self.now
            )
            self.unseen.append(key)
            if reserve_now:
                # A planned move is one the ledger accepts at once.
                self.reserve(key, move.uid)
        for node in plan.emptied:
            state = self.ledger.nodes[node]
            assert not state.own and not state.foreign
        self.book.draining.update(plan.drain)

    def check_backoff(self, vm: str) -> None:
        """The VM's failures in a row that the book knows of (and has not forgiven) are
        waited out."""
        horizon = 2 * CONFIG.failure_backoff_max_seconds
        failed: list[float] = []
        for r in sorted(self.known.values(), key=lambda r: r.created):
            if r.vm != vm or r.ended is None or self.now - r.ended >= horizon:
                continue
            failed = [*failed, r.ended] if r.phase is MovePhase.FAILED else []
        if failed:
            wait = min(
                CONFIG.failure_backoff_seconds * 2 ** (len(failed) - 1),
                CONFIG.failure_backoff_max_seconds,
            )
            assert self.now - max(failed) >= wait, ("retried within its backoff", vm, failed)

    def reserve(self, key: str, uid: str) -> bool:
        entry = self.ledger.pods[uid]
        record = self.api[key]
        assert record.target_node is not None
        self.ledger.reserve_move(
            uid, target_name=f"{entry.name}-{self._uid()}", target_node=record.target_node,
            at=self.now,
        )  # fmt: skip
        self._write(key, msgspec.structs.replace(record, phase=MovePhase.RUNNING))
        self.source_of[key] = uid
        return True

    @rule(data=st.data())
    def controller_reserved(self, data):
        """The vm-controller's ``POST /v1/moves`` for a migration created earlier: the
        ledger may refuse it (the room went meanwhile), and the migration fails."""
        key = self._pick(data, (k for k, r in self.api.items() if r.phase is MovePhase.PENDING))
        if key is None:
            return
        uid = self._pod_of(self.api[key].vm)
        if uid is None or uid not in self.ledger.pods:
            self._end(key, succeeded=False)  # VMNotRunning
            return
        try:
            self.reserve(key, uid)
        except (NoRoom, UnknownNode, Conflict):
            self._end(key, succeeded=False)

    @rule(data=st.data(), node=st.sampled_from(sorted(NODES)))
    def human_migrated(self, data, node):
        """A VirtualMachineMigration made by hand: relief counts it as its own."""
        uid = self._pick(data, (u for u in self.api_pods if u in self.ledger.pods))
        if uid is None:
            return
        key = f"ns/human-{self._uid()}"
        self._write(key, MoveRecord(vm=self.vm_of[uid], target_node=node,
                                    phase=MovePhase.PENDING, created=self.now))  # fmt: skip

    @rule(data=st.data())
    def move_finished(self, data):
        key = self._pick(data, self.source_of)
        if key is None:
            return
        uid = self.source_of[key]
        move = self.ledger.moves[uid]
        source = self.ledger.pods[uid]
        assert source.vm is not None
        target_uid = self._uid()
        vm = self.vm_of[uid]
        pod = vm_pod(target_uid, move.target_key.split("/")[1], node=move.target_node,
                     lo=source.vm.min_vcpus, hi=source.vm.max_vcpus,
                     vm_name=vm.split("/")[1])  # fmt: skip
        self.api_pods[target_uid] = pod
        self.ledger.observe_pod(pod, at=self.now)
        self.vm_of[target_uid] = self.vm_of.pop(uid)
        self.book.move_finished(uid, target_uid)
        del self.api_pods[uid]
        self.ledger.forget_pod(uid)
        self._end(key, succeeded=True)

    @rule(data=st.data())
    def move_failed(self, data):
        key = self._pick(data, self.source_of)
        if key is not None:
            self.ledger.cancel_move(self.source_of[key])
            self._end(key, succeeded=False)

    @rule(data=st.data())
    def vm_deleted(self, data):
        uid = self._pick(data, (u for u in self.api_pods if u in self.ledger.pods))
        if uid is None:
            return
        vm = self.vm_of[uid]
        if uid in self.ledger.moves:
            self.ledger.cancel_move(uid)
        del self.api_pods[uid]
        self.vm_of.pop(uid, None)
        self.ledger.forget_pod(uid)
        for key, record in sorted(self.api.items()):
            if record.vm == vm and record.is_active:
                self._end(key, succeeded=False)  # the controller: VMNotFound, or aborted

    @rule(data=st.data())
    def migration_deleted(self, data):
        """Someone deletes an ended migration: its VM's history goes with it, everywhere."""
        key = self._pick(data, (k for k, r in self.api.items() if not r.is_active))
        if key is not None:
            del self.api[key]
            self.unseen.append(key)

    @rule(count=st.integers(1, 4))
    def watch_delivered(self, count):
        for key in self.unseen[:count]:
            if key in self.api:
                record = self.known[key] = self.api[key]
                self.book.migration_seen(key, record)
            else:
                self.book.migration_gone(key)
                self.known.pop(key, None)
        del self.unseen[:count]

    @rule(seconds=st.sampled_from([1.0, 20.0, 60.0, 200.0]), reserve_now=st.booleans())
    def time_passed(self, seconds, reserve_now):
        """Time passes, and relief's periodic pass runs."""
        self.now += seconds
        self.book.forget_gone(self.ledger, now=self.now, config=CONFIG)
        self.relief_pass(reserve_now)

    @precondition(lambda self: self.book.draining)
    @rule()
    def emptied_node_removed(self):
        for node in sorted(self.book.draining):
            state = self.ledger.nodes[node]
            if not state.own and not state.foreign:
                self.ledger.remove_node(node)
        self.book.forget_gone(self.ledger, now=self.now, config=CONFIG)

    @invariant()
    def a_restart_rebuilds_the_same_book(self):
        """Once the watch has delivered everything, a book rebuilt from the list of
        VirtualMachineMigrations (a restart, a failover) equals the one that lived through it,
        and so plans the same (``plan_moves`` is a function of the ledger and the book)."""
        if self.unseen:
            return
        book = self.book
        live = ReliefBook(
            wants=dict(book.wants),
            migrations=dict(book.migrations),
            touched_at=dict(book.touched_at),
            draining=set(book.draining),
        )
        rebuilt = ReliefBook(
            wants=dict(book.wants), touched_at=dict(book.touched_at), draining=set(book.draining)
        )
        rebuilt.migrations_listed(self.api)
        for b in (live, rebuilt):
            b.forget_gone(self.ledger, now=self.now, config=CONFIG)
        assert rebuilt == live

    @invariant()
    def never_over_a_node(self):
        self.ledger.check_invariants()
        for name, state in self.ledger.nodes.items():
            free = state.free
            assert free.cpu_millis >= 0 and free.memory_bytes >= 0, (name, free)
        sources = [self.ledger.pods[u].node for u in self.ledger.moves]
        humans = [
            k
            for k, r in [*self.api.items(), *self.known.items()]
            if r.is_active or k in self.source_of
        ]
        if not any(k.startswith("ns/human-") for k in humans):  # humans have no budget
            assert len(self._in_flight()) <= CONFIG.max_moves_in_flight
            assert len(sources) == len(set(sources)), "two moves leave one node"
        for key, uid in self.source_of.items():
            vm = self.ledger.pods[uid].vm
            # A human's migration of an opted-out VM is carried out; relief's never.
            assert vm is not None and (vm.is_movable or key.startswith("ns/human-"))

    def teardown(self):
        for uid in list(self.ledger.moves):
            self.ledger.cancel_move(uid)
        for uid in list(self.api_pods):
            self.ledger.forget_pod(uid)
        for node in sorted(self.book.draining):
            self.ledger.remove_node(node)
        assert not self.ledger.pods and self.ledger.totals() == Demand(0, 0)
        for key, record in sorted(self.api.items()):
            if record.is_active:
                self._end(key, succeeded=False)
        self.watch_delivered(len(self.unseen))
        self.book.forget_gone(self.ledger, now=self.now + 1e6, config=CONFIG)
        assert self.book.is_empty, self.book


ReliefMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
test_relief_rules = ReliefMachine.TestCase


def test_state_shows_the_moves_in_flight_only_while_there_are_some():
    ledger = ledger_of({"a": Demand(4000, 8 * GI), "b": Demand(4000, 8 * GI)})
    bind(ledger, "db", "a", lo=2, hi=4)
    assert "moves" not in dump_state(ledger)
    ledger.reserve_move("db", target_name="db-2", target_node="b", at=0.0)
    assert dump_state(ledger)["moves"] == [
        {
            "pod": "ns/db",
            "uid": "db",
            "fromNode": "a",
            "toNode": "b",
            "targetPod": "ns/db-2",
            "targetObserved": False,
            "held": {"cpuMillis": 2000, "memoryBytes": GI},
        }
    ]
    ledger.cancel_move("db")
    assert "moves" not in dump_state(ledger)


def test_state_shows_reliefs_book_of_migrations():
    ledger = ledger_of({"a": Demand(4000, 8 * GI), "b": Demand(4000, 8 * GI)})
    bind(ledger, "db", "a", lo=2, hi=4)
    book = ReliefBook()
    assert "migrations" not in dump_state(ledger, book)
    move = PlannedMove(uid="db", pod="ns/db", source="a", target="b",
                       reason=MoveReason.WATERMARK, message="", vm="ns/db")  # fmt: skip
    book.move_started(move, migration="ns/db-relief-0", now=0.0)
    assert dump_state(ledger, book)["migrations"] == [
        {
            "migration": "ns/db-relief-0",
            "vm": "ns/db",
            "toNode": "b",
            "phase": "Pending",
            "createdAt": "1970-01-01T00:00:00.000+00:00",
            "endedAt": None,
        }
    ]
    book.move_ended("ns/db-relief-0", succeeded=False, now=1.0)
    [ended] = dump_state(ledger, book)["migrations"]
    assert (ended["phase"], ended["endedAt"]) == ("Failed", "1970-01-01T00:00:01.000+00:00")
    book.forget_gone(ledger, now=1e6, config=CONFIG)
    assert "migrations" not in dump_state(ledger, book)


# -- drain: the other pods, by kubectl drain's rules -------------------------------------------


def foreign_pod(uid: str, node: str, disruption: Disruption, *, cpu: int = 100) -> PodInfo:
    """A pod another scheduler placed, of ``disruption``'s kind."""
    return PodInfo(
        uid=uid,
        namespace="ns",
        name=uid,
        node_name=node,
        scheduler_name="default-scheduler",
        requests=Demand(cpu, 64 * 2**20),
        priority=0,
        is_ours=False,
        is_vm=False,
        is_static=disruption is Disruption.MIRROR,
        is_terminated=False,
        disruption=disruption,
    )


def _pod(owner: str | None = None, *, mirror: bool = False, empty_dir: bool = False) -> Pod:
    refs = [OwnerReference(kind=owner, name="x", controller=True)] if owner else None
    return Pod(
        metadata=ObjectMeta(
            name="p",
            namespace="ns",
            owner_references=refs,
            annotations={ann.MIRROR_ANNOTATION: "abc"} if mirror else None,
        ),
        spec=PodSpec(
            volumes=[Volume(name="scratch", empty_dir=EmptyDirVolumeSource())]
            if empty_dir
            else [Volume(name="config")]
        ),
    )


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (_pod("ReplicaSet"), Disruption.EVICT),
        (_pod("StatefulSet"), Disruption.EVICT),
        (_pod("DaemonSet"), Disruption.DAEMONSET),
        (_pod("DaemonSet", empty_dir=True), Disruption.DAEMONSET),  # kubectl: DaemonSet first
        (_pod(mirror=True), Disruption.MIRROR),
        (_pod("Node"), Disruption.MIRROR),
        (_pod("ReplicaSet", empty_dir=True), Disruption.LOCAL_STORAGE),
        (_pod(), Disruption.UNMANAGED),
        (_pod(empty_dir=True), Disruption.LOCAL_STORAGE),  # kubectl: local storage first
    ],
    ids=["replicaset", "statefulset", "daemonset", "daemonset-emptydir", "mirror",
         "node-owned", "emptydir", "no-controller", "no-controller-emptydir"],
)  # fmt: skip
def test_a_pods_fate_in_a_drain_is_kubectl_drains(pod, expected):
    assert disruption_of(pod) is expected
    assert pod_info(pod, scheduler_name="vm-scheduler").disruption is expected


def _with_volumes(names: list[str], empty_dir: set[str], safe: str | None) -> Pod:
    return Pod(
        metadata=ObjectMeta(
            name="p",
            namespace="ns",
            owner_references=[OwnerReference(kind="ReplicaSet", name="x", controller=True)],
            annotations=None if safe is None else {ann.SAFE_TO_EVICT_LOCAL_VOLUMES: safe},
        ),
        spec=PodSpec(
            volumes=[
                Volume(name=n, empty_dir=EmptyDirVolumeSource() if n in empty_dir else None)
                for n in names
            ]
        ),
    )


@settings(max_examples=200, deadline=None)
@given(
    names=st.lists(st.sampled_from(["tmp", "cache", "config", "data"]), unique=True, max_size=4),
    empty=st.sets(st.sampled_from(["tmp", "cache", "config", "data"])),
    listed=st.none() | st.lists(st.sampled_from(["tmp", "cache", "data", " tmp", ""]), max_size=3),
)
def test_an_emptydir_blocks_a_drain_unless_the_pod_names_it_safe_to_evict(names, empty, listed):
    """cluster-autoscaler's rule: every emptyDir must be named in the annotation (split on
    commas, names as written) for its pod to be evicted; other volumes never matter."""
    pod = _with_volumes(names, empty, None if listed is None else ",".join(listed))
    named = set(listed or ())
    at_risk = [n for n in names if n in empty and n not in named]
    assert disruption_of(pod) is (Disruption.LOCAL_STORAGE if at_risk else Disruption.EVICT)


def _quiet_node_with(*kinds: Disruption) -> tuple[Ledger, ReliefBook]:
    ledger = ledger_of({"quiet": Demand(8000, 8 * GI), "busy": Demand(8000, 8 * GI)})
    bind(ledger, "a", "quiet", lo=1, hi=1)
    bind(ledger, "b", "busy", lo=4, hi=4)
    for i, kind in enumerate(kinds):
        ledger.observe_pod(foreign_pod(f"f{i}-{kind.value}", "quiet", kind), at=0.0)
    return ledger, ReliefBook()


def test_a_drain_moves_the_vms_then_evicts_the_rest_and_leaves_daemonsets_and_mirrors():
    ledger, book = _quiet_node_with(Disruption.EVICT, Disruption.DAEMONSET, Disruption.MIRROR)
    plan = plan_moves(ledger, book, now=100.0, config=CONFIG)
    assert plan.drain == ["quiet"]
    book.draining.update(plan.drain)
    plan = plan_moves(ledger, book, now=101.0, config=CONFIG)
    # VMs first: nothing is evicted while one of ours is still there.
    assert [m.pod for m in plan.moves] == ["ns/a"] and plan.evict == []
    ledger.forget_pod("a")
    plan = plan_moves(ledger, book, now=102.0, config=CONFIG)
    assert [(e.pod, e.node) for e in plan.evict] == [("ns/f0-evict", "quiet")]
    assert plan.emptied == []
    # Refused (a PodDisruptionBudget): tried again 5 s later, or at the server's Retry-After.
    book.eviction_answered("f0-evict", accepted=False, now=102.0)
    assert plan_moves(ledger, book, now=106.9, config=CONFIG).evict == []
    assert len(plan_moves(ledger, book, now=107.0, config=CONFIG).evict) == 1
    book.eviction_answered("f0-evict", accepted=False, now=107.0, retry_after=10.0)
    assert plan_moves(ledger, book, now=116.9, config=CONFIG).evict == []
    # Accepted: the pod terminates, and is not evicted again meanwhile.
    book.eviction_answered("f0-evict", accepted=True, now=117.0)
    assert plan_moves(ledger, book, now=118.0, config=CONFIG).evict == []
    ledger.forget_pod("f0-evict")
    assert plan_moves(ledger, book, now=119.0, config=CONFIG).emptied == ["quiet"]
    book.forget_gone(ledger, now=119.0, config=CONFIG)
    assert book.evicted == set() and book.evict_retry_at == {}


def test_a_drain_an_operator_starts_by_the_taint_ignores_the_share_and_the_hysteresis():
    """docs/DEPLOY.md: the taint is the drain; put by hand on a node relief would never pick
    (held well above ``below_share``, a VM grown there a moment ago), it drains all the same."""
    ledger, book = _quiet_node_with(Disruption.EVICT, Disruption.DAEMONSET)
    bind(ledger, "c", "quiet", lo=4, hi=4)
    book.touched_at["quiet"] = 99.0
    assert plan_moves(ledger, book, now=100.0, config=CONFIG).drain == []
    book.draining.add("quiet")
    plan = plan_moves(ledger, book, now=100.0, config=CONFIG)
    assert [(m.pod, m.reason) for m in plan.moves] == [("ns/a", MoveReason.DRAIN)]
    assert plan.evict == [] and plan.emptied == []


def test_a_drain_moves_a_vm_that_just_moved_there_but_a_failed_move_backs_off():
    """Rule 4: a drained node is never a target, so its VMs leave it without the cool-down (a
    VM moved there a moment ago goes now, not ``cooldown_seconds`` after the taint); a move
    that failed still waits its backoff, as any other."""
    ledger, book = _quiet_node_with(Disruption.EVICT)
    arrived = PlannedMove(uid="a", pod="ns/a", source="busy", target="quiet",
                          reason=MoveReason.WATERMARK, message="", vm="ns/a")  # fmt: skip
    book.move_started(arrived, migration="ns/a-in", now=100.0)
    book.move_ended("ns/a-in", succeeded=True, now=101.0)
    book.draining.add("quiet")
    [move] = plan_moves(ledger, book, now=102.0, config=CONFIG).moves  # cool-down: 100 s
    assert (move.pod, move.reason, move.target) == ("ns/a", MoveReason.DRAIN, "busy")
    book.move_started(move, migration="ns/a-out", now=102.0)
    book.move_ended("ns/a-out", succeeded=False, now=103.0)
    assert plan_moves(ledger, book, now=152.9, config=CONFIG).moves == []  # backoff: 50 s
    assert [m.pod for m in plan_moves(ledger, book, now=153.0, config=CONFIG).moves] == ["ns/a"]


@pytest.mark.parametrize("kind", [Disruption.UNMANAGED, Disruption.LOCAL_STORAGE], ids=str)
def test_a_node_with_a_pod_kubectl_drain_refuses_is_never_drained(kind):
    ledger, book = _quiet_node_with(Disruption.EVICT, kind)
    assert plan_moves(ledger, book, now=100.0, config=CONFIG).drain == []
    # Drained anyway (its taint put by hand): such a pod is never evicted, the node never empty.
    book.draining.add("quiet")
    ledger.forget_pod("a")
    plan = plan_moves(ledger, book, now=101.0, config=CONFIG)
    assert [e.pod for e in plan.evict] == ["ns/f0-evict"] and plan.emptied == []


@settings(max_examples=150, deadline=None)
@given(
    pods=st.lists(
        st.tuples(st.sampled_from(["n0", "n1", "n2"]), st.sampled_from(list(Disruption))),
        max_size=10,
    ),
    vms=st.lists(st.sampled_from(["n0", "n1", "n2"]), max_size=3),
    draining=st.sets(st.sampled_from(["n0", "n1", "n2"])),
    answered=st.lists(st.tuples(st.integers(0, 9), st.booleans(), st.integers(0, 20))),
    later=st.floats(0.0, 30.0),
)
def test_evictions_only_take_evictable_pods_from_drained_nodes_without_our_vms(
    pods, vms, draining, answered, later
):
    """Whatever the cluster and the answers so far: a pod is evicted only from a node being
    drained that none of our VMs holds anything on, never a DaemonSet or mirror pod nor one
    kubectl drain refuses, never one already evicted or refused less than its retry ago; and a
    node is empty exactly when only DaemonSet and mirror pods are left on it."""
    ledger = ledger_of({n: Demand(64000, 64 * GI) for n in ("n0", "n1", "n2")})
    for i, node in enumerate(vms):
        bind(ledger, f"v{i}", node, lo=1, hi=1)
    kinds = {}
    for i, (node, kind) in enumerate(pods):
        ledger.observe_pod(foreign_pod(f"f{i}", node, kind), at=0.0)
        kinds[f"f{i}"] = kind
    book = ReliefBook(draining=set(draining))
    answers: dict[str, tuple[bool, float]] = {}
    for i, accepted, at in answered:
        if f"f{i}" in kinds:
            book.eviction_answered(f"f{i}", accepted=accepted, now=float(at))
            answers[f"f{i}"] = (accepted, float(at))
    now = 20.0 + later
    plan = plan_moves(ledger, book, now=now, config=CONFIG)
    for e in plan.evict:
        entry = ledger.pods[e.uid]
        assert entry.disruption is Disruption.EVICT, entry
        assert e.node == entry.node in draining and not ledger.nodes[e.node].own
        found = answers.get(e.uid)
        assert found is None or (not found[0] and now - found[1] >= EVICTION_RETRY_SECONDS)
    assert len({e.uid for e in plan.evict}) == len(plan.evict)
    for node in draining:
        state = ledger.nodes[node]
        only_left = not state.own and all(e.disruption.is_left for e in state.foreign.values())
        assert (node in plan.emptied) is only_left
