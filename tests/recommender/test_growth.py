"""Plan for growth (``growth_headroom``): the scale-up sized for VMs' room to grow, on
hand-computed cases. Pool "p": 4 cpu nodes, 20% reserved, 3.2 cpu usable."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import annotations as ann
from scheduler_extender.recommender import (
    RecommenderConfig,
    UnscheduledReason,
    encode_recommendation,
)
from tests.recommender.test_recommender import (
    node,
    pod,
    pool,
    reasons,
    run,
    scaled,
    snap,
    snapshots,
)


def vm(name: str, *, top: int, now: int | None = None, **extra: Any) -> dict[str, Any]:
    annotations = {ann.MIN_VCPUS: "1", ann.MAX_VCPUS: str(top)}
    if now is not None:
        annotations[ann.PERMITTED_VCPUS] = str(now)
    return pod(
        name,
        "1",
        schedulerName="vm-scheduler",
        labels={ann.VM_LABEL: "true"},
        annotations=annotations,
        **extra,
    )


def grow(headroom: float) -> RecommenderConfig:
    return RecommenderConfig(growth_headroom=headroom)


def two_vms_on_one_node() -> dict[str, Any]:
    # Two VMs at 1 vCPU, top 3: at headroom 0.5 each counts 1 + 0.5 x 2 = 2, 4 in all, over
    # n1's 3.2. The lower-priority one is planned to move; the other then fits (2 <= 3.2).
    return snap(
        nodePools=[pool("p")],
        nodes=[node("n1", "p")],
        pods=[
            vm("a", top=3, now=1, nodeName="n1", priority=0),
            vm("b", top=3, now=1, nodeName="n1", priority=10),
        ],
    )


def test_a_vm_its_node_cannot_give_room_to_grow_gets_a_new_node():
    rec = run(two_vms_on_one_node(), grow(0.5))
    # n1 still holds both at 1 vCPU (1.2 free): "a" at 2 vCPUs needs a new node.
    assert scaled(rec) == {"p/a": 1}
    [move] = rec.diagnostics.growth
    assert (move.pod, move.node, move.cpu_millis, move.to_node) == ("ns/a", "n1", 2000, "p-a-new-1")
    assert rec.unscheduled_pods == []


def test_without_a_headroom_running_vms_ask_for_nothing():
    rec = run(two_vms_on_one_node(), grow(0.0))
    assert rec.scale_up == [] and rec.diagnostics.growth == []
    # 0.25: each counts 1 + 0.5 = 1.5, 3 in all: n1 has room for both to grow that far.
    rec = run(two_vms_on_one_node(), grow(0.25))
    assert rec.scale_up == [] and rec.diagnostics.growth == []


def test_pending_vms_are_sized_to_grow_where_they_land():
    # n1 has 3.2 free. A pending VM at 1 vCPU (min), top 7: it fits n1 today; at headroom
    # 0.5 it counts 1 + 3 = 4 and needs a node of pool "big" (8 cpu, 6.4 usable).
    doc = snap(
        nodePools=[pool("p"), pool("big", cpu="8")],
        nodes=[node("n1", "p")],
        pods=[vm("new", top=7)],
    )
    assert [e.node for e in run(doc).diagnostics.placed_on_existing] == ["n1"]
    rec = run(doc, grow(0.5))
    assert scaled(rec) == {"big/a": 1}
    assert rec.diagnostics.new_nodes == {"big-a-new-1": ["ns/new"]}
    # At 1.0 it counts 7: bigger than any template.
    rec = run(doc, grow(1.0))
    assert reasons(rec) == {"ns/new": UnscheduledReason.TOO_BIG}


def test_a_mover_no_pool_can_take_is_said_so_and_not_called_unscheduled():
    doc = two_vms_on_one_node()
    doc["nodePools"][0]["maxCount"] = 1  # n1 is the pool's only node
    rec = run(doc, grow(0.5))
    assert rec.scale_up == []
    [move] = rec.diagnostics.growth
    assert (move.pod, move.to_node) == ("ns/a", None)
    assert rec.unscheduled_pods == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=snapshots(), headroom=st.sampled_from([0.0, 0.3, 1.0]))
def test_any_snapshot_plans_growth_for_placed_vms_only(doc, headroom):
    for i, p in enumerate(doc["pods"]):
        if i % 2 == 0:  # every other pod one of our VMs, 1 vCPU now, top 4
            p["schedulerName"] = "vm-scheduler"
            p["labels"] = {ann.VM_LABEL: "true"}
            p["annotations"] = {ann.MIN_VCPUS: "1", ann.MAX_VCPUS: "4"}
    rec = run(doc, grow(headroom))
    placed = {f"ns/{p['name']}" for p in doc["pods"] if p.get("nodeName")}
    assert {m.pod for m in rec.diagnostics.growth} <= placed
    assert not placed & set(rec.unscheduled_pods)
    if headroom == 0:
        assert encode_recommendation(rec) == encode_recommendation(run(doc, RecommenderConfig()))
