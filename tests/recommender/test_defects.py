"""Issue 18's hand-computed defects: pod priority without classes, and prices that passed
validation but crashed the recommender (the third, plans mixing pools, is ``test_cost_plan``)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_extender.config import ConfigError, parse_config
from scheduler_extender.recommender import (
    RecommenderConfig,
    Scorer,
    SnapshotError,
    encode_recommendation,
    load_snapshot,
)
from tests.recommender.test_recommender import pod, pool, reasons, run, snap

LEAST_COST = RecommenderConfig(scorers=(Scorer.LEAST_COST,))
CHAINS = [
    RecommenderConfig(),
    LEAST_COST,
    RecommenderConfig(scorers=(Scorer.MOST_PODS,)),
    RecommenderConfig(scorers=()),
]
CHAIN_IDS = ["default", "least-cost", "most-pods", "names-only"]


# -- 1. priority from the pod alone ------------------------------------------------------------


def scarce_room(**high_extra: Any) -> dict[str, Any]:
    """One node left in the pool. The priority-1000 pod may only run in zone b; four priority-0
    pods fill a zone-a node exactly (4 x 0.8 = 3.2 usable), so a single combined pass gives
    that last node to them (least waste, most pods) and leaves the priority-1000 pod out."""
    return snap(
        nodePools=[pool("p", maxCount=1, price=1.0)],
        pods=[
            *(pod(f"low{i}", "800m", priority=0) for i in range(4)),
            pod("high", "2", nodeSelector={"topology.kubernetes.io/zone": "b"}, **high_extra),
        ],
    )


@pytest.mark.parametrize("config", CHAINS, ids=CHAIN_IDS)
def test_pod_priority_without_classes_is_served_highest_first(config):
    rec = run(scarce_room(priority=1000), config)
    # The last node goes to zone b for the priority-1000 pod; one low pod fits beside it
    # (2 + 0.8 = 2.8 of 3.2), and the pool is then at its maximum.
    assert rec.diagnostics.new_nodes == {"p-b-new-1": ["ns/high", "ns/low0"]}
    assert rec.unscheduled_pods == ["ns/low1", "ns/low2", "ns/low3"]
    assert set(reasons(rec).values()) == {"PoolAtMaxCount"}
    assert [r.pass_priority for r in rec.diagnostics.rounds] == [1000, 0]


def test_pod_priority_and_class_priority_give_the_same_plan():
    by_pod = run(scarce_room(priority=1000))
    doc = scarce_room(priorityClassName="high")
    doc["priorityClasses"] = [{"name": "high", "value": 1000}]
    by_class = run(doc)
    assert by_pod.diagnostics.new_nodes == by_class.diagnostics.new_nodes
    assert by_pod.unscheduled_pods == by_class.unscheduled_pods


def test_one_priority_without_classes_is_still_one_unlabelled_pass():
    rec = run(snap(nodePools=[pool("p")], pods=[pod("a", "3"), pod("b", "3")]))
    assert [r.pass_priority for r in rec.diagnostics.rounds] == [None, None]


# -- 2. prices that pass validation never crash ------------------------------------------------


def two_nodes_of(price: float) -> dict[str, Any]:
    return snap(nodePools=[pool("p", price=price)], pods=[pod("a", "3"), pod("b", "3")])


@pytest.mark.parametrize("price", [5e-324, 1e-300, 1e-10, 1e13, 1e308], ids=str)
def test_prices_out_of_range_are_refused_with_their_path(price):
    with pytest.raises(SnapshotError) as e:
        run(two_nodes_of(price), LEAST_COST)
    [error] = e.value.errors
    assert error.path == "$.nodePools[0].price"
    assert "1e-09" in error.message or "1000000000000" in error.message
    assert e.value.status == 400


def test_config_pools_with_out_of_range_prices_are_refused_with_their_path():
    # The config's pools are written exactly like a snapshot's (camelCase).
    pools = [pool("p", price=1e308)]
    with pytest.raises(ConfigError) as e:
        parse_config({"recommender": {"node_pools": pools}})
    assert "$.recommender.node_pools[0].price" in str(e.value)


@settings(max_examples=80, deadline=None)
@given(
    price=st.floats(min_value=1e-9, max_value=1e12),
    other=st.floats(min_value=1e-9, max_value=1e12),
    cpu=st.sampled_from(["1m", "1", "64", "9223372036854775"]),
    config=st.sampled_from(CHAINS),
)
def test_every_accepted_price_gives_an_answer(price, other, cpu, config):
    doc = snap(
        nodePools=[pool("p", cpu=cpu, price=price), pool("q", cpu="8", price=other)],
        pods=[pod("a", "3"), pod("b", "3"), pod("c", "1m")],
    )
    rec = run(doc, config)
    msgspec.json.decode(encode_recommendation(rec))


def test_the_boundary_prices_are_accepted():
    for price in (1e-9, 1e12):
        load_snapshot(msgspec.json.encode(two_nodes_of(price)))
