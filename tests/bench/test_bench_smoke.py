"""Smoke test of scripts/bench_extender.py: a tiny cluster end to end, and the JSON's shape.

No timings are asserted (they depend on the machine); only that every phase ran and reported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_extender.py"
LATENCY_KEYS = {"n", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_extender_tiny_run_reports_every_phase() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--nodes=20",
            "--pods=100",
            "--iterations=20",
            "--binds=10",
            "--permit-seconds=0.3",
            "--concurrency=2",
        ],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["config"]["nodes"] == 20
    assert set(result["config"]["affinity"]) == {"machine", "server", "load_generator", "fake_api"}
    for mode in ("cache", "nocache"):
        phase = result["filter"][mode]
        assert phase["extender"].keys() >= LATENCY_KEYS
        assert phase["bare"].keys() >= LATENCY_KEYS
        assert phase["bare_same_answer"].keys() >= LATENCY_KEYS
        assert phase["extender"]["n"] == phase["bare"]["n"] == phase["bare_same_answer"]["n"] == 20
        assert phase["ratio_p99"] > 0
        assert phase["ratio_p99_vs_same_answer"] > 0
    assert result["bind"]["n"] == 10
    assert result["bind"]["binding_post"].startswith("fake API")
    permits = result["permits"]
    assert permits["batch_vms"] == 50
    for side in ("extender", "bare"):
        assert permits[side]["vm_permits"] > 0
        assert permits[side]["batch_latency"].keys() >= LATENCY_KEYS
    assert set(result["ratios"]) == {
        "filter_cache_p99_vs_bare",
        "filter_nocache_p99_vs_bare",
        "filter_cache_p99_vs_bare_same_answer",
        "filter_nocache_p99_vs_bare_same_answer",
        "vm_permits_per_second",
    }
