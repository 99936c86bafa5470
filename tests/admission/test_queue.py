"""Scenario tests of the admission queue: each steps through events and asserts whole decisions."""

import msgspec
import pytest

from scheduler_extender.admission.queue import (
    AdmissionDecision,
    AdmissionStatus,
    PodKey,
    PodState,
    admit,
    pod_state,
    quota_room,
    recheck,
    user_state,
)
from scheduler_extender.admission.quota import QuotaConfig
from scheduler_extender.core.podinfo import Demand

from .helpers import GI, T0, cluster, delete, grow, place, quotas, vm, vmspec

ADMITTED = AdmissionStatus.ADMITTED
WAITING = AdmissionStatus.WAITING


def key(pod):
    return PodKey(namespace=pod.namespace, name=pod.name, uid=pod.uid)


def test_waiting_vm_is_admitted_as_soon_as_another_vm_in_its_namespace_is_deleted():
    ledger, state = cluster(quotas(team_a={"vcpus": 4}))
    a, b = vm("a", vcpus=3, created="2024-05-01T10:00:00Z"), vm("b", vcpus=2)
    assert admit(state, a, now=T0).is_admitted
    bound_a = place(ledger, a)
    assert admit(state, b, now=T0 + 1) == AdmissionDecision(
        WAITING,
        "waiting for quota in namespace team-a (position 1): needs 2000m cpu, 1000m left"
        " of its quota",
    )
    assert recheck(state, now=T0 + 2) == []  # nothing changed: nobody to nudge

    delete(ledger, state, bound_a)

    assert recheck(state, now=T0 + 3) == [key(b)]
    assert admit(state, b, now=T0 + 4).is_admitted
    assert state.usage("team-a") == Demand(2000, GI)


def test_an_upscale_counts_against_quota_and_a_shrink_lets_the_queue_in():
    ledger, state = cluster(quotas(team_a={"vcpus": 4}))
    a, b = vm("a", vcpus=1), vm("b", vcpus=2)
    admit(state, a, now=T0)
    place(ledger, a)
    assert grow(state, ledger, a, current=1, requested=3).permit.permit.vcpus == 3
    assert admit(state, b, now=T0).status is WAITING  # 3 used, 1 left: vCPUs granted count
    assert grow(state, ledger, a, current=3, requested=2).permit.permit.vcpus == 2  # shrank
    assert recheck(state, now=T0 + 1) == [key(b)]


def test_upscale_is_clamped_by_the_quota_then_denied_never_queued():
    ledger, state = cluster(quotas(team_a={"vcpus": 4}))
    a = vm("a", vcpus=1)
    admit(state, a, now=T0)
    place(ledger, a)
    partial = grow(state, ledger, a, current=1, requested=8).permit
    assert (partial.status.value, partial.permit.vcpus) == ("partial", 4)
    assert "namespace team-a" in partial.reason
    assert quota_room(state, "team-a") == Demand(0, 63 * GI)
    denied = grow(state, ledger, a, current=4, requested=5).permit
    assert (denied.status.value, denied.permit.vcpus) == ("denied", 4)


def test_best_effort_fifo_lets_a_smaller_pod_past_one_that_does_not_fit():
    ledger, state = cluster(quotas(team_a={"vcpus": 4}))
    running = vm("running", vcpus=2)
    admit(state, running, now=T0)
    place(ledger, running)
    big = vm("big", vcpus=4, created="2024-05-01T10:00:01Z")
    small = vm("small", vcpus=1, created="2024-05-01T10:00:02Z")
    state.observe_pending(big)
    state.observe_pending(small)
    assert recheck(state, now=T0) == []  # first pass: nothing had been told to wait
    assert admit(state, small, now=T0).is_admitted
    assert admit(state, big, now=T0).status is WAITING


def test_strict_fifo_head_blocks_the_rest():
    ledger, state = cluster(quotas(team_a={"vcpus": 4, "queueing_strategy": "StrictFIFO"}))
    running = vm("running", vcpus=2)
    admit(state, running, now=T0)
    bound = place(ledger, running)
    big = vm("big", vcpus=4, created="2024-05-01T10:00:01Z")
    small = vm("small", vcpus=1, created="2024-05-01T10:00:02Z")
    assert admit(state, big, now=T0).status is WAITING
    assert admit(state, small, now=T0) == AdmissionDecision(
        WAITING,
        "waiting for quota in namespace team-a (position 2): behind the head of its"
        " namespace's queue (StrictFIFO)",
    )
    delete(ledger, state, bound)
    assert recheck(state, now=T0 + 1) == [key(big)]  # the head first; small still waits
    assert admit(state, small, now=T0 + 1).status is WAITING


def test_queue_order_is_priority_then_creation_then_name():
    _ledger, state = cluster(quotas(team_a={"vcpus": 0}))
    pods = [
        vm("c-old-low", priority=0, created="2024-05-01T09:00:00Z"),
        vm("b-new-high", priority=10, created="2024-05-01T11:00:00Z"),
        vm("a-old-high", priority=10, created="2024-05-01T10:00:00Z"),
        vm("z-same", priority=0, created="2024-05-01T09:00:00Z"),
        vm("no-timestamp", priority=0, created=""),
    ]
    for pod in pods:
        state.observe_pending(pod)
    assert [w.name for w in state.waiting_in_order("team-a")] == [
        "a-old-high",
        "b-new-high",
        "c-old-low",
        "z-same",
        "no-timestamp",
    ]
    state.set_quotas(quotas(team_a={"vcpus": 2}), now=T0)
    assert {w.name for w in state.waiting_in_order("team-a")} == {
        "c-old-low",
        "z-same",
        "no-timestamp",
    }


def test_cohort_borrowing_up_to_the_limit_and_no_preemption_to_take_it_back():
    config = quotas(
        team_a={
            "vcpus": 4,
            "cohort": "research",
            "borrowing_limit": {"vcpus": 2, "memory_bytes": 0},
        },
        team_b={"vcpus": 4, "cohort": "research"},
    )
    ledger, state = cluster(config)
    a1 = vm("a1", vcpus=4)
    a2 = vm("a2", vcpus=2)  # borrowed from team-b's unused 4
    a3 = vm("a3", vcpus=1, created="2024-05-01T10:00:05Z")  # beyond the borrowing limit
    for pod in (a1, a2):
        assert admit(state, pod, now=T0).is_admitted
        place(ledger, pod)
    assert admit(state, a3, now=T0).reason == (
        "waiting for quota in namespace team-a (position 1): needs 1000m cpu, 0m left of its quota"
    )
    view = state.usage("team-a"), quota_room(state, "team-a"), quota_room(state, "team-b")
    assert view == (Demand(6000, 2 * GI), Demand(0, 62 * GI), Demand(2000, 126 * GI))
    # team-b wants its own quota back: no preemption, so it waits for the borrower to shrink.
    b1 = vm("b1", ns="team-b", vcpus=4, created="2024-05-01T10:00:01Z")
    assert admit(state, b1, now=T0).reason == (
        "waiting for quota in namespace team-b (position 1): needs 4000m cpu, 2000m left"
        " in cohort research"
    )
    delete(ledger, state, a2)
    # One pass over the cohort in one order: b1 is older than a3, so the freed room is its.
    assert recheck(state, now=T0 + 1) == [key(b1)]
    assert admit(state, a3, now=T0 + 1).reason == (
        "waiting for quota in namespace team-a (position 1): needs 1000m cpu, 0m left"
        " in cohort research"
    )


def test_pods_queued_before_the_quota_configuration_existed_are_admitted_in_order_once_it_loads():
    _ledger, state = cluster(None)
    old = vm("old", vcpus=2, created="2024-05-01T09:00:00Z")
    new = vm("new", vcpus=2, created="2024-05-01T10:00:00Z")
    other = vm("web", ns="unlimited", vcpus=30)
    # The pod list arrives newest first: the order must come from the queue, not the list.
    for pod in (new, other, old):
        state.observe_pending(pod)
    assert admit(state, new, now=T0) == AdmissionDecision(
        WAITING,
        "waiting for the quota configuration to load, in namespace team-a (position 2)",
    )
    assert quota_room(state, "team-a") == Demand(0, 0)  # no upscale before the quota is known

    nudged = state.set_quotas(quotas(team_a={"vcpus": 2}), now=T0 + 1)

    # new had been told to wait, but old is older and takes the room; old itself had never
    # been told anything, so nobody needs a nudge.
    assert nudged == []
    assert admit(state, old, now=T0 + 1).is_admitted
    assert admit(state, other, now=T0 + 1).is_admitted  # no quota listed: unlimited
    assert admit(state, new, now=T0 + 1).status is WAITING


def test_removing_a_quota_admits_its_waiting_pods_at_once():
    _ledger, state = cluster(quotas(team_a={"vcpus": 1}, team_b={"vcpus": 1}))
    pods = [vm(f"p{i}", vcpus=1, created=f"2024-05-01T10:00:0{i}Z") for i in range(3)]
    for pod in pods:
        admit(state, pod, now=T0)
    assert [admit(state, p, now=T0).status for p in pods] == [ADMITTED, WAITING, WAITING]
    assert state.set_quotas(quotas(team_b={"vcpus": 1}), now=T0 + 1) == [key(pods[1]), key(pods[2])]
    assert quota_room(state, "team-a") is None


def test_lowering_a_quota_below_usage_evicts_nothing_and_stops_growth_until_usage_falls():
    ledger, state = cluster(quotas(team_a={"vcpus": 8}))
    a, b = vm("a", vcpus=3), vm("b", vcpus=3)
    for pod in (a, b):
        admit(state, pod, now=T0)
        place(ledger, pod)
    state.set_quotas(quotas(team_a={"vcpus": 4}), now=T0)
    c = vm("c", vcpus=1)
    assert admit(state, c, now=T0).status is WAITING
    assert grow(state, ledger, a, current=3, requested=4).permit.status.value == "denied"
    assert state.usage("team-a").cpu_millis == 6000  # nothing evicted
    delete(ledger, state, a)
    assert recheck(state, now=T0 + 1) == [key(c)]  # 3 + 1 <= 4


def test_an_admission_that_is_never_bound_expires_and_goes_behind_its_peers():
    _ledger, state = cluster(quotas(ttl=60.0, team_a={"vcpus": 2}))
    stuck = vm("stuck", vcpus=2, created="2024-05-01T09:00:00Z")
    later = vm("later", vcpus=2, created="2024-05-01T10:00:00Z")
    assert admit(state, stuck, now=T0).is_admitted  # ... but no node ever takes it
    assert admit(state, later, now=T0 + 1).status is WAITING
    assert recheck(state, now=T0 + 59.9) == []

    assert recheck(state, now=T0 + 60) == [key(later)]

    decision = admit(state, stuck, now=T0 + 61)
    assert decision.status is WAITING
    assert decision.reason.startswith("waiting for quota in namespace team-a (position 1)")
    # The bind re-checks admission at its commit point: an expired admission is refused there.
    assert state.reservation(stuck.uid) is None


def test_a_bind_in_flight_holds_quota_through_the_ledger_not_twice():
    ledger, state = cluster(quotas(ttl=60.0, team_a={"vcpus": 2}))
    a = vm("a", vcpus=2)
    admit(state, a, now=T0)
    ledger.reserve_for_bind(a, "n1", at=0.0)  # tentative: the Binding is being posted
    assert state.usage("team-a") == Demand(2000, GI)
    assert recheck(state, now=T0 + 600) == []  # the ledger holds it: no TTL applies
    ledger.cancel_bind(a.uid)  # the Binding failed: the pod must be admitted again
    assert pod_state(state, a) is PodState.REQUESTED
    assert admit(state, a, now=T0 + 601).is_admitted


def test_pods_of_other_schedulers_and_finished_pods_are_not_queued():
    _ledger, state = cluster(quotas(team_a={"vcpus": 0}))
    foreign = msgspec.structs.replace(vm("f", vcpus=1), is_ours=False)
    assert admit(state, foreign, now=T0).is_admitted
    assert state.waiting_in_order("team-a") == []


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({}, PodState.REQUESTED),
        ({"is_waiting": True}, PodState.WAITING),
        ({"is_admitted": True}, PodState.ADMITTED),
        ({"is_held": True}, PodState.RUNNING),
        ({"is_held": True, "is_terminated": True}, PodState.FINISHED),
    ],
    ids=["requested", "waiting", "admitted", "running", "finished"],
)
def test_user_state(facts, expected):
    base = {"is_terminated": False, "is_held": False, "is_admitted": False, "is_waiting": False}
    assert user_state(**(base | facts)) is expected


def test_pod_state_through_a_whole_life():
    ledger, state = cluster(quotas(team_a={"vcpus": 1}))
    a, b = vm("a"), vm("b")
    assert pod_state(state, b) is PodState.REQUESTED
    admit(state, a, now=T0)
    admit(state, b, now=T0)
    assert (pod_state(state, a), pod_state(state, b)) == (PodState.ADMITTED, PodState.WAITING)
    bound = place(ledger, a)
    assert pod_state(state, bound) is PodState.RUNNING
    finished = msgspec.structs.replace(bound, is_terminated=True)
    assert pod_state(state, finished) is PodState.FINISHED


def test_no_quota_config_means_nothing_is_limited():
    _ledger, state = cluster(QuotaConfig())
    assert admit(state, vm("a", vcpus=64), now=T0).is_admitted
    assert quota_room(state, "team-a") is None


def test_a_pod_whose_demand_grew_after_admission_is_admitted_again():
    _ledger, state = cluster(quotas(team_a={"vcpus": 2}))
    small = vm("a", vcpus=1)
    assert admit(state, small, now=T0).is_admitted
    grown = msgspec.structs.replace(small, vm=vmspec(3, 8))
    assert admit(state, grown, now=T0).reason == (
        "waiting for quota in namespace team-a (position 1): needs 3000m cpu, 2000m left"
        " of its quota"
    )
    assert state.usage("team-a") == Demand(0, 0)
