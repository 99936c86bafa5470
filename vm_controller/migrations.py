"""What to do about a VirtualMachineMigration: the migration controller's policy.

Pure: no I/O, no clock (the shell passes ``now`` as the RFC 3339 string a status records).
The shell (``vm_controller.migrator``) asks ``admit`` once for a new migration, then either
writes the refusal or reserves the target's room (the extender's ``POST /v1/moves``), writes
``started``'s status, marks the source pod, creates ``target_pod``, and drives QEMU
(``vm_runner.migrate``, the move's own pure state machine); ``finished`` is the status after.

*The VM <-> pod link.* A VM's pod is named as the VM until it first moves; a target pod is
named ``target_pod_name`` (the API server forbids a second pod of the same name, and the
source still holds it). While it moves the target pod carries ``TARGET_LABEL``: it is not the
VM's pod (``decide.current_pod`` skips it) until cut-over removes the label, before the source
is deleted. So at every instant the VM has exactly one pod it calls its own, and the
VirtualMachine controller never creates a second copy of a VM that is moving.

*Restart.* Everything a move needs is in its objects: the migration's status names both pods
and both nodes, and both pods carry ``annotations.MIGRATION``. A controller that starts and
finds a migration ``Running`` that no driver of its own runs decides with ``recover``: the
source gone and the target there means the move had cut over (finish it); anything else is
aborted (the source keeps running, the target is deleted, the reservation cancelled), since
half a transfer cannot be resumed.

*never-move.* A VM whose pod says ``vm-autoscaling.io/never-move: "true"`` (or whose
VirtualMachine says ``spec.neverMove``, before the controller has patched its pod) opted out of the
moves nobody asked for: the extender's relief never chooses it (``core.relief``), and a
migration relief created (``RELIEF_LABEL``) is refused here (``NeverMove``) if the VM opted out
after the plan, or its pod's value is unreadable. A migration a human created is carried out:
the annotation guards against automatic moves, as Karpenter's ``karpenter.sh/do-not-disrupt``
stops Karpenter's own disruptions but not a ``kubectl drain``; whoever creates a migration by
hand has asked for this one.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Final, Literal

import msgspec

from protocol import annotations as ann
from protocol.kube import Pod
from protocol.virtualmachine import (
    RELIEF_LABEL,
    Condition,
    VirtualMachine,
    VirtualMachineMigration,
    VirtualMachineMigrationStatus,
)
from vm_controller import decide

# While a pod is a move's target (not yet the VM's pod): the migration's name.
TARGET_LABEL: Final = decide.MIGRATION_TARGET_LABEL
# Every runner pod of a VirtualMachine serves QMP on this TCP port (``--migration-port``) for
# the driver, and a target waits for the source's state on INCOMING_PORT.
QMP_PORT: Final = decide.MIGRATION_QMP_PORT
INCOMING_PORT: Final = decide.MIGRATION_INCOMING_PORT
CONDITION: Final = "Succeeded"
_MAX_POD_NAME: Final = 253


class Refusal(enum.StrEnum):
    """Why a migration was refused before anything was done (its condition's reason)."""

    VM_NOT_FOUND = "VMNotFound"
    VM_NOT_RUNNING = "VMNotRunning"
    ALREADY_MOVING = "AlreadyMoving"
    SAME_NODE = "SameNode"
    # The runner's --disk is a file on the source's node: QEMU's migration moves memory and
    # device state, not disk contents (no block migration here), so the target would boot
    # from another disk under the guest's feet.
    LOCAL_DISK = "LocalDisk"
    # Relief's migration of a VM that opted out of automatic moves (module docstring).
    NEVER_MOVE = "NeverMove"
    # The extender reserved room without naming the node (one older than this controller,
    # asked to choose): the reservation is cancelled.
    NO_TARGET_NODE = "NoTargetNode"


class NotStarted(enum.StrEnum):
    """Why an admitted move failed before QEMU was asked to send anything (its reason)."""

    # The source pod was deleted (or replaced) after the move was admitted.
    SOURCE_GONE = "SourceGone"
    # The source pod has no IP: the driver cannot reach its QMP port, nor could the target
    # receive from it (a pod the kubelet lost track of, or one being torn down).
    SOURCE_WITHOUT_IP = "SourceWithoutIP"
    # The target pod never ran with an IP in its time, or ended.
    TARGET_NEVER_READY = "TargetNeverReady"


def cannot_start(source: Pod | None, target: Pod | None, *, waited: bool) -> NotStarted | None:
    """Whether an admitted move can start: the source running with an IP, and (once the shell
    has ``waited`` for it) the target too. None: start it."""
    if source is None or source.metadata.deletion_timestamp:
        return NotStarted.SOURCE_GONE
    if not source.status.pod_ip:
        return NotStarted.SOURCE_WITHOUT_IP
    if waited and (target is None or not target.status.pod_ip):
        return NotStarted.TARGET_NEVER_READY
    return None


class Refused(msgspec.Struct, frozen=True, kw_only=True):
    reason: str  # a Refusal, or the extender's own reason (NoRoom, UnknownNode ...)
    message: str


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """An admitted move: from the VM's running pod to a new pod on ``target_node`` (None: the
    migration names no node; the extender chooses it when it reserves the room, ``placed``)."""

    source_pod: str
    source_uid: str
    source_node: str
    target_pod: str
    target_node: str | None


def placed(plan: Plan, target_node: str | None) -> Plan:
    """The plan on the node the extender reserved room on: the node it names (the one it chose,
    or the one the migration named); still None only from an extender that chose a node
    without naming it, which the shell refuses (``NoTargetNode``) and cancels."""
    return msgspec.structs.replace(plan, target_node=target_node or plan.target_node)


def is_active(vmm: VirtualMachineMigration) -> bool:
    return vmm.status.phase in (None, "Pending", "Running")


def target_pod_name(vmm: VirtualMachineMigration) -> str:
    """Derived from the migration alone (its uid), so a restarted controller finds the pod:
    ``<vm>-m<first 8 hex digits of the migration's uid>``."""
    suffix = "-m" + vmm.metadata.uid.replace("-", "")[:8]
    return vmm.spec.vm_name[: _MAX_POD_NAME - len(suffix)] + suffix


def admit(
    vmm: VirtualMachineMigration,
    vm: VirtualMachine | None,
    source: Pod | None,
    others: Iterable[VirtualMachineMigration],
) -> Plan | Refused:
    """A new migration: refused (with the reason, nothing done) or the move to make.
    ``source``: the VM's pod (``decide.current_pod``); ``others``: the namespace's other
    migrations."""
    name = vmm.spec.vm_name
    if vm is None or vm.metadata.deletion_timestamp:
        return Refused(reason=Refusal.VM_NOT_FOUND, message=f"VirtualMachine {name} does not exist")
    moving = [
        o.metadata.name
        for o in others
        if o.spec.vm_name == name
        and o.metadata.uid != vmm.metadata.uid
        and o.status.phase == "Running"
    ]
    if moving or (source is not None and ann.MIGRATION in (source.metadata.annotations or {})):
        by = f" (VirtualMachineMigration {moving[0]})" if moving else ""
        return Refused(reason=Refusal.ALREADY_MOVING, message=f"VM {name} is already moving{by}")
    if (
        source is None
        or source.metadata.deletion_timestamp
        or source.status.phase != "Running"
        or not source.spec.node_name
        or not decide.is_owned_by(source, vm)
    ):
        return Refused(
            reason=Refusal.VM_NOT_RUNNING,
            message=f"VM {name} has no running pod to move"
            + (f" (pod {source.metadata.name} is {source.status.phase})" if source else ""),
        )
    if RELIEF_LABEL in (vmm.metadata.labels or {}) and (vm.spec.never_move or _never_move(source)):
        return Refused(
            reason=Refusal.NEVER_MOVE,
            message=f"VM {name} opted out of automatic moves (never-move); relief does not move it",
        )
    if any(arg == "--disk" or arg.startswith("--disk=") for arg in vm.spec.runner_args):
        return Refused(
            reason=Refusal.LOCAL_DISK,
            message=f"VM {name} has a --disk on its node; only memory-resident guests move",
        )
    target = vmm.spec.target_node
    if target is not None and target == source.spec.node_name:
        return Refused(reason=Refusal.SAME_NODE, message=f"VM {name} already runs on node {target}")
    return Plan(
        source_pod=source.metadata.name,
        source_uid=source.metadata.uid,
        source_node=source.spec.node_name,
        target_pod=target_pod_name(vmm),
        target_node=target,
    )


def _never_move(pod: Pod) -> bool:
    """The pod opted out of automatic moves; an unreadable value counts as opted out."""
    try:
        return ann.is_never_move(pod.metadata.annotations)
    except ann.AnnotationError:
        return True


def source_marks(vmm: VirtualMachineMigration, plan: Plan | None) -> dict[str, str]:
    """The annotations a move's source pod carries (keys only matter to remove them, ``plan``
    None): ``MIGRATION`` (the agent leaves the VM alone) and ``MIGRATION_TO`` (a restarted
    extender holds the target's room again from it)."""
    to = f"{plan.target_node}/{plan.target_pod}" if plan is not None else ""
    return {ann.MIGRATION: vmm.metadata.name, ann.MIGRATION_TO: to}


def _vm_container(manifest_or_pod: list[Any]) -> Any:
    return next(c for c in manifest_or_pod if c["name"] == decide.VM_CONTAINER)


def target_pod(vm: VirtualMachine, source: Pod, plan: Plan, migration: str) -> dict[str, Any]:
    """The target runner pod: the VM's own pod (``decide.desired_pod``: the same device set,
    machine type, memory region and block size, since every runner flag is the VM's) on
    ``plan.target_node`` (``nodeName``: placed, room reserved by the extender beforehand), in
    incoming mode, as large as the source runs now and carrying its permit."""
    pod = decide.desired_pod(vm)
    meta, spec = pod["metadata"], pod["spec"]
    meta["name"] = plan.target_pod
    meta["labels"][TARGET_LABEL] = migration
    del meta["labels"][decide.SERVING_LABEL]  # until cut-over: ``decide.SERVING_LABEL``
    annotations = meta["annotations"]
    socket = decide.qmp_socket_host_path(vm.metadata.namespace, plan.target_pod)
    annotations[ann.HYPERVISOR] = f"{vm.spec.hypervisor}://{socket}"
    annotations[ann.MIGRATION] = migration
    for key in (ann.PERMITTED_VCPUS, ann.PERMITTED_MEMORY, ann.MEMORY_OVERHEAD):
        value = (source.metadata.annotations or {}).get(key)
        if value is not None:
            annotations[key] = value
    spec["nodeName"] = plan.target_node
    container = _vm_container(spec["containers"])
    container["args"].append(f"--incoming-port={INCOMING_PORT}")
    cpu, memory = decide.vm_container_limits(source)
    if cpu is not None and memory is not None:
        container["resources"] = {
            "requests": {"cpu": cpu, "memory": memory},
            "limits": {"cpu": cpu, "memory": memory},
        }
    return pod


def qmp_address(pod: Pod) -> str | None:
    ip = pod.status.pod_ip
    return f"tcp:{ip}:{QMP_PORT}" if ip else None


def incoming_uri(pod: Pod) -> str | None:
    ip = pod.status.pod_ip
    return f"tcp:{ip}:{INCOMING_PORT}" if ip else None


def _condition(
    status: Literal["True", "False", "Unknown"], reason: str, message: str, now: str
) -> Condition:
    return Condition(
        type=CONDITION, status=status, reason=reason, message=message, last_transition_time=now
    )


def refused(
    vmm: VirtualMachineMigration, why: Refused, *, now: str
) -> VirtualMachineMigrationStatus:
    return VirtualMachineMigrationStatus(
        phase="Failed",
        target_node=vmm.spec.target_node,
        completion_time=now,
        conditions=[_condition("False", why.reason, why.message, now)],
    )


def started(plan: Plan, *, now: str) -> VirtualMachineMigrationStatus:
    return VirtualMachineMigrationStatus(
        phase="Running",
        source_pod=plan.source_pod,
        source_node=plan.source_node,
        target_pod=plan.target_pod,
        target_node=plan.target_node,
        start_time=now,
        conditions=[
            _condition(
                "Unknown",
                "Migrating",
                f"moving from {plan.source_node} to {plan.target_node}",
                now,
            )
        ],
    )


def finished(
    status: VirtualMachineMigrationStatus,
    *,
    succeeded: bool,
    reason: str,
    message: str,
    now: str,
    downtime_ms: int | None = None,
    total_ms: int | None = None,
) -> VirtualMachineMigrationStatus:
    return msgspec.structs.replace(
        status,
        phase="Succeeded" if succeeded else "Failed",
        completion_time=now,
        downtime_milliseconds=downtime_ms,
        total_milliseconds=total_ms,
        conditions=[_condition("True" if succeeded else "False", reason, message, now)],
    )


Recovery = Literal["finish", "abort"]


def recover(source: Pod | None, target: Pod | None) -> Recovery:
    """A ``Running`` migration no driver of this process runs (the controller restarted): it
    had cut over if the target runs and either no longer carries ``TARGET_LABEL`` (cut-over
    removes it first) or the source is gone or going; else abort it."""
    if target is None or target.metadata.deletion_timestamp or target.status.phase != "Running":
        return "abort"
    source_gone = source is None or bool(source.metadata.deletion_timestamp)
    is_cut_over = TARGET_LABEL not in (target.metadata.labels or {})
    return "finish" if source_gone or is_cut_over else "abort"
