"""The simulator's output reads without the source: the table has a key for every column and
abbreviation, a scenario says what to expect, and the plot shows pending VMs, denials, node
capacity in cores, every node, and says when VMs were left out."""

from __future__ import annotations

import math

import msgspec
import pytest

from simulator.builtin import default_scenario
from simulator.engine import simulate
from simulator.report import Report, format_table
from tests.simulator.helpers import library, vm


@pytest.fixture(scope="module")
def default_report() -> Report:
    return simulate(default_scenario())


@pytest.fixture(scope="module")
def contention_report() -> Report:
    return simulate(library("contention"))


def test_every_column_and_abbreviation_has_a_key(default_report):
    table = format_table(default_report)
    headers = [line for line in table.splitlines() if line.startswith(("vm ", "node "))]
    keyed = table[table.index("key:") :]
    for header in headers:
        for column in header.split("(")[0].split():
            if column not in ("vm", "node", "pool/zone"):
                assert column in keyed, f"column {column!r} has no key"
    for term in ("MIN..MAX=END", "shrk", "errs", "over-target", "deny", "deleted"):
        assert term in table, term
    assert "skipped while settled: a VM whose load cannot change its size" in table


def test_the_scenario_says_its_denials_are_the_point(contention_report):
    assert vm(contention_report, "vm-a").denials > 0
    table = format_table(contention_report)
    assert "the many denials in the table are the point of this scenario" in " ".join(table.split())
    assert "OK (every invariant held)" in table


def test_series_count_pending_vms_and_denials(default_report, contention_report):
    analytics = vm(default_report, "analytics")
    assert analytics.placed_at_seconds is not None and analytics.placed_at_seconds > 0
    series = default_report.series
    waiting = [
        n
        for t, n in zip(series.times_seconds, series.pending_vms, strict=True)
        if 0 < t < analytics.placed_at_seconds - 60
    ]
    assert max(waiting) >= 1  # analytics waited for the recommender's node
    vm_a = next(v for v in contention_report.series.vms if v.name == "vm-a")
    assert vm_a.denials == sorted(vm_a.denials)  # a running count
    assert vm_a.denials[-1] <= vm(contention_report, "vm-a").denials
    assert vm_a.denials[-1] > 0


matplotlib = pytest.importorskip("matplotlib")  # the plot extra; scripts/setup installs it


def _figure(report: Report):
    from simulator.plot import build_figure

    return build_figure(report)


def _axes_titled(fig, start: str):
    return next(ax for ax in fig.axes if ax.get_title(loc="left").startswith(start))


def test_a_pending_vm_is_not_drawn_at_zero(default_report):
    fig = _figure(default_report)
    ax = _axes_titled(fig, "analytics")
    line = next(li for li in ax.get_lines() if li.get_label() == "vCPUs (while it runs)")
    placed = vm(default_report, "analytics").placed_at_seconds
    for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
        if x * 60 < placed:
            assert math.isnan(y), (x, y)
    assert any(p.get_label() == "pending: waiting for a node" for p in ax.patches)
    pending = _axes_titled(fig, "VMs waiting for a node")
    assert max(pending.get_lines()[0].get_ydata()) >= 1


def test_denials_are_marked(contention_report):
    fig = _figure(contention_report)
    ax = _axes_titled(fig, "vm-a")
    marks = [c for c in ax.collections if c.get_label().startswith("permit denied")]
    assert marks and len(marks[0].get_offsets()) > 0


def test_nodes_in_cores_and_identical_nodes_share_a_named_line(default_report):
    nodes = default_report.series.nodes
    twin = msgspec.structs.replace(nodes[0], name="twin-of-" + nodes[0].name)
    report = msgspec.structs.replace(
        default_report,
        series=msgspec.structs.replace(default_report.series, nodes=[*nodes, twin]),
    )
    ax = _axes_titled(_figure(report), "reserved cores per node")
    assert ax.get_ylabel() == "cores"
    labels = [li.get_label() for li in ax.get_lines() if not li.get_label().startswith("_")]
    assert f"{nodes[0].name}, twin-of-{nodes[0].name} (identical)" in labels
    usable = nodes[0].usable_millis / 1000
    assert any(f"usable: {usable:g} cores" in t.get_text() for t in ax.texts)


def test_the_title_says_when_vms_are_left_out(default_report):
    fig = _figure(default_report)
    shown, total = len(default_report.series.vms), len(default_report.vms)
    assert shown < total
    assert f"showing {shown} of {total} VMs" in fig.get_suptitle()
