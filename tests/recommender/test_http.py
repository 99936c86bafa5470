"""``POST /v1/recommend``, ``GET /v1/recommendation`` and auto-publish, over real HTTP against
the fake API server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import yaml

from scheduler_extender.recommender import POOL_LABEL, ZONE_LABEL
from tests.extender.conftest import StartExtender, make_config, wait_until
from tests.extender.helpers import filter_body, vm_pod
from tests.fakes.kube_api import FakeKubeApi, node_object

ROOT = Path(__file__).resolve().parents[2]
BASIC = ROOT / "examples/snapshots/basic.yaml"
GOLDEN = Path(__file__).parent / "data/basic.recommendation.json"
POOL = {
    "name": "general",
    "zones": ["zone-a"],
    "template": {"instanceType": "m-8", "allocatable": {"cpu": "8", "memory": "32Gi"}},
    "maxCount": 3,
}


def pooled_node(name: str, pool: str = "general") -> dict[str, Any]:
    return node_object(name, cpu="4", labels={POOL_LABEL: pool, ZONE_LABEL: "zone-a"})


def recommender_config(**extra: Any) -> Any:
    return make_config(recommender={"node_pools": [POOL], **extra})


async def test_snapshot_body_in_yaml_answers_the_golden_recommendation_with_run_time(
    start_extender: StartExtender,
) -> None:
    running = await start_extender()
    response = await running.verbs.post(
        "/v1/recommend", data=BASIC.read_bytes(), headers={"Content-Type": "application/yaml"}
    )
    assert response.status == 200
    body = await response.read()
    answer = msgspec.json.decode(body)
    assert isinstance(answer.pop("runTimeMillis"), int)
    assert answer == msgspec.json.decode(GOLDEN.read_bytes())
    # The design's keys come first, with the handler's timing before the diagnostics.
    assert list(msgspec.json.decode(body)) == [
        "scaleUp",
        "unscheduledPods",
        "runTimeMillis",
        "diagnostics",
    ]


async def test_same_snapshot_as_json_gives_the_same_recommendation(
    start_extender: StartExtender,
) -> None:
    running = await start_extender()
    doc = yaml.safe_load(BASIC.read_text())
    response = await running.verbs.post("/v1/recommend", json=doc)
    assert response.status == 200
    answer = await response.json()
    del answer["runTimeMillis"]
    assert answer == msgspec.json.decode(GOLDEN.read_bytes())


async def test_bad_snapshot_is_400_naming_every_path_and_changes_nothing(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(pooled_node("node-a"))
    running = await start_extender(recommender_config())
    generation = running.extender.ledger.generation
    doc = yaml.safe_load(BASIC.read_text())
    doc["nodePools"][1]["zones"] = ["zone-a", "zone-a"]
    doc["pods"][1]["requests"]["cpu"] = "two"
    response = await running.verbs.post("/v1/recommend", json=doc)
    assert response.status == 400
    body = await response.json()
    assert body["reason"] == "InvalidSnapshot"
    assert [e["path"] for e in body["errors"]] == [
        "$.nodePools[1].zones[1]",
        "$.pods[1].requests.cpu",
    ]
    # A type error is reported by the decoder, with its path too.
    response = await running.verbs.post("/v1/recommend", json={**doc, "nodes": [{"name": 1}]})
    assert response.status == 400
    assert [e["path"] for e in (await response.json())["errors"]] == ["$.nodes[0].name"]
    assert running.extender.ledger.generation == generation
    assert (await running.verbs.get("/v1/recommendation")).status == 404


async def test_empty_body_recommends_for_the_live_pending_pods_and_configured_pools(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(pooled_node("node-a"))
    kube_api.add_pod(vm_pod("small", uid="u-small", min_vcpus=1))
    kube_api.add_pod(vm_pod("big", uid="u-big", min_vcpus=4))  # 4 > 3.2 usable on node-a
    running = await start_extender(recommender_config())
    response = await running.verbs.post("/v1/recommend")
    assert response.status == 200
    answer = await response.json()
    assert answer["scaleUp"] == [
        {
            "nodePool": "general",
            "zone": "zone-a",
            "instanceType": "m-8",
            "incrementBy": 1,
            "nodeNames": ["general-zone-a-new-1"],
        }
    ]
    assert answer["diagnostics"]["placedOnExisting"] == [{"pod": "vms/small", "node": "node-a"}]
    assert answer["diagnostics"]["newNodes"] == {"general-zone-a-new-1": ["vms/big"]}
    # Live mode only reads the ledger.
    assert set(running.extender.ledger.pods) == set()


async def test_live_state_that_contradicts_the_configured_pools_is_409(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(pooled_node("node-x", pool="gone"))
    running = await start_extender(recommender_config())
    response = await running.verbs.post("/v1/recommend")
    assert response.status == 409
    body = await response.json()
    assert body["reason"] == "LiveStateMismatch"
    assert "unknown node pool 'gone'" in body["errors"][0]["message"]


async def test_pod_refused_past_the_threshold_publishes_gauge_event_and_latest(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(pooled_node("node-a"))
    pod = kube_api.add_pod(vm_pod("big", uid="u-big", min_vcpus=4))
    config = recommender_config(pending_threshold_seconds=0.05, check_interval_seconds=0.02)
    running = await start_extender(config)
    assert (await running.verbs.get("/v1/recommendation")).status == 404
    response = await running.verbs.post("/filter", json=filter_body(pod, ["node-a"]))
    assert (await response.json())["NodeNames"] == []

    async def published() -> dict[str, Any] | None:
        response = await running.verbs.get("/v1/recommendation")
        return await response.json() if response.status == 200 else None

    latest: dict[str, Any] | None = None

    async def poll() -> None:
        nonlocal latest
        while latest is None:
            latest = await published()

    async with asyncio.timeout(5):
        await poll()
    assert latest is not None
    assert latest["reason"].startswith("filter found no node with room for pod vms/big for ")
    assert latest["publishedAt"] == "2027-01-15T08:00:00+00:00"
    assert latest["recommendation"]["scaleUp"][0]["incrementBy"] == 1
    metrics = await (await running.verbs.get("/metrics")).text()
    assert 'vmautoscale_extender_recommended_nodes{pool="general",zone="zone-a"} 1.0' in metrics
    assert 'vmautoscale_extender_recommendations_total{outcome="published",trigger="auto"}' in (
        metrics
    )
    await wait_until(lambda: any(e["reason"] == "ScaleUpRecommended" for e in kube_api.events))
    (event,) = [e for e in kube_api.events if e["reason"] == "ScaleUpRecommended"]
    assert event["involvedObject"]["name"] == "big"
    assert event["involvedObject"]["uid"] == "u-big"
    assert event["message"].startswith("scale-up recommended: 1 x general/zone-a;")
    # The same plan published again is not a second Event.
    registry = running.extender.metrics.registry
    name = "vmautoscale_extender_recommendations_total"
    labels = {"trigger": "auto", "outcome": "published"}
    count = registry.get_sample_value(name, labels) or 0.0
    await wait_until(lambda: (registry.get_sample_value(name, labels) or 0.0) > count)
    assert len([e for e in kube_api.events if e["reason"] == "ScaleUpRecommended"]) == 1


async def test_a_filter_that_finds_room_ends_the_wait_before_the_threshold(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(pooled_node("node-a"))
    pod = kube_api.add_pod(vm_pod("small", uid="u-small", min_vcpus=1))
    config = recommender_config(pending_threshold_seconds=0.05, check_interval_seconds=0.02)
    running = await start_extender(config)
    response = await running.verbs.post("/filter", json=filter_body(pod, ["node-a"]))
    assert (await response.json())["NodeNames"] == ["node-a"]
    assert running.extender.capacity_waits.waits == {}
    # Several checks go by; nothing is due, so nothing is published.
    await asyncio.sleep(0.15)
    assert (await running.verbs.get("/v1/recommendation")).status == 404
