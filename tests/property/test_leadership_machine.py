"""Two extenders, one Lease, two ledgers: never two deciders, never an over-committed node.

A hypothesis state machine over everything that can interleave: each replica's elector with
its own monotonic clock (offset anywhere, rate within the drift the elector tolerates), the
API server's Lease (writes under a ``resourceVersion`` precondition), requests that are sent,
applied and answered separately or lost (before or after the API server applied them), and
kube-scheduler's Lease moving between the replicas (``candidacy``); a replica may crash and
come back as a new incarnation. Beside the Lease, each replica keeps a warm ledger of one node
whose VMs' agents ask whichever replica the Service hands them, one request per VM in flight,
and apply an answer only if it arrives (they may abandon it).

Invariants: at no real time do both replicas decide (``is_leading``), and the VMs' real sizes
never exceed the node, whichever replica granted them and however late its answer arrived.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from protocol import annotations as ann
from protocol.permits import PodRef, ResourceRequest, Resources
from scheduler_extender.core.leadership import Elector, LeaseRecord, Write
from scheduler_extender.core.ledger import Ledger
from scheduler_extender.core.permits import decide
from scheduler_extender.core.podinfo import Demand, PodInfo

GI = 2**30
DURATION = 6.0
RENEW = 2.0
RETRY = 1.0
DRIFT = 0.05
NODE = "n1"
USABLE_VCPUS = 8
VMS = ("a", "b", "c")
MAX_VCPUS = 4


def vm_pod(uid: str, *, permitted: int | None) -> PodInfo:
    spec = ann.VmSpec(
        min_vcpus=1, max_vcpus=MAX_VCPUS, scaling_unit=1, min_memory_bytes=GI, max_memory_bytes=GI
    )
    return PodInfo(
        uid=uid,
        namespace="ns",
        name=uid,
        node_name=NODE,
        scheduler_name="vm-scheduler",
        requests=Demand(1000, GI),
        priority=0,
        is_ours=True,
        is_vm=True,
        is_static=False,
        is_terminated=False,
        vm=spec,
        permitted_vcpus=permitted,
        permitted_memory_bytes=GI if permitted is not None else None,
    )


@dataclass
class InFlight:
    """One Lease request between a replica and the API server."""

    write: Write | None  # None: a read
    sent_at: float  # the sender's local time
    applied: bool = False
    answer: LeaseRecord | None = None
    conflicted: bool = False


@dataclass
class Replica:
    elector: Elector
    ledger: Ledger
    offset: float
    rate: float
    request: InFlight | None = None
    incarnation: int = 0


@dataclass
class Ask:
    """An agent's request in flight, and the answer it will apply if it arrives."""

    requested: int
    granted: int | None  # None: refused (not the leader)


class LeadershipMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.t = 0.0
        self.lease: LeaseRecord | None = None
        self.versions = 0
        self.replicas: list[Replica] = []
        self.truth = dict.fromkeys(VMS, 1)  # vCPUs each VM really runs with
        self.last_permit: dict[str, int | None] = dict.fromkeys(VMS)
        self.annotations: dict[str, int | None] = dict.fromkeys(VMS)
        self.asks: dict[str, Ask] = {}
        # The last grant's durable write, not yet on the pod: (vm, vCPUs).
        self.pending_annotation: tuple[str, int | None] | None = None

    @initialize(
        offsets=st.tuples(st.floats(0, 1000), st.floats(0, 1000)),
        rates=st.tuples(
            st.floats(1 / (1 + DRIFT), 1 + DRIFT), st.floats(1 / (1 + DRIFT), 1 + DRIFT)
        ),
        candidates=st.tuples(st.booleans(), st.booleans()),
    )
    def start(self, offsets, rates, candidates):
        for i in range(2):
            r = Replica(self._elector(i, 0), self._ledger(), offset=offsets[i], rate=rates[i])
            r.elector.candidacy_changed(self._now(r), is_candidate=candidates[i])
            self.replicas.append(r)

    def _elector(self, i: int, incarnation: int) -> Elector:
        return Elector(
            f"r{i}-{incarnation}",
            duration_seconds=DURATION,
            renew_seconds=RENEW,
            retry_seconds=RETRY,
            drift=DRIFT,
        )

    def _ledger(self) -> Ledger:
        """A warm ledger: the node and its VMs as the API server shows them now."""
        ledger = Ledger()
        ledger.replace_nodes([(NODE, Demand(USABLE_VCPUS * 1000, 64 * GI), {})])
        ledger.replace_pods(
            [vm_pod(uid, permitted=self.annotations[uid]) for uid in VMS], at=self.t
        )
        return ledger

    def _now(self, r: Replica) -> float:
        return r.offset + r.rate * self.t

    # -- time and kube-scheduler's Lease ----------------------------------------------------

    @rule(dt=st.floats(0.01, 8.0))
    def time_passes(self, dt):
        self.t += dt

    @rule(i=st.integers(0, 1), is_candidate=st.booleans())
    def candidacy(self, i, is_candidate):
        r = self.replicas[i]
        r.elector.candidacy_changed(self._now(r), is_candidate=is_candidate)

    @rule(i=st.integers(0, 1))
    def crashed_and_restarted(self, i):
        r = self.replicas[i]
        r.incarnation += 1
        r.elector = self._elector(i, r.incarnation)
        r.ledger = self._ledger()  # the restart path: a fresh list
        # Its last request may still reach the API server (and its answer nobody).
        if r.request is not None and not r.request.applied:
            self._apply(r.request)
        r.request = None

    # -- the Lease's requests ---------------------------------------------------------------

    @rule(i=st.integers(0, 1))
    def elector_acts(self, i):
        r = self.replicas[i]
        if r.request is not None:
            return
        now = self._now(r)
        step = r.elector.step(now)
        if step.read or step.write is not None:
            r.request = InFlight(write=step.write, sent_at=now)

    def _apply(self, req: InFlight) -> None:
        req.applied = True
        if req.write is None:
            req.answer = self.lease
            return
        current = self.lease.version if self.lease is not None else ""
        if req.write.version != current:
            req.conflicted = True
            return
        self.versions += 1
        self.lease = msgspec.structs.replace(req.write.record, version=str(self.versions))
        req.answer = self.lease

    @rule(i=st.integers(0, 1))
    def api_server_applies(self, i):
        req = self.replicas[i].request
        if req is not None and not req.applied:
            self._apply(req)

    @rule(i=st.integers(0, 1))
    def answer_arrives(self, i):
        r = self.replicas[i]
        req = r.request
        if req is None or not req.applied:
            return
        r.request = None
        now = self._now(r)
        was_leading = r.elector.is_leading(now)
        if req.write is None:
            r.elector.read(now, req.answer)
        elif req.conflicted:
            r.elector.write_conflicted(now)
        else:
            assert req.answer is not None
            r.elector.wrote(req.sent_at, req.answer)
        if r.elector.is_leading(now) and not was_leading:
            r.ledger.forget_agents()  # what the shell does on every gain

    @rule(i=st.integers(0, 1))
    def round_trip(self, i):
        """The common case in one step: act, applied at once, answered at once, and again
        until the elector waits (the shell's loop does not sleep between a read and the write
        it leads to)."""
        for _ in range(3):
            if self.replicas[i].request is not None:
                return
            self.elector_acts(i)
            if self.replicas[i].request is None:
                return
            self.api_server_applies(i)
            self.answer_arrives(i)

    @rule(dt=st.floats(0.1, 3.0), rounds=st.integers(1, 4))
    def both_keep_going(self, dt, rounds):
        """A stretch of quiet progress: each replica's loop runs, time passes."""
        for _ in range(rounds):
            self.round_trip(0)
            self.round_trip(1)
            self.time_passes(dt)

    @rule(i=st.integers(0, 1), dt=st.floats(0.5, 3.0), rounds=st.integers(2, 8))
    def scheduler_moves_to(self, i, dt, rounds):
        """kube-scheduler's Lease moves to replica ``i``: the other resigns, ``i`` stands."""
        self.candidacy(1 - i, False)
        self.candidacy(i, True)
        self.both_keep_going(dt, rounds)

    @rule(i=st.integers(0, 1), dt=st.floats(0.1, 2.0), rounds=st.integers(1, 8))
    def partitioned(self, i, dt, rounds):
        """Replica ``i`` cannot reach the API server (its requests never arrive) while the
        other goes on, and both keep answering agents."""
        other = 1 - i
        for _ in range(rounds):
            self.elector_acts(i)
            self.answer_lost(i)
            self.round_trip(other)
            self.time_passes(dt)
            self.at_most_one_decides()

    @rule(i=st.integers(0, 1))
    def answer_lost(self, i):
        r = self.replicas[i]
        if r.request is not None:
            r.request = None
            r.elector.failed(self._now(r))

    # -- the agents -------------------------------------------------------------------------

    @rule(vm=st.sampled_from(VMS), want=st.integers(1, MAX_VCPUS), i=st.integers(0, 1))
    def agent_asks(self, vm, want, i):
        if vm in self.asks:
            return  # one request per VM in flight: it reports only after the last answer
        r = self.replicas[i]
        if not r.elector.is_leading(self._now(r)):
            self.asks[vm] = Ask(requested=want, granted=None)
            return
        last = self.last_permit[vm]
        d = decide(
            r.ledger,
            ResourceRequest(
                pod=PodRef(namespace="ns", name=vm, uid=vm),
                node=NODE,
                current=Resources(vcpus=self.truth[vm], memory_bytes=GI),
                requested=Resources(vcpus=want, memory_bytes=GI),
                last_permit=Resources(vcpus=last, memory_bytes=GI) if last else None,
            ),
        )
        assert d.permit.permit is not None, d.permit.error
        self.asks[vm] = Ask(requested=want, granted=d.permit.permit.vcpus)
        # The durable write lands some time later (or never): ``annotation_written``.
        self.pending_annotation = (vm, r.ledger.pods[vm].vcpus)

    @rule(
        i=st.integers(0, 1),
        order=st.permutations(VMS),
        wants=st.lists(st.integers(1, MAX_VCPUS), min_size=len(VMS), max_size=len(VMS)),
    )
    def agents_ask_in_turn(self, i, order, wants):
        """Every agent asks replica ``i`` once and applies the answer, one after another."""
        for vm, want in zip(order, wants, strict=True):
            self.agent_asks(vm, want, i)
            self.agent_receives(vm)

    @rule(vm=st.sampled_from(VMS))
    def agent_receives(self, vm):
        ask = self.asks.pop(vm, None)
        if ask is None or ask.granted is None:
            return
        current = self.truth[vm]
        self.truth[vm] = ask.requested if ask.requested < current else ask.granted
        self.last_permit[vm] = ask.granted

    @rule(vm=st.sampled_from(VMS))
    def agent_gives_up(self, vm):
        self.asks.pop(vm, None)

    @rule()
    def annotation_written(self):
        pending = self.pending_annotation
        if pending is None:
            return
        vm, vcpus = pending
        self.pending_annotation = None
        self.annotations[vm] = vcpus
        for r in self.replicas:  # both watches see the pod change
            r.ledger.observe_pod(vm_pod(vm, permitted=vcpus), at=self.t)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def at_most_one_decides(self):
        leading = [r for r in self.replicas if r.elector.is_leading(self._now(r))]
        assert len(leading) <= 1, [r.elector.identity for r in leading]

    @invariant()
    def the_node_is_never_over_committed(self):
        assert sum(self.truth.values()) <= USABLE_VCPUS, self.truth

    @invariant()
    def ledgers_are_consistent(self):
        for r in self.replicas:
            r.ledger.check_invariants()


LeadershipMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLeadership = LeadershipMachine.TestCase


def test_a_replica_that_leads_again_forgets_what_its_agents_said():
    """The history the machine must survive, written out: x leads and hears every agent; y
    leads and grows two VMs; x leads again. Without ``forget_agents`` x would still believe
    its old sizes and grow a VM into room y already gave away."""
    m = LeadershipMachine()
    m.start(offsets=(0.0, 0.0), rates=(1.0, 1.0), candidates=(True, False))
    m.both_keep_going(dt=1.0, rounds=3)
    x, y = m.replicas
    assert x.elector.is_leading(m._now(x))
    m.agents_ask_in_turn(0, order=VMS, wants=[1, 1, 1])
    m.scheduler_moves_to(1, dt=1.0, rounds=4)
    assert y.elector.is_leading(m._now(y))
    m.agents_ask_in_turn(1, order=VMS, wants=[1, 4, 4])
    assert m.truth["c"] == 4  # y grew it, and x never heard
    m.scheduler_moves_to(0, dt=1.0, rounds=4)
    assert x.elector.is_leading(m._now(x))
    m.agents_ask_in_turn(0, order=VMS, wants=[4, 4, 4])
    m.the_node_is_never_over_committed()
    m.at_most_one_decides()
