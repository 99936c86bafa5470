"""Live moves in the ledger (``reserve_move`` and what the watch then sees), over random
histories: VMs are bound and resized, moves are reserved, their target pods appear, and each
move ends in any of its ways (source gone: success; target gone, or cancelled before or after
its target pod exists: failure). After every step no node is promised more than it has (moves
are this extender's decisions, and these nodes never shrink); at the end everything is zero.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from protocol import annotations as ann
from protocol.permits import PodRef, ResourceRequest, Resources
from scheduler_extender.core.ledger import Conflict, Ledger, LedgerError, NoRoom, SystemReserve
from scheduler_extender.core.permits import decide
from scheduler_extender.core.podinfo import Demand, PodInfo
from tests.property import common

GI = 2**30
NODES = {"n1": Demand(4000, 8 * GI), "n2": Demand(6000, 8 * GI), "n3": Demand(3000, 4 * GI)}


def vm_pod(uid: str, name: str, *, node: str | None, lo: int, hi: int, vcpus: int | None = None):
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
            min_vcpus=lo, max_vcpus=hi, scaling_unit=1, min_memory_bytes=GI, max_memory_bytes=GI
        ),
        permitted_vcpus=vcpus,
    )


class MoveMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.ledger = Ledger(reserve=SystemReserve(cpu_fraction=0.0))
        for node, allocatable in NODES.items():
            self.ledger.upsert_node(node, allocatable=allocatable)
        self.api_pods: dict[str, PodInfo] = {}
        self.counter = 0

    def _uid(self) -> str:
        self.counter += 1
        return f"u{self.counter}"

    def _vms(self, data, *, moving: bool | None = None) -> str | None:
        uids = sorted(
            u
            for u in self.api_pods
            if u in self.ledger.pods and (moving is None or (u in self.ledger.moves) == moving)
        )
        return data.draw(st.sampled_from(uids)) if uids else None

    @rule(node=st.sampled_from(sorted(NODES)), lo=st.integers(1, 2), extra=st.integers(0, 3))
    def vm_bound(self, node, lo, extra):
        uid = self._uid()
        pod = vm_pod(uid, f"vm-{uid}", node=None, lo=lo, hi=lo + extra)
        try:
            self.ledger.reserve_for_bind(pod, node, at=0.0)
        except NoRoom:
            return
        self.api_pods[uid] = msgspec.structs.replace(pod, node_name=node)
        self.ledger.observe_pod(self.api_pods[uid], at=0.0)

    @rule(want=st.integers(1, 5), data=st.data())
    def agent_asked(self, want, data):
        uid = self._vms(data)
        if uid is None:
            return
        entry = self.ledger.pods[uid]
        assert entry.vm is not None and entry.vcpus is not None
        requested = max(entry.vm.min_vcpus, min(entry.vm.max_vcpus, want))
        d = decide(
            self.ledger,
            ResourceRequest(
                pod=PodRef(namespace="ns", name=entry.name, uid=uid),
                node=entry.node,
                current=Resources(vcpus=entry.vcpus, memory_bytes=GI),
                requested=Resources(vcpus=requested, memory_bytes=GI),
                last_permit=None,
            ),
        )
        assert d.permit.permit is not None
        if uid in self.ledger.moves:
            assert d.permit.permit.vcpus <= entry.vcpus or requested <= entry.vcpus

    @rule(to=st.sampled_from(sorted(NODES)), data=st.data())
    def move_reserved(self, to, data):
        target = to
        uid = self._vms(data)
        if uid is None:
            return
        source = self.ledger.pods[uid]
        before = {n: s.free for n, s in self.ledger.nodes.items()}
        room = self.ledger.nodes[target].free
        try:
            self.ledger.reserve_move(uid, target_name=f"{source.name}-{self._uid()}",
                                     target_node=target, at=0.0)  # fmt: skip
        except Conflict:
            assert target == source.node or any(
                uid in (m.source_uid, m.target_uid) for m in self.ledger.moves.values()
            )
            assert {n: s.free for n, s in self.ledger.nodes.items()} == before
            return
        except NoRoom:
            assert (
                source.held.cpu_millis > room.cpu_millis
                or source.held.memory_bytes > room.memory_bytes
            )
            assert {n: s.free for n, s in self.ledger.nodes.items()} == before
            return
        assert self.ledger.nodes[target].free == Demand(
            room.cpu_millis - source.held.cpu_millis, room.memory_bytes - source.held.memory_bytes
        )

    @rule(data=st.data())
    def target_pod_bound(self, data):
        uid = self._vms(data, moving=True)
        if uid is None:
            return
        move = self.ledger.moves[uid]
        if move.is_target_observed:
            return
        source = self.ledger.pods[uid]
        assert source.vm is not None
        target_uid = self._uid()
        pod = vm_pod(target_uid, move.target_key.split("/")[1], node=move.target_node,
                     lo=source.vm.min_vcpus, hi=source.vm.max_vcpus)  # fmt: skip
        reserved = self.ledger.nodes[move.target_node].free
        reservation = self.ledger.pods[f"move:{uid}"].held
        self.api_pods[target_uid] = pod
        self.ledger.observe_pod(pod, at=0.0)
        # The pod took the reservation over at the VM's size now (the permit travelled with
        # it): never more than was reserved.
        taken = self.ledger.pods[target_uid]
        assert taken.vcpus == source.vcpus
        assert taken.held.cpu_millis <= reservation.cpu_millis
        free = self.ledger.nodes[move.target_node].free
        assert free.cpu_millis >= reserved.cpu_millis
        assert self.ledger.moves[uid].target_uid == target_uid

    @rule(data=st.data())
    def moved(self, data):
        """Cut over: the source pod is deleted; the VM is the target pod's."""
        uid = self._vms(data, moving=True)
        if uid is None or not self.ledger.moves[uid].is_target_observed:
            return
        target_uid = self.ledger.moves[uid].target_uid
        del self.api_pods[uid]
        self.ledger.forget_pod(uid)
        assert uid not in self.ledger.moves
        assert target_uid in self.ledger.pods

    @rule(data=st.data())
    def target_gone(self, data):
        """The target pod died or was removed after a failure: the source runs on."""
        uid = self._vms(data, moving=True)
        if uid is None or not self.ledger.moves[uid].is_target_observed:
            return
        target_uid = self.ledger.moves[uid].target_uid
        del self.api_pods[target_uid]
        self.ledger.forget_pod(target_uid)
        assert uid not in self.ledger.moves
        assert uid in self.ledger.pods

    @rule(data=st.data())
    def move_cancelled(self, data):
        uid = self._vms(data, moving=True)
        if uid is None:
            return
        move = self.ledger.moves[uid]
        self.ledger.cancel_move(uid)
        assert uid not in self.ledger.moves
        if move.is_target_observed:  # the target pod still exists and is counted until gone
            assert move.target_uid in self.ledger.pods
        else:
            assert f"move:{uid}" not in self.ledger.pods

    @rule(data=st.data())
    def source_died(self, data):
        uid = self._vms(data)
        if uid is None:
            return
        del self.api_pods[uid]
        self.ledger.forget_pod(uid)
        assert uid not in self.ledger.moves
        assert f"move:{uid}" not in self.ledger.pods

    @invariant()
    def never_promised_more_than_it_has(self):
        self.ledger.check_invariants()
        for name, state in self.ledger.nodes.items():
            free = state.free
            assert free.cpu_millis >= 0 and free.memory_bytes >= 0, (name, free)

    def teardown(self):
        for uid in list(self.ledger.moves):
            self.ledger.cancel_move(uid)
        common.forget_everything(self.ledger, self.api_pods)
        assert not self.ledger.moves


MoveMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
test_moves = MoveMachine.TestCase


@pytest.mark.parametrize(
    ("source", "target", "error"),
    [("nope", "n2", "holds nothing"), ("u1", "n1", "already runs on"), ("u1", "n9", "not known")],
    ids=["unknown-vm", "same-node", "unknown-node"],
)
def test_bad_moves_are_refused_and_change_nothing(source, target, error):
    ledger = Ledger(reserve=SystemReserve(cpu_fraction=0.0))
    for node, allocatable in NODES.items():
        ledger.upsert_node(node, allocatable=allocatable)
    pod = vm_pod("u1", "vm", node="n1", lo=1, hi=2)
    ledger.observe_pod(pod, at=0.0)
    generation = ledger.generation
    with pytest.raises(LedgerError, match=error):
        ledger.reserve_move(source, target_name="vm-2", target_node=target, at=0.0)
    assert ledger.generation == generation and not ledger.moves


def test_a_vm_already_moving_is_refused():
    ledger = Ledger(reserve=SystemReserve(cpu_fraction=0.0))
    for node, allocatable in NODES.items():
        ledger.upsert_node(node, allocatable=allocatable)
    ledger.observe_pod(vm_pod("u1", "vm", node="n1", lo=1, hi=2, vcpus=1), at=0.0)
    ledger.reserve_move("u1", target_name="vm-2", target_node="n2", at=0.0)
    with pytest.raises(Conflict, match="already moving"):
        ledger.reserve_move("u1", target_name="vm-3", target_node="n3", at=0.0)
