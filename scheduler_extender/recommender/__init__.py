"""The recommender: which nodes to add so that pending pods can run, and which could go.

Decides, for a ``ClusterSnapshot`` (a file, or the extender's own ledger in live mode), which
node pool x zone to add and how many, and why every pod left is left. Pure, like ``core`` and
``admission``: no I/O, no clock, no randomness; it may import ``protocol`` and
``scheduler_extender.core``, nothing of the shell. ``phases`` describes the design;
``scale_down`` the check of which existing nodes could be removed.

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
    GrowthMove,
    PlanCost,
    PlanNodes,
    Recommendation,
    Round,
    ScaleUp,
    UnscheduledPod,
    UnscheduledReason,
    encode_recommendation,
)
from scheduler_extender.recommender.scale_down import (
    KeepReason,
    KeptNode,
    Move,
    RemovableNode,
    ScaleDown,
    ScaleDownConfig,
    encode_scale_down,
    recommend_scale_down,
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
    LabelSelector,
    NodeAffinity,
    NodePool,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    NodeTemplate,
    PodDisruptionBudget,
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
    "GrowthMove",
    "KeepReason",
    "KeptNode",
    "LabelSelector",
    "Move",
    "NodeAffinity",
    "NodePool",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "NodeTemplate",
    "PlanCost",
    "PlanNodes",
    "PodDisruptionBudget",
    "PoolLimits",
    "PreparedSnapshot",
    "PriorityClass",
    "Recommendation",
    "RecommenderConfig",
    "RemovableNode",
    "Resources",
    "Round",
    "ScaleDown",
    "ScaleDownConfig",
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
    "encode_scale_down",
    "load_snapshot",
    "prepare_snapshot",
    "recommend",
    "recommend_scale_down",
    "snapshot_from_ledger",
    "validate_snapshot",
]
