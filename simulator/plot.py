"""The PNG a user opens after a run: vCPUs against load per VM, node reservations, decisions.

Shell: draws from a finished ``Report`` (its ``series``) and writes a file. matplotlib is the
optional ``plot`` extra; ``is_available()`` says whether it is installed, and it is imported
only here, with the non-interactive Agg backend (no display needed).

Made to be read without the source: a VM is drawn only while it runs (a pending VM is not a VM
at 0 vCPUs: the bottom panel counts the VMs waiting for a node), permit denials are marked
where they happen, nodes are drawn in cores against their own usable capacity, nodes whose
series are identical share one line named after all of them (so none hides another), event
labels are staggered, and the title says when VMs were left out of the plot.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.report import NodeSeries, Report, VmSeries, VmSummary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_MARK_COLORS = {
    "recommend": "tab:purple",
    "restart": "black",
    "delete": "tab:gray",
    "hv fail": "tab:brown",
    "node joined": "tab:cyan",
}


def is_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(report: Report, path: Path) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415 (optional; build_figure chose Agg)

    fig = build_figure(report)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_figure(report: Report) -> Figure:
    """The whole figure, not yet written (tests look at what it draws)."""
    # Imported here, not at the top: matplotlib is an optional extra and slow to import.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    series = report.series
    times = [t / 60 for t in series.times_seconds]
    vms = series.vms
    summaries = {s.name: s for s in report.vms}
    created_at: dict[str, float] = {}
    for e in report.log:
        if e.kind == "created":
            created_at.setdefault(e.subject, e.at_seconds)
    cols = 2
    rows = max(1, math.ceil(len(vms) / cols))
    # Runs with a VM whose memory scales get a panel of the nodes' memory too.
    has_memory = any(n.reserved_memory_bytes is not None for n in series.nodes)
    extra = [1.3] if has_memory else []
    fig = plt.figure(figsize=(14, 3.0 * rows + 6.0 + 2.5 * len(extra)), layout="constrained")
    grid = fig.add_gridspec(
        rows + 2 + len(extra), cols, height_ratios=[1.0] * rows + [1.3, *extra, 0.7]
    )
    marks = _marks(report)
    legend: dict[str, Any] = {}
    for i, vm in enumerate(vms):
        ax = fig.add_subplot(grid[i // cols, i % cols])
        created = created_at.get(vm.name, 0.0)
        _draw_vm(
            ax, times, series.times_seconds, vm, summary=summaries.get(vm.name), created_at=created
        )
        _draw_marks(ax, marks)
        axes = [ax]
        if vm.memory_bytes is not None:
            axes.append(_draw_vm_memory(ax, times, series.times_seconds, vm))
        for each in axes:
            for handle, label in zip(*each.get_legend_handles_labels(), strict=True):
                legend.setdefault(label, handle)  # each kind of line once, from any VM
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="outside lower center", fontsize=8,
                   ncols=min(6, len(legend)))  # fmt: skip
    nodes_ax = fig.add_subplot(grid[rows, :])
    _draw_nodes(nodes_ax, times, series.nodes)
    _draw_marks(nodes_ax, marks, labels=True)
    if has_memory:
        memory_ax = fig.add_subplot(grid[rows + 1, :], sharex=nodes_ax)
        _draw_nodes_memory(memory_ax, times, series.nodes)
        _draw_marks(memory_ax, marks)
    pending_ax = fig.add_subplot(grid[rows + 1 + len(extra), :], sharex=nodes_ax)
    _draw_pending(pending_ax, times, series.pending_vms)
    _draw_marks(pending_ax, marks)
    status = (
        "OK: every invariant held"
        if report.is_ok
        else f"VIOLATION: {report.violation and report.violation.invariant}"
    )
    title = f"simulation '{report.scenario}' (seed {report.seed}): {status}"
    if len(vms) < len(report.vms):
        title += (
            f"\nshowing {len(vms)} of {len(report.vms)} VMs (the scenario's plot_vms picks"
            " which); the summary table and the JSON report have them all"
        )
    fig.suptitle(title, fontsize=12)
    return fig


def _draw_vm(
    ax: Axes,
    minutes: list[float],
    seconds: list[float],
    vm: VmSeries,
    *,
    summary: VmSummary | None,
    created_at: float,
) -> None:
    placed = summary.placed_at_seconds if summary is not None else 0.0
    deleted = summary.deleted_at_seconds if summary is not None else None

    def runs(t: float) -> bool:
        return placed is not None and t >= placed and (deleted is None or t < deleted)

    def only_running(values: list[float] | list[int]) -> list[float]:
        return [float(v) if runs(t) else math.nan for t, v in zip(seconds, values, strict=True)]

    ax.fill_between(minutes, vm.demand_vcpus, step="post", alpha=0.18, color="tab:orange")
    ax.step(minutes, vm.demand_vcpus, where="post", color="tab:orange", lw=1, label="demand")
    ax.plot(minutes, only_running(vm.load1), color="tab:red", lw=1.2,
            label="load1 (what the agent sees)")  # fmt: skip
    # vCPUs wide underneath, permit thin and dashed on top: equal values stay visible.
    ax.step(minutes, only_running(vm.vcpus), where="post", color="tab:blue", lw=2.6,
            label="vCPUs (while it runs)")  # fmt: skip
    ax.step(minutes, only_running(vm.permit_vcpus), where="post", color="tab:green", lw=1,
            ls="--", label="permit")  # fmt: skip
    denied = [
        (minutes[i], vm.permit_vcpus[i])
        for i in range(1, len(vm.denials))
        if vm.denials[i] > vm.denials[i - 1]
    ]
    if denied:
        ax.scatter([d[0] for d in denied], [d[1] for d in denied], marker="x", color="black",
                   s=28, zorder=5, label="permit denied (granted < asked)")  # fmt: skip
    waited_until = placed if placed is not None else (deleted or seconds[-1] if seconds else 0.0)
    if waited_until > created_at:
        ax.axvspan(created_at / 60, waited_until / 60, color="tab:gray", alpha=0.2, lw=0,
                   label="pending: waiting for a node")  # fmt: skip
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


GIB = 2**30


def _draw_vm_memory(ax: Axes, minutes: list[float], seconds: list[float], vm: VmSeries) -> Axes:
    """A VM whose memory scales: its memory on a second axis (GiB), 0 while it does not run."""
    twin = ax.twinx()
    assert vm.memory_bytes is not None and vm.memory_used_bytes is not None
    assert vm.permit_memory_bytes is not None

    def gib(values: list[int]) -> list[float]:
        return [v / GIB if v > 0 else math.nan for v in values]

    twin.fill_between(minutes, [v / GIB for v in vm.memory_used_bytes], step="post",
                      alpha=0.15, color="tab:purple")  # fmt: skip
    twin.step(minutes, gib(vm.memory_used_bytes), where="post", color="tab:purple", lw=1,
              label="memory used by the guest (GiB)")  # fmt: skip
    twin.step(minutes, gib(vm.memory_bytes), where="post", color="tab:brown", lw=2.2,
              label="memory (GiB)")  # fmt: skip
    twin.step(minutes, gib(vm.permit_memory_bytes), where="post", color="tab:olive", lw=1,
              ls="--", label="memory permit (GiB)")  # fmt: skip
    twin.set_ylabel("GiB")
    twin.set_ylim(bottom=0)
    return twin


def _draw_nodes_memory(ax: Axes, minutes: list[float], nodes: list[NodeSeries]) -> None:
    """Reserved memory per node against its usable memory (GiB)."""
    top = 0.0
    for node in nodes:
        if node.reserved_memory_bytes is None:
            continue
        values = [r / GIB if r >= 0 else math.nan for r in node.reserved_memory_bytes]
        ax.step(minutes, values, where="post", lw=1.6, label=node.name)
        top = max(top, *(v for v in values if not math.isnan(v)), 0.0)
        if node.usable_memory_bytes is not None:
            usable = node.usable_memory_bytes / GIB
            ax.axhline(usable, color="black", lw=1, ls=":")
            ax.text(minutes[0] if minutes else 0, usable, f" usable: {usable:g} GiB ({node.name})",
                    fontsize=7, va="bottom")  # fmt: skip
            top = max(top, usable)
    ax.set_ylabel("GiB")
    ax.set_ylim(0, top * 1.15 if top else 1)
    ax.grid(alpha=0.3)
    ax.set_title("reserved memory per node as the extender's ledger sees it (dotted: usable)",
                 fontsize=10, loc="left")  # fmt: skip
    ax.legend(fontsize=7, loc="lower right", ncols=4)


def _draw_nodes(ax: Axes, minutes: list[float], nodes: list[NodeSeries]) -> None:
    """Reserved cores per node against its usable cores; identical nodes share one line."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for node in nodes:
        groups.setdefault(tuple(node.reserved_millis), []).append(node.name)
    top = 0.0
    for reserved, names in groups.items():
        cores = [r / 1000 if r >= 0 else math.nan for r in reserved]
        label = names[0] if len(names) == 1 else f"{', '.join(names)} (identical)"
        ax.step(minutes, cores, where="post", lw=1.6, label=label)
        top = max(top, *(c for c in cores if not math.isnan(c)), 0.0)
    # Usable cores, one dotted line per distinct value, named after its nodes.
    by_usable: dict[int, list[str]] = {}
    for node in nodes:
        by_usable.setdefault(node.usable_millis, []).append(node.name)
    for usable, names in sorted(by_usable.items()):
        who = "every node" if len(names) == len(nodes) else ", ".join(names)
        ax.axhline(usable / 1000, color="black", lw=1, ls=":")
        ax.text(minutes[0] if minutes else 0, usable / 1000, f" usable: {usable / 1000:g} cores"
                f" ({who})", fontsize=7, va="bottom")  # fmt: skip
        top = max(top, usable / 1000)
    ax.set_ylabel("cores")
    ax.set_ylim(0, top * 1.15 if top else 1)
    ax.grid(alpha=0.3)
    ax.set_title(
        "reserved cores per node as the extender's ledger sees them (dotted: usable cores;"
        " gaps: extender down)\nevent lines: purple recommendation, cyan node joined,"
        " black extender restart, gray VM deleted, brown hypervisor failing",
        fontsize=10,
        loc="left",
    )
    ax.legend(fontsize=7, loc="lower right", ncols=4)


def _draw_pending(ax: Axes, minutes: list[float], pending: list[int]) -> None:
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415 (matplotlib is optional)

    ax.step(minutes, pending, where="post", color="tab:gray", lw=1.6)
    ax.fill_between(minutes, pending, step="post", color="tab:gray", alpha=0.25)
    ax.set_ylabel("VMs")
    ax.set_xlabel("minutes")
    ax.set_ylim(0, max([*pending, 1]) + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.set_title("VMs waiting for a node (pending)", fontsize=10, loc="left")


def _marks(report: Report) -> list[tuple[float, str, str]]:
    out = [(r.at_seconds / 60, "recommend", "recommend") for r in report.recommendations]
    for e in report.log:
        if e.kind == "extender_killed":
            out.append((e.at_seconds / 60, "restart", "restart"))
        elif e.kind == "deleted":
            out.append((e.at_seconds / 60, "delete", f"delete {e.subject}"))
        elif e.kind == "hypervisor_failing":
            out.append((e.at_seconds / 60, "hv fail", f"hv fail {e.subject}"))
        elif e.kind == "node_joined":
            out.append((e.at_seconds / 60, "node joined", f"{e.subject} joined"))
    return sorted(out)


def _draw_marks(ax: Axes, marks: list[tuple[float, str, str]], *, labels: bool = False) -> None:
    for i, (x, kind, text) in enumerate(marks):
        color = _MARK_COLORS[kind]
        ax.axvline(x, color=color, lw=0.8, ls="-" if kind == "recommend" else "--", alpha=0.7)
        if labels:
            # Staggered heights (axes fraction), so labels of nearby events do not overlap.
            ax.text(x, 0.97 - 0.09 * (i % 4), f" {text}", fontsize=7, color=color, va="top",
                    transform=ax.get_xaxis_transform())  # fmt: skip
