"""The simulated guest's memory (simulator.world): what it uses over time and what a shrink
can give back. The policy that sizes it is the agent's own (tests/agent)."""

from __future__ import annotations

import pytest

from protocol.annotations import VmSpec
from simulator.scenario import ScenarioError, parse_scenario
from simulator.world import given_back_to, memory_segments, round_up_memory

GI, MI = 2**30, 2**20
SPEC = VmSpec(
    min_vcpus=1,
    max_vcpus=1,
    min_memory_bytes=2 * GI,
    max_memory_bytes=16 * GI,
    memory_unit_bytes=512 * MI,
)


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
