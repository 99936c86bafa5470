"""A pending VM binds soon after room frees, even when the extender hears of it last.

kube-scheduler retries a pod rejected for room as soon as its informers see room free (a pod
deleted or finished). The extender learns the same from its own watch, a few milliseconds to
seconds later. A retry that arrives first is rejected again, and with no further event
kube-scheduler parks the pod until its five-minute flush, although ``/state`` shows the room
free. Here the extender's link to the API server lags by a known amount (``LaggingLink``), so
every retry arrives first: the VM binds only if the extender itself prompts a retry once its
watch catches up.
"""

from __future__ import annotations

import time

from testkit.cluster import Cluster, Names
from testkit.controlplane import wait_for


def extender_knows(cluster: Cluster, node: str) -> bool:
    return any(n["name"] == node and n["known"] for n in cluster.extender.state()["nodes"])


def test_a_pending_vm_binds_soon_after_room_frees(lagging: Cluster, names: Names):
    node = names.node("a", cpu="2.5")  # room for two VMs of one vCPU
    wait_for(lambda: extender_knows(lagging, node), timeout_seconds=30, what="node known")
    holders = ["vm-0", "vm-1"]
    for vm in holders:
        names.vm(vm)
    for vm in holders:
        names.wait_bound(vm)
    for round_, way in enumerate(["deleted", "succeeded", "failed"]):
        waiting = f"vm-w{round_}"
        names.vm(waiting)
        wait_for(
            lambda w=waiting: names.failed_scheduling(w),  # type: ignore[misc]
            timeout_seconds=30,
            what=f"{waiting} rejected",
        )
        # Past the first back-off: kube-scheduler retries the moment it hears of the room.
        time.sleep(1.5)
        victim = holders.pop(0)
        if way == "deleted":
            names.api.delete(f"/api/v1/namespaces/{names.namespace}/pods/{victim}")
        else:
            # The kubelet's part: the VM's process ended; the pod stays, terminated.
            names.api.set_pod_phase(names.namespace, victim, way.capitalize())
        # Far below the five-minute flush it would otherwise wait for.
        assert names.wait_bound(waiting, timeout_seconds=60) == node, way
        holders.append(waiting)


def test_vms_waiting_for_a_node_take_it_when_it_is_added(lagging: Cluster, names: Names):
    """The same race for a new node: kube-scheduler offers it before the extender's node
    watch has it, and the extender can only say it does not know that node yet."""
    for vm in ("vm-0", "vm-1"):
        names.vm(vm)
    wait_for(lambda: names.failed_scheduling("vm-1"), timeout_seconds=30, what="no node for vm-1")
    time.sleep(1.5)
    node = names.node("late", cpu="2.5")
    assert names.wait_bound("vm-0", timeout_seconds=60) == node
    assert names.wait_bound("vm-1", timeout_seconds=60) == node


def test_a_new_vm_binds_on_the_first_try_though_the_watch_has_not_seen_it(
    lagging: Cluster, names: Names
):
    """kube-scheduler filters and binds a new pod within milliseconds of its creation, before
    the extender's pod watch has delivered it. bind used to refuse such a pod ("not known to
    the extender yet") and kube-scheduler retried after its back-off; the pod as kube-scheduler
    sent it to filter is enough to reserve for it."""
    node = names.node("a", cpu="10")
    wait_for(lambda: extender_knows(lagging, node), timeout_seconds=30, what="node known")
    for i in range(3):
        names.vm(f"vm-{i}")
    for i in range(3):
        assert names.wait_bound(f"vm-{i}") == node
    for i in range(3):
        assert names.failed_scheduling(f"vm-{i}") == []
    state = lagging.extender.state()
    entry = next(n for n in state["nodes"] if n["name"] == node)
    assert sorted(a["pod"] for a in entry["allocations"]) == [
        f"{names.namespace}/vm-{i}" for i in range(3)
    ]
