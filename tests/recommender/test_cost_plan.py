"""Phase 6, the cost plan: the cheapest plan placing what greedy placed, mixing pools and zones
(issue 18's second defect: five 3-cpu pods, a6 fits 2 at 1.8, b9 fits 3 at 2.8)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.quantity import cpu_millis
from scheduler_extender.recommender import RecommenderConfig, Scorer, load_snapshot, recommend
from scheduler_extender.recommender.plan import EXACT_PODS
from tests.recommender.test_defects import CHAIN_IDS, CHAINS, LEAST_COST
from tests.recommender.test_recommender import ROOT, pod, pool, run, scaled, snap

# -----------------------------------------------------------


def issue_pools(**a6_extra: Any) -> list[dict[str, Any]]:
    # 20% of cpu is reserved: a6's 8 cpu leave 6.4 (two 3-cpu pods), b9's 12 leave 9.6 (three).
    return [
        pool("a6", cpu="8", memory="32Gi", price=1.8, **a6_extra),
        pool("b9", cpu="12", memory="48Gi", price=2.8),
    ]


def five_pods() -> list[dict[str, Any]]:
    return [pod(f"x{i}", "3", "1Gi") for i in range(5)]


@pytest.mark.parametrize("config", CHAINS, ids=CHAIN_IDS)
def test_the_issue_plan_mixing_pools_is_recommended(config):
    rec = run(snap(nodePools=issue_pools(), pods=five_pods()), config)
    # b9 (3 pods, 2.8) + a6 (2 pods, 1.8) = 4.6: the cheapest plan for five 3-cpu pods.
    assert scaled(rec) == {"a6/a": 1, "b9/a": 1}
    cost = rec.diagnostics.cost
    assert cost is not None
    assert cost.price == pytest.approx(4.6)
    assert cost.is_optimal
    assert cost.lower_bound == pytest.approx(4.6)
    assert cost.greedy_extra_cost == pytest.approx(cost.greedy_price - 4.6)
    assert sorted(len(p) for p in rec.diagnostics.new_nodes.values()) == [2, 3]
    assert rec.unscheduled_pods == []


def test_least_cost_greedy_buys_three_a6_and_the_answer_says_what_that_costs():
    # Least-cost prefers a6 every round (6,000 units for 1.8 beats 9,000 for 2.8): 3 x a6.
    rec = run(snap(nodePools=issue_pools(), pods=five_pods()), LEAST_COST)
    cost = rec.diagnostics.cost
    assert cost is not None
    assert cost.greedy_price == pytest.approx(5.4)
    assert cost.greedy_extra_cost == pytest.approx(0.8)
    assert {(g.node_pool, g.zone, g.increment_by) for g in cost.greedy_scale_up} == {("a6", "a", 3)}
    assert any("0.8" in note and "greedy" in note for note in rec.diagnostics.notes)
    # The rounds still show what greedy did; the scale-up is the cheaper plan.
    assert [r.winner for r in rec.diagnostics.rounds] == ["a6/a"] * 3


def test_greedy_is_kept_and_proven_optimal_when_nothing_is_cheaper():
    rec = run(snap(nodePools=[pool("p", price=1.0)], pods=[pod("x", "1")]))
    assert scaled(rec) == {"p/a": 1}
    cost = rec.diagnostics.cost
    assert cost is not None
    assert (cost.greedy_price, cost.price, cost.greedy_extra_cost) == (1.0, 1.0, 0.0)
    assert cost.is_optimal and cost.lower_bound == 1.0
    assert cost.greedy_scale_up == []


def test_the_plan_honours_pool_max_count():
    # b9 may not grow: the best plan left is greedy's three a6 nodes.
    pools = issue_pools()
    pools[1]["maxCount"] = 0
    rec = run(snap(nodePools=pools, pods=five_pods()), LEAST_COST)
    assert scaled(rec) == {"a6/a": 3}
    assert rec.diagnostics.cost is not None and rec.diagnostics.cost.greedy_extra_cost == 0


def test_the_plan_honours_zones_the_pods_ask_for():
    pods = [pod(f"x{i}", "3", "1Gi", nodeSelector={"topology.kubernetes.io/zone": "b"})
            for i in range(5)]  # fmt: skip
    rec = run(snap(nodePools=issue_pools(), pods=pods), LEAST_COST)
    assert scaled(rec) == {"a6/b": 1, "b9/b": 1}


def test_an_exhausted_search_keeps_greedy_and_says_how_far_it_may_be():
    config = RecommenderConfig(scorers=(Scorer.LEAST_COST,), plan_search_steps=0)
    rec = run(snap(nodePools=issue_pools(), pods=five_pods()), config)
    assert scaled(rec) == {"a6/a": 3}
    cost = rec.diagnostics.cost
    assert cost is not None
    assert not cost.is_optimal
    # Volume bound: 15 cpu at the cheapest price per usable cpu (a6: 1.8 / 6.4).
    assert cost.lower_bound == pytest.approx(15 * 1.8 / 6.4)
    assert cost.price == pytest.approx(5.4)


def test_unpriced_pools_skip_the_check_with_a_note():
    pools = issue_pools()
    del pools[0]["price"]
    rec = run(snap(nodePools=pools, pods=five_pods()))
    assert rec.diagnostics.cost is None
    assert any("pools without a price: a6" in n for n in rec.diagnostics.notes)


sizes = st.sampled_from(["500m", "1", "1500m", "2", "3", "5"])
IN_ZONE_B = {"topology.kubernetes.io/zone": "b"}


@st.composite
def plan_snapshots(draw: st.DrawFn) -> dict[str, Any]:
    pools = [
        pool(
            f"p{i}",
            cpu=draw(st.sampled_from(["4", "6", "8", "12"])),
            memory="64Gi",
            price=draw(st.sampled_from([0.5, 1.0, 1.3, 1.8, 2.8])),
            maxCount=draw(st.integers(0, 4)),
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    pods = [
        pod(f"x{i}", draw(sizes), "1Gi", nodeSelector=IN_ZONE_B if draw(st.booleans()) else {})
        for i in range(draw(st.integers(0, 9)))
    ]
    return snap(nodePools=pools, pods=pods)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=plan_snapshots(), config=st.sampled_from(CHAINS))
def test_the_recommended_plan_places_greedys_pods_and_costs_no_more(doc, config):
    greedy = run(doc, RecommenderConfig(scorers=config.scorers, plan_search_steps=0))
    rec = run(doc, config)
    assert rec.unscheduled_pods == greedy.unscheduled_pods
    assert sorted(k for ps in rec.diagnostics.new_nodes.values() for k in ps) == sorted(
        k for ps in greedy.diagnostics.new_nodes.values() for k in ps
    )
    cost, greedy_cost = rec.diagnostics.cost, greedy.diagnostics.cost
    if cost is None:
        assert rec.scale_up == []
        return
    assert greedy_cost is not None
    assert cost.lower_bound <= cost.price + 1e-9
    assert cost.price <= greedy_cost.price + 1e-9
    assert cost.greedy_price == greedy_cost.price
    # Every new node holds what fits in its template's usable room (80% of its cpu), in a
    # zone its pods allow, and the pools' maxima hold.
    pools = {p["name"]: p for p in doc["nodePools"]}
    pods = {f"ns/{p['name']}": p for p in doc["pods"]}
    per_pool: dict[str, int] = {}
    price = Fraction(0)
    for up in rec.scale_up:
        template = pools[up.node_pool]["template"]
        per_pool[up.node_pool] = per_pool.get(up.node_pool, 0) + up.increment_by
        price += Fraction(pools[up.node_pool]["price"]) * up.increment_by
        for name in up.node_names:
            held = [pods[k] for k in rec.diagnostics.new_nodes[name]]
            used = sum(cpu_millis(p["requests"]["cpu"]) for p in held)
            assert used <= cpu_millis(template["allocatable"]["cpu"]) * 4 // 5
            for p in held:
                assert p["nodeSelector"].get("topology.kubernetes.io/zone", up.zone) == up.zone
    for name, n in per_pool.items():
        assert n <= pools[name]["maxCount"]
    assert float(price) == pytest.approx(cost.price)


def test_pool_priority_first_in_the_chain_outranks_price():
    # basic.yaml: greedy takes "large" (priority 10) for 0.7 where two "small" nodes (priority
    # 0) cost 0.4. With priority first in the chain the plan keeps to priority >= 10; under
    # most-pods alone greedy takes "large" too (3 pods), and the plan the cheaper smalls.
    data = (ROOT / "examples/snapshots/basic.yaml").read_bytes()
    rec = recommend(load_snapshot(data, fmt="yaml"), config=RecommenderConfig())
    assert scaled(rec) == {"large/zone-b": 1}
    assert rec.diagnostics.cost is not None and rec.diagnostics.cost.is_optimal
    most_pods = RecommenderConfig(scorers=(Scorer.MOST_PODS,))
    rec = recommend(load_snapshot(data, fmt="yaml"), config=most_pods)
    assert [r.winner for r in rec.diagnostics.rounds] == ["large/zone-b"]
    assert scaled(rec) == {"small/zone-a": 1, "small/zone-b": 1}
    cost = rec.diagnostics.cost
    assert cost is not None
    assert (cost.greedy_price, cost.price, cost.greedy_extra_cost) == (0.7, 0.4, 0.3)


def test_beyond_the_exact_size_one_descent_runs_and_the_bound_says_how_far():
    # 2 * EXACT_PODS pods of 3 cpu: greedy by least cost buys a6 nodes (2 pods each); the
    # descent opens the node cheapest per pod of the shape, a6 (0.9 a pod, b9 0.93), so it
    # finds nothing cheaper and says so; the bound is the cpu volume at a6's rate.
    n = 2 * EXACT_PODS
    pods = [pod(f"x{i:04d}", "3", "1Gi") for i in range(n)]
    pools = issue_pools()
    for p in pools:
        p["maxCount"] = n
    rec = run(snap(nodePools=pools, pods=pods), LEAST_COST)
    cost = rec.diagnostics.cost
    assert cost is not None
    assert scaled(rec) == {"a6/a": n // 2}
    assert not cost.is_optimal
    assert cost.price == pytest.approx(n // 2 * 1.8)
    assert cost.lower_bound == pytest.approx(n * 3 * 1.8 / 6.4)
    assert 0 < cost.search_steps <= RecommenderConfig().plan_search_steps
