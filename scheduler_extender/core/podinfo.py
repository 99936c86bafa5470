"""From a Kubernetes Pod to the facts the ledger needs (``PodInfo``).

Pure: no I/O. This is the border where API objects become our own frozen values; nothing past
it looks at a ``protocol.kube.Pod``.

How much a pod holds on its node (``pod_requests``) is what kube-scheduler v1.36 counts for it:
its NodeInfo adds each assigned pod at ``resourcehelper.PodRequests`` (k8s.io/component-helpers
``resource/helpers.go``) with status resources on (``InPlacePodVerticalScaling``, GA since 1.35),
pod-level resources on (``PodLevelResources``, beta and on by default since 1.34) and pod-level
in-place resize on (``InPlacePodLevelResourcesVerticalScaling``, beta and on by default in 1.36).
Restated, per resource (CPU and memory; a missing resource is not the same as zero):

1. **Containers** (KEP-753, sidecars): the regular containers' sum, plus every restartable
   ("sidecar", ``restartPolicy: Always``) init container, at least the largest of
   ``init container + the sidecars declared before it`` (init containers run one at a time,
   beside the sidecars already started). This sum is taken three times, over three views of
   each container:

   - *spec*: ``spec.containers[].resources.requests``;
   - *allocated*: its status' ``allocatedResources`` if the kubelet reported them, else its spec;
   - *actuated*: its status' ``resources.requests`` (what the kubelet read back from the cgroup),
     else its ``allocatedResources``, else its spec.

   When the pod's status carries pod-level ``allocatedResources`` *and* ``resources.requests``
   (KEP-5419), those two stand for the allocated and actuated sums. The pod counts at the larger
   of the three sums (KEP-1287: a resize in progress may sit on either side of the spec), except
   when the kubelet has marked the resize **Infeasible** (condition ``PodResizePending``, reason
   ``Infeasible``): then the spec, which will never be applied, does not count, and a container
   with no status counts as nothing.
2. **Pod-level requests** (KEP-2837): when ``spec.resources.requests`` names CPU, memory or a
   huge-page size, each resource it names replaces the containers' figure. With a pod-level
   status (``status.allocatedResources`` or ``status.resources``), that is the larger of the spec
   (left out when Infeasible), the status' requests and its allocated resources, each less the
   pod overhead (floored at zero): the kubelet reports them with the overhead in.
3. **Overhead** (RuntimeClass, ``spec.overhead``) is added last.

Quantities are summed exactly (in nano-units) and rounded up once per pod, as
``Quantity.MilliValue()``/``Value()`` round the summed list. Not counted, as neither of them is a
CPU or memory request of the pod: DRA claims on node-allocatable resources (alpha).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final

import msgspec

from protocol import annotations as ann
from protocol.kube import Container, ContainerStatus, Pod, StrMap
from protocol.quantity import QuantityError, parse_quantity

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


# A resource list as Kubernetes keeps one: resource name -> amount in nano-units (nanocores,
# nanobytes). Only CPU and memory are counted; a name that is missing is not the same as zero.
Amounts = dict[str, int]
_COUNTED: Final = ("cpu", "memory")
_NANO: Final = 10**9
# What the kubelet writes when a resize can never fit its node.
RESIZE_PENDING: Final = "PodResizePending"
INFEASIBLE: Final = "Infeasible"


@functools.lru_cache(maxsize=4096)
def _nanos(text: str) -> int:
    value = parse_quantity(text) * _NANO
    return -(-value.numerator // value.denominator)


def _amounts(resources: StrMap | None) -> Amounts | None:
    if resources is None:
        return None
    return {name: _nanos(resources[name]) for name in _COUNTED if name in resources}


def _add(into: Amounts, more: Amounts | None) -> None:
    for name, amount in (more or {}).items():
        into[name] = into.get(name, 0) + amount


def _raise_to(into: Amounts, other: Amounts | None) -> None:
    for name, amount in (other or {}).items():
        if amount > into.get(name, -1):
            into[name] = amount


def _largest(*lists: Amounts | None) -> Amounts:
    result: Amounts = {}
    for amounts in lists:
        _raise_to(result, amounts)
    return result


def _less_overhead(amounts: Amounts | None, overhead: Amounts | None) -> Amounts | None:
    if amounts is None or not overhead:
        return amounts
    return {n: max(0, a - overhead[n]) if n in overhead else a for n, a in amounts.items()}


def is_resize_infeasible(pod: Pod) -> bool:
    """``IsPodResizeInfeasible``: the first ``PodResizePending`` condition says Infeasible."""
    for condition in pod.status.conditions or ():
        if condition.type == RESIZE_PENDING:
            return condition.reason == INFEASIBLE
    return False


# How one container is seen: (container, its status or None, the pod's resize is infeasible).
View = Callable[[Container, ContainerStatus | None, bool], Amounts | None]


def _spec(c: Container, _status: ContainerStatus | None, _infeasible: bool) -> Amounts | None:
    return _amounts(c.resources.requests if c.resources is not None else None)


def _allocated(c: Container, status: ContainerStatus | None, infeasible: bool) -> Amounts | None:
    if status is not None and status.allocated_resources is not None:
        return _amounts(status.allocated_resources)
    return None if infeasible else _spec(c, status, infeasible)


def _actuated(c: Container, status: ContainerStatus | None, infeasible: bool) -> Amounts | None:
    if (
        status is not None
        and status.resources is not None
        and status.resources.requests is not None
    ):
        return _amounts(status.resources.requests)
    return _allocated(c, status, infeasible)


def _sum_containers(
    pod: Pod, view: View, statuses: dict[str, ContainerStatus], infeasible: bool
) -> Amounts:
    """Rule 1's sum for one view of the containers."""
    total: Amounts = {}
    for c in pod.spec.containers or ():
        _add(total, view(c, statuses.get(c.name), infeasible))
    sidecars: Amounts = {}
    init_peak: Amounts = {}
    for c in pod.spec.init_containers or ():
        own = view(c, statuses.get(c.name), infeasible)
        if c.restart_policy == "Always":
            _add(total, own)
            _add(sidecars, own)
            _raise_to(init_peak, sidecars)
        else:
            running = dict(sidecars)
            _add(running, own)
            _raise_to(init_peak, running)
    _raise_to(total, init_peak)
    return total


def _has_pod_level_requests(pod: Pod) -> bool:
    """``IsPodLevelRequestsSet``: CPU, memory or a huge-page size among the pod's requests."""
    res = pod.spec.resources
    return res is not None and any(
        n in _COUNTED or n.startswith("hugepages-") for n in res.requests or ()
    )


def _container_amounts(pod: Pod) -> Amounts:
    """Rule 1."""
    status = pod.status
    statuses = {s.name: s for s in status.container_statuses or ()}
    for s in status.init_container_statuses or ():
        statuses.setdefault(s.name, s)
    infeasible = is_resize_infeasible(pod)
    spec = _sum_containers(pod, _spec, statuses, infeasible)
    pod_status = status.resources
    if (
        status.allocated_resources is not None
        and pod_status is not None
        and pod_status.requests is not None
    ):
        allocated = _amounts(status.allocated_resources)
        actuated = _amounts(pod_status.requests)
    elif not statuses and not infeasible:
        return spec  # nothing reported: every view is the spec
    else:
        allocated = _sum_containers(pod, _allocated, statuses, infeasible)
        actuated = _sum_containers(pod, _actuated, statuses, infeasible)
    return _largest(actuated, allocated) if infeasible else _largest(spec, actuated, allocated)


def pod_amounts(pod: Pod) -> Amounts:
    """``PodRequests`` in nano-units (see the module docstring); raises ``QuantityError``."""
    amounts = _container_amounts(pod)
    spec = pod.spec
    overhead = _amounts(spec.overhead)
    if _has_pod_level_requests(pod):
        assert spec.resources is not None
        effective = _amounts(spec.resources.requests)
        status = pod.status
        if status.resources is not None or status.allocated_resources is not None:
            actuated = _amounts(status.resources.requests) if status.resources else None
            allocated = _amounts(status.allocated_resources)
            effective = _largest(
                None if is_resize_infeasible(pod) else effective,
                _less_overhead(actuated, overhead),
                _less_overhead(allocated, overhead),
            )
        amounts.update(effective or {})
    _add(amounts, overhead)
    return amounts


def _ceil_div(amount: int, unit: int) -> int:
    return -(-amount // unit)


def _demand(amounts: Amounts) -> Demand:
    return Demand(
        _ceil_div(amounts.get("cpu", 0), _NANO // 1000), _ceil_div(amounts.get("memory", 0), _NANO)
    )


def pod_requests(pod: Pod) -> Demand:
    """What the pod holds on its node, as kube-scheduler counts it (see module docstring):
    millicores and bytes, each rounded up once."""
    try:
        return _demand(pod_amounts(pod))
    except QuantityError as e:
        raise PodError(f"pod {pod.metadata.namespace}/{pod.metadata.name}: {e}") from e


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
    statuses = pod.status.container_statuses or ()
    status = next((s for s in statuses if s.name == container.name), None)
    infeasible = is_resize_infeasible(pod)
    # The container alone, seen as rule 1 sees the pod: the largest of its views.
    views = (_allocated, _actuated) if infeasible else (_spec, _allocated, _actuated)
    try:
        own = _demand(_largest(*(view(container, status, infeasible) for view in views)))
    except QuantityError:
        return 0, 0
    recorded = ann.parse_memory_overhead(pod.metadata.annotations)
    overhead = recorded if recorded is not None else max(0, own.memory_bytes - vm.min_memory_bytes)
    return max(0, requests.memory_bytes - own.memory_bytes) + overhead, overhead
