"""Memory permits: increases in memory units, decreases at the size the guest really reached,
claims above what a VM holds believed only where they fit, memory quotas."""

import msgspec
import pytest

from protocol import annotations as ann
from protocol.permits import PermitStatus, PodRef, ResourceRequest, Resources
from scheduler_extender.core.ledger import Ledger, SystemReserve
from scheduler_extender.core.permits import ShortOf, decide
from scheduler_extender.core.podinfo import Demand
from tests.support import pod_info

GI = 2**30
MI = 2**20


def vm_pod(uid, *, lo=GI, hi=8 * GI, unit=512 * MI, node=None, permitted=None):
    spec = ann.VmSpec(
        min_vcpus=1, max_vcpus=4, min_memory_bytes=lo, max_memory_bytes=hi, memory_unit_bytes=unit
    )
    return pod_info(uid, requests=Demand(1000, lo), node=node, vm=spec, permitted_memory=permitted)


def foreign(uid, mem):
    return pod_info(uid, requests=Demand(0, mem), node="n1", namespace="other")


def ask(uid, current, requested, *, vcpus=(1, 1), last=None):
    return ResourceRequest(
        pod=PodRef(namespace="ns", name=uid, uid=uid),
        node="n1",
        current=Resources(vcpus=vcpus[0], memory_bytes=current),
        requested=Resources(vcpus=vcpus[1], memory_bytes=requested),
        last_permit=Resources(vcpus=vcpus[0], memory_bytes=last) if last else None,
    )


@pytest.fixture
def ledger():
    led = Ledger(reserve=SystemReserve(cpu_fraction=0.2))
    led.upsert_node("n1", allocatable=Demand(8000, 8 * GI))
    return led


def bound(ledger, uid="v1", **kw):
    pod = vm_pod(uid, **kw)
    ledger.reserve_for_bind(pod, "n1", at=0)
    ledger.observe_pod(msgspec.structs.replace(pod, node_name="n1"), at=1)
    return pod


def mem_held(ledger):
    return ledger.nodes["n1"].own_total.memory_bytes


def test_an_increase_is_rounded_down_to_the_memory_unit(ledger):
    bound(ledger)
    d = decide(ledger, ask("v1", GI, 2 * GI + 300 * MI))
    assert d.permit.permit == Resources(vcpus=1, memory_bytes=2 * GI)
    assert d.permit.status is PermitStatus.PARTIAL
    assert d.permit.reason == (
        f"granted {2 * GI} of {2 * GI + 300 * MI} bytes of memory:"
        f" node n1 had {7 * GI} bytes of memory free"
    )
    assert mem_held(ledger) == 2 * GI


def test_an_increase_stops_at_the_last_unit_that_fits(ledger):
    bound(ledger)
    ledger.observe_pod(foreign("f1", 4 * GI + 724 * MI), at=0)  # 3 GiB + 300 MiB for the VM
    d = decide(ledger, ask("v1", GI, 6 * GI))
    assert d.permit.permit is not None
    assert d.permit.permit.memory_bytes == 3 * GI  # 1 GiB + 4 x 512 MiB: a fifth unit does not fit
    assert ledger.nodes["n1"].free.memory_bytes == 300 * MI
    # Nothing left for one more unit: denied, in memory's words.
    d = decide(ledger, ask("v1", 3 * GI, 4 * GI))
    assert d.permit.status is PermitStatus.DENIED
    assert d.permit.reason == f"node n1 has no room to grow ({300 * MI} bytes of memory free)"
    assert d.short_of is ShortOf.NODE


def test_cpu_and_memory_are_decided_independently(ledger):
    bound(ledger)
    ledger.observe_pod(foreign("f1", 0), at=0)
    ledger.observe_pod(
        msgspec.structs.replace(foreign("f2", 0), requests=Demand(5400, 0)), at=0
    )  # 6400m usable: 0 cpu left beyond the VM's 1000m
    d = decide(ledger, ask("v1", GI, 4 * GI, vcpus=(1, 3)))
    assert d.permit.permit == Resources(vcpus=1, memory_bytes=4 * GI)
    assert d.permit.status is PermitStatus.PARTIAL


def test_a_shrink_the_guest_could_not_complete_frees_only_what_it_gave_back(ledger):
    bound(ledger)
    decide(ledger, ask("v1", GI, 4 * GI))
    # The agent asked the guest for 1 GiB; it gave back down to 2.5 GiB and reports that.
    d = decide(ledger, ask("v1", 4 * GI, 2 * GI + 512 * MI, last=4 * GI))
    assert d.permit.status is PermitStatus.RELEASED
    assert d.permit.permit is not None
    assert d.permit.permit.memory_bytes == 2 * GI + 512 * MI
    assert mem_held(ledger) == 2 * GI + 512 * MI


def test_a_steady_report_below_the_permit_keeps_what_the_agent_still_claims(ledger):
    bound(ledger)
    decide(ledger, ask("v1", GI, 4 * GI))
    # Plugging is still under way (3 GiB so far): the permit it holds stays held.
    d = decide(ledger, ask("v1", 3 * GI, 3 * GI, last=4 * GI))
    assert d.permit.permit is not None and d.permit.permit.memory_bytes == 3 * GI
    assert mem_held(ledger) == 4 * GI


def test_memory_claimed_above_what_the_vm_holds_never_overcommits_the_node(ledger):
    bound(ledger)
    ledger.observe_pod(foreign("f1", 5 * GI), at=0)  # 2 GiB of room beyond the VM's 1 GiB
    # An agent reports 7 GiB it was never granted: counting it would over-commit by 4 GiB.
    d = decide(ledger, ask("v1", 7 * GI, 7 * GI))
    assert d.permit.permit is not None
    assert d.permit.permit.memory_bytes == 3 * GI  # what fits; the agent must give the rest back
    assert "not the 7516192768 reported" in d.permit.reason
    assert not ledger.nodes["n1"].is_overcommitted
    assert ledger.nodes["n1"].free.memory_bytes == 0
    # The same as a notice (shrunk "to" 6 GiB) or as a request from 7 GiB.
    for req in (ask("v1", 7 * GI, 6 * GI), ask("v1", 7 * GI, 8 * GI)):
        decide(ledger, req)
        assert not ledger.nodes["n1"].is_overcommitted
        ledger.check_invariants()


def test_memory_claims_within_what_the_vm_holds_are_believed(ledger):
    # Found bound after a restart with a 4 GiB record: up to its maximum is uncertain, and
    # the agent's report of 6 GiB (with lastPermit) fits in that: believed, not capped.
    pod = vm_pod("v1", node="n1", permitted=4 * GI)
    ledger.observe_pod(pod, at=0)
    d = decide(ledger, ask("v1", 6 * GI, 6 * GI, last=6 * GI))
    assert d.permit.permit is not None and d.permit.permit.memory_bytes == 6 * GI
    assert mem_held(ledger) == 6 * GI
    assert ledger.nodes["n1"].uncertain_total == Demand(0, 0)


def test_a_namespace_memory_quota_limits_an_increase(ledger):
    bound(ledger)

    def room(namespace):
        return Demand(10_000, GI + 100 * MI) if namespace == "ns" else None

    d = decide(ledger, ask("v1", GI, 4 * GI), room)
    assert d.permit.permit is not None
    assert d.permit.permit.memory_bytes == 2 * GI  # 1 GiB + two units within 1.1 GiB of quota
    assert d.permit.reason.endswith(
        f"namespace ns has {GI + 100 * MI} bytes of memory of quota left"
    )
    assert d.short_of is ShortOf.QUOTA
    # A steady or shrinking VM takes no quota, whatever is left.
    d = decide(ledger, ask("v1", 2 * GI, GI), lambda _ns: Demand(0, 0))
    assert d.permit.status is PermitStatus.RELEASED
    assert d.short_of is None
    assert mem_held(ledger) == GI


def test_vms_growing_memory_in_one_batch_share_the_node_fairly(ledger):
    from scheduler_extender.core.permits import decide_batch

    bound(ledger, "v1")
    bound(ledger, "v2")  # 6 GiB free
    first, second = decide_batch(ledger, "n1", [ask("v1", GI, 8 * GI), ask("v2", GI, 8 * GI)])
    assert first.permit.permit is not None and second.permit.permit is not None
    # 3 GiB each, not 6 GiB for the first in the batch and nothing for the second.
    assert first.permit.permit.memory_bytes == second.permit.permit.memory_bytes == 4 * GI
    # A share one VM leaves unused goes round to the other.
    other = Ledger(reserve=SystemReserve(cpu_fraction=0.2))
    other.upsert_node("n1", allocatable=Demand(8000, 8 * GI))
    bound(other, "v3")
    bound(other, "v4")
    other.observe_pod(foreign("f1", 4 * GI), at=0)  # 2 GiB free
    small, big = decide_batch(other, "n1", [ask("v3", GI, GI + 512 * MI), ask("v4", GI, 8 * GI)])
    assert small.permit.permit is not None and big.permit.permit is not None
    assert small.permit.permit.memory_bytes == GI + 512 * MI
    assert big.permit.permit.memory_bytes == 2 * GI + 512 * MI


def test_a_grow_leaves_room_for_the_pods_memory_beyond_the_guests(ledger):
    """A VM in a container 512Mi above its guest (QEMU's own memory): the node must have room
    for the guest's new size *and* that, since the resized container keeps it."""
    pod = msgspec.structs.replace(
        vm_pod("v1"),
        requests=Demand(1000, GI + 512 * MI),
        memory_extra_bytes=512 * MI,
        container_memory_overhead_bytes=512 * MI,
    )
    ledger.reserve_for_bind(pod, "n1", at=0)
    ledger.observe_pod(msgspec.structs.replace(pod, node_name="n1"), at=1)
    assert mem_held(ledger) == GI + 512 * MI
    ledger.observe_pod(foreign("f1", 4 * GI), at=2)  # 8 GiB node: 2.5 GiB left
    d = decide(ledger, ask("v1", GI, 8 * GI))
    # 1.5 GiB held + 2.5 GiB free = 4 GiB of pod: 3.5 GiB of guest, in 512Mi units.
    assert d.permit.permit.memory_bytes == 3 * GI + 512 * MI
    assert mem_held(ledger) == 4 * GI
    assert ledger.nodes["n1"].free.memory_bytes == 0
    ledger.check_invariants()


def test_a_quota_counts_from_what_the_pods_requests_already_hold(ledger):
    """A pod whose requests are above its VM's size already holds that much of its quota: with
    none left, the VM may still grow into its own requests (and no further)."""
    spec = ann.VmSpec(min_vcpus=1, max_vcpus=4, min_memory_bytes=GI, max_memory_bytes=GI)
    pod = pod_info("v1", requests=Demand(3000, GI), vm=spec)
    ledger.reserve_for_bind(pod, "n1", at=0)
    ledger.observe_pod(msgspec.structs.replace(pod, node_name="n1"), at=1)
    no_quota_left = lambda namespace: Demand(0, 0)  # noqa: E731
    d = decide(ledger, ask("v1", GI, GI, vcpus=(1, 4)), no_quota_left)
    assert d.permit.permit == Resources(vcpus=3, memory_bytes=GI)
    assert d.permit.reason == "granted 3 of 4 vCPUs: namespace ns has 0m cpu of quota left"
