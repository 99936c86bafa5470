"""``scheduler-extender recommend SNAPSHOT``: JSON on stdout, exit 3 naming each bad path."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from scheduler_extender.__main__ import EXIT_CONFIG, main

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "data/basic.recommendation.json"


def test_recommend_prints_the_golden_json(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    snapshot = str(ROOT / "examples/snapshots/basic.yaml")
    assert main(["recommend", snapshot, "--diagnostics", "full"]) == 0
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
    assert main(["recommend", str(bad)]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{bad}: duplicate zone 'a' - at `$.nodePools[0].zones[1]`" in err
    assert "at `$.nodePools[0].template.allocatable.cpu`" in err


def test_missing_file_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recommend", str(tmp_path / "nope.yaml")]) == 3
    assert "cannot read" in capsys.readouterr().err


def summary_of_golden() -> bytes:
    golden = msgspec.json.decode(GOLDEN.read_bytes())
    for r in golden["diagnostics"]["rounds"]:
        del r["candidates"]
    return msgspec.json.encode(golden)


def test_the_summary_is_the_default_the_golden_json_without_round_candidates(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    snapshot = str(ROOT / "examples/snapshots/basic.yaml")
    assert main(["recommend", snapshot]) == 0
    out, err = capsysbinary.readouterr()
    assert out == summary_of_golden() + b"\n"
    assert err == b""
    assert main(["recommend", snapshot, "--diagnostics", "summary"]) == 0
    assert capsysbinary.readouterr().out == summary_of_golden() + b"\n"


def test_diagnostics_follows_the_config_unless_given(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("recommender:\n  diagnostics: full\n")
    snapshot = str(ROOT / "examples/snapshots/basic.yaml")
    assert main(["recommend", snapshot, "--config", str(config)]) == 0
    assert capsysbinary.readouterr().out == GOLDEN.read_bytes() + b"\n"
    assert main(["recommend", snapshot, "--config", str(config), "--diagnostics", "summary"]) == 0
    assert capsysbinary.readouterr().out == summary_of_golden() + b"\n"


def test_diagnostics_help_names_both_levels(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["recommend", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--diagnostics {full,summary}" in out


@pytest.mark.parametrize("price", ["5.0e-324", "1.0e+308"])
def test_a_price_out_of_range_is_one_line_naming_its_path(
    price: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Both used to crash (OverflowError): a traceback and exit 1.
    bad = tmp_path / "price.yaml"
    bad.write_text(
        "apiVersion: vm-autoscaling.io/v1alpha1\nkind: ClusterSnapshot\n"
        f"nodePools: [{{name: p, zones: [a], maxCount: 9, price: {price},"
        " template: {instanceType: t, allocatable: {cpu: '4', memory: 8Gi}}}]\n"
        "pods: [{namespace: n, name: a, uid: a, requests: {cpu: '3'}},"
        " {namespace: n, name: b, uid: b, requests: {cpu: '3'}}]\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text("recommender:\n  scorers: [least-cost]\n")
    assert main(["recommend", str(bad), "--config", str(config)]) == EXIT_CONFIG
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.endswith("- at `$.nodePools[0].price`")
