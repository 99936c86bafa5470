"""Benchmark: do recommendations delay kube-scheduler's filter calls?

Starts the extender as ``__main__`` does (``serve --standalone``, a generated cluster of
``--nodes`` nodes with pods on them, logging at warning into a file), once per worker mode
(``recommender.worker: inline`` and ``process``), and for each measures, over real HTTP from
this process:

* ``idle``: filter calls one after another (a VM pod against ``--filter-nodes`` node names),
  nothing else running;
* ``busy``: the same filter calls while another client posts ``POST /v1/recommend`` back to
  back (``scripts/bench_recommender.py``'s snapshot scaled to ``--pending`` pending pods, at
  ``--diagnostics``), so that a recommendation is always running;
* ``idle`` again, so that drift shows.

Prints one JSON object: per mode, the filter latency p50/p99/max in milliseconds for each phase,
the busy p99 over the idle p99 of the same server (``busyToIdleP99Ratio``, the figure that
matters), how many recommendations ran during the busy phase and their mean time as the client
saw it.

    .venv/bin/python scripts/bench_recommend_hotpath.py [--pending 1000] [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import msgspec
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test kit (testkit/) is not installed

from testkit.ports import free_port  # noqa: E402


def bench_recommender() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench", REPO / "scripts/bench_recommender.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "calls": len(ordered),
        "p50Millis": round(statistics.median(ordered) * 1000, 3),
        "p99Millis": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 3),
        "maxMillis": round(ordered[-1] * 1000, 3),
    }


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
    port = free_port()
    config = workdir / f"config-{mode}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {
                    "verbs": {"host": "127.0.0.1", "port": port},
                    "permits": {"host": "127.0.0.1", "port": free_port()},
                },
                "auth": {"mode": "static", "static_token": "bench"},
                "kube": {"post_events": False},
                "recommender": {"worker": mode, "auto_publish": False},
            }
        )
    )
    cluster_file = workdir / "cluster.yaml"
    log = (workdir / f"server-{mode}.log").open("w")
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scheduler_extender", "serve", "--standalone", str(cluster_file),
        "--config", str(config), "--log-level", "warning",
        cwd=REPO, stdout=log, stderr=log,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(600):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{base}/readyz") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.05)
            else:
                raise SystemExit(f"{mode}: the extender did not get ready")
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
        server.terminate()
        await asyncio.wait_for(server.wait(), 30)
        log.close()
    idle_p99 = summary(idle)["p99Millis"]
    return {
        "idle": summary(idle),
        "busy": summary(busy),
        "idleAgain": summary(idle_again),
        "busyToIdleP99Ratio": round(summary(busy)["p99Millis"] / idle_p99, 2),
        "idleAgainToIdleP99Ratio": round(summary(idle_again)["p99Millis"] / idle_p99, 2),
        "recommendationsDuringBusy": len(took),
        "recommendationMeanMillis": round(statistics.mean(took) * 1000, 1) if took else None,
    }


async def main_async(args: argparse.Namespace) -> None:
    bench = bench_recommender()
    doc = bench.generate()
    if args.pending != 1000:
        doc = bench.generate(pending=args.pending)
    snapshot = msgspec.json.encode(doc)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "cluster.yaml").write_text(yaml.safe_dump(cluster(args.nodes)))
        results = {mode: await measure(args, mode, snapshot, workdir) for mode in args.modes}
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "filterNodeNames": args.filter_nodes,
                "pendingPods": args.pending,
                "snapshotBytes": len(snapshot),
                "diagnostics": args.diagnostics,
                "cpus": os.cpu_count(),
                "results": results,
            },
            indent=2,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500, help="nodes in the extender's cluster")
    parser.add_argument("--filter-nodes", type=int, default=100, help="NodeNames per filter")
    parser.add_argument("--calls", type=int, default=2000, help="filter calls per phase")
    parser.add_argument("--pending", type=int, default=1000, help="pending pods to recommend for")
    parser.add_argument("--diagnostics", choices=["summary", "full"], default="summary")
    parser.add_argument("--modes", nargs="+", default=["inline", "process"])
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
