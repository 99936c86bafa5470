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

from protocol.annotations import MIN_VCPUS
from testkit.controlplane import wait_for
from tests.node.conftest import RELIEVABLE_MAX_VCPUS, apply_example_vm
from tests.node.harness import VM, Node, Obj, container_cgroup, wait_postgres

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
AGENT = "app.kubernetes.io/name=autoscaler-agent"
# The leading replica (it labels its own pod; the permit Service selects the label).
LEADER = "app.kubernetes.io/name=scheduler-extender,vm-autoscaling.io/extender-role=leader"
# The pods of manifests/examples/double/'s VirtualMachines (each named as its VM).
DOUBLE = ("pg-vm-a", "pg-vm-b")


CFS_PERIOD_US = 100_000  # the kubelet's cpu.cfs_period_us: a quota of one CPU


def _quota(pod: Obj) -> int:
    return int((container_cgroup(pod, "cpu") / "cpu.cfs_quota_us").read_text())


@pytest.fixture(autouse=True)
def _on_the_tuned_system(tuned: Node) -> None:
    """Every case runs on the system as the tier's overlay leaves it (two extender replicas, a
    leader and a standby; room on the 2-CPU node for two 1-vCPU VMs), whether or not
    test_deploy ran first. A failing case reports the cluster as it was (conftest.py)."""


def _pods(node: Node, selector: str, on: str | None = None) -> list[str]:
    """Names of the pods ``selector`` selects (``on``: on that node only)."""
    where = ["--field-selector", f"spec.nodeName={on}"] if on else []
    out = node.kubectl(
        "-n", "vm-autoscaling", "get", "pods", "-l", selector, *where,
        "-o", "jsonpath={.items[*].metadata.name}",
    ).stdout  # fmt: skip
    return out.split()


def _replaced(node: Node, selector: str, kind_name: str, on: str | None = None) -> float:
    """Delete the workload's pod (``on`` that node), wait for its successor to be Ready;
    seconds it took."""
    (old,) = _pods(node, selector, on)
    started = time.monotonic()
    node.kubectl("-n", "vm-autoscaling", "delete", "pod", old, "--wait=false")
    wait_for(
        lambda: old not in _pods(node, selector) and _pods(node, selector, on),
        timeout_seconds=90,
        what=f"a pod to replace {old}",
        interval=0.5,
    )
    node.rollout(kind_name)
    return time.monotonic() - started


def test_a_deleted_agent_pod_is_replaced_and_the_vm_keeps_its_size(deployed: Node, vm: Obj) -> None:
    # A quiet VM at its minimum first: the guest fills its database at boot, and may grow for
    # that (the agent's doing, not the replacement's).
    wait_postgres(vm["status"]["podIP"])
    minimum = int(vm["metadata"]["annotations"][MIN_VCPUS])
    wait_for(
        lambda: _quota(deployed.pod("default", VM)) == CFS_PERIOD_US * minimum,
        timeout_seconds=120, what=f"{VM} back at its minimum", interval=0.5,
    )  # fmt: skip
    pod = deployed.pod("default", VM)
    quota = _quota(pod)
    since = time.time()
    took = _replaced(deployed, AGENT, "daemonset/autoscaler-agent", on=pod["spec"]["nodeName"])
    print(f"agent pod deleted -> replacement Ready: {took:.1f}s")

    def reported() -> list[Obj]:
        events = deployed.agent_events(since, pod["spec"]["nodeName"])
        return [e for e in events if e["event"] == "permit_answered"]

    answers = wait_for(reported, timeout_seconds=60, what="the new agent's report", interval=1)
    assert answers[0]["outcome"] in ("granted", "released"), answers[0]
    after = deployed.pod("default", VM)
    assert after["metadata"]["uid"] == pod["metadata"]["uid"]
    assert _quota(after) == quota


def test_a_deleted_extender_pod_is_replaced_and_rebuilds_the_vm(deployed: Node, vm: Obj) -> None:
    since = time.time()
    # The leader: the standby takes over, and the replacement becomes the new standby.
    took = _replaced(deployed, LEADER, "deployment/scheduler-extender")
    here = vm["spec"]["nodeName"]
    print(f"extender pod deleted -> replacement Ready: {took:.1f}s")

    # The agent notices the new extender (its epoch) and reports the VM's size again.
    def reported() -> list[Obj]:
        events = deployed.agent_events(since, here)
        return [e for e in events if e["event"] == "extender_epoch_changed"]

    (met, *_) = wait_for(
        reported, timeout_seconds=60, what="the agent meeting the new extender", interval=1
    )
    leader = ", ".join(_pods(deployed, LEADER))
    took = met["t"] - since
    print(f"the pod labelled leader: {leader}; the agent on {here} met it {took:.1f}s after the "
          "deletion")  # fmt: skip
    events = deployed.agent_events(since, here)
    # Holding, not shrinking or growing the VM, while no extender answered.
    assert not [e for e in events if e["event"] == "resize_started"], events


def test_a_kubelet_restart_leaves_the_vm_running(deployed: Node, vm: Obj) -> None:
    before = deployed.pod("default", VM)
    (status,) = [s for s in before["status"]["containerStatuses"] if s["name"] == "vm"]
    member = deployed.members[before["spec"]["nodeName"]]
    started = time.monotonic()
    member.stop_kubelet()
    member.start_kubelet()
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
    """The 2-CPU node holds two 1-vCPU VMs: pg-vm and one of pg-vm-a and pg-vm-b fill it
    (whichever kube-scheduler takes first: both VirtualMachines are applied at once), the other
    waits; deleting pg-vm (its VirtualMachine, so nothing recreates its pod) lets the waiting
    one in. The other nodes are cordoned meanwhile (kube-scheduler's NodeUnschedulable filter
    runs before the extender), so that the one node is all there is; uncordoned, pg-vm applied
    again (at node 1's size, for test_migration's relief) finds that node full and vm-scheduler
    places it on another: VMs on two nodes. Every VM pod here is the vm-controller's."""
    double = str(ROOT / "manifests" / "examples" / "double")
    here = vm["spec"]["nodeName"]
    others = [n for n in deployed.members if n != here]
    for other in others:
        deployed.kubectl("cordon", other)
    deployed.kubectl("apply", "-k", double)
    try:

        def is_waiting(pod: Obj) -> bool:
            return not pod["spec"].get("nodeName") and any(
                c["type"] == "PodScheduled" and c["status"] == "False"
                for c in pod.get("status", {}).get("conditions", [])
            )

        def one_placed_one_waiting() -> str | None:
            """The name of the waiting VM, once the other is placed."""
            pods = {n: deployed.pod_or_none("default", n) for n in DOUBLE}
            if None in pods.values():  # the vm-controller has not made them yet
                return None
            (a, pa), (b, pb) = pods.items()
            assert pa is not None and pb is not None
            if pa["spec"].get("nodeName") and is_waiting(pb):
                return b
            if pb["spec"].get("nodeName") and is_waiting(pa):
                return a
            return None

        waiting: str = wait_for(
            one_placed_one_waiting, timeout_seconds=90, what="one double VM placed, one waiting"
        )
        started = time.monotonic()
        deployed.kubectl("delete", "-k", str(ROOT / "manifests" / "examples"), "--wait=false")

        def waiting_running() -> bool:
            pod = deployed.pod_or_none("default", waiting) or {}
            statuses = pod.get("status", {}).get("containerStatuses") or []
            return bool(statuses and statuses[0].get("state", {}).get("running"))

        wait_for(waiting_running, timeout_seconds=120, what=f"{waiting} running", interval=0.5)
        print(f"VM deleted -> waiting VM running: {time.monotonic() - started:.1f}s")
        if not others:
            return
        # its grace period is 40 s (QEMU's shutdown)
        wait_for(lambda: deployed.pod_or_none("default", VM) is None, timeout_seconds=90,
                 what=f"{VM} gone")  # fmt: skip
        for other in others:
            deployed.kubectl("uncordon", other)
        started = time.monotonic()
        # At node 1's size: test_migration, next, has relief move it there under load.
        apply_example_vm(deployed, max_vcpus=RELIEVABLE_MAX_VCPUS)
        placed: str = wait_for(
            lambda: (deployed.pod_or_none("default", VM) or {}).get("spec", {}).get("nodeName"),
            timeout_seconds=90, what=f"{VM} placed again", interval=0.5,
        )  # fmt: skip
        nodes = {deployed.pod("default", n)["spec"]["nodeName"] for n in DOUBLE}
        print(f"{VM} applied again -> bound on {placed}: {time.monotonic() - started:.1f}s; "
              f"the double VMs on {sorted(nodes)}")  # fmt: skip
        assert nodes == {here} and placed in others, (nodes, placed)
    finally:
        for other in others:
            deployed.kubectl("uncordon", other, check=False)
        deployed.kubectl("delete", "-k", double, "--wait=false", check=False)
