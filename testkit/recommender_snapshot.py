"""The recommender's benchmark snapshot: 1,000 pending pods, 500 existing nodes, 10 pools x 3
zones by default, generated deterministically (a seeded ``random.Random``).

``scripts/bench_recommender.py`` times the recommender on it, ``scripts/bench_recommend_hotpath.py``
posts it to a running extender, and ``tests/recommender/test_golden.py`` pins the answer to the
default one (so its defaults never change without the golden hash).
"""

from __future__ import annotations

import json
import random
from typing import Any

from scheduler_extender.recommender import API_VERSION, KIND, POOL_LABEL, ZONE_LABEL

ZONES = ["zone-a", "zone-b", "zone-c"]
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
