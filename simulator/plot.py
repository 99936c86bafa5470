"""The PNG a user opens after a run: vCPUs against load per VM, node reservations, decisions.

Shell: draws from a finished ``Report`` (its ``series``) and writes a file. matplotlib is the
optional ``plot`` extra; ``is_available()`` says whether it is installed, and it is imported
only here, with the non-interactive Agg backend (no display needed).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.report import Report

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def is_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(report: Report, path: Path) -> None:
    # Imported here, not at the top: matplotlib is an optional extra and slow to import.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    series = report.series
    times = [t / 60 for t in series.times_seconds]
    vms = series.vms
    cols = 2
    rows = max(1, math.ceil(len(vms) / cols))
    fig = plt.figure(figsize=(14, 3.0 * rows + 3.6), layout="constrained")
    grid = fig.add_gridspec(rows + 1, cols, height_ratios=[1.0] * rows + [1.2])
    marks = _marks(report)
    for i, vm in enumerate(vms):
        ax = fig.add_subplot(grid[i // cols, i % cols])
        ax.fill_between(times, vm.demand_vcpus, step="post", alpha=0.18, color="tab:orange")
        ax.step(times, vm.demand_vcpus, where="post", color="tab:orange", lw=1, label="demand")
        ax.plot(times, vm.load1, color="tab:red", lw=1.2, label="load1 (what the agent sees)")
        ax.step(times, vm.permit_vcpus, where="post", color="tab:green", lw=1, ls="--",
                label="permit")  # fmt: skip
        ax.step(times, vm.vcpus, where="post", color="tab:blue", lw=2, label="vCPUs")
        summary = next((s for s in report.vms if s.name == vm.name), None)
        title = vm.name
        if summary is not None:
            title += (
                f"  ({summary.min_vcpus}..{summary.max_vcpus} vCPUs on {summary.node or '-'},"
                f" {summary.grows} grows, {summary.shrinks} shrinks, {summary.denials} denials)"
            )
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_ylabel("vCPUs")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        _draw_marks(ax, marks)
        if i == 0:
            fig.legend(loc="outside upper right", fontsize=8, ncols=4)
    ax = fig.add_subplot(grid[rows, :])
    for node in series.nodes:
        used = [
            (r / node.usable_millis * 100) if r >= 0 else math.nan for r in node.reserved_millis
        ]
        ax.step(times, used, where="post", lw=1.5, label=node.name)
    ax.axhline(100, color="black", lw=1, ls=":")
    ax.set_ylabel("reserved, % of usable cpu")
    ax.set_xlabel("minutes")
    ax.set_ylim(0, 110)
    ax.grid(alpha=0.3)
    ax.set_title(
        "node reservations as the ledger sees them (gaps: extender down). Lines: purple ="
        " recommendation, black = extender restart, gray = VM deleted, brown = hypervisor failing",
        fontsize=10,
        loc="left",
    )
    _draw_marks(ax, marks, labels=True)
    ax.legend(fontsize=8, loc="lower right", ncols=4)
    status = (
        "OK" if report.is_ok else f"VIOLATION: {report.violation and report.violation.invariant}"
    )
    fig.suptitle(f"simulation '{report.scenario}' (seed {report.seed}): {status}", fontsize=12)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _marks(report: Report) -> list[tuple[float, str, str]]:
    out = [(r.at_seconds / 60, "tab:purple", "recommend") for r in report.recommendations]
    for e in report.log:
        if e.kind == "extender_killed":
            out.append((e.at_seconds / 60, "black", "restart"))
        elif e.kind == "deleted":
            out.append((e.at_seconds / 60, "tab:gray", f"delete {e.subject}"))
        elif e.kind == "hypervisor_failing":
            out.append((e.at_seconds / 60, "tab:brown", f"hv fail {e.subject}"))
    return out


def _draw_marks(ax: Axes, marks: list[tuple[float, str, str]], *, labels: bool = False) -> None:
    for x, color, text in marks:
        ax.axvline(x, color=color, lw=0.8, ls="-" if text == "recommend" else "--", alpha=0.7)
        if labels:
            ax.text(x, 104, f" {text}", fontsize=7, color=color, va="bottom", rotation=0)
