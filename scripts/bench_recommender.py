"""Benchmark the scale-up recommender against decoding the same snapshot.

By default 1,000 pending pods, 500 existing nodes, 10 pools x 3 zones, generated deterministically
(a seeded ``random.Random``: the same snapshot on every run). Prints one JSON object: the best of
several runs of (a) decoding the snapshot bytes only, (b) ``load_snapshot`` (decode, check and
compile into a ``PreparedSnapshot``), (c) ``recommend`` on that prepared snapshot, (d)
``encode_recommendation``, (e) all of b-d from bytes, as ``POST /v1/recommend`` does; and the
ratios of b-e to (a). These are for the full diagnostics (the default: every round lists every
candidate). Under ``summary``, each chain also gets c-e and their ratios at
``DiagnosticsLevel.SUMMARY`` (one line per round, the candidates' records never built, and no trial
filled for a pool whose priority cannot win the round; what auto-publish and
``?diagnostics=summary`` run), against the same decode and load. All of them, for both scorer
chains and both levels, are timed round-robin in one loop (``best_millis``), so every ratio divides
figures taken in the same conditions.

Sizes: ``--pending``, ``--pools`` (3 zones each) and ``--nodes`` scale the snapshot (the
defaults are the one ``tests/recommender/test_golden.py`` pins). ``--scaling 1000,2500,5000,
10000`` instead times bytes -> answer at summary for each number of pending pods and prints the
time per pending pod (flat when the cost is linear in them). ``--controllers`` hands the
pending pods' creation times out template by template (see ``generate``): the same pods, in
the order controllers would have created them.

    .venv/bin/python scripts/bench_recommender.py [--repeat N] [--write PATH]
        [--pending N] [--pools N] [--nodes N] [--scaling N,N,...] [--controllers]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from scheduler_extender.recommender import (
    API_VERSION,
    KIND,
    POOL_LABEL,
    ZONE_LABEL,
    ClusterSnapshot,
    DiagnosticsLevel,
    RecommenderConfig,
    Scorer,
    encode_recommendation,
    load_snapshot,
    recommend,
)

ZONES = ["zone-a", "zone-b", "zone-c"]
GI = 2**30
# (cpu cores, GiB per core, price per hour)
POOL_SHAPES = [
    (4, 4, 0.19),
    (8, 4, 0.38),
    (16, 4, 0.76),
    (32, 4, 1.52),
    (8, 8, 0.50),
    (16, 8, 1.00),
    (32, 8, 2.00),
    (64, 4, 3.04),
    (16, 2, 0.68),
    (8, 2, 0.34),
]
POD_SHAPES = [("250m", "512Mi"), ("500m", "1Gi"), ("1", "2Gi"), ("1", "4Gi"), ("2", "4Gi"),
              ("2", "8Gi"), ("4", "8Gi"), ("4", "16Gi"), ("8", "16Gi")]  # fmt: skip


def generate(
    seed: int = 42,
    *,
    pending: int = 1000,
    pools_count: int = 10,
    nodes_count: int = 500,
    controllers: bool = False,
) -> dict[str, Any]:
    """The benchmark's snapshot. The defaults are the one the golden test pins; other sizes
    repeat the ten pool shapes (each repetition a little dearer, so that they differ) and the
    same mix of pending pods.

    The pending pods' creation times follow their index, so in scheduling order pods of one
    shape (size, priority, constraints) are shuffled among the others: runs of 1.06 pods on
    average. With ``controllers`` the same pods get the same times, handed out template by
    template, as when each Deployment's replicas are created together: the same pods, in
    runs of 8 in scheduling order."""
    rng = random.Random(seed)
    pools: list[dict[str, Any]] = []
    for i in range(pools_count):
        cores, gib, base_price = POOL_SHAPES[i % len(POOL_SHAPES)]
        price = round(base_price * (1 + 0.03 * (i // len(POOL_SHAPES))), 4)
        kind = i % len(POOL_SHAPES)
        template: dict[str, Any] = {
            "instanceType": f"t{i}-{cores}x{cores * gib}",
            "allocatable": {"cpu": str(cores), "memory": f"{cores * gib}Gi"},
            "labels": {"tier": "gpu" if kind == 7 else ("high-mem" if gib == 8 else "general")},
        }
        if kind == 7:
            template["taints"] = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
        pools.append(
            {
                "name": f"pool-{i:02d}",
                "zones": ZONES,
                "template": template,
                "currentCount": 50,
                # Room grows with the pending pods, so that larger sizes are the same problem
                # scaled rather than one where every pool is soon at its maximum.
                "maxCount": 150 * max(1, pending // 1000),
                "price": price,
                "priority": rng.choice([0, 0, 5]),
                **({"limits": {"cpu": str(2400 * max(1, pending // 1000))}} if kind == 3 else {}),
            }
        )
    nodes = []
    pods: list[dict[str, Any]] = []
    for i in range(nodes_count):
        pool = pools[i % len(pools)]
        zone = ZONES[(i // 10) % 3]
        t: dict[str, Any] = pool["template"]
        name = f"node-{i:03d}"
        nodes.append(
            {
                "name": name,
                "labels": {**t["labels"], POOL_LABEL: pool["name"], ZONE_LABEL: zone},
                "allocatable": t["allocatable"],
                "taints": t.get("taints", []),
            }
        )
        cores = int(t["allocatable"]["cpu"])
        used = 0.0
        for j in range(6):
            cpu = max(0.25, round(cores * rng.uniform(0.05, 0.2), 2))
            if used + cpu > cores * 0.78:
                break
            used += cpu
            pods.append(
                {
                    "namespace": "running",
                    "name": f"{name}-p{j}",
                    "uid": f"uid-{name}-{j}",
                    "nodeName": name,
                    "requests": {"cpu": f"{int(cpu * 1000)}m", "memory": f"{int(cpu)}Gi"},
                    "priority": 100,
                    **(
                        {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}
                        if "taints" in t
                        else {}
                    ),
                }
            )
    classes = [("critical", 1000), ("standard", 100), ("batch", 10)]
    for i in range(pending):
        shape, mem = rng.choice(POD_SHAPES)
        pc, _ = rng.choices(classes, weights=[1, 3, 6])[0]
        pod: dict[str, Any] = {
            "namespace": f"team-{i % 7}",
            "name": f"pending-{i:04d}",
            "uid": f"uid-pending-{i:04d}",
            "requests": {"cpu": shape, "memory": mem},
            "priorityClassName": pc,
            "creationTimestamp": f"2024-05-{1 + i // 3600:02d}T10:{i // 60 % 60:02d}:{i % 60:02d}Z",
        }
        r = rng.random()
        if r < 0.10:
            zone = rng.choice(ZONES)
            pod["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [
                                {"key": ZONE_LABEL, "operator": "In", "values": [zone]}]}
                        ]
                    }
                }
            }  # fmt: skip
        elif r < 0.15:
            pod["nodeSelector"] = {"tier": "gpu"}
            pod["tolerations"] = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
        elif r < 0.25:
            pod["nodeSelector"] = {"tier": "high-mem"}
        pods.append(pod)
    if controllers:
        waiting = [p for p in pods if "nodeName" not in p]
        times = sorted(p["creationTimestamp"] for p in waiting)
        for p, created in zip(sorted(waiting, key=_template), times, strict=True):
            p["creationTimestamp"] = created
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "priorityClasses": [{"name": n, "value": v} for n, v in classes],
        "nodePools": pools,
        "nodes": nodes,
        "pods": pods,
    }


def _template(pod: dict[str, Any]) -> str:
    """What a controller's pods have in common: all but their name, uid and namespace."""
    own = ("name", "uid", "namespace", "creationTimestamp")
    return json.dumps({k: v for k, v in pod.items() if k not in own}, sort_keys=True)


def best_millis(timers: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best of ``repeat`` for each timer, taken round-robin: repetition k runs every timer once
    before repetition k+1 runs any. Each figure is then taken in the same conditions as the
    others (caches as warm, the machine as busy), which a ratio between two of them needs."""
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(repeat):
        for name, fn in timers.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: round(seconds * 1000, 2) for name, seconds in best.items()}


def scaling(
    sizes: list[int], *, pools: int, nodes: int, repeat: int, controllers: bool
) -> dict[str, Any]:
    """Bytes -> answer at summary for each number of pending pods (same pools and nodes), with
    the time per pending pod: flat when the cost is linear in pending pods."""
    rows = []
    for pending in sizes:
        data = msgspec.json.encode(
            generate(pending=pending, pools_count=pools, nodes_count=nodes, controllers=controllers)
        )
        decoder = msgspec.json.Decoder(ClusterSnapshot)
        row: dict[str, Any] = {"pendingPods": pending, "snapshotBytes": len(data)}
        chains = {
            "+".join(chain): RecommenderConfig(scorers=chain)
            for chain in (
                (Scorer.PRIORITY, Scorer.LEAST_WASTE, Scorer.MOST_PODS),
                (Scorer.LEAST_COST,),
            )
        }
        # Decode and both chains round-robin in one loop: each ratio divides figures taken
        # in the same conditions.
        timers: dict[str, Callable[[], object]] = {
            "decode": lambda d=data, dec=decoder: dec.decode(d)
        }
        for name, config in chains.items():
            timers[name] = lambda d=data, c=config: encode_recommendation(
                recommend(load_snapshot(d), config=c)
            )
        best = best_millis(timers, repeat)
        row["decodeMillis"] = best["decode"]
        for name in chains:
            row[name] = {
                "bytesToAnswerMillis": best[name],
                "bytesToAnswerToDecodeRatio": round(best[name] / best["decode"], 2),
                "microsPerPendingPod": round(best[name] * 1000 / pending, 1),
            }
        rows.append(row)
    per_pod = {
        name: [row[name]["microsPerPendingPod"] for row in rows]
        for name in rows[0]
        if isinstance(rows[0][name], dict)
    }
    return {
        "pools": pools,
        "controllers": controllers,
        "existingNodes": nodes,
        "sizes": rows,
        # Time per pending pod at the largest size over the smallest: 1.0 is exactly linear.
        "perPodLargestToSmallestRatio": {
            name: round(values[-1] / values[0], 2) for name, values in per_pod.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--repeat", type=int, default=10, help="runs of each measurement; the best is kept"
    )
    parser.add_argument("--write", type=Path, help="also write the snapshot JSON here")
    parser.add_argument("--pending", type=int, default=1000, help="pending pods (default 1000)")
    parser.add_argument("--pools", type=int, default=10, help="node pools, 3 zones each")
    parser.add_argument("--nodes", type=int, default=500, help="existing nodes")
    parser.add_argument(
        "--controllers",
        action="store_true",
        help="the same pending pods, created template by template as controllers create"
        " replicas (same-shape pods in runs in scheduling order, not shuffled)",
    )
    parser.add_argument(
        "--scaling",
        metavar="N,N,...",
        help="instead: bytes -> answer at summary for each of these numbers of pending pods"
        " (with --pools and --nodes), and the time per pending pod",
    )
    args = parser.parse_args()
    if args.scaling:
        sizes = [int(n) for n in args.scaling.split(",")]
        report = scaling(
            sizes,
            pools=args.pools,
            nodes=args.nodes,
            repeat=args.repeat,
            controllers=args.controllers,
        )
        print(json.dumps(report, indent=2))
        return
    data = msgspec.json.encode(
        generate(
            pending=args.pending,
            pools_count=args.pools,
            nodes_count=args.nodes,
            controllers=args.controllers,
        )
    )
    if args.write:
        args.write.write_bytes(data)
    decoder = msgspec.json.Decoder(ClusterSnapshot)
    snapshot = load_snapshot(data)
    chains = {
        "+".join(chain): RecommenderConfig(scorers=chain, diagnostics=DiagnosticsLevel.FULL)
        for chain in ((Scorer.PRIORITY, Scorer.LEAST_WASTE, Scorer.MOST_PODS), (Scorer.LEAST_COST,))
    }
    recs = {name: recommend(snapshot, config=config) for name, config in chains.items()}
    lean_chains = {
        name: msgspec.structs.replace(config, diagnostics=DiagnosticsLevel.SUMMARY)
        for name, config in chains.items()
    }
    lean_recs = {name: recommend(snapshot, config=config) for name, config in lean_chains.items()}
    # One decode and one load figure, measured in the same loop as every chain's: timed apart
    # before each chain, the decode read 20-25% lower the second time (warmer caches), which
    # made the second chain's ratios look worse than they were.
    timers: dict[str, Callable[[], object]] = {
        "decode": lambda: decoder.decode(data),
        "load": lambda: load_snapshot(data),
    }
    for name, config in chains.items():
        rec = recs[name]
        timers[f"{name}:recommend"] = lambda c=config: recommend(snapshot, config=c)
        timers[f"{name}:encode"] = lambda r=rec: encode_recommendation(r)
        timers[f"{name}:whole"] = lambda c=config: encode_recommendation(
            recommend(load_snapshot(data), config=c)
        )
        lean_config, lean_rec = lean_chains[name], lean_recs[name]
        timers[f"{name}:summary:recommend"] = lambda c=lean_config: recommend(snapshot, config=c)
        timers[f"{name}:summary:encode"] = lambda r=lean_rec: encode_recommendation(r)
        timers[f"{name}:summary:whole"] = lambda c=lean_config: encode_recommendation(
            recommend(load_snapshot(data), config=c)
        )
    best = best_millis(timers, args.repeat)
    decode, load = best["decode"], best["load"]
    results = {}

    def timings(key: str) -> dict[str, Any]:
        """One chain's (and level's) times and their ratios to the shared baselines."""
        rec_ms, enc_ms, whole_ms = (
            best[f"{key}:{part}"] for part in ("recommend", "encode", "whole")
        )
        return {
            "recommendMillis": rec_ms,
            "encodeMillis": enc_ms,
            "bytesToAnswerMillis": whole_ms,
            "recommendToDecodeRatio": round(rec_ms / decode, 2),
            "recommendToLoadRatio": round(rec_ms / load, 2),
            "encodeToDecodeRatio": round(enc_ms / decode, 2),
            "bytesToAnswerToDecodeRatio": round(whole_ms / decode, 2),
        }

    for name, rec in recs.items():
        results[name] = {
            "decodeMillis": decode,
            "loadSnapshotMillis": load,
            **timings(name),
            "loadToDecodeRatio": round(load / decode, 2),
            "newNodes": sum(s.increment_by for s in rec.scale_up),
            "rounds": len(rec.diagnostics.rounds),
            "placedOnExisting": len(rec.diagnostics.placed_on_existing),
            "unscheduled": len(rec.unscheduled_pods),
            "cost": msgspec.to_builtins(rec.diagnostics.cost),
            "answerBytes": len(encode_recommendation(rec)),
        }
        lean = lean_recs[name]
        results[name]["summary"] = {
            **timings(f"{name}:summary"),
            "rounds": len(lean.diagnostics.rounds),
            "answerBytes": len(encode_recommendation(lean)),
        }
    print(
        json.dumps(
            {
                "snapshotBytes": len(data),
                "pendingPods": args.pending,
                "existingNodes": args.nodes,
                "pools": args.pools,
                "controllers": args.controllers,
                "zones": 3,
                "repeat": args.repeat,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
