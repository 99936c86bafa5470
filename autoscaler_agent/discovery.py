"""Which VMs this agent manages: a seam with two sources, Kubernetes and a standalone file.

A ``VmSource`` yields complete snapshots (``{key: VmTarget}``) whenever its view changes; the
supervisor (``runner.Supervisor``) reconciles its VM loops against each one. Whole snapshots
rather than add/remove events make the supervisor idempotent: a relist after a disconnect is
just another snapshot, and nothing can be started or stopped twice.

* ``KubeSource``: list-then-watch of the pods on this node (``kube_io.watch_objects``), kept to
  VM pods (label ``vm-autoscaling.io/vm: "true"``) that are running and not terminating.
  ``kube_io`` is imported only when this source runs, so the standalone mode and the tests need
  neither a cluster nor that package.
* ``StandaloneSource``: a YAML file listing VMs, for running on one machine without a cluster;
  re-read when it changes.

``vm_target_from_pod`` and ``parse_standalone`` are pure: no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Annotated, Protocol

import msgspec
import structlog
import yaml

from protocol.annotations import (
    DEFAULT_MEMORY_UNIT,
    MIGRATION,
    AnnotationError,
    VmSpec,
    is_vm,
    parse_memory_overhead,
    parse_permitted,
    parse_vm_spec,
    vm_container_name,
)
from protocol.kube import Pod
from protocol.permits import PodRef
from protocol.quantity import QuantityError, cpu_millis, memory_bytes
from protocol.strict_yaml import describe_yaml_error

log = structlog.get_logger(__name__)

DEFAULT_METRICS_PORT = 9100


class VmTarget(msgspec.Struct, frozen=True, kw_only=True):
    """One VM to manage: where it is, its bounds, and how to reach its VMM and its metrics."""

    namespace: str
    name: str
    uid: str
    node: str
    spec: VmSpec
    hypervisor_url: str
    metrics_url: str
    # The extender's durable record of the last permit (pod annotation), if any.
    permitted_vcpus: int | None = None
    permitted_memory: int | None = None
    # Guest memory the VM container's memory limit, as the kubelet reports it applied, leaves
    # room for (``memory_room``); None when no limit is known or memory does not scale.
    memory_room_bytes: int | None = None
    # vCPUs the VM container's CPU limit, as the kubelet reports it applied, has room for
    # (``vcpu_room``); None when no limit is known.
    vcpu_room: int | None = None
    # Where the VM container's cgroup may be, relative to the host's cgroup filesystem
    # (``container_cgroup_dirs``): the agent reads its CPU throttling there. () when unknown.
    cgroup_dirs: tuple[str, ...] = ()
    # The pod is one side of a live move (annotation ``migration``): not to be resized.
    is_moving: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def same_loop(self, other: VmTarget) -> bool:
        """Whether a loop built for ``other`` can go on for this target: everything but the
        permit record, which only seeds a new loop's state (the running loop knows its permit
        better than the annotation, which the extender writes after answering), and the
        container's memory room and whether the VM moves, which the loop is told of as they
        change."""
        return _loop_part(self) == _loop_part(other)

    @property
    def pod(self) -> PodRef:
        return PodRef(namespace=self.namespace, name=self.name, uid=self.uid)


def _loop_part(target: VmTarget) -> VmTarget:
    return msgspec.structs.replace(
        target,
        permitted_vcpus=None,
        permitted_memory=None,
        memory_room_bytes=None,
        vcpu_room=None,
        is_moving=False,
    )


Snapshot = Mapping[str, VmTarget]


class VmSource(Protocol):
    """Yields the complete set of VMs on this node each time it changes."""

    def snapshots(self) -> AsyncIterator[Snapshot]: ...


class DiscoveryError(Exception):
    """A VM description that cannot be used (names the VM and the problem)."""


# -- Kubernetes ----------------------------------------------------------------------------


def _pod_memory_bytes(pod: Pod) -> int:
    total = 0
    for c in pod.spec.containers or ():
        raw = (c.resources.requests or {}).get("memory") if c.resources else None
        if raw:
            with contextlib.suppress(QuantityError):
                total += memory_bytes(raw)
    return total


def memory_room(pod: Pod, spec: VmSpec) -> int | None:
    """Guest memory the VM container's applied memory limit leaves room for, or None.

    The limit is the kubelet's report of what it applied (``status.containerStatuses[].
    resources``, which lags an in-place resize of the spec), less the container's memory above
    the guest's: the extender's record (``memory-overhead``) or, before any permit, the
    container's memory as written above ``min-memory``. None when memory does not scale, or
    the kubelet reports no memory limit (then nothing in the pod caps QEMU's memory).
    """
    if spec.max_memory_bytes <= spec.min_memory_bytes:
        return None
    name = vm_container_name(pod)
    container = next((c for c in pod.spec.containers or () if c.name == name), None)
    status = next((s for s in pod.status.container_statuses or () if s.name == name), None)
    if container is None or status is None or status.resources is None:
        return None
    try:
        applied = memory_bytes((status.resources.limits or {})["memory"])
    except (KeyError, QuantityError):
        return None
    overhead = parse_memory_overhead(pod.metadata.annotations)
    if overhead is None:
        res = container.resources
        written = res and ((res.limits or {}).get("memory") or (res.requests or {}).get("memory"))
        try:
            overhead = max(0, memory_bytes(written) - spec.min_memory_bytes) if written else 0
        except QuantityError:
            overhead = 0
    return max(0, applied - overhead)


def vcpu_room(pod: Pod) -> int | None:
    """vCPUs the VM container's applied CPU limit has room for (whole cores), or None.

    The extender resizes the container to one core per permitted vCPU; the kubelet applies
    that to the cgroup a moment later and reports it (``status.containerStatuses[].resources``).
    A vCPU onlined before then runs throttled under the old quota, so growth waits for it, as
    memory waits for its limit. None when the kubelet reports no CPU limit.
    """
    name = vm_container_name(pod)
    status = next((s for s in pod.status.container_statuses or () if s.name == name), None)
    if status is None or status.resources is None:
        return None
    try:
        return cpu_millis((status.resources.limits or {})["cpu"]) // 1000
    except (KeyError, QuantityError):
        return None


# The runtime's name for a container's scope under the systemd cgroup driver, by the scheme of
# its containerID.
_SCOPE_PREFIXES = {"containerd": "cri-containerd-", "cri-o": "crio-", "docker": "docker-"}


def container_cgroup_dirs(pod: Pod) -> tuple[str, ...]:
    """Where the VM container's cgroup is, relative to the cgroup filesystem's root: one
    directory per kubelet cgroup driver (``cgroupfs``: ``kubepods[/<qos>]/pod<uid>/<id>``;
    ``systemd``: ``kubepods.slice/[kubepods-<qos>.slice/]kubepods[-<qos>]-pod<uid>.slice/
    <runtime>-<id>.scope``, pkg/kubelet/cm/cgroup_manager_linux.go) and hierarchy (v2: at
    the root; v1: below the ``cpu`` controller's mount). The agent reads whichever exists.
    () when the container has no ID yet."""
    name = vm_container_name(pod)
    status = next((s for s in pod.status.container_statuses or () if s.name == name), None)
    if status is None or not status.container_id or "://" not in status.container_id:
        return ()
    runtime, cid = status.container_id.split("://", 1)
    uid = pod.metadata.uid
    qos = (pod.status.qos_class or "").lower()
    is_guaranteed = qos in ("guaranteed", "")
    cgroupfs = f"kubepods/pod{uid}/{cid}" if is_guaranteed else f"kubepods/{qos}/pod{uid}/{cid}"
    slice_uid = uid.replace("-", "_")
    scope = f"{_SCOPE_PREFIXES.get(runtime, runtime + '-')}{cid}.scope"
    systemd = (
        f"kubepods.slice/kubepods-pod{slice_uid}.slice/{scope}"
        if is_guaranteed
        else f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slice_uid}.slice/{scope}"
    )
    return tuple(prefix + d for prefix in ("", "cpu/", "cpu,cpuacct/") for d in (cgroupfs, systemd))


def vm_target_from_pod(pod: Pod, *, node: str) -> VmTarget | None:
    """The VM a pod describes, None if it is not one of ours to manage now.

    Raises DiscoveryError for a VM pod whose annotations are unusable (logged by the caller,
    the VM is left alone: resizing a VM with unknown bounds is worse than not resizing it).
    """
    meta = pod.metadata
    if not is_vm(meta.labels) or meta.deletion_timestamp is not None:
        return None
    if pod.spec.node_name != node or pod.status.phase != "Running":
        return None
    key = f"{meta.namespace}/{meta.name}"
    try:
        spec = parse_vm_spec(meta.annotations, pod_memory_bytes=_pod_memory_bytes(pod))
    except AnnotationError as e:
        raise DiscoveryError(f"{key}: {e}") from e
    if spec.hypervisor is None:
        raise DiscoveryError(f"{key}: annotation vm-autoscaling.io/hypervisor is required")
    metrics_url = spec.metrics_url
    if metrics_url is None:
        pod_ip = pod.status.pod_ip
        if not pod_ip:
            raise DiscoveryError(f"{key}: no metrics-url annotation and no pod IP known")
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        metrics_url = f"http://{host}:{DEFAULT_METRICS_PORT}/metrics"
    permitted, permitted_memory = parse_permitted(meta.annotations)
    return VmTarget(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        node=node,
        spec=spec,
        hypervisor_url=spec.hypervisor,
        metrics_url=metrics_url,
        permitted_vcpus=permitted,
        permitted_memory=permitted_memory,
        memory_room_bytes=memory_room(pod, spec),
        vcpu_room=vcpu_room(pod),
        cgroup_dirs=container_cgroup_dirs(pod),
        is_moving=MIGRATION in (meta.annotations or {}),
    )


def targets_from_pods(pods: Mapping[str, Pod], *, node: str) -> dict[str, VmTarget]:
    targets: dict[str, VmTarget] = {}
    for pod in pods.values():
        try:
            target = vm_target_from_pod(pod, node=node)
        except DiscoveryError as e:
            log.warning("vm_pod_unusable", error=str(e))
            continue
        if target is not None:
            targets[target.key] = target
    return targets


class KubeSource:
    """VM pods on ``node``, from a list-then-watch of pods filtered by ``spec.nodeName``."""

    def __init__(self, *, kubeconfig: str | None, node: str) -> None:
        self._kubeconfig = kubeconfig
        self._node = node

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        try:
            # Imported here, not at the top: the seam that keeps kube_io optional.
            from kube_io import Changed, KubeClient, Listed, watch_objects  # noqa: PLC0415
        except ImportError as e:  # the seam: standalone mode must not need kube_io
            raise DiscoveryError(f"Kubernetes discovery needs the kube_io package: {e}") from e
        pods: dict[str, Pod] = {}
        last: dict[str, VmTarget] | None = None
        async with await KubeClient.connect(self._kubeconfig) as client:
            items = watch_objects(client, "pods", field_selector=f"spec.nodeName={self._node}")
            try:
                async for item in items:
                    if isinstance(item, Listed):
                        pods = {p.metadata.uid: p for p in item.objects}
                    elif isinstance(item, Changed):
                        if item.type == "DELETED":
                            pods.pop(item.object.metadata.uid, None)
                        else:
                            pods[item.object.metadata.uid] = item.object
                    targets = targets_from_pods(pods, node=self._node)
                    # Most pod updates (status, unrelated annotations) change no target.
                    if targets != last:
                        last = targets
                        yield targets
            finally:
                # Close the watch (and its connection) now, not whenever it is collected.
                if isinstance(items, AsyncGenerator):
                    await items.aclose()


# -- standalone file -----------------------------------------------------------------------

PositiveVcpus = Annotated[int, msgspec.Meta(ge=1, le=4096)]


class StandaloneVm(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    namespace: str = "default"
    uid: str
    node: str | None = None  # None: whichever node the agent runs as
    min_vcpus: PositiveVcpus
    max_vcpus: PositiveVcpus
    scaling_unit: PositiveVcpus = 1
    # Memory: ``memory`` is the minimum (the pod's request); with ``max_memory`` above it and a
    # virtio-mem device in the VM, the agent resizes memory in steps of ``memory_unit``.
    memory: str = "1Gi"
    max_memory: str | None = None
    memory_unit: str | None = None
    hypervisor: str
    metrics_url: str


class StandaloneFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    vms: list[StandaloneVm] = msgspec.field(default_factory=list)


def parse_standalone(text: str, *, node: str, source: str = "<vms>") -> dict[str, VmTarget]:
    """The VMs of a standalone file that run on ``node``; raises DiscoveryError with a path."""
    try:
        raw = yaml.safe_load(text)
        parsed = msgspec.convert(raw if raw is not None else {}, StandaloneFile)
    except yaml.YAMLError as e:
        raise DiscoveryError(f"{source}: not valid YAML: {describe_yaml_error(e)}") from e
    except msgspec.ValidationError as e:
        raise DiscoveryError(f"{source}: {e}") from e
    targets: dict[str, VmTarget] = {}
    for i, vm in enumerate(parsed.vms):
        where = f"{source}: $.vms[{i}]"
        if vm.max_vcpus < vm.min_vcpus:
            raise DiscoveryError(f"{where}.max_vcpus: {vm.max_vcpus} < min_vcpus {vm.min_vcpus}")
        try:
            mem = memory_bytes(vm.memory)
        except QuantityError as e:
            raise DiscoveryError(f"{where}.memory: {e}") from e
        try:
            max_mem = memory_bytes(vm.max_memory) if vm.max_memory is not None else mem
            unit = memory_bytes(vm.memory_unit) if vm.memory_unit is not None else None
        except QuantityError as e:
            raise DiscoveryError(f"{where}.max_memory/memory_unit: {e}") from e
        if max_mem < mem:
            raise DiscoveryError(f"{where}.max_memory: {vm.max_memory} < memory {vm.memory}")
        if unit is not None and unit <= 0:
            raise DiscoveryError(f"{where}.memory_unit: {vm.memory_unit} must be positive")
        if (vm.node or node) != node:
            continue
        spec = VmSpec(
            min_vcpus=vm.min_vcpus,
            max_vcpus=vm.max_vcpus,
            scaling_unit=vm.scaling_unit,
            min_memory_bytes=mem,
            max_memory_bytes=max_mem,
            memory_unit_bytes=unit if unit is not None else DEFAULT_MEMORY_UNIT,
            hypervisor=vm.hypervisor,
            metrics_url=vm.metrics_url,
        )
        target = VmTarget(
            namespace=vm.namespace,
            name=vm.name,
            uid=vm.uid,
            node=node,
            spec=spec,
            hypervisor_url=vm.hypervisor,
            metrics_url=vm.metrics_url,
        )
        if target.key in targets:
            raise DiscoveryError(f"{where}: duplicate VM {target.key}")
        targets[target.key] = target
    return targets


class StandaloneSource:
    """VMs listed in a YAML file; the file is polled and re-read when it changes.

    A file that is broken at start raises (the operator sees it at once); one broken later is
    logged and the previous list kept, so a half-written edit never stops running VMs' loops.
    """

    def __init__(self, path: Path, *, node: str, poll_seconds: float = 2.0) -> None:
        self._path = path
        self._node = node
        self._poll = poll_seconds

    def load(self) -> dict[str, VmTarget]:
        try:
            text = self._path.read_text(encoding="utf-8")
        except OSError as e:
            raise DiscoveryError(f"{self._path}: {e.strerror or e}") from e
        return parse_standalone(text, node=self._node, source=str(self._path))

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self._path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns)

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        stamp = self._stamp()
        current = self.load()
        yield current
        while True:
            await asyncio.sleep(self._poll)
            new_stamp = self._stamp()
            if new_stamp == stamp:
                continue
            stamp = new_stamp
            try:
                targets = self.load()
            except DiscoveryError as e:
                log.warning("standalone_file_unusable", error=str(e))
                continue
            if targets != current:
                current = targets
                yield targets
