"""Benchmark (not a test): the simulator at fleet scale.

1,000 nodes and 20,000 VMs for one simulated hour, the agents scraping every 5 s (720 ticks),
every VM with its own seeded load trace: most change level a few times an hour, some ramp up
and down, some follow a slow sine (quantised to 60 s steps). The VMs start bound to their
nodes (a running fleet), so what is measured is the autoscaling hour, not 20,000 placements.

Prints one JSON object: wall time per simulated tick and per VM-tick, the work counters, and
whether every invariant held. ``--profile`` adds the top functions by own time (of this
process: with ``--parts`` above 1, of the first part and the join).

The fleet's nodes share nothing, so the run is split by node over ``--parts`` processes
(``simulator.split``; by default one per CPU this process may use): the report is byte for
byte the one a single process writes. The run's wall time counts the split, the forks and
the join.

    .venv/bin/python scripts/bench_simulator.py [--nodes N] [--vms N] [--seconds S]
        [--parts N] [--profile]
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import resource
import time

from simulator.fleet import TICK_SECONDS, fleet
from simulator.split import node_parts, simulate_split
from testkit import bench as kit


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that ended (the run's other parts)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _peak_rss_mib(who: int) -> float:
    """The peak resident set of this process (``RUSAGE_SELF``) or of its largest child that
    ended (``RUSAGE_CHILDREN``: a part run in a process of its own), in MiB."""
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)  # Linux: ru_maxrss in KiB


def main() -> int:
    parser = kit.command(__doc__)
    parser.add_argument("--nodes", type=int, default=1000, help="nodes in the fleet (1000)")
    parser.add_argument(
        "--vms", type=int, default=20_000, help="VMs, spread over the nodes (20000)"
    )
    parser.add_argument(
        "--seconds", type=float, default=3600.0, help="simulated seconds to run (3600)"
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the VMs' load traces and jitter (1)"
    )
    parser.add_argument(
        "--parts",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="processes to split the run over by node (one per usable CPU); 1: one process",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run under cProfile and add the top functions by cumulative time to the JSON",
    )
    args = parser.parse_args()

    started = time.perf_counter()
    scenario = fleet(args.nodes, args.vms, args.seconds, args.seed)
    split = node_parts(scenario, args.parts)
    setup = time.perf_counter() - started
    profiler = cProfile.Profile() if args.profile else None
    started = time.perf_counter()
    cpu_started = _cpu_seconds()
    if profiler is not None:
        profiler.enable()
    report = simulate_split(scenario, parts=args.parts)
    if profiler is not None:
        profiler.disable()
    wall = time.perf_counter() - started
    cpu = _cpu_seconds() - cpu_started

    ticks = args.seconds / TICK_SECONDS
    c = report.counters
    result: dict[str, object] = {
        "nodes": args.nodes,
        "vms": args.vms,
        "simulated_seconds": args.seconds,
        "tick_seconds": TICK_SECONDS,
        "ticks": int(ticks),
        "vm_ticks": int(ticks * args.vms),
        "parts": len(split) if split is not None else 1,
        "setup_wall_seconds": round(setup, 2),
        "run_wall_seconds": round(wall, 2),
        # This machine is shared: CPU time (of every part) says what the run cost, wall time
        # what it took.
        "run_cpu_seconds": round(cpu, 2),
        "wall_ms_per_tick": round(wall / ticks * 1e3, 2),
        "wall_us_per_vm_tick": round(wall / ticks / args.vms * 1e6, 3),
        "is_under_a_minute": setup + wall < 60,
        "is_ok": report.is_ok,
        "violation": report.violation.message if report.violation else None,
        "events": c.events,
        "scrapes": c.scrapes,
        "scrapes_skipped": c.scrapes_skipped,
        "permit_requests": c.permit_requests,
        "permit_batches": c.permit_batches,
        "permit_batches_repeated": c.permit_batches_repeated,
        "resizes": c.resizes,
        "denials": sum(v.denials for v in report.vms),
        "full_checks": c.full_checks,
        "overcommit_seconds": sum(n.overcommit_seconds for n in report.nodes),
        "peak_rss_mib": _peak_rss_mib(resource.RUSAGE_SELF),
        "peak_rss_child_mib": _peak_rss_mib(resource.RUSAGE_CHILDREN),
    }
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(18)
        result["profile_top_by_own_time"] = [
            line.strip() for line in out.getvalue().splitlines() if "(" in line and "/" in line
        ]
    kit.emit(result)
    return 0 if report.is_ok else 1


if __name__ == "__main__":
    kit.main(main)
