"""VMs' room to grow: the scale-down check's headroom, and the scale-up's plan for growth.

Pure: no I/O, no clock. A VM pod holds its current size (``PodInfo.initial_demand``: its
permitted size, else its minimum); with a *headroom* h in [0, 1] it counts as its current size
plus h of its room to grow to its top size, rounded up (room is a promise, never overstated).
Other pods count at their requests either way.

``placed_pods`` reads the snapshot's placed pods per node, with what the compiled model does
not keep of them (constraints, labels, static or not, VM bounds): the model keeps only their
sum per node, which is all the scale-up needs without a headroom.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction

import msgspec

from protocol import annotations as ann
from protocol.quantity import cpu_millis, memory_bytes
from scheduler_extender.core.podinfo import Demand
from scheduler_extender.recommender.config import RecommenderConfig
from scheduler_extender.recommender.model import (
    Constraints,
    Model,
    Pending,
    PreparedSnapshot,
    _constraints,
    _Errors,
    _pod_info,
    usable,
)
from scheduler_extender.recommender.snapshot import SnapshotError, SnapshotPod

__all__ = ["Mover", "PlacedPod", "demands", "placed_pods", "plan_growth", "priority_of"]


@dataclass(slots=True)
class PlacedPod:
    key: str
    uid: str
    priority: int
    now: Demand  # what the extender holds for it
    grown: Demand  # with the growth headroom
    cls: Constraints
    labels: dict[str, str]
    namespace: str
    is_static: bool
    is_vm: bool  # one of our VMs with usable bounds (``grown`` may exceed ``now``)


def demands(
    pod: SnapshotPod, priority: int, *, scheduler_name: str, headroom: float
) -> tuple[Demand, Demand, bool]:
    """The pod's size now and with the headroom, and whether it is one of our VMs."""
    requests = Demand(
        cpu_millis(str(pod.requests.cpu or 0)), memory_bytes(str(pod.requests.memory or 0))
    )
    if not (pod.scheduler_name == scheduler_name and ann.is_vm(pod.labels)):
        return requests, requests, False
    info = _pod_info(pod, requests, priority, scheduler_name=scheduler_name)
    now = info.initial_demand()
    if info.vm is None:
        return now, now, False
    top = Demand(info.vm.top_vcpus * 1000, info.vm.top_memory_bytes)
    grown = Demand(
        now.cpu_millis + _ceil_share(top.cpu_millis - now.cpu_millis, headroom),
        now.memory_bytes + _ceil_share(top.memory_bytes - now.memory_bytes, headroom),
    )
    return now, grown, True


def _ceil_share(room: int, share: float) -> int:
    if room <= 0:
        return 0
    exact = Fraction(room) * Fraction(share)
    return -(-exact.numerator // exact.denominator)


def priority_of(prepared: PreparedSnapshot, pod: SnapshotPod) -> int:
    """The pod's priority as ``compile_snapshot`` resolves it."""
    if pod.priority is not None:
        return pod.priority
    classes = prepared.snapshot.priority_classes
    if pod.priority_class_name is not None:
        return next((c.value for c in classes if c.name == pod.priority_class_name), 0)
    return next((c.value for c in classes if c.global_default), 0)


def placed_pods(
    prepared: PreparedSnapshot, *, scheduler_name: str, headroom: float
) -> list[list[PlacedPod]]:
    """Per node of the model (same order), its placed pods in snapshot order."""
    model = prepared.model
    index = {n.name: i for i, (n, _) in enumerate(model.nodes)}
    errors = _Errors()
    pods_on: list[list[PlacedPod]] = [[] for _ in model.nodes]
    for i, pod in enumerate(prepared.snapshot.pods):
        if not pod.node_name:
            continue
        priority = priority_of(prepared, pod)
        now, grown, is_vm = demands(pod, priority, scheduler_name=scheduler_name, headroom=headroom)
        pods_on[index[pod.node_name]].append(
            PlacedPod(
                key=f"{pod.namespace}/{pod.name}",
                uid=pod.uid,
                priority=priority,
                now=now,
                grown=grown,
                cls=_constraints(pod, f"$.pods[{i}]", errors, {}),
                labels=pod.labels,
                namespace=pod.namespace,
                is_static=ann.MIRROR_ANNOTATION in pod.annotations,
                is_vm=is_vm,
            )
        )
    if errors.items:  # pragma: no cover - compile_snapshot checked the same constraints
        raise SnapshotError(errors.items)
    return pods_on


@dataclass(frozen=True, slots=True)
class Mover:
    """A running VM planned to move so that the VMs on its node keep their room to grow."""

    key: str
    uid: str
    node: str
    grown: Demand


def plan_growth(prepared: PreparedSnapshot, config: RecommenderConfig) -> tuple[Model, list[Mover]]:
    """The model the scale-up plans on when ``config.growth_headroom`` is above 0:

    * pending VM pods at their grown size, so that where they land leaves them room to grow;
    * per node whose pods, at their grown sizes, exceed its room: its VMs that would have to
      move (lowest priority first, then the largest, then name) until the rest fit, added as
      pods to place at their grown size, after the pending pods of their priority. They keep
      holding their current size where they run: until one moves, its room is not free.

    The shared model is not changed: this is a new one (the lists it changes are copies).
    """
    model = prepared.model
    headroom = config.growth_headroom
    name = config.scheduler_name
    pods_on = placed_pods(prepared, scheduler_name=name, headroom=headroom)
    by_uid = {p.uid: p for p in prepared.snapshot.pods if not p.node_name}
    classes = list(model.classes)
    class_ids = {c: i for i, c in enumerate(classes)}
    # (priority, is a mover, order within its kind) -> the pod to place, at its size.
    queued: list[tuple[int, int, int, Pending]] = []
    for p in model.pending:
        demand = p.demand
        if p.vm_error is None:
            demand = demands(by_uid[p.uid], p.priority, scheduler_name=name, headroom=headroom)[1]
        queued.append((-p.priority, 0, p.order, msgspec.structs.replace(p, demand=demand)))
    movers: list[Mover] = []
    for i, (node, _host) in enumerate(model.nodes):
        room = usable(model.allocatable[i], config.reserve)
        need_cpu = sum(p.grown.cpu_millis for p in pods_on[i])
        need_mem = sum(p.grown.memory_bytes for p in pods_on[i])
        vms = sorted(
            (p for p in pods_on[i] if p.is_vm and p.grown != p.now),
            key=lambda p: (p.priority, -p.grown.cpu_millis, -p.grown.memory_bytes, p.key),
        )
        for vm in vms:
            if need_cpu <= room.cpu_millis and need_mem <= room.memory_bytes:
                break
            need_cpu -= vm.grown.cpu_millis
            need_mem -= vm.grown.memory_bytes
            cls = class_ids.get(vm.cls)
            if cls is None:
                cls = class_ids[vm.cls] = len(classes)
                classes.append(vm.cls)
            movers.append(Mover(key=vm.key, uid=vm.uid, node=node.name, grown=vm.grown))
            pending = Pending(0, vm.uid, vm.priority, None, vm.grown, cls, vm.key, 0)
            queued.append((-vm.priority, 1, len(movers), pending))
    queued.sort(key=lambda q: q[:3])
    shapes: dict[tuple[int, Demand], int] = {}
    ordered: list[Pending] = []
    for position, (_, _, _, p) in enumerate(queued):
        shape = shapes.setdefault((p.cls, p.demand), len(shapes))
        ordered.append(msgspec.structs.replace(p, order=position, shape=shape))
    grown_model = dataclasses.replace(model, pending=ordered, shapes=len(shapes), classes=classes)
    return grown_model, movers
