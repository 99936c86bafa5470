"""The recommender's answer: ``Recommendation`` and its diagnostics, and their JSON encoding.

Pure: no I/O, no clock. camelCase on the wire; every list and map has a deterministic order, so
equal recommendations encode to equal bytes (the golden test in ``tests/recommender`` pins them).
``runTimeMillis`` is the caller's measurement, passed in: a clock here would make runs differ.

The answer::

    {"scaleUp": [{"nodePool", "zone", "instanceType", "incrementBy", "nodeNames"}],
     "unscheduledPods": ["ns/name", ...],
     "runTimeMillis": N,                       # when the caller measured it
     "diagnostics": {
       "rounds": [{"round", "passPriority", "winner", "newNode",
                   "candidates": [{"nodePool", "zone", "instanceType", "outcome", "reason",
                                   "score", "pods"}]}],
       "placedOnExisting": [{"pod", "node"}],
       "newNodes": {"node name": ["ns/name", ...]},
       "unscheduled": [{"pod", "uid", "priority", "reason", "message", "pools"}],
       "cost": {"greedyPrice", "price", "greedyExtraCost", "lowerBound", "isOptimal",
                "searchSteps", "greedyScaleUp": [{"nodePool", "zone", "incrementBy"}]},
       "notes": [...]}}

``RecommenderConfig.diagnostics`` (``DiagnosticsLevel``) says how much of the rounds is kept:
``summary`` (the default) keeps one line per round without ``candidates`` and never builds
them; ``full`` lists every candidate of every round. Everything else is the same bytes at both
levels. Keys whose value is empty or None are left out.
"""

from __future__ import annotations

import enum
from typing import Final

import msgspec

__all__ = [
    "CandidateOutcome",
    "CandidateTrial",
    "Diagnostics",
    "ExistingPlacement",
    "GrowthMove",
    "PlanCost",
    "PlanNodes",
    "Recommendation",
    "Round",
    "ScaleUp",
    "Score",
    "UnscheduledPod",
    "UnscheduledReason",
    "encode_recommendation",
]


class _Out(msgspec.Struct, rename="camel", kw_only=True, frozen=True, omit_defaults=True, gc=False):
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
    """One greedy round. ``winner`` and ``new_node`` are None for a pass's last round when no
    candidate placed anything (then pods are left unscheduled)."""

    round: int
    # The priority value this pass places (None: a single pass, no priority classes).
    pass_priority: int | None = None
    winner: str | None = None
    new_node: str | None = None
    # Every candidate, in (pool, zone) order, at ``DiagnosticsLevel.FULL``; never empty then
    # (a round is recorded only when there are candidates). Empty, and so left out of the
    # JSON, at ``SUMMARY``: the records were not built.
    candidates: list[CandidateTrial] = []


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


class PlanNodes(_Out, frozen=True, kw_only=True):
    node_pool: str
    zone: str
    increment_by: int


class PlanCost(_Out, frozen=True, kw_only=True):
    """Phase 6: what the new nodes cost, per hour, in the pools' ``price`` currency. Present
    when greedy added nodes and every pool it used has a price."""

    # Greedy's new nodes (the rounds' winners), summed.
    greedy_price: float
    # The recommended plan (``scaleUp``): greedy's, or a cheaper one that places the same pods.
    price: float
    # greedy_price - price: what following the rounds alone would have cost on top (0 when
    # greedy's plan is recommended).
    greedy_extra_cost: float
    # No plan placing these pods costs less. Equal to ``price`` when ``is_optimal``; otherwise
    # ``price - lower_bound`` is how far from optimal the plan may be.
    lower_bound: float
    # The search finished within its step budget: no cheaper plan exists.
    is_optimal: bool
    # Steps the search took (``RecommenderConfig.plan_search_steps`` is the budget).
    search_steps: int
    # Greedy's plan, when it is not the one recommended.
    greedy_scale_up: list[PlanNodes] = []


class GrowthMove(_Out, frozen=True, kw_only=True):
    """Plan for growth: a running VM that would have to move so that the VMs on its node keep
    their room to grow, and where the plan puts it (absent: nowhere, no pool can take it)."""

    pod: str
    node: str
    cpu_millis: int  # its size with the headroom
    memory_bytes: int
    to_node: str | None = None


class Diagnostics(_Out, frozen=True, kw_only=True):
    rounds: list[Round] = []
    placed_on_existing: list[ExistingPlacement] = []
    new_nodes: dict[str, list[str]] = {}
    unscheduled: list[UnscheduledPod] = []
    cost: PlanCost | None = None
    growth: list[GrowthMove] = []
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
