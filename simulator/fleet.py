"""A generated fleet: the benchmark's scenario, and the tests' for what only shows at scale.

Pure: the same arguments always give the same ``Scenario``. Every VM starts bound to its node
(a running fleet, no placements), with min 1 and max 8 vCPUs and its own seeded load trace:
most change level a few times an hour, some ramp up and down, some follow a slow sine
(quantised to 60 s steps). The agents scrape every ``TICK_SECONDS``. With 20 VMs per 96-CPU
node some nodes fill up, so VMs there contend for the room that others give back.
"""

from __future__ import annotations

import random
from typing import Final

from simulator.scenario import (
    Agent,
    Node,
    Piece,
    Ramp,
    Scenario,
    Sine,
    Timing,
    Vm,
)

TICK_SECONDS: Final = 5.0


def fleet(nodes: int, vms: int, seconds: float, seed: int) -> Scenario:
    rng = random.Random(seed)
    node_specs = [
        Node(name=f"node-{i:04d}", cpu=96, memory="512Gi", zone=f"zone-{i % 3}")
        for i in range(nodes)
    ]
    vm_specs: list[Vm] = []
    for i in range(vms):
        kind = rng.random()
        base = round(rng.uniform(0.1, 1.5), 2)
        pieces = [Piece(at_seconds=0, level_vcpus=base)]
        if kind < 0.6:
            at = 0.0
            for _ in range(rng.randint(1, 4)):
                at += rng.uniform(120, seconds / 3)
                if at >= seconds:
                    break
                pieces.append(
                    Piece(at_seconds=round(at), level_vcpus=round(rng.uniform(0.1, 5), 2))
                )
        elif kind < 0.85:
            up = round(rng.uniform(60, seconds / 2))
            down = up + round(rng.uniform(600, seconds / 2))
            pieces.append(
                Piece(
                    at_seconds=up, ramp=Ramp(to_vcpus=round(rng.uniform(2, 6), 2), over_seconds=300)
                )
            )
            pieces.append(Piece(at_seconds=down, level_vcpus=base))
        else:
            mean = round(rng.uniform(1, 3), 2)
            pieces = [
                Piece(
                    at_seconds=0,
                    sine=Sine(
                        mean_vcpus=mean,
                        amplitude_vcpus=round(mean * rng.uniform(0.2, 0.8), 2),
                        period_seconds=rng.choice([1200, 1800, 3600]),
                    ),
                )
            ]
        vm_specs.append(
            Vm(
                name=f"vm-{i:05d}",
                min_vcpus=1,
                max_vcpus=8,
                node=node_specs[i % nodes].name,
                trace=pieces,
            )
        )
    return Scenario(
        name="fleet",
        duration_seconds=seconds,
        seed=seed,
        agent=Agent(scrape_interval_seconds=TICK_SECONDS),
        timing=Timing(
            load_quantum_seconds=60,
            sample_interval_seconds=60,
            check_interval_seconds=60,
        ),
        nodes=node_specs,
        vms=vm_specs,
    )
