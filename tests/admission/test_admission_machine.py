"""The admission queue's promises over random histories (hypothesis state machine).

Rules are what happens in a cluster: VM pods are created (and listed before any filter),
filtered, bound (or their Binding fails), grown and shrunk by their agents (the grant clamped by
``quota_room``), deleted; quotas are reloaded, lowered below usage or removed; time passes and
admissions expire. After every step:

* usage is what the ledger and the reservations say (``check_invariants``), and
* *quota safety*: a namespace's usage never rises above ``quota + borrowing_limit``, nor a
  cohort's above the sum of its quotas; when a quota is lowered below usage, usage may stay
  there (nothing is evicted) but never grows;
* *order*: a pod admitted in this step has no waiting pod ahead of it in its namespace
  (StrictFIFO), or only ones that do not fit (BestEffortFIFO);

and after every ``recheck`` *nothing waits that fits*.
"""

import math

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from scheduler_extender.admission.queue import admit, quota_room, recheck
from scheduler_extender.admission.quota import QueueingStrategy, covers, minus, parse_quota_config
from scheduler_extender.core.ledger import LedgerError, Owner
from scheduler_extender.core.podinfo import ZERO, Demand

from .helpers import GI, T0, cluster, grow, place, vm

NAMESPACES = ["ns-a", "ns-b", "ns-c"]
INF = Demand(math.inf, math.inf)  # type: ignore[arg-type]


@st.composite
def quota_configs(draw):
    namespaces = {}
    for name in NAMESPACES:
        if draw(st.integers(0, 4)) == 0:
            continue  # unlimited
        spec = {
            "vcpus": draw(st.integers(0, 6)),
            "memory_bytes": draw(st.integers(0, 6)) * GI,
            "queueing_strategy": draw(st.sampled_from(["BestEffortFIFO", "StrictFIFO"])),
        }
        if draw(st.booleans()):
            spec["cohort"] = "c"
            if draw(st.booleans()):
                spec["borrowing_limit"] = {
                    "vcpus": draw(st.integers(0, 3)),
                    "memory_bytes": draw(st.integers(0, 3)) * GI,
                }
        namespaces[name] = spec
    return parse_quota_config({"admission_ttl_seconds": 30, "namespaces": namespaces})


def queue_key(waiter):
    """The documented order, computed here rather than trusted from ``Waiter.order``."""
    w = waiter
    return (-w.priority, w.requeues, w.created == "", w.created, w.name, w.uid)


class AdmissionMachine(RuleBasedStateMachine):
    @initialize(config=st.one_of(quota_configs(), quota_configs(), st.none()))
    def start(self, config):
        self.ledger, self.state = cluster(config, nodes=2, cpu=8000, mem=16 * GI)
        self.pods = {}  # uid -> PodInfo as the API server has it
        self.vcpus = {}  # uid -> vCPUs the VM runs with (agents are honest)
        self.counter = 0  # the creation clock, in seconds
        self.created = 0  # pods ever created: names (and so uids) are never reused
        self.now = T0
        self.settled = False
        self._snapshot()

    # -- oracle: usage and room computed from scratch, not from the state's counters ---------

    def usage(self, namespace):
        total = ZERO
        for entry in self.ledger.pods.values():
            if entry.owner is Owner.OWN and entry.namespace == namespace:
                total = total + entry.held
        for reservation in self.state.reserved_in(namespace):
            total = total + reservation.waiter.demand
        return total

    def caps(self):
        """(namespaces, cap) pairs: each quota'd namespace, and each cohort as a whole."""
        quotas = self.state.quotas
        if quotas is None:
            return []
        out = []
        cohort = ZERO
        members = []
        for name, q in quotas.namespaces.items():
            if q.cohort is None:
                out.append(((name,), q.nominal))
                continue
            members.append(name)
            cohort = cohort + q.nominal
            limit = q.borrowing_limit
            out.append(((name,), INF if limit is None else q.nominal + limit.demand()))
        if members:
            out.append((tuple(members), cohort))
        return out

    def room(self, namespace):
        """None: unlimited."""
        rooms = [
            minus(cap, self._sum(names))
            for names, cap in self.caps()
            if namespace in names and cap is not INF
        ]
        if self.state.quotas is None or namespace not in self.state.quotas.namespaces:
            return None
        room = INF
        for r in rooms:
            room = Demand(
                min(room.cpu_millis, r.cpu_millis), min(room.memory_bytes, r.memory_bytes)
            )
        return room

    def _sum(self, names):
        total = ZERO
        for name in names:
            total = total + self.usage(name)
        return total

    def _snapshot(self):
        self.before = {names: self._sum(names) for names, _ in self.caps()}
        self.reserved_before = {
            r.waiter.uid for ns in NAMESPACES for r in self.state.reserved_in(ns)
        }

    # -- helpers --------------------------------------------------------------------------

    def _pick(self, data, *, bound):
        uids = sorted(u for u, p in self.pods.items() if (p.node_name is not None) == bound)
        return self.pods[data.draw(st.sampled_from(uids))] if uids else None

    # -- rules ----------------------------------------------------------------------------

    @rule(
        ns=st.sampled_from(NAMESPACES),
        vcpus=st.integers(1, 3),
        priority=st.integers(0, 2),
        same_second=st.booleans(),
        listed=st.booleans(),
    )
    def pod_created(self, ns, vcpus, priority, same_second, listed):
        self.counter += 0 if same_second else 1
        self.created += 1
        pod = vm(
            f"p{self.created}",
            ns=ns,
            vcpus=vcpus,
            hi=6,
            priority=priority,
            created=f"2024-05-01T10:{self.counter // 60:02d}:{self.counter % 60:02d}Z",
        )
        self.pods[pod.uid] = pod
        if listed:
            self.state.observe_pending(pod)

    @rule(data=st.data())
    def filtered(self, data):
        pod = self._pick(data, bound=False)
        if pod is not None:
            admit(self.state, pod, now=self.now)

    @rule(data=st.data(), node=st.sampled_from(["n1", "n2"]), fails=st.booleans())
    def bound(self, data, node, fails):
        pod = self._pick(data, bound=False)
        if pod is None or not admit(self.state, pod, now=self.now).is_admitted:
            return  # the commit point re-checks admission
        if fails:
            try:
                self.ledger.reserve_for_bind(pod, node, at=0.0)
            except LedgerError:
                return
            self.ledger.cancel_bind(pod.uid)
            return
        try:
            self.pods[pod.uid] = place(self.ledger, pod, node)
        except LedgerError:
            return
        self.vcpus[pod.uid] = pod.vm.min_vcpus

    @rule(data=st.data(), want=st.integers(1, 6))
    def agent_asked(self, data, want):
        pod = self._pick(data, bound=True)
        if pod is None:
            return
        current = self.vcpus[pod.uid]
        want = max(want, pod.vm.min_vcpus)
        permit = grow(self.state, self.ledger, pod, current=current, requested=want).permit
        assert permit.error is None, permit.error
        if want > current:
            assert current <= permit.permit.vcpus <= want
        self.vcpus[pod.uid] = min(want, permit.permit.vcpus) if want > current else want

    @rule(data=st.data(), bound=st.booleans())
    def deleted(self, data, bound):
        pod = self._pick(data, bound=bound)
        if pod is None:
            return
        del self.pods[pod.uid]
        self.vcpus.pop(pod.uid, None)
        self.ledger.forget_pod(pod.uid)
        self.state.forget(pod.uid)

    @rule(config=quota_configs())
    def quotas_reloaded(self, config):
        self.state.set_quotas(config, now=self.now)
        self.settled = True

    @rule(seconds=st.sampled_from([1.0, 10.0, 31.0]))
    def time_passed(self, seconds):
        self.now += seconds

    @rule()
    def rechecked(self):
        recheck(self.state, now=self.now)
        self.settled = True

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def after_every_step(self):
        # One invariant calling the checks in order: the last one takes the snapshot the next
        # step is compared with, so they must not run in hypothesis' own order.
        self.consistent()
        self.quota_is_never_exceeded_by_our_decisions()
        self.order_is_respected()
        self.nothing_waits_that_fits()
        self.settled = False
        self._snapshot()

    def consistent(self):
        self.state.check_invariants()
        for ns in NAMESPACES:
            assert self.state.usage(ns) == self.usage(ns)
            room, expected = quota_room(self.state, ns), self.room(ns)
            if self.state.quotas is None:
                assert room == ZERO
            elif expected is None:
                assert room is None
            else:
                assert room == Demand(max(0, expected.cpu_millis), max(0, expected.memory_bytes))

    def quota_is_never_exceeded_by_our_decisions(self):
        for names, cap in self.caps():
            after = self._sum(names)
            before = self.before.get(names, after)
            for resource in ("cpu_millis", "memory_bytes"):
                a, b, c = (
                    getattr(after, resource),
                    getattr(before, resource),
                    getattr(cap, resource),
                )
                assert a <= c or a <= b, f"{names} {resource}: {b} -> {a}, limit {c}"

    def order_is_respected(self):
        quotas = self.state.quotas
        for ns in NAMESPACES:
            quota = None if quotas is None else quotas.namespaces.get(ns)
            waiting = self.state.waiting_in_order(ns)
            new = [
                r for r in self.state.reserved_in(ns) if r.waiter.uid not in self.reserved_before
            ]
            for reservation in new:
                ahead = [w for w in waiting if queue_key(w) < queue_key(reservation.waiter)]
                if quota is not None and quota.queueing_strategy is QueueingStrategy.STRICT_FIFO:
                    assert not ahead, f"{reservation.waiter.name} passed {ahead[0].name}"
                room = self.room(ns)
                for w in ahead:
                    assert room is not None and not covers(room, w.demand), w.name

    def nothing_waits_that_fits(self):
        if self.settled and self.state.quotas is not None:
            for ns in NAMESPACES:
                waiting = sorted(self.state.waiting_in_order(ns), key=queue_key)
                room = self.room(ns)
                if room is None:
                    assert not waiting, f"{ns} is unlimited but {waiting[0].name} waits"
                    continue
                quota = self.state.quotas.namespaces[ns]
                if quota.queueing_strategy is QueueingStrategy.STRICT_FIFO:
                    waiting = waiting[:1]
                for w in waiting:
                    assert not covers(room, w.demand), f"{w.name} fits {room} but waits"


AdmissionMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_admission_machine = AdmissionMachine.TestCase
