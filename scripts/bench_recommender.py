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

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from scheduler_extender.recommender import (
    ClusterSnapshot,
    DiagnosticsLevel,
    RecommenderConfig,
    Scorer,
    encode_recommendation,
    load_snapshot,
    recommend,
)
from testkit import bench as kit
from testkit.recommender_snapshot import generate


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
        row: dict[str, Any] = {"pending_pods": pending, "snapshot_bytes": len(data)}
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
        row["decode_ms"] = best["decode"]
        for name in chains:
            row[name] = {
                "bytes_to_answer_ms": best[name],
                "bytes_to_answer_to_decode_ratio": round(best[name] / best["decode"], 2),
                "us_per_pending_pod": round(best[name] * 1000 / pending, 1),
            }
        rows.append(row)
    per_pod = {
        name: [row[name]["us_per_pending_pod"] for row in rows]
        for name in rows[0]
        if isinstance(rows[0][name], dict)
    }
    return {
        "pools": pools,
        "controllers": controllers,
        "existing_nodes": nodes,
        "sizes": rows,
        # Time per pending pod at the largest size over the smallest: 1.0 is exactly linear.
        "per_pod_largest_to_smallest_ratio": {
            name: round(values[-1] / values[0], 2) for name, values in per_pod.items()
        },
    }


def main() -> None:
    parser = kit.command(__doc__)
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
        kit.emit(report)
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
            "recommend_ms": rec_ms,
            "encode_ms": enc_ms,
            "bytes_to_answer_ms": whole_ms,
            "recommend_to_decode_ratio": round(rec_ms / decode, 2),
            "recommend_to_load_ratio": round(rec_ms / load, 2),
            "encode_to_decode_ratio": round(enc_ms / decode, 2),
            "bytes_to_answer_to_decode_ratio": round(whole_ms / decode, 2),
        }

    for name, rec in recs.items():
        results[name] = {
            "decode_ms": decode,
            "load_snapshot_ms": load,
            **timings(name),
            "load_to_decode_ratio": round(load / decode, 2),
            "new_nodes": sum(s.increment_by for s in rec.scale_up),
            "rounds": len(rec.diagnostics.rounds),
            "placed_on_existing": len(rec.diagnostics.placed_on_existing),
            "unscheduled": len(rec.unscheduled_pods),
            "cost": kit.snake_keys(msgspec.to_builtins(rec.diagnostics.cost)),
            "answer_bytes": len(encode_recommendation(rec)),
        }
        lean = lean_recs[name]
        results[name]["summary"] = {
            **timings(f"{name}:summary"),
            "rounds": len(lean.diagnostics.rounds),
            "answer_bytes": len(encode_recommendation(lean)),
        }
    kit.emit(
        {
            "snapshot_bytes": len(data),
            "pending_pods": args.pending,
            "existing_nodes": args.nodes,
            "pools": args.pools,
            "controllers": args.controllers,
            "zones": 3,
            "repeat": args.repeat,
            "results": results,
        }
    )


if __name__ == "__main__":
    kit.main(main)
