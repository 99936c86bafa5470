"""Scenario files: strict types, every error with its ``$.path``, CSV traces, quantisation."""

from __future__ import annotations

import msgspec
import pytest

from simulator.scenario import (
    Noise,
    Piece,
    Ramp,
    ScenarioError,
    Sine,
    load_scenario_file,
    parse_scenario,
    segments,
)
from tests.simulator.helpers import SCENARIOS

HEAD = "name: x\nduration_seconds: 100\n"
VM = "{name: a, min_vcpus: 1, max_vcpus: 2"

BAD = [
    ("unknown-field", f"vms: [{VM}, cpus: 3}}]", "unknown field `cpus` - at `$.vms[0]`"),
    ("wrong-type", "vms: [{name: a, min_vcpus: two, max_vcpus: 2}]", "at `$.vms[0].min_vcpus`"),
    (
        "min-above-max",
        "vms: [{name: a, min_vcpus: 3, max_vcpus: 2}]",
        "below min_vcpus - at `$.vms[0]`",
    ),
    ("unknown-trace", f"vms: [{VM}, trace: nope}}]", "unknown trace 'nope' - at `$.vms[0].trace`"),
    ("unknown-node", f"vms: [{VM}, node: n9}}]", "unknown node 'n9' - at `$.vms[0].node`"),
    ("bad-quantity", "nodes: [{name: n, cpu: lots}]", "at `$.nodes[0].cpu`"),
    ("zero-cpu", "nodes: [{name: n, cpu: 0}]", "must be positive - at `$.nodes[0].cpu`"),
    (
        "two-kinds-of-piece",
        "traces: {t: [{at_seconds: 0, level_vcpus: 1, ramp: {to_vcpus: 2, over_seconds: 5}}]}",
        "exactly one of level_vcpus, ramp, sine, noise - at `$.traces.t[0]`",
    ),
    (
        "time-goes-back",
        "traces: {t: [{at_seconds: 5, level_vcpus: 1}, {at_seconds: 2, level_vcpus: 1}]}",
        "at_seconds must increase - at `$.traces.t[1].at_seconds`",
    ),
    ("unknown-event", "events: [{at_seconds: 1, kind: explode}]", "at `$.events[0].kind`"),
    (
        "event-without-target",
        "events: [{at_seconds: 1, kind: hypervisor-fail, for_seconds: 3}]",
        "name exactly one of vm, node - at `$.events[0]`",
    ),
    (
        "event-unknown-vm",
        "events: [{at_seconds: 1, kind: delete-vm, vm: ghost}]",
        "unknown vm 'ghost' - at `$.events[0].vm`",
    ),
    ("duplicate-key", "duration_seconds: 5", "duplicate key 'duration_seconds'"),
    (
        "typo-in-timing",
        "timing: {resize_second: 2}",
        "unknown field `resize_second` - at `$.timing`",
    ),
    (
        "duplicate-vm",
        f"vms: [{VM}}}, {VM}}}]",
        "duplicate vm name 'a' - at `$.vms[1].name`",
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [(t, e) for _, t, e in BAD], ids=[i for i, _, _ in BAD]
)
def test_bad_scenarios_name_the_path(text, expected):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(HEAD + text)
    assert any(expected in error for error in info.value.errors), info.value.errors


def test_every_library_scenario_loads():
    names = sorted(p.stem for p in SCENARIOS.glob("*.yaml"))
    assert {"steady", "burst", "contention", "restart"} <= set(names)
    for name in names:
        assert load_scenario_file(SCENARIOS / f"{name}.yaml").name == name


def test_csv_trace_is_read_relative_to_the_scenario(tmp_path):
    (tmp_path / "load.csv").write_text("seconds,vcpus\n0,0.5\n60,3\n")
    (tmp_path / "s.yaml").write_text(
        HEAD + "traces: {t: {csv: load.csv}}\n" + f"vms: [{VM}, trace: t}}]\n"
    )
    scenario = load_scenario_file(tmp_path / "s.yaml")
    assert scenario.traces["t"] == [
        Piece(at_seconds=0, level_vcpus=0.5),
        Piece(at_seconds=60, level_vcpus=3),
    ]


@pytest.mark.parametrize(
    ("csv", "expected"),
    [
        ("0,1\n10,x\n", "line 2: expected `seconds,vcpus` - at `$.traces.t.csv`"),
        ("0,1\n0,2\n", "line 2: seconds must increase"),
    ],
    ids=["not-a-number", "not-increasing"],
)
def test_bad_csv_traces_name_the_line(tmp_path, csv, expected):
    (tmp_path / "load.csv").write_text(csv)
    (tmp_path / "s.yaml").write_text(HEAD + "traces: {t: {csv: load.csv}}\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario_file(tmp_path / "s.yaml")
    assert expected in str(info.value)


def test_missing_csv_names_the_path(tmp_path):
    (tmp_path / "s.yaml").write_text(HEAD + "traces: {t: {csv: gone.csv}}\n")
    with pytest.raises(ScenarioError, match=r"at `\$\.traces\.t\.csv`"):
        load_scenario_file(tmp_path / "s.yaml")


def test_ramps_and_sines_become_steps_of_one_quantum():
    pieces = [
        Piece(at_seconds=0, level_vcpus=1),
        Piece(at_seconds=100, ramp=Ramp(to_vcpus=3, over_seconds=40)),
        Piece(at_seconds=200, level_vcpus=3),  # equal to where the ramp ended: merged
        Piece(at_seconds=300, sine=Sine(mean_vcpus=2, amplitude_vcpus=1, period_seconds=40)),
    ]
    got = segments(pieces, quantum_seconds=10, end_seconds=340)
    assert got[:6] == ((0.0, 1.0), (100, 1.25), (110, 1.75), (120, 2.25), (130, 2.75), (140, 3.0))
    # The sine, sampled mid-quantum: 2 + sin(pi/4 + k pi/2); equal neighbours merge.
    assert [(t, round(v, 3)) for t, v in got[6:]] == [(300, 2.707), (320, 1.293)]


def test_noise_is_a_new_draw_every_step_within_its_bounds_and_repeatable():
    noise = Noise(mean_vcpus=4, amplitude_vcpus=0.4, step_seconds=1, seed=3)
    pieces = [Piece(at_seconds=0, level_vcpus=1), Piece(at_seconds=10, noise=noise)]
    got = segments(pieces, quantum_seconds=15, end_seconds=110)
    assert got[0] == (0.0, 1.0)
    assert [t for t, _ in got[1:]] == [float(t) for t in range(10, 110)]  # one per step
    assert all(3.6 <= v <= 4.4 for _, v in got[1:])
    assert len({v for _, v in got[1:]}) > 90  # independent draws, not a pattern
    assert segments(pieces, quantum_seconds=15, end_seconds=110) == got
    other = [pieces[0], Piece(at_seconds=10, noise=msgspec.structs.replace(noise, seed=4))]
    assert segments(other, quantum_seconds=15, end_seconds=110) != got


def test_noise_cannot_go_negative():
    with pytest.raises(ScenarioError, match="amplitude_vcpus above mean_vcpus"):
        parse_scenario(
            HEAD + "traces: {t: [{at_seconds: 0, noise: {mean_vcpus: 1, amplitude_vcpus: 2}}]}\n"
        )


def test_no_trace_means_idle():
    assert segments(None, quantum_seconds=10, end_seconds=100) == ((0.0, 0.1),)
