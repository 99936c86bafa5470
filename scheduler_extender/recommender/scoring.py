"""Phase 4 of the recommender: rank the candidates (node pool x zone) with the scorer chain.

Pure: no I/O, no clock, no randomness. Ranking is exact, so float rounding never decides a tie;
ties fall through the chain, then to pool and zone names. What humans see (``Score``) is the
same values as floats.

Each link's value is a ratio of integers (``cost_ratio``, ``waste_ratio``) whose denominator
depends on the pool only. A rank key holds, per link, the numerator times (the link's common
denominator over all pools / the pool's own): the value times one positive integer shared by
every candidate, so keys keep the values' order and ties exactly, and comparing two keys is a
comparison of ints, with no Fraction arithmetic (a round compares every candidate's key). The
floats shown are ``numerator / denominator``: int division is correctly rounded, so they are
the exact values' nearest floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Final

from scheduler_extender.core.podinfo import Demand
from scheduler_extender.recommender.config import DiagnosticsLevel, RecommenderConfig, Scorer
from scheduler_extender.recommender.model import Pool
from scheduler_extender.recommender.recommendation import Score

__all__ = ["ChainValues", "Ranking", "cost_ratio", "price_of", "waste_ratio"]

# Smaller is better: the chain's links in order, as exact integers (see ``Ranking``). Names
# break what ties are left: the candidates' own order (pool name, then zone name).
ChainValues = tuple[int, ...]


def price_of(pool: Pool) -> Fraction:
    assert pool.price is not None  # checked before any ranking (recommend)
    return pool.price


def cost_ratio(config: RecommenderConfig, pool: Pool, d: Demand) -> tuple[int, int]:
    """least-cost's ``units(config, d) / price_of(pool)`` as (numerator, denominator), not
    reduced; the denominator depends on the pool only."""
    price = price_of(pool)
    per_cpu = config.memory_bytes_per_cpu
    return (
        (d.cpu_millis * per_cpu + d.memory_bytes * 1000) * price.denominator,
        per_cpu * price.numerator,
    )


def waste_ratio(allocatable: Demand, requested: Demand) -> tuple[int, int]:
    """cluster-autoscaler's least-waste, the sum over cpu and memory of the unused share, as
    (numerator, denominator), not reduced; the denominator depends on ``allocatable`` only."""
    ac, am = allocatable.cpu_millis, allocatable.memory_bytes
    if ac and am:
        return (ac - requested.cpu_millis) * am + (am - requested.memory_bytes) * ac, ac * am
    if ac:
        return ac - requested.cpu_millis, ac
    if am:
        return am - requested.memory_bytes, am
    return 0, 1


class Ranking:
    """The scorer chain over one snapshot's pools: exact integer keys, the scores humans see,
    and the sentence a losing candidate gets. Values are memoised per (pool, requested, pods):
    a recommendation meets only a few hundred distinct ones, and each costs Fractions."""

    def __init__(self, config: RecommenderConfig, pools: Sequence[Pool]) -> None:
        self.config = config
        chain = config.scorers
        # Per link, per pool: what that pool's values of the link are multiplied by (the
        # link's common denominator over the pool's own); 1 for the links that are ints.
        self.scales: list[list[int]] = []
        for s in chain:
            if s is Scorer.LEAST_COST:
                dens = [cost_ratio(config, p, _ZERO)[1] for p in pools]
            elif s is Scorer.LEAST_WASTE:
                dens = [waste_ratio(p.allocatable, _ZERO)[1] for p in pools]
            else:
                dens = [1] * len(pools)
            common = math.lcm(*dens)
            self.scales.append([common // d for d in dens])
        # What each position of a key ranks on, then the names' two positions.
        self.links = [*(s.value for s in chain), "pool name", "zone name"]
        self.pool_link = len(chain)
        self.zone_link = len(chain) + 1
        # (pool index, cpu millis, memory bytes, pods) -> ``values``: callers may look here
        # first (the rounds do, for each candidate whose trial changed).
        self.memo: dict[tuple[int, int, int, int], tuple[ChainValues, Score]] = {}
        # Scores are shown only in the candidates' records of ``DiagnosticsLevel.FULL``; at
        # SUMMARY nothing reads them, and building them cost as much as the keys.
        self._is_shown = config.diagnostics is DiagnosticsLevel.FULL
        # How many leading links ``bound`` gives exactly (a pool's priority does not depend on
        # what its node holds).
        self.exact_links = 0
        while self.exact_links < len(chain) and chain[self.exact_links] is Scorer.PRIORITY:
            self.exact_links += 1

    def values(
        self, pool: Pool, cpu_millis: int, memory_bytes: int, pods: int
    ) -> tuple[ChainValues, Score]:
        """The chain's key for one new node of ``pool`` holding ``pods`` pods that request
        ``cpu_millis`` and ``memory_bytes``, and its score as shown (an empty one at SUMMARY)."""
        memo = (pool.index, cpu_millis, memory_bytes, pods)
        found = self.memo.get(memo)
        if found is None:
            requested = Demand(cpu_millis, memory_bytes)
            found = self.memo[memo] = (
                self._key(pool, requested, pods),
                self._score(pool, requested, pods) if self._is_shown else _UNSHOWN,
            )
        return found

    def bound(self, pool: Pool, room: Demand, pods: int) -> ChainValues:
        """A key that ranks no later than any key of a new ``pool`` node whose room is
        ``room``, holding at most ``pods`` pods: its key when full, with all of them. Every
        link is non-increasing in the requested cpu and memory and in the pods, and each
        link's bound holds, so the whole key's does (lexicographically)."""
        return self._key(pool, room, pods)

    def _key(self, pool: Pool, requested: Demand, pods: int) -> ChainValues:
        config = self.config
        key: list[int] = []
        for s, scales in zip(config.scorers, self.scales, strict=True):
            if s is Scorer.PRIORITY:
                key.append(-pool.priority)
            elif s is Scorer.LEAST_COST:  # more units per price wins
                key.append(-cost_ratio(config, pool, requested)[0] * scales[pool.index])
            elif s is Scorer.LEAST_WASTE:
                key.append(waste_ratio(pool.allocatable, requested)[0] * scales[pool.index])
            else:
                key.append(-pods)
        return tuple(key)

    def _score(self, pool: Pool, requested: Demand, pods: int) -> Score:
        config = self.config
        chain = config.scorers
        return Score(
            priority=pool.priority if Scorer.PRIORITY in chain else None,
            # int / int is correctly rounded, so these are exactly the Fractions' floats.
            least_cost=_quotient(cost_ratio(config, pool, requested))
            if Scorer.LEAST_COST in chain
            else None,
            least_waste=_quotient(waste_ratio(pool.allocatable, requested))
            if Scorer.LEAST_WASTE in chain
            else None,
            most_pods=pods if Scorer.MOST_PODS in chain else None,
        )


def _quotient(ratio: tuple[int, int]) -> float:
    return ratio[0] / ratio[1]


_ZERO: Final = Demand(0, 0)
# What ``Ranking.values`` gives for the score when no record shows it (SUMMARY).
_UNSHOWN: Final = Score()
