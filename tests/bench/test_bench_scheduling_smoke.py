"""Smoke test of scripts/bench_scheduling.py: a tiny run through the real control plane.

No timings are asserted (they depend on the machine); only that every mode scheduled every
pod, with our extender and with the floor extender (built here with go on first use: about
20 s of CPU from a cold Go build cache, none once its binary is cached), each pinned to a CPU
of its own, the extender's costs were read, and the latency phase saw the pending VM bind.
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
@pytest.mark.timeout(420)
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
            "--floor",
            "--pin=yes",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    for mode in ("alone", "cache", "nocache", "cache@floor", "nocache@floor"):
        assert len(result[f"{mode}+pinned"]["podsPerSecond"]) == 1
        assert result[f"{mode}+pinned"]["podsPerSecond"][0] > 0
        assert result[f"{mode}+pinned"]["cycleMsPerPod"]["algorithm"] > 0
    for mode in ("cache", "nocache", "cache@floor", "nocache@floor"):
        cpus = result[f"{mode}+pinned"]["cpus"]
        assert len(cpus["extender"]) == 1
        for process in ("kube-scheduler", "kube-apiserver", "etcd"):
            assert cpus[process]
            assert not set(cpus[process]) & set(cpus["extender"])
    for mode in ("cache", "nocache"):
        assert result[f"{mode}+pinned"]["extenderCpuMsPerPod"] > 0
        assert set(result[f"{mode}+pinned"]["verbMsPerPod"]) >= {"filter", "bind"}
        assert result[f"{mode}+pinnedToAloneRatio"] > 0
        assert result["toFloor"][f"{mode}+pinned"]["median"] > 0
    assert result["deleteToBind"]["samples"] == 2
