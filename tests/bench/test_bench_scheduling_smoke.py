"""Smoke test of scripts/bench_scheduling.py: a tiny run through the real control plane.

No timings are asserted (they depend on the machine); only that every mode scheduled every
pod, the extender's costs were read, and the latency phase saw the pending VM bind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controlplane.harness import KUBE_BIN_HINT, kube_bin_dir

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_scheduling.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_scheduling_tiny_run_reports_every_mode() -> None:
    if kube_bin_dir() is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run this; {KUBE_BIN_HINT}")
        pytest.skip(KUBE_BIN_HINT)
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--nodes=5",
            "--pods=20",
            "--rounds=1",
            "--latency-samples=2",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    for mode in ("alone", "cache", "nocache"):
        assert len(result[mode]["podsPerSecond"]) == 1
        assert result[mode]["podsPerSecond"][0] > 0
    for mode in ("cache", "nocache"):
        assert result[mode]["extenderCpuMsPerPod"] > 0
        assert set(result[mode]["verbMsPerPod"]) >= {"filter", "bind"}
        assert result[f"{mode}ToAloneRatio"] > 0
    assert result["deleteToBind"]["samples"] == 2
