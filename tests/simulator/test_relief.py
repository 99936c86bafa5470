"""Relief and drain in the simulator (``examples/scenarios/relief.yaml``): the real
``core.relief`` plan on the real ledger, moves that take time and sometimes fail, and every
invariant checked after every event (``check_interval_seconds`` 0)."""

from __future__ import annotations

import msgspec

from simulator.cli import main
from simulator.engine import simulate
from simulator.report import Report, encode_report, relief_line
from simulator.scenario import ForeignPod
from tests.simulator.helpers import SCENARIOS, library


def test_a_full_node_is_relieved_and_a_quiet_node_emptied():
    scenario = library("relief")
    report = simulate(scenario)
    assert report.is_ok, report.violation
    relief = report.relief
    assert relief is not None and relief.is_enabled
    vms = {vm.name: vm for vm in report.vms}
    # db's burst wants 6 vCPUs on a node that can give it 4: a neighbour moves away and db
    # reaches its full size where it is.
    assert vms["db"].node == "node-a" and vms["db"].final_vcpus == 6
    assert relief.moves_by_reason["NeighbourAway"] >= 1
    # node-c's one idle VM moves away after the hysteresis; the node is reported empty.
    assert relief.nodes_emptied == ["node-c"] and vms["lone"].node == "node-b"
    # The VM that opted out never moved; a failed move left its VM where it was.
    assert vms["idle"].node == "node-b"
    assert relief.moves_failed >= 1
    assert relief.moves_started == relief.moves_done + relief.moves_failed
    kinds = [(e.kind, e.subject) for e in report.log]
    assert ("move_started", "idle") not in kinds

    # The same run without relief: nothing moves, db stays cut short for its whole burst.
    off = msgspec.structs.replace(
        scenario, relief=msgspec.structs.replace(scenario.relief, enabled=False)
    )
    baseline = simulate(off)
    assert baseline.is_ok and baseline.relief is not None
    assert baseline.relief.moves_started == 0
    assert baseline.relief.cut_short_share > 5 * relief.cut_short_share
    assert {vm.name: vm.final_vcpus for vm in baseline.vms}["db"] == 4


def test_the_same_scenario_moves_the_same_vms():
    scenario = library("relief")
    assert encode_report(simulate(scenario)) == encode_report(simulate(scenario))


def test_a_report_without_relief_has_no_relief_key():
    scenario = msgspec.structs.replace(library("relief"), relief=None)
    report = simulate(scenario)
    assert report.relief is None and b'"relief":' not in encode_report(report)


def test_the_summary_prints_the_cut_short_share_with_and_without_relief(tmp_path, capsys):
    assert main([str(SCENARIOS / "relief.yaml"), "--no-plot", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    report = msgspec.json.decode((tmp_path / "relief.json").read_bytes(), type=Report)
    assert report.relief is not None
    assert relief_line(report.relief) in out
    assert "nodes emptied: node-c" in out
    assert "without relief: cut-short VM-seconds" in out


def test_a_drained_nodes_other_pods_are_evicted_once_its_vms_have_moved():
    """A pod of another scheduler on quiet node-c (a ReplicaSet's, as the simulator's are):
    the drain still starts, moves node-c's VM away first, then evicts the pod, and the node
    is empty after; the same figures otherwise."""
    scenario = library("relief")
    web = ForeignPod(name="web-0", cpu="100m", memory="128Mi", node="node-c")
    report = simulate(msgspec.structs.replace(scenario, foreign_pods=[web]))
    assert report.is_ok, report.violation
    assert report.relief is not None and report.relief.nodes_emptied == ["node-c"]
    kinds = [(e.kind, e.subject) for e in report.log]
    moved = next(i for i, k in enumerate(kinds) if k == ("move_started", "lone"))
    assert kinds.index(("evicted", "web-0")) > moved
