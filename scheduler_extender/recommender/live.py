"""Live mode: a ``ClusterSnapshot`` of the extender's own ledger, for the recommender.

Pure: reads the ledger, never changes it; no I/O, no clock. The shell (``http/recommend.py``)
passes the pending pods and the node pools from the config.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

import msgspec

from protocol import annotations as ann
from protocol import kube
from protocol.annotations import VmSpec
from scheduler_extender.core.ledger import Ledger
from scheduler_extender.core.podinfo import PodInfo
from scheduler_extender.recommender.model import validate_snapshot
from scheduler_extender.recommender.snapshot import (
    API_VERSION,
    KIND,
    POOL_LABEL,
    Affinity,
    Capacity,
    ClusterSnapshot,
    NodePool,
    PriorityClass,
    Resources,
    SnapshotNode,
    SnapshotPod,
    Taint,
    TaintEffect,
    Toleration,
)

__all__ = ["snapshot_from_ledger"]


def snapshot_from_ledger(
    ledger: Ledger,
    pending: Sequence[PodInfo],
    pools: Sequence[NodePool],
    *,
    pod_specs: Mapping[str, kube.PodSpec] | None = None,
    node_taints: Mapping[str, Sequence[kube.Taint]] | None = None,
    unschedulable_nodes: Collection[str] = (),
    priority_classes: Sequence[PriorityClass] | None = None,
    pool_label: str = POOL_LABEL,
    left_out: list[str] | None = None,
    vm_scheduler_name: str | None = None,
) -> ClusterSnapshot:
    """A snapshot of the live ledger, for ``recommend``. Reads the ledger, never changes it.

    The ledger knows sizes but not scheduling constraints, so the shell passes them:
    ``pod_specs`` by pending pod uid (nodeSelector, affinity, tolerations, priorityClassName)
    and ``node_taints`` by node name. Placed pods are written at what they *hold* (a VM at its
    permitted size); pending pods at ``initial_demand()``, so VM annotations need not travel.
    Nodes the ledger knows only from pods (no Node object yet) are left out with their pods:
    nothing new can be placed there anyway. Pending pods with unusable VM annotations are left
    out too: the extender rejects them everywhere and no node would change that.

    A pending pod whose constraints this model cannot express (an affinity operator such as
    ``Gt``) is left out rather than simulated as if it had none, which could recommend a pool
    it cannot use; ``left_out`` gets a sentence for each such pod.

    With ``priority_classes`` None, the classes are the ones the pending pods name, each at
    the priority the API server resolved for the first of its pods (a pod carries it in
    ``spec.priority``); a pod whose priority differs (its class changed since) is written
    without its class. So the passes per priority class happen live too.

    With ``vm_scheduler_name`` (the extender's scheduler name), VM pods also carry their
    bounds (the VM label and annotations, that scheduler's name), so that a growth headroom
    can size them (``RecommenderConfig.growth_headroom``); their sizes are the same either way.

    Raises ``SnapshotError`` when the result is inconsistent (say, a node labelled with a
    pool the config does not have).
    """
    specs = pod_specs or {}
    taints = node_taints or {}
    nodes: list[SnapshotNode] = []
    for name in sorted(ledger.nodes):
        state = ledger.nodes[name]
        if not state.is_known:
            continue
        nodes.append(
            SnapshotNode(
                name=name,
                labels=dict(state.labels),
                allocatable=Capacity(
                    cpu=f"{state.allocatable.cpu_millis}m",
                    memory=state.allocatable.memory_bytes,
                ),
                taints=[
                    Taint(key=t.key, value=t.value or "", effect=cast(TaintEffect, t.effect))
                    for t in taints.get(name, ())
                    if t.effect in ("NoSchedule", "PreferNoSchedule", "NoExecute")
                ],
                unschedulable=name in unschedulable_nodes,
            )
        )
    known = {n.name for n in nodes}
    pods: list[SnapshotPod] = []
    for entry in sorted(ledger.pods.values(), key=lambda e: (e.node, e.key, e.uid)):
        if entry.node not in known:
            continue
        pods.append(
            SnapshotPod(
                namespace=entry.namespace,
                name=entry.name,
                uid=entry.uid,
                node_name=entry.node,
                requests=Resources(cpu=f"{entry.held.cpu_millis}m", memory=entry.held.memory_bytes),
                priority=entry.priority,
                **_vm_fields(vm_scheduler_name, entry.vm, entry.vcpus, entry.memory_bytes),
            )
        )
    classes: dict[str, int] = {}
    for info in pending:
        if info.vm_error is not None or info.uid in ledger.pods:
            continue
        spec = specs.get(info.uid, kube.PodSpec())
        demand = info.initial_demand()
        try:
            affinity = (
                None
                if spec.affinity is None
                else msgspec.convert(msgspec.to_builtins(spec.affinity), Affinity)
            )
            tolerations = [
                msgspec.convert(msgspec.to_builtins(t), Toleration) for t in spec.tolerations or ()
            ]
        except msgspec.ValidationError as e:
            if left_out is not None:
                left_out.append(f"pod {info.key} left out: its constraints are not modelled ({e})")
            continue
        class_name = spec.priority_class_name
        if (
            class_name is not None
            and priority_classes is None
            and classes.setdefault(class_name, info.priority) != info.priority
        ):
            class_name = None
        pods.append(
            SnapshotPod(
                namespace=info.namespace,
                name=info.name,
                uid=info.uid,
                requests=Resources(cpu=f"{demand.cpu_millis}m", memory=demand.memory_bytes),
                priority=info.priority,
                priority_class_name=class_name,
                creation_timestamp=_parse_created(info.created),
                node_selector=dict(spec.node_selector or {}),
                affinity=affinity,
                tolerations=tolerations,
                **_vm_fields(
                    vm_scheduler_name, info.vm, info.permitted_vcpus, info.permitted_memory_bytes
                ),
            )
        )
    if priority_classes is None:
        priority_classes = [PriorityClass(name=n, value=v) for n, v in sorted(classes.items())]
    snapshot = ClusterSnapshot(
        api_version=API_VERSION,
        kind=KIND,
        pool_label=pool_label,
        nodes=nodes,
        pods=pods,
        priority_classes=list(priority_classes),
        node_pools=list(pools),
    )
    validate_snapshot(snapshot)
    return snapshot


def _parse_created(text: str) -> datetime | None:
    try:
        created = datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
    return created if created is not None and created.tzinfo is not None else None


def _vm_fields(
    scheduler_name: str | None, vm: VmSpec | None, vcpus: int | None, memory: int | None
) -> dict[str, Any]:
    """A VM pod's bounds as the snapshot writes them (``parse_vm_spec`` reads them back), when
    asked for; nothing otherwise."""
    if scheduler_name is None or vm is None:
        return {}
    annotations = {
        ann.MIN_VCPUS: str(vm.min_vcpus),
        ann.MAX_VCPUS: str(vm.max_vcpus),
        ann.SCALING_UNIT: str(vm.scaling_unit),
        ann.MIN_MEMORY: str(vm.min_memory_bytes),
        ann.MAX_MEMORY: str(vm.max_memory_bytes),
        ann.MEMORY_UNIT: str(vm.memory_unit_bytes),
    }
    if vcpus is not None:
        annotations[ann.PERMITTED_VCPUS] = str(vcpus)
    if memory is not None:
        annotations[ann.PERMITTED_MEMORY] = str(memory)
    return {
        "scheduler_name": scheduler_name,
        "labels": {ann.VM_LABEL: "true"},
        "annotations": annotations,
    }
