"""Every pod counts as the real kube-scheduler v1.36 counts it (``podinfo``'s module docstring).

The test plays the kubelet: it creates pods bound to nodes of their own and writes their status
(allocated and actuated resources, the Infeasible condition) through ``pods/status``. The real
kube-scheduler's own count of each node is read from its cache, which it dumps to its log on
SIGUSR2 (``Dump of cached NodeInfo``); the extender's from ``/state``.
"""

from __future__ import annotations

import json
import os
import re
import signal
from typing import Any

import msgspec

from protocol.codec import decode
from protocol.kube import Pod
from scheduler_extender.core.podinfo import pod_requests
from testkit.cluster import Cluster, Names
from testkit.controlplane import Obj, pod_path, wait_for

GI = 2**30
INFEASIBLE = {"type": "PodResizePending", "status": "True", "reason": "Infeasible"}
RUNTIME_CLASS = "vma-test-overhead"


def ctr(name: str, **requests: str) -> Obj:
    return {"name": name, "image": "app", "resources": {"requests": requests}}


def cs(name: str, allocated: Obj | None = None, actual: Obj | None = None) -> Obj:
    """A container status as the kubelet writes one (``resources`` only once it reports it)."""
    out: Obj = {"name": name, "image": "app", "imageID": "", "ready": True, "restartCount": 0}
    if allocated is not None:
        out["allocatedResources"] = allocated
    if actual is not None:
        out["resources"] = {"requests": actual}
    return out


# name: (spec beyond containers, containers, status, kube-scheduler's (cpu m, memory), ours)
CASES: dict[str, tuple[Obj, list[Obj], Obj, tuple[int, int], tuple[int, int]]] = {
    "pod-level": ({"resources": {"requests": {"cpu": "2"}}}, [ctr("c")], {}, (2000, 0), (2000, 0)),
    "resizing": (
        {},
        [ctr("c", cpu="500m")],
        {"containerStatuses": [cs("c", {"cpu": "500m"}, {"cpu": "2"})]},
        (2000, 0),
        (2000, 0),
    ),
    # The one difference: the kubelet has admitted 2 CPUs and not yet reported them running.
    "allocated": (
        {},
        [ctr("c", cpu="500m")],
        {"containerStatuses": [cs("c", {"cpu": "2"})]},
        (500, 0),
        (2000, 0),
    ),
    "infeasible": (
        {},
        [ctr("c", cpu="3")],
        {"conditions": [INFEASIBLE], "containerStatuses": [cs("c", {"cpu": "2"}, {"cpu": "1"})]},
        (2000, 0),
        (2000, 0),
    ),
    "init-status": (
        {"initContainers": [ctr("i", cpu="3")]},
        [ctr("c", cpu="1")],
        {"initContainerStatuses": [cs("i", None, {"cpu": "4"})]},
        (3000, 0),
        (3000, 0),
    ),
    "pod-level-status": (
        {"resources": {"requests": {"cpu": "1"}}, "runtimeClassName": RUNTIME_CLASS},
        [ctr("c", memory="2Gi")],
        {
            "allocatedResources": {"cpu": "2"},
            "resources": {"requests": {"cpu": "2500m", "memory": "1Gi"}},
        },
        (2600, 2 * GI),
        (2600, 2 * GI),
    ),
    "pod-level-infeasible": (
        {"resources": {"requests": {"cpu": "3"}}},
        [ctr("c", cpu="500m")],
        {"conditions": [INFEASIBLE], "resources": {"requests": {"memory": "1Gi"}}},
        (0, 0),
        (0, 0),
    ),
    "rounding": (
        {},
        [ctr("a", cpu="500u", memory="1500m"), ctr("b", cpu="500u", memory="1500m")],
        {},
        (2, 3),
        (2, 3),
    ),
}


def place(
    names: Names, name: str, node: str, *, spec: Obj, containers: list[Obj], status: Obj
) -> None:
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": names.namespace},
        "spec": {"nodeName": node, "containers": containers, **spec},
    }
    names.api.create(pod_path(names.namespace), body)
    if status:
        names.api.request(
            "PATCH",
            pod_path(names.namespace, name) + "/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )


def scheduler_counts(cluster: Cluster) -> dict[str, tuple[int, int]]:
    """kube-scheduler's own count of every node, from the cache dump SIGUSR2 asks it for."""
    process = cluster.scheduler.process
    assert process is not None
    log = process.log_path
    before = log.read_text(errors="replace").count("Dump of cached NodeInfo")
    os.kill(process.popen.pid, signal.SIGUSR2)
    text = wait_for(
        lambda: (
            (t := log.read_text(errors="replace")).count("Dump of cached NodeInfo") > before and t
        ),
        timeout_seconds=10,
        what="kube-scheduler's cache dump",
    )
    dump = text[text.rindex("Dump of cached NodeInfo") :]
    found = re.findall(
        r"Node name: (\S+)\s+Deleted: \w+\s+Requested Resources: &\{MilliCPU:(\d+) Memory:(\d+)",
        dump,
    )
    return {node: (int(cpu), int(mem)) for node, cpu, mem in found}


def extender_counts(cluster: Cluster, nodes: list[str]) -> dict[str, tuple[int, int]]:
    state: dict[str, Any] = cluster.extender.state()
    return {
        n["name"]: (n["occupied"]["cpuMillis"], n["occupied"]["memoryBytes"])
        for n in state["nodes"]
        if n["name"] in nodes
    }


def test_the_extender_counts_every_pod_as_kube_scheduler_does(cluster: Cluster, names: Names):
    names.api.create(
        "/apis/node.k8s.io/v1/runtimeclasses",
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": RUNTIME_CLASS},
            "handler": "runc",
            "overhead": {"podFixed": {"cpu": "100m"}},
        },
    )
    names.cleanup.append(f"/apis/node.k8s.io/v1/runtimeclasses/{RUNTIME_CLASS}")
    nodes = {case: names.node(case, cpu="16", memory="64Gi") for case in CASES}
    for case, (spec, containers, status, _, _) in CASES.items():
        place(names, case, nodes[case], spec=spec, containers=containers, status=status)
    theirs = {nodes[case]: expected for case, (_, _, _, expected, _) in CASES.items()}
    ours = {nodes[case]: expected for case, (_, _, _, _, expected) in CASES.items()}
    node_names = list(nodes.values())
    # Both learn through their watches; each must settle on exactly its figure.
    wait_for(
        lambda: extender_counts(cluster, node_names) == ours,
        timeout_seconds=30,
        what="the extender's counts",
    )
    seen: dict[str, tuple[int, int]] = {}

    def settled() -> bool:
        seen.update(scheduler_counts(cluster))
        return {n: seen.get(n) for n in node_names} == theirs

    try:
        wait_for(settled, timeout_seconds=30, what="kube-scheduler's counts", interval=0.5)
    except AssertionError:
        assert {n: seen.get(n) for n in node_names} == theirs
    # Never below kube-scheduler's count, on any node.
    for node in node_names:
        assert all(o >= t for o, t in zip(ours[node], theirs[node], strict=True)), node


def test_no_second_vm_on_a_node_a_foreign_pod_fills(cluster: Cluster, names: Names):
    """The issue's table: each 4-CPU node (3.2 usable) holds a foreign pod kube-scheduler
    counts at 2 CPUs, so one 1-CPU VM fits and a second would over-commit it."""
    nodes = {}
    for case in ("pod-level", "resizing", "allocated"):
        spec, containers, status, _, _ = CASES[case]
        nodes[case] = node = names.node(case, cpu="4")
        place(names, f"{case}-app", node, spec=spec, containers=containers, status=status)

    # The extender has read each pod as the API server now has it (status included), by its
    # own counting: what happens next depends on the counting, not on how fast its watch is.
    latest = {}
    for case, node in nodes.items():
        pod = decode(Pod, json.dumps(names.api.pod(names.namespace, f"{case}-app")))
        latest[node] = msgspec.structs.astuple(pod_requests(pod))
    wait_for(
        lambda: extender_counts(cluster, list(latest)) == latest,
        timeout_seconds=30,
        what="the extender caught up with the foreign pods",
    )
    vms = {case: [f"{case}-vm-{i}" for i in range(2)] for case in nodes}
    for case, node in nodes.items():
        for vm in vms[case]:
            names.vm(vm, node=node)
    for case, pair in vms.items():
        wait_for(
            lambda pair=pair: (
                sum(bool(names.node_of(vm)) for vm in pair) == 1
                and any(names.failed_scheduling(vm) for vm in pair)
            ),
            timeout_seconds=30,
            what=f"one VM of {case} bound and the other refused",
        )
    state = cluster.extender.state()
    for entry in state["nodes"]:
        if entry["name"] in nodes.values():
            assert not entry["overcommitted"], entry
            assert len(entry["allocations"]) == 1, entry
