"""Builders for VM pods and filter/bind/permit bodies used by several extender tests."""

from __future__ import annotations

from typing import Any

from testkit.kube_api import TokenIdentity, pod_object

VM_LABELS = {"vm-autoscaling.io/vm": "true"}


def vm_pod(
    name: str,
    *,
    uid: str,
    node: str | None = None,
    min_vcpus: int = 1,
    max_vcpus: int = 4,
    extra: dict[str, str] | None = None,
    drop: tuple[str, ...] = (),
    memory: str = "1Gi",
) -> dict[str, Any]:
    annotations = {
        "vm-autoscaling.io/min-vcpus": str(min_vcpus),
        "vm-autoscaling.io/max-vcpus": str(max_vcpus),
        **(extra or {}),
    }
    for key in drop:
        annotations.pop(key)
    return pod_object(
        name,
        namespace="vms",
        uid=uid,
        node_name=node,
        labels=VM_LABELS,
        annotations=annotations,
        cpu=str(min_vcpus),
        memory=memory,
        phase="Running" if node else "Pending",
    )


def filter_body(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def bind_body(pod: dict[str, Any], node: str) -> dict[str, Any]:
    meta = pod["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": node,
    }


def permit_batch(
    node: str,
    *,
    uid: str,
    name: str = "vm-1",
    current: int = 1,
    requested: int = 2,
    last_permit: int | None = None,
    protocol: tuple[int, int] = (1, 1),
    memory: tuple[int, int] = (2**30, 2**30),
    last_memory: int = 2**30,
) -> dict[str, Any]:
    """One VM's request; ``memory`` is (current, requested) in bytes."""
    request: dict[str, Any] = {
        "pod": {"namespace": "vms", "name": name, "uid": uid},
        "node": node,
        "current": {"vcpus": current, "memoryBytes": memory[0]},
        "requested": {"vcpus": requested, "memoryBytes": memory[1]},
    }
    if last_permit is not None:
        request["lastPermit"] = {"vcpus": last_permit, "memoryBytes": last_memory}
    return {
        "protocol": {"min": protocol[0], "max": protocol[1]},
        "node": node,
        "requests": [request],
    }


AGENT_NAMESPACE = "vm-autoscaling"
AGENT_SERVICE_ACCOUNT = "autoscaler-agent"
AGENT_USER = f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}"


def agent_pod(
    node: str,
    *,
    name: str | None = None,
    uid: str | None = None,
    namespace: str = AGENT_NAMESPACE,
    service_account: str = AGENT_SERVICE_ACCOUNT,
    phase: str = "Running",
) -> dict[str, Any]:
    """A pod of the agent DaemonSet on ``node`` (or of another ServiceAccount, for attacks)."""
    pod = pod_object(
        name or f"autoscaler-agent-{node}",
        namespace=namespace,
        uid=uid or f"agent-pod-{node}",
        node_name=node,
        labels={"app.kubernetes.io/name": "autoscaler-agent"},
        cpu="10m",
        memory="64Mi",
        scheduler_name="default-scheduler",
        phase=phase,
    )
    pod["spec"]["serviceAccountName"] = service_account
    return pod


def pod_token(pod: dict[str, Any], **kw: Any) -> TokenIdentity:
    """What a TokenReview says of a token bound to ``pod`` (see token-claims.json)."""
    meta, spec = pod["metadata"], pod["spec"]
    return TokenIdentity(
        username=f"system:serviceaccount:{meta['namespace']}:{spec['serviceAccountName']}",
        node_name=spec["nodeName"],
        node_uid=f"uid-of-{spec['nodeName']}",
        pod_name=meta["name"],
        pod_uid=meta["uid"],
        **kw,
    )


async def ask_memory(
    client: Any,
    headers: dict[str, str],
    *,
    current: int,
    requested: int,
    last: int,
    node: str = "node-a",
    uid: str = "u-1",
) -> dict[str, Any]:
    """One VM at 1 vCPU asks for memory (bytes); its Permit, as the permit port answers it."""
    body = permit_batch(
        node,
        uid=uid,
        current=1,
        requested=1,
        last_permit=1,
        memory=(current, requested),
        last_memory=last,
    )
    response = await client.post("/v1/permits", json=body, headers=headers)
    assert response.status == 200, await response.text()
    permit: dict[str, Any] = (await response.json())["permits"][0]
    return permit
