"""kube-scheduler v1.36 calling the extender, against kube-apiserver v1.36: placement.

Node sizes are chosen so the extender, not kube-scheduler's own resource fit, is what says no:
a node of 2.5 CPUs keeps 20% for the host (``system_reserve.cpu_fraction`` in the deployed
config), which leaves exactly two VMs of one vCPU, while kube-scheduler alone would place a third.
"""

from __future__ import annotations

import time

from testkit.cluster import Cluster, Names
from testkit.controlplane import wait_for


def own_pods(state: dict, node: str) -> list[str]:
    for entry in state["nodes"]:
        if entry["name"] == node:
            return sorted(a["pod"] for a in entry["allocations"])
    return []


def test_room_is_what_the_reserve_and_foreign_pods_leave(cluster: Cluster, names: Names):
    node = names.node("a", cpu="5")  # 4 usable after the reserve
    names.foreign("app", node=node, cpu="1")
    names.foreign("static", node=node, cpu="1", static=True)
    vms = [f"vm-{i}" for i in range(3)]
    for vm in vms:
        names.vm(vm)
    # Which two get the room is kube-scheduler's choice; that exactly two do is ours.
    bound = wait_for(
        lambda: (
            [vm for vm in vms if names.node_of(vm)]
            if sum(bool(names.node_of(vm)) for vm in vms) == 2
            else None
        ),
        timeout_seconds=30,
        what="two VMs bound",
    )
    (waiting,) = set(vms) - set(bound)
    messages = wait_for(
        lambda: names.failed_scheduling(waiting), timeout_seconds=30, what="FailedScheduling"
    )
    # The extender's own words reach the user through kube-scheduler's event: filter's, or,
    # when two pods passed filter together (filter reserves nothing), the losing bind's.
    # kube-scheduler's own resource fit would say "Insufficient cpu", and let this VM in.
    assert any("insufficient cpu: " in m and "needs 1000m" in m for m in messages), messages
    time.sleep(1)  # nothing binds it later either
    assert names.node_of(waiting) is None
    assert {names.node_of(vm) for vm in bound} == {node}
    state = cluster.extender.state()
    entry = next(n for n in state["nodes"] if n["name"] == node)
    assert own_pods(state, node) == sorted(f"{names.namespace}/{vm}" for vm in bound)
    assert sorted(a["pod"] for a in entry["foreignAllocations"]) == [
        f"{names.namespace}/app",
        f"{names.namespace}/static",
    ]
    assert entry["free"]["cpuMillis"] == 0
