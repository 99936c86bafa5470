"""Phase 4 of the recommender: rank the candidates (node pool x zone) with the scorer chain.

Pure: no I/O, no clock, no randomness. Ranking is exact, so float rounding never decides a tie;
ties fall through the chain, then to pool and zone names. What humans see (``Score``) is the
same values as floats. Each value is built as one ``Fraction(n, d)`` (a single gcd) rather than
a sum of Fractions: the value is identical, the cost a fraction.

Rank keys hold integers, not the Fractions: each link's value times one common denominator of
that link over all pools (``Ranking``). Multiplying every value of a link by the same positive
integer keeps their order and their ties, and then comparing two keys is a comparison of ints
instead of Python-level Fraction arithmetic; a round compares every candidate's key.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from scheduler_extender.podinfo import Demand
from scheduler_extender.recommend_config import RecommenderConfig, Scorer
from scheduler_extender.recommendation import Score
from scheduler_extender.snapshot_model import Pool

__all__ = ["ChainValues", "Ranking", "price_of", "units", "waste"]

# Smaller is better: the chain's links in order, as exact integers (see ``Ranking``). Names
# break what ties are left: the candidates' own order (pool name, then zone name).
ChainValues = tuple[int, ...]


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


def _waste_denominator(allocatable: Demand) -> int:
    """A multiple of the denominator of every ``waste(allocatable, ...)``."""
    ac, am = allocatable.cpu_millis, allocatable.memory_bytes
    return (ac or 1) * (am or 1)


def _cost_denominator(config: RecommenderConfig, pool: Pool) -> int:
    """A multiple of the denominator of every ``units(...) / price_of(pool)``."""
    return config.memory_bytes_per_cpu * price_of(pool).numerator


class Ranking:
    """The scorer chain over one snapshot's pools: exact integer keys, the scores humans see,
    and the sentence a losing candidate gets. Values are memoised per (pool, requested, pods):
    a recommendation meets only a few hundred distinct ones, and each costs Fractions."""

    def __init__(self, config: RecommenderConfig, pools: Sequence[Pool]) -> None:
        self.config = config
        chain = config.scorers
        self.scales: list[int] = []
        for s in chain:
            if s is Scorer.LEAST_COST:
                self.scales.append(math.lcm(*(_cost_denominator(config, p) for p in pools)))
            elif s is Scorer.LEAST_WASTE:
                self.scales.append(math.lcm(*(_waste_denominator(p.allocatable) for p in pools)))
            else:
                self.scales.append(1)
        # What each position of a key ranks on, then the names' two positions.
        self.links = [*(s.value for s in chain), "pool name", "zone name"]
        self.pool_link = len(chain)
        self.zone_link = len(chain) + 1
        # (pool index, cpu millis, memory bytes, pods) -> ``values``: callers may look here
        # first (the rounds do, for each candidate whose trial changed).
        self.memo: dict[tuple[int, int, int, int], tuple[ChainValues, Score]] = {}

    def values(
        self, pool: Pool, cpu_millis: int, memory_bytes: int, pods: int
    ) -> tuple[ChainValues, Score]:
        """The chain's key for one new node of ``pool`` holding ``pods`` pods that request
        ``cpu_millis`` and ``memory_bytes``, and its score as shown."""
        memo = (pool.index, cpu_millis, memory_bytes, pods)
        found = self.memo.get(memo)
        if found is None:
            requested = Demand(cpu_millis, memory_bytes)
            found = self.memo[memo] = (
                self._key(pool, requested, pods),
                self._score(pool, requested, pods),
            )
        return found

    def _key(self, pool: Pool, requested: Demand, pods: int) -> ChainValues:
        config = self.config
        key: list[int] = []
        for s, scale in zip(config.scorers, self.scales, strict=True):
            if s is Scorer.PRIORITY:
                key.append(-pool.priority)
            elif s is Scorer.LEAST_COST:
                value = -units(config, requested) / price_of(pool)
                key.append(value.numerator * (scale // value.denominator))
            elif s is Scorer.LEAST_WASTE:
                value = waste(pool.allocatable, requested)
                key.append(value.numerator * (scale // value.denominator))
            else:
                key.append(-pods)
        return tuple(key)

    def _score(self, pool: Pool, requested: Demand, pods: int) -> Score:
        config = self.config
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
