"""The memory goal: a named table, scenarios on a fake clock, and hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from autoscaler_agent.memory_policy import (
    MemoryPolicyConfig,
    MemoryPolicyState,
    couple,
    goal_memory,
    headroom,
)
from protocol.annotations import VmSpec

MiB = 2**20
GiB = 2**30
CFG = MemoryPolicyConfig()
# A guest's MemTotal is its VM size minus what the kernel keeps (88 MiB of 512 on the minimal
# guest); the policy must not care, so the tests use a fixed overhead.
OVERHEAD = 88 * MiB


def spec(min_mem=512 * MiB, max_mem=4 * GiB, unit=128 * MiB):
    return VmSpec(
        min_vcpus=1,
        max_vcpus=4,
        min_memory_bytes=min_mem,
        max_memory_bytes=max_mem,
        memory_unit_bytes=unit,
    )


def goal(used, current, *, s=None, state=None, now=1000.0, cfg=CFG):
    s = s or spec()
    total = current - OVERHEAD
    return goal_memory(
        total,
        total - used,
        s,
        state or MemoryPolicyState(),
        current_bytes=current,
        top_bytes=s.top_memory_bytes,
        config=cfg,
        now=now,
    )


CASES = [
    pytest.param(100 * MiB, 512 * MiB, 512 * MiB, id="idle-at-min-holds"),
    # available 424-300 = 124 MiB < max(128, 60) MiB: grow so that 150 MiB... at least 128 MiB.
    pytest.param(300 * MiB, 512 * MiB, 640 * MiB, id="low-headroom-grows-one-step"),
    # 24 MiB available of 424: leave max(128, 200) MiB -> 512 + 176 -> 768 MiB, in one step.
    pytest.param(400 * MiB, 512 * MiB, 768 * MiB, id="nearly-out-grows-in-one-step"),
    pytest.param(3800 * MiB, 4 * GiB - 128 * MiB, 4 * GiB, id="clamped-to-max"),
    pytest.param(600 * MiB, 1024 * MiB, 1024 * MiB, id="in-band-holds"),
]


@pytest.mark.parametrize(("used", "current", "expected"), CASES)
def test_goal_table(used, current, expected):
    assert goal(used, current).memory_bytes == expected


@pytest.mark.parametrize(
    ("total", "available"),
    [(None, 1.0), (1.0, None), (float("nan"), 1.0), (100.0, 200.0), (0.0, 0.0)],
    ids=["no-total", "no-available", "nan", "available-above-total", "zero-total"],
)
def test_unusable_numbers_hold(total, available):
    g = goal_memory(
        total,
        available,
        spec(),
        MemoryPolicyState(low_since=1.0, low_peak_bytes=GiB),
        current_bytes=GiB,
        top_bytes=4 * GiB,
        config=CFG,
        now=10.0,
    )
    assert g.memory_bytes == GiB
    assert g.state == MemoryPolicyState()
    assert g.reason.startswith("hold: no usable")


def test_a_big_page_cache_does_not_grow_the_vm():
    # MemAvailable counts reclaimable cache as available: 2 GiB of cache in a 3 GiB VM whose
    # processes use 200 MiB leaves MemAvailable near 2.7 GiB. Nothing to grow; it may shrink.
    g = goal(200 * MiB, 3 * GiB)
    assert g.memory_bytes == 3 * GiB
    assert g.shrink_bytes is not None and g.shrink_bytes < 3 * GiB


def test_a_rising_use_grows_before_it_runs_out():
    """A process allocating 40 MiB/s: the VM grows while the guest still has room, not at 0."""
    current, used, t = 512 * MiB, 100 * MiB, 0.0
    state = MemoryPolicyState()
    grew_with_available = None
    for _ in range(30):
        g = goal(used, current, state=state, now=t)
        state = g.state
        if g.memory_bytes > current:
            grew_with_available = (current - OVERHEAD) - used
            break
        used += 40 * MiB
        t += 1.0
    assert grew_with_available is not None
    # Projected 5 s ahead at 40 MiB/s: it grows with ~200 MiB still available, long before
    # the guest would have had to reclaim its cache or kill anything.
    assert grew_with_available >= 150 * MiB


def test_shrink_waits_for_the_window_and_goes_to_the_peak():
    s = spec()
    state = MemoryPolicyState()
    current = 2 * GiB
    sizes = []
    for second in range(0, 40):
        used = 300 * MiB if second != 10 else 500 * MiB  # one spike inside the window
        g = goal(used, current, s=s, state=state, now=float(second))
        state = g.state
        sizes.append(g.memory_bytes)
        if g.memory_bytes != current:
            break
    # The 500 MiB spike closes nothing (it is still below the size) but raises the peak.
    assert sizes[:-1] == [current] * (len(sizes) - 1)
    assert len(sizes) == 31  # shrinks at 30 s, not before
    spike_size = goal(500 * MiB, current).shrink_bytes
    assert sizes[-1] == spike_size
    assert spike_size < current


def test_a_low_scrape_closes_the_shrink_window():
    state = goal(300 * MiB, 2 * GiB, now=0.0).state
    assert state.low_since == 0.0
    state = goal(1700 * MiB, 2 * GiB, state=state, now=10.0).state
    assert state.low_since is None


def test_coupling_raises_both_to_the_larger_need():
    s = VmSpec(min_vcpus=1, max_vcpus=8, min_memory_bytes=GiB, max_memory_bytes=32 * GiB)
    kw = {"top_vcpus": 8, "top_memory_bytes": 32 * GiB, "memory_per_vcpu_bytes": 4 * GiB}
    assert couple(1, 9 * GiB, s, **kw) == (3, 12 * GiB)  # memory-bound: 3 units
    assert couple(4, 2 * GiB, s, **kw) == (4, 16 * GiB)  # CPU-bound: 4 units
    assert couple(8, 32 * GiB, s, **kw) == (8, 32 * GiB)
    assert couple(2, 9 * GiB, s, **{**kw, "memory_per_vcpu_bytes": 0}) == (2, 9 * GiB)


# -- properties -------------------------------------------------------------------------------

sizes_mib = st.integers(min_value=0, max_value=24).map(lambda k: 512 * MiB + k * 128 * MiB)


@settings(max_examples=300, deadline=None)
@given(
    current=sizes_mib,
    used_fraction=st.floats(min_value=0.0, max_value=3.0),
    previous_used=st.none() | st.floats(min_value=0.0, max_value=4.0 * GiB),
    window_age=st.none() | st.floats(min_value=0.0, max_value=100.0),
)
def test_never_below_use_plus_headroom(current, used_fraction, previous_used, window_age):
    """Whatever the history, the goal leaves the guest its low headroom (unless at max)."""
    s = spec()
    used = used_fraction * (current - OVERHEAD)
    used = min(used, current - OVERHEAD)  # the guest cannot use more than it has
    state = MemoryPolicyState(
        used_bytes=previous_used,
        used_at=999.0 if previous_used is not None else None,
        low_since=None if window_age is None else 1000.0 - window_age,
        low_peak_bytes=None if window_age is None else 512 * MiB,
    )
    g = goal(used, current, s=s, state=state)
    available_after = (g.memory_bytes - current) + (current - OVERHEAD - used)
    if g.memory_bytes < s.top_memory_bytes and g.memory_bytes != current:
        assert available_after >= headroom(used, CFG.low_headroom_fraction, CFG) - 1
    if g.memory_bytes < current:  # a shrink keeps the target headroom, not just the low one
        assert available_after >= headroom(used, CFG.target_headroom_fraction, CFG) - 1


@settings(max_examples=300, deadline=None)
@given(
    base_mib=st.integers(min_value=50, max_value=3000),
    noise=st.lists(st.floats(min_value=-0.05, max_value=0.05), min_size=120, max_size=120),
)
def test_a_steady_use_with_noise_does_not_flap(base_mib, noise):
    """±5% noise around a steady use, from a size that fits it: never a grow, so never back and
    forth; only shrinks towards the target headroom (a second one when the first window's peak
    was a noisy high), each after a full window."""
    s = spec(max_mem=8 * GiB)
    base = base_mib * MiB
    current = min(
        s.top_memory_bytes,
        s.memory_bounds.round_down(int(base * 1.6 + OVERHEAD)) + s.memory_unit_bytes,
    )
    state = MemoryPolicyState()
    changes: list[int] = []
    for second, n in enumerate(noise):
        used = base * (1 + n)
        g = goal(used, current, s=s, state=state, now=float(second))
        state = g.state
        if g.memory_bytes != current:
            changes.append(g.memory_bytes - current)
            current = g.memory_bytes
    assert all(d < 0 for d in changes), changes
    assert len(changes) <= len(noise) // CFG.shrink_after_seconds, changes
    assert current - OVERHEAD - base * 1.05 >= headroom(base, CFG.low_headroom_fraction, CFG) - 1


@settings(max_examples=200, deadline=None)
@given(
    rate_mib=st.integers(min_value=20, max_value=180),
    start_mib=st.integers(min_value=50, max_value=300),
)
def test_a_steady_allocation_is_always_ahead_of_the_guest(rate_mib, start_mib):
    """An allocation rising steadily, with each grow landing one scrape after it was decided:
    the guest never runs out (available stays positive) until the VM is at its maximum. The
    limit: the first two scrapes of it must fit in what the guest has (nothing can see an
    allocation before it starts, and the first grow lands a scrape after it is decided)."""
    assume(start_mib + 2 * rate_mib < 424)
    s = spec(max_mem=16 * GiB)
    current, used, state = s.min_memory_bytes, float(start_mib * MiB), MemoryPolicyState()
    pending = None
    for second in range(60):
        if pending is not None:
            current, pending = pending, None
        assert used < current - OVERHEAD or current == s.top_memory_bytes
        g = goal(used, current, s=s, state=state, now=float(second))
        state = g.state
        if g.memory_bytes > current:
            pending = g.memory_bytes
        used += rate_mib * MiB
        if used + OVERHEAD >= s.top_memory_bytes:
            break


# -- pressure (PSI) -----------------------------------------------------------------------------


def pressured(waited_per_second, *, used=200 * MiB, current=1 * GiB, stalled_per_second=0.0):
    """Two scrapes 1 s apart of a guest with plenty of MemAvailable, whose tasks waited for
    memory ``waited_per_second`` of that second (PSI some)."""
    s = spec()
    total = current - OVERHEAD
    first = goal_memory(
        total,
        total - used,
        s,
        MemoryPolicyState(),
        current_bytes=current,
        top_bytes=s.top_memory_bytes,
        config=CFG,
        now=100.0,
        waiting_seconds_total=50.0,
        stalled_seconds_total=5.0,
    )
    return goal_memory(
        total,
        total - used,
        s,
        first.state,
        current_bytes=current,
        top_bytes=s.top_memory_bytes,
        config=CFG,
        now=101.0,
        waiting_seconds_total=50.0 + waited_per_second,
        stalled_seconds_total=5.0 + stalled_per_second,
    )


@pytest.mark.parametrize(
    ("waited", "memory_mib", "is_pressure_grow"),
    [
        (0.0, 1024, False),  # no pressure, plenty available: hold
        (0.09, 1024, False),  # below the threshold (0.1)
        (0.3, 1280, True),  # 30% waiting: +25% of 1 GiB, rounded up to the unit
    ],
    ids=["none", "below-threshold", "pressure"],
)
def test_pressure_grows_a_vm_whose_memavailable_looks_fine(waited, memory_mib, is_pressure_grow):
    g = pressured(waited, stalled_per_second=0.05)
    assert g.memory_bytes == memory_mib * MiB
    assert g.is_pressure_grow is is_pressure_grow
    assert g.waiting_fraction == pytest.approx(waited)
    assert g.stalled_seconds == pytest.approx(0.05)
    if is_pressure_grow:
        assert g.reason.startswith("grow 1024 -> 1280 MiB on memory pressure: waited 30%")


def test_pressure_closes_the_shrink_window():
    """200 MiB used of 1 GiB would shrink after the window; a guest waiting for memory does
    not give any back."""
    g = pressured(0.5)
    assert g.state.low_since is None and g.state.low_peak_bytes is None


def test_without_psi_counters_there_is_no_pressure():
    assert goal(200 * MiB, 1 * GiB).waiting_fraction is None


def test_no_shrink_under_pressure_even_at_the_top():
    """A guest streaming a disk larger than any size waits for memory at every size: at its
    maximum it must hold, not shrink after the window and grow back on the next stall."""
    s = spec(max_mem=1 * GiB)
    total = 1 * GiB - OVERHEAD
    cfg = MemoryPolicyConfig(shrink_after_seconds=2.0)
    state = MemoryPolicyState()
    for now in (100.0, 101.0, 102.0, 103.0):
        g = goal_memory(
            total,
            total - 100 * MiB,
            s,
            state,
            current_bytes=1 * GiB,
            top_bytes=1 * GiB,
            config=cfg,
            now=now,
            waiting_seconds_total=now * 0.5,
            stalled_seconds_total=0.0,
        )
        state = g.state
        assert g.memory_bytes == 1 * GiB
        # The first scrape has no rate yet and opens the window; each later one closes it.
        assert (state.low_since is None) is (now > 100.0)
    # A shrink already due when the pressure comes (the window passed): held.
    due = MemoryPolicyState(
        used_bytes=100 * MiB,
        used_at=103.0,
        low_since=50.0,
        low_peak_bytes=512 * MiB,
        waiting_seconds=0.0,
        stalled_seconds=0.0,
    )
    g = goal_memory(
        total,
        total - 100 * MiB,
        s,
        due,
        current_bytes=1 * GiB,
        top_bytes=1 * GiB,
        config=cfg,
        now=104.0,
        waiting_seconds_total=0.5,
        stalled_seconds_total=0.0,
    )
    assert g.memory_bytes == 1 * GiB
    assert g.reason.startswith("hold on memory pressure: waited 50%"), g.reason


def test_a_window_peak_from_a_larger_size_never_makes_a_shrink_a_grow():
    """A scrape taken while a shrink landed judged the old, larger size; its peak (896 MiB)
    carried into the window must not "shrink" the VM now at 768 MiB up to it."""
    stale = MemoryPolicyState(
        used_bytes=76 * MiB, used_at=100.0, low_since=60.0, low_peak_bytes=896 * MiB
    )
    g = goal(76 * MiB, 768 * MiB, state=stale, now=101.0)
    assert g.memory_bytes <= 768 * MiB


def test_a_window_from_before_a_shrink_landed_starts_again_at_the_first_scrape_after_it():
    """The window's peak (896 MiB) was judged at a larger size; at 768 MiB the window starts
    again from this scrape, not from the next one, and the shrink comes a full window later."""
    stale = MemoryPolicyState(
        used_bytes=76 * MiB, used_at=100.0, low_since=60.0, low_peak_bytes=896 * MiB
    )
    g = goal(76 * MiB, 768 * MiB, state=stale, now=101.0)
    assert g.memory_bytes == 768 * MiB
    assert (g.state.low_since, g.state.low_peak_bytes) == (101.0, g.shrink_bytes)
    assert g.shrink_bytes is not None and g.shrink_bytes < 768 * MiB
    later = goal(76 * MiB, 768 * MiB, state=g.state, now=101.0 + CFG.shrink_after_seconds)
    assert later.memory_bytes == g.shrink_bytes, later.reason


def test_a_rising_use_closes_the_shrink_window():
    """A writer filling a guest that is still far below its size: with a 1 s window, the
    shrink came due mid-write ("shrink 1280 -> 896 MiB after 1s: ... rising 150.5 MiB/s") and
    the VM grew back on the next scrapes. On a trend it holds, and the window starts over."""
    cfg = MemoryPolicyConfig(shrink_after_seconds=1.0)
    current, used = 2 * GiB, 300 * MiB
    state = goal(used, current, state=MemoryPolicyState(), now=0.0, cfg=cfg).state
    assert state.low_since == 0.0  # low and still: the window opens
    for now in (1.0, 2.0, 3.0):
        used = int(used * 1.1)  # +10% a second: a trend from the second interval on
        g = goal(used, current, state=state, now=now, cfg=cfg)
        state = g.state
        assert g.shrink_bytes is not None and g.shrink_bytes < current
        if now == 1.0:
            continue  # one rise is no trend yet
        assert g.memory_bytes == current, g.reason
        assert g.reason.startswith("hold: no shrink while the use rises"), g.reason
        assert state.low_since is None
    # Once the use stands still, the window opens again and runs its full length.
    g = goal(used, current, state=state, now=4.0, cfg=cfg)
    assert g.memory_bytes == current and g.state.low_since == 4.0, g.reason
    g = goal(used, current, state=g.state, now=5.0, cfg=cfg)
    assert g.memory_bytes < current, g.reason
