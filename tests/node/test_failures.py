"""What goes wrong on a real node, after the benchmark, on the same node and VM.

The agent pod deleted: the DaemonSet replaces it, the VM keeps its size, the new agent reads
the VM and reports to the extender. The extender pod deleted: the Deployment replaces it, the
new extender rebuilds the VM's allocation from the API, and the agent, which held meanwhile,
is answered again. The kubelet restarted: the VM's container keeps running, untouched. A VM
deleted: its room goes to a VM that was waiting for it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from testkit.controlplane import wait_for
from tests.node.harness import VM, Node, Obj, container_cgroup

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
AGENT = "app.kubernetes.io/name=autoscaler-agent"
EXTENDER = "app.kubernetes.io/name=scheduler-extender"


def _quota(pod: Obj) -> int:
    return int((container_cgroup(pod, "cpu") / "cpu.cfs_quota_us").read_text())


def _pods(node: Node, selector: str) -> list[str]:
    out = node.kubectl(
        "-n",
        "vm-autoscaling",
        "get",
        "pods",
        "-l",
        selector,
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ).stdout
    return out.split()


def _replaced(node: Node, selector: str, kind_name: str) -> float:
    """Delete the workload's pod, wait for its successor to be Ready; seconds it took."""
    (old,) = _pods(node, selector)
    started = time.monotonic()
    node.kubectl("-n", "vm-autoscaling", "delete", "pod", old, "--wait=false")
    wait_for(
        lambda: old not in _pods(node, selector) and _pods(node, selector),
        timeout_seconds=90,
        what=f"a pod to replace {old}",
        interval=0.5,
    )
    node.rollout(kind_name)
    return time.monotonic() - started


def test_a_deleted_agent_pod_is_replaced_and_the_vm_keeps_its_size(deployed: Node, vm: Obj) -> None:
    pod = deployed.pod("default", VM)
    quota = _quota(pod)
    since = time.time()
    took = _replaced(deployed, AGENT, "daemonset/autoscaler-agent")
    print(f"agent pod deleted -> replacement Ready: {took:.1f}s")

    def reported() -> list[Obj]:
        return [e for e in deployed.agent_events(since) if e["event"] == "permit_answered"]

    answers = wait_for(reported, timeout_seconds=60, what="the new agent's report", interval=1)
    assert answers[0]["outcome"] in ("granted", "released"), answers[0]
    after = deployed.pod("default", VM)
    assert after["metadata"]["uid"] == pod["metadata"]["uid"]
    assert _quota(after) == quota


def test_a_deleted_extender_pod_is_replaced_and_rebuilds_the_vm(deployed: Node, vm: Obj) -> None:
    since = time.time()
    took = _replaced(deployed, EXTENDER, "deployment/scheduler-extender")
    print(f"extender pod deleted -> replacement Ready: {took:.1f}s")

    # The agent notices the new extender (its epoch) and reports the VM's size again.
    def reported() -> list[Obj]:
        return [e for e in deployed.agent_events(since) if e["event"] == "extender_epoch_changed"]

    wait_for(reported, timeout_seconds=60, what="the agent meeting the new extender", interval=1)
    events = deployed.agent_events(since)
    # Holding, not shrinking or growing the VM, while no extender answered.
    assert not [e for e in events if e["event"] == "resize_started"], events


def test_a_kubelet_restart_leaves_the_vm_running(deployed: Node, vm: Obj) -> None:
    before = deployed.pod("default", VM)
    (status,) = [s for s in before["status"]["containerStatuses"] if s["name"] == "vm"]
    started = time.monotonic()
    deployed.stop_kubelet()
    deployed.start_kubelet()
    print(
        f"kubelet restart -> node Ready (a heartbeat from the new kubelet): "
        f"{time.monotonic() - started:.1f}s"
    )

    def running_again() -> Obj | None:
        pod = deployed.pod("default", VM)
        (s,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == "vm"]
        return pod if s.get("ready") else None

    after: Obj = wait_for(running_again, timeout_seconds=60, what=f"{VM} ready", interval=0.5)
    (now,) = [s for s in after["status"]["containerStatuses"] if s["name"] == "vm"]
    assert now["containerID"] == status["containerID"]
    assert now["restartCount"] == status["restartCount"]


def test_a_deleted_vm_frees_its_room_for_a_waiting_vm(deployed: Node, vm: Obj) -> None:
    """The 2-CPU node holds two 1-vCPU VMs: pg-vm-0 and pg-vm-a-0 fill it, pg-vm-b-0 waits;
    deleting pg-vm-0 (its StatefulSet, so nothing recreates it) lets pg-vm-b-0 in."""
    double = str(ROOT / "manifests" / "examples" / "double")
    deployed.kubectl("apply", "-k", double)
    try:

        def waiting() -> bool:
            a = deployed.pod_or_none("default", "pg-vm-a-0")
            b = deployed.pod_or_none("default", "pg-vm-b-0")
            if a is None or b is None:  # the StatefulSet controller has not made them yet
                return False
            return (
                bool(a["spec"].get("nodeName"))
                and not b["spec"].get("nodeName")
                and any(
                    c["type"] == "PodScheduled" and c["status"] == "False"
                    for c in b.get("status", {}).get("conditions", [])
                )
            )

        wait_for(waiting, timeout_seconds=90, what="pg-vm-a-0 placed, pg-vm-b-0 waiting")
        started = time.monotonic()
        deployed.kubectl("delete", "-k", str(ROOT / "manifests" / "examples"), "--wait=false")

        def b_running() -> bool:
            b = deployed.pod_or_none("default", "pg-vm-b-0") or {}
            statuses = b.get("status", {}).get("containerStatuses") or []
            return bool(statuses and statuses[0].get("state", {}).get("running"))

        wait_for(b_running, timeout_seconds=120, what="pg-vm-b-0 running", interval=0.5)
        print(f"VM deleted -> waiting VM running: {time.monotonic() - started:.1f}s")
    finally:
        deployed.kubectl("delete", "-k", double, "--wait=false", check=False)
