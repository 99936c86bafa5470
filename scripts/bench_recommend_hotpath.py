"""Benchmark: do recommendations delay kube-scheduler's filter calls?

Starts the extender process (``serve --standalone``, a generated cluster of
``--nodes`` nodes with pods on them, logging at warning into a file), once per worker mode
(``recommender.worker: inline`` and ``process``), and for each measures, over real HTTP from
this process:

* ``idle``: filter calls one after another (a VM pod against ``--filter-nodes`` node names),
  nothing else running;
* ``busy``: the same filter calls while another client posts ``POST /v1/recommend`` back to
  back (the benchmark snapshot of ``testkit/recommender_snapshot.py``, which
  ``scripts/bench_recommender.py`` times, scaled to ``--pending`` pending pods, at
  ``--diagnostics``), so that a recommendation is always running;
* ``idle`` again, so that drift shows.

Prints one JSON object: per mode, the filter latency p50/p99/max in milliseconds for each phase,
the busy p99 over the idle p99 of the same server (``busy_to_idle_p99_ratio``, the figure that
matters), how many recommendations ran during the busy phase and their mean time as the client
saw it.

    .venv/bin/python scripts/bench_recommend_hotpath.py [--pending 1000] [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import yaml

from testkit import bench as kit
from testkit.controlplane import Extender
from testkit.ports import free_port
from testkit.recommender_snapshot import generate


def cluster(nodes: int) -> dict[str, Any]:
    """Nodes of 16 cpu with two VMs each (ours), so that filter has work to do."""
    out: dict[str, Any] = {"nodes": [], "pods": []}
    for i in range(nodes):
        name = f"node-{i:04d}"
        out["nodes"].append({"name": name, "cpu": "16", "memory": "64Gi", "labels": {}})
        for j in range(2):
            out["pods"].append(
                {
                    "namespace": "vms",
                    "name": f"{name}-vm{j}",
                    "uid": f"uid-{name}-{j}",
                    "node": name,
                    "labels": {"vm-autoscaling.io/vm": "true"},
                    "annotations": {
                        "vm-autoscaling.io/min-vcpus": "2",
                        "vm-autoscaling.io/max-vcpus": "8",
                    },
                    "requests": {"cpu": "2", "memory": "4Gi"},
                }
            )
    return out


def filter_body(node_names: list[str]) -> bytes:
    pod = {
        "metadata": {
            "name": "probe",
            "namespace": "vms",
            "uid": "uid-probe",
            "labels": {"vm-autoscaling.io/vm": "true"},
            "annotations": {
                "vm-autoscaling.io/min-vcpus": "2",
                "vm-autoscaling.io/max-vcpus": "4",
            },
        },
        "spec": {
            "schedulerName": "vm-scheduler",
            "containers": [
                {"name": "vm", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}
            ],
        },
        "status": {"phase": "Pending"},
    }
    return msgspec.json.encode({"Pod": pod, "Nodes": None, "NodeNames": node_names})


async def filters(session: aiohttp.ClientSession, url: str, body: bytes, n: int) -> list[float]:
    samples: list[float] = []
    for _ in range(n):
        start = time.perf_counter()
        async with session.post(url, data=body) as r:
            await r.read()
            assert r.status == 200, r.status
        samples.append(time.perf_counter() - start)
    return samples


async def measure(args: argparse.Namespace, mode: str, snapshot: bytes, workdir: Path) -> Any:
    work = workdir / mode
    work.mkdir()
    config = {
        "listen": {
            "verbs": {"host": "127.0.0.1", "port": free_port()},
            "permits": {"host": "127.0.0.1", "port": free_port()},
        },
        "auth": {"mode": "static", "static_token": "bench"},
        "kube": {"post_events": False},
        "recommender": {"worker": mode, "auto_publish": False},
    }
    server = Extender(work, None, config, log_level="warning", standalone=workdir / "cluster.yaml")
    await asyncio.to_thread(kit.start_extender, server)
    base = f"http://127.0.0.1:{server.verbs_port}"
    try:
        async with aiohttp.ClientSession() as session:
            body = filter_body([f"node-{i:04d}" for i in range(args.filter_nodes)])
            url = f"{base}/filter"
            recommend_url = f"{base}/v1/recommend?diagnostics={args.diagnostics}"
            # Warm up both paths (the worker process starts on first use).
            await filters(session, url, body, 50)
            async with session.post(recommend_url, data=snapshot) as r:
                assert r.status == 200, await r.text()
                await r.read()
            idle = await filters(session, url, body, args.calls)

            done = asyncio.Event()
            took: list[float] = []

            async def recommend_forever() -> None:
                async with aiohttp.ClientSession() as other:
                    while not done.is_set():
                        start = time.perf_counter()
                        async with other.post(recommend_url, data=snapshot) as r:
                            await r.read()
                            assert r.status == 200
                        took.append(time.perf_counter() - start)

            background = asyncio.create_task(recommend_forever())
            await asyncio.sleep(0.05)
            busy = await filters(session, url, body, args.calls)
            done.set()
            await background
            idle_again = await filters(session, url, body, args.calls)
    finally:
        await asyncio.to_thread(server.stop)
    phases = {
        "idle": kit.summary(idle, unit="ms"),
        "busy": kit.summary(busy, unit="ms"),
        "idle_again": kit.summary(idle_again, unit="ms"),
    }
    idle_p99 = phases["idle"]["p99_ms"]
    return {
        **phases,
        "busy_to_idle_p99_ratio": round(phases["busy"]["p99_ms"] / idle_p99, 2),
        "idle_again_to_idle_p99_ratio": round(phases["idle_again"]["p99_ms"] / idle_p99, 2),
        "recommendations_during_busy": len(took),
        "recommendation_mean_ms": round(statistics.mean(took) * 1000, 1) if took else None,
    }


async def main_async(args: argparse.Namespace) -> None:
    snapshot = msgspec.json.encode(generate(pending=args.pending))
    with tempfile.TemporaryDirectory(prefix="bench-hotpath-") as tmp:
        workdir = Path(tmp)
        (workdir / "cluster.yaml").write_text(yaml.safe_dump(cluster(args.nodes)))
        results = {mode: await measure(args, mode, snapshot, workdir) for mode in args.modes}
    kit.emit(
        {
            "nodes": args.nodes,
            "filter_node_names": args.filter_nodes,
            "pending_pods": args.pending,
            "snapshot_bytes": len(snapshot),
            "diagnostics": args.diagnostics,
            "cpus": os.cpu_count(),
            "results": results,
        }
    )


def main() -> None:
    parser = kit.command(__doc__)
    parser.add_argument("--nodes", type=int, default=500, help="nodes in the extender's cluster")
    parser.add_argument("--filter-nodes", type=int, default=100, help="NodeNames per filter")
    parser.add_argument("--calls", type=int, default=2000, help="filter calls per phase")
    parser.add_argument("--pending", type=int, default=1000, help="pending pods to recommend for")
    parser.add_argument(
        "--diagnostics",
        choices=["summary", "full"],
        default="summary",
        help="the recommendations' diagnostics level (default: summary)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["inline", "process"],
        help="recommender.worker modes, one extender each (default: inline process)",
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    kit.main(main)
