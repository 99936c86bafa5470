"""Shared helpers for the simulator tests: load the library scenarios, look things up."""

from __future__ import annotations

from pathlib import Path

import msgspec

from simulator.report import Report, VmSummary
from simulator.scenario import Scenario, load_scenario_file

SCENARIOS = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def library(name: str) -> Scenario:
    return load_scenario_file(SCENARIOS / f"{name}.yaml")


def vm(report: Report, name: str) -> VmSummary:
    return next(v for v in report.vms if v.name == name)


def with_timing(scenario: Scenario, **changes: object) -> Scenario:
    return msgspec.structs.replace(
        scenario, timing=msgspec.structs.replace(scenario.timing, **changes)
    )


def series_of(report: Report, name: str) -> tuple[list[float], list[int]]:
    s = next(v for v in report.series.vms if v.name == name)
    return report.series.times_seconds, s.vcpus
