"""A run split by node over processes writes the whole run's report, byte for byte."""

from __future__ import annotations

import gc

import msgspec
import pytest

from simulator import scenario as sc
from simulator.builtin import default_scenario
from simulator.engine import simulate
from simulator.fleet import fleet
from simulator.split import node_parts, simulate_split


def _json(report: object) -> bytes:
    return msgspec.json.encode(report)


@pytest.mark.parametrize(("nodes", "vms", "seed"), [(24, 480, 1), (17, 300, 4)])
def test_a_split_fleet_reports_what_the_whole_run_does(nodes, vms, seed):
    # Full nodes (20 VMs per 96 CPUs) contend within each part; 17 nodes split unevenly.
    scenario = fleet(nodes, vms, 1200, seed)
    split = node_parts(scenario, 2)
    assert split is not None and len(split) == 2
    assert sorted(n for part in split for n in part) == sorted(n.name for n in scenario.nodes)
    whole = simulate(scenario)
    assert whole.is_ok and whole.counters.permit_batches > 0
    assert _json(simulate_split(scenario, parts=2)) == _json(whole)
    assert gc.isenabled()  # paused for the run only


def test_a_scenario_whose_nodes_share_something_runs_whole():
    restart = msgspec.structs.replace(
        fleet(24, 480, 600, 1), events=[sc.ExtenderRestart(at_seconds=300, down_seconds=20)]
    )
    for scenario in (default_scenario(), restart):
        assert node_parts(scenario, 2) is None
    assert _json(simulate_split(restart, parts=2)) == _json(simulate(restart))


def test_too_few_nodes_to_split():
    assert node_parts(fleet(15, 300, 600, 1), 2) is None
    assert node_parts(fleet(16, 300, 600, 1), 1) is None
    assert node_parts(fleet(16, 300, 600, 1), 2) is not None
