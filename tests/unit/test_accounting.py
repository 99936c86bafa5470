"""Scenario tests of the ledger, bind and permit rules (the pure core)."""

import msgspec
import pytest

from protocol import annotations as ann
from protocol.permits import PermitStatus, PodRef, ResourceRequest, Resources
from scheduler_extender.core.ledger import (
    Conflict,
    ForeignTag,
    Ledger,
    NoRoom,
    SystemReserve,
    UnknownNode,
)
from scheduler_extender.core.permits import decide, decide_batch
from scheduler_extender.core.placement import (
    FitIndex,
    Strategy,
    choose_victims,
    rejection,
    score_nodes,
)
from scheduler_extender.core.podinfo import Demand, PodInfo
from scheduler_extender.core.refusals import Refusal, Refused

GI = 2**30


def info(
    uid,
    *,
    node=None,
    cpu=0,
    mem=0,
    ours=False,
    vm=None,
    static=False,
    terminated=False,
    permitted=None,
    priority=0,
):
    return PodInfo(
        uid=uid,
        namespace="ns",
        name=f"pod-{uid}",
        node_name=node,
        scheduler_name="vm-scheduler" if ours else "default-scheduler",
        requests=Demand(cpu, mem),
        priority=priority,
        is_ours=ours,
        is_vm=vm is not None,
        is_static=static,
        is_terminated=terminated,
        vm=vm,
        permitted_vcpus=permitted,
    )


def vmspec(lo=1, hi=4, unit=1, mem=GI):
    return ann.VmSpec(
        min_vcpus=lo, max_vcpus=hi, scaling_unit=unit, min_memory_bytes=mem, max_memory_bytes=mem
    )


def request(uid, node, current, requested, *, mem=GI, last=None):
    return ResourceRequest(
        pod=PodRef(namespace="ns", name=f"pod-{uid}", uid=uid),
        node=node,
        current=Resources(vcpus=current, memory_bytes=mem),
        requested=Resources(vcpus=requested, memory_bytes=mem),
        last_permit=Resources(vcpus=last, memory_bytes=mem) if last else None,
    )


@pytest.fixture
def ledger():
    led = Ledger(reserve=SystemReserve(cpu_fraction=0.2))
    led.upsert_node("n1", allocatable=Demand(5000, 16 * GI))  # 4000m usable
    return led


def bound_vm(ledger, uid="v1", node="n1", **kw):
    vm = info(uid, ours=True, vm=kw.pop("vm", vmspec()), mem=GI, **kw)
    ledger.reserve_for_bind(vm, node, at=0)
    ledger.observe_pod(msgspec.structs.replace(vm, node_name=node), at=1)
    return vm


def test_usable_capacity_keeps_the_system_reserve(ledger):
    node = ledger.nodes["n1"]
    assert node.reserve == Demand(1000, 0)
    assert node.usable == Demand(4000, 16 * GI)
    assert node.free == node.usable


def test_foreign_pods_are_counted_and_tagged(ledger):
    ledger.observe_pod(info("f1", node="n1", cpu=500, mem=GI), at=0)
    ledger.observe_pod(info("s1", node="n1", cpu=250, static=True), at=0)
    node = ledger.nodes["n1"]
    assert node.foreign_total == Demand(750, GI)
    assert node.foreign["f1"].tag is ForeignTag.DEFAULT
    assert node.foreign["s1"].tag is ForeignTag.STATIC
    assert node.static_total == Demand(250, 0)
    ledger.check_invariants()


def test_terminated_and_deleted_pods_release_everything(ledger):
    ledger.observe_pod(info("f1", node="n1", cpu=500), at=0)
    bound_vm(ledger)
    ledger.observe_pod(info("f1", node="n1", cpu=500, terminated=True), at=1)
    assert ledger.forget_pod("v1")
    node = ledger.nodes["n1"]
    assert node.allocated == Demand(0, 0) and not node.own and not node.foreign
    assert not ledger.pods
    ledger.check_invariants()


def test_bind_rechecks_the_fit(ledger):
    ledger.observe_pod(info("f1", node="n1", cpu=3500), at=0)
    with pytest.raises(NoRoom, match="insufficient cpu"):
        ledger.reserve_for_bind(info("v1", ours=True, vm=vmspec()), "n1", at=0)
    assert ledger.nodes["n1"].own_total == Demand(0, 0)


def test_bind_to_unknown_node_and_double_bind(ledger):
    vm = info("v1", ours=True, vm=vmspec())
    with pytest.raises(UnknownNode):
        ledger.reserve_for_bind(vm, "nope", at=0)
    ledger.upsert_node("n2", allocatable=Demand(5000, 16 * GI))
    bound_vm(ledger)
    with pytest.raises(Conflict, match="already bound to node n1"):
        ledger.reserve_for_bind(vm, "n2", at=0)
    assert ledger.reserve_for_bind(vm, "n1", at=0) is None  # a retried bind is idempotent


def test_failed_bind_releases_only_a_tentative_hold(ledger):
    vm = info("v1", ours=True, vm=vmspec())
    ledger.reserve_for_bind(vm, "n1", at=0)
    # The watch shows an unrelated update of the still-unbound pod: the hold stays.
    ledger.observe_pod(vm, at=0)
    assert "v1" in ledger.nodes["n1"].own
    assert ledger.cancel_bind("v1")
    assert ledger.nodes["n1"].own_total == Demand(0, 0)
    # Once the watch confirmed the binding, a late failure report changes nothing.
    bound_vm(ledger)
    assert ledger.cancel_bind("v1") == []
    assert ledger.nodes["n1"].own_total == Demand(1000, GI)


def test_relist_reconciles_missed_deletes_but_keeps_binds_in_flight(ledger):
    ledger.observe_pod(info("f1", node="n1", cpu=500), at=0)
    ledger.reserve_for_bind(info("v1", ours=True, vm=vmspec()), "n1", at=0)
    ledger.replace_pods([], at=1)
    assert set(ledger.pods) == {"v1"}
    ledger.check_invariants()


def test_removed_node_keeps_counting_its_pods_until_they_go(ledger):
    ledger.observe_pod(info("f1", node="n1", cpu=500), at=0)
    ledger.remove_node("n1")
    assert not ledger.nodes["n1"].is_known
    assert ledger.nodes["n1"].foreign_total == Demand(500, 0)
    ledger.forget_pod("f1")
    assert "n1" not in ledger.nodes
    ledger.check_invariants()


def test_grow_is_granted_in_full_when_it_fits(ledger):
    bound_vm(ledger)
    (d,) = decide_batch(ledger, "n1", [request("v1", "n1", 1, 3)])
    assert d.permit.status is PermitStatus.GRANTED
    assert d.permit.permit == Resources(vcpus=3, memory_bytes=GI)
    assert ledger.nodes["n1"].own_total == Demand(3000, GI)


def test_grow_is_partial_and_rounded_to_the_scaling_unit(ledger):
    bound_vm(ledger, vm=vmspec(lo=1, hi=9, unit=2))
    ledger.observe_pod(info("f1", node="n1", cpu=500), at=0)  # 3500m left for the VM
    d = decide(ledger, request("v1", "n1", 1, 7))
    # fits 3 vCPUs; sizes are 1, 3, 5, 7, 9
    assert d.permit.status is PermitStatus.PARTIAL
    assert d.permit.permit is not None and d.permit.permit.vcpus == 3
    ledger.check_invariants()


def test_grow_is_denied_on_a_full_node(ledger):
    bound_vm(ledger)
    ledger.observe_pod(info("f1", node="n1", cpu=3000), at=0)
    d = decide(ledger, request("v1", "n1", 1, 2))
    assert d.permit.status is PermitStatus.DENIED
    assert d.permit.permit is not None and d.permit.permit.vcpus == 1
    assert "no room" in d.permit.reason


def test_decrease_is_a_notice_and_frees_at_once(ledger):
    bound_vm(ledger)
    decide(ledger, request("v1", "n1", 1, 4))
    d = decide(ledger, request("v1", "n1", 4, 2))
    assert d.permit.status is PermitStatus.RELEASED
    assert ledger.nodes["n1"].own_total == Demand(2000, GI)


def test_steady_releases_nothing(ledger):
    bound_vm(ledger)
    decide(ledger, request("v1", "n1", 1, 4))
    # The hypervisor only reached 3 so far: the answer never exceeds the request, but the
    # hold keeps the whole permit the agent still claims.
    d = decide(ledger, request("v1", "n1", 3, 3, last=4))
    assert d.permit.status is PermitStatus.STEADY
    assert d.permit.permit is not None and d.permit.permit.vcpus == 3
    assert ledger.nodes["n1"].own_total == Demand(4000, GI)
    # Once the agent no longer claims it, the rest is released (a stale hold would leak).
    decide(ledger, request("v1", "n1", 3, 3, last=3))
    assert ledger.nodes["n1"].own_total == Demand(3000, GI)


def test_reality_above_the_permit_is_counted_and_reported(ledger):
    bound_vm(ledger)
    ledger.observe_pod(info("f1", node="n1", cpu=3000), at=0)
    d = decide(ledger, request("v1", "n1", 2, 2))
    assert d.permit.permit is not None and d.permit.permit.vcpus == 2
    assert ledger.nodes["n1"].is_overcommitted


def test_restarted_ledger_adopts_last_permit_when_it_fits(ledger):
    bound_vm(ledger)  # annotation lost: the rebuilt ledger thinks the VM has 1 vCPU
    d = decide(ledger, request("v1", "n1", 3, 3, last=3))
    assert d.permit.permit is not None and d.permit.permit.vcpus == 3
    assert ledger.nodes["n1"].own_total == Demand(3000, GI)


@pytest.mark.parametrize(
    ("req", "refusal"),
    [
        (request("zz", "n1", 1, 2), Refusal.UNKNOWN_POD),
        (request("f1", "n1", 1, 2), Refusal.NOT_A_VM),
        (request("v1", "n1", 1, 9), Refusal.OUT_OF_BOUNDS),
    ],
    ids=["unknown", "foreign", "above-max"],
)
def test_item_errors_leave_the_ledger_alone(ledger, req, refusal):
    bound_vm(ledger)
    ledger.observe_pod(info("f1", node="n1", cpu=100), at=0)
    before = msgspec.json.encode(ledger.nodes)
    d = decide(ledger, req)
    assert d.refused is not None and d.refused.kind is refusal
    assert d.permit.permit is None and d.permit.error is None  # the edge adds the error
    assert msgspec.json.encode(ledger.nodes) == before


def test_a_batch_for_another_nodes_pod_is_refused_whole(ledger):
    ledger.upsert_node("n2", allocatable=Demand(5000, 16 * GI))
    bound_vm(ledger, "v1", "n1")
    bound_vm(ledger, "v2", "n2")
    before = msgspec.json.encode(ledger.nodes)
    refused = decide_batch(ledger, "n1", [request("v1", "n1", 1, 2), request("v2", "n1", 1, 2)])
    assert isinstance(refused, Refused) and refused.kind is Refusal.WRONG_NODE
    assert msgspec.json.encode(ledger.nodes) == before


def test_fit_index_follows_the_ledger(ledger):
    index = FitIndex(ledger)
    size = Demand(2000, GI)
    assert index.filter(size, ["n1"]).passed == ["n1"]
    ledger.observe_pod(info("f1", node="n1", cpu=2500), at=0)
    result = index.filter(size, ["n1", "ghost"])
    assert result.passed == []
    assert result.failed["n1"] == "insufficient cpu: pod needs 2000m"
    assert result.failed["ghost"] == "node not known to the extender yet"
    huge = index.filter(Demand(4500, 0), ["n1"])
    assert huge.unresolvable["n1"].startswith("node too small: pod needs 4500m cpu")
    # The node's own numbers are in the detailed rejection (bind refusals, logs).
    detail = rejection(ledger.nodes["n1"], Demand(4500, 0))
    assert detail is not None and "can never give more than 4000m" in detail.reason
    ledger.forget_pod("f1")
    assert index.filter(size, ["n1"]).passed == ["n1"]


def test_scores_prefer_room_to_grow(ledger):
    ledger.upsert_node("n2", allocatable=Demand(5000, 16 * GI))
    ledger.observe_pod(info("f1", node="n2", cpu=3000), at=0)
    scores = dict(
        score_nodes(
            ledger, ["n1", "n2"], Demand(1000, GI), growth_millis=3000, strategy=Strategy.SPREAD
        )
    )
    assert scores["n1"] > scores["n2"]
    assert all(0 <= s <= 10 for s in scores.values())
    packed = dict(
        score_nodes(ledger, ["n1", "n2"], Demand(1000, 0), growth_millis=0, strategy=Strategy.PACK)
    )
    assert packed["n2"] > packed["n1"]


def test_static_pods_are_never_preemption_victims(ledger):
    ledger.observe_pod(info("s1", node="n1", cpu=2000, static=True), at=0)
    ledger.observe_pod(info("f1", node="n1", cpu=2000), at=0)
    keep = choose_victims(ledger, "n1", Demand(2000, 0), ["s1", "f1"], 0)
    assert keep.victims == ["f1"]
    drop = choose_victims(ledger, "n1", Demand(3000, 0), ["s1", "f1"], 0)
    assert drop.victims is None and "static" in drop.reason


def test_a_vm_found_bound_holds_its_maximum_until_its_agent_reports(ledger):
    # A restarted extender lists a VM whose permit annotation was lost: it may really run up to
    # its maximum, so that is what it holds until the agent says what it runs.
    found = info("v1", node="n1", ours=True, vm=vmspec(lo=1, hi=3), mem=GI)
    ledger.observe_pod(found, at=0)
    node = ledger.nodes["n1"]
    # It holds its record (the minimum here); the rest up to its maximum is uncertain: not
    # allocated, but no bind or grant may take it.
    assert node.own_total == Demand(1000, GI)
    assert node.uncertain_total == Demand(2000, 0)
    assert node.free == Demand(4000 - 3000, 15 * GI)
    assert ledger.pods["v1"].is_unverified
    with pytest.raises(NoRoom):
        ledger.reserve_for_bind(info("v2", ours=True, vm=vmspec(lo=2, hi=2)), "n1", at=0)
    d = decide(ledger, request("v1", "n1", 2, 2, last=2))
    assert d.permit.permit is not None and d.permit.permit.vcpus == 2
    assert not ledger.pods["v1"].is_unverified
    assert node.own_total == Demand(2000, GI) and node.uncertain_total == Demand(0, 0)
    assert node.free == Demand(2000, 15 * GI)
    ledger.check_invariants()


def test_the_fit_index_sees_an_unverified_vm_settle_at_its_size(ledger):
    # The agent reports exactly the size the VM was found at: what it holds does not change,
    # but the room up to its maximum comes back, and filter must see it.
    index = FitIndex(ledger)
    ledger.observe_pod(info("v1", node="n1", ours=True, vm=vmspec(lo=1, hi=3), mem=GI), at=0)
    size = Demand(2000, GI)
    assert index.filter(size, ["n1"]).passed == []  # 4000 - 1000 held - 2000 uncertain
    decide(ledger, request("v1", "n1", 1, 1))
    assert ledger.nodes["n1"].own_total == Demand(1000, GI)
    assert index.filter(size, ["n1"]).passed == ["n1"]


def test_a_vm_we_place_is_fresh_and_holds_its_minimum(ledger):
    bound_vm(ledger, vm=vmspec(lo=1, hi=3))
    assert not ledger.pods["v1"].is_unverified
    assert ledger.nodes["n1"].own_total == Demand(1000, GI)


def test_vms_growing_in_one_batch_share_the_node_fairly(ledger):
    # 4000m usable; two 1-vCPU VMs leave 2000m: both want 4, neither may take it all.
    bound_vm(ledger, "v1")
    bound_vm(ledger, "v2")
    a, b = decide_batch(ledger, "n1", [request("v1", "n1", 1, 4), request("v2", "n1", 1, 4)])
    assert a.permit.permit is not None and b.permit.permit is not None
    assert (a.permit.permit.vcpus, b.permit.permit.vcpus) == (2, 2)
    assert a.permit.status is PermitStatus.PARTIAL and b.permit.status is PermitStatus.PARTIAL
    ledger.check_invariants()


def test_a_fair_share_left_unused_goes_to_the_others(ledger):
    bound_vm(ledger, "v1")
    bound_vm(ledger, "v2")
    # v1 wants 1 more, v2 as much as it can: v2 gets its share and what v1 left.
    a, b = decide_batch(ledger, "n1", [request("v1", "n1", 1, 2), request("v2", "n1", 1, 4)])
    assert a.permit.permit is not None and b.permit.permit is not None
    assert (a.permit.permit.vcpus, b.permit.permit.vcpus) == (2, 2)
    assert a.permit.status is PermitStatus.GRANTED
    assert ledger.nodes["n1"].free.cpu_millis == 0


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("held", "holds .*, not its size"),
        ("own_total", "totals .* != sums"),
        ("foreign_total", "totals .* != sums"),
        ("static_total", "static total"),
        ("uncertain_total", "uncertain total"),
    ],
)
def test_the_ledger_check_names_each_total_that_no_longer_adds_up(ledger, broken, message):
    # One node with every kind of hold: an unverified VM (held and uncertain), a static pod
    # and another scheduler's pod. Each total, and a pod's hold, put one millicore off.
    ledger.observe_pod(info("v1", node="n1", ours=True, vm=vmspec(lo=1, hi=3), mem=GI), at=0)
    ledger.observe_pod(info("s1", node="n1", cpu=250, static=True), at=0)
    ledger.observe_pod(info("f1", node="n1", cpu=500, mem=GI), at=0)
    ledger.check_invariants()
    node = ledger.nodes["n1"]
    target = ledger.pods["v1"] if broken == "held" else node
    value = getattr(target, broken)
    setattr(target, broken, Demand(value.cpu_millis + 1, value.memory_bytes))
    with pytest.raises(AssertionError, match=message):
        ledger.check_invariants()
