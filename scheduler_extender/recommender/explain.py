"""Phase 7 of the recommender, for humans: why each pod left unscheduled is left.

Pure: no I/O, no clock. Read-only over the finished ``Simulation``: for every candidate (pool x
zone), the first of these that applies: its constraints exclude the pod, the pod is bigger than
the template, the pool is at its maximum node count or its resource limit. The pod's reason is
the most actionable one any candidate gave.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler_extender.core.ledger import NodeState
from scheduler_extender.core.placement import rejection
from scheduler_extender.recommender.model import Candidate, Pending
from scheduler_extender.recommender.recommendation import (
    CandidateOutcome,
    UnscheduledPod,
    UnscheduledReason,
)
from scheduler_extender.recommender.sim import Simulation

__all__ = ["explain"]


def explain(sim: Simulation, p: Pending) -> UnscheduledPod:
    """Why ``p`` was left unscheduled, overall and per pool."""
    if p.vm_error is not None:
        return UnscheduledPod(
            pod=p.key,
            uid=p.uid,
            priority=p.priority,
            reason=UnscheduledReason.INVALID_VM_SPEC,
            message=f"the extender rejects this VM on every node: {p.vm_error}",
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
        uid=p.uid,
        priority=p.priority,
        reason=reason,
        message=messages[reason],
        pools=_collapse_zones(sim.candidates, per),
    )


def _collapse_zones(
    candidates: Sequence[Candidate], per: Mapping[str, tuple[UnscheduledReason, str]]
) -> dict[str, str]:
    """One line per pool when its zones agree, else one per pool/zone."""
    out: dict[str, str] = {}
    by_pool: dict[str, list[Candidate]] = {}
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
