"""The pure tracker behind auto-publish: scenarios with an explicit clock."""

from __future__ import annotations

import pytest

from scheduler_extender.recommender.capacity_waits import CapacityWaits, Overdue, WaitKind

T0 = 1000.0


def test_a_refused_pod_is_overdue_only_after_the_threshold_from_its_first_refusal():
    waits = CapacityWaits()
    waits.filter_answered("u1", "ns/a", has_room=False, now=T0)
    waits.filter_answered("u1", "ns/a", has_room=False, now=T0 + 50)  # a retry: same wait
    assert waits.overdue(now=T0 + 60, threshold_seconds=60) is None
    assert waits.overdue(now=T0 + 61, threshold_seconds=60) == Overdue(
        kind=WaitKind.PENDING, uid="u1", subject="ns/a", waited_seconds=61.0, count=1
    )


def test_room_found_ends_the_wait():
    waits = CapacityWaits()
    waits.filter_answered("u1", "ns/a", has_room=False, now=T0)
    waits.filter_answered("u1", "ns/a", has_room=True, now=T0 + 10)
    assert waits.overdue(now=T0 + 100, threshold_seconds=60) is None


@pytest.mark.parametrize(
    ("is_short_again", "overdue"),
    [(True, True), (False, False)],
    ids=["still-denied", "granted-ends-it"],
)
def test_denied_agents_wait_until_a_full_grant(is_short_again, overdue):
    waits = CapacityWaits()
    waits.permit_answered("u2", "vms/vm", is_short=True, now=T0)
    waits.permit_answered("u2", "vms/vm", is_short=is_short_again, now=T0 + 5)
    found = waits.overdue(now=T0 + 61, threshold_seconds=60)
    assert (found is not None) is overdue
    if found is not None:
        assert found.kind is WaitKind.DENIED
        assert found.reason == "the agent was denied capacity for VM pod vms/vm for 61s"


def test_the_longest_wait_is_reported_with_how_many_others_wait():
    waits = CapacityWaits()
    waits.filter_answered("u1", "ns/b", has_room=False, now=T0 + 1)
    waits.filter_answered("u2", "ns/a", has_room=False, now=T0)
    waits.permit_answered("u3", "vms/vm", is_short=True, now=T0 + 30)
    found = waits.overdue(now=T0 + 100, threshold_seconds=60)
    assert found is not None
    assert (found.subject, found.count) == ("ns/a", 3)
    assert (
        found.reason == "filter found no node with room for pod ns/a for 100s (2 more waiting too)"
    )


def test_retain_drops_bound_pods_and_gone_vms():
    waits = CapacityWaits()
    waits.filter_answered("bound", "ns/a", has_room=False, now=T0)
    waits.filter_answered("pending", "ns/b", has_room=False, now=T0)
    waits.permit_answered("gone", "vms/x", is_short=True, now=T0)
    waits.permit_answered("running", "vms/y", is_short=True, now=T0)
    waits.retain(pending={"pending"}, running={"running", "bound"})
    assert set(waits.waits) == {"pending", "running"}
