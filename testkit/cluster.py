"""What the control-plane tests and benchmarks build on the real control plane: a test's own
namespace and nodes (``Names``), the extender and kube-scheduler calling it (``running_cluster``),
and the agent DaemonSet's pod as the kubelet would report it (``agent_pod``).

Tests stay independent through names: each makes its own namespace and nodes, and its pods
select their own nodes by label, so another test's nodes never take its pods.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.controlplane import (
    MANIFEST_EXTENDER_CONFIG,
    MANIFEST_SCHEDULER_CONFIG,
    SCHEDULER_NAME,
    Api,
    ControlPlane,
    Extender,
    LaggingLink,
    Obj,
    Scheduler,
    extender_config,
    extender_token,
    pod_path,
    scheduler_config,
    wait_for,
)
from testkit.ports import free_port

AGENT_NS = "vm-autoscaling"
AGENT_SA = "autoscaler-agent"


@dataclass
class Cluster:
    cp: ControlPlane
    api: Api
    extender: Extender
    scheduler: Scheduler


def new_extender(cp: ControlPlane, kubeconfig: Path, work: Path, **overrides: Any) -> Extender:
    config = extender_config(
        MANIFEST_EXTENDER_CONFIG,
        verbs_port=free_port(),
        permits_port=free_port(),
        metrics_port=free_port(),
    )
    config.update(overrides)
    return Extender(work, kubeconfig, config)


@contextlib.contextmanager
def running_cluster(
    cp: ControlPlane, kubeconfig: Path, work: Path, *, api_lag_seconds: float = 0.0
) -> Iterator[Cluster]:
    """The extender and kube-scheduler calling it; with ``api_lag_seconds``, everything the
    API server sends the extender (lists, watch events, answers) arrives that much late."""
    link = None
    extender_kubeconfig = kubeconfig
    if api_lag_seconds:
        link = LaggingLink(cp.port, delay_seconds=api_lag_seconds)
        extender_kubeconfig = cp.write_kubeconfig(
            work / "lagging.kubeconfig", token=extender_token(kubeconfig), port=link.port
        )
    extender = new_extender(cp, extender_kubeconfig, work)
    scheduler = Scheduler(
        cp.bin_dir,
        work,
        cp,
        scheduler_config(
            MANIFEST_SCHEDULER_CONFIG, kubeconfig=kubeconfig, verbs_port=extender.verbs_port
        ),
    )
    api = cp.admin()
    try:
        extender.start()
        scheduler.start()
        yield Cluster(cp, api, extender, scheduler)
    finally:
        scheduler.stop()
        extender.stop()
        api.close()
        if link is not None:
            link.close()


@dataclass
class Names:
    """A test's own namespace and node-name prefix, and builders for its objects."""

    api: Api
    namespace: str
    group: str
    nodes: list[str] = field(default_factory=list)
    # Objects outside the namespace to delete at the end (paths).
    cleanup: list[str] = field(default_factory=list)

    def node(self, suffix: str, *, cpu: str, memory: str = "16Gi", **labels: str) -> str:
        name = f"{self.group}-{suffix}"
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"vma-test-group": self.group, "kubernetes.io/hostname": name, **labels},
            },
            "status": {
                "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        self.api.create("/api/v1/nodes", body)
        self.nodes.append(name)
        return name

    def vm(
        self,
        name: str,
        *,
        min_vcpus: int = 1,
        max_vcpus: int = 1,
        memory: str = "1Gi",
        annotations: dict[str, str] | None = None,
        node: str | None = None,
    ) -> Obj:
        """A VM pod of the group's; with ``node``, aimed at that node alone."""
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {"vm-autoscaling.io/vm": "true"},
                "annotations": {
                    "vm-autoscaling.io/min-vcpus": str(min_vcpus),
                    "vm-autoscaling.io/max-vcpus": str(max_vcpus),
                    **(annotations or {}),
                },
            },
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "nodeSelector": {"vma-test-group": self.group}
                if node is None
                else {"kubernetes.io/hostname": node},
                "containers": [
                    {
                        "name": "vm",
                        "image": "vm-runner",
                        "resources": {
                            "requests": {"cpu": str(min_vcpus), "memory": memory},
                            "limits": {"cpu": str(min_vcpus), "memory": memory},
                        },
                    }
                ],
            },
        }
        return self.api.create(pod_path(self.namespace), body)

    def foreign(self, name: str, *, node: str, cpu: str, static: bool = False) -> Obj:
        """A pod someone else placed: already bound (``nodeName``), default scheduler."""
        meta: Obj = {"name": name, "namespace": self.namespace}
        if static:
            # What the kubelet's mirror of a static pod looks like through the API.
            meta["annotations"] = {"kubernetes.io/config.mirror": "mirror"}
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": str(uuid.uuid4())}
            ]
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": "c", "image": "app", "resources": {"requests": {"cpu": cpu}}}
                ],
            },
        }
        return self.api.create(pod_path(self.namespace), body)

    def node_of(self, pod: str) -> str | None:
        node: str | None = self.api.pod(self.namespace, pod)["spec"].get("nodeName")
        return node

    def wait_bound(self, pod: str, *, timeout_seconds: float = 30) -> str:
        node: str = wait_for(
            lambda: self.node_of(pod), timeout_seconds=timeout_seconds, what=f"{pod} bound"
        )
        return node

    def failed_scheduling(self, pod: str) -> list[str]:
        return [
            e.get("message", "")
            for e in self.api.events_for(self.namespace, pod)
            if e.get("reason") == "FailedScheduling"
        ]


def agent_pod(names: Names, node: str) -> Obj:
    """The agent DaemonSet's pod on ``node``, as the kubelet would report it: Running."""
    name = f"agent-{node}"
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": AGENT_NS,
            "labels": {"app.kubernetes.io/name": "autoscaler-agent"},
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": AGENT_SA,
            "containers": [{"name": "agent", "image": "agent"}],
        },
    }
    pod = names.api.create(pod_path(AGENT_NS), body)
    names.api.set_pod_phase(AGENT_NS, name, "Running")
    names.cleanup.append(pod_path(AGENT_NS, name))
    return pod


def permit_batch(node: str, vm: Obj, *, current: int, requested: int) -> Obj:
    meta = vm["metadata"]
    gib = 2**30
    return {
        "protocol": {"min": 1, "max": 1},
        "node": node,
        "requests": [
            {
                "pod": {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]},
                "node": node,
                "current": {"vcpus": current, "memoryBytes": gib},
                "requested": {"vcpus": requested, "memoryBytes": gib},
            }
        ],
    }
