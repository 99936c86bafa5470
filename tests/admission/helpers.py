"""Builders shared by the admission tests: pods, VMs, a ledger with nodes, a fake clock."""

import functools

import msgspec

from protocol import annotations as ann
from protocol.permits import PodRef, ResourceRequest, Resources
from scheduler_extender.admission.queue import AdmissionState, quota_room
from scheduler_extender.admission.quota import QuotaConfig, parse_quota_config
from scheduler_extender.core.ledger import Ledger, SystemReserve
from scheduler_extender.core.permits import decide
from scheduler_extender.core.podinfo import Demand, PodInfo

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
    """An agent's request, decided by ``permits.decide`` with the namespace's quota room."""
    entry = ledger.pods[pod.uid]
    req = ResourceRequest(
        pod=PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid),
        node=entry.node,
        current=Resources(vcpus=current, memory_bytes=mem),
        requested=Resources(vcpus=requested, memory_bytes=mem),
    )
    return decide(ledger, req, functools.partial(quota_room, state))
