"""Memory permits over random histories (hypothesis state machine).

VMs whose memory scales are bound, grow and shrink through their agents' requests; a guest
may give back less than it was asked to (a shrink ends where the guest stopped), and some
agents lie: they report memory they were never granted, in steady reports, notices and
requests, with made-up last permits. The extender restarts and rebuilds from the durable
records. After every step: no node's memory holds exceed what it can give, and every grant
is ``min + k * unit``; a restart, once the agents report, gives the same memory holds; when
every pod is gone, nothing is held.
"""

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from protocol import annotations as ann
from protocol.permits import PodRef, ResourceRequest, Resources
from scheduler_extender.core.ledger import Ledger, LedgerError, SystemReserve
from scheduler_extender.core.permits import decide, decide_batch
from scheduler_extender.core.podinfo import Demand, PodInfo
from tests.property import common
from tests.support import pod_info

MI = 2**20
NODES = ["n1", "n2"]


class MemoryMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.ledger = Ledger(reserve=SystemReserve(cpu_fraction=0.2, memory_fraction=0.1))
        self.api_nodes: dict[str, Demand] = {}
        self.api_pods: dict[str, PodInfo] = {}
        self.real: dict[str, int] = {}  # bytes each VM's guest really has plugged
        self.counter = 0

    def _pick(self, data):
        uids = sorted(u for u, e in self.ledger.pods.items() if not e.is_tentative)
        return data.draw(st.sampled_from(uids)) if uids else None

    def _record(self, uid):
        """The durable record the extender writes after every permit."""
        entry = self.ledger.pods[uid]
        self.api_pods[uid] = msgspec.structs.replace(
            self.api_pods[uid], permitted_memory_bytes=entry.memory_bytes
        )

    def _ask(self, uid, current, requested, last):
        entry = self.ledger.pods[uid]
        d = decide(
            self.ledger,
            ResourceRequest(
                pod=PodRef(namespace="ns", name=uid, uid=uid),
                node=entry.node,
                current=Resources(vcpus=1, memory_bytes=current),
                requested=Resources(vcpus=1, memory_bytes=requested),
                last_permit=Resources(vcpus=1, memory_bytes=last) if last is not None else None,
            ),
        )
        assert d.refused is None and d.permit.permit is not None, d.permit
        self._record(uid)
        return d.permit.permit.memory_bytes

    @initialize(mems=st.lists(st.integers(2, 24), min_size=2, max_size=2))
    def nodes_listed(self, mems):
        for node, gib in zip(NODES, mems, strict=True):
            self.api_nodes[node] = Demand(64_000, gib * 1024 * MI)
            self.ledger.upsert_node(node, allocatable=self.api_nodes[node])

    @rule(
        node=st.sampled_from(NODES),
        lo=st.integers(1, 8),
        extra=st.integers(0, 16),
        unit=st.sampled_from([128, 256, 384, 1024]),
        qemu=st.integers(0, 4),
    )
    def vm_bound(self, node, lo, extra, unit, qemu):
        self.counter += 1
        uid = f"v{self.counter}"
        spec = ann.VmSpec(
            min_vcpus=1,
            max_vcpus=1,
            min_memory_bytes=lo * 256 * MI,
            max_memory_bytes=(lo + extra) * 256 * MI,
            memory_unit_bytes=unit * MI,
        )
        # A memory-scaling VM's container may be written above its guest (QEMU's own memory):
        # it holds that on top of every permit.
        overhead = qemu * 128 * MI if extra else 0
        pod = msgspec.structs.replace(
            pod_info(uid, requests=Demand(1000, spec.min_memory_bytes + overhead), vm=spec),
            memory_extra_bytes=overhead,
            container_memory_overhead_bytes=overhead,
        )
        try:
            self.ledger.reserve_for_bind(pod, node, at=0)
        except LedgerError:
            return
        self.api_pods[uid] = msgspec.structs.replace(pod, node_name=node)
        self.ledger.observe_pod(self.api_pods[uid], at=0)
        self.real[uid] = spec.min_memory_bytes

    @rule(data=st.data(), want=st.integers(0, 10_000))
    def agent_grew_or_shrank(self, data, want):
        """An honest agent: grows to what it is granted; a shrink ends where the guest
        stopped giving memory back, and that is what the notice reports."""
        uid = self._pick(data)
        if uid is None:
            return
        vm = self.ledger.pods[uid].vm
        assert vm is not None
        current, last = self.real[uid], self.ledger.pods[uid].memory_bytes
        target = vm.memory_bounds.round_down(vm.min_memory_bytes + want * MI)
        if target > current:
            granted = self._ask(uid, current, target, last)
            assert current <= granted <= target
            assert (granted - vm.min_memory_bytes) % vm.memory_unit_bytes == 0 or (
                granted == current
            )
            self.real[uid] = granted
        elif target < current:
            steps = (current - target) // vm.memory_unit_bytes
            given = data.draw(st.integers(0, steps)) * vm.memory_unit_bytes
            reached = current - given
            assert self._ask(uid, current, reached, last) == reached
            self.real[uid] = reached
        else:
            assert self._ask(uid, current, current, last) == current

    @rule(
        data=st.data(),
        claim=st.integers(0, 10_000),
        asked=st.integers(0, 10_000),
        last=st.none() | st.integers(0, 10_000),
    )
    def agent_lied(self, data, claim, asked, last):
        """An agent reports memory it was never granted (within the VM's bounds)."""
        uid = self._pick(data)
        if uid is None:
            return
        vm = self.ledger.pods[uid].vm
        assert vm is not None

        def within(extra):
            return min(vm.max_memory_bytes, vm.min_memory_bytes + extra * MI)

        current = within(claim)
        answered = self._ask(uid, current, within(asked), None if last is None else within(last))
        # Whatever it said, it ends up with what it was answered (it gives the rest back).
        self.real[uid] = answered

    @rule(node=st.sampled_from(NODES), wants=st.lists(st.integers(0, 10_000), min_size=2))
    def agents_grew_together(self, node, wants):
        """One node's batch of VMs growing memory: shared fairly, never over-committing."""
        uids = sorted(u for u, e in self.ledger.pods.items() if e.node == node)[: len(wants)]
        if len(uids) < 2:
            return
        requests = []
        for uid, want in zip(uids, wants, strict=False):
            vm = self.ledger.pods[uid].vm
            assert vm is not None
            current = self.real[uid]
            requests.append(
                ResourceRequest(
                    pod=PodRef(namespace="ns", name=uid, uid=uid),
                    node=node,
                    current=Resources(vcpus=1, memory_bytes=current),
                    requested=Resources(
                        vcpus=1, memory_bytes=max(current, vm.memory_bounds.round_down(want * MI))
                    ),
                    last_permit=Resources(vcpus=1, memory_bytes=self.ledger.pods[uid].memory_bytes),
                )
            )
        for req, d in zip(requests, decide_batch(self.ledger, node, requests), strict=True):
            assert d.permit.permit is not None, d.permit
            granted = d.permit.permit.memory_bytes
            assert req.current.memory_bytes <= granted <= req.requested.memory_bytes
            self.real[req.pod.uid] = granted
            self._record(req.pod.uid)

    @rule(data=st.data())
    def vm_deleted(self, data):
        uid = self._pick(data)
        if uid is None:
            return
        self.api_pods.pop(uid)
        self.real.pop(uid)
        self.ledger.forget_pod(uid)

    @precondition(lambda self: bool(self.api_pods))
    @rule()
    def extender_restarted(self):
        before = {u: (e.node, e.held, e.memory_bytes) for u, e in self.ledger.pods.items()}
        rebuilt = common.rebuilt(self.ledger, self.api_nodes, self.api_pods.values(), at=0)
        for uid, entry in rebuilt.pods.items():
            # The durable record: the same hold, the rest up to the maximum kept out of free.
            assert (entry.node, entry.held, entry.memory_bytes) == before[uid]
            assert entry.vm is not None
            assert entry.held.memory_bytes + entry.uncertain.memory_bytes >= (
                entry.vm.top_memory_bytes
            )
        old, self.ledger = self.ledger, rebuilt
        for uid in sorted(rebuilt.pods):
            real = self.real[uid]
            self._ask(uid, real, real, old.pods[uid].memory_bytes)
        assert {u: (e.node, e.held, e.memory_bytes) for u, e in rebuilt.pods.items()} == before
        for name, state in old.nodes.items():
            assert rebuilt.nodes[name].allocated == state.allocated
            assert rebuilt.nodes[name].uncertain_total == Demand(0, 0)

    @rule(data=st.data())
    def everything_deleted(self, data):
        if data.draw(st.integers(0, 9)) != 0:
            return
        common.forget_everything(self.ledger, self.api_pods)
        self.real.clear()

    @invariant()
    def memory_holds_never_exceed_what_a_node_can_give(self):
        self.ledger.check_invariants()
        for name, state in self.ledger.nodes.items():
            assert state.allocated.memory_bytes <= state.usable.memory_bytes, name

    @invariant()
    def no_vm_holds_less_than_its_guest_has(self):
        for uid, real in self.real.items():
            entry = self.ledger.pods[uid]
            assert entry.held.memory_bytes >= real + entry.memory_extra, (uid, entry.held, real)


TestMemoryMachine = MemoryMachine.TestCase
TestMemoryMachine.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
