"""What a VirtualMachine should have, and what to do about what it has: the controller's policy.

Pure: no I/O, no clock (the shell passes ``now`` as the RFC 3339 string a condition records).

- ``desired_pod(vm)``: the runner pod, labelled and annotated exactly as a hand-written VM pod
  (``protocol/annotations.py``, ``manifests/examples/statefulset/vm-deploy.yaml``), so the
  extender and the agent see no difference between the two; the socket paths and the metrics
  URL are filled in.
- ``desired_service(vm)``: a headless Service giving the pod the DNS name the metrics URL uses.
- ``reconcile(vm, pod, service, now=...)``: the actions and the status for one VM, from the
  pod and the Service of its name that exist now (or None); among them the annotation patch
  that keeps a running pod's ``never-move`` equal to the VM's ``spec.neverMove``
  (``never_move_patch``).

A VM has at most one pod at any instant, as a StatefulSet of one: the pod's name is the VM's,
so the API server itself refuses a second while the first (even a terminating one) holds the
name, and ``reconcile`` creates a pod only once the previous one is gone.

A Service of the VM's name that the VM does not own (a user's own, or the StatefulSet form's of
manifests/examples/statefulset/) is never adopted nor rewritten: controller-runtime's rule for
``controllerutil.SetControllerReference``, which refuses an object another controller owns,
taken one step further, since a Service with no owner may be a user's too. The VM says so
(Ready False, ``ServiceConflict``, and a Warning Event once) and looks again every
``SERVICE_RECHECK_SECONDS``: an object it does not own is not one whose deletion it watches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from protocol import annotations as ann
from protocol.kube import ObjectMeta, Pod, Service
from protocol.quantity import cpu_millis, format_memory, memory_bytes
from protocol.virtualmachine import (
    API_VERSION,
    KIND,
    Condition,
    CurrentAndPermitted,
    MemoryCurrentAndPermitted,
    Phase,
    Quantity,
    VirtualMachine,
    VirtualMachineStatus,
)

# The pod label naming its VirtualMachine: the controller's watch selects on it.
VM_NAME_LABEL: Final = ann.PREFIX + "virtualmachine"
# On a live move's target pod until cut-over: the migration's name (``migrations``).
MIGRATION_TARGET_LABEL: Final = ann.PREFIX + "migration-target"
# On the pod that runs the VM for its clients, "true": the VM's Service selects it. A live
# move's target pod has it only from cut-over, when the source loses it (``migrator``), so the
# VM's name resolves to the one pod that runs its guest at every step of a move; before, it
# resolved to both, and a client could connect to a target still waiting for the guest's state
# (its QEMU in incoming mode), where its connection hung until its own timeout.
SERVING_LABEL: Final = ann.PREFIX + "serving"
# Inside the container; the hostPath root below it is <root>/<namespace>/<pod> on the host.
SOCKET_DIR: Final = "/run/vm-autoscaling"
HOST_SOCKET_ROOT: Final = "/run/vm-autoscaling"
METRICS_PORT: Final = 9100
VM_CONTAINER: Final = "vm"
# A live migration (``migrations``): QMP on TCP for its driver; a target's incoming state.
MIGRATION_QMP_PORT: Final = 4445
MIGRATION_INCOMING_PORT: Final = 4444
# The runner powers the guest off on SIGTERM (ACPI, 20 s), then QMP quit (5 s).
TERMINATION_GRACE_SECONDS: Final = 40
# How often a VM whose Service name is taken by another's Service looks again.
SERVICE_RECHECK_SECONDS: Final = 30.0
SERVICE_CONFLICT: Final = "ServiceConflict"

Manifest = dict[str, Any]


class Event(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


class Actions(msgspec.Struct, frozen=True, kw_only=True):
    """What the shell does for one VM, in this order: the Service, then delete, create or
    patch the pod, then the Service's selector, then the status (written only when it differs
    from the one the VM has); ``recheck_seconds``: pass over the VM again after that long even
    if nothing it watches changes."""

    create_service: Manifest | None = None
    create_pod: Manifest | None = None
    delete_pod_uid: str | None = None
    # Annotations to merge into the VM's current pod (a None value removes the key).
    patch_pod_annotations: dict[str, str | None] | None = None
    # Labels to merge into the VM's current pod (before the Service's selector below).
    patch_pod_labels: dict[str, str | None] | None = None
    # The merge patch that gives the VM's own Service the VM's selector, where it has another.
    patch_service_selector: dict[str, str | None] | None = None
    status: VirtualMachineStatus
    events: tuple[Event, ...] = ()
    recheck_seconds: float | None = None


def _bytes(quantity: Quantity) -> int:
    return quantity if isinstance(quantity, int) else memory_bytes(quantity)


def _quantity(quantity: Quantity) -> str:
    return format_memory(_bytes(quantity))


def qmp_socket_host_path(namespace: str, pod: str) -> str:
    return f"{HOST_SOCKET_ROOT}/{namespace}/{pod}/qmp.sock"


def metrics_url(namespace: str, vm: str) -> str:
    # The pod's own DNS record (hostname.subdomain.namespace.svc) through the headless
    # Service: known before the pod has an IP, unlike the agent's pod-IP default.
    return f"http://{vm}.{vm}.{namespace}.svc:{METRICS_PORT}/metrics"


def owner_reference(vm: VirtualMachine) -> Manifest:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": vm.metadata.name,
        "uid": vm.metadata.uid,
        "controller": True,
    }


def pod_annotations(vm: VirtualMachine) -> dict[str, str]:
    """The annotations the extender and the agent read (``protocol.annotations``)."""
    spec, meta = vm.spec, vm.metadata
    memory = spec.memory
    out = {
        ann.MIN_VCPUS: str(spec.vcpus.min),
        ann.MAX_VCPUS: str(spec.vcpus.max),
        ann.SCALING_UNIT: str(spec.vcpus.unit),
        ann.MIN_MEMORY: _quantity(memory.min),
        ann.MAX_MEMORY: _quantity(memory.max if memory.max is not None else memory.min),
        ann.HYPERVISOR: f"{spec.hypervisor}://{qmp_socket_host_path(meta.namespace, meta.name)}",
        ann.METRICS_URL: metrics_url(meta.namespace, meta.name),
        ann.VM_CONTAINER: VM_CONTAINER,
    }
    if memory.unit is not None:
        out[ann.MEMORY_UNIT] = _quantity(memory.unit)
    if spec.never_move:
        out[ann.NEVER_MOVE] = "true"
    return out


def never_move_patch(vm: VirtualMachine, pod: Pod) -> dict[str, str | None] | None:
    """The annotation patch that makes ``pod`` say what the VM's ``spec.neverMove`` says, or
    None if it does already. The field is the truth and the pod its copy (the extender and
    the migration controller read the pod): a VM that opts in or out later is followed on the
    pod it runs as now, not only on the next pod. Absent and ``"false"`` mean the same."""
    raw = (pod.metadata.annotations or {}).get(ann.NEVER_MOVE)
    if vm.spec.never_move:
        return None if raw == "true" else {ann.NEVER_MOVE: "true"}
    return None if raw in (None, "false") else {ann.NEVER_MOVE: None}


def container_memory_bytes(vm: VirtualMachine) -> int:
    return _bytes(vm.spec.memory.min) + _bytes(vm.spec.memory.overhead)


def desired_pod(vm: VirtualMachine) -> Manifest:
    spec, meta = vm.spec, vm.metadata
    cpu = str(spec.vcpus.min)
    memory = format_memory(container_memory_bytes(vm))
    resources = {
        "requests": {"cpu": cpu, "memory": memory},
        "limits": {"cpu": cpu, "memory": memory},
    }
    annotations = pod_annotations(vm)
    args = [
        f"--min-vcpus={spec.vcpus.min}",
        f"--max-vcpus={spec.vcpus.max}",
        f"--memory={annotations[ann.MIN_MEMORY]}",
        f"--max-memory={annotations[ann.MAX_MEMORY]}",
        f"--vcpu-mode={'online' if spec.hypervisor == 'qmp+qga' else 'hotplug'}",
        f"--qmp-socket={SOCKET_DIR}/qmp.sock",
        # A live migration's driver (the vm-controller) reaches QEMU here; the NetworkPolicy
        # of manifests/vm-controller/migration-networkpolicy.yaml admits only the controller.
        f"--migration-port={MIGRATION_QMP_PORT}",
        *spec.runner_args,
    ]
    ports = [
        {"name": "node-exporter", "containerPort": METRICS_PORT, "protocol": "TCP"},
        {"name": "migration-qmp", "containerPort": MIGRATION_QMP_PORT, "protocol": "TCP"},
        {"name": "migration-in", "containerPort": MIGRATION_INCOMING_PORT, "protocol": "TCP"},
    ]
    ports += [{"name": p.name, "containerPort": p.port, "protocol": "TCP"} for p in spec.ports]
    socket_mount = {
        "name": "vm-sockets",
        "mountPath": SOCKET_DIR,
        "subPathExpr": "$(POD_NAMESPACE)/$(POD_NAME)",
    }
    downward = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    init_resources = {"cpu": "100m", "memory": "32Mi"}
    pod_spec: Manifest = {
        "schedulerName": spec.scheduler_name,
        "hostname": meta.name,
        "subdomain": meta.name,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "automountServiceAccountToken": False,
        "initContainers": [
            {
                # The kubelet creates the socket directory as root; the runner runs as 10100.
                "name": "socket-dir",
                "image": spec.image,
                "imagePullPolicy": spec.image_pull_policy,
                "command": ["chown", "10100:10100", SOCKET_DIR],
                "securityContext": {
                    "runAsUser": 0,
                    "runAsNonRoot": False,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
                },
                "resources": {"requests": init_resources, "limits": init_resources},
                "volumeMounts": [socket_mount],
                "env": downward,
            }
        ],
        "containers": [
            {
                "name": VM_CONTAINER,
                "image": spec.image,
                "imagePullPolicy": spec.image_pull_policy,
                "args": args,
                "env": downward,
                "ports": ports,
                "resources": resources,
                "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
                "volumeMounts": [socket_mount],
            }
        ],
        "volumes": [
            {
                "name": "vm-sockets",
                "hostPath": {"path": HOST_SOCKET_ROOT, "type": "DirectoryOrCreate"},
            }
        ],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta.name,
            "namespace": meta.namespace,
            "labels": {ann.VM_LABEL: "true", VM_NAME_LABEL: meta.name, SERVING_LABEL: "true"},
            "annotations": annotations,
            "ownerReferences": [owner_reference(vm)],
        },
        "spec": pod_spec,
    }


def desired_service(vm: VirtualMachine) -> Manifest:
    meta = vm.metadata
    ports = [{"name": "node-exporter", "port": METRICS_PORT, "targetPort": "node-exporter"}]
    ports += [{"name": p.name, "port": p.port, "targetPort": p.name} for p in vm.spec.ports]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": meta.name,
            "namespace": meta.namespace,
            "labels": {VM_NAME_LABEL: meta.name},
            "ownerReferences": [owner_reference(vm)],
        },
        "spec": {
            # Headless: the pod's DNS name (the metrics URL's) exists from its first second.
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": service_selector(vm),
            "ports": ports,
        },
    }


def service_selector(vm: VirtualMachine) -> dict[str, str]:
    """The VM's pod while it serves its clients (``SERVING_LABEL``)."""
    return {VM_NAME_LABEL: vm.metadata.name, SERVING_LABEL: "true"}


def selector_patch(service: Service, vm: VirtualMachine) -> dict[str, str | None] | None:
    """The merge patch that gives the VM's Service the VM's selector (a Service an older
    controller made selects every pod of the VM), or None if it has it."""
    want = service_selector(vm)
    have = service.spec.selector or {}
    if have == want:
        return None
    return {**dict.fromkeys(have.keys() - want.keys()), **want}


def serving_patch(pod: Pod) -> dict[str, str | None] | None:
    """The label patch that makes the VM's settled pod serve, or None if it does already. Not
    for a move's source (it carries ``MIGRATION``): cut-over takes the label off it, and the
    pod is going."""
    annotations = pod.metadata.annotations or {}
    if (pod.metadata.labels or {}).get(SERVING_LABEL) == "true" or ann.MIGRATION in annotations:
        return None
    return {SERVING_LABEL: "true"}


def is_owned_by(obj: Pod | Service, vm: VirtualMachine) -> bool:
    return _controlled_by(obj.metadata, vm)


def _controlled_by(meta: ObjectMeta, vm: VirtualMachine) -> bool:
    return any(ref.controller and ref.uid == vm.metadata.uid for ref in meta.owner_references or ())


def vm_container_limits(pod: Pod) -> tuple[str | None, str | None]:
    """The VM container's CPU and memory limits as the kubelet applied them (KEP-1287's
    ``status.containerStatuses[].resources``), else as the spec has them."""
    for status in pod.status.container_statuses or ():
        if status.name == VM_CONTAINER and status.resources and status.resources.limits:
            limits = status.resources.limits
            return limits.get("cpu"), limits.get("memory")
    for container in pod.spec.containers or ():
        if container.name == VM_CONTAINER and container.resources and container.resources.limits:
            limits = container.resources.limits
            return limits.get("cpu"), limits.get("memory")
    return None, None


def observed_sizes(
    vm: VirtualMachine, pod: Pod
) -> tuple[CurrentAndPermitted, MemoryCurrentAndPermitted]:
    """Current: what the VM's container has (memory less QEMU's overhead); permitted: the
    extender's durable permit on the pod, else the minimum the VM was placed with."""
    permitted_vcpus, permitted_memory = ann.parse_permitted(pod.metadata.annotations)
    cpu, memory = vm_container_limits(pod)
    current_vcpus = -(-cpu_millis(cpu) // 1000) if cpu else None
    overhead = ann.parse_memory_overhead(pod.metadata.annotations)
    if overhead is None:
        overhead = _bytes(vm.spec.memory.overhead)
    current_memory = memory_bytes(memory) - overhead if memory else None
    return (
        CurrentAndPermitted(
            current=current_vcpus,
            permitted=permitted_vcpus if permitted_vcpus is not None else vm.spec.vcpus.min,
        ),
        MemoryCurrentAndPermitted(
            current=format_memory(current_memory) if current_memory else None,
            permitted=format_memory(
                permitted_memory if permitted_memory is not None else _bytes(vm.spec.memory.min)
            ),
        ),
    )


def _phase(pod: Pod | None) -> Phase:
    if pod is None:
        return "Pending"
    if pod.metadata.deletion_timestamp:
        return "Restarting"
    if pod.status.phase in ("Failed", "Succeeded"):
        return "Failed"
    if pod.status.phase == "Running":
        return "Running"
    return "Scheduled" if pod.spec.node_name else "Pending"


def _ready(
    pod: Pod | None, *, conflict: bool, service_taken: bool, name: str
) -> tuple[Literal["True", "False"], str, str]:
    if conflict:
        return "False", "PodConflict", "a pod of this name exists that this VM does not own"
    if service_taken:
        return "False", SERVICE_CONFLICT, _service_taken_message(name)
    if pod is None:
        return "False", "NoPod", "the runner pod is being created"
    for condition in pod.status.conditions or ():
        if condition.type == "Ready":
            if condition.status == "True":
                return "True", "PodReady", f"pod {pod.metadata.name} is ready"
            return "False", condition.reason or "PodNotReady", f"pod {pod.metadata.name} not ready"
    return "False", "PodNotReady", f"pod {pod.metadata.name} is not ready yet"


def _condition(
    previous: VirtualMachineStatus,
    *,
    type_: str,
    status: Literal["True", "False"],
    reason: str,
    message: str,
    now: str,
) -> Condition:
    before = next((c for c in previous.conditions or () if c.type == type_), None)
    since = before.last_transition_time if before and before.status == status else now
    return Condition(
        type=type_, status=status, reason=reason, message=message, last_transition_time=since
    )


def current_pod(vm: VirtualMachine, pods: Mapping[str, Pod]) -> Pod | None:
    """The VM's pod among the pods labelled with its name (by pod name): not a live move's
    target (``migrations.TARGET_LABEL``, removed at cut-over); the one its status names, else
    the one named as the VM, else the first by name (a pod a move made the VM's)."""
    settled = {
        n: p for n, p in pods.items() if MIGRATION_TARGET_LABEL not in (p.metadata.labels or {})
    }
    for name in (vm.status.pod, vm.metadata.name):
        if name and name in settled:
            return settled[name]
    return settled[min(settled)] if settled else None


def _service_taken_message(name: str) -> str:
    return (
        f"service {name} exists and is not owned by this VirtualMachine; leaving it alone "
        "(the pod has no DNS name for its metrics URL until it is deleted)"
    )


def reconcile(vm: VirtualMachine, pod: Pod | None, *, service: Service | None, now: str) -> Actions:
    """One VM's next step, from its pod (``current_pod``, or None) and its Service (the one
    named as the VM, or None)."""
    conflict = pod is not None and not is_owned_by(pod, vm)
    service_taken = service is not None and not is_owned_by(service, vm)
    events: list[Event] = []
    create_pod = delete_uid = None
    patch: dict[str, str | None] | None = None
    labels: dict[str, str | None] | None = None
    if vm.metadata.deletion_timestamp:
        # Going away: the garbage collector removes the pod and the Service (owner references).
        pass
    elif pod is None:
        create_pod = desired_pod(vm)
        if vm.status.pod:
            events.append(Event(type="Normal", reason="Recreating", message="runner pod is gone"))
    elif conflict:
        events.append(
            Event(
                type="Warning",
                reason="PodConflict",
                message=f"pod {pod.metadata.name} is "
                "not owned by this VirtualMachine; leaving it alone",
            )
        )
    elif not pod.metadata.deletion_timestamp and pod.status.phase in ("Failed", "Succeeded"):
        # A pod that ended (evicted, or QEMU exited with restartPolicy Never) never runs again:
        # remove it, and the next pass creates a new one once its name is free.
        delete_uid = pod.metadata.uid
        events.append(
            Event(type="Warning", reason="PodEnded", message=f"pod phase {pod.status.phase}")
        )
    elif not pod.metadata.deletion_timestamp:
        patch = never_move_patch(vm, pod)
        labels = serving_patch(pod)
    was = next((c for c in vm.status.conditions or () if c.type == "Ready"), None)
    if service_taken and not (was and was.reason == SERVICE_CONFLICT):
        events.append(
            Event(
                type="Warning",
                reason=SERVICE_CONFLICT,
                message=_service_taken_message(vm.metadata.name),
            )
        )
    owned = None if conflict else pod
    ready, reason, message = _ready(
        owned, conflict=conflict, service_taken=service_taken, name=vm.metadata.name
    )
    vcpus, memory = observed_sizes(vm, owned) if owned is not None else (None, None)
    status = VirtualMachineStatus(
        observed_generation=vm.metadata.generation,
        phase="Failed" if conflict else _phase(owned),
        node=(owned.spec.node_name or None) if owned is not None else None,
        pod=owned.metadata.name if owned is not None else None,
        vcpus=vcpus,
        memory=memory,
        conditions=[
            _condition(
                vm.status, type_="Ready", status=ready, reason=reason, message=message, now=now
            )
        ],
    )
    return Actions(
        create_service=None
        if service is not None or vm.metadata.deletion_timestamp
        else desired_service(vm),
        create_pod=create_pod,
        delete_pod_uid=delete_uid,
        patch_pod_annotations=patch,
        patch_pod_labels=labels,
        patch_service_selector=None
        if service is None or service_taken
        else selector_patch(service, vm),
        status=status,
        events=tuple(events),
        recheck_seconds=SERVICE_RECHECK_SECONDS if service_taken else None,
    )
