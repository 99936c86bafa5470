"""Grow latency to the guest and the stuck signal (autoscaler_agent/progress.py), in fake time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler_agent.progress import Progress, ScalingProgress
from tests.agent.clock import FakeClock


def steps(progress, clock, rows):
    """Feed (seconds later, current, desired, online) rows; return each step's Progress."""
    out = []
    for later, current, desired, online in rows:
        clock.advance(later)
        out.append(progress.observe(clock.now, current=current, desired=desired, online=online))
    return out


def test_a_grow_is_timed_from_the_decision_to_the_cpus_online_in_the_guest():
    clock, p = FakeClock(), ScalingProgress(stuck_after_seconds=60)
    got = steps(
        p,
        clock,
        [
            (0, 1, 1, 1),  # settled
            (1, 1, 3, 1),  # the grow is due: the decision (t = 1001)
            (0.1, 1, 3, 1),  # permit granted, resize under way
            (2, 3, 3, 1),  # resized: the hypervisor has 3, the last scrape still says 1
            (0.9, 3, 3, 3),  # the next scrape: 3 online in the guest
            (1, 3, 3, 3),
        ],
    )
    assert [g.grow_latency_seconds for g in got] == [None, None, None, None, 3.0, None]
    assert not any(g.is_stuck or g.grow_abandoned for g in got)
    assert got[1].pending_since == 1001.0 and got[3].pending_since == 1001.0  # not online yet
    assert got[4] == Progress(grow_latency_seconds=3.0)


def test_a_grow_in_two_steps_counts_from_the_first_decision_to_the_last_size():
    # The second step (8) is wanted before the first (7) is online: one wait, 4 s.
    clock, p = FakeClock(), ScalingProgress(stuck_after_seconds=60)
    got = steps(p, clock, [(0, 1, 7, 1), (1, 7, 8, 1), (3, 8, 8, 8)])
    assert [g.grow_latency_seconds for g in got] == [None, None, 4.0]
    # A grow decided after the first was online is an episode of its own.
    clock, p = FakeClock(), ScalingProgress(stuck_after_seconds=60)
    got = steps(p, clock, [(0, 1, 7, 1), (3, 7, 7, 7), (1, 7, 8, 7), (3, 8, 8, 8)])
    assert [g.grow_latency_seconds for g in got] == [None, 3.0, None, 3.0]


def test_a_permit_denied_for_long_marks_the_vm_stuck_until_the_grow_happens():
    clock, p = FakeClock(), ScalingProgress(stuck_after_seconds=30)
    got = steps(p, clock, [(0, 2, 6, 2)] + [(5, 2, 6, 2)] * 6 + [(1, 6, 6, 2), (1, 6, 6, 6)])
    assert [g.is_stuck for g in got] == [False] * 6 + [True, True, False]
    assert got[6].pending_since == 1000.0
    # The long wait is what the user waited: it is in the latency too.
    assert got[-1].grow_latency_seconds == 32.0


def test_a_guest_that_never_onlines_the_plugged_cpus_is_stuck():
    clock, p = FakeClock(), ScalingProgress(stuck_after_seconds=10)
    got = steps(p, clock, [(0, 1, 4, 1), (1, 4, 4, 1), (9, 4, 4, 1), (5, 4, 4, 2), (1, 4, 4, 4)])
    assert [g.is_stuck for g in got] == [False, False, True, True, False]
    assert got[-1].grow_latency_seconds == 16.0


def test_a_refusing_hypervisor_keeps_the_change_pending_through_the_rereads():
    # After a failed resize the size is unknown (None) until it is read again: those steps
    # neither end the pending change nor start another.
    clock, p = FakeClock(), ScalingProgress(stuck_after_seconds=60)
    rows = [(0, 2, 4, 2)] + [(10, None, None, 2), (10, 2, 4, 2)] * 3
    got = steps(p, clock, rows)
    assert [g.pending_since for g in got] == [1000.0] * 7
    assert [g.is_stuck for g in got] == [False] * 6 + [True]


def test_a_partial_permit_is_timed_to_its_part_and_the_rest_is_a_new_wait():
    # Wants 4, the node has room for 3: the 3 are timed when online (the user got them then);
    # the fourth is a new wait from there, timed when it comes, and stuck while it does not.
    clock, p = FakeClock(), ScalingProgress(stuck_after_seconds=5)
    got = steps(
        p,
        clock,
        [(0, 1, 4, 1), (1, 3, 4, 1), (1, 3, 4, 3), (5, 3, 4, 3), (1, 4, 4, 3), (1, 4, 4, 4)],
    )
    # (1002: the 3 online; 1009: the fourth online, 7 s after the rest was asked for)
    assert [g.grow_latency_seconds for g in got] == [None, None, 2.0, None, None, 7.0]
    assert [g.is_stuck for g in got] == [False, False, False, True, True, False]


def test_a_grow_no_longer_wanted_is_abandoned_not_timed():
    clock, p = FakeClock(), ScalingProgress(stuck_after_seconds=60)
    got = steps(p, clock, [(0, 2, 6, 2), (1, 2, 6, 2), (1, 2, 2, 2), (1, 2, 2, 2)])
    assert [g.grow_abandoned for g in got] == [False, False, True, False]
    assert all(g.grow_latency_seconds is None for g in got)
    assert got[-1] == Progress()


def test_a_shrink_that_does_not_happen_is_stuck_too():
    clock, p = FakeClock(), ScalingProgress(stuck_after_seconds=20)
    got = steps(p, clock, [(0, 8, 2, 8), (20, 8, 2, 8), (1, 2, 2, 2)])
    assert [g.is_stuck for g in got] == [False, True, False]
    assert all(g.grow_latency_seconds is None and not g.grow_abandoned for g in got)


def test_without_a_cpu_count_from_the_guest_nothing_is_timed():
    clock, p = FakeClock(), ScalingProgress(stuck_after_seconds=60)
    got = steps(p, clock, [(0, 1, 3, None), (2, 3, 3, None), (1, 3, 3, None)])
    assert all(g.grow_latency_seconds is None for g in got)
    assert not p.is_growing and got[-1].pending_since is None


sizes = st.one_of(st.none(), st.integers(1, 8))


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(st.floats(0, 20, allow_nan=False), sizes, sizes, sizes), max_size=40),
    stuck_after=st.floats(0.5, 60, allow_nan=False),
)
def test_latencies_are_never_negative_and_stuck_means_pending_that_long(rows, stuck_after):
    clock, p = FakeClock(), ScalingProgress(stuck_after_seconds=stuck_after)
    opened_at = None
    for later, current, desired, online in rows:
        clock.advance(later)
        was_growing = p.is_growing
        got = p.observe(clock.now, current=current, desired=desired, online=online)
        if not was_growing and p.is_growing:
            opened_at = clock.now
        if got.grow_latency_seconds is not None:
            assert got.grow_latency_seconds >= 0
            assert was_growing or got.grow_latency_seconds == 0
            assert opened_at is None or got.grow_latency_seconds <= clock.now - opened_at + 1e-9
        assert not (got.grow_latency_seconds is not None and got.grow_abandoned)
        if got.is_stuck:
            assert got.pending_since is not None
            assert clock.now - got.pending_since >= stuck_after
