"""``DiagnosticsLevel.SUMMARY``: the rounds without their candidates, and nothing else changed.

The summary must be the full answer with each round's ``candidates`` left out, to the byte: the
same scale-up, unscheduled pods and reasons, placements, new nodes and cost report. Both
come from the same rounds, so this holds only if skipping the records changes no decision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from protocol import annotations as ann
from scheduler_extender.recommender import (
    POOL_LABEL,
    ZONE_LABEL,
    DiagnosticsLevel,
    PreparedSnapshot,
    Recommendation,
    RecommenderConfig,
    Scorer,
    encode_recommendation,
    load_snapshot,
    recommend,
)
from testkit.recommender_snapshot import generate
from tests.recommender.test_recommender import affinity, node, pod, pool, snap, snapshots

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = DiagnosticsLevel.SUMMARY
DEFAULT_CHAIN = RecommenderConfig().scorers


def summarised(rec: Recommendation) -> Recommendation:
    """The full answer as the summary should read: each round without its candidates."""
    rounds = [replace(r, candidates=[]) for r in rec.diagnostics.rounds]
    return replace(rec, diagnostics=replace(rec.diagnostics, rounds=rounds))


def assert_summary_is_the_full_answer_without_candidates(
    prepared: PreparedSnapshot, config: RecommenderConfig
) -> Recommendation:
    full = recommend(prepared, config=replace(config, diagnostics=DiagnosticsLevel.FULL))
    lean = recommend(prepared, config=replace(config, diagnostics=SUMMARY))
    # Every full round lists candidates, so the comparison below does remove something.
    assert all(r.candidates for r in full.diagnostics.rounds)
    assert all(not r.candidates for r in lean.diagnostics.rounds)
    assert encode_recommendation(lean) == encode_recommendation(summarised(full))
    return full


def test_summary_is_the_default():
    assert RecommenderConfig().diagnostics is DiagnosticsLevel.SUMMARY


@pytest.mark.parametrize(
    "chain",
    [DEFAULT_CHAIN, (Scorer.LEAST_COST,)],
    ids=["priority+least-waste+most-pods", "least-cost"],
)
def test_bench_snapshot_summary_is_the_full_answer_without_candidates(chain):
    data = msgspec.json.encode(generate())
    full = assert_summary_is_the_full_answer_without_candidates(
        load_snapshot(data), RecommenderConfig(scorers=chain)
    )
    assert len(full.diagnostics.rounds) > 100
    lean = encode_recommendation(summarised(full))
    assert len(lean) * 10 < len(encode_recommendation(full))
    # Every part other than the rounds carries data here, so each is compared.
    doc = msgspec.json.decode(lean)
    assert doc["scaleUp"] and doc["diagnostics"]["placedOnExisting"]
    assert doc["diagnostics"]["newNodes"] and "cost" in doc["diagnostics"]


def test_basic_example_summary_is_the_full_answer_without_candidates():
    data = (ROOT / "examples/snapshots/basic.yaml").read_bytes()
    for chain in (DEFAULT_CHAIN, (Scorer.LEAST_COST,)):
        assert_summary_is_the_full_answer_without_candidates(
            load_snapshot(data, fmt="yaml"), RecommenderConfig(scorers=chain)
        )


def fixtures() -> dict[str, tuple[dict[str, Any], tuple[Scorer, ...]]]:
    classes = [{"name": "high", "value": 100}, {"name": "low", "value": 1}]
    vm = pod("vm", schedulerName="vm-scheduler", labels={ann.VM_LABEL: "true"})
    gpu = pool("gpu", template={"taints": [{"key": "gpu", "effect": "NoSchedule"}]})
    return {
        # Two passes, a pool at its maximum, a pod left for it.
        "priority-passes-at-max": (
            snap(
                priorityClasses=classes,
                nodePools=[pool("p", maxCount=1)],
                pods=[
                    pod("low", "3", priorityClassName="low"),
                    pod("high", "3", priorityClassName="high"),
                ],
            ),
            DEFAULT_CHAIN,
        ),
        "later-pass-fills-new-node": (
            snap(
                priorityClasses=classes,
                nodePools=[pool("p")],
                pods=[
                    pod("high", "2", priorityClassName="high"),
                    pod("low", "1", priorityClassName="low"),
                ],
            ),
            DEFAULT_CHAIN,
        ),
        "pool-limit": (
            snap(
                nodePools=[pool("p", limits={"cpu": "8"}, currentCount=1)],
                pods=[pod(f"x{i}", "3") for i in range(3)],
            ),
            DEFAULT_CHAIN,
        ),
        "too-big-and-invalid-vm": (
            snap(nodePools=[pool("p")], pods=[pod("huge", "16"), vm, pod("ok", "1")]),
            DEFAULT_CHAIN,
        ),
        "greedy-suboptimal": (
            snap(
                nodePools=[
                    pool("small", cpu="2500m", memory="8Gi", price=1.9),
                    pool("large", cpu="5", memory="16Gi", price=3.0),
                ],
                pods=[pod(f"x{i}", "1", "1Gi") for i in range(3)],
            ),
            (Scorer.LEAST_COST,),
        ),
        "zones-taints-existing-nodes": (
            snap(
                nodePools=[pool("p", price=1.0, priority=1), gpu],
                nodes=[node("n0", "p", cpu="2")],
                pods=[
                    pod("a", "1", affinity=affinity(ZONE_LABEL, "In", "b")),
                    pod("t", "1", tolerations=[{"key": "gpu", "operator": "Exists"}]),
                    pod("s", "3", nodeSelector={POOL_LABEL: "gpu"}),
                    pod("e", "500m"),
                ],
            ),
            (Scorer.PRIORITY, Scorer.MOST_PODS),
        ),
    }


@pytest.mark.parametrize("name", list(fixtures()))
def test_fixture_summary_is_the_full_answer_without_candidates(name):
    doc, chain = fixtures()[name]
    assert_summary_is_the_full_answer_without_candidates(
        load_snapshot(msgspec.json.encode(doc)), RecommenderConfig(scorers=chain)
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=snapshots(), chain=st.permutations(list(Scorer)))
def test_any_snapshot_summary_is_the_full_answer_without_candidates(doc, chain):
    assert_summary_is_the_full_answer_without_candidates(
        load_snapshot(msgspec.json.encode(doc)), RecommenderConfig(scorers=tuple(chain))
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc=snapshots(),
    rest=st.permutations([s for s in Scorer if s is not Scorer.PRIORITY]).flatmap(
        lambda links: st.integers(0, len(links)).map(lambda n: links[:n])
    ),
)
def test_priority_first_summary_skips_lower_tiers_and_still_matches_the_full_answer(doc, rest):
    """Summary rounds leave a lower-priority tier's trials unfilled while a higher tier places
    pods (pools at their maximum push the rounds down the tiers): the winners must still be
    the full answer's."""
    assert_summary_is_the_full_answer_without_candidates(
        load_snapshot(msgspec.json.encode(doc)),
        RecommenderConfig(scorers=(Scorer.PRIORITY, *rest)),
    )
