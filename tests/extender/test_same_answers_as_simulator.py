"""The simulator and the server answer the same inputs identically.

One side is the real extender over HTTP (filter, prioritize and bind on the verbs port, permit
batches on the permit port, fed by the fake API server's lists); the other is the simulator's
own entry points (``simulator.scheduling``: ``choose_node``, ``bind``, ``permit_batch``) on a
simulated extender built from the same nodes. A seeded mix of VM shapes (scaling units,
memory that scales, pods too large for any node) is placed one by one, then every node's
agents ask to grow, twice (the second round with the next seqs), and each answer is compared:
the node chosen or why none, each bind's error, each permit's size, status, reason and seq.
"""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec

from protocol import codec
from protocol.kube import Pod
from protocol.permits import PodRef, ResourceRequest, Resources
from scheduler_extender.admission.quota import QuotaConfig
from scheduler_extender.core.placement import Strategy
from scheduler_extender.core.podinfo import Demand, PodInfo, pod_info
from simulator import scheduling
from simulator.records import ExtenderLife
from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import (
    STATIC_TOKEN,
    Running,
    StartExtender,
    make_config,
    wait_until,
)
from tests.extender.helpers import bind_body, filter_body, vm_pod

GI = 2**30
# (name, vCPUs, GiB): uneven, so that fit, headroom and spread all differ between nodes.
NODES = [("node-a", 6, 16), ("node-b", 7, 12), ("node-c", 5, 24), ("node-d", 9, 10)]
NAMES = [n for n, _, _ in NODES]


def _pods(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    pods = []
    for i in range(18):
        low = rng.choice([1, 1, 2, 3])
        unit = rng.choice([1, 1, 2])
        high = low + unit * rng.randint(0, 3) + rng.choice([0, 1])
        if i % 7 == 6:
            low = high = 12  # larger than any node: unresolvable everywhere
        extra = {"vm-autoscaling.io/scaling-unit": str(unit)}
        memory = f"{rng.choice([1, 2])}Gi"
        if rng.random() < 0.4:
            extra["vm-autoscaling.io/min-memory"] = memory
            extra["vm-autoscaling.io/max-memory"] = f"{rng.choice([3, 4, 6])}Gi"
            extra["vm-autoscaling.io/memory-unit"] = "512Mi"
        pods.append(
            vm_pod(
                f"vm-{i}",
                uid=f"u-{i}",
                min_vcpus=low,
                max_vcpus=high,
                extra=extra,
                memory=memory,
            )
        )
    return pods


def _simulated() -> ExtenderLife:
    ext = ExtenderLife(1, QuotaConfig())
    for name, cpu, gib in NODES:
        ext.ledger.upsert_node(name, allocatable=Demand(cpu * 1000, gib * GI), labels={})
    return ext


def _request(info: PodInfo, node: str, round_: int, rng: random.Random) -> ResourceRequest:
    vm = info.vm
    assert vm is not None
    start = info.initial_demand()
    vcpus = start.cpu_millis // 1000
    memory = vm.min_memory_bytes
    want_memory = memory
    if vm.max_memory_bytes > memory:
        want_memory = rng.choice([memory, vm.max_memory_bytes, memory + GI])
    return ResourceRequest(
        pod=PodRef(namespace=info.namespace, name=info.name, uid=info.uid),
        node=node,
        current=Resources(vcpus=vcpus, memory_bytes=memory),
        requested=Resources(
            vcpus=min(vm.max_vcpus, vcpus + rng.randint(0, 3) + round_),
            memory_bytes=min(vm.max_memory_bytes, want_memory),
        ),
        last_permit=Resources(vcpus=vcpus, memory_bytes=memory),
    )


def _permit_view(permit: dict[str, Any]) -> tuple[Any, ...]:
    granted = permit.get("permit")
    return (
        permit["pod"]["uid"],
        permit.get("status"),
        None if granted is None else (granted["vcpus"], granted["memoryBytes"]),
        permit.get("reason"),
        permit.get("seq"),
        (permit.get("error") or {}).get("reason"),
    )


async def test_the_simulator_and_the_server_place_bind_and_permit_alike(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    for name, cpu, gib in NODES:
        kube_api.add_node(node_object(name, cpu=str(cpu), memory=f"{gib}Gi"))
    pods = _pods(seed=38)
    for pod in pods:
        kube_api.add_pod(pod)
    config = make_config()  # the simulator's ledger keeps the same default system reserve
    running = await start_extender(config)
    strategy = config.scoring.strategy
    assert strategy is Strategy.SPREAD  # the default, which weighs headroom and free room
    infos = [
        pod_info(codec.decode(Pod, json.dumps(p)), scheduler_name=config.scheduler_name)
        for p in pods
    ]
    ext = _simulated()

    async def post(path: str, body: Any) -> Any:
        response = await running.verbs.post(path, json=body)
        assert response.status == 200, await response.text()
        return await response.json()

    placed: dict[str, list[PodInfo]] = {}
    outcomes = []
    for pod, info in zip(pods, infos, strict=True):
        # The server, as kube-scheduler drives it: filter, prioritize the passing nodes,
        # the best score (ties: the first name, the simulator's rule), bind.
        answer = await post("/filter", filter_body(pod, NAMES))
        passed = answer["NodeNames"]
        served: tuple[Any, ...]
        if passed:
            scores = await post("/prioritize", filter_body(pod, passed))
            best = min(scores, key=lambda s: (-s["Score"], s["Host"]))["Host"]
            bound = await post("/bind", bind_body(pod, best))
            served = (best, bound["Error"])
        else:
            failed = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
            served = (None, "; ".join(sorted(set(failed.values()))[:2]))
        # The simulator's entry points, on the same pod.
        choice = scheduling.choose_node(ext, info, NAMES, now=1.0, strategy=strategy)
        simulated: tuple[Any, ...]
        if choice.node is not None:
            decided = scheduling.bind(ext, info, choice.node, now=1.0)
            simulated = (choice.node, decided.error)
            ext.ledger.observe_pod(msgspec.structs.replace(info, node_name=choice.node), at=1.0)
            placed.setdefault(choice.node, []).append(info)
        else:
            simulated = (None, choice.reason)
        assert simulated == served, info.key
        outcomes.append(served)
    # The mix exercises both branches, more than one node and a refused size.
    assert len({node for node, _ in outcomes if node is not None}) >= 3
    assert any(node is None for node, _ in outcomes)

    # A bind to a node with no room left: the same refusal.
    full = max(placed, key=lambda n: len(placed[n]))
    late = vm_pod("vm-late", uid="u-late", min_vcpus=4, max_vcpus=4)
    kube_api.add_pod(late)
    late_info = pod_info(codec.decode(Pod, json.dumps(late)), scheduler_name=config.scheduler_name)
    await post("/filter", filter_body(late, NAMES))  # bind may come before the pod watch
    served_late = (await post("/bind", bind_body(late, full)))["Error"]
    assert served_late == scheduling.bind(ext, late_info, full, now=1.0).error
    assert served_late.startswith(f"cannot bind vms/vm-late to {full}")

    # Every node's agents ask to grow, twice: the permit batches, sequence numbers included.
    rng = random.Random(7)
    seqs: dict[str, int] = {}
    answers: list[tuple[Any, ...]] = []
    # The third round replays the first's seqs: refused as stale on both sides.
    for round_ in range(3):
        if round_:
            await _same_pods(kube_api, running, ext, placed, config.scheduler_name)
        if round_ == 2:
            seqs.clear()
        for node in sorted(placed):
            requests = [_request(info, node, round_, rng) for info in placed[node]]
            simulated_permits = scheduling.permit_batch(ext, node, requests, seqs)
            assert isinstance(simulated_permits, list)
            body = {
                "protocol": {"min": 1, "max": 2},
                "node": node,
                "requests": [
                    msgspec.to_builtins(msgspec.structs.replace(r, seq=round_ % 2 + 1))
                    for r in requests
                ],
            }
            response = await running.permits.post(
                "/v1/permits",
                data=codec.encode(body),
                headers={"Authorization": f"Bearer {STATIC_TOKEN}"},
            )
            assert response.status == 200, await response.text()
            served_permits = (await response.json())["permits"]
            sim_view = [
                _permit_view(msgspec.to_builtins(d.permit) | {"error": _error(d)})
                for d in simulated_permits
            ]
            assert sim_view == [_permit_view(p) for p in served_permits], node
            answers.extend(sim_view)
    statuses = {view[1] for view in answers} | {view[5] for view in answers}
    assert {"granted", "partial", "denied", "steady", "StaleSequence"} <= statuses


async def _same_pods(
    kube_api: FakeKubeApi,
    running: Running,
    ext: ExtenderLife,
    placed: dict[str, list[PodInfo]],
    scheduler_name: str,
) -> None:
    """The server writes each permit back to its pod (annotations, an in-place resize), and its
    pod watch brings the pod back: once it has, the simulated extender's watch gets the same
    pods (the simulator models the write's delay, not the resize of the pod's requests)."""
    assert running.extender.recorder is not None
    await running.extender.recorder.wait_idle()
    pods = {
        info.uid: pod_info(
            codec.decode(Pod, json.dumps(kube_api.get_pod(info.namespace, info.name))),
            scheduler_name=scheduler_name,
        )
        for infos in placed.values()
        for info in infos
    }
    ledger = running.extender.ledger
    await wait_until(lambda: all(ledger.pods[u].requests == p.requests for u, p in pods.items()))
    for info in pods.values():
        ext.ledger.observe_pod(info, at=2.0)


def _error(decision: Any) -> dict[str, str] | None:
    return None if decision.refused is None else {"reason": decision.refused.kind.value}
