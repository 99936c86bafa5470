"""``scheduler-extender recommend SNAPSHOT``: JSON on stdout, exit 2 naming each bad path."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_extender.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "data/basic.recommendation.json"


def test_recommend_prints_the_golden_json(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main(["recommend", str(ROOT / "examples/snapshots/basic.yaml")]) == 0
    out, err = capsysbinary.readouterr()
    assert out == GOLDEN.read_bytes() + b"\n"
    assert err == b""


def test_bad_snapshot_exits_2_with_every_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: vm-autoscaling.io/v1alpha1\nkind: ClusterSnapshot\n"
        "nodePools: [{name: p, zones: [a, a], maxCount: 1,"
        " template: {instanceType: t, allocatable: {cpu: 4x, memory: 1Gi}}}]\n"
    )
    assert main(["recommend", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{bad}: duplicate zone 'a' - at `$.nodePools[0].zones[1]`" in err
    assert "at `$.nodePools[0].template.allocatable.cpu`" in err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recommend", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
