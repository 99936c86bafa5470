"""The simulated cluster's records: one per VM, foreign pod, node and extender incarnation.

Plain mutable state for ``simulator.engine``, which alone changes it; nothing here decides or
schedules anything. Pure: no I/O, no clock, no randomness. A ``VmRecord`` carries the scenario's
spec, what the simulated hypervisor really runs, what the extender last permitted, the agent's
``VmState`` and the counters the report reads; ``info()`` is the pod as the API server would
show it to the extender.
"""

from __future__ import annotations

from typing import Final

from autoscaler_agent.core import VmState
from protocol.annotations import VmSpec
from protocol.permits import PodRef
from scheduler_extender.admission import queue as adm
from scheduler_extender.admission.quota import QuotaConfig
from scheduler_extender.core.ledger import Ledger, SystemReserve
from scheduler_extender.core.placement import FitIndex, ScoreIndex
from scheduler_extender.core.podinfo import Demand, PodInfo
from scheduler_extender.core.sequences import SequenceBook
from scheduler_extender.recommender import POOL_LABEL, ZONE_LABEL
from simulator import scenario as sc
from simulator.report import StepResult
from simulator.world import GuestLoad

# The scheduler name our pods carry: the extender and the recommender tell them apart by it.
SCHEDULER_NAME: Final = "vm-scheduler"


class VmRecord:
    """One VM: the scenario's spec, the simulated guest and hypervisor, the agent's VmState."""

    __slots__ = (
        "agent",
        "deleted_at",
        "denials",
        "granted",
        "grows",
        "guest",
        "hv_fail_until",
        "hv_retryable",
        "index",
        "is_deleted",
        "is_pending",
        "is_settled",
        "jitter_draws",
        "jitter_mix",
        "last_scrape_at",
        "mem",
        "memory",
        "node",
        "op",
        "op_token",
        "op_value",
        "open_step",
        "peak",
        "permit_errors",
        "placed_at",
        "pod_name",
        "rank",
        "ref",
        "resize_errors",
        "shrinks",
        "spec",
        "steps",
        "uid",
        "vcpus",
        "vm_spec",
        "wake_token",
    )

    def __init__(
        self, index: int, spec: sc.Vm, vm_spec: VmSpec, memory: int, *, rank: int | None = None
    ) -> None:
        # Its slot in the simulation's list of VMs; ``rank``, its place in the scenario, which
        # orders VMs and seeds their agents' jitter. The two differ in a simulation of some of
        # the scenario's nodes (``simulator.split``), where the same VM must act the same.
        self.index = index
        self.rank = index if rank is None else rank
        self.spec = spec
        self.vm_spec = vm_spec
        self.memory = memory
        # The VM's pod: its name and uid change when it moves live to another node.
        self.pod_name = spec.name
        self.uid = f"uid-{spec.namespace}-{spec.name}"
        self.ref = PodRef(namespace=spec.namespace, name=spec.name, uid=self.uid)
        self.node: str | None = None
        self.vcpus = spec.min_vcpus  # what the hypervisor really runs
        self.granted = spec.min_vcpus  # what the extender last permitted (survives restarts)
        self.agent: VmState | None = None
        self.guest: GuestLoad | None = None
        self.op: str | None = None
        self.op_token = 0
        self.op_value = 0
        self.wake_token = 0
        self.is_settled = False
        self.last_scrape_at = 0.0
        # The agent's backoff jitter: this VM's own stream (``Simulation._jitter`` in the engine).
        self.jitter_mix = 0
        self.jitter_draws = 0
        self.is_deleted = False
        self.is_pending = False
        self.hv_fail_until = -1.0
        self.hv_retryable = True
        self.placed_at: float | None = None
        self.deleted_at: float | None = None
        self.peak = spec.min_vcpus
        self.grows = self.shrinks = self.denials = self.permit_errors = self.resize_errors = 0
        self.steps: list[StepResult] = []
        # The step being chased: (at, demand, from, target, is_up).
        self.open_step: tuple[float, float, int, int, bool] | None = None
        # Its memory, when it scales (``max_memory``); None: fixed at ``memory``.
        self.mem: MemoryRecord | None = None

    def info(
        self, *, node: str | None, permitted: int | None, permitted_memory: int | None = None
    ) -> PodInfo:
        return PodInfo(
            uid=self.uid,
            namespace=self.spec.namespace,
            name=self.pod_name,
            node_name=node,
            scheduler_name=SCHEDULER_NAME,
            requests=Demand(self.spec.min_vcpus * 1000, self.memory),
            priority=self.spec.priority,
            is_ours=True,
            is_vm=True,
            is_static=False,
            is_terminated=False,
            vm=self.vm_spec,
            permitted_vcpus=permitted,
            permitted_memory_bytes=permitted_memory
            if permitted_memory is not None
            else (self.memory if permitted is not None else None),
            created=f"2026-01-01T00:00:00.{self.rank:06d}Z",
            vm_name=self.spec.name,  # every simulated VM is a VirtualMachine's
        )


class MemoryRecord:
    """A VM whose memory scales: its guest's use (``simulator.world``), its plugged size, its
    memory permit, and the counters the report reads. The decisions are the agent's core's."""

    __slots__ = (
        "denials",
        "granted",
        "grows",
        "is_out",
        "oom_seconds",
        "ooms",
        "out_since",
        "partial_shrinks",
        "peak",
        "permit_errors",
        "segment",
        "segments",
        "shrinks",
        "size",
        "used",
    )

    def __init__(self, segments: tuple[tuple[float, int], ...], size: int) -> None:
        self.segments = segments
        self.segment = 0
        self.used = segments[0][1]
        self.size = size  # what the guest really has plugged
        self.granted = size  # the memory permit it holds, as the extender last answered
        self.peak = size
        self.grows = self.shrinks = self.partial_shrinks = self.denials = 0
        self.permit_errors = self.ooms = 0
        self.oom_seconds = 0.0
        self.is_out = False
        self.out_since = 0.0


class ForeignRecord:
    def __init__(self, index: int, spec: sc.ForeignPod) -> None:
        self.index = index
        self.spec = spec
        self.uid = f"uid-foreign-{spec.namespace}-{spec.name}"
        self.demand = Demand(sc.milli(spec.cpu), sc.bytes_of(spec.memory))
        self.node: str | None = None

    def info(self) -> PodInfo:
        return PodInfo(
            uid=self.uid,
            namespace=self.spec.namespace,
            name=self.spec.name,
            node_name=self.node,
            scheduler_name="default-scheduler",
            requests=self.demand,
            priority=0,
            is_ours=False,
            is_vm=False,
            is_static=False,
            is_terminated=False,
        )


class NodeRecord:
    def __init__(
        self, name: str, allocatable: Demand, pool: str, zone: str, joined_at: float
    ) -> None:
        self.name = name
        self.allocatable = allocatable
        self.usable = SystemReserve().of(allocatable)
        self.usable = Demand(
            allocatable.cpu_millis - self.usable.cpu_millis,
            allocatable.memory_bytes - self.usable.memory_bytes,
        )
        self.pool = pool
        self.zone = zone
        self.labels = {POOL_LABEL: pool, ZONE_LABEL: zone}
        self.joined_at = joined_at
        self.peak_reserved = 0
        self.peak_reserved_memory = 0  # tracked only in runs with a VM whose memory scales
        self.reality_millis = 0  # what runs there: VMs at their real size, foreign pods
        self.overcommit_seconds = 0.0
        self.overcommit_since: float | None = None


class ExtenderLife:
    """One incarnation of the extender: everything it loses when it dies."""

    def __init__(self, epoch: int, quotas: QuotaConfig) -> None:
        self.epoch = epoch
        self.ledger = Ledger()
        self.fit = FitIndex(self.ledger)
        self.scores = ScoreIndex(self.ledger)
        self.admission = adm.AdmissionState(self.ledger, quotas)
        # The last applied seq per VM, in memory only: a restarted extender starts empty.
        self.sequences = SequenceBook()
