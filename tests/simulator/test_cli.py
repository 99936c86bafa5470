"""``vm-simulator``: exit statuses, files written, paths printed."""

from __future__ import annotations

import json

import msgspec
import pytest

from simulator.cli import main
from simulator.fleet import fleet
from simulator.scenario import load_scenario_file
from simulator.split import node_parts
from tests.simulator.helpers import SCENARIOS


def test_simulate_a_scenario_writes_the_report_and_the_plot(tmp_path, capsys):
    status = main([str(SCENARIOS / "burst.yaml"), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0
    assert "scenario burst: 1500s of 1500s simulated, seed 1, OK" in out
    assert f"report: {tmp_path / 'burst.json'}" in out
    assert f"plot:   {tmp_path / 'burst.png'}" in out
    report = json.loads((tmp_path / "burst.json").read_text())
    assert report["is_ok"] is True and report["scenario"] == "burst"
    assert (tmp_path / "burst.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_without_a_file_runs_the_built_in_scenario(tmp_path, capsys):
    assert main(["--no-plot", "--seed", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "scenario default: 3600s of 3600s simulated, seed 3, OK" in out
    assert "recommender at 1500s: add general/zone-a x1" in out
    assert not (tmp_path / "default.png").exists()


def test_a_bad_scenario_exits_2_naming_the_path(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nduration_seconds: 10\nvms: [{name: a, min_vcpus: 0, max_vcpus: 2}]\n")
    assert main([str(bad), "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "simulate: scenario error: Expected `int` >= 1 - at `$.vms[0].min_vcpus`" in err


def test_a_missing_scenario_exits_3(tmp_path, capsys):
    assert main([str(tmp_path / "nope.yaml")]) == 3
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"]], ids=["help"])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    assert "vm-simulator" in capsys.readouterr().out


def test_a_fleet_split_over_processes_writes_the_one_process_report(tmp_path, capsys):
    # A fleet whose nodes share nothing: with --processes 2 it runs split by node, and the
    # report is byte for byte the one a single process writes.
    scenario = msgspec.structs.replace(fleet(16, 160, 300, 2), name="split")
    path = tmp_path / "split.yaml"
    path.write_bytes(msgspec.yaml.encode(scenario))
    assert node_parts(load_scenario_file(path), 2) is not None
    reports = []
    for processes in ("1", "2"):
        out = tmp_path / processes
        assert main([str(path), "--no-plot", "--processes", processes, "--out", str(out)]) == 0
        reports.append((out / "split.json").read_bytes())
    assert reports[0] == reports[1]
    assert json.loads(reports[0])["is_ok"] is True
    capsys.readouterr()


def test_processes_below_one_is_a_bad_command_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--processes", "0"])
    assert info.value.code == 2
    assert "--processes: must be at least 1, not 0" in capsys.readouterr().err
