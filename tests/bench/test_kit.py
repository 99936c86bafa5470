"""The benchmarks' kit (testkit/bench.py): its one percentile rule, its output's one casing, and
every script under scripts/ using it instead of a way of its own.

Pure and fast (no benchmark runs here: those are test_benchmarks_run.py's, under --bench).
"""

from __future__ import annotations

import ast
import math
import os
import signal
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testkit import bench as kit
from testkit.manifests import ROOT

SCRIPTS = ROOT / "scripts"
BENCHES = sorted(SCRIPTS.glob("bench_*.py"))
PYTHON_SCRIPTS = sorted(SCRIPTS.glob("*.py"))

samples = st.lists(
    st.floats(min_value=-1e9, max_value=1e9, allow_nan=False), min_size=1, max_size=200
)
# Percentiles as people write them (99, 99.9, 12.345): a q's meaning is its decimal form.
quantiles = st.one_of(
    st.integers(min_value=0, max_value=100).map(float),
    st.floats(min_value=0, max_value=100, allow_nan=False).map(lambda q: round(q, 3)),
)


@given(values=samples, q=quantiles)
def test_percentile_is_the_nearest_rank(values, q):
    """The smallest value with at least q% of the values at or below it: always one of them."""
    p = kit.percentile(values, q)
    share = Fraction(str(q)) * len(values)  # q% of the values, exactly
    assert p in values
    at_or_below = sum(1 for v in values if v <= p)
    below = sum(1 for v in values if v < p)
    assert at_or_below * 100 >= share  # at least q% at or below
    if q > 0:
        assert below * 100 < share  # and it is the smallest such value


@given(values=samples, q1=quantiles, q2=quantiles)
def test_percentile_grows_with_q(values, q1, q2):
    lo, hi = sorted((q1, q2))
    assert kit.percentile(values, lo) <= kit.percentile(values, hi)


@given(values=samples)
def test_percentile_ends_are_the_extremes(values):
    assert kit.percentile(values, 0) == min(values)
    assert kit.percentile(values, 100) == max(values)


@pytest.mark.parametrize(
    ("n", "q", "rank"),
    [
        (100, 99, 99),  # the 99th of 100
        (100, 7, 7),  # 0.07 * 100 is 7.000000000000001 in floats: still rank 7, not 8
        (50, 99, 50),  # fewer than 100 samples: p99 is their maximum
        (2, 50, 1),  # p50 of two: the lower one (never their mean)
        (3, 50, 2),
        (1000, 99.9, 999),
    ],
    ids=["p99-of-100", "float-exact", "p99-of-50", "p50-of-2", "p50-of-3", "p99.9-of-1000"],
)
def test_percentile_ranks(n, q, rank):
    assert kit.percentile(list(range(1, n + 1)), q) == rank


@pytest.mark.parametrize("bad", [-1, 100.5, math.nan])
def test_percentile_refuses_a_q_out_of_range(bad):
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        kit.percentile([1.0], bad)


def test_percentile_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="no values"):
        kit.percentile([], 50)


def test_summary_reports_in_its_unit():
    seconds = [0.001 * i for i in range(1, 101)]
    assert kit.summary(seconds, unit="ms", percentiles=(50, 90, 99)) == {
        "n": 100,
        "p50_ms": 50.0,
        "p90_ms": 90.0,
        "p99_ms": 99.0,
        "max_ms": 100.0,
        "mean_ms": 50.5,
    }
    assert kit.summary([2.0, 4.0], unit="s", percentiles=(99.9,)) == {
        "n": 2,
        "p99_9_s": 4.0,
        "max_s": 4.0,
        "mean_s": 3.0,
    }
    assert kit.summary([], unit="s") == {"n": 0}


def test_output_keys_are_snake_case():
    data_keys = {
        "cache@floor+pinned": {"POST pods/binding": 1.0},
        "kube-scheduler": [1, 2],
        "statuses": {"ConnectionResetError": 1, "connect:TimeoutError": 2, "401": 3},
    }
    kit.to_json({"pods_per_second": [1.0], "modes": data_keys})  # data keys keep their spelling
    with pytest.raises(ValueError, match=r"\$\.results\[0\]\.podsPerSecond"):
        kit.to_json({"results": [{"podsPerSecond": 1.0}]})
    for camel in ("p99Millis", "idleAgain", "pods_perSecond"):
        assert kit.camel_keys({camel: 1}) == [f"$.{camel}"]


def test_snake_keys_converts_the_products_wire_casing():
    wire = {"greedyExtraCost": 1, "greedyScaleUp": [{"nodePool": "a", "incrementBy": 2}]}
    assert kit.snake_keys(wire) == {
        "greedy_extra_cost": 1,
        "greedy_scale_up": [{"node_pool": "a", "increment_by": 2}],
    }
    assert not kit.camel_keys(kit.snake_keys(wire))


def _tree(script: Path) -> ast.Module:
    return ast.parse(script.read_text(), filename=str(script))


@pytest.mark.parametrize("script", PYTHON_SCRIPTS, ids=lambda p: p.name)
def test_no_script_edits_sys_path(script):
    """The scripts import the project and the test kit as installed (pyproject.toml)."""
    edits = [
        node.lineno
        for node in ast.walk(_tree(script))
        if isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    ]
    assert not edits, f"{script.name} touches sys.path on lines {edits}"
    loads_by_path = [
        node.lineno
        for node in ast.walk(_tree(script))
        if isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location"
    ]
    assert not loads_by_path, f"{script.name} loads a module by path on lines {loads_by_path}"


@pytest.mark.parametrize("script", BENCHES, ids=lambda p: p.name)
def test_every_benchmark_uses_the_kit(script):
    """It imports ``testkit.bench`` as ``kit``, builds its parser with ``kit.command`` (no
    parser of its own), prints its JSON with ``kit.emit`` and exits through ``kit.main``."""
    tree = _tree(script)
    imports_kit = any(
        isinstance(node, ast.ImportFrom)
        and node.module == "testkit"
        and any(a.name == "bench" and a.asname == "kit" for a in node.names)
        for node in tree.body
    )
    assert imports_kit, f"{script.name}: no `from testkit import bench as kit`"
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "kit"
    }
    assert {"command", "emit", "main"} <= used, f"{script.name} uses only kit.{sorted(used)}"
    own = [
        node.lineno
        for node in ast.walk(tree)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "ArgumentParser"
        )
        or (isinstance(node, ast.Attribute) and node.attr == "ArgumentParser")
    ]
    assert not own, f"{script.name} builds a parser of its own on lines {own}"


def test_main_turns_a_bench_error_into_one_line_and_exit_1(capsys):
    def run() -> int:
        raise kit.BenchError("pgbench is not installed (scripts/setup installs it)")

    with pytest.raises(SystemExit) as exited:
        kit.main(run, name="bench_x")
    assert exited.value.code == 1
    assert (
        capsys.readouterr().err == "bench_x: pgbench is not installed (scripts/setup installs it)\n"
    )


@pytest.mark.parametrize(("returned", "code"), [(None, 0), (0, 0), (1, 1), (3, 3)])
def test_main_exits_with_what_the_benchmark_returns(returned, code):
    with pytest.raises(SystemExit) as exited:
        kit.main(lambda: returned)
    assert exited.value.code == code


def test_main_stops_what_the_benchmark_started_on_sigterm_and_says_so_in_one_line(capsys):
    """``timeout`` or a cancelled CI job sends SIGTERM: the benchmark's ``finally`` blocks
    run (they stop its control plane, extenders, guests), even when one of them fails in turn,
    and the command ends as an interrupt does."""
    stopped = []

    def run() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # interrupted before this ends
            return 0
        finally:
            stopped.append(True)
            raise TimeoutError("the control plane got the signal too")

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exited:
        kit.main(run, name="bench_x")
    assert exited.value.code == 130
    assert stopped == [True]
    assert capsys.readouterr().err == "bench_x: interrupted; everything it started is stopped\n"
    assert signal.getsignal(signal.SIGTERM) is before
