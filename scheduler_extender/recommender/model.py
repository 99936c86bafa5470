"""Phase 1 of the recommender: check a ``ClusterSnapshot`` and compile it into the model.

Pure: no I/O, no clock, no randomness. msgspec has checked types and shapes while decoding; this
adds every cross-field check (duplicates, unknown pools and nodes, bad quantities, malformed
selectors), collecting *all* errors, each with its ``$.path``, into one ``SnapshotError``.

The compiled ``Model`` is what the simulation reads: quantities parsed once, constraints interned
into classes, pending pods in scheduling order. ``PreparedSnapshot`` keeps it next to the
snapshot, so a snapshot that was loaded (and so validated) is not compiled a second time by
``recommend``. The model is never changed after compiling: one prepared snapshot can serve any
number of ``recommend`` calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from operator import attrgetter
from typing import Final

import msgspec

from protocol import annotations as ann
from protocol.quantity import QuantityError, cpu_millis, memory_bytes
from scheduler_extender.core.ledger import NodeState, SystemReserve
from scheduler_extender.core.podinfo import Demand, PodInfo
from scheduler_extender.recommender.config import DEFAULT_SCHEDULER_NAME
from scheduler_extender.recommender.snapshot import (
    HOSTNAME_LABEL,
    ZONE_LABEL,
    Capacity,
    ClusterSnapshot,
    FieldError,
    PoolLimits,
    Quantity,
    Resources,
    SnapshotError,
    SnapshotFormat,
    SnapshotNode,
    SnapshotPod,
    Taint,
    Toleration,
    decode_snapshot,
)

__all__ = [
    "Candidate",
    "Constraints",
    "Host",
    "Model",
    "Pending",
    "Pool",
    "PreparedSnapshot",
    "admission",
    "candidates",
    "compile_snapshot",
    "load_snapshot",
    "prepare_snapshot",
    "usable",
    "validate_snapshot",
]

# A pod's scheduling constraints, canonical and hashable, so that pods sharing them share one
# feasibility check per node (pods come from a handful of controllers: few distinct keys).
_Expr = tuple[str, str, tuple[str, ...]]  # key, operator, values
_Term = tuple[tuple[_Expr, ...], tuple[tuple[str, tuple[str, ...]], ...]]  # exprs, name fields
_TolKey = tuple[str, str, str, str]  # key, operator, value, effect
# A pending pod before it is numbered: its scheduling order key (-priority, no timestamp,
# created, key) first, then the rest of its ``Pending``: uid, vm_error, demand, cls.
_Queued = tuple[int, bool, datetime, str, str, str | None, Demand, int]


# Frozen msgspec Structs rather than frozen dataclasses: one of these is built per node and per
# constrained pod, and a Struct's constructor is several times cheaper.
class Constraints(msgspec.Struct, frozen=True):
    selector: tuple[tuple[str, str], ...]
    terms: tuple[_Term, ...] | None  # None: no required node affinity
    tolerations: tuple[_TolKey, ...]

    @property
    def by_name(self) -> bool:
        """Whether admission looks at a node's name or hostname label: then nodes of one
        kind (``Model.host_kinds``) may differ for this class."""
        if any(k == HOSTNAME_LABEL for k, _ in self.selector):
            return True
        for exprs, fields in self.terms or ():
            if fields or any(e[0] == HOSTNAME_LABEL for e in exprs):
                return True
        return False


class Host(msgspec.Struct, frozen=True):
    """What constraint matching looks at on a node (existing or a template in a zone)."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[tuple[str, str, str], ...]  # key, value, effect; NoSchedule/NoExecute only


# A Struct (gc=False: it holds no container) rather than a dataclass: one is built per pending
# pod, and a Struct's constructor is several times cheaper.
class Pending(msgspec.Struct, gc=False):
    order: int  # position in scheduling order (priority desc, oldest, name)
    uid: str
    priority: int
    # Why a VM pod's annotations are unusable (``PodInfo.vm_error``): the extender rejects it
    # on every node, so the simulation leaves it out.
    vm_error: str | None
    demand: Demand  # ``PodInfo.initial_demand()``
    cls: int  # interned Constraints
    key: str
    # Interned (cls, demand): pods of one shape are interchangeable for every fit and
    # feasibility question. ``Model.shapes`` of them, numbered from 0.
    shape: int


@dataclass(slots=True)
class Pool:
    index: int
    name: str
    instance_type: str
    zones: list[str]
    allocatable: Demand
    capacity: Demand
    labels: dict[str, str]
    taints: tuple[tuple[str, str, str], ...]
    count: int
    max_count: int
    limit_cpu: int | None
    limit_memory: int | None
    price: Fraction | None
    priority: int


@dataclass(slots=True)
class _Candidate:
    index: int
    pool: Pool
    zone: str
    host: Host  # name is a placeholder: a new node has no name until committed
    usable: Demand
    label: str  # "pool/zone"


@dataclass(slots=True)
class Model:
    nodes: list[tuple[SnapshotNode, Host]]
    # Per node (same order as ``nodes``): allocatable, and what its placed pods hold (each at
    # ``initial_demand()``, which is what the ledger's ``observe_pod`` holds for them too).
    allocatable: list[Demand]
    held: list[Demand]
    # Per node: its kind, the same for nodes whose labels (but the hostname) and taints are
    # the same, so that a class's admission is checked once per kind (``Constraints.by_name``
    # says when it is not). ``kind_count`` kinds, numbered from 0.
    host_kinds: list[int]
    kind_count: int
    pending: list[Pending]
    shapes: int  # how many distinct ``Pending.shape``
    classes: list[Constraints]
    pools: list[Pool]
    has_priority_classes: bool


class _Errors:
    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(FieldError(path=path, message=message))


def _key_path(base: str, key: str) -> str:
    return f'{base}["{key}"]'


class _Quantities:
    """Parses each distinct quantity text once per compile, and interns whole (cpu, memory)
    pairs: a snapshot repeats a few sizes thousands of times, and parsing goes through
    Fractions. A pair with a bad quantity is never interned, so each occurrence is reported."""

    def __init__(self, errors: _Errors) -> None:
        self._errors = errors
        # An absent quantity (None) is zero.
        self._cpu: dict[Quantity | None, int] = {None: 0}
        self._mem: dict[Quantity | None, int] = {None: 0}
        # Looked up by the callers first (``pairs.get``): a pair seen before, the common case,
        # costs that one lookup.
        self.pairs: dict[Resources | Capacity, Demand] = {}

    def cpu(self, value: Quantity | None, path: str) -> int:
        found = self._cpu.get(value)
        if found is None:
            try:
                found = self._cpu[value] = cpu_millis(str(value))
            except QuantityError as e:
                self._errors.add(path, str(e))
                return 0
        return found

    def memory(self, value: Quantity | None, path: str) -> int:
        found = self._mem.get(value)
        if found is None:
            try:
                found = self._mem[value] = memory_bytes(str(value))
            except QuantityError as e:
                self._errors.add(path, str(e))
                return 0
        return found

    def demand(self, pair: Resources | Capacity, *, at: str, index: int, field: str) -> Demand:
        """``pair`` parsed; a bad quantity is reported at ``at[index].field.cpu`` (or
        ``.memory``). The paths are formatted only then: most pairs are parsed fine, and
        a snapshot may have hundreds of distinct ones (placed pods' requests)."""
        cpu = self._cpu.get(pair.cpu)
        mem = self._mem.get(pair.memory)
        try:
            if cpu is None:
                cpu = self._cpu[pair.cpu] = cpu_millis(str(pair.cpu))
            if mem is None:
                mem = self._mem[pair.memory] = memory_bytes(str(pair.memory))
        except QuantityError:
            # Again, through the reporting parsers: the pair is not interned, so that each
            # occurrence of a bad quantity is reported.
            return Demand(
                self.cpu(pair.cpu, f"{at}[{index}].{field}.cpu"),
                self.memory(pair.memory, f"{at}[{index}].{field}.memory"),
            )
        found = self.pairs[pair] = Demand(cpu, mem)
        return found


def _taints(taints: Iterable[Taint]) -> tuple[tuple[str, str, str], ...]:
    # PreferNoSchedule is a preference: it never makes a pod unschedulable.
    return tuple((t.key, t.value, t.effect) for t in taints if t.effect != "PreferNoSchedule")


def _check_taints(taints: Sequence[Taint], path: str, errors: _Errors) -> None:
    seen: set[tuple[str, str]] = set()
    for j, t in enumerate(taints):
        if (t.key, t.effect) in seen:
            errors.add(f"{path}[{j}]", f"duplicate taint {t.key}:{t.effect}")
        seen.add((t.key, t.effect))


_NO_CONSTRAINTS: Final = Constraints(selector=(), terms=None, tolerations=())

# A pod's tolerations, canonical, and what is wrong with them: (index, field, message).
_Tolerations = tuple[tuple[_TolKey, ...], tuple[tuple[int, str, str], ...]]


def _tolerations(tolerations: Sequence[Toleration]) -> _Tolerations:
    tols: list[_TolKey] = []
    problems: list[tuple[int, str, str]] = []
    for j, t in enumerate(tolerations):
        if t.operator == "Exists" and t.value:
            problems.append((j, "value", "must be empty when operator is Exists"))
        if t.operator == "Equal" and not t.key:
            problems.append((j, "key", "an empty key needs operator Exists"))
        tols.append((t.key, t.operator, t.value, t.effect))
    return tuple(tols), tuple(problems)


def _constraints(
    pod: SnapshotPod, path: str, errors: _Errors, seen: dict[tuple[Toleration, ...], _Tolerations]
) -> Constraints:
    """The pod's constraints, canonical; every malformed one reported under ``path``.

    ``seen`` keeps the tolerations lists met before: pods of one controller repeat the same
    list, and checking it once per distinct list is enough (the index of a bad one is the
    same in every copy).
    """
    terms: tuple[_Term, ...] | None = None
    na = pod.affinity.node_affinity if pod.affinity is not None else None
    required = na.required_during_scheduling_ignored_during_execution if na else None
    if required is not None:
        tpath = f"{path}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        built: list[_Term] = []
        for j, term in enumerate(required.node_selector_terms):
            exprs: list[_Expr] = []
            for k, r in enumerate(term.match_expressions):
                op = r.operator
                if r.values:
                    if op in ("Exists", "DoesNotExist"):
                        errors.add(
                            f"{tpath}.nodeSelectorTerms[{j}].matchExpressions[{k}].values",
                            f"operator {op} takes no values",
                        )
                elif op in ("In", "NotIn"):
                    errors.add(
                        f"{tpath}.nodeSelectorTerms[{j}].matchExpressions[{k}].values",
                        f"operator {op} needs at least one value",
                    )
                exprs.append((r.key, op, tuple(r.values)))
            fields: list[tuple[str, tuple[str, ...]]] = []
            for k, f in enumerate(term.match_fields):
                if not f.values:
                    errors.add(
                        f"{tpath}.nodeSelectorTerms[{j}].matchFields[{k}].values",
                        f"operator {f.operator} needs at least one value",
                    )
                fields.append((f.operator, tuple(f.values)))
            built.append((tuple(exprs), tuple(fields)))
        terms = tuple(built)
    selector = pod.node_selector
    return Constraints(
        selector=tuple(sorted(selector.items())) if selector else (),
        terms=terms,
        tolerations=_checked_tolerations(pod, path, errors, seen) if pod.tolerations else (),
    )


def _checked_tolerations(
    pod: SnapshotPod, path: str, errors: _Errors, seen: dict[tuple[Toleration, ...], _Tolerations]
) -> tuple[_TolKey, ...]:
    """The pod's tolerations, canonical; each malformed one reported under ``path``."""
    listed = tuple(pod.tolerations)
    found = seen.get(listed)
    if found is None:
        found = seen[listed] = _tolerations(listed)
    tols, problems = found
    for j, field, message in problems:
        errors.add(f"{path}.tolerations[{j}].{field}", message)
    return tols


def _pod_info(pod: SnapshotPod, requests: Demand, priority: int, *, scheduler_name: str) -> PodInfo:
    """``podinfo.pod_info`` for a pod whose effective requests are already summed: the same
    ownership and VM rules, without rebuilding containers to sum them again."""
    ours = pod.scheduler_name == scheduler_name
    is_vm = ann.is_vm(pod.labels)
    vm: ann.VmSpec | None = None
    vm_error: str | None = None
    permitted: tuple[int | None, int | None] = (None, None)
    if is_vm and ours:
        try:
            vm = ann.parse_vm_spec(pod.annotations, pod_memory_bytes=requests.memory_bytes)
        except ann.AnnotationError as e:
            vm_error = str(e)
        permitted = ann.parse_permitted(pod.annotations)
    created = pod.creation_timestamp
    return PodInfo(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        node_name=pod.node_name or None,
        scheduler_name=pod.scheduler_name,
        requests=requests,
        priority=priority,
        is_ours=ours,
        is_vm=is_vm,
        is_static=ann.MIRROR_ANNOTATION in pod.annotations,
        is_terminated=False,
        vm=vm,
        vm_error=vm_error,
        permitted_vcpus=permitted[0],
        permitted_memory_bytes=permitted[1],
        created=created.isoformat() if created is not None else "",
    )


def compile_snapshot(snapshot: ClusterSnapshot, *, scheduler_name: str) -> Model:
    """Check every cross-field rule and build the model; raise ``SnapshotError`` with all.

    The loops over nodes and pods run once per object, so they format no path unless
    something is wrong, and look sizes and tolerations up among those already met.
    """
    errors = _Errors()
    qty = _Quantities(errors)
    pair = qty.pairs.get

    # Priority classes.
    class_values: dict[str, int] = {}
    default_priority = 0
    defaults = 0
    for i, pc in enumerate(snapshot.priority_classes):
        if pc.name in class_values:
            errors.add(f"$.priorityClasses[{i}].name", f"duplicate priority class {pc.name!r}")
        class_values[pc.name] = pc.value
        if pc.global_default:
            defaults += 1
            default_priority = pc.value
            if defaults > 1:
                errors.add(f"$.priorityClasses[{i}].globalDefault", "a second global default")

    # PodDisruptionBudgets (read by the scale-down check only).
    for i, pdb in enumerate(snapshot.pod_disruption_budgets):
        if (pdb.min_available is None) == (pdb.max_unavailable is None):
            errors.add(
                f"$.podDisruptionBudgets[{i}]", "give exactly one of minAvailable, maxUnavailable"
            )

    # Pools.
    pools: list[Pool] = []
    pools_by_name: dict[str, Pool] = {}
    for i, p in enumerate(snapshot.node_pools):
        path = f"$.nodePools[{i}]"
        if p.name in pools_by_name:
            errors.add(f"{path}.name", f"duplicate node pool {p.name!r}")
        seen_zones: set[str] = set()
        for j, z in enumerate(p.zones):
            if z in seen_zones:
                errors.add(f"{path}.zones[{j}]", f"duplicate zone {z!r}")
            seen_zones.add(z)
        t = p.template
        tpath = f"{path}.template"
        alloc = pair(t.allocatable) or qty.demand(
            t.allocatable, at="$.nodePools", index=i, field="template.allocatable"
        )
        cap = alloc
        if t.capacity is not None:
            cap = pair(t.capacity) or qty.demand(
                t.capacity, at="$.nodePools", index=i, field="template.capacity"
            )
            if alloc.cpu_millis > cap.cpu_millis:
                errors.add(f"{tpath}.allocatable.cpu", "exceeds the template's capacity")
            if alloc.memory_bytes > cap.memory_bytes:
                errors.add(f"{tpath}.allocatable.memory", "exceeds the template's capacity")
        for reserved in (snapshot.pool_label, ZONE_LABEL, HOSTNAME_LABEL):
            if reserved in t.labels:
                errors.add(
                    _key_path(f"{tpath}.labels", reserved),
                    "set by the recommender for each new node; remove it from the template",
                )
        _check_taints(t.taints, f"{tpath}.taints", errors)
        limits = p.limits or PoolLimits()
        pool = Pool(
            index=i,
            name=p.name,
            instance_type=t.instance_type,
            zones=list(p.zones),
            allocatable=alloc,
            capacity=cap,
            labels=dict(t.labels),
            taints=_taints(t.taints),
            count=p.current_count or 0,
            max_count=p.max_count,
            limit_cpu=None if limits.cpu is None else qty.cpu(limits.cpu, f"{path}.limits.cpu"),
            limit_memory=None
            if limits.memory is None
            else qty.memory(limits.memory, f"{path}.limits.memory"),
            # The decimal written (0.7 is 7/10, not the float nearest it), so that sums of
            # prices read as the operator would add them.
            price=Fraction(repr(p.price)) if p.price is not None else None,
            priority=p.priority,
        )
        pools.append(pool)
        pools_by_name.setdefault(p.name, pool)

    # Nodes.
    nodes: list[tuple[SnapshotNode, Host]] = []
    allocatable: list[Demand] = []
    node_index: dict[str, int] = {}  # name -> first node of that name
    observed: dict[str, int] = {}
    kinds: dict[tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str, str], ...]], int] = {}
    host_kinds: list[int] = []
    pool_label = snapshot.pool_label
    for i, n in enumerate(snapshot.nodes):
        name = n.name
        if name in node_index:
            errors.add(f"$.nodes[{i}].name", f"duplicate node {name!r}")
        else:
            node_index[name] = i
        allocatable.append(
            pair(n.allocatable)
            or qty.demand(n.allocatable, at="$.nodes", index=i, field="allocatable")
        )
        taints: tuple[tuple[str, str, str], ...] = ()
        if n.taints:
            _check_taints(n.taints, f"$.nodes[{i}].taints", errors)
            taints = _taints(n.taints)
        labels = n.labels
        pool_name = labels.get(pool_label)
        if pool_name is not None:
            found = pools_by_name.get(pool_name)
            if found is None:
                errors.add(
                    _key_path(f"$.nodes[{i}].labels", pool_label),
                    f"unknown node pool {pool_name!r}",
                )
            else:
                observed[pool_name] = observed.get(pool_name, 0) + 1
                zone = labels.get(ZONE_LABEL)
                if zone not in found.zones:
                    errors.add(
                        _key_path(f"$.nodes[{i}].labels", ZONE_LABEL),
                        f"zone {zone!r} is not one of pool {pool_name!r}'s zones {found.zones}",
                    )
        nodes.append((n, Host(name, labels, taints)))
        kind = (
            tuple(labels.items())
            if HOSTNAME_LABEL not in labels
            else tuple(kv for kv in labels.items() if kv[0] != HOSTNAME_LABEL),
            taints,
        )
        found_kind = kinds.get(kind)
        if found_kind is None:
            found_kind = kinds[kind] = len(kinds)
        host_kinds.append(found_kind)
    for pool in pools:
        pool.count = max(pool.count, observed.get(pool.name, 0))

    # Pods. A placed pod only adds what it holds to its node; no PodInfo is kept for it.
    held_cpu = [0] * len(nodes)
    held_mem = [0] * len(nodes)
    pending: list[_Queued] = []
    classes: list[Constraints] = []
    class_ids: dict[Constraints, int] = {}
    seen_tolerations: dict[tuple[Toleration, ...], _Tolerations] = {}
    pods = snapshot.pods
    # Duplicates are rare: sets of the whole lists say whether there are any, and only then
    # is each pod looked for in the loop (to report each in its place among the errors).
    # Keys ("namespace/name") are built for pending pods only (the answer names them), unless
    # the names alone cannot rule out a repeated key: two "namespace/name" strings are equal
    # only if the names are, or a "/" in one of them makes two different pairs one string.
    # Building a key for every pod was a large share of this function's time. Reading the
    # pods a field at a time instead (``map`` over each field, Python work once per distinct
    # size, priority pair and constraints) was measured slower (scripts/bench_recommender.py),
    # each field's pass costing about what the loop spends on it.
    names = list(map(_NAME, pods))
    repeated = len(set(map(_UID, pods))) < len(pods)
    if not repeated and (
        len(set(names)) < len(names) or "/" in "".join(names) or "/" in "".join(map(_NS, pods))
    ):
        repeated = len({f"{pod.namespace}/{pod.name}" for pod in pods}) < len(pods)
    uids: set[str] = set()
    keys: set[str] = set()
    for i, pod in enumerate(pods):
        if repeated:
            key = f"{pod.namespace}/{pod.name}"
            uid = pod.uid
            if uid in uids:
                errors.add(f"$.pods[{i}].uid", f"duplicate pod uid {uid!r}")
            if key in keys:
                errors.add(f"$.pods[{i}].name", f"duplicate pod {key!r}")
            uids.add(uid)
            keys.add(key)
        requests = pair(pod.requests) or qty.demand(
            pod.requests, at="$.pods", index=i, field="requests"
        )
        priority = pod.priority
        class_name = pod.priority_class_name
        if class_name is not None:
            value = class_values.get(class_name)
            if value is None:
                errors.add(
                    f"$.pods[{i}].priorityClassName", f"unknown priority class {class_name!r}"
                )
            elif priority is not None and priority != value:
                errors.add(
                    f"$.pods[{i}].priority",
                    f"{priority} differs from priority class {class_name!r} ({value})",
                )
            if priority is None:
                priority = value or 0
        elif priority is None:
            priority = default_priority
        node_name = pod.node_name
        if node_name:
            # A placed pod's constraints are only checked: nothing asks where else it could
            # run, so they are not compiled.
            if pod.affinity is not None:
                _constraints(pod, f"$.pods[{i}]", errors, seen_tolerations)
            elif pod.tolerations:
                _checked_tolerations(pod, f"$.pods[{i}]", errors, seen_tolerations)
            demand = requests
            if pod.labels and pod.scheduler_name == scheduler_name and ann.is_vm(pod.labels):
                demand = _pod_info(
                    pod, requests, priority, scheduler_name=scheduler_name
                ).initial_demand()
            node = node_index.get(node_name)
            if node is None:
                errors.add(f"$.pods[{i}].nodeName", f"unknown node {node_name!r}")
            else:
                held_cpu[node] += demand.cpu_millis
                held_mem[node] += demand.memory_bytes
            continue
        if pod.affinity is None and not pod.tolerations and not pod.node_selector:
            constraints = _NO_CONSTRAINTS
        else:
            constraints = _constraints(pod, f"$.pods[{i}]", errors, seen_tolerations)
        # Only our own VM pods hold anything but their requests (``PodInfo.initial_demand``).
        demand = requests
        vm_error: str | None = None
        if pod.labels and pod.scheduler_name == scheduler_name and ann.is_vm(pod.labels):
            info = _pod_info(pod, requests, priority, scheduler_name=scheduler_name)
            demand = info.initial_demand()
            vm_error = info.vm_error
        cls = class_ids.get(constraints)
        if cls is None:
            cls = class_ids[constraints] = len(classes)
            classes.append(constraints)
        uid = pod.uid
        created = pod.creation_timestamp
        # Scheduling order: highest priority, then oldest (no timestamp: last, after a
        # placeholder that only keeps the tuples comparable), then name.
        pending.append(
            (
                -priority,
                created is None,
                created or _EPOCH,
                f"{pod.namespace}/{pod.name}",
                uid,
                vm_error,
                demand,
                cls,
            )
        )

    if errors.items:
        raise SnapshotError(errors.items)

    # Sorted as they are: keys are unique (a duplicate raised above), so comparing two
    # tuples never goes past the key.
    pending.sort()
    ordered: list[Pending] = []
    shapes: dict[tuple[int, Demand], int] = {}
    for position, (minus, _, _, key, uid, vm_error, demand, cls) in enumerate(pending):
        shape = shapes.setdefault((cls, demand), len(shapes))
        ordered.append(Pending(position, uid, -minus, vm_error, demand, cls, key, shape))
    return Model(
        nodes=nodes,
        allocatable=allocatable,
        held=[
            Demand(cpu, mem) if cpu or mem else _ZERO
            for cpu, mem in zip(held_cpu, held_mem, strict=True)
        ],
        host_kinds=host_kinds,
        kind_count=len(kinds),
        pending=ordered,
        shapes=len(shapes),
        classes=classes,
        pools=pools,
        has_priority_classes=bool(snapshot.priority_classes),
    )


_ZERO: Final = Demand(0, 0)
_NAME: Final = attrgetter("name")
_NS: Final = attrgetter("namespace")
_UID: Final = attrgetter("uid")
_EPOCH: Final = datetime.fromisoformat("1970-01-01T00:00:00+00:00")


# ---------------------------------------------------------------------------------------------
# Constraint matching (nodeSelector, required node affinity, taints and tolerations)
# ---------------------------------------------------------------------------------------------


def _expr_matches(expr: _Expr, labels: Mapping[str, str]) -> bool:
    key, op, values = expr
    value = labels.get(key)
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    return value is None  # DoesNotExist


def _term_matches(term: _Term, host: Host) -> bool:
    exprs, fields = term
    if not exprs and not fields:
        return False  # Kubernetes: an empty term matches no node
    for op, values in fields:
        if (host.name in values) != (op == "In"):
            return False
    return all(_expr_matches(e, host.labels) for e in exprs)


def _tolerates(tols: tuple[_TolKey, ...], taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    for t_key, t_op, t_value, t_effect in tols:
        if t_effect and t_effect != effect:
            continue
        if t_key and t_key != key:
            continue
        if t_op == "Exists" or t_value == value:
            return True
    return False


def admission(c: Constraints, host: Host) -> str | None:
    """Why a pod with constraints ``c`` may not run on ``host``, or None if it may."""
    labels = host.labels
    for k, v in c.selector:
        if labels.get(k) != v:
            return f"nodeSelector {k}={v} does not match"
    if c.terms is not None and not any(_term_matches(t, host) for t in c.terms):
        return "required node affinity matches no term"
    for taint in host.taints:
        if not _tolerates(c.tolerations, taint):
            key, value, effect = taint
            return f"taint {key}={value}:{effect} is not tolerated"
    return None


# ---------------------------------------------------------------------------------------------
# Candidates: one new node of a pool's template, per pool and zone
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    index: int
    pool: Pool
    zone: str
    host: Host  # name is a placeholder: a new node has no name until committed
    usable: Demand
    label: str  # "pool/zone"


def usable(allocatable: Demand, reserve: SystemReserve) -> Demand:
    """A node's room for pods. Through ``NodeState`` so that a simulated node is exactly what
    the extender would see (the reserve is rounded up there)."""
    return NodeState(
        name="", is_known=True, allocatable=allocatable, reserve=reserve.of(allocatable)
    ).usable


def candidates(model: Model, *, pool_label: str, reserve: SystemReserve) -> list[Candidate]:
    """Every (pool, zone), by pool name then zone name: the order ties finally fall to."""
    found: list[Candidate] = []
    for pool in sorted(model.pools, key=lambda p: p.name):
        room = usable(pool.allocatable, reserve)
        for zone in sorted(pool.zones):
            # Every node has a hostname label; a new one's value is not known yet (it is set
            # when the node is committed), so a template matches Exists and DoesNotExist as
            # its nodes will, and no pod's In list of real names.
            labels = {**pool.labels, pool_label: pool.name, ZONE_LABEL: zone, HOSTNAME_LABEL: ""}
            found.append(
                Candidate(
                    index=len(found),
                    pool=pool,
                    zone=zone,
                    host=Host("", labels, pool.taints),
                    usable=room,
                    label=f"{pool.name}/{zone}",
                )
            )
    return found


# ---------------------------------------------------------------------------------------------
# Loading: decode, check, compile once
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparedSnapshot:
    """A checked snapshot with its compiled model (for ``scheduler_name``'s VM rules)."""

    snapshot: ClusterSnapshot
    scheduler_name: str
    model: Model


def prepare_snapshot(
    snapshot: ClusterSnapshot, *, scheduler_name: str = DEFAULT_SCHEDULER_NAME
) -> PreparedSnapshot:
    """Check and compile; raise ``SnapshotError`` listing every bad path."""
    model = compile_snapshot(snapshot, scheduler_name=scheduler_name)
    return PreparedSnapshot(snapshot=snapshot, scheduler_name=scheduler_name, model=model)


def load_snapshot(
    data: bytes, *, fmt: SnapshotFormat = "json", scheduler_name: str = DEFAULT_SCHEDULER_NAME
) -> PreparedSnapshot:
    """Decode, check and compile; raise ``SnapshotError`` (400) naming each bad path.

    Nothing is half-applied: the result is a new value or an exception, and no state exists to
    be left behind.
    """
    return prepare_snapshot(decode_snapshot(data, fmt=fmt), scheduler_name=scheduler_name)


def validate_snapshot(snapshot: ClusterSnapshot) -> None:
    """The cross-field checks msgspec cannot do; raise ``SnapshotError`` listing all of them."""
    compile_snapshot(snapshot, scheduler_name=DEFAULT_SCHEDULER_NAME)
