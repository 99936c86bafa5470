"""From a Kubernetes Pod to the facts the ledger needs (``PodInfo``).

Pure: no I/O. This is the border where API objects become our own frozen values; nothing past
it looks at a ``protocol.kube.Pod``.

Effective requests follow Kubernetes' own ``PodRequests`` (k8s.io/component-helpers
resource/helpers.go), so our numbers match what kube-scheduler and the kubelet count:

* the sum of the regular containers, plus every restartable ("sidecar") init container, which
  runs beside them;
* but at least the largest single init container plus the sidecars started before it (init
  containers run one at a time);
* plus the pod overhead (RuntimeClass);
* for each container, the larger of the spec and what the kubelet has allocated (an in-place
  resize in progress may be on either side).
"""

from __future__ import annotations

from typing import Final

import msgspec

from protocol import annotations as ann
from protocol.kube import Container, ContainerStatus, Pod
from protocol.quantity import QuantityError, cpu_millis, memory_bytes

TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


class Demand(msgspec.Struct, frozen=True, array_like=True):
    """CPU in millicores and memory in bytes: what a pod holds, or wants to hold, on a node."""

    cpu_millis: int
    memory_bytes: int

    def __add__(self, other: Demand) -> Demand:
        return Demand(self.cpu_millis + other.cpu_millis, self.memory_bytes + other.memory_bytes)

    def max(self, other: Demand) -> Demand:
        return Demand(
            max(self.cpu_millis, other.cpu_millis), max(self.memory_bytes, other.memory_bytes)
        )


ZERO: Final = Demand(0, 0)


class PodInfo(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    namespace: str
    name: str
    node_name: str | None
    scheduler_name: str
    requests: Demand
    priority: int
    is_ours: bool
    is_vm: bool
    is_static: bool
    is_terminated: bool
    vm: ann.VmSpec | None = None
    # Why a VM pod's annotations are unusable; filter rejects every node with it.
    vm_error: str | None = None
    permitted_vcpus: int | None = None
    permitted_memory_bytes: int | None = None
    # For a VM whose memory scales: the pod's memory beyond the guest's, which it holds on top
    # of its permitted memory (the VM container's own overhead, QEMU's, plus every other
    # container and the pod overhead), and the VM container's part of it, which a resize of the
    # container keeps. Zero for every other pod (and VM), whose requests are what they hold.
    memory_extra_bytes: int = 0
    container_memory_overhead_bytes: int = 0
    created: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def initial_demand(self) -> Demand:
        """What placing this pod reserves: a VM's permitted (else minimum) size, at least its
        pod requests; any other pod, its requests."""
        if self.vm is None:
            return self.requests
        vcpus = self.permitted_vcpus if self.permitted_vcpus is not None else self.vm.min_vcpus
        mem = (
            self.permitted_memory_bytes
            if self.permitted_memory_bytes is not None
            else self.vm.min_memory_bytes
        )
        return self.requests.max(Demand(vcpus * 1000, mem + self.memory_extra_bytes))


class PodError(ValueError):
    """A pod whose resource requests cannot be parsed (the API server validates them, so this
    means a malformed request body rather than a real pod)."""


def _container_demand(container: Container, status: ContainerStatus | None) -> Demand:
    cpu = mem = 0
    res = container.resources
    if res is not None and res.requests:
        req = res.requests
        if "cpu" in req:
            cpu = cpu_millis(req["cpu"])
        if "memory" in req:
            mem = memory_bytes(req["memory"])
    if status is not None and status.allocated_resources:
        alloc = status.allocated_resources
        if "cpu" in alloc:
            cpu = max(cpu, cpu_millis(alloc["cpu"]))
        if "memory" in alloc:
            mem = max(mem, memory_bytes(alloc["memory"]))
    return Demand(cpu, mem)


def pod_requests(pod: Pod) -> Demand:
    """The pod's effective requests, as Kubernetes computes them (see module docstring)."""
    spec = pod.spec
    statuses = {s.name: s for s in pod.status.container_statuses or ()}
    try:
        total = ZERO
        for c in spec.containers or ():
            total = total + _container_demand(c, statuses.get(c.name))
        init_statuses = {s.name: s for s in pod.status.init_container_statuses or ()}
        sidecars = ZERO
        init_peak = ZERO
        for c in spec.init_containers or ():
            d = _container_demand(c, init_statuses.get(c.name))
            if c.restart_policy == "Always":
                total = total + d
                sidecars = sidecars + d
                init_peak = init_peak.max(sidecars)
            else:
                init_peak = init_peak.max(sidecars + d)
        total = total.max(init_peak)
        if spec.overhead:
            total = total + Demand(
                cpu_millis(spec.overhead.get("cpu", "0")),
                memory_bytes(spec.overhead.get("memory", "0")),
            )
    except QuantityError as e:
        raise PodError(f"pod {pod.metadata.namespace}/{pod.metadata.name}: {e}") from e
    return total


def is_static_pod(pod: Pod) -> bool:
    """Static (mirror) pods are owned by a kubelet; they must never be preempted."""
    meta = pod.metadata
    if meta.annotations and ann.MIRROR_ANNOTATION in meta.annotations:
        return True
    return any(ref.kind == "Node" for ref in meta.owner_references or ())


def pod_info(pod: Pod, *, scheduler_name: str) -> PodInfo:
    """Summarise a Pod; raises PodError only for unparseable resource quantities."""
    meta = pod.metadata
    spec = pod.spec
    requests = pod_requests(pod)
    ours = (spec.scheduler_name or "default-scheduler") == scheduler_name
    is_vm = ann.is_vm(meta.labels)
    vm: ann.VmSpec | None = None
    vm_error: str | None = None
    permitted: tuple[int | None, int | None] = (None, None)
    if is_vm and ours:
        try:
            vm = ann.parse_vm_spec(meta.annotations, pod_memory_bytes=requests.memory_bytes)
        except ann.AnnotationError as e:
            vm_error = str(e)
        permitted = ann.parse_permitted(meta.annotations)
    extra = overhead = 0
    if vm is not None and vm.max_memory_bytes > vm.min_memory_bytes:
        extra, overhead = _memory_extra(pod, vm, requests)
    return PodInfo(
        uid=meta.uid,
        namespace=meta.namespace,
        name=meta.name,
        node_name=spec.node_name or None,
        scheduler_name=spec.scheduler_name or "default-scheduler",
        requests=requests,
        priority=spec.priority or 0,
        is_ours=ours,
        is_vm=is_vm,
        is_static=is_static_pod(pod),
        is_terminated=(pod.status.phase in TERMINAL_PHASES),
        vm=vm,
        vm_error=vm_error,
        permitted_vcpus=permitted[0],
        permitted_memory_bytes=permitted[1],
        memory_extra_bytes=extra,
        container_memory_overhead_bytes=overhead,
        created=meta.creation_timestamp or "",
    )


def _memory_extra(pod: Pod, vm: ann.VmSpec, requests: Demand) -> tuple[int, int]:
    """(extra, overhead) of ``PodInfo`` for a VM whose memory scales.

    The VM container's overhead is what the extender recorded with its first permit
    (``memory-overhead``) or, before any, its memory above ``min-memory`` as written (nothing
    has resized it yet: the record is written before the resize). The rest of the pod (other
    containers, the pod overhead) is its requests less the VM container's, at any moment."""
    containers = pod.spec.containers or []
    name = ann.vm_container_name(pod)
    container = next((c for c in containers if c.name == name), None)
    if container is None and containers:
        container = containers[0]
    if container is None:
        return 0, 0
    statuses = {s.name: s for s in pod.status.container_statuses or ()}
    try:
        own = _container_demand(container, statuses.get(container.name)).memory_bytes
    except QuantityError:
        return 0, 0
    recorded = ann.parse_memory_overhead(pod.metadata.annotations)
    overhead = recorded if recorded is not None else max(0, own - vm.min_memory_bytes)
    return max(0, requests.memory_bytes - own) + overhead, overhead
