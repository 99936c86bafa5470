"""The label and annotation keys that make a pod a VM, and their strict parsing.

Pure. The extender, the agent, the manifests and the docs all use exactly these names.

Set by users on a VM pod (prefix ``vm-autoscaling.io/``):

=====================  ========================================================  ==========
key                    meaning                                                   default
=====================  ========================================================  ==========
label ``vm``           ``"true"`` marks the pod as a VM                          (required)
``min-vcpus``          fewest vCPUs; the VM is placed and started with these     (required)
``max-vcpus``          most vCPUs the VM may grow to (QEMU ``maxcpus``)          (required)
``scaling-unit``       vCPUs per step; sizes are ``min + k * unit`` <= max        ``1``
``min-memory``         least memory (a quantity, e.g. ``1Gi``); required when     pod request
                       ``max-memory`` is above the pod's memory request
``max-memory``         most memory                                               min-memory
``memory-unit``        memory step; sizes are ``min + k * unit``                 ``128Mi``
``hypervisor``         how the agent reaches the VMM: ``qmp+qga:///run/vm/qmp.sock`` (none)
                       (vCPUs onlined in the guest through qemu-guest-agent at
                       ``qmp.qga.sock``, memory by QMP; vm_runner's default
                       mode), ``qmp:///run/vm/qmp.sock`` (vCPU hot-plug) or
                       ``cloud-hypervisor:///var/run/ch/ch.sock`` (a path on
                       the host, below the agent's configured root)
``metrics-url``        the guest's node_exporter                                 pod IP :9100
``vm-container``       which container runs the VM (its memory is resized)       the first
``never-move``         ``"true"``: relief and drains never move this VM live      ``"false"``
                       to another node (``scheduler_extender.core.relief``)
=====================  ========================================================  ==========

Written by the extender (the durable record a restarted extender rebuilds from):

``permitted-vcpus`` / ``permitted-memory``: the last permit granted to the VM.
``memory-overhead``: for a VM whose memory scales, its container's memory above the guest's
(QEMU's own, from the container as written: its memory less ``min-memory``), which every
resize of the container keeps and the extender holds on top of the permitted memory.

Written by the VM controller: ``migration``, on both pods of a VM while it moves live (the
source and the target runner pod; value: the move's name). The agent resizes neither while it
is there, and re-reads the VM's size from its hypervisor once it is gone.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Final

import msgspec

from protocol import bounds
from protocol.quantity import QuantityError, memory_bytes
from protocol.sizes import Bounds

if TYPE_CHECKING:
    from protocol.kube import Pod

PREFIX: Final = "vm-autoscaling.io/"
VM_LABEL: Final = PREFIX + "vm"
MIN_VCPUS: Final = PREFIX + "min-vcpus"
MAX_VCPUS: Final = PREFIX + "max-vcpus"
SCALING_UNIT: Final = PREFIX + "scaling-unit"
MIN_MEMORY: Final = PREFIX + "min-memory"
MAX_MEMORY: Final = PREFIX + "max-memory"
MEMORY_UNIT: Final = PREFIX + "memory-unit"
HYPERVISOR: Final = PREFIX + "hypervisor"
METRICS_URL: Final = PREFIX + "metrics-url"
PERMITTED_VCPUS: Final = PREFIX + "permitted-vcpus"
PERMITTED_MEMORY: Final = PREFIX + "permitted-memory"
# Written by the extender with ``permitted-memory`` for a VM whose memory scales: the VM
# container's memory above the guest's (QEMU's own), kept when the container is resized.
MEMORY_OVERHEAD: Final = PREFIX + "memory-overhead"
# Names the VM's container in a pod with several (default: the first container).
VM_CONTAINER: Final = PREFIX + "vm-container"
# Written by an extender that has just taken the lead on every pod still waiting for a node:
# its term. The write changes each pod's resourceVersion, so a Binding the previous leader sent
# before it lost the Lease, still on its way, fails its precondition (``Extender.fence``).
LEADER_TERM: Final = PREFIX + "leader-term"
MIGRATION: Final = PREFIX + "migration"
NEVER_MOVE: Final = PREFIX + "never-move"
# On a moving VM's source pod, beside MIGRATION (the vm-controller writes both): where it moves,
# ``<node>/<pod>``. A restarted extender holds the target's room again from it while the target
# pod does not exist yet (``Extender.pods_listed``).
MIGRATION_TO: Final = PREFIX + "migration-to"

DEFAULT_MEMORY_UNIT: Final = 128 * 2**20
# Beyond this a value is a typo, not a VM (QEMU's q35 tops out at 1024 / 4096 vCPUs).
MAX_SANE_VCPUS: Final = bounds.MAX_VCPUS
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
# The NoSchedule taint the extender puts on a node it drains (relief's live scale-down): the
# drain's state, which a restarted extender reads back from the nodes. Removing it stops the
# drain (what moved or was evicted stays where it went).
DRAIN_TAINT: Final = PREFIX + "draining"
# cluster-autoscaler's: the pod's local volumes (comma-separated names) whose data may be lost,
# so that they do not keep its node from being emptied (kubernetes/autoscaler
# ``cluster-autoscaler/utils/drain/drain.go``, ``SafeToEvictLocalVolumesKey``; its FAQ, "What
# types of pods can prevent CA from removing a node?"). A drain honours it (``Disruption``).
SAFE_TO_EVICT_LOCAL_VOLUMES: Final = "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"


class AnnotationError(ValueError):
    """A VM pod whose annotations are missing, malformed or contradictory; names the key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"annotation {key}: {message}")
        self.key = key


class VmSpec(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """A VM's bounds, as its pod's annotations declare them (``vcpu_bounds``, ``memory_bounds``:
    the same as ``protocol.sizes.Bounds``, which rounds)."""

    min_vcpus: int
    max_vcpus: int
    scaling_unit: int = 1
    min_memory_bytes: int
    max_memory_bytes: int
    memory_unit_bytes: int = DEFAULT_MEMORY_UNIT
    hypervisor: str | None = None
    metrics_url: str | None = None
    # False: the VM opted out of being moved live (``never-move: "true"``).
    is_movable: bool = True

    @cached_property
    def vcpu_bounds(self) -> Bounds:
        return Bounds(self.min_vcpus, self.max_vcpus, self.scaling_unit)

    @cached_property
    def memory_bounds(self) -> Bounds:
        return Bounds(self.min_memory_bytes, self.max_memory_bytes, self.memory_unit_bytes)

    @property
    def top_vcpus(self) -> int:
        """The largest allowed vCPU count (max rounded down to the scaling unit)."""
        return self.vcpu_bounds.top

    @property
    def top_memory_bytes(self) -> int:
        return self.memory_bounds.top


def is_vm(labels: dict[str, str] | None) -> bool:
    return bool(labels) and labels is not None and labels.get(VM_LABEL) == "true"


def _whole(annotations: dict[str, str], key: str, default: int | None) -> int:
    raw = annotations.get(key)
    if raw is None:
        if default is None:
            raise AnnotationError(key, "is required on a VM pod")
        return default
    text = raw.strip()
    if not text.isdigit():
        raise AnnotationError(key, f"{raw!r} is not a whole number")
    value = int(text)
    if not 1 <= value <= MAX_SANE_VCPUS:
        raise AnnotationError(key, f"{value} is outside 1..{MAX_SANE_VCPUS}")
    return value


def _memory(annotations: dict[str, str], key: str, default: int | None) -> int:
    raw = annotations.get(key)
    if raw is None:
        if default is None:
            raise AnnotationError(key, "is required (the pod requests no memory to default to)")
        return default
    try:
        value = memory_bytes(raw)
    except QuantityError as e:
        raise AnnotationError(key, str(e)) from e
    if value <= 0:
        raise AnnotationError(key, f"{raw!r} must be positive")
    return value


def parse_vm_spec(annotations: dict[str, str] | None, *, pod_memory_bytes: int) -> VmSpec:
    """Read a VM pod's bounds; raises AnnotationError naming the first bad key."""
    ann = annotations or {}
    min_vcpus = _whole(ann, MIN_VCPUS, None)
    max_vcpus = _whole(ann, MAX_VCPUS, None)
    if max_vcpus < min_vcpus:
        raise AnnotationError(MAX_VCPUS, f"{max_vcpus} is below {MIN_VCPUS} ({min_vcpus})")
    unit = _whole(ann, SCALING_UNIT, 1)
    min_mem = _memory(ann, MIN_MEMORY, pod_memory_bytes or None)
    max_mem = _memory(ann, MAX_MEMORY, min_mem)
    if max_mem > min_mem and MIN_MEMORY not in ann:
        # The pod's memory follows the permit (in-place resize): read as the minimum, it
        # would rise with every grant and never come down again.
        raise AnnotationError(
            MIN_MEMORY, "is required when max-memory is above the pod's memory request"
        )
    if max_mem < min_mem:
        raise AnnotationError(MAX_MEMORY, f"{max_mem} bytes is below {MIN_MEMORY} ({min_mem})")
    mem_unit = _memory(ann, MEMORY_UNIT, DEFAULT_MEMORY_UNIT)
    is_movable = not is_never_move(ann)
    return VmSpec(
        min_vcpus=min_vcpus,
        max_vcpus=max_vcpus,
        scaling_unit=unit,
        min_memory_bytes=min_mem,
        max_memory_bytes=max_mem,
        memory_unit_bytes=mem_unit,
        hypervisor=ann.get(HYPERVISOR) or None,
        metrics_url=ann.get(METRICS_URL) or None,
        is_movable=is_movable,
    )


def is_never_move(annotations: dict[str, str] | None) -> bool:
    """Whether the pod opted out of live moves (``never-move: "true"``; absent is
    ``"false"``); raises ``AnnotationError`` for any other value."""
    raw = (annotations or {}).get(NEVER_MOVE, "false")
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise AnnotationError(NEVER_MOVE, f'{raw!r} is neither "true" nor "false"')
    return value == "true"


def parse_permitted(annotations: dict[str, str] | None) -> tuple[int | None, int | None]:
    """The durable permit the extender wrote, if any and if well-formed.

    Malformed values are ignored rather than fatal: this is our own record, and falling back to
    the VM's minimum (or the agent's lastPermit) is safe.
    """
    ann = annotations or {}
    vcpus_raw = ann.get(PERMITTED_VCPUS, "").strip()
    vcpus = int(vcpus_raw) if vcpus_raw.isdigit() and len(vcpus_raw) < 10 else None
    if vcpus is not None and vcpus > MAX_SANE_VCPUS:
        vcpus = None
    mem: int | None
    try:
        mem = memory_bytes(ann[PERMITTED_MEMORY]) if PERMITTED_MEMORY in ann else None
    except QuantityError:
        mem = None
    return vcpus, mem


def parse_memory_overhead(annotations: dict[str, str] | None) -> int | None:
    """The VM container's memory overhead the extender recorded, if any and well-formed."""
    raw = (annotations or {}).get(MEMORY_OVERHEAD)
    if raw is None:
        return None
    try:
        return memory_bytes(raw)
    except QuantityError:
        return None


def vm_container_name(pod: Pod, *, annotation: str = VM_CONTAINER) -> str | None:
    """The container that runs the VM: the one ``annotation`` names, else the first."""
    named = (pod.metadata.annotations or {}).get(annotation)
    if named:
        return named
    containers = pod.spec.containers or []
    return containers[0].name if containers else None


def parse_migration_to(annotations: dict[str, str] | None) -> tuple[str, str] | None:
    """``MIGRATION_TO`` as (node, pod name), or None when absent or malformed (our own record:
    a malformed one only means no reservation is rebuilt from it)."""
    value = (annotations or {}).get(MIGRATION_TO)
    if value is None:
        return None
    node, sep, pod = value.partition("/")
    return (node, pod) if sep and node and pod and "/" not in pod else None
