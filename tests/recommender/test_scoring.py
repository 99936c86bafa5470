"""The ranking's integer keys and shown floats agree with the exact Fractions they stand for."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from scheduler_extender.core.podinfo import Demand
from scheduler_extender.recommender.config import DiagnosticsLevel, RecommenderConfig, Scorer
from scheduler_extender.recommender.model import Pool
from scheduler_extender.recommender.scoring import Ranking

# Full diagnostics: scores are built only for the candidates' records, which only FULL has.
CONFIG = RecommenderConfig(
    scorers=(Scorer.LEAST_COST, Scorer.LEAST_WASTE), diagnostics=DiagnosticsLevel.FULL
)


def make_pool(index: int, cpu: int, memory: int, price: float) -> Pool:
    alloc = Demand(cpu, memory)
    return Pool(
        index=index,
        name=f"p{index}",
        instance_type="t",
        zones=["a"],
        allocatable=alloc,
        capacity=alloc,
        labels={},
        taints=(),
        count=0,
        max_count=10,
        limit_cpu=None,
        limit_memory=None,
        price=Fraction(price),
        priority=0,
    )


def exact(pool: Pool, requested: Demand) -> tuple[Fraction, Fraction]:
    """least-cost (negated: smaller ranks first) and least-waste, as plain Fractions."""
    per_cpu = CONFIG.memory_bytes_per_cpu
    units = Fraction(requested.cpu_millis * per_cpu + requested.memory_bytes * 1000, per_cpu)
    assert pool.price is not None
    ac, am = pool.allocatable.cpu_millis, pool.allocatable.memory_bytes
    shares = [Fraction(ac - requested.cpu_millis, ac) if ac else None]
    shares.append(Fraction(am - requested.memory_bytes, am) if am else None)
    return -units / pool.price, sum((s for s in shares if s is not None), Fraction(0))


sizes = st.tuples(st.integers(0, 64_000), st.integers(0, 2**38))
prices = st.floats(min_value=0.001, max_value=100, allow_nan=False)


@given(
    shapes=st.lists(st.tuples(sizes, prices), min_size=1, max_size=4),
    requests=st.lists(st.tuples(st.integers(0, 3), sizes), min_size=2, max_size=6),
)
def test_keys_order_and_tie_like_the_fractions_and_floats_are_theirs(shapes, requests):
    pools = [make_pool(i, c, m, price) for i, ((c, m), price) in enumerate(shapes)]
    ranking = Ranking(CONFIG, pools)
    seen = []
    for which, (cpu, memory) in requests:
        pool = pools[which % len(pools)]
        key, shown = ranking.values(pool, cpu, memory, 1)
        cost, waste = exact(pool, Demand(cpu, memory))
        assert shown.least_cost == float(-cost)
        assert shown.least_waste == float(waste)
        seen.append((key, (cost, waste)))
    for key_a, exact_a in seen:
        for key_b, exact_b in seen:
            assert (key_a < key_b) == (exact_a < exact_b)
            assert (key_a == key_b) == (exact_a == exact_b)


@given(
    chain=st.permutations(list(Scorer)).flatmap(
        lambda c: st.integers(0, len(c)).map(lambda n: c[:n])
    ),
    shape=st.tuples(sizes, prices),
    priority=st.integers(0, 5),
    room=sizes,
    filled=st.tuples(st.integers(0, 64_000), st.integers(0, 2**38), st.integers(0, 50)),
)
def test_a_node_never_ranks_before_its_bound(chain, shape, priority, room, filled):
    """What the lazy SUMMARY rounds rely on: whatever a new node holds within its room, and
    however few of the pods, its key ranks no earlier than ``bound`` (the node full)."""
    (cpu, memory), price = shape
    pool = replace(make_pool(0, cpu, memory, price), priority=priority)
    ranking = Ranking(RecommenderConfig(scorers=tuple(chain)), [pool])
    room_cpu, room_mem = min(room[0], cpu), min(room[1], memory)
    pods = 50
    used_cpu, used_mem, placed = min(filled[0], room_cpu), min(filled[1], room_mem), filled[2]
    bound = ranking.bound(pool, Demand(room_cpu, room_mem), pods)
    key, _shown = ranking.values(pool, used_cpu, used_mem, placed)
    assert bound <= key
    if used_cpu == room_cpu and used_mem == room_mem and placed == pods:
        assert bound == key
    # The priority links are exact: a bound ranks with its own tier.
    for link, scorer in enumerate(chain[: ranking.exact_links]):
        assert scorer is Scorer.PRIORITY
        assert bound[link] == key[link]
