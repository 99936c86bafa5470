"""Phase 4 of the recommender: rank the candidates (node pool x zone) with the scorer chain.

Pure: no I/O, no clock, no randomness. Ranking compares exact ``Fraction``s, so float rounding
never decides a tie; ties fall through the chain, then to pool and zone names. What humans see
(``Score``) is the same values as floats. Each value is built as one ``Fraction(n, d)`` (a
single gcd) rather than a sum of Fractions: the value is identical, the cost a fraction.
"""

from __future__ import annotations

from fractions import Fraction

from scheduler_extender.podinfo import Demand
from scheduler_extender.recommend_config import RecommenderConfig, Scorer
from scheduler_extender.recommendation import Score
from scheduler_extender.snapshot_model import Pool

__all__ = ["RankKey", "lost_reason", "price_of", "rank_key", "score", "units", "waste"]

# Smaller is better: the chain's values in order, then pool name and zone name.
RankKey = tuple[object, ...]


def price_of(pool: Pool) -> Fraction:
    assert pool.price is not None  # checked before any ranking (recommend)
    return pool.price


def units(config: RecommenderConfig, d: Demand) -> Fraction:
    """Resource units: millicores plus memory at ``memory_bytes_per_cpu`` bytes a vCPU."""
    per_cpu = config.memory_bytes_per_cpu
    return Fraction(d.cpu_millis * per_cpu + d.memory_bytes * 1000, per_cpu)


def waste(allocatable: Demand, requested: Demand) -> Fraction:
    """cluster-autoscaler's least-waste: sum over cpu and memory of the unused share."""
    ac, am = allocatable.cpu_millis, allocatable.memory_bytes
    if ac and am:
        return Fraction(
            (ac - requested.cpu_millis) * am + (am - requested.memory_bytes) * ac, ac * am
        )
    if ac:
        return Fraction(ac - requested.cpu_millis, ac)
    if am:
        return Fraction(am - requested.memory_bytes, am)
    return Fraction(0)


def rank_key(
    config: RecommenderConfig, pool: Pool, zone: str, requested: Demand, pods: int
) -> RankKey:
    key: list[object] = []
    for s in config.scorers:
        if s is Scorer.PRIORITY:
            key.append(-pool.priority)
        elif s is Scorer.LEAST_COST:
            key.append(-units(config, requested) / price_of(pool))
        elif s is Scorer.LEAST_WASTE:
            key.append(waste(pool.allocatable, requested))
        else:
            key.append(-pods)
    key.extend((pool.name, zone))
    return tuple(key)


def score(config: RecommenderConfig, pool: Pool, requested: Demand, pods: int) -> Score:
    chain = config.scorers
    return Score(
        priority=pool.priority if Scorer.PRIORITY in chain else None,
        least_cost=float(units(config, requested) / price_of(pool))
        if Scorer.LEAST_COST in chain
        else None,
        least_waste=float(waste(pool.allocatable, requested))
        if Scorer.LEAST_WASTE in chain
        else None,
        most_pods=pods if Scorer.MOST_PODS in chain else None,
    )


def lost_reason(config: RecommenderConfig, key: RankKey, best: RankKey, winner: str) -> str:
    links = [*(s.value for s in config.scorers), "pool name", "zone name"]
    for link, mine, theirs in zip(links, key, best, strict=True):
        if mine != theirs:
            return f"{winner} ranks higher on {link}"
    return f"{winner} ranks higher"  # pragma: no cover - keys are unique by name
