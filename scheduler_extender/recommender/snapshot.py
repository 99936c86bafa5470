"""The ``ClusterSnapshot`` wire types: what the scale-up recommender is asked about.

Pure: no I/O, no clock. Decoding only: msgspec checks types and shapes (the first error, with its
``$.path``); the cross-field checks (duplicate names, unknown pools, bad quantities) belong to
``model``, which compiles a snapshot into the simulation's model. ``scheduler_extender/
state.py`` is the unrelated ``/state`` dump.

Snapshots are versioned input, so unknown fields are errors, not silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Final, Literal

import msgspec
import yaml

from protocol.bounds import Count, Int32, Int64, NumericQuantity
from protocol.strict_yaml import describe_yaml_error, load_strict

__all__ = [
    "API_VERSION",
    "HOSTNAME_LABEL",
    "KIND",
    "MAX_PRICE",
    "MIN_PRICE",
    "POOL_LABEL",
    "ZONE_LABEL",
    "Affinity",
    "Capacity",
    "ClusterSnapshot",
    "FieldError",
    "LabelSelector",
    "NodeAffinity",
    "NodePool",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "NodeTemplate",
    "PodDisruptionBudget",
    "PoolLimits",
    "PriorityClass",
    "Quantity",
    "Resources",
    "SnapshotError",
    "SnapshotFormat",
    "SnapshotNode",
    "SnapshotPod",
    "Taint",
    "TaintEffect",
    "Toleration",
    "decode_snapshot",
]


API_VERSION: Final = "vm-autoscaling.io/v1alpha1"
KIND: Final = "ClusterSnapshot"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
POOL_LABEL: Final = "vm-autoscaling.io/node-pool"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
# A pool's price range (per node and hour). Quantities stop at 2**63, so units / price and
# price x node count stay far below a float's 1.8e308 for any price in it.
MIN_PRICE: Final = 1e-9
MAX_PRICE: Final = 1e12

# ---------------------------------------------------------------------------------------------
# The ClusterSnapshot wire types (input). camelCase, strict: a typo is an error, not a default.
# ---------------------------------------------------------------------------------------------

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
# Kubernetes accepts numbers for quantities too (``cpu: 2`` in YAML); they are read as text.
Quantity = str | NumericQuantity
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class _Wire(
    msgspec.Struct,
    rename="camel",
    kw_only=True,
    frozen=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
    gc=False,
):
    """Base of the snapshot types.

    Not tracked by the garbage collector (``gc=False``): a snapshot is tens of thousands of
    these, frozen, holding only strings, numbers, lists and dicts of them, so they cannot form
    a cycle. Tracked, every collection while a snapshot is alive walks all of them: decoding
    the benchmark's snapshot (``scripts/bench_recommender.py``) was measurably slower, and
    the extender serves filter calls on the same event loop."""


class Resources(_Wire, frozen=True, kw_only=True):
    """A pod's *effective* requests: what ``podinfo.pod_requests`` counts (containers, sidecars,
    init containers, pod-level requests, an in-place resize's status, overhead). Absent means
    zero."""

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
    toleration_seconds: Int64 | None = None


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
    priority: Int32 | None = None
    priority_class_name: str | None = None
    creation_timestamp: Annotated[datetime, msgspec.Meta(tz=True)] | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    node_selector: dict[str, str] = {}
    affinity: Affinity | None = None
    tolerations: list[Toleration] = []


class PriorityClass(_Wire, frozen=True, kw_only=True):
    name: NonEmpty
    value: Int32
    global_default: bool = False


class LabelSelector(_Wire, frozen=True, kw_only=True):
    # matchLabels only: PodDisruptionBudgets written with matchExpressions are refused rather
    # than matched wrongly.
    match_labels: dict[str, str] = {}


class PodDisruptionBudget(_Wire, frozen=True, kw_only=True):
    """Read by the scale-down check only. Whole numbers (percentages are not supported); one
    of ``minAvailable`` and ``maxUnavailable``. The pods it covers are the placed pods of its
    namespace matching ``selector``, all counted as healthy."""

    namespace: NonEmpty
    name: NonEmpty
    selector: LabelSelector
    min_available: Count | None = None
    max_unavailable: Count | None = None


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
    # Per node and hour, in any currency as long as it is the same for every pool. Bounded so
    # that every figure the answer shows (least-cost scores, plan prices) is a finite float:
    # a price of 5e-324 made a least-cost score overflow, one near 1e308 the sum of two nodes.
    price: Annotated[float, msgspec.Meta(ge=MIN_PRICE, le=MAX_PRICE)] | None = None
    # Higher wins under the ``priority`` scorer.
    priority: Int32 = 0


class ClusterSnapshot(_Wire, frozen=True, kw_only=True):
    api_version: Literal["vm-autoscaling.io/v1alpha1"]
    kind: Literal["ClusterSnapshot"]
    # The node label naming a node's pool (clouds each have their own).
    pool_label: NonEmpty = POOL_LABEL
    nodes: list[SnapshotNode] = []
    pods: list[SnapshotPod] = []
    priority_classes: list[PriorityClass] = []
    node_pools: list[NodePool] = []
    pod_disruption_budgets: list[PodDisruptionBudget] = []


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


_JSON_DECODER: Final = msgspec.json.Decoder(ClusterSnapshot)

SnapshotFormat = Literal["json", "yaml"]


def decode_snapshot(data: bytes, *, fmt: SnapshotFormat = "json") -> ClusterSnapshot:
    """Decode (types and shapes only); raise ``SnapshotError`` (400) naming the bad path."""
    try:
        if fmt == "json":
            return _JSON_DECODER.decode(data)
        raw = load_strict(data)  # duplicate keys refused: two maxCount lines are a mistake
        return msgspec.convert(raw, ClusterSnapshot)
    except msgspec.ValidationError as e:
        raise _from_msgspec(e) from e
    except msgspec.DecodeError as e:
        raise SnapshotError([FieldError(path="$", message=f"malformed JSON: {e}")]) from e
    except yaml.YAMLError as e:
        raise SnapshotError(
            [FieldError(path="$", message=f"malformed YAML: {describe_yaml_error(e)}")]
        ) from e
