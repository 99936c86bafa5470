"""The recommender's settings: the scorer chain and the rules it shares with the extender.

Pure: declarations only. The extender's ``recommender:`` config section builds one of these.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from scheduler_extender.core.ledger import SystemReserve

__all__ = ["DEFAULT_SCHEDULER_NAME", "DiagnosticsLevel", "RecommenderConfig", "Scorer"]

DEFAULT_SCHEDULER_NAME = "vm-scheduler"


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


class DiagnosticsLevel(enum.StrEnum):
    """How much of the greedy rounds the answer records (``diagnostics.rounds``).

    Only the rounds differ: ``scaleUp``, ``unscheduledPods`` and every other diagnostic are the
    same bytes at both levels.
    """

    # Every round lists every candidate (pool x zone) with its outcome, the reason, its score
    # and the pods it would place: the whole trace, nearly all of a full answer's bytes.
    FULL = "full"
    # Every round is one line, its number, pass priority, winner and new node (the winner's
    # order and the passes, which ``newNodes`` alone does not show), without ``candidates``.
    # The candidates' records are then never built, which is the point: auto-publish and
    # any caller that only acts on the scale-up skip that work, not just its encoding.
    SUMMARY = "summary"


class RecommenderConfig(msgspec.Struct, frozen=True, kw_only=True):
    scorers: tuple[Scorer, ...] = (Scorer.PRIORITY, Scorer.LEAST_WASTE, Scorer.MOST_PODS)
    # Whose VM pods reserve their VM size (the extender's own scheduler name).
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    # The extender keeps this share of every node back; the simulation must too, or it would
    # place pods the extender then refuses.
    reserve: SystemReserve = msgspec.field(default_factory=SystemReserve)
    # least-cost's exchange rate between memory and CPU: this many bytes count as one vCPU
    # (1000 units). Exact: units are Fractions of millicores.
    memory_bytes_per_cpu: Annotated[int, msgspec.Meta(gt=0)] = 4 * 2**30
    # Step budget of phase 6's search for the cheapest plan (one step per open node or
    # candidate tried): beyond it the best plan found so far stands (greedy's at worst),
    # flagged ``isOptimal: false`` with a lower bound. Steps, not seconds: the answer must
    # not depend on the machine's speed.
    plan_search_steps: Annotated[int, msgspec.Meta(ge=0)] = 50_000
    # Plan for growth: above 0, the scale-up sizes every VM at its current size plus this
    # share of its room to grow to its top size, pending VMs and running ones alike; running
    # VMs whose node cannot give them that are planned to move (``growth.plan_growth``).
    # 0 (the default): pending pods at their current size only.
    growth_headroom: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    # What ``diagnostics.rounds`` records: one line per round unless the full trace is asked
    # for (it reached 1 MB for 1,000 pending pods, 17 MB for 10,000).
    diagnostics: DiagnosticsLevel = DiagnosticsLevel.SUMMARY
