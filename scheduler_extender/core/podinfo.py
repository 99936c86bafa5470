"""From a Kubernetes Pod to the facts the ledger needs (``PodInfo``).

Pure: no I/O. This is the border where API objects become our own frozen values; nothing past
it looks at a ``protocol.kube.Pod``.

How much a pod holds on its node (``pod_requests``) is what kube-scheduler v1.36 counts for it:
its NodeInfo adds each assigned pod at ``resourcehelper.PodRequests`` (k8s.io/component-helpers
``resource/helpers.go``) with status resources on (``InPlacePodVerticalScaling``, KEP-1287, GA
since 1.35), pod-level resources on (``PodLevelResources``, KEP-2837, on by default since 1.34)
and their in-place resize on (``InPlacePodLevelResourcesVerticalScaling``, KEP-5419, beta and on
by default in 1.36). Restated, for CPU and memory, as the v1.36.2 binary behaves (the
control-plane tier reads the real kube-scheduler's cache to hold us to it,
``tests/controlplane/test_counting.py``; upstream's main branch has moved on since):

1. **Each container** counts at its spec requests. A regular container or a sidecar (an init
   container with ``restartPolicy: Always``) whose status carries ``resources`` (the kubelet's
   read-back of the cgroup; present, even if empty) counts at the larger of its spec, that
   status' ``requests`` and its ``allocatedResources`` (KEP-1287: a resize in progress may sit on
   either side of the spec), except when the kubelet has marked the pod's resize **Infeasible**
   (the first ``PodResizePending`` condition has reason ``Infeasible``): then at the larger of
   the two status figures only, as the spec will never be applied. An ordinary init container
   always counts at its spec.
2. **Containers add up** as in KEP-753: the regular containers and the sidecars summed, at least
   the largest ``init container + the sidecars declared before it`` (init containers run one at
   a time, beside the sidecars already started).
3. **Pod-level requests** (KEP-2837): when ``spec.resources.requests`` names CPU, memory or a
   huge-page size, each of CPU and memory that it names replaces the containers' figure. If the
   pod's status carries ``resources`` (KEP-5419), the replacement is the larger of the spec's
   value (left out when Infeasible), ``status.resources.requests``' and
   ``status.allocatedResources``' values for it, a missing value counting as zero.
4. **Overhead** (RuntimeClass, ``spec.overhead``) is added last.

One deliberate difference, never below kube-scheduler's figure: where the kubelet has reported
``allocatedResources`` (a container's, or the pod's for a resource its pod-level requests name)
but no ``resources`` yet, kube-scheduler counts the spec; we count at least the allocation. The
kubelet has admitted that much (its own admission counts pods at their allocation), so a node
counted at the spec could be promised more than it has until the kubelet reports.

Every quantity is first rounded up to a thousandth of its unit, as the API keeps quantities
(``500u`` of CPU is ``1m``); they are summed exactly, and the pod's total is rounded up once, to
millicores and bytes (``Quantity.MilliValue()``/``Value()`` of the summed list). Not counted, as
neither is a CPU or memory request: DRA claims on node-allocatable resources (alpha).
"""

from __future__ import annotations

import enum
import functools
from typing import Final

import msgspec

from protocol import annotations as ann
from protocol.kube import Container, ContainerStatus, Pod, StrMap
from protocol.quantity import QuantityError, parse_quantity
from protocol.virtualmachine import API_VERSION as VM_API_VERSION
from protocol.virtualmachine import KIND as VM_KIND

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


class Disruption(enum.StrEnum):
    """What a drain does with a pod that is not one of our VMs: kubectl drain's filters
    (kubernetes/kubernetes ``staging/src/k8s.io/kubectl/pkg/drain/filters.go``, ``makeFilters``,
    applied in its order: DaemonSet, mirror, local storage, unreplicated), as ``kubectl drain
    --ignore-daemonsets`` runs them (no ``--delete-emptydir-data``, no ``--force``), with one
    addition from cluster-autoscaler, which is what removes an emptied node: an ``emptyDir``
    the pod names in ``cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes``
    (``ann.SAFE_TO_EVICT_LOCAL_VOLUMES``) is data its owner says may be lost, and does not
    block (kubectl drain knows no such annotation; its ``--delete-emptydir-data`` is the same
    choice made for every pod at once, by whoever drains). A pod in a terminal phase never
    reaches a drain: the ledger holds nothing for it."""

    EVICT = "evict"  # evicted through the Eviction API (its PodDisruptionBudget decides when)
    DAEMONSET = "daemonset"  # controlled by a DaemonSet: left (it tolerates the node anyway)
    MIRROR = "mirror"  # a static pod's mirror (or a pod a Node owns): left, the kubelet's
    LOCAL_STORAGE = "local-storage"  # an emptyDir: its data would be lost; blocks the drain
    UNMANAGED = "no-controller"  # no controller would make it again; blocks the drain

    @property
    def is_left(self) -> bool:
        """Left on a drained node: not evicted, and not counted against its emptiness
        (cluster-autoscaler and Karpenter, too, ignore DaemonSet and mirror pods there)."""
        return self is Disruption.DAEMONSET or self is Disruption.MIRROR

    @property
    def blocks(self) -> bool:
        """A node with such a pod is never drained (kubectl drain refuses it without flags)."""
        return self is Disruption.LOCAL_STORAGE or self is Disruption.UNMANAGED


def local_volumes_at_risk(pod: Pod) -> list[str]:
    """The pod's ``emptyDir`` volumes that ``ann.SAFE_TO_EVICT_LOCAL_VOLUMES`` does not name
    (read as cluster-autoscaler's ``getNonBlockingVolumes`` reads it: the value split on
    commas, each part a name as written), in the pod's order: what an eviction would lose
    against its owner's word."""
    listed = (pod.metadata.annotations or {}).get(ann.SAFE_TO_EVICT_LOCAL_VOLUMES, "")
    safe = set(listed.split(",")) if listed else set()
    return [
        v.name for v in pod.spec.volumes or () if v.empty_dir is not None and v.name not in safe
    ]


def disruption_of(pod: Pod) -> Disruption:
    """``Disruption`` for ``pod``: kubectl drain's filters, in their order. One departure:
    kubectl also fetches a DaemonSet pod's DaemonSet and refuses an orphan (without
    ``--force``); here the controller reference alone decides, as the ledger reads no
    DaemonSets (an orphaned DaemonSet pod is left, never evicted)."""
    controller = next((r for r in pod.metadata.owner_references or () if r.controller), None)
    if controller is not None and controller.kind == "DaemonSet":
        return Disruption.DAEMONSET
    if is_static_pod(pod):
        return Disruption.MIRROR
    if local_volumes_at_risk(pod):
        return Disruption.LOCAL_STORAGE
    if controller is None:
        return Disruption.UNMANAGED
    return Disruption.EVICT


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
    # The VirtualMachine that controls this pod (its controller owner reference), by name in
    # the pod's namespace; None for a pod made by hand. Only such a VM can be moved live: a
    # VirtualMachineMigration names the VM, not the pod.
    vm_name: str | None = None
    # The version it was read at: a Binding made for it carries it as a precondition.
    resource_version: str = ""
    # What a drain does with it, if it is not one of our VMs (``disruption_of``).
    disruption: Disruption = Disruption.EVICT

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


# A resource list as Kubernetes keeps one: resource name -> amount in thousandths of its unit
# (millicores, millibytes). Only CPU and memory are counted; a missing name is not a zero.
Amounts = dict[str, int]
_COUNTED: Final = ("cpu", "memory")
_MILLI: Final = 1000
# What the kubelet writes when a resize can never fit its node.
RESIZE_PENDING: Final = "PodResizePending"
INFEASIBLE: Final = "Infeasible"


@functools.lru_cache(maxsize=4096)
def _millis(text: str) -> int:
    value = parse_quantity(text) * _MILLI
    return -(-value.numerator // value.denominator)


def _amounts(resources: StrMap | None) -> Amounts:
    if not resources:
        return {}
    return {name: _millis(resources[name]) for name in _COUNTED if name in resources}


def _add(into: Amounts, more: Amounts) -> None:
    for name, amount in more.items():
        into[name] = into.get(name, 0) + amount


def _raise_to(into: Amounts, other: Amounts) -> None:
    for name, amount in other.items():
        if amount > into.get(name, -1):
            into[name] = amount


def _largest(*lists: Amounts) -> Amounts:
    result: Amounts = {}
    for amounts in lists:
        _raise_to(result, amounts)
    return result


def is_resize_infeasible(pod: Pod) -> bool:
    """``IsPodResizeInfeasible``: the first ``PodResizePending`` condition says Infeasible."""
    for condition in pod.status.conditions or ():
        if condition.type == RESIZE_PENDING:
            return condition.reason == INFEASIBLE
    return False


def _container(c: Container, status: ContainerStatus | None, infeasible: bool) -> Amounts:
    """Rule 1 for a regular container or a sidecar."""
    spec = _amounts(c.resources.requests if c.resources is not None else None)
    if status is None:
        return spec
    allocated = _amounts(status.allocated_resources)
    if status.resources is None:
        return _largest(spec, allocated)  # the kubelet's floor (see the module docstring)
    actual = _amounts(status.resources.requests)
    return _largest(actual, allocated) if infeasible else _largest(spec, actual, allocated)


def _container_amounts(pod: Pod) -> Amounts:
    """Rules 1 and 2."""
    statuses = {s.name: s for s in pod.status.container_statuses or ()}
    for s in pod.status.init_container_statuses or ():
        statuses.setdefault(s.name, s)
    infeasible = bool(statuses) and is_resize_infeasible(pod)
    total: Amounts = {}
    for c in pod.spec.containers or ():
        _add(total, _container(c, statuses.get(c.name), infeasible))
    sidecars: Amounts = {}
    init_peak: Amounts = {}
    for c in pod.spec.init_containers or ():
        if c.restart_policy == "Always":
            own = _container(c, statuses.get(c.name), infeasible)
            _add(total, own)
            _add(sidecars, own)
            _raise_to(init_peak, sidecars)
        else:
            running = _amounts(c.resources.requests if c.resources is not None else None)
            _add(running, sidecars)
            _raise_to(init_peak, running)
    _raise_to(total, init_peak)
    return total


def _pod_level(pod: Pod) -> Amounts:
    """Rule 3: what replaces the containers' figures (nothing without pod-level requests)."""
    res = pod.spec.resources
    named = res.requests if res is not None else None
    if not named or not any(n in _COUNTED or n.startswith("hugepages-") for n in named):
        return {}
    spec = _amounts(named)
    status = pod.status
    allocated = _amounts(status.allocated_resources)
    if status.resources is None:  # the kubelet's floor (see the module docstring)
        return {name: max(amount, allocated.get(name, 0)) for name, amount in spec.items()}
    actual = _amounts(status.resources.requests)
    infeasible = is_resize_infeasible(pod)
    return {
        name: max(0 if infeasible else amount, actual.get(name, 0), allocated.get(name, 0))
        for name, amount in spec.items()
    }


def pod_amounts(pod: Pod) -> Amounts:
    """``PodRequests`` in thousandths (see the module docstring); raises ``QuantityError``."""
    amounts = _container_amounts(pod)
    amounts.update(_pod_level(pod))
    _add(amounts, _amounts(pod.spec.overhead))
    return amounts


def _ceil_div(amount: int, unit: int) -> int:
    return -(-amount // unit)


def _demand(amounts: Amounts) -> Demand:
    return Demand(amounts.get("cpu", 0), _ceil_div(amounts.get("memory", 0), _MILLI))


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
        vm_name=controlling_vm(pod),
        resource_version=meta.resource_version,
        disruption=disruption_of(pod),
    )


def controlling_vm(pod: Pod) -> str | None:
    """The name of the VirtualMachine that controls ``pod`` (an owner reference of our kind
    with ``controller: true``, as ``vm_controller.decide.owner_reference`` writes it), or None."""
    for ref in pod.metadata.owner_references or ():
        if ref.controller and ref.kind == VM_KIND and ref.api_version == VM_API_VERSION:
            return ref.name or None
    return None


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
    try:
        own = _demand(_container(container, status, is_resize_infeasible(pod)))
    except QuantityError:
        return 0, 0
    recorded = ann.parse_memory_overhead(pod.metadata.annotations)
    overhead = recorded if recorded is not None else max(0, own.memory_bytes - vm.min_memory_bytes)
    return max(0, requests.memory_bytes - own.memory_bytes) + overhead, overhead
