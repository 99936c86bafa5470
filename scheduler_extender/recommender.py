"""Scale-up recommender: which nodes to add so that pending pods can run.

Pure: no I/O, no clock, no randomness, no globals. The same snapshot and config give the same
``Recommendation``, and ``encode_recommendation`` turns it into the same bytes. Timing is the
caller's business (``run_time_millis`` is passed in, not measured here), because a clock inside
would make two runs differ.

It follows the "ScaleSim" design, in memory instead of against a real scheduler (that design
waits 10 s of wall time per zone simulation; this answers in milliseconds), in numbered phases
like kueue's scheduling cycle:

1. **Snapshot.** Validate the ``ClusterSnapshot`` (every error with its ``$.path``) and build a
   *fresh* ``Ledger`` from it: the extender's own accounting and fit rules, on a copy. The live
   ledger is never touched (``snapshot_from_ledger`` only reads it).
2. **Existing nodes.** Pending pods, highest priority first, then oldest, then name, go onto
   existing nodes when they fit (first fit by node name, through the extender's ``FitIndex``).
   Such a pod needs no new node.
3. **Simulate.** For every eligible candidate (node pool x zone, one new node of the pool's
   template), place the still-unscheduled pods on it in the same order, first fit.
4. **Rank.** Score the candidates with the configured chain of scorers; ties fall through to
   the next link and finally to (pool, zone) names. Never random.
5. **Commit.** Add the winner's node and pods to the virtual cluster; go back to 3 until nothing
   is left or no candidate places anything. When the snapshot has priority classes, 2-5 run
   once per priority value, highest first, so high-priority pods choose the node shapes.
6. **Check.** Greedy picks one node at a time and can miss a cheaper plan (one large node
   instead of two small ones). For each pool, pack everything greedy placed on new nodes onto
   the fewest nodes of that pool alone (bounded search) and report it when it costs less.
7. **Recommend.** Group the new nodes by pool and zone; explain every pod left unscheduled.

Decisions are an enum plus a reason a human can read (``CandidateOutcome``, ``UnscheduledReason``).

The ``ClusterSnapshot`` wire types live here too, for now: ``scheduler_extender/snapshot.py`` is
already the ``/state`` dump. They are versioned input, so unknown fields are errors.
"""

from __future__ import annotations

import enum
import heapq
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from typing import Annotated, Final, Literal, cast

import msgspec
import yaml

from protocol import annotations as ann
from protocol import kube
from protocol.quantity import QuantityError, cpu_millis, format_cpu, memory_bytes
from scheduler_extender.accounting import Ledger, NodeState, SystemReserve
from scheduler_extender.placement import FitIndex, rejection
from scheduler_extender.podinfo import Demand, PodInfo

__all__ = [
    "API_VERSION",
    "KIND",
    "POOL_LABEL",
    "ZONE_LABEL",
    "Affinity",
    "CandidateOutcome",
    "CandidateTrial",
    "Capacity",
    "CheaperPlan",
    "ClusterSnapshot",
    "Diagnostics",
    "ExistingPlacement",
    "FieldError",
    "NodeAffinity",
    "NodePool",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "NodeTemplate",
    "PoolLimits",
    "PriorityClass",
    "Recommendation",
    "RecommenderConfig",
    "Resources",
    "Round",
    "ScaleUp",
    "Scorer",
    "SnapshotError",
    "SnapshotNode",
    "SnapshotPod",
    "Taint",
    "Toleration",
    "UnscheduledPod",
    "UnscheduledReason",
    "encode_recommendation",
    "load_snapshot",
    "recommend",
    "snapshot_from_ledger",
    "validate_snapshot",
]

API_VERSION: Final = "vm-autoscaling.io/v1alpha1"
KIND: Final = "ClusterSnapshot"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
POOL_LABEL: Final = "vm-autoscaling.io/node-pool"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"

# ---------------------------------------------------------------------------------------------
# The ClusterSnapshot wire types (input). camelCase, strict: a typo is an error, not a default.
# ---------------------------------------------------------------------------------------------

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Count = Annotated[int, msgspec.Meta(ge=0)]
# Kubernetes accepts numbers for quantities too (``cpu: 2`` in YAML); they are read as text.
Quantity = str | int | float
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class _Wire(
    msgspec.Struct,
    rename="camel",
    kw_only=True,
    frozen=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
):
    """Base of the snapshot types."""


class Resources(_Wire, frozen=True, kw_only=True):
    """A pod's *effective* requests (containers, init containers and overhead already summed,
    as ``podinfo.pod_requests`` does). Absent means zero."""

    cpu: Quantity | None = None
    memory: Quantity | None = None


class Capacity(_Wire, frozen=True, kw_only=True):
    cpu: Quantity
    memory: Quantity


class Taint(_Wire, frozen=True, kw_only=True):
    key: NonEmpty
    value: str = ""
    effect: TaintEffect


class Toleration(_Wire, frozen=True, kw_only=True):
    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    toleration_seconds: int | None = None


class NodeSelectorRequirement(_Wire, frozen=True, kw_only=True):
    key: NonEmpty
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = []


class FieldSelectorRequirement(_Wire, frozen=True, kw_only=True):
    key: Literal["metadata.name"]
    operator: Literal["In", "NotIn"]
    values: list[str] = []


class NodeSelectorTerm(_Wire, frozen=True, kw_only=True):
    match_expressions: list[NodeSelectorRequirement] = []
    match_fields: list[FieldSelectorRequirement] = []


class NodeSelector(_Wire, frozen=True, kw_only=True):
    node_selector_terms: list[NodeSelectorTerm]


class NodeAffinity(_Wire, frozen=True, kw_only=True):
    # Preferred (soft) affinity is not modelled: it cannot make a pod unschedulable, and
    # silently ignoring it would be worse than rejecting the field.
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None


class Affinity(_Wire, frozen=True, kw_only=True):
    node_affinity: NodeAffinity | None = None


class SnapshotNode(_Wire, frozen=True, kw_only=True):
    name: NonEmpty
    labels: dict[str, str] = {}
    allocatable: Capacity
    taints: list[Taint] = []
    unschedulable: bool = False


class SnapshotPod(_Wire, frozen=True, kw_only=True):
    """A pod: placed (``nodeName`` set) or pending. VM pods (label ``vm-autoscaling.io/vm``,
    scheduled by ``RecommenderConfig.scheduler_name``) reserve ``PodInfo.initial_demand()``,
    as the extender does, read from their annotations."""

    namespace: NonEmpty
    name: NonEmpty
    uid: NonEmpty
    node_name: str | None = None
    scheduler_name: str = "default-scheduler"
    requests: Resources = msgspec.field(default_factory=Resources)
    priority: int | None = None
    priority_class_name: str | None = None
    creation_timestamp: Annotated[datetime, msgspec.Meta(tz=True)] | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    node_selector: dict[str, str] = {}
    affinity: Affinity | None = None
    tolerations: list[Toleration] = []


class PriorityClass(_Wire, frozen=True, kw_only=True):
    name: NonEmpty
    value: int
    global_default: bool = False


class NodeTemplate(_Wire, frozen=True, kw_only=True):
    instance_type: NonEmpty
    allocatable: Capacity
    # What counts against the pool's limits; defaults to allocatable.
    capacity: Capacity | None = None
    labels: dict[str, str] = {}
    taints: list[Taint] = []


class PoolLimits(_Wire, frozen=True, kw_only=True):
    """Caps on the sum over the pool's nodes of the template's capacity (cluster-autoscaler's
    resource limits, per pool)."""

    cpu: Quantity | None = None
    memory: Quantity | None = None


class NodePool(_Wire, frozen=True, kw_only=True):
    name: NonEmpty
    zones: Annotated[list[NonEmpty], msgspec.Meta(min_length=1)]
    template: NodeTemplate
    # Nodes the pool has now; when absent, the snapshot's nodes labelled with the pool. Never
    # taken below that count: nodes we can see exist.
    current_count: Count | None = None
    max_count: Count
    limits: PoolLimits | None = None
    # Per node and hour, in any currency as long as it is the same for every pool.
    price: Annotated[float, msgspec.Meta(gt=0)] | None = None
    # Higher wins under the ``priority`` scorer.
    priority: int = 0


class ClusterSnapshot(_Wire, frozen=True, kw_only=True):
    api_version: Literal["vm-autoscaling.io/v1alpha1"]
    kind: Literal["ClusterSnapshot"]
    # The node label naming a node's pool (clouds each have their own).
    pool_label: NonEmpty = POOL_LABEL
    nodes: list[SnapshotNode] = []
    pods: list[SnapshotPod] = []
    priority_classes: list[PriorityClass] = []
    node_pools: list[NodePool] = []


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class FieldError(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    message: str


class SnapshotError(ValueError):
    """A snapshot that cannot be used: malformed, or inconsistent across fields. A client error
    (HTTP 400): retrying the same snapshot will not help. ``errors`` lists every problem found
    by the cross-field checks (msgspec stops at the first type error), each with its path."""

    status: Final = 400

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(f"{e.message} - at `{e.path}`" for e in self.errors))


_MSGSPEC_PATH = re.compile(r"^(?P<message>.*) - at `(?P<path>\$[^`]*)`$", re.DOTALL)


def _from_msgspec(e: msgspec.ValidationError) -> SnapshotError:
    m = _MSGSPEC_PATH.match(str(e))
    if m is None:
        return SnapshotError([FieldError(path="$", message=str(e))])
    return SnapshotError([FieldError(path=m["path"], message=m["message"])])


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: PyYAML keeps the last one silently, and a
    snapshot with two ``maxCount`` lines is a mistake, not a choice."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> object:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _mapping_without_duplicates,
)

_JSON_DECODER: Final = msgspec.json.Decoder(ClusterSnapshot)


def load_snapshot(data: bytes, *, fmt: Literal["json", "yaml"] = "json") -> ClusterSnapshot:
    """Decode and validate a snapshot; raise ``SnapshotError`` (400) naming each bad path.

    Nothing is half-applied: the result is a new value or an exception, and no state exists to
    be left behind.
    """
    try:
        if fmt == "json":
            snapshot = _JSON_DECODER.decode(data)
        else:
            raw = yaml.load(data, Loader=_StrictLoader)  # a SafeLoader subclass
            snapshot = msgspec.convert(raw, ClusterSnapshot)
    except msgspec.ValidationError as e:
        raise _from_msgspec(e) from e
    except msgspec.DecodeError as e:
        raise SnapshotError([FieldError(path="$", message=f"malformed JSON: {e}")]) from e
    except yaml.YAMLError as e:
        raise SnapshotError([FieldError(path="$", message=f"malformed YAML: {e}")]) from e
    validate_snapshot(snapshot)
    return snapshot


def validate_snapshot(snapshot: ClusterSnapshot) -> None:
    """The cross-field checks msgspec cannot do; raise ``SnapshotError`` listing all of them."""
    _compile(snapshot, RecommenderConfig())


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


class Scorer(enum.StrEnum):
    """Links of the ranking chain. Each only breaks the ties the links before it left."""

    # The pool's ``priority``: higher wins (cluster-autoscaler's priority expander).
    PRIORITY = "priority"
    # Resource units scheduled per price: more wins. Every pool needs a price.
    LEAST_COST = "least-cost"
    # cluster-autoscaler's least-waste: sum over cpu and memory of
    # (allocatable - requested) / allocatable of the new node; less wins.
    LEAST_WASTE = "least-waste"
    # Pods scheduled: more wins.
    MOST_PODS = "most-pods"


class RecommenderConfig(msgspec.Struct, frozen=True, kw_only=True):
    scorers: tuple[Scorer, ...] = (Scorer.PRIORITY, Scorer.LEAST_WASTE, Scorer.MOST_PODS)
    # Whose VM pods reserve their VM size (the extender's own scheduler name).
    scheduler_name: str = "vm-scheduler"
    # The extender keeps this share of every node back; the simulation must too, or it would
    # place pods the extender then refuses.
    reserve: SystemReserve = msgspec.field(default_factory=SystemReserve)
    # least-cost's exchange rate between memory and CPU: this many bytes count as one vCPU
    # (1000 units). Exact: units are Fractions of millicores.
    memory_bytes_per_cpu: Annotated[int, msgspec.Meta(gt=0)] = 4 * 2**30
    # Step budget of the exact search in the cheaper-plan check (per pool); beyond it the
    # first-fit-decreasing packing stands, flagged as not proven fewest.
    plan_search_steps: Annotated[int, msgspec.Meta(ge=0)] = 20_000


# ---------------------------------------------------------------------------------------------
# The answer (output). camelCase; deterministic field and list orders.
# ---------------------------------------------------------------------------------------------


class _Out(msgspec.Struct, rename="camel", kw_only=True, frozen=True, omit_defaults=True):
    pass


class ScaleUp(_Out, frozen=True, kw_only=True):
    node_pool: str
    zone: str
    instance_type: str
    increment_by: int
    node_names: list[str]


class CandidateOutcome(enum.StrEnum):
    WON = "won"
    LOST = "lost"
    PLACES_NOTHING = "placesNothing"
    AT_MAX = "atMax"
    OVER_LIMIT = "overLimit"


class Score(_Out, frozen=True, kw_only=True):
    """The values of the chain's links (only the configured ones), as shown to humans; the
    ranking itself compares exact Fractions."""

    priority: int | None = None
    least_cost: float | None = None
    least_waste: float | None = None
    most_pods: int | None = None


class CandidateTrial(_Out, frozen=True, kw_only=True):
    node_pool: str
    zone: str
    instance_type: str
    outcome: CandidateOutcome
    reason: str
    score: Score | None = None
    pods: list[str] = []


class Round(_Out, frozen=True, kw_only=True):
    round: int
    # The priority value this pass places (None: a single pass, no priority classes).
    pass_priority: int | None = None
    winner: str | None = None
    new_node: str | None = None
    candidates: list[CandidateTrial]


class UnscheduledReason(enum.StrEnum):
    NO_MATCHING_POOL = "NoMatchingPool"  # selector / affinity / taints exclude every pool
    TOO_BIG = "TooBigForAnyTemplate"
    POOL_AT_MAX = "PoolAtMaxCount"
    POOL_LIMIT = "PoolResourceLimit"
    INVALID_VM_SPEC = "InvalidVmSpec"  # the extender rejects it on every node


class UnscheduledPod(_Out, frozen=True, kw_only=True):
    pod: str
    uid: str
    priority: int
    reason: UnscheduledReason
    message: str
    # Per pool (or ``pool/zone`` when the zones differ): why it cannot help.
    pools: dict[str, str] = {}


class ExistingPlacement(_Out, frozen=True, kw_only=True):
    pod: str
    node: str


class CheaperPlan(_Out, frozen=True, kw_only=True):
    node_pool: str
    instance_type: str
    node_count: int
    zones: dict[str, int]
    total_price: float
    greedy_price: float
    # False when the search budget ran out: fewer nodes may exist.
    is_fewest_proven: bool


class Diagnostics(_Out, frozen=True, kw_only=True):
    rounds: list[Round] = []
    placed_on_existing: list[ExistingPlacement] = []
    new_nodes: dict[str, list[str]] = {}
    unscheduled: list[UnscheduledPod] = []
    greedy_price: float | None = None
    cheaper_plans: list[CheaperPlan] = []
    notes: list[str] = []


class Recommendation(_Out, frozen=True, kw_only=True):
    scale_up: list[ScaleUp]
    unscheduled_pods: list[str]
    diagnostics: Diagnostics


class _Envelope(_Out, frozen=True, kw_only=True):
    """The wire form: the design's three keys first, then the diagnostics."""

    scale_up: list[ScaleUp]
    unscheduled_pods: list[str]
    run_time_millis: int | None = None
    diagnostics: Diagnostics


_ENCODER: Final = msgspec.json.Encoder()


def encode_recommendation(rec: Recommendation, *, run_time_millis: int | None = None) -> bytes:
    """JSON bytes; identical for equal recommendations. ``run_time_millis`` is measured by the
    caller (``recommend`` has no clock) and left out when None, so tests compare bytes."""
    return _ENCODER.encode(
        _Envelope(
            scale_up=rec.scale_up,
            unscheduled_pods=rec.unscheduled_pods,
            run_time_millis=run_time_millis,
            diagnostics=rec.diagnostics,
        )
    )


# ---------------------------------------------------------------------------------------------
# Phase 1: compile the snapshot into the simulation's model, checking it on the way.
# ---------------------------------------------------------------------------------------------

# A pod's scheduling constraints, canonical and hashable, so that pods sharing them share one
# feasibility check per node (pods come from a handful of controllers: few distinct keys).
_Expr = tuple[str, str, tuple[str, ...]]  # key, operator, values
_Term = tuple[tuple[_Expr, ...], tuple[tuple[str, tuple[str, ...]], ...]]  # exprs, name fields
_TolKey = tuple[str, str, str, str]  # key, operator, value, effect


@dataclass(frozen=True, slots=True)
class _Constraints:
    selector: tuple[tuple[str, str], ...]
    terms: tuple[_Term, ...] | None  # None: no required node affinity
    tolerations: tuple[_TolKey, ...]


@dataclass(frozen=True, slots=True)
class _Host:
    """What constraint matching looks at on a node (existing or a template in a zone)."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[tuple[str, str, str], ...]  # key, value, effect; NoSchedule/NoExecute only


@dataclass(slots=True)
class _Pending:
    order: int  # position in scheduling order (priority desc, oldest, name)
    info: PodInfo
    demand: Demand
    cls: int  # interned _Constraints
    key: str


@dataclass(slots=True)
class _Pool:
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
    pool: _Pool
    zone: str
    host: _Host  # name is a placeholder: a new node has no name until committed
    usable: Demand
    label: str  # "pool/zone"


@dataclass(slots=True)
class _Model:
    nodes: list[tuple[SnapshotNode, _Host]]
    placed: list[PodInfo]
    pending: list[_Pending]
    classes: list[_Constraints]
    pools: list[_Pool]
    has_priority_classes: bool


class _Errors:
    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(FieldError(path=path, message=message))


def _key_path(base: str, key: str) -> str:
    return f'{base}["{key}"]'


class _Quantities:
    """Parses each distinct quantity text once per compile; a snapshot repeats a few sizes
    thousands of times, and parsing goes through Fractions."""

    def __init__(self, errors: _Errors) -> None:
        self._errors = errors
        self._cpu: dict[Quantity, int] = {}
        self._mem: dict[Quantity, int] = {}

    def cpu(self, value: Quantity | None, path: str) -> int:
        if value is None:
            return 0
        found = self._cpu.get(value)
        if found is None:
            try:
                found = self._cpu[value] = cpu_millis(str(value))
            except QuantityError as e:
                self._errors.add(path, str(e))
                return 0
        return found

    def memory(self, value: Quantity | None, path: str) -> int:
        if value is None:
            return 0
        found = self._mem.get(value)
        if found is None:
            try:
                found = self._mem[value] = memory_bytes(str(value))
            except QuantityError as e:
                self._errors.add(path, str(e))
                return 0
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


def _constraints(pod: SnapshotPod, path: str, errors: _Errors) -> _Constraints:
    terms: tuple[_Term, ...] | None = None
    na = pod.affinity.node_affinity if pod.affinity is not None else None
    required = na.required_during_scheduling_ignored_during_execution if na else None
    if required is not None:
        tpath = f"{path}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        built: list[_Term] = []
        for j, term in enumerate(required.node_selector_terms):
            exprs: list[_Expr] = []
            for k, r in enumerate(term.match_expressions):
                vpath = f"{tpath}.nodeSelectorTerms[{j}].matchExpressions[{k}].values"
                if r.operator in ("In", "NotIn") and not r.values:
                    errors.add(vpath, f"operator {r.operator} needs at least one value")
                if r.operator in ("Exists", "DoesNotExist") and r.values:
                    errors.add(vpath, f"operator {r.operator} takes no values")
                exprs.append((r.key, r.operator, tuple(r.values)))
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
    tols: list[_TolKey] = []
    for j, t in enumerate(pod.tolerations):
        if t.operator == "Exists" and t.value:
            errors.add(f"{path}.tolerations[{j}].value", "must be empty when operator is Exists")
        if t.operator == "Equal" and not t.key:
            errors.add(f"{path}.tolerations[{j}].key", "an empty key needs operator Exists")
        tols.append((t.key, t.operator, t.value, t.effect))
    return _Constraints(
        selector=tuple(sorted(pod.node_selector.items())),
        terms=terms,
        tolerations=tuple(tols),
    )


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


def _compile(snapshot: ClusterSnapshot, config: RecommenderConfig) -> _Model:
    errors = _Errors()
    qty = _Quantities(errors)

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

    # Pools.
    pools: list[_Pool] = []
    pools_by_name: dict[str, _Pool] = {}
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
        alloc = Demand(
            qty.cpu(t.allocatable.cpu, f"{tpath}.allocatable.cpu"),
            qty.memory(t.allocatable.memory, f"{tpath}.allocatable.memory"),
        )
        cap = alloc
        if t.capacity is not None:
            cap = Demand(
                qty.cpu(t.capacity.cpu, f"{tpath}.capacity.cpu"),
                qty.memory(t.capacity.memory, f"{tpath}.capacity.memory"),
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
        pool = _Pool(
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
            price=Fraction(p.price) if p.price is not None else None,
            priority=p.priority,
        )
        pools.append(pool)
        pools_by_name.setdefault(p.name, pool)

    # Nodes.
    nodes: list[tuple[SnapshotNode, _Host]] = []
    node_names: set[str] = set()
    observed: dict[str, int] = {}
    for i, n in enumerate(snapshot.nodes):
        path = f"$.nodes[{i}]"
        if n.name in node_names:
            errors.add(f"{path}.name", f"duplicate node {n.name!r}")
        node_names.add(n.name)
        qty.cpu(n.allocatable.cpu, f"{path}.allocatable.cpu")
        qty.memory(n.allocatable.memory, f"{path}.allocatable.memory")
        _check_taints(n.taints, f"{path}.taints", errors)
        pool_name = n.labels.get(snapshot.pool_label)
        if pool_name is not None:
            found = pools_by_name.get(pool_name)
            if found is None:
                errors.add(
                    _key_path(f"{path}.labels", snapshot.pool_label),
                    f"unknown node pool {pool_name!r}",
                )
            else:
                observed[pool_name] = observed.get(pool_name, 0) + 1
                zone = n.labels.get(ZONE_LABEL)
                if zone not in found.zones:
                    errors.add(
                        _key_path(f"{path}.labels", ZONE_LABEL),
                        f"zone {zone!r} is not one of pool {pool_name!r}'s zones {found.zones}",
                    )
        nodes.append((n, _Host(n.name, n.labels, _taints(n.taints))))
    for pool in pools:
        pool.count = max(pool.count, observed.get(pool.name, 0))

    # Pods.
    placed: list[PodInfo] = []
    pending: list[tuple[tuple[int, bool, datetime | None, str, str], _Pending]] = []
    classes: list[_Constraints] = []
    class_ids: dict[_Constraints, int] = {}
    uids: set[str] = set()
    keys: set[str] = set()
    for i, pod in enumerate(snapshot.pods):
        path = f"$.pods[{i}]"
        key = f"{pod.namespace}/{pod.name}"
        if pod.uid in uids:
            errors.add(f"{path}.uid", f"duplicate pod uid {pod.uid!r}")
        if key in keys:
            errors.add(f"{path}.name", f"duplicate pod {key!r}")
        uids.add(pod.uid)
        keys.add(key)
        requests = Demand(
            qty.cpu(pod.requests.cpu, f"{path}.requests.cpu"),
            qty.memory(pod.requests.memory, f"{path}.requests.memory"),
        )
        if pod.priority_class_name is not None:
            value = class_values.get(pod.priority_class_name)
            if value is None:
                errors.add(
                    f"{path}.priorityClassName",
                    f"unknown priority class {pod.priority_class_name!r}",
                )
            elif pod.priority is not None and pod.priority != value:
                errors.add(
                    f"{path}.priority",
                    f"{pod.priority} differs from priority class"
                    f" {pod.priority_class_name!r} ({value})",
                )
            priority = pod.priority if pod.priority is not None else (value or 0)
        else:
            priority = pod.priority if pod.priority is not None else default_priority
        constraints = _constraints(pod, path, errors)
        info = _pod_info(pod, requests, priority, scheduler_name=config.scheduler_name)
        if pod.node_name:
            if pod.node_name not in node_names:
                errors.add(f"{path}.nodeName", f"unknown node {pod.node_name!r}")
            placed.append(info)
            continue
        cls = class_ids.get(constraints)
        if cls is None:
            cls = class_ids[constraints] = len(classes)
            classes.append(constraints)
        created = pod.creation_timestamp
        # Scheduling order: highest priority, then oldest (no timestamp: last), then name;
        # uid last only so that the order is total.
        order_key = (-priority, created is None, created, key, pod.uid)
        pending.append((order_key, _Pending(0, info, info.initial_demand(), cls, key)))

    if errors.items:
        raise SnapshotError(errors.items)

    pending.sort(key=_order_sort_key)
    ordered = [item for _, item in pending]
    for position, item in enumerate(ordered):
        item.order = position
    return _Model(
        nodes=nodes,
        placed=placed,
        pending=ordered,
        classes=classes,
        pools=pools,
        has_priority_classes=bool(snapshot.priority_classes),
    )


def _order_sort_key(
    item: tuple[tuple[int, bool, datetime | None, str, str], _Pending],
) -> tuple[int, bool, datetime, str, str]:
    prio, missing, created, key, uid = item[0]
    # A placeholder for a missing timestamp; ``missing`` already sorts those last.
    return prio, missing, created if created is not None else _EPOCH, key, uid


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


def _term_matches(term: _Term, host: _Host) -> bool:
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


def _admission(c: _Constraints, host: _Host) -> str | None:
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
# Phases 2-7
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Trial:
    """One new node's simulated contents. Shared by the candidates with the same signature,
    and reused across rounds while none of its pods has been taken (see ``_Pass``)."""

    placed: list[int]  # pass-local indices, in placement order
    requested: Demand
    keys: list[str]  # the placed pods' names, built once for the diagnostics
    # Per candidate index: the rank key and the displayed score, computed once (Fractions).
    ranks: dict[int, tuple[object, ...]] = field(default_factory=dict)
    scores: dict[int, Score] = field(default_factory=dict)

    def rank_key(self, sim: _Sim, cand: _Candidate) -> tuple[object, ...]:
        found = self.ranks.get(cand.index)
        if found is None:
            found = self.ranks[cand.index] = sim.rank_key(cand, self)
        return found

    def score_of(self, sim: _Sim, cand: _Candidate) -> Score:
        found = self.scores.get(cand.index)
        if found is None:
            found = self.scores[cand.index] = sim.score(cand, self)
        return found


@dataclass(slots=True)
class _Group:
    """Pending pods of one pass with the same constraints and size: identical for every fit
    and feasibility question. Members taken by a winner always form a prefix (a trial takes a
    group's members in order while they fit), so ``head`` is all the bookkeeping needed."""

    cls: int
    demand: Demand
    members: list[int]
    head: int = 0


class _Pass:
    """Phase 3 for one pass, made cheap.

    Done naively, every round tries every candidate against every pending pod: rounds x
    candidates x pods (about 1 s for the benchmark). Instead:

    * pods are grouped by (constraints, size), and each candidate's feasible groups are found
      once per pass (the constraint check is per group, not per pod and round);
    * candidates with the same usable size and feasible groups (a pool's zones, when no pod
      cares about zones) share one trial: their simulations are identical;
    * a trial is a heap merge over the groups' heads in scheduling order, which is exactly
      first fit in that order, but drops a whole group the first time its size no longer fits
      (room only shrinks), so it costs O(pods placed x log groups), not O(pods pending);
    * a trial stays valid until a pod it placed is taken: removing a pod it skipped cannot
      change a first fit that skipped it.
    """

    def __init__(self, sim: _Sim, pods: list[_Pending]) -> None:
        self.pods = pods
        self.done = [False] * len(pods)
        by_key: dict[tuple[int, Demand], int] = {}
        self.groups: list[_Group] = []
        self.group_of: list[int] = []  # pod -> group
        for i, p in enumerate(pods):
            n = by_key.get((p.cls, p.demand))
            if n is None:
                n = by_key[(p.cls, p.demand)] = len(self.groups)
                self.groups.append(_Group(p.cls, p.demand, []))
            self.groups[n].members.append(i)
            self.group_of.append(n)
        sigs: dict[tuple[Demand, tuple[int, ...]], int] = {}
        self.sig_groups: list[tuple[int, ...]] = []
        self.sig_usable: list[Demand] = []
        self.sig_of: list[int] = []
        for cand in sim.candidates:
            u = cand.usable
            feasible = tuple(
                n
                for n, g in enumerate(self.groups)
                if g.demand.cpu_millis <= u.cpu_millis
                and g.demand.memory_bytes <= u.memory_bytes
                and sim.admits(g.cls, cand) is None
            )
            sig = sigs.get((u, feasible))
            if sig is None:
                sig = sigs[(u, feasible)] = len(self.sig_groups)
                self.sig_groups.append(feasible)
                self.sig_usable.append(u)
            self.sig_of.append(sig)
        self.cache: dict[int, _Trial] = {}

    def trial(self, cand: _Candidate) -> _Trial:
        sig = self.sig_of[cand.index]
        cached = self.cache.get(sig)
        done = self.done
        if cached is not None and not any(done[i] for i in cached.placed):
            return cached
        free_cpu, free_mem = self.sig_usable[sig].cpu_millis, self.sig_usable[sig].memory_bytes
        groups = self.groups
        heap: list[tuple[int, int, int]] = []
        for n in self.sig_groups[sig]:
            g = groups[n]
            d = g.demand
            if g.head < len(g.members) and d.cpu_millis <= free_cpu and d.memory_bytes <= free_mem:
                heap.append((g.members[g.head], n, g.head))
        heapq.heapify(heap)
        placed: list[int] = []
        while heap:
            i, n, pos = heapq.heappop(heap)
            g = groups[n]
            d = g.demand
            if d.cpu_millis > free_cpu or d.memory_bytes > free_mem:
                continue  # and never again in this trial: room only shrinks
            placed.append(i)
            free_cpu -= d.cpu_millis
            free_mem -= d.memory_bytes
            pos += 1
            if pos < len(g.members):
                heapq.heappush(heap, (g.members[pos], n, pos))
        usable = self.sig_usable[sig]
        t = _Trial(
            placed=placed,
            requested=Demand(usable.cpu_millis - free_cpu, usable.memory_bytes - free_mem),
            keys=[self.pods[i].key for i in placed],
        )
        self.cache[sig] = t
        return t

    def taken(self, t: _Trial) -> None:
        for i in t.placed:
            self.done[i] = True
        for i in t.placed:
            g = self.groups[self.group_of[i]]
            while g.head < len(g.members) and self.done[g.members[g.head]]:
                g.head += 1


@dataclass(slots=True)
class _Sim:
    """The virtual cluster of one ``recommend`` call. Owns a fresh Ledger: never the live one."""

    model: _Model
    config: RecommenderConfig
    ledger: Ledger
    fit: FitIndex
    candidates: list[_Candidate]
    admission: dict[tuple[int, int], str | None] = field(default_factory=dict)
    eligible: dict[int, set[str]] = field(default_factory=dict)  # class -> existing nodes
    existing_hosts: list[_Host] = field(default_factory=list)
    added: dict[str, int] = field(default_factory=dict)  # "pool/zone" -> nodes added
    new_nodes: dict[str, tuple[_Candidate, list[str]]] = field(default_factory=dict)
    greedy_pods: list[_Pending] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    placed_on_existing: list[ExistingPlacement] = field(default_factory=list)
    pool_label: str = POOL_LABEL

    # -- feasibility ----------------------------------------------------------------------

    def admits(self, cls: int, cand: _Candidate) -> str | None:
        key = (cls, cand.index)
        if key in self.admission:
            return self.admission[key]
        why = self.admission[key] = _admission(self.model.classes[cls], cand.host)
        return why

    def eligible_nodes(self, cls: int) -> set[str]:
        found = self.eligible.get(cls)
        if found is None:
            c = self.model.classes[cls]
            found = self.eligible[cls] = {
                h.name for h in self.existing_hosts if _admission(c, h) is None
            }
        return found

    # -- phase 2 ---------------------------------------------------------------------------

    def place_on_existing(self, pods: Sequence[_Pending]) -> list[_Pending]:
        """First fit by node name; returns the pods that fit nowhere."""
        left: list[_Pending] = []
        # Room only shrinks during this phase, so a (constraints, size) that found no node
        # finds none for the rest of it: skip the set arithmetic for the pods that follow.
        hopeless: set[tuple[int, Demand]] = set()
        for p in pods:
            memo = (p.cls, p.demand)
            if memo in hopeless:
                left.append(p)
                continue
            rejected = self.fit.rejections(p.demand)
            free = self.eligible_nodes(p.cls).difference(rejected)
            if not free:
                hopeless.add(memo)
                left.append(p)
                continue
            node = min(free)
            self.ledger.reserve_for_bind(p.info, node, at=0.0)
            added = self.new_nodes.get(node)
            if added is None:
                self.placed_on_existing.append(ExistingPlacement(pod=p.key, node=node))
            else:
                # Room an earlier pass's new node left over: this pod needs that node too,
                # so it belongs to the scale-up (and to the cheaper-plan check).
                added[1].append(p.key)
                self.greedy_pods.append(p)
        return left

    # -- phases 3-5 --------------------------------------------------------------------------

    def blocked(self, cand: _Candidate) -> tuple[CandidateOutcome, str] | None:
        pool = self.pool_count(cand.pool)
        if pool >= cand.pool.max_count:
            return (
                CandidateOutcome.AT_MAX,
                f"pool {cand.pool.name} has {pool} of at most {cand.pool.max_count} nodes",
            )
        cap = cand.pool.capacity
        if cand.pool.limit_cpu is not None and (pool + 1) * cap.cpu_millis > cand.pool.limit_cpu:
            return (
                CandidateOutcome.OVER_LIMIT,
                f"another node would take pool {cand.pool.name} to"
                f" {format_cpu((pool + 1) * cap.cpu_millis)} cpu, over its limit of"
                f" {format_cpu(cand.pool.limit_cpu)}",
            )
        if (
            cand.pool.limit_memory is not None
            and (pool + 1) * cap.memory_bytes > cand.pool.limit_memory
        ):
            return (
                CandidateOutcome.OVER_LIMIT,
                f"another node would take pool {cand.pool.name} to"
                f" {(pool + 1) * cap.memory_bytes} bytes of memory, over its limit of"
                f" {cand.pool.limit_memory}",
            )
        return None

    def pool_count(self, pool: _Pool) -> int:
        return pool.count + sum(self.added.get(f"{pool.name}/{z}", 0) for z in pool.zones)

    def rank_key(self, cand: _Candidate, t: _Trial) -> tuple[object, ...]:
        """Smaller is better; exact values so that no float rounding decides a tie."""
        key: list[object] = []
        for s in self.config.scorers:
            if s is Scorer.PRIORITY:
                key.append(-cand.pool.priority)
            elif s is Scorer.LEAST_COST:
                key.append(-self.units(t.requested) / _price(cand.pool))
            elif s is Scorer.LEAST_WASTE:
                key.append(_waste(cand.pool.allocatable, t.requested))
            else:
                key.append(-len(t.placed))
        key.extend((cand.pool.name, cand.zone))
        return tuple(key)

    def units(self, d: Demand) -> Fraction:
        return d.cpu_millis + Fraction(d.memory_bytes * 1000, self.config.memory_bytes_per_cpu)

    def score(self, cand: _Candidate, t: _Trial) -> Score:
        chain = set(self.config.scorers)
        return Score(
            priority=cand.pool.priority if Scorer.PRIORITY in chain else None,
            least_cost=float(self.units(t.requested) / _price(cand.pool))
            if Scorer.LEAST_COST in chain
            else None,
            least_waste=float(_waste(cand.pool.allocatable, t.requested))
            if Scorer.LEAST_WASTE in chain
            else None,
            most_pods=len(t.placed) if Scorer.MOST_PODS in chain else None,
        )

    def lost_reason(self, key: tuple[object, ...], best: tuple[object, ...], winner: str) -> str:
        links = [*(s.value for s in self.config.scorers), "pool name", "zone name"]
        for link, mine, theirs in zip(links, key, best, strict=True):
            if mine != theirs:
                return f"{winner} ranks higher on {link}"
        return f"{winner} ranks higher"  # pragma: no cover - keys are unique by name

    def run_rounds(self, pods: list[_Pending], pass_priority: int | None) -> list[_Pending]:
        state = _Pass(self, pods)
        done = state.done
        left = len(pods)
        while left:
            trials: list[tuple[tuple[object, ...], _Candidate, _Trial]] = []
            entries: list[tuple[_Candidate, CandidateOutcome, str, _Trial | None]] = []
            for cand in self.candidates:
                block = self.blocked(cand)
                if block is not None:
                    entries.append((cand, block[0], block[1], None))
                    continue
                t = state.trial(cand)
                if not t.placed:
                    entries.append(
                        (cand, CandidateOutcome.PLACES_NOTHING, "no unscheduled pod fits", t)
                    )
                    continue
                trials.append((t.rank_key(self, cand), cand, t))
                entries.append((cand, CandidateOutcome.LOST, "", t))
            if not trials:
                if entries:
                    self.rounds.append(self.round_record(entries, pass_priority, None, None))
                break
            best_key, winner, won = min(trials, key=lambda x: x[0])
            keys = {c.index: k for k, c, _ in trials}
            for n, (cand, outcome, _reason, tried) in enumerate(entries):
                if outcome is CandidateOutcome.LOST:
                    if cand is winner:
                        entries[n] = (cand, CandidateOutcome.WON, "best of the chain", tried)
                    else:
                        why = self.lost_reason(keys[cand.index], best_key, winner.label)
                        entries[n] = (cand, CandidateOutcome.LOST, why, tried)
            name = self.commit(winner, [pods[i] for i in won.placed])
            state.taken(won)
            left -= len(won.placed)
            self.rounds.append(self.round_record(entries, pass_priority, winner, name))
        return [p for i, p in enumerate(pods) if not done[i]]

    def round_record(
        self,
        entries: list[tuple[_Candidate, CandidateOutcome, str, _Trial | None]],
        pass_priority: int | None,
        winner: _Candidate | None,
        new_node: str | None,
    ) -> Round:
        trials: list[CandidateTrial] = []
        for cand, outcome, reason, t in entries:
            has_pods = t is not None and bool(t.placed)
            trials.append(
                CandidateTrial(
                    node_pool=cand.pool.name,
                    zone=cand.zone,
                    instance_type=cand.pool.instance_type,
                    outcome=outcome,
                    reason=reason,
                    score=t.score_of(self, cand) if t is not None and has_pods else None,
                    pods=t.keys if t is not None else [],
                )
            )
        return Round(
            round=len(self.rounds) + 1,
            pass_priority=pass_priority,
            winner=winner.label if winner is not None else None,
            new_node=new_node,
            candidates=trials,
        )

    def commit(self, cand: _Candidate, pods: list[_Pending]) -> str:
        n = self.added.get(cand.label, 0) + 1
        self.added[cand.label] = n
        name = f"{cand.pool.name}-{cand.zone}-new-{n}"
        while name in self.ledger.nodes:  # a real node already has that name
            name += "x"
        labels = {
            **cand.pool.labels,
            self.pool_label: cand.pool.name,
            ZONE_LABEL: cand.zone,
            HOSTNAME_LABEL: name,
        }
        self.ledger.upsert_node(name, allocatable=cand.pool.allocatable, labels=labels)
        host = _Host(name, labels, cand.pool.taints)
        self.existing_hosts.append(host)
        for cls, names in self.eligible.items():
            if self.admits(cls, cand) is None:
                names.add(name)
        for p in pods:
            # The Ledger re-checks the fit (NoRoom): the trial's arithmetic must agree with
            # the extender's own accounting, or this raises.
            self.ledger.reserve_for_bind(p.info, name, at=0.0)
        self.new_nodes[name] = (cand, [p.key for p in pods])
        self.greedy_pods.extend(pods)
        return name


def _price(pool: _Pool) -> Fraction:
    assert pool.price is not None  # checked before any ranking (recommend)
    return pool.price


def _waste(allocatable: Demand, requested: Demand) -> Fraction:
    waste = Fraction(0)
    if allocatable.cpu_millis:
        waste += Fraction(allocatable.cpu_millis - requested.cpu_millis, allocatable.cpu_millis)
    if allocatable.memory_bytes:
        waste += Fraction(
            allocatable.memory_bytes - requested.memory_bytes, allocatable.memory_bytes
        )
    return waste


def _usable(allocatable: Demand, reserve: SystemReserve) -> Demand:
    # Through NodeState so that the simulated node is exactly what the extender would see.
    return NodeState(
        name="", is_known=True, allocatable=allocatable, reserve=reserve.of(allocatable)
    ).usable


def recommend(snapshot: ClusterSnapshot, *, config: RecommenderConfig) -> Recommendation:
    """Which nodes to add for the snapshot's pending pods. Pure; see the module docstring.

    Raises ``SnapshotError`` (400) for an inconsistent snapshot, or when the ``least-cost``
    scorer is configured and a pool has no price.
    """
    # Phase 1: snapshot.
    model = _compile(snapshot, config)
    if Scorer.LEAST_COST in config.scorers:
        missing = [
            FieldError(
                path=f"$.nodePools[{p.index}].price", message="the least-cost scorer needs it"
            )
            for p in model.pools
            if p.price is None
        ]
        if missing:
            raise SnapshotError(missing)
    ledger = Ledger(reserve=config.reserve)
    for node, _host in model.nodes:
        alloc = Demand(
            cpu_millis(str(node.allocatable.cpu)), memory_bytes(str(node.allocatable.memory))
        )
        ledger.upsert_node(node.name, allocatable=alloc, labels=dict(node.labels))
    for info in model.placed:
        ledger.observe_pod(info, at=0.0)
    candidates: list[_Candidate] = []
    for pool in sorted(model.pools, key=lambda p: p.name):
        for zone in sorted(pool.zones):
            labels = {**pool.labels, snapshot.pool_label: pool.name, ZONE_LABEL: zone}
            candidates.append(
                _Candidate(
                    index=len(candidates),
                    pool=pool,
                    zone=zone,
                    host=_Host("", labels, pool.taints),
                    usable=_usable(pool.allocatable, config.reserve),
                    label=f"{pool.name}/{zone}",
                )
            )
    sim = _Sim(
        model=model,
        config=config,
        ledger=ledger,
        fit=FitIndex(ledger),
        candidates=candidates,
        existing_hosts=[h for n, h in model.nodes if not n.unschedulable],
        pool_label=snapshot.pool_label,
    )

    # Passes: one per priority value when priority classes exist.
    unscheduled: list[_Pending] = []
    invalid: list[_Pending] = [p for p in model.pending if p.info.vm_error is not None]
    valid = [p for p in model.pending if p.info.vm_error is None]
    passes: list[tuple[int | None, list[_Pending]]] = []
    if model.has_priority_classes:
        for p in valid:
            if not passes or passes[-1][0] != p.info.priority:
                passes.append((p.info.priority, []))
            passes[-1][1].append(p)
    elif valid:
        passes.append((None, valid))
    for pass_priority, pods in passes:
        # Phase 2: existing nodes (including those added by earlier passes).
        left = sim.place_on_existing(pods)
        # Phases 3-5.
        unscheduled.extend(sim.run_rounds(left, pass_priority))

    # Phase 6: is there a cheaper plan than greedy's?
    notes: list[str] = []
    greedy_price, plans = _cheaper_plans(sim, notes)

    # Phase 7: recommend.
    groups: dict[str, list[str]] = {}
    for name, (cand, _pods) in sim.new_nodes.items():
        groups.setdefault(cand.label, []).append(name)
    by_label = {c.label: c for c in candidates}
    scale_up = [
        ScaleUp(
            node_pool=by_label[label].pool.name,
            zone=by_label[label].zone,
            instance_type=by_label[label].pool.instance_type,
            increment_by=len(names),
            node_names=names,
        )
        for label, names in sorted(groups.items())
    ]
    left_over = sorted([*invalid, *unscheduled], key=lambda p: p.order)
    explained = [_explain(sim, p) for p in left_over]
    return Recommendation(
        scale_up=scale_up,
        unscheduled_pods=[p.key for p in left_over],
        diagnostics=Diagnostics(
            rounds=sim.rounds,
            placed_on_existing=sim.placed_on_existing,
            new_nodes={name: pods for name, (_c, pods) in sim.new_nodes.items()},
            unscheduled=explained,
            greedy_price=greedy_price,
            cheaper_plans=plans,
            notes=notes,
        ),
    )


def _explain(sim: _Sim, p: _Pending) -> UnscheduledPod:
    if p.info.vm_error is not None:
        return UnscheduledPod(
            pod=p.key,
            uid=p.info.uid,
            priority=p.info.priority,
            reason=UnscheduledReason.INVALID_VM_SPEC,
            message=f"the extender rejects this VM on every node: {p.info.vm_error}",
        )
    per: dict[str, tuple[UnscheduledReason, str]] = {}
    for cand in sim.candidates:
        why = sim.admits(p.cls, cand)
        if why is not None:
            per[cand.label] = (UnscheduledReason.NO_MATCHING_POOL, why)
            continue
        empty = NodeState(
            name=cand.label,
            is_known=True,
            allocatable=cand.pool.allocatable,
            reserve=sim.config.reserve.of(cand.pool.allocatable),
        )
        too_big = rejection(empty, p.demand)
        if too_big is not None:
            per[cand.label] = (UnscheduledReason.TOO_BIG, too_big.reason)
            continue
        block = sim.blocked(cand)
        if block is not None and block[0] is CandidateOutcome.AT_MAX:
            per[cand.label] = (UnscheduledReason.POOL_AT_MAX, block[1])
        elif block is not None:
            per[cand.label] = (UnscheduledReason.POOL_LIMIT, block[1])
        else:  # pragma: no cover - the rounds only stop when no candidate can take it
            per[cand.label] = (UnscheduledReason.POOL_LIMIT, "no candidate was left")
    found = {r for r, _ in per.values()}
    for reason in (
        UnscheduledReason.POOL_AT_MAX,
        UnscheduledReason.POOL_LIMIT,
        UnscheduledReason.TOO_BIG,
    ):
        if reason in found:
            break
    else:
        reason = UnscheduledReason.NO_MATCHING_POOL
    messages = {
        UnscheduledReason.POOL_AT_MAX: "it fits no existing node, and every pool that could"
        " take it is at its maximum node count",
        UnscheduledReason.POOL_LIMIT: "it fits no existing node, and every pool that could take"
        " it would exceed its resource limit",
        UnscheduledReason.TOO_BIG: "it fits no existing node and is bigger than every"
        " template its constraints allow",
        UnscheduledReason.NO_MATCHING_POOL: "it fits no existing node, and no pool's template"
        " matches its node selector, affinity and tolerations"
        if sim.candidates
        else "it fits no existing node, and the snapshot has no node pools",
    }
    return UnscheduledPod(
        pod=p.key,
        uid=p.info.uid,
        priority=p.info.priority,
        reason=reason,
        message=messages[reason],
        pools=_collapse_zones(sim.candidates, per),
    )


def _collapse_zones(
    candidates: Sequence[_Candidate], per: Mapping[str, tuple[UnscheduledReason, str]]
) -> dict[str, str]:
    """One line per pool when its zones agree, else one per pool/zone."""
    out: dict[str, str] = {}
    by_pool: dict[str, list[_Candidate]] = {}
    for c in candidates:
        by_pool.setdefault(c.pool.name, []).append(c)
    for pool, cands in by_pool.items():
        texts = [per[c.label][1] for c in cands]
        if all(t == texts[0] for t in texts):
            out[pool] = texts[0]
        else:
            for c, t in zip(cands, texts, strict=True):
                out[c.label] = t
    return out


# ---------------------------------------------------------------------------------------------
# Phase 6: the cheaper-plan check
# ---------------------------------------------------------------------------------------------


def _cheaper_plans(sim: _Sim, notes: list[str]) -> tuple[float | None, list[CheaperPlan]]:
    if not sim.new_nodes:
        return None, []
    unpriced = sorted({c.pool.name for c, _ in sim.new_nodes.values() if c.pool.price is None})
    if unpriced:
        notes.append(f"cheaper-plan check skipped: pools without a price: {', '.join(unpriced)}")
        return None, []
    greedy = sum((_price(c.pool) for c, _ in sim.new_nodes.values()), Fraction(0))
    plans: list[CheaperPlan] = []
    by_pool: dict[str, list[_Candidate]] = {}
    for c in sim.candidates:
        by_pool.setdefault(c.pool.name, []).append(c)
    for pool_name, cands in by_pool.items():
        pool = cands[0].pool
        if pool.price is None:
            continue
        packed = _pack_on_pool(sim, cands, sim.greedy_pods, price=pool.price, greedy=greedy)
        if packed is None:
            continue
        zones, count, proven = packed
        total = count * pool.price
        # The pool's own bounds apply to the alternative too.
        after = pool.count + count
        if after > pool.max_count:
            continue
        if pool.limit_cpu is not None and after * pool.capacity.cpu_millis > pool.limit_cpu:
            continue
        if pool.limit_memory is not None and after * pool.capacity.memory_bytes > pool.limit_memory:
            continue
        if total < greedy:
            plans.append(
                CheaperPlan(
                    node_pool=pool_name,
                    instance_type=pool.instance_type,
                    node_count=count,
                    zones=zones,
                    total_price=float(total),
                    greedy_price=float(greedy),
                    is_fewest_proven=proven,
                )
            )
    plans.sort(key=lambda p: (p.total_price, p.node_pool))
    return float(greedy), plans


def _pack_on_pool(
    sim: _Sim, cands: list[_Candidate], pods: list[_Pending], *, price: Fraction, greedy: Fraction
) -> tuple[dict[str, int], int, bool] | None:
    """The fewest nodes of one pool holding ``pods``; None if some pod cannot go there, or if
    even the volume bound costs no less than ``greedy`` (then no packing can be cheaper, and
    searching would only burn the budget: most pools end here).

    Zones: all in the first zone that admits every pod, else each pod in its first zone.
    """
    usable = cands[0].usable
    feasible: list[list[str]] = []
    for p in pods:
        if p.demand.cpu_millis > usable.cpu_millis or p.demand.memory_bytes > usable.memory_bytes:
            return None
        zones = [c.zone for c in cands if sim.admits(p.cls, c) is None]
        if not zones:
            return None
        feasible.append(zones)
    common = [c.zone for c in cands if all(c.zone in z for z in feasible)]
    by_zone: dict[str, list[Demand]] = {}
    for p, zones in zip(pods, feasible, strict=True):
        zone = common[0] if common else zones[0]
        by_zone.setdefault(zone, []).append(p.demand)
    bound = sum(_volume_bound(items, usable) for items in by_zone.values())
    if bound * price >= greedy:
        return None
    counts: dict[str, int] = {}
    proven = True
    budget = [sim.config.plan_search_steps]
    for zone in sorted(by_zone):
        n, ok = _fewest_bins(by_zone[zone], usable, budget)
        counts[zone] = n
        proven = proven and ok
    return counts, sum(counts.values()), proven


def _fewest_bins(items: list[Demand], cap: Demand, budget: list[int]) -> tuple[int, bool]:
    """Two-dimensional bin packing: first-fit decreasing, then a depth-first search for fewer
    bins down to the volume bound, within ``budget`` steps (shared, decremented)."""
    order = sorted(items, key=lambda d: (d.cpu_millis, d.memory_bytes), reverse=True)
    bins: list[list[int]] = []
    for d in order:
        for b in bins:
            if d.cpu_millis <= b[0] and d.memory_bytes <= b[1]:
                b[0] -= d.cpu_millis
                b[1] -= d.memory_bytes
                break
        else:
            bins.append([cap.cpu_millis - d.cpu_millis, cap.memory_bytes - d.memory_bytes])
    best = len(bins)
    lower = _volume_bound(order, cap)
    proven = True
    for k in range(lower, best):
        found, exhausted = _fits_in(order, cap, k, budget)
        if exhausted:
            proven = False
            break
        if found:
            return k, True
    return best, proven


def _volume_bound(items: Sequence[Demand], cap: Demand) -> int:
    """No packing uses fewer bins than the total size over one bin's size, per resource."""
    total_cpu = sum(d.cpu_millis for d in items)
    total_mem = sum(d.memory_bytes for d in items)
    return max(
        -(-total_cpu // cap.cpu_millis) if cap.cpu_millis else 0,
        -(-total_mem // cap.memory_bytes) if cap.memory_bytes else 0,
        1 if items else 0,
    )


def _fits_in(order: list[Demand], cap: Demand, k: int, budget: list[int]) -> tuple[bool, bool]:
    free = [[cap.cpu_millis, cap.memory_bytes] for _ in range(k)]

    def place(i: int) -> bool | None:
        if i == len(order):
            return True
        d = order[i]
        tried_empty = False
        for b in free:
            if d.cpu_millis > b[0] or d.memory_bytes > b[1]:
                continue
            is_empty = b[0] == cap.cpu_millis and b[1] == cap.memory_bytes
            if is_empty:
                if tried_empty:  # empty bins are interchangeable
                    continue
                tried_empty = True
            budget[0] -= 1
            if budget[0] < 0:
                return None
            b[0] -= d.cpu_millis
            b[1] -= d.memory_bytes
            result = place(i + 1)
            b[0] += d.cpu_millis
            b[1] += d.memory_bytes
            if result is None or result:
                return result
        return False

    result = place(0)
    return bool(result), result is None


# ---------------------------------------------------------------------------------------------
# Live mode
# ---------------------------------------------------------------------------------------------


def snapshot_from_ledger(
    ledger: Ledger,
    pending: Sequence[PodInfo],
    pools: Sequence[NodePool],
    *,
    pod_specs: Mapping[str, kube.PodSpec] | None = None,
    node_taints: Mapping[str, Sequence[kube.Taint]] | None = None,
    unschedulable_nodes: Collection[str] = (),
    priority_classes: Sequence[PriorityClass] = (),
    pool_label: str = POOL_LABEL,
) -> ClusterSnapshot:
    """A snapshot of the live ledger, for ``recommend``. Reads the ledger, never changes it.

    The ledger knows sizes but not scheduling constraints, so the shell passes them:
    ``pod_specs`` by pending pod uid (nodeSelector, affinity, tolerations, priorityClassName)
    and ``node_taints`` by node name. Placed pods are written at what they *hold* (a VM at its
    permitted size); pending pods at ``initial_demand()``, so VM annotations need not travel.
    Nodes the ledger knows only from pods (no Node object yet) are left out with their pods:
    nothing new can be placed there anyway. Pending pods with unusable VM annotations are left
    out too: the extender rejects them everywhere and no node would change that.

    Raises ``SnapshotError`` when the result is inconsistent (say, an affinity operator this
    model does not support).
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
            )
        )
    for info in pending:
        if info.vm_error is not None or info.uid in ledger.pods:
            continue
        spec = specs.get(info.uid, kube.PodSpec())
        demand = info.initial_demand()
        affinity: Affinity | None = None
        if spec.affinity is not None:
            affinity = msgspec.convert(msgspec.to_builtins(spec.affinity), Affinity)
        pods.append(
            SnapshotPod(
                namespace=info.namespace,
                name=info.name,
                uid=info.uid,
                requests=Resources(cpu=f"{demand.cpu_millis}m", memory=demand.memory_bytes),
                priority=info.priority,
                priority_class_name=spec.priority_class_name,
                creation_timestamp=_parse_created(info.created),
                node_selector=dict(spec.node_selector or {}),
                affinity=affinity,
                tolerations=[
                    msgspec.convert(msgspec.to_builtins(t), Toleration)
                    for t in spec.tolerations or ()
                ],
            )
        )
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
