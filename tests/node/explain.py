"""What the cluster looked like when a test of the tier failed, for its report.

CI shows only pytest's output, and the cluster (with its pods' logs) is gone once the session
ends; so when a test of the tier fails, ``tests/node/conftest.py`` appends this to its report:
who holds both Leases, the extender pods (node, role label, Ready, restarts), where the permit
Service routes, the VirtualMachines as ``kubectl get vm`` shows them, the VM pods and why any of
them waits, and the last lines of every system container's log (the extenders', kube-scheduler's,
the agents', the vm-controller's). The whole logs go to the session's ``logs/`` directory too.
Every read is best effort: a snapshot that cannot read something says so and goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.node.harness import Node, Obj

NS = "vm-autoscaling"
LEASES = ("vm-scheduler", "vm-scheduler-extender")
ROLE = "vm-autoscaling.io/extender-role"
TAIL = 30  # log lines per container in the report (the files keep everything)


def _try(what: str, read: Callable[[], str]) -> str:
    try:
        return read()
    except Exception as e:  # a snapshot must not hide the failure it explains
        return f"({what}: cannot read: {e})"


def _leases(node: Node) -> str:
    lines = []
    for name in LEASES:
        spec = node.admin_get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}")["spec"]
        lines.append(
            f"  {name}: holder={spec.get('holderIdentity')!r} "
            f"renew={spec.get('renewTime')} acquired={spec.get('acquireTime')} "
            f"duration={spec.get('leaseDurationSeconds')} "
            f"transitions={spec.get('leaseTransitions')}"
        )
    return "\n".join(lines)


def _pod_line(pod: Obj) -> str:
    meta, status = pod["metadata"], pod.get("status", {})
    ready = {c["type"]: c["status"] for c in status.get("conditions", [])}
    restarts = {s["name"]: s["restartCount"] for s in status.get("containerStatuses") or []}
    waiting = [c.get("message") for c in status.get("conditions", [])
               if c["type"] == "PodScheduled" and c["status"] == "False"]  # fmt: skip
    role = (meta.get("labels") or {}).get(ROLE)
    return (
        f"  {meta['name']} node={pod['spec'].get('nodeName')} phase={status.get('phase')} "
        f"ready={ready.get('Ready')} role={role} restarts={restarts}"
        + (" deleting" if meta.get("deletionTimestamp") else "")
        + (f" unscheduled: {waiting[0]}" if waiting else "")
    )


def _pods(node: Node, namespace: str, selector: str = "") -> list[Obj]:
    args = ["-n", namespace, "get", "pods", "-o", "json"] + (["-l", selector] if selector else [])
    items: list[Obj] = json.loads(node.kubectl(*args).stdout)["items"]
    return items


def _routes(node: Node) -> str:
    slices = node.admin_get(
        f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
        "?labelSelector=kubernetes.io/service-name=scheduler-extender"
    )["items"]
    found = [
        f"{e.get('targetRef', {}).get('name')} {e['addresses']} {e.get('conditions')}"
        for s in slices
        for e in s.get("endpoints") or []
    ]
    return "  " + ("\n  ".join(found) if found else "(no endpoints)")


def _vms(node: Node) -> str:
    out = node.kubectl("get", "vm", "-A", check=False)
    return "  " + "\n  ".join((out.stdout or out.stderr or "(none)").splitlines())


def _logs(node: Node, pod: Obj, container: str, save: Path) -> str:
    name = pod["metadata"]["name"]
    out = node.kubectl("-n", NS, "logs", name, "-c", container, check=False)
    text = out.stdout or out.stderr
    (save / f"{name}-{container}.log").write_text(text)
    lines = text.splitlines()[-TAIL:]
    return f"--- {name} {container} (last {len(lines)} lines):\n" + "\n".join(lines)


def snapshot(node: Node, save: Path) -> str:
    """The report text; the containers' whole logs into ``save``."""
    save.mkdir(parents=True, exist_ok=True)
    parts = [
        "Leases:\n" + _try("Leases", lambda: _leases(node)),
        "permit Service routes to:\n" + _try("EndpointSlices", lambda: _routes(node)),
    ]
    try:
        system = _pods(node, NS)
        vms = _pods(node, "default")
    except Exception as e:
        parts.append(f"(pods: cannot read: {e})")
        return "\n".join(parts)
    parts.append("system pods:\n" + "\n".join(map(_pod_line, system)))
    parts.append("VirtualMachines:\n" + _try("VirtualMachines", lambda: _vms(node)))
    parts.append("VM pods (default):\n" + ("\n".join(map(_pod_line, vms)) or "  (none)"))
    for pod in system:
        for container in pod["spec"]["containers"]:

            def logs(pod: Obj = pod, name: str = container["name"]) -> str:
                return _logs(node, pod, name, save)

            parts.append(_try(f"{pod['metadata']['name']} logs", logs))
    parts.append(f"(whole logs in {save})")
    return "\n".join(parts)
