"""A run split over processes by node, for a scenario whose nodes share nothing.

The same ``Report``, byte for byte, as ``engine.simulate``: only sooner, on more cores. A
scenario splits when every VM starts bound to its node and nothing crosses nodes: no foreign
pods, no scenario events, no node pools (so no recommender, no placements), no namespace
quotas, and full checks on an interval (``timing.check_interval_seconds``). Then what happens
on one node depends on that node alone: its VMs' agents, their permit batches to the node's
ledger entry, their traces and jitter (seeded by each VM's place in the scenario, not in the
part). Each part is a contiguous run of the scenario's nodes and is simulated with
``Simulation(only_nodes=...)``; the first part runs in this process, the others in forked ones,
and the reports are joined:

* the VMs in the scenario's order, the nodes by name, the counters summed (the events at
  which every part samples the plot counted once; full checks once per check interval that
  had events in any part, as the whole run counts them);
* the plotted series: every part samples at the same times; each plotted VM's series from
  its part, the first nodes' from the first part (which holds the first nodes);
* the log in time order. Within one instant the whole run logs in the order its events were
  queued, which interleaves nodes; if two parts logged at the same instant, that order is not
  known here, and a run that broke an invariant stops where the whole would not: in both
  cases the scenario is simulated again, whole, in this process.

Runs the real cores, unchanged; what this module adds is processes and the join, no decision.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Final

import msgspec

from simulator import scenario as sc
from simulator.engine import MAX_LOG, Simulation, simulate
from simulator.measurements import MAX_PLOTTED
from simulator.report import Counters, Report, Series

# Fewer nodes than this per part: not worth a process (and the first part must hold the
# plotted nodes).
MIN_NODES_PER_PART: Final = MAX_PLOTTED


class _Part(msgspec.Struct, frozen=True):
    """What one part sends back: its report and the check intervals that had events."""

    report: Report
    check_cells: list[int]


def node_parts(scenario: sc.Scenario, parts: int) -> list[list[str]] | None:
    """The scenario's nodes in ``parts`` contiguous runs of about equal VMs, or None if the
    scenario does not split (see the module docstring) or is too small to."""
    if (
        parts < 2
        or scenario.foreign_pods
        or scenario.events
        or scenario.node_pools
        or scenario.quotas
        or scenario.relief is not None  # moves cross nodes
        or scenario.timing.check_interval_seconds <= 0
        or any(v.node is None for v in scenario.vms)
    ):
        return None
    names = [n.name for n in scenario.nodes]
    parts = min(parts, len(names) // MIN_NODES_PER_PART)
    if parts < 2:
        return None
    vms_on: dict[str, int] = dict.fromkeys(names, 0)
    for v in scenario.vms:
        if v.node not in vms_on:
            return None  # bound to a node the scenario does not have: the whole run says so
        vms_on[v.node] += 1
    total = len(scenario.vms)
    out: list[list[str]] = [[]]
    seen = 0
    for name in names:
        if len(out) < parts and seen >= total * len(out) / parts and len(out[-1]) > 0:
            out.append([])
        out[-1].append(name)
        seen += vms_on[name]
    if len(out) < 2 or min(len(p) for p in out) < MIN_NODES_PER_PART:
        return None
    return out


def _run_part(scenario: sc.Scenario, nodes: Sequence[str]) -> _Part:
    sim = Simulation(scenario, only_nodes=nodes)
    report = sim.run()
    return _Part(report=report, check_cells=sim.check_cells)


def _child(scenario: sc.Scenario, nodes: Sequence[str], conn: Connection) -> None:
    # Pickled, not msgpack: a float field that holds an int (a time from the trace) stays an
    # int, and the report's JSON stays byte for byte what the whole run writes.
    conn.send(_run_part(scenario, nodes))
    conn.close()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a run goes (and in the parts forked then).

    A run makes almost no cyclic garbage (its records refer to each other, and live as long as
    it does): a 1,000-node hour left 550 objects for the collector. But the collector's passes
    over the older generations visit every live record, millions at fleet size: a quarter of
    the run's time at 5,000 nodes. Reference counting still frees everything else at once."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def simulate_split(scenario: sc.Scenario, *, parts: int | None = None) -> Report:
    """``engine.simulate(scenario)``, in ``parts`` processes (default: one per CPU this
    process may use) when the scenario splits; else in this one. Either way with the garbage
    collector paused (``_collector_paused``)."""
    if parts is None:
        parts = len(os.sched_getaffinity(0))
    with _collector_paused():
        split = node_parts(scenario, parts)
        if split is None:
            return simulate(scenario)
        return _simulate_parts(scenario, split)


def _simulate_parts(scenario: sc.Scenario, split: list[list[str]]) -> Report:
    # Forked: the children share the parsed scenario and import nothing again.
    ctx = multiprocessing.get_context("fork")
    children = []
    for nodes in split[1:]:
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(scenario, nodes, send), daemon=True)
        proc.start()
        send.close()
        children.append((proc, receive))
    try:
        results = [_run_part(scenario, split[0])]
        for proc, receive in children:
            results.append(receive.recv())
            proc.join()
    finally:
        for proc, receive in children:
            receive.close()
            if proc.is_alive():
                proc.kill()
                proc.join()
    joined = join_parts(scenario, split, results)
    return joined if joined is not None else simulate(scenario)


def join_parts(
    scenario: sc.Scenario, split: Sequence[Sequence[str]], results: Sequence[_Part]
) -> Report | None:
    """The whole run's report from its parts', or None where that cannot be told (see the
    module docstring)."""
    reports = [r.report for r in results]
    if any(r.violation is not None for r in reports):
        return None
    # The log: parts' entries in time order; two parts at one instant is an unknown order.
    entries = sorted(
        ((e.at_seconds, i, k, e) for i, r in enumerate(reports) for k, e in enumerate(r.log)),
        key=lambda x: (x[0], x[1], x[2]),
    )
    for a, b in itertools.pairwise(entries):
        if a[0] == b[0] and a[1] != b[1]:
            return None
    first = reports[0]
    log = [e for _, _, _, e in entries][:MAX_LOG]
    # The VMs in the scenario's order: each part holds its nodes' VMs in that order.
    part_of = {name: i for i, nodes in enumerate(split) for name in nodes}
    cursors = [iter(r.vms) for r in reports]
    vms = [next(cursors[part_of[v.node]]) for v in scenario.vms if v.node is not None]
    nodes = sorted((n for r in reports for n in r.nodes), key=lambda n: n.name)
    samples = len(first.series.times_seconds)
    counts = {f: sum(getattr(r.counters, f) for r in reports) for f in Counters.__struct_fields__}
    counts["events"] -= (len(reports) - 1) * samples  # every part samples the plot
    cells = {c for r in results for c in r.check_cells}
    counts["full_checks"] = max(1, len(cells))
    series_vms = {s.name: s for r in reports for s in r.series.vms}
    names = scenario.plot_vms or sorted(v.name for v in scenario.vms)
    series = Series(
        times_seconds=first.series.times_seconds,
        vms=[series_vms[n] for n in names[:MAX_PLOTTED]],
        pending_vms=[sum(p) for p in zip(*(r.series.pending_vms for r in reports), strict=True)],
        nodes=[n for r in reports for n in r.series.nodes][:MAX_PLOTTED],
    )
    return msgspec.structs.replace(
        first,
        counters=Counters(**counts),
        vms=vms,
        nodes=nodes,
        pending_at_end=sorted(n for r in reports for n in r.pending_at_end),
        recommendations=[x for r in reports for x in r.recommendations],
        log=log,
        series=series,
    )
