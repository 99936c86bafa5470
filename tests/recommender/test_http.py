"""``POST /v1/recommend``, ``GET /v1/recommendation`` and auto-publish, over real HTTP against
the fake API server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import yaml
from msgspec.structs import replace

from scheduler_extender.http.recommend import live_recommendation, publish_if_overdue
from scheduler_extender.recommender import POOL_LABEL, ZONE_LABEL, encode_recommendation
from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import StartExtender, make_config, wait_until
from tests.extender.helpers import filter_body, vm_pod

ROOT = Path(__file__).resolve().parents[2]
BASIC = ROOT / "examples/snapshots/basic.yaml"
GOLDEN = Path(__file__).parent / "data/basic.recommendation.json"
BASIC_DOC = yaml.safe_load(BASIC.read_text())
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
        "/v1/recommend?diagnostics=full",
        data=BASIC.read_bytes(),
        headers={"Content-Type": "application/yaml"},
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
    response = await running.verbs.post("/v1/recommend?diagnostics=full", json=doc)
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
    # Not on the permits listener: it is open to every pod, and a recommendation names pods.
    assert (await running.permits.get("/v1/recommendation")).status == 404
    assert (await running.permits.post("/v1/recommend")).status == 404
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


# -- diagnostics level -------------------------------------------------------------------------


def basic_summary() -> dict[str, Any]:
    """The golden answer with each round's candidates left out (``test_diagnostics`` shows the
    summary is exactly that)."""
    golden = msgspec.json.decode(GOLDEN.read_bytes())
    for r in golden["diagnostics"]["rounds"]:
        del r["candidates"]
    return golden


async def test_the_summary_is_the_default_and_the_query_asks_for_it_too(
    start_extender: StartExtender,
) -> None:
    running = await start_extender()
    for query in ("", "?diagnostics=summary"):
        response = await running.verbs.post(
            f"/v1/recommend{query}",
            data=BASIC.read_bytes(),
            headers={"Content-Type": "application/yaml"},
        )
        assert response.status == 200
        answer = msgspec.json.decode(await response.read())
        assert isinstance(answer.pop("runTimeMillis"), int)
        assert answer == basic_summary()


async def test_config_sets_the_level_and_the_query_overrides_it(
    start_extender: StartExtender,
) -> None:
    running = await start_extender(make_config(recommender={"diagnostics": "full"}))

    async def post(query: str) -> dict[str, Any]:
        response = await running.verbs.post(f"/v1/recommend{query}", json=BASIC_DOC)
        assert response.status == 200
        answer: dict[str, Any] = await response.json()
        del answer["runTimeMillis"]
        return answer

    assert await post("") == msgspec.json.decode(GOLDEN.read_bytes())
    assert await post("?diagnostics=summary") == basic_summary()


async def test_unknown_diagnostics_level_is_400(start_extender: StartExtender) -> None:
    running = await start_extender()
    response = await running.verbs.post("/v1/recommend?diagnostics=verbose", json=BASIC_DOC)
    assert response.status == 400
    body = await response.json()
    assert body["reason"] == "InvalidParameter"
    assert body["message"] == "diagnostics must be 'full' or 'summary', not 'verbose'"


async def test_auto_publish_computes_the_summary_and_publishes_what_the_full_answer_would(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(pooled_node("node-a"))
    pods = [
        kube_api.add_pod(vm_pod(f"vm-{i}", uid=f"u-{i}", min_vcpus=vcpus, max_vcpus=16))
        for i, vcpus in enumerate([4, 3, 2, 2, 1, 12])  # 12 fits no template
    ]
    pool = {**POOL, "zones": ["zone-a", "zone-b"]}
    # The config asks for full rounds: auto-publish computes the summary anyway. No task
    # (auto_publish off): the check is called directly, at a time past the threshold.
    config = make_config(
        recommender={"node_pools": [pool], "diagnostics": "full", "auto_publish": False}
    )
    running = await start_extender(config)
    for p in pods:
        response = await running.verbs.post("/filter", json=filter_body(p, ["node-a"]))
        assert response.status == 200
    app = running.verbs.app
    now = asyncio.get_running_loop().time() + config.recommender.pending_threshold_seconds + 1
    published = await publish_if_overdue(app, now=now)
    assert published is not None
    full = live_recommendation(running.extender)
    assert full.diagnostics.rounds and all(r.candidates for r in full.diagnostics.rounds)
    assert full.scale_up and full.unscheduled_pods == ["vms/vm-5"]

    # GET /v1/recommendation: the full answer without the rounds' candidates, to the byte.
    body = await (await running.verbs.get("/v1/recommendation")).json()
    rounds = [replace(r, candidates=[]) for r in full.diagnostics.rounds]
    summary = replace(full, diagnostics=replace(full.diagnostics, rounds=rounds))
    assert msgspec.json.encode(body["recommendation"]) == encode_recommendation(summary)
    assert body["reason"] == published.reason
    # The gauge: the full answer's scale-up, zero for the other zone.
    registry = running.extender.metrics.registry
    expected = {(s.node_pool, s.zone): s.increment_by for s in full.scale_up}
    for zone in pool["zones"]:
        value = registry.get_sample_value(
            "vmautoscale_extender_recommended_nodes", {"pool": "general", "zone": zone}
        )
        assert value == expected.get(("general", zone), 0)
    # The Event: the full answer's plan and count.
    plan = ", ".join(f"{s.increment_by} x {s.node_pool}/{s.zone}" for s in full.scale_up)
    await wait_until(lambda: any(e["reason"] == "ScaleUpRecommended" for e in kube_api.events))
    (event,) = [e for e in kube_api.events if e["reason"] == "ScaleUpRecommended"]
    assert event["message"] == (
        f"scale-up recommended: {plan}; 1 pod(s) left unscheduled; because {published.reason}"
    )


async def test_live_state_brings_pod_constraints_node_taints_and_cordons_to_the_simulation(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    db_pool = {
        **POOL,
        "name": "db",
        "template": {**POOL["template"], "labels": {"tier": "db"}},
    }
    tainted = pooled_node("node-a")
    tainted["spec"]["taints"] = [{"key": "maintenance", "effect": "NoSchedule"}]
    cordoned = pooled_node("node-b")
    cordoned["spec"]["unschedulable"] = True
    kube_api.add_node(tainted)
    kube_api.add_node(cordoned)
    kube_api.add_pod(vm_pod("small", uid="u-small", min_vcpus=1))
    db = vm_pod("db", uid="u-db", min_vcpus=1)
    db["spec"]["nodeSelector"] = {"tier": "db"}
    kube_api.add_pod(db)
    gt = vm_pod("gt", uid="u-gt", min_vcpus=1)
    gt["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["8"]}]}
                ]
            }
        }
    }  # fmt: skip
    kube_api.add_pod(gt)
    running = await start_extender(recommender_config(node_pools=[POOL, db_pool]))
    response = await running.verbs.post("/v1/recommend")
    assert response.status == 200
    answer = await response.json()
    # Both nodes have room for "small", but one is tainted and one cordoned; "db" selects
    # its pool (and "small" shares its new node); "gt" is left out, and said to be.
    assert answer["diagnostics"]["newNodes"] == {"db-zone-a-new-1": ["vms/db", "vms/small"]}
    assert "placedOnExisting" not in answer["diagnostics"]
    assert [n.split(":")[0] for n in answer["diagnostics"]["notes"]] == [
        "cost check skipped",  # the pools have no price
        "pod vms/gt left out",
    ]
    # The node watch keeps them current: the taint lifted, "small" fits node-a again.
    kube_api.update_node("node-a", lambda n: n["spec"].pop("taints"))
    await wait_until(lambda: not running.extender.node_taints)
    answer = await (await running.verbs.post("/v1/recommend")).json()
    assert answer["diagnostics"]["placedOnExisting"] == [{"pod": "vms/small", "node": "node-a"}]
    # A pod that gets bound leaves its spec behind with it.
    kube_api.update_pod("vms", "db", lambda p: p["spec"].update(nodeName="node-a"))
    await wait_until(lambda: "vms/db" not in running.extender.unbound_specs)
    assert set(running.extender.unbound_specs) == set(running.extender.unbound)


async def test_plan_for_growth_live_gives_vms_denied_room_a_node(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    # node-a: 4 cpu, 3.2 usable. Two running VMs at 1 vCPU, top 3: at headroom 0.5 each
    # counts 2, 4 in all. One is planned to move: "vms/a" (same priority and size: by name).
    kube_api.add_node(pooled_node("node-a"))
    for name in ("a", "b"):
        kube_api.add_pod(vm_pod(name, uid=f"u-{name}", node="node-a", min_vcpus=1, max_vcpus=3))
    running = await start_extender(recommender_config(growth_headroom=0.5, auto_publish=False))
    answer = await (await running.verbs.post("/v1/recommend")).json()
    assert [(s["nodePool"], s["incrementBy"]) for s in answer["scaleUp"]] == [("general", 1)]
    assert answer["diagnostics"]["growth"] == [
        {"pod": "vms/a", "node": "node-a", "cpuMillis": 2000,
         "memoryBytes": 2**30, "toNode": "general-zone-a-new-1"}
    ]  # fmt: skip
    # Without a headroom the live state asks for nothing.
    running = await start_extender(recommender_config(auto_publish=False))
    answer = await (await running.verbs.post("/v1/recommend")).json()
    assert answer["scaleUp"] == [] and "growth" not in answer["diagnostics"]
