"""The goal calculation: a named table, and the no-oscillation property under steady load."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler_agent.policy import (
    PolicyConfig,
    PolicyState,
    Samples,
    cpu_busy_fraction,
    goal_vcpus,
    memory_used_fraction,
)
from protocol.annotations import VmSpec

GiB = 2**30
CFG = PolicyConfig(target_load_per_vcpu=0.9, shrink_load_per_vcpu=0.6, shrink_after_seconds=30)


def spec(min_vcpus=1, max_vcpus=16, unit=1):
    return VmSpec(
        min_vcpus=min_vcpus,
        max_vcpus=max_vcpus,
        scaling_unit=unit,
        min_memory_bytes=GiB,
        max_memory_bytes=GiB,
    )


FRESH = PolicyState()


def goal(load1, current, *, s=None, state=FRESH, now=1000.0, top=None):
    s = s or spec()
    return goal_vcpus(
        Samples(load1=load1),
        s,
        state,
        current_vcpus=current,
        top_vcpus=top if top is not None else s.top_vcpus,
        config=CFG,
        now=now,
    )


# (load1, current, spec, expected goal) -- grow decisions need no hysteresis.
CASES = [
    pytest.param(0.0, 1, spec(), 1, id="idle-at-min-holds"),
    pytest.param(0.9, 1, spec(), 1, id="exactly-target-holds"),
    pytest.param(0.91, 1, spec(), 2, id="just-above-target-grows"),
    pytest.param(1.8, 1, spec(), 2, id="float-fuzz-1.8/0.9-is-2-not-3"),
    pytest.param(7.0, 1, spec(), 8, id="one-step-grow-1-to-8"),
    pytest.param(7.0, 2, spec(unit=4, min_vcpus=2, max_vcpus=18), 10, id="rounds-up-to-unit"),
    pytest.param(100.0, 4, spec(max_vcpus=16), 16, id="clamped-to-max"),
    pytest.param(100.0, 4, spec(max_vcpus=15, unit=2), 15, id="max-not-on-unit-uses-top"),
    pytest.param(0.1, 2, spec(min_vcpus=2), 2, id="never-below-min"),
    pytest.param(3.0, 4, spec(), 4, id="in-band-holds"),
    pytest.param(None, 4, spec(), 4, id="no-load1-holds"),
    pytest.param(float("nan"), 4, spec(), 4, id="nan-load1-holds"),
]


@pytest.mark.parametrize(("load1", "current", "s", "expected"), CASES)
def test_goal_table(load1, current, s, expected):
    assert goal(load1, current, s=s).vcpus == expected


def test_grow_reason_names_the_parts():
    g = goal(7.0, 1)
    assert g.grow_vcpus == 8
    assert g.reason.startswith("grow 1 -> 8: load1 7.00 at 0.9 per vCPU needs 8")


def test_shrink_waits_for_the_window_then_goes_to_the_peak():
    # 8 vCPUs, load 1.0: shrink size ceil(1/0.6) = 2, but only after 30 s of low load.
    g = goal(1.0, 8, now=1000.0)
    assert (g.vcpus, g.state.low_since) == (8, 1000.0)
    assert g.reason.startswith("hold: shrink to 2 pending, low for 0s of 30s")
    # A brief rise inside the window (load 2.0 -> shrink size 4) raises the peak...
    g = goal(2.0, 8, state=g.state, now=1010.0)
    assert (g.vcpus, g.state.low_peak_vcpus) == (8, 4)
    g = goal(1.0, 8, state=g.state, now=1029.0)
    assert g.vcpus == 8
    # ... so after the window the VM shrinks to 4, not 2.
    g = goal(1.0, 8, state=g.state, now=1030.0)
    assert g.vcpus == 4
    assert g.state == PolicyState()


def test_shrink_window_resets_when_load_returns():
    g = goal(1.0, 8, now=1000.0)
    g = goal(6.0, 8, state=g.state, now=1020.0)  # shrink size ceil(6/0.6)=10 >= 8: not low
    assert g.state == PolicyState()
    g = goal(1.0, 8, state=g.state, now=1040.0)
    assert (g.vcpus, g.state.low_since) == (8, 1040.0)


def test_above_max_shrinks_at_once():
    g = goal(0.5, 12, s=spec(max_vcpus=8))
    assert g.vcpus == 8


def test_cpu_and_memory_fractions():
    a = Samples(cpu_seconds_total=100.0, cpu_idle_seconds_total=80.0)
    b = Samples(cpu_seconds_total=110.0, cpu_idle_seconds_total=82.5)
    assert cpu_busy_fraction(a, b) == pytest.approx(0.75)
    assert cpu_busy_fraction(None, b) is None
    assert cpu_busy_fraction(b, a) is None  # counter reset
    m = Samples(memory_available_bytes=25.0, memory_total_bytes=100.0)
    assert memory_used_fraction(m) == pytest.approx(0.75)
    assert memory_used_fraction(Samples()) is None


specs = st.builds(
    lambda lo, extra, unit: spec(min_vcpus=lo, max_vcpus=lo + extra, unit=unit),
    st.integers(1, 8),
    st.integers(0, 64),
    st.integers(1, 4),
)


@settings(max_examples=80, deadline=None)
@given(
    s=specs,
    load1=st.floats(0, 100, allow_nan=False),
    start=st.integers(1, 80),
    noise=st.lists(st.floats(-0.02, 0.02), min_size=60, max_size=60),
)
def test_noisy_steady_load_never_reverses(s, load1, start, noise):
    """With 2% sampling noise the size may creep (a noisy peak needs one more vCPU), but it
    never goes back and forth: every change is in the same direction."""
    current = s.round_vcpus_down(start)
    state = PolicyState()
    directions = set()
    for tick, n in enumerate(noise):
        g = goal(max(0.0, load1 * (1 + n)), current, s=s, state=state, now=1000.0 + tick)
        state = g.state
        if g.vcpus != current:
            directions.add(g.vcpus > current)
            current = g.vcpus
    assert len(directions) <= 1


@settings(max_examples=150, deadline=None)
@given(s=specs, load1=st.floats(0, 100, allow_nan=False), start=st.integers(1, 80))
def test_exactly_steady_load_changes_size_at_most_once(s, load1, start):
    current = s.round_vcpus_down(start)
    state = PolicyState()
    sizes = [current]
    for tick in range(100):
        g = goal(load1, current, s=s, state=state, now=1000.0 + tick)
        state, current = g.state, g.vcpus
        if current != sizes[-1]:
            sizes.append(current)
        assert s.min_vcpus <= current <= s.top_vcpus
        assert (current - s.min_vcpus) % s.scaling_unit == 0 or current == s.top_vcpus
    assert len(sizes) <= 2, sizes
