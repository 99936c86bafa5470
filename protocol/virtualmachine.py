"""The ``VirtualMachine`` custom resource (group ``vm-autoscaling.io``, ``v1alpha1``) as msgspec
structs.

Pure. The schema the API server enforces is ``manifests/crds/virtualmachines.yaml``; these
structs read what it admitted (a tolerant reader, like ``protocol.kube``) and write the status.
Quantities stay as the user wrote them (``1Gi`` or a plain integer of bytes); the controller
converts them with ``protocol.quantity`` where it needs a number.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from protocol.kube import ListMeta, ObjectMeta

GROUP: Final = "vm-autoscaling.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "VirtualMachine"
PLURAL: Final = "virtualmachines"
MIGRATION_PLURAL: Final = "virtualmachinemigrations"

Quantity = str | int
HypervisorMode = Literal["qmp+qga", "qmp"]
Phase = Literal["Pending", "Scheduled", "Running", "Restarting", "Failed"]


class _Obj(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True, frozen=True):
    """camelCase keys as the API has them; defaults are the CRD's own defaults."""


class VcpuRange(_Obj, frozen=True, kw_only=True):
    min: int
    max: int
    unit: int = 1


class MemoryRange(_Obj, frozen=True, kw_only=True):
    min: Quantity
    max: Quantity | None = None
    unit: Quantity | None = None
    overhead: Quantity = "512Mi"


class Port(_Obj, frozen=True, kw_only=True):
    name: str
    port: int


class VirtualMachineSpec(_Obj, frozen=True, kw_only=True):
    vcpus: VcpuRange
    memory: MemoryRange
    image: str = "vm-autoscaling/vm-runner:dev"
    image_pull_policy: str = "IfNotPresent"
    hypervisor: HypervisorMode = "qmp+qga"
    ports: list[Port] = msgspec.field(default_factory=list)
    scheduler_name: str = "vm-scheduler"
    node_selector: dict[str, str] | None = None
    runner_args: list[str] = msgspec.field(default_factory=list)
    # Opted out of automatic live moves (relief, drains): the pod carries it as the
    # ``vm-autoscaling.io/never-move`` annotation (``vm_controller.decide``).
    never_move: bool = False


class Condition(_Obj, frozen=True, kw_only=True):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None


class CurrentAndPermitted(_Obj, frozen=True, kw_only=True):
    current: int | None = None
    permitted: int | None = None


class MemoryCurrentAndPermitted(_Obj, frozen=True, kw_only=True):
    current: str | None = None
    permitted: str | None = None


class VirtualMachineStatus(_Obj, frozen=True, kw_only=True):
    observed_generation: int | None = None
    phase: Phase | None = None
    node: str | None = None
    pod: str | None = None
    vcpus: CurrentAndPermitted | None = None
    memory: MemoryCurrentAndPermitted | None = None
    conditions: list[Condition] | None = None


class VirtualMachine(_Obj, frozen=True, kw_only=True):
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: VirtualMachineSpec
    status: VirtualMachineStatus = msgspec.field(default_factory=VirtualMachineStatus)


class VirtualMachineList(_Obj, frozen=True, kw_only=True):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[VirtualMachine] | None = None


# -- VirtualMachineMigration ------------------------------------------------------------------

MIGRATION_KIND: Final = "VirtualMachineMigration"
# On a migration the extender's relief created (not a human): its ``MoveReason``.
RELIEF_LABEL: Final = f"{GROUP}/relief-reason"
MigrationPhase = Literal["Pending", "Running", "Succeeded", "Failed"]


class VirtualMachineMigrationSpec(_Obj, frozen=True, kw_only=True):
    vm_name: str
    target_node: str | None = None


class VirtualMachineMigrationStatus(_Obj, frozen=True, kw_only=True):
    phase: MigrationPhase | None = None
    source_pod: str | None = None
    source_node: str | None = None
    target_pod: str | None = None
    target_node: str | None = None
    start_time: str | None = None
    completion_time: str | None = None
    # QEMU's own figures, as the source last reported them (a move that got that far).
    downtime_milliseconds: int | None = None
    total_milliseconds: int | None = None
    conditions: list[Condition] | None = None


class VirtualMachineMigration(_Obj, frozen=True, kw_only=True):
    api_version: str = API_VERSION
    kind: str = MIGRATION_KIND
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: VirtualMachineMigrationSpec
    status: VirtualMachineMigrationStatus = msgspec.field(
        default_factory=VirtualMachineMigrationStatus
    )


class VirtualMachineMigrationList(_Obj, frozen=True, kw_only=True):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[VirtualMachineMigration] | None = None


def migration_manifest(migration: VirtualMachineMigration) -> dict[str, object]:
    """The object to POST: ``omit_defaults`` leaves out ``apiVersion`` and ``kind`` (they are
    the defaults), which the API server requires (400 "Object 'Kind' is missing")."""
    body = msgspec.to_builtins(migration)
    assert isinstance(body, dict)
    return {"apiVersion": migration.api_version, "kind": migration.kind, **body}
