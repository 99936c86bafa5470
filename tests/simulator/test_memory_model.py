"""The simulator's memory model (simulator.memory): a pure policy, tested on a fake clock."""

from __future__ import annotations

import pytest

from protocol.annotations import VmSpec
from simulator.memory import (
    MemoryPolicyConfig,
    MemoryPolicyState,
    given_back_to,
    memory_goal,
    memory_segments,
    round_up_memory,
)
from simulator.scenario import ScenarioError, parse_scenario

GI, MI = 2**30, 2**20
SPEC = VmSpec(
    min_vcpus=1,
    max_vcpus=1,
    min_memory_bytes=2 * GI,
    max_memory_bytes=16 * GI,
    memory_unit_bytes=512 * MI,
)
CONFIG = MemoryPolicyConfig()  # grow above 75% used, shrink below 50% after 60 s, 256Mi margin


@pytest.mark.parametrize(
    ("used", "current", "goal"),
    [
        (1 * GI, 2 * GI, 2 * GI),  # 50%: steady
        (int(1.6 * GI), 2 * GI, 2560 * MI),  # 80%: one step to where it is below 75%
        (7 * GI, 2 * GI, 9728 * MI),  # far above: straight there, not unit by unit
        (15 * GI, 16 * GI, 16 * GI),  # never above the maximum
    ],
    ids=["steady", "one-step", "straight-there", "at-max"],
)
def test_growth_goes_in_one_step_to_the_smallest_size_that_fits(used, current, goal):
    got, _ = memory_goal(
        SPEC, MemoryPolicyState(), used=used, current=current, config=CONFIG, now=0.0
    )
    assert got == goal


def test_shrink_waits_out_its_window_and_keeps_a_margin_above_use():
    state = MemoryPolicyState()
    for now in (0.0, 30.0, 59.0):
        goal, state = memory_goal(SPEC, state, used=GI, current=8 * GI, config=CONFIG, now=now)
        assert goal == 8 * GI
    goal, state = memory_goal(SPEC, state, used=GI, current=8 * GI, config=CONFIG, now=60.0)
    # 1Gi / 0.75 = 1.33Gi and 1Gi + 256Mi: both below the minimum.
    assert goal == 2 * GI
    goal, _ = memory_goal(SPEC, state, used=3 * GI, current=8 * GI, config=CONFIG, now=61.0)
    assert goal == 4 * GI  # 3Gi / 0.75 = 4Gi, above 3Gi + 256Mi
    # Use coming back above half resets the window.
    _, state = memory_goal(SPEC, state, used=5 * GI, current=8 * GI, config=CONFIG, now=62.0)
    assert state.low_since is None


def test_a_shrink_ends_where_the_guest_holds_its_memory():
    assert given_back_to(SPEC, asked=2 * GI, used=GI) == 2 * GI
    assert given_back_to(SPEC, asked=2 * GI, used=5 * GI + 1) == 5 * GI + 512 * MI
    assert round_up_memory(SPEC, 100 * GI) == 16 * GI


def test_a_ramp_of_use_is_steps_on_the_scrape_grid():
    segments = memory_segments([(10.0, 2 * GI, 4.0), (20.0, GI, 0.0)], 4 * GI, step_seconds=1.0)
    assert segments == (
        (0.0, GI),
        (10.0, GI + GI // 4),
        (11.0, GI + GI // 2),
        (12.0, GI + 3 * GI // 4),
        (13.0, 2 * GI),
        (20.0, GI),
    )


@pytest.mark.parametrize(
    ("vm", "path"),
    [
        (
            "{name: a, min_vcpus: 1, max_vcpus: 1, memory: 4Gi, max_memory: 2Gi}",
            "$.vms[0].max_memory",
        ),
        ("{name: a, min_vcpus: 1, max_vcpus: 1, memory_unit: 0}", "$.vms[0].memory_unit"),
        (
            "{name: a, min_vcpus: 1, max_vcpus: 1, memory_used: [{at_seconds: 5, used: 1Gi},"
            " {at_seconds: 5, used: 2Gi}]}",
            "$.vms[0].memory_used[1]",
        ),
    ],
    ids=["max-below-min", "zero-unit", "time-goes-back"],
)
def test_bad_memory_in_a_scenario_names_its_path(vm, path):
    text = f"name: x\nduration_seconds: 10\nnodes: [{{name: n, cpu: 4}}]\nvms: [{vm}]\n"
    with pytest.raises(ScenarioError) as e:
        parse_scenario(text)
    assert any(path in err for err in e.value.errors), e.value.errors
