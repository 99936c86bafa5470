"""The ledger's invariants over random histories (hypothesis state machine).

The machine keeps two views: the *API server's* (pods with their node, phase and durable
permit annotation, which is what a restarted extender lists) and the extender's ledger. Rules
are what happens in a cluster: nodes come, change and go; foreign pods and VMs appear, get
bound (or the bind fails), are resized by agents, terminate or are deleted; the extender
restarts. After every step the ledger's invariants hold, the fit index agrees with a fresh
computation, and nothing this extender decided over-committed a node.
"""

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from protocol import annotations as ann
from protocol.permits import PermitStatus, PodRef, ResourceRequest, Resources
from scheduler_extender.core.ledger import Ledger, LedgerError, SystemReserve
from scheduler_extender.core.permits import decide, decide_batch
from scheduler_extender.core.placement import (
    NOT_KNOWN,
    FitIndex,
    ScoreIndex,
    Strategy,
    rejection,
    score_nodes,
    verdict,
)
from scheduler_extender.core.podinfo import Demand, PodInfo
from tests.property import common

GI = 2**30
NODES = ["n1", "n2", "n3"]
SIZES = [Demand(1000, GI), Demand(2000, GI), Demand(500, 0), Demand(4000, 2 * GI)]


def overcommit(ledger: Ledger, node: str) -> tuple[int, int]:
    state = ledger.nodes.get(node)
    if state is None:
        return (0, 0)
    free = state.free
    return (max(0, -free.cpu_millis), max(0, -free.memory_bytes))


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.ledger = Ledger(reserve=SystemReserve(cpu_fraction=0.2))
        self.index = FitIndex(self.ledger)
        self.scores = ScoreIndex(self.ledger)
        self.api_nodes: dict[str, Demand] = {}
        self.api_pods: dict[str, PodInfo] = {}
        self.current: dict[str, int] = {}  # vCPUs each VM really runs with
        # Per size, the last (version, answer) seen: the extender reuses an encoded answer
        # while ``version(size)`` stands still, so a changed answer must change the version.
        self.answers: dict[Demand, tuple[tuple[int, int], object]] = {}
        # The same for prioritize's answers, per (size, growth, strategy).
        self.score_answers: dict[tuple[Demand, int, Strategy], tuple[int, object]] = {}
        self.counter = 0
        self.at = 0.0

    def _uid(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def _observe(self, pod: PodInfo):
        self.api_pods[pod.uid] = pod
        self.ledger.observe_pod(pod, at=self.at)

    def _pick(self, data, prefix, *, bound=None):
        uids = sorted(
            u
            for u, p in self.api_pods.items()
            if u.startswith(prefix) and (bound is None or (p.node_name is not None) == bound)
        )
        return data.draw(st.sampled_from(uids)) if uids else None

    @initialize(cpus=st.lists(st.integers(2000, 10000), min_size=3, max_size=3))
    def nodes_listed(self, cpus):
        for node, cpu in zip(NODES, cpus, strict=True):
            self.node_added_or_changed(node, cpu, 16)

    @rule(node=st.sampled_from(NODES), cpu=st.integers(1000, 10000), mem=st.integers(1, 32))
    def node_added_or_changed(self, node, cpu, mem):
        self.api_nodes[node] = Demand(cpu, mem * GI)
        self.ledger.upsert_node(node, allocatable=Demand(cpu, mem * GI))

    @rule(node=st.sampled_from(NODES))
    def node_removed(self, node):
        self.api_nodes.pop(node, None)
        self.ledger.remove_node(node)

    @rule(
        node=st.sampled_from(NODES),
        cpu=st.integers(0, 1500),
        mem=st.integers(0, 8),
        static=st.booleans(),
    )
    def foreign_pod_started(self, node, cpu, mem, static):
        uid = self._uid("f")
        pod = PodInfo(
            uid=uid,
            namespace="ns",
            name=uid,
            node_name=node,
            scheduler_name="default-scheduler",
            requests=Demand(cpu, mem * GI),
            priority=0,
            is_ours=False,
            is_vm=False,
            is_static=static,
            is_terminated=False,
        )
        self._observe(pod)

    @rule(lo=st.integers(1, 3), extra=st.integers(0, 6), unit=st.integers(1, 3))
    def vm_created(self, lo, extra, unit):
        uid = self._uid("v")
        spec = ann.VmSpec(
            min_vcpus=lo,
            max_vcpus=lo + extra,
            scaling_unit=unit,
            min_memory_bytes=GI,
            max_memory_bytes=GI,
        )
        pod = PodInfo(
            uid=uid,
            namespace="ns",
            name=uid,
            node_name=None,
            scheduler_name="vm-scheduler",
            requests=Demand(lo * 1000, GI),
            priority=0,
            is_ours=True,
            is_vm=True,
            is_static=False,
            is_terminated=False,
            vm=spec,
        )
        self._observe(pod)

    @rule(node=st.sampled_from(NODES), succeeds=st.booleans(), data=st.data())
    def vm_bound(self, node, succeeds, data):
        uid = self._pick(data, "v", bound=False)
        if uid is None:
            return
        pod = self.api_pods[uid]
        before = overcommit(self.ledger, node)
        fits = self.index.filter(pod.initial_demand(), [node]).passed == [node]
        try:
            self.ledger.reserve_for_bind(pod, node, at=self.at)
        except LedgerError:
            assert not fits, "the fit index said it fits but the bind refused"
            return
        assert fits, "the bind reserved on a node the fit index rejects"
        after = overcommit(self.ledger, node)
        assert after[0] <= before[0] and after[1] <= before[1], (before, after)
        if succeeds:
            self.current[uid] = pod.initial_demand().cpu_millis // 1000
            self._observe(msgspec.structs.replace(pod, node_name=node))
        else:
            self.ledger.cancel_bind(uid)

    @rule(want=st.integers(1, 9), data=st.data())
    def agent_asked(self, want, data):
        uid = self._pick(data, "v", bound=True)
        entry = self.ledger.pods.get(uid) if uid is not None else None
        if entry is None or entry.is_tentative or entry.vm is None:
            return
        vm = entry.vm
        current = self.current.get(uid, vm.min_vcpus)
        requested = max(vm.min_vcpus, min(vm.max_vcpus, want))
        before = overcommit(self.ledger, entry.node)
        last = data.draw(st.sampled_from([None, entry.vcpus]))
        d = decide(
            self.ledger,
            ResourceRequest(
                pod=PodRef(namespace="ns", name=uid, uid=uid),
                node=entry.node,
                current=Resources(vcpus=current, memory_bytes=GI),
                requested=Resources(vcpus=requested, memory_bytes=GI),
                last_permit=Resources(vcpus=last, memory_bytes=GI) if last else None,
            ),
        )
        assert uid is not None
        assert d.refused is None and d.permit.permit is not None
        granted = d.permit.permit.vcpus
        if requested > current:
            assert current <= granted <= requested
            if granted > current:
                assert (granted - vm.min_vcpus) % vm.scaling_unit == 0
                # a grant above reality never creates or deepens an over-commit
                after = overcommit(self.ledger, entry.node)
                assert after[0] <= before[0] and after[1] <= before[1], (before, after)
        elif requested < current:
            assert granted == requested and d.permit.status is PermitStatus.RELEASED
        else:
            assert granted >= current
        # The agent resizes to the permit (or stays, when it asked for less); the extender
        # records it durably on the pod.
        self.current[uid] = min(granted, requested) if requested >= current else requested
        pod = self.api_pods[uid]
        self.api_pods[uid] = msgspec.structs.replace(pod, permitted_vcpus=entry.vcpus)

    @rule(node=st.sampled_from(NODES), wants=st.lists(st.integers(1, 9), min_size=2, max_size=3))
    def agents_asked_together(self, node, wants):
        """One node's batch of growing VMs: shared fairly, never over-committing."""
        entries = sorted(
            (
                e
                for e in self.ledger.pods.values()
                if e.node == node and e.vm and not e.is_tentative
            ),
            key=lambda e: e.uid,
        )[: len(wants)]
        if len(entries) < 2:
            return
        before = overcommit(self.ledger, node)
        requests = []
        for entry, want in zip(entries, wants, strict=False):
            assert entry.vm is not None
            current = self.current.get(entry.uid, entry.vm.min_vcpus)
            requested = max(current, min(entry.vm.max_vcpus, want))
            requests.append(
                ResourceRequest(
                    pod=PodRef(namespace="ns", name=entry.uid, uid=entry.uid),
                    node=node,
                    current=Resources(vcpus=current, memory_bytes=GI),
                    requested=Resources(vcpus=requested, memory_bytes=GI),
                    last_permit=Resources(vcpus=entry.vcpus or current, memory_bytes=GI),
                )
            )
        decisions = decide_batch(self.ledger, node, requests)
        for req, d in zip(requests, decisions, strict=True):
            assert d.permit.permit is not None
            granted = d.permit.permit.vcpus
            assert req.current.vcpus <= granted <= req.requested.vcpus
            uid = req.pod.uid
            self.current[uid] = granted
            self.api_pods[uid] = msgspec.structs.replace(
                self.api_pods[uid], permitted_vcpus=self.ledger.pods[uid].vcpus
            )
        after = overcommit(self.ledger, node)
        assert after[0] <= before[0] and after[1] <= before[1], (before, after)

    @rule(data=st.data())
    def vm_deleted(self, data):
        uid = self._pick(data, "v")
        if uid is None:
            return
        self.api_pods.pop(uid, None)
        self.current.pop(uid, None)
        self.ledger.forget_pod(uid)

    @rule(delete=st.booleans(), data=st.data())
    def foreign_pod_finished(self, delete, data):
        uid = self._pick(data, "f")
        if uid is None:
            return
        pod = self.api_pods.pop(uid, None)
        if delete or pod is None:
            self.ledger.forget_pod(uid)
        else:
            self.ledger.observe_pod(msgspec.structs.replace(pod, is_terminated=True), at=self.at)

    @precondition(lambda self: not any(e.is_tentative for e in self.ledger.pods.values()))
    @rule()
    def extender_restarted(self):
        rebuilt = common.rebuilt(self.ledger, self.api_nodes, self.api_pods.values(), at=self.at)
        old = {u: (e.node, e.held) for u, e in self.ledger.pods.items()}
        assert set(rebuilt.pods) == set(old)
        for uid, entry in rebuilt.pods.items():
            node, held = old[uid]
            # The permits are durable here, so a VM found bound holds what it held before, and
            # until its agent reports it may run up to its maximum: that much is kept out of
            # the node's free room.
            assert (entry.node, entry.held) == (node, held)
            if entry.vm is not None:
                top = entry.vm.top_vcpus * 1000
                assert entry.held.cpu_millis + entry.uncertain.cpu_millis >= top
        # Every agent reports (steady, with its last permit): the same ledger as before.
        for uid, entry in list(rebuilt.pods.items()):
            if entry.vm is None:
                continue
            current = self.current.get(uid, entry.vm.min_vcpus)
            last = self.ledger.pods[uid].vcpus
            d = decide(
                rebuilt,
                ResourceRequest(
                    pod=PodRef(namespace="ns", name=uid, uid=uid),
                    node=entry.node,
                    current=Resources(vcpus=current, memory_bytes=GI),
                    requested=Resources(vcpus=current, memory_bytes=GI),
                    last_permit=Resources(vcpus=last, memory_bytes=GI) if last else None,
                ),
            )
            assert d.refused is None
        assert {u: (e.node, e.held) for u, e in rebuilt.pods.items()} == old
        for name, state in self.ledger.nodes.items():
            assert rebuilt.nodes[name].allocated == state.allocated
            assert rebuilt.nodes[name].uncertain_total == Demand(0, 0)
        self.ledger = rebuilt
        self.index = FitIndex(rebuilt)
        self.scores = ScoreIndex(self.ledger)
        self.answers.clear()  # a new index: the extender's answer cache is new too
        self.score_answers.clear()

    @precondition(lambda self: not any(e.is_tentative for e in self.ledger.pods.values()))
    @rule()
    def extender_restarted_agents_silent(self):
        """A restart the agents have not answered yet: every VM found bound is unverified,
        its room up to its maximum kept out of ``free``, until its agent's next request
        settles it (``agent_asked``): the index must follow that room coming back."""
        rebuilt = common.rebuilt(self.ledger, self.api_nodes, self.api_pods.values(), at=self.at)
        assert {u: e.held for u, e in rebuilt.pods.items()} == {
            u: e.held for u, e in self.ledger.pods.items()
        }
        self.ledger = rebuilt
        self.index = FitIndex(rebuilt)
        self.scores = ScoreIndex(self.ledger)
        self.answers.clear()
        self.score_answers.clear()

    @rule(data=st.data())
    def everything_deleted(self, data):
        # rare: otherwise histories never grow long enough to fill nodes
        if data.draw(st.integers(0, 9)) != 0:
            return
        common.forget_everything(self.ledger, self.api_pods)
        self.current.clear()
        assert all(s.is_known for s in self.ledger.nodes.values())

    @invariant()
    def ledger_is_consistent(self):
        self.ledger.check_invariants()

    @invariant()
    def fit_index_matches_a_fresh_computation(self):
        """Which nodes pass, and each rejected node's words and kind, as computed afresh (the
        kind decides between FailedNodes and FailedAndUnresolvableNodes: preemption)."""
        for size in SIZES:
            result = self.index.filter(size, [*NODES, "ghost"])
            for node in [*NODES, "ghost"]:
                state = self.ledger.nodes.get(node)
                fresh = rejection(state, size) if state is not None else "unknown"
                assert (node in result.passed) == (fresh is None), (node, size, fresh)
                if state is None or not state.is_known:
                    assert result.failed.get(node) == NOT_KNOWN, (node, result)
                    continue
                words = verdict(state, size)
                if words is None:
                    continue
                where = result.unresolvable if words.is_unresolvable else result.failed
                assert where.get(node) == words.summary, (node, size, words, result)

    @invariant()
    def an_unchanged_version_means_an_unchanged_answer(self):
        for size in SIZES:
            version = self.index.version(size)
            answer = self.index.filter(size, [*NODES, "ghost"])
            seen = self.answers.get(size)
            if seen is not None and seen[0] == version:
                assert seen[1] == answer, (size, version, seen[1], answer)
            self.answers[size] = (version, answer)

    @invariant()
    def score_index_matches_a_fresh_computation(self):
        """Prioritize's kept scores are what scoring every node afresh gives, and while the
        index's version for a key stands still, so do they (the shell reuses its encoded
        answer then)."""
        names = [*NODES, "ghost"]
        for size in SIZES:
            for growth in (0, 3000):
                for strategy in Strategy:
                    version = self.scores.version(size, growth_millis=growth, strategy=strategy)
                    kept = self.scores.scores(names, size, growth_millis=growth, strategy=strategy)
                    fresh = score_nodes(
                        self.ledger, names, size, growth_millis=growth, strategy=strategy
                    )
                    assert kept == fresh, (size, growth, strategy)
                    key = (size, growth, strategy)
                    seen = self.score_answers.get(key)
                    if seen is not None and seen[0] == version:
                        assert seen[1] == kept, (key, version, seen[1], kept)
                    self.score_answers[key] = (version, kept)


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
