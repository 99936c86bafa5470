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
from protocol.permits import PodRef, ResourceRequest, Resources
from scheduler_extender.core.ledger import Ledger, NoRoom, SystemReserve, UnknownNode
from scheduler_extender.core.permits import decide_batch
from scheduler_extender.core.podinfo import Demand, PodInfo
from scheduler_extender.core.refusals import Refused
from scheduler_extender.core.relief import (
    DrainConfig,
    MoveReason,
    ReliefBook,
    ReliefConfig,
    choose_target,
    plan_moves,
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
):
    """A VM pod; ``controlled``: a VirtualMachine of the same name owns it."""
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
        vm_name=name if controlled else None,
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
    book.node_touched("quiet", now=0.0)
    assert plan_moves(ledger, book, now=10.0, config=CONFIG).drain == []
    plan = plan_moves(ledger, book, now=60.0, config=CONFIG)
    assert plan.drain == ["quiet"]
    book.draining.update(plan.drain)
    plan = plan_moves(ledger, book, now=61.0, config=CONFIG)
    assert [(m.pod, m.target, m.reason) for m in plan.moves] == [("ns/a", "busy", MoveReason.DRAIN)]
    ledger.forget_pod("a")
    assert plan_moves(ledger, book, now=62.0, config=CONFIG).emptied == ["quiet"]


def test_drain_is_off_by_default():
    ledger = ledger_of({"quiet": Demand(8000, 8 * GI), "busy": Demand(8000, 8 * GI)})
    bind(ledger, "a", "quiet", lo=1, hi=1)
    assert ReliefConfig().drain.enabled is False
    assert plan_moves(ledger, ReliefBook(), now=1e6, config=ReliefConfig()).drain == []


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
    def __init__(self):
        super().__init__()
        self.ledger = ledger_of(NODES)
        self.book = ReliefBook()
        self.now = 0.0
        self.counter = 0
        self.api_pods: dict[str, PodInfo] = {}
        self.vm_of: dict[str, str] = {}  # pod uid -> the VM it runs (a move changes the pod)
        self.moved_at: dict[str, float] = {}  # VM -> when its last move started

    def _uid(self) -> str:
        self.counter += 1
        return f"u{self.counter}"

    def _pick(self, data, uids) -> str | None:
        uids = sorted(uids)
        return data.draw(st.sampled_from(uids)) if uids else None

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
        self.vm_of[uid] = uid
        self.book.node_touched(node, now=self.now)

    @rule(want=st.integers(1, 7), data=st.data())
    def agent_asked(self, want, data):
        uid = self._pick(data, (u for u in self.api_pods if u in self.ledger.pods))
        if uid is None:
            return
        entry = self.ledger.pods[uid]
        assert entry.vm is not None
        ask(self.ledger, self.book, uid, max(entry.vm.min_vcpus, min(entry.vm.max_vcpus, want)),
            now=self.now)  # fmt: skip

    @rule()
    def relief_ran(self):
        plan = plan_moves(self.ledger, self.book, now=self.now, config=CONFIG)
        for move in plan.moves:
            entry = self.ledger.pods[move.uid]
            assert entry.vm is not None and entry.vm.is_movable, "an opted-out VM moves"
            vm = self.vm_of[move.uid]
            since = self.moved_at.get(vm)
            assert since is None or self.now - since >= CONFIG.cooldown_seconds, "ping-pong"
            assert move.target not in self.book.draining
            if move.reason is MoveReason.GROWER:
                # Room for its full requested size on the target, at this moment.
                want = self.book.wants[move.uid].requested
                free = self.ledger.nodes[move.target].free
                assert want.cpu_millis <= free.cpu_millis and want.memory_bytes <= free.memory_bytes
            self.ledger.reserve_move(
                move.uid, target_name=f"{entry.name}-{self._uid()}", target_node=move.target,
                at=self.now,
            )  # fmt: skip
            self.book.move_started(move, now=self.now)
            self.moved_at[vm] = self.now
            self.check_budgets()
        for node in plan.emptied:
            state = self.ledger.nodes[node]
            assert not state.own and not state.foreign
        self.book.draining.update(plan.drain)

    @rule(data=st.data())
    def move_finished(self, data):
        uid = self._pick(data, self.ledger.moves)
        if uid is None:
            return
        move = self.ledger.moves[uid]
        source = self.ledger.pods[uid]
        assert source.vm is not None
        target_uid = self._uid()
        pod = vm_pod(target_uid, move.target_key.split("/")[1], node=move.target_node,
                     lo=source.vm.min_vcpus, hi=source.vm.max_vcpus)  # fmt: skip
        self.api_pods[target_uid] = pod
        self.ledger.observe_pod(pod, at=self.now)
        self.vm_of[target_uid] = self.vm_of.pop(uid)
        self.book.move_finished(uid, target_uid)
        del self.api_pods[uid]
        self.ledger.forget_pod(uid)

    @rule(data=st.data())
    def move_failed(self, data):
        uid = self._pick(data, self.ledger.moves)
        if uid is not None:
            self.ledger.cancel_move(uid)

    @rule(data=st.data())
    def vm_deleted(self, data):
        uid = self._pick(data, (u for u in self.api_pods if u in self.ledger.pods))
        if uid is None:
            return
        del self.api_pods[uid]
        self.vm_of.pop(uid, None)
        self.ledger.forget_pod(uid)

    @rule(seconds=st.sampled_from([1.0, 20.0, 60.0]))
    def time_passed(self, seconds):
        self.now += seconds
        self.book.forget_gone(self.ledger, now=self.now, config=CONFIG)

    @precondition(lambda self: self.book.draining)
    @rule()
    def emptied_node_removed(self):
        for node in sorted(self.book.draining):
            state = self.ledger.nodes[node]
            if not state.own and not state.foreign:
                self.ledger.remove_node(node)
        self.book.forget_gone(self.ledger, now=self.now, config=CONFIG)

    def check_budgets(self):
        assert len(self.ledger.moves) <= CONFIG.max_moves_in_flight
        sources = [self.ledger.pods[u].node for u in self.ledger.moves]
        assert len(sources) == len(set(sources)), "two moves leave one node"

    @invariant()
    def never_over_a_node(self):
        self.ledger.check_invariants()
        for name, state in self.ledger.nodes.items():
            free = state.free
            assert free.cpu_millis >= 0 and free.memory_bytes >= 0, (name, free)
        self.check_budgets()
        for uid in self.ledger.moves:
            vm = self.ledger.pods[uid].vm
            assert vm is not None and vm.is_movable

    def teardown(self):
        for uid in list(self.ledger.moves):
            self.ledger.cancel_move(uid)
        for uid in list(self.api_pods):
            self.ledger.forget_pod(uid)
        for node in sorted(self.book.draining):
            self.ledger.remove_node(node)
        assert not self.ledger.pods and self.ledger.totals() == Demand(0, 0)
        self.book.forget_gone(self.ledger, now=self.now + 1e6, config=CONFIG)
        assert self.book.is_empty, self.book


ReliefMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=40, deadline=None,
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
