"""Every benchmark runs, tiny, and prints its JSON: the benchmarks stay runnable.

Benchmark runs, not tests of the product (which the suite tests directly): they take minutes
together and their figures depend on the machine, so they are marked ``bench`` and run only
with ``--bench`` (alone: ``scripts/test --bench -n 0``) or ``--with-bench`` (with the suite,
the first step of ``scripts/test``).
Each run must exit 0 and print one JSON object with the keys its readers use, every key in
snake_case (``testkit.bench.emit``); no figure is asserted. ``scripts/bench_memory.py`` boots
a guest for minutes: its --help is in test_help.py, and what it measures runs in
tests/e2e/test_memory_scaling.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.bench import camel_keys
from testkit.controlplane import KUBE_BIN_HINT, kube_bin_dir

pytestmark = [pytest.mark.bench, pytest.mark.slow]

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

# script -> (tiny arguments, keys its JSON must have)
RUNS: dict[str, tuple[list[str], set[str]]] = {
    "bench_extender.py": (
        ["--nodes=20", "--pods=100", "--iterations=20", "--binds=10", "--permit-seconds=0.3",
         "--concurrency=2"],
        {"config", "filter", "bind", "permits", "ratios"},
    ),
    "bench_attacks.py": (
        # One attack of each kind (bodies, heads, tokens, replay; each port): every phase
        # starts a prober process, and all sixteen cost ~45 s for no more coverage. The
        # attacker at normal priority: it also serves the fake API server the extender lists
        # from, and at SCHED_IDLE (the bench's default, for its figures on a quiet machine) a
        # host busy with the suite's guests starved it past the extender's readiness wait.
        ["--seconds=0.5", "--rounds=1", "--nodes=20", "--connections=60", "--bomb-mib=8",
         "--attacker-sched=normal",
         "--only=gzip_bombs_unauthenticated_permits", "--only=slowloris_heads",
         "--only=garbage_token_flood", "--only=replayed_permit",
         "--only=metrics_token_churn", "--only=verbs_deep_nesting"],
        {"attacks", "worst_p99_ratio_to_idle", "extender_alive_after", "extender_peak_rss_mib"},
    ),
    # With both floors (the Go one built with go on first use: about 20 s of CPU from a cold
    # Go build cache), nothing pinned: the headline is ours over the floor unpinned.
    "bench_scheduling.py": (
        [
            "--nodes=5",
            "--pods=20",
            "--rounds=1",
            "--latency-samples=2",
            "--floor",
            "--python-floor",
        ],
        {
            "alone",
            "cache",
            "cache@floor",
            "cache@pyfloor",
            "to_floor",
            "headline",
            "delete_to_bind",
            "run_seconds",
        },
    ),
    "bench_agent.py": (
        ["--vms=5", "--interval=0.2", "--steady-ticks=2"],
        {"vms", "step_to_resize_seconds", "steady_cpu_seconds_per_vm_per_tick"},
    ),
    "bench_simulator.py": (
        ["--nodes=5", "--vms=20", "--seconds=60"],
        {"nodes", "events", "is_ok", "run_wall_seconds"},
    ),
    "bench_scenario_load.py": (
        ["--nodes=5", "--vms=20", "--seconds=60"],
        {"nodes", "vms", "parse_scenario_seconds"},
    ),
    "bench_recommender.py": (
        ["--repeat=1", "--pending=10", "--pools=2", "--nodes=10"],
        {"pending_pods", "results"},
    ),
    "bench_recommend_hotpath.py": (
        ["--nodes=20", "--filter-nodes=5", "--calls=20", "--pending=10"],
        {"nodes", "results"},
    ),
}  # fmt: skip


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", RUNS)
def test_benchmark_runs_and_prints_its_json(script: str) -> None:
    if script == "bench_scheduling.py" and kube_bin_dir() is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run this; {KUBE_BIN_HINT}")
        pytest.skip(KUBE_BIN_HINT)
    argv, keys = RUNS[script]
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *argv],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # A child of the benchmark's own (a server of fakes) stopped as the benchmark is when
    # interrupted would say so here; it must simply stop.
    assert "interrupted" not in done.stderr, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert isinstance(result, dict)
    assert keys <= result.keys(), sorted(result)
    if script == "bench_scheduling.py":
        headline = {"ours_to_floor_unpinned", "machine_cpu_ms_per_pod", "floor_cpu_over_ours"}
        assert headline <= result["headline"].keys(), result["headline"]
    assert not camel_keys(result)
