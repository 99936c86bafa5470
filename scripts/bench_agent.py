"""Benchmark: one agent managing many VMs; load step -> resize latency and agent CPU per tick.

The agent (supervisor, VM loops, scraper, batched extender client) runs in this process with
emulated in-memory hypervisors. The fakes it talks to over loopback HTTP (a synthetic
node_exporter per VM, and the fake extender unless ``--extender-url`` is given) run in a child
process, so that the CPU measured here is the agent's alone.

    .venv/bin/python scripts/bench_agent.py [--vms 200] [--interval 1.0] [--extender-url URL]

Prints one JSON object. Targets: p95 step->resize <= interval + 200 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from autoscaler_agent.core import CoreConfig
from autoscaler_agent.discovery import VmTarget
from autoscaler_agent.extender_client import ExtenderClient, PermitBatcher, TokenFile
from autoscaler_agent.metrics import AgentMetrics
from autoscaler_agent.runner import RunnerDeps, Supervisor, VmLoops
from protocol.annotations import VmSpec
from testkit import bench as kit
from testkit.agent_fakes import FakeExtender, FakeHypervisor, SyntheticMetrics
from testkit.ports import free_port

NODE = "bench-node"
GiB = 2**30


async def serve_fakes(ext_port: int, metrics_port: int, capacity: int) -> None:
    """Child process: the fake extender and the synthetic metrics, plus POST /loads to step."""
    extender = FakeExtender(node=NODE, capacity_vcpus=capacity)
    metrics = SyntheticMetrics()
    mapp = metrics.app()

    async def set_loads(request: web.Request) -> web.Response:
        metrics.loads.update(await request.json())
        return web.Response(text="ok")

    mapp.router.add_post("/loads", set_loads)
    runners = []
    for app, port in ((extender.app(), ext_port), (mapp, metrics_port)):
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    await asyncio.Event().wait()


async def wait_reachable(url: str) -> None:
    async with aiohttp.ClientSession() as s, asyncio.timeout(10):
        while True:
            try:
                async with s.get(url):
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)


async def bench(args: argparse.Namespace) -> dict[str, object]:
    metrics_port = free_port()
    metrics_base = f"http://127.0.0.1:{metrics_port}"
    ext_port = free_port()
    extender_url = args.extender_url or f"http://127.0.0.1:{ext_port}"
    # Popen only forks; the fakes then serve on their own until killed below.
    child = subprocess.Popen(  # noqa: ASYNC220
        [
            sys.executable,
            __file__,
            "--serve-fakes",
            f"{ext_port},{metrics_port},{args.vms * 8}",
        ],
    )
    try:
        await wait_reachable(f"{metrics_base}/vm/x/metrics")
        return await run_agent(args, extender_url, metrics_base)
    finally:
        # Killed: the fakes have nothing to clean up, and a SIGTERM would reach them as
        # kit.main's interrupt (they run through it too), which on a loaded machine once kept
        # the child past this wait, holding the bench's output open.
        child.kill()
        child.wait(timeout=5)


async def run_agent(
    args: argparse.Namespace, extender_url: str, metrics_base: str
) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    hypervisors: dict[str, FakeHypervisor] = {}
    targets: dict[str, VmTarget] = {}
    for i in range(args.vms):
        name = f"vm-{i:04d}"
        t = VmTarget(
            namespace="bench",
            name=name,
            uid=f"uid-{i}",
            node=NODE,
            spec=VmSpec(min_vcpus=1, max_vcpus=8, min_memory_bytes=GiB, max_memory_bytes=GiB),
            hypervisor_url=f"qmp:///run/{name}.sock",
            metrics_url=f"{metrics_base}/vm/{name}/metrics",
        )
        targets[t.key] = t
        # A hot-plug takes a few ms of the hypervisor's time in reality.
        hypervisors[t.key] = FakeHypervisor(current=2, max_vcpus=8, resize_seconds=0.005)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as session:
        client = ExtenderClient(
            session,
            base_url=extender_url,
            node=NODE,
            token=TokenFile(Path(args.token_file) if args.token_file else None),
            timeout_seconds=2.0,
        )
        batcher = PermitBatcher(client, window_seconds=0.005)
        registry = CollectorRegistry()
        metrics = AgentMetrics(registry)
        deps = RunnerDeps(
            core=CoreConfig(scrape_interval_seconds=args.interval),
            node=NODE,
            session=session,
            permits=batcher,
            hypervisor_for=lambda t: hypervisors[t.key],
            metrics=metrics,
            scrape_timeout_seconds=min(0.8, args.interval),
            rng=random.Random(1),
        )
        loops = VmLoops(deps)
        sup = Supervisor(loops.run, node=NODE, metrics=metrics, update_vm=loops.update)
        await sup.apply(targets)

        async def set_loads(value: float) -> None:
            body = {t.name: value for t in targets.values()}
            async with session.post(f"{metrics_base}/loads", json=body) as r:
                r.raise_for_status()

        await set_loads(0.5)
        await asyncio.sleep(args.interval * 3)  # warm up: every VM read, scraped, steady

        # Steady state: CPU of the agent per VM per tick.
        ticks = args.steady_ticks
        cpu0, wall0 = time.process_time(), loop.time()
        await asyncio.sleep(args.interval * ticks)
        cpu_steady = time.process_time() - cpu0
        wall_steady = loop.time() - wall0

        # Load step for every VM at once: 2 -> 6 vCPUs each (the worst case: all at once).
        # Each loop starts at its own offset in the interval (a hash of its uid), so the step
        # lands at a different place in each VM's interval and their scrapes, permit requests
        # and resizes spread over it. The synthetic exporter serves load1 only, so the policy
        # grows on the first scrape after the step: this measures the agent's own latency,
        # not grow_after_seconds (the simulator tests show the policy's reaction time).
        await asyncio.sleep(args.interval * args.step_phase)
        await set_loads(5.0)
        stepped_at = loop.time()
        batches_before = batcher.batches_sent
        cpu1 = time.process_time()
        deadline = stepped_at + args.interval * 5
        # Polling is fine here: 10 ms is below the resolution we report, and cheap.
        while loop.time() < deadline and any(  # noqa: ASYNC110
            h.current != 6 for h in hypervisors.values()
        ):
            await asyncio.sleep(0.01)
        cpu_step = time.process_time() - cpu1
        latencies = [
            h.resized_at[-1][0] - stepped_at
            for h in hypervisors.values()
            if h.resized_at and h.current == 6
        ]
        batches = batcher.batches_sent - batches_before
        await sup.close()
        await batcher.close()

    target_s = args.interval + 0.2
    step = kit.summary(latencies, unit="s", percentiles=(50, 95), digits=4)
    return {
        "vms": args.vms,
        "scrape_interval_seconds": args.interval,
        "extender": "real" if args.extender_url else "fake",
        "resized_vms": len(latencies),
        "step_to_resize_seconds": step,
        "target_seconds": target_s,
        "meets_target_p95": bool(latencies) and step["p95_s"] <= target_s,
        "permit_batches_for_step": batches,
        "steady_cpu_seconds_per_vm_per_tick": round(cpu_steady / (args.vms * ticks), 7),
        "steady_cpu_fraction_of_one_core": round(cpu_steady / wall_steady, 4),
        "step_cpu_seconds_total": round(cpu_step, 4),
    }


def main() -> None:
    p = kit.command(__doc__)
    p.add_argument("--vms", type=int, default=200, help="VMs managed by the one agent")
    p.add_argument("--interval", type=float, default=1.0, help="scrape interval, seconds")
    p.add_argument(
        "--step-phase",
        type=float,
        default=0.0,
        help="when to step the load, in intervals after the warm-up (VMs are staggered)",
    )
    p.add_argument("--steady-ticks", type=int, default=5, help="ticks measured for CPU")
    p.add_argument(
        "--extender-url",
        default=None,
        help="a real extender's permit port (default: start the fake one)",
    )
    p.add_argument("--token-file", default=None, help="bearer token for --extender-url")
    p.add_argument("--serve-fakes", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_fakes:
        ext_port, metrics_port, capacity = (int(x) for x in args.serve_fakes.split(","))
        asyncio.run(serve_fakes(ext_port, metrics_port, capacity))
        return
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    kit.emit(asyncio.run(bench(args)))


if __name__ == "__main__":
    kit.main(main)
