"""Builders shared by the admission tests: pods, VMs, a ledger with nodes, a fake clock."""

import msgspec

from protocol import annotations as ann
from protocol.permits import PermitStatus, PodRef, ResourceRequest, Resources
from scheduler_extender.accounting import Ledger, SystemReserve
from scheduler_extender.admission import AdmissionState, quota_room
from scheduler_extender.permits import CPU_MILLIS_PER_VCPU, Decision, decide
from scheduler_extender.podinfo import Demand, PodInfo
from scheduler_extender.quota import QuotaConfig, parse_quota_config

GI = 2**30
# A round start, only ever moved forward (the house FakeClock habit).
T0 = 1000.0


def vmspec(lo=1, hi=8, mem=GI):
    return ann.VmSpec(min_vcpus=lo, max_vcpus=hi, min_memory_bytes=mem, max_memory_bytes=mem)


def vm(name, *, ns="team-a", vcpus=1, hi=8, mem=GI, priority=0, created=None, node=None, uid=None):
    """A VM pod of our scheduler: its initial demand is ``vcpus`` and ``mem``."""
    return PodInfo(
        uid=uid or f"uid-{ns}-{name}",
        namespace=ns,
        name=name,
        node_name=node,
        scheduler_name="vm-scheduler",
        requests=Demand(0, 0),
        priority=priority,
        is_ours=True,
        is_vm=True,
        is_static=False,
        is_terminated=False,
        vm=vmspec(vcpus, hi, mem),
        created=created or "2024-05-01T10:00:00Z",
    )


def quotas(ttl=120.0, **namespaces):
    """``quotas(team_a={"vcpus": 4, ...})``: underscores become dashes in namespace names."""
    return parse_quota_config(
        {
            "admission_ttl_seconds": ttl,
            "namespaces": {
                name.replace("_", "-"): {"memory_bytes": 64 * GI, **spec}
                for name, spec in namespaces.items()
            },
        }
    )


def cluster(config: QuotaConfig | None, *, nodes=2, cpu=64_000, mem=256 * GI):
    ledger = Ledger(reserve=SystemReserve(cpu_fraction=0.0))
    for i in range(nodes):
        ledger.upsert_node(f"n{i + 1}", allocatable=Demand(cpu, mem))
    return ledger, AdmissionState(ledger, config)


def place(ledger, pod, node="n1", at=0.0):
    """What bind then the watch do: reserve on the node, then see it bound."""
    ledger.reserve_for_bind(pod, node, at=at)
    bound = msgspec.structs.replace(pod, node_name=node)
    ledger.observe_pod(bound, at=at)
    return bound


def delete(ledger, state, pod):
    ledger.forget_pod(pod.uid)
    state.forget(pod.uid)


def grow(state, ledger, pod, *, current, requested, mem=GI):
    """An agent's upscale request, decided with the quota clamp (``decide_within_quota``)."""
    entry = ledger.pods[pod.uid]
    req = ResourceRequest(
        pod=PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid),
        node=entry.node,
        current=Resources(vcpus=current, memory_bytes=mem),
        requested=Resources(vcpus=requested, memory_bytes=mem),
    )
    return decide_within_quota(ledger, state, req)


def decide_within_quota(ledger: Ledger, state: AdmissionState, req: ResourceRequest) -> Decision:
    """Local stand-in for ``permits.decide`` once it clamps by ``quota_room`` (see the report).

    ``decide`` is not ours to edit, so this applies the same limit afterwards: it reads the
    namespace's room *before* the decision, lets ``decide`` grant by the node, then lowers an
    increase to ``round_down(held + room)``, never below ``current``. Because rounding down is
    monotone, ``min(round(node), round(quota))`` is exactly what the clamped ``decide`` grants.
    """
    entry = ledger.pods.get(req.pod.uid)
    room = quota_room(state, req.pod.namespace) if entry is not None else None
    held = entry.held if entry is not None else None
    decision = decide(ledger, req)
    permit = decision.permit
    if room is None or held is None or permit.permit is None or entry is None:
        return decision
    vm_spec = entry.vm
    assert vm_spec is not None
    cap_cpu = held.cpu_millis + room.cpu_millis
    cap_mem = held.memory_bytes + room.memory_bytes

    def clamp(granted, current, requested, cap, round_down):
        if requested <= current or granted <= current:
            return granted
        limit = round_down(cap)
        if limit > cap:  # not even the minimum fits the quota
            limit = current
        return max(current, min(granted, limit))

    vcpus = clamp(
        permit.permit.vcpus,
        req.current.vcpus,
        req.requested.vcpus,
        cap_cpu // CPU_MILLIS_PER_VCPU,
        vm_spec.round_vcpus_down,
    )
    memory = clamp(
        permit.permit.memory_bytes,
        req.current.memory_bytes,
        req.requested.memory_bytes,
        cap_mem,
        vm_spec.round_memory_down,
    )
    if (vcpus, memory) == (permit.permit.vcpus, permit.permit.memory_bytes):
        return decision
    ledger.set_vm_size(entry.uid, vcpus=vcpus, memory_bytes=memory)
    status = PermitStatus.DENIED if vcpus <= req.current.vcpus else PermitStatus.PARTIAL
    reason = (
        f"granted {vcpus} of {req.requested.vcpus} vCPUs: namespace {entry.namespace}"
        f" has {room.cpu_millis}m cpu of quota left"
    )
    new = msgspec.structs.replace(
        permit,
        permit=Resources(vcpus=vcpus, memory_bytes=memory),
        status=status,
        reason=reason,
    )
    return Decision(new, decision.events)
