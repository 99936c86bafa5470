"""Operability: /metrics names, /state shape, node_alloc log lines, standalone mode."""

from __future__ import annotations

import logging
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from scheduler_extender.config import Config
from scheduler_extender.http.app import Deps, make_app, make_permits_app
from scheduler_extender.kube.standalone import StandaloneCluster, StandaloneNode, StandalonePod
from testkit.kube_api import FakeKubeApi, node_object, pod_object
from tests.extender.conftest import STATIC_TOKEN, StartExtender, make_config, wait_until
from tests.extender.helpers import (
    VM_LABELS,
    bind_body,
    filter_body,
    permit_batch,
    vm_pod,
)

AUTH = {"Authorization": f"Bearer {STATIC_TOKEN}"}


async def test_metrics_and_state(kube_api: FakeKubeApi, start_extender: StartExtender) -> None:
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a"))
    foreign = pod_object("web", uid="u-web", node_name="node-a", cpu="500m", scheduler_name="x")
    kube_api.add_pod(foreign)
    running = await start_extender()
    body = permit_batch("node-a", uid="u-1", current=1, requested=2)
    assert (await running.permits.post("/v1/permits", json=body, headers=AUTH)).status == 200
    text = await (await running.verbs.get("/metrics")).text()
    for name in (
        'vmautoscale_extender_verb_duration_seconds_count{verb="permits"} 1.0',
        'vmautoscale_extender_permits_total{status="granted"} 1.0',
        'vmautoscale_extender_node_reserved_vcpus{node="node-a"} 2.0',
        'vmautoscale_extender_node_free_vcpus{node="node-a"} 3.9',
        "vmautoscale_extender_foreign_vcpus 0.5",
        "vmautoscale_extender_synced 1.0",
    ):
        assert name in text
    (node,) = (await running.state())["nodes"]
    assert {k: node[k] for k in ("capacity", "systemReserve", "allocated", "occupied", "free")} == {
        "capacity": {"cpuMillis": 8000, "memoryBytes": 8 * 2**30},
        "systemReserve": {"cpuMillis": 1600, "memoryBytes": 0},
        "allocated": {"cpuMillis": 2000, "memoryBytes": 2**30},
        "occupied": {"cpuMillis": 500, "memoryBytes": 2**30},
        "free": {"cpuMillis": 3900, "memoryBytes": 6 * 2**30},
    }
    assert node["overcommitted"] is False
    (own,) = node["allocations"]
    assert own["pod"] == "vms/vm-1" and own["uid"] == "u-1" and own["tags"] == {}
    assert own["allocatedAt"] == "2027-01-15T08:00:00.000+00:00"
    (other,) = node["foreignAllocations"]
    assert other["tags"] == {"foreign": "default"} and other["pod"] == "default/web"
    # Nothing was posted for the initial list.
    assert kube_api.events == []


async def test_node_alloc_logged_on_add_and_remove(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a"))
    pod = kube_api.add_pod(vm_pod("vm-1", uid="u-1"))
    running = await start_extender()
    merge = structlog.contextvars.merge_contextvars
    with structlog.testing.capture_logs(processors=[merge]) as logs:
        assert (
            await (await running.verbs.post("/bind", json=bind_body(pod, "node-a"))).json()
        ) == {"Error": ""}
    # One line per bind: the request's, with the allocation on it.
    assert [e for e in logs if e["event"] == "node_alloc"] == []
    (line,) = [e for e in logs if e["event"] == "request"]
    assert line["status"] == 200 and line["reason"] == "bound" and "request_id" in line
    assert (line["pod"], line["node"], line["uid"]) == ("vms/vm-1", "node-a", "u-1")
    assert (line["cpu_millis"], line["memory_bytes"]) == (1000, 2**30)
    with structlog.testing.capture_logs(processors=[merge]) as logs:
        kube_api.delete_pod("vms", "vm-1")
        await wait_until(lambda: not running.extender.ledger.pods)
    (alloc,) = [e for e in logs if e["event"] == "node_alloc"]
    assert (alloc["action"], alloc["foreign"], alloc["pod"]) == ("remove", False, "vms/vm-1")


async def test_request_lines_filter_at_debug_bind_and_errors_at_info(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """At info, filter and prioritize leave no line (the histogram counts them); bind and a
    refused request do. At debug every request has its line."""
    kube_api.add_node(node_object("node-a"))
    pod = kube_api.add_pod(vm_pod("vm-1", uid="u-1"))
    running = await start_extender()
    merge = structlog.contextvars.merge_contextvars
    calls = (
        ("/filter", filter_body(pod, ["node-a"])),
        ("/prioritize", filter_body(pod, ["node-a"])),
        ("/filter", {"Pod": {}}),  # no node list: 400
        ("/bind", bind_body(pod, "node-a")),
    )
    for level, expected in (
        (logging.INFO, [("/filter", 400), ("/bind", 200)]),
        (logging.DEBUG, [("/filter", 200), ("/prioritize", 200), ("/filter", 400), ("/bind", 200)]),
    ):
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
        with structlog.testing.capture_logs(processors=[merge]) as logs:
            for path, body in calls:
                await (await running.verbs.post(path, json=body)).read()
        lines = [e for e in logs if e["event"] == "request"]
        assert [(e["path"], e["status"]) for e in lines] == expected
        assert [e["log_level"] for e in lines if e["status"] == 200 and e["path"] != "/bind"] == [
            "debug"
        ] * (len(expected) - 2)


async def test_standalone_mode(aiohttp_client: Any) -> None:
    vm = {"vm-autoscaling.io/min-vcpus": "1", "vm-autoscaling.io/max-vcpus": "4"}
    cluster = StandaloneCluster(
        nodes=[StandaloneNode(name="node-a", cpu="10", memory="16Gi")],
        pods=[
            StandalonePod(
                name="vm-1",
                namespace="vms",
                uid="u-1",
                labels=VM_LABELS,
                annotations=vm,
                requests={"cpu": "1", "memory": "1Gi"},
            ),
        ],
    )
    config: Config = make_config()
    app = make_app(config, Deps(registry=CollectorRegistry(), standalone=cluster))
    verbs = await aiohttp_client(app)
    permits = await aiohttp_client(make_permits_app(config, app))
    assert (await verbs.get("/readyz")).status == 200
    pod = vm_pod("vm-1", uid="u-1")
    answer = await (await verbs.post("/filter", json=filter_body(pod, ["node-a"]))).json()
    assert answer["NodeNames"] == ["node-a"]
    assert (await (await verbs.post("/bind", json=bind_body(pod, "node-a"))).json()) == {
        "Error": ""
    }
    body = permit_batch("node-a", uid="u-1", current=1, requested=4)
    answer = await (await permits.post("/v1/permits", json=body, headers=AUTH)).json()
    assert answer["permits"][0]["status"] == "granted"
    state = await (await verbs.get("/state")).json()
    assert state["nodes"][0]["allocated"]["cpuMillis"] == 4000
