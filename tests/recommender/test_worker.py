"""Recommendations run in a worker process: the same answer, and the loop stays free for
kube-scheduler's calls while one runs (an ordering, not a timing: the benchmark
``scripts/bench_recommend_hotpath.py`` measures the latencies)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from scheduler_extender.config import RecommendWorkerMode
from scheduler_extender.http.recommend_worker import Job, RecommendWorker, compute
from scheduler_extender.recommender import (
    DiagnosticsLevel,
    RecommenderConfig,
    encode_recommendation,
    load_snapshot,
    recommend,
)
from testkit.kube_api import FakeKubeApi, node_object
from testkit.recommender_snapshot import generate
from tests.extender.conftest import StartExtender, make_config
from tests.extender.helpers import filter_body, vm_pod
from tests.recommender.test_http import BASIC

FULL = RecommenderConfig(diagnostics=DiagnosticsLevel.FULL)


def without_time(answer: bytes) -> Any:
    doc = msgspec.json.decode(answer)
    assert isinstance(doc.pop("runTimeMillis"), int)
    return doc


@pytest.mark.parametrize("mode", list(RecommendWorkerMode))
async def test_both_modes_answer_what_recommend_answers(mode: RecommendWorkerMode) -> None:
    data = BASIC.read_bytes()
    expected = encode_recommendation(recommend(load_snapshot(data, fmt="yaml"), config=FULL))
    worker = RecommendWorker(mode)
    try:
        result = await worker.run(Job(snapshot=data, fmt="yaml", config=FULL, notes=["n"]))
    finally:
        worker.close()
    answer = without_time(result.answer)
    expected_doc = msgspec.json.decode(expected)
    expected_doc["diagnostics"]["notes"] = ["n"]
    assert answer == expected_doc
    assert (result.new_nodes, result.unscheduled, result.recommendation) == (1, 0, None)


async def test_a_bad_snapshot_comes_back_as_its_errors() -> None:
    result = compute(Job(snapshot=b"{", fmt="json", config=FULL))
    assert result.answer == b""
    assert [e.path for e in result.errors] == ["$"]


async def test_filter_calls_are_answered_while_a_recommendation_runs(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a", cpu="16"))
    pod = kube_api.add_pod(vm_pod("probe", uid="u-probe", min_vcpus=1))
    running = await start_extender(make_config(recommender={"worker": "process"}))
    # The benchmark's snapshot with the full trace: far more work than a few filter calls.
    snapshot = msgspec.json.encode(generate())
    recommendation = asyncio.create_task(
        running.verbs.post("/v1/recommend?diagnostics=full", data=snapshot)
    )
    answered = 0
    while not recommendation.done():
        response = await running.verbs.post("/filter", json=filter_body(pod, ["node-a"]))
        assert response.status == 200
        answered += 1
    assert (await recommendation).status == 200
    # On the loop, filter calls queued behind the simulation: one or two got through.
    assert answered >= 10
