"""The cluster path's samples and plot (``scripts/run-bench.sh`` without ``--local``).

    cluster_bench.py --state-url URL --agent-url URL --vm NS/NAME --node NODE \\
        --phase-file FILE --bench-log FILE --out DIR [--vcpu-mode online|hotplug]

run-bench.sh starts it beside pgbench, with the extender's ``/state`` and the VM's node's agent
``/metrics`` port-forwarded to loopback; it takes one ``Sample`` a second (the same as the local
bench's, ``testkit/bench_plot.py``) until SIGTERM, then writes ``DIR/bench.json`` (the samples)
and ``DIR/bench.png`` (the same plot as the local bench's) and prints ``==> plot DIR/bench.png``.
The phase is what run-bench.sh last wrote to ``--phase-file`` (idle, load, cool); the tps is
pgbench's last ``-P`` progress line in ``--bench-log`` while the load runs. A reading that fails
is a gap in the samples, not a reason to stop.

Shell: it reads and draws; the scaling decisions are the agent's.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from testkit import bench as kit
from testkit.bench_plot import Sample, plot
from testkit.local_stack import http_get, scrape, value

T = TypeVar("T")
_PROGRESS = re.compile(r"progress: ([\d.]+) s, ([\d.]+) tps")


def attempt(read: Callable[[], T]) -> T | None:
    try:
        return read()
    except (OSError, ValueError, KeyError, StopIteration):
        return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state-url", required=True, help="the extender's /state")
    p.add_argument("--agent-url", required=True, help="the VM's node's agent /metrics")
    p.add_argument("--vm", required=True, help="the VM pod, NAMESPACE/NAME")
    p.add_argument("--node", required=True, help="the VM's node")
    p.add_argument("--phase-file", type=Path, required=True, help="idle, load or cool")
    p.add_argument("--bench-log", type=Path, required=True, help="pgbench's output so far")
    p.add_argument("--out", type=Path, required=True, help="directory for bench.json, bench.png")
    p.add_argument(
        "--vcpu-mode",
        choices=["online", "hotplug"],
        default="online",
        help="the VM's hypervisor scheme: qmp+qga (online) or qmp (hotplug)",
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    return p.parse_args(argv)


def take_sample(t: float, args: argparse.Namespace) -> Sample:
    def node_and_reserved() -> tuple[float, float]:
        state: dict[str, Any] = json.loads(http_get(args.state_url))
        node = next(n for n in state["nodes"] if n["name"] == args.node)
        alloc = next(a for a in node.get("allocations") or () if a.get("pod") == args.vm)
        return node["free"]["cpuMillis"] / 1000, alloc["resources"]["cpuMillis"] / 1000

    def tps() -> float | None:
        found = _PROGRESS.findall(args.bench_log.read_text(errors="replace"))
        return float(found[-1][1]) if found else None

    phase = attempt(lambda: args.phase_file.read_text().strip()) or "idle"
    before = attempt(node_and_reserved)
    metrics = attempt(lambda: scrape(args.agent_url)) or {}
    after = attempt(node_and_reserved)

    def gauge(name: str) -> float | None:
        return value(metrics, f"vmautoscale_agent_vm_{name}", vm=args.vm)

    current = gauge("current_vcpus")
    return Sample(
        t=round(t, 2),
        phase=phase,
        burst=0 if phase == "idle" else 1,
        vcpus=None if current is None else int(current),
        online=gauge("online_vcpus"),
        reserved_before=before and before[1],
        reserved_after=after and after[1],
        agent_desired=gauge("desired_vcpus"),
        node_free_cpu=after and after[0],
        tps=attempt(tps) if phase == "load" else None,
        stuck=gauge("stuck"),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    samples: list[Sample] = []
    started = time.monotonic()
    while not stop.is_set():
        samples.append(take_sample(time.monotonic() - started, args))
        stop.wait(args.interval)
    # The end state too (run-bench.sh stops the sampler once the VM is back at its minimum).
    samples.append(take_sample(time.monotonic() - started, args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(
        kit.to_json({"vm": args.vm, "samples": [asdict(s) for s in samples]}, indent=1)
    )
    path = args.out / "bench.png"
    plot(samples, path, vm=args.vm, vcpu_mode=args.vcpu_mode, setting="cluster run-bench",
         client="a pod beside the VM")  # fmt: skip
    print(f"==> plot {path}, samples {args.out / 'bench.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
