"""The scale-up recommender: which nodes to add so that pending pods can run.

Decides, for a ``ClusterSnapshot`` (a file, or the extender's own ledger in live mode), which
node pool x zone to add and how many, and why every pod left is left. Pure, like ``core`` and
``admission``: no I/O, no clock, no randomness; it may import ``protocol`` and
``scheduler_extender.core``, nothing of the shell. ``phases`` describes the design.

Callers (the extender's ``/v1/recommend``, the simulator, ``scheduler-extender recommend``)
import from here; the names below are the public surface.
"""

from __future__ import annotations

from scheduler_extender.recommender.config import DiagnosticsLevel, RecommenderConfig, Scorer
from scheduler_extender.recommender.live import snapshot_from_ledger
from scheduler_extender.recommender.model import (
    PreparedSnapshot,
    load_snapshot,
    prepare_snapshot,
    validate_snapshot,
)
from scheduler_extender.recommender.phases import recommend
from scheduler_extender.recommender.recommendation import (
    CandidateOutcome,
    CandidateTrial,
    Diagnostics,
    ExistingPlacement,
    PlanCost,
    PlanNodes,
    Recommendation,
    Round,
    ScaleUp,
    UnscheduledPod,
    UnscheduledReason,
    encode_recommendation,
)
from scheduler_extender.recommender.snapshot import (
    API_VERSION,
    KIND,
    POOL_LABEL,
    ZONE_LABEL,
    Affinity,
    Capacity,
    ClusterSnapshot,
    FieldError,
    NodeAffinity,
    NodePool,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    NodeTemplate,
    PoolLimits,
    PriorityClass,
    Resources,
    SnapshotError,
    SnapshotNode,
    SnapshotPod,
    Taint,
    Toleration,
    decode_snapshot,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "POOL_LABEL",
    "ZONE_LABEL",
    "Affinity",
    "CandidateOutcome",
    "CandidateTrial",
    "Capacity",
    "ClusterSnapshot",
    "Diagnostics",
    "DiagnosticsLevel",
    "ExistingPlacement",
    "FieldError",
    "NodeAffinity",
    "NodePool",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "NodeTemplate",
    "PlanCost",
    "PlanNodes",
    "PoolLimits",
    "PreparedSnapshot",
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
    "decode_snapshot",
    "encode_recommendation",
    "load_snapshot",
    "prepare_snapshot",
    "recommend",
    "snapshot_from_ledger",
    "validate_snapshot",
]
