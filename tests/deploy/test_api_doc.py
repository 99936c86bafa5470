"""docs/API.md against the code: every route both services register is documented, every
documented endpoint exists, on the listener and default port the doc says; and every JSON key
the extender emits outside kube-scheduler's own wire format is camelCase."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from autoscaler_agent.__main__ import make_app as make_agent_app
from autoscaler_agent.config import HttpSection
from scheduler_extender.config import Config, load_config
from scheduler_extender.http.app import Deps, make_app, make_metrics_app, make_permits_app
from scheduler_extender.kube.standalone import load_cluster
from testkit.manifests import ROOT

API = ROOT / "docs" / "API.md"
EXAMPLES = ROOT / "examples"
_ROW = re.compile(
    r"^\| (scheduler-extender|autoscaler-agent) \| (\w+) \((\d+)\) \| ([A-Z]+) \| (/\S*) \|", re.M
)
_CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$")
# Maps keyed by data (names of namespaces, nodes, zones), not by field names.
_DATA_MAPS = frozenset({"namespaces", "newNodes", "zones", "tags"})


def _apps():
    config = load_config(EXAMPLES / "standalone-config.yaml")
    deps = Deps(
        registry=CollectorRegistry(),
        standalone=load_cluster(EXAMPLES / "standalone-cluster.yaml"),
    )
    verbs = make_app(config, deps)
    return (
        config,
        verbs,
        make_permits_app(config, verbs),
        make_metrics_app(config, verbs),
        make_agent_app(CollectorRegistry()),
    )


def _routes(app) -> set[tuple[str, str]]:
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


def _documented() -> set[tuple[str, str, int, str, str]]:
    return {
        (service, listener, int(port), method, path)
        for service, listener, port, method, path in _ROW.findall(API.read_text())
    }


def test_the_doc_lists_exactly_the_routes_the_services_serve():
    config, verbs, permits, metrics, agent = _apps()
    assert config.listen.metrics is not None
    served = {
        ("scheduler-extender", "verbs", config.listen.verbs.port, m, p) for m, p in _routes(verbs)
    }
    served |= {
        ("scheduler-extender", "permits", config.listen.permits.port, m, p)
        for m, p in _routes(permits)
    }
    served |= {
        ("scheduler-extender", "metrics", config.listen.metrics.port, m, p)
        for m, p in _routes(metrics)
    }
    served |= {("autoscaler-agent", "http", HttpSection().port, m, p) for m, p in _routes(agent)}
    documented = _documented()
    assert served - documented == set(), "served but not in docs/API.md"
    assert documented - served == set(), "in docs/API.md but not served (or on another port)"


def test_the_default_ports_in_the_doc_are_the_defaults():
    defaults = Config().listen
    rows = _documented()
    assert {r[2] for r in rows if r[1] == "verbs"} == {defaults.verbs.port}
    assert {r[2] for r in rows if r[1] == "permits"} == {defaults.permits.port}
    # Off by default; the port the doc gives is the one the manifests set.
    assert defaults.metrics is None
    manifests = load_config(ROOT / "manifests" / "config" / "extender.yaml").listen.metrics
    assert manifests is not None
    assert {r[2] for r in rows if r[1] == "metrics"} == {manifests.port}
    assert {r[2] for r in rows if r[1] == "http"} == {HttpSection().port}


def test_every_endpoint_has_its_section():
    text = API.read_text()
    for _service, _listener, _port, method, path in _documented():
        assert f"### {method} {path}\n" in text, f"no section for {method} {path}"


def _non_camel_keys(value: Any, *, parent: str = "$") -> list[str]:
    bad: list[str] = []
    if isinstance(value, dict):
        for key, child in value.items():
            is_data = parent.rsplit(".", 1)[-1] in _DATA_MAPS
            if not is_data and not _CAMEL.match(key):
                bad.append(f"{parent}.{key}")
            bad += _non_camel_keys(child, parent=f"{parent}.{key}")
    elif isinstance(value, list):
        for item in value:
            bad += _non_camel_keys(item, parent=parent)
    return bad


@pytest.fixture
async def running(aiohttp_client, tmp_path: Path):
    # A quota, so /v1/queue and /state have a namespace to show.
    quota = tmp_path / "quota.yaml"
    quota.write_text("namespaces:\n  vms: {vcpus: 4, memory_bytes: 17179869184}\n")
    text = (EXAMPLES / "standalone-config.yaml").read_text() + f"quota: {{file: {quota}}}\n"
    path = tmp_path / "extender.yaml"
    path.write_text(text)
    config = load_config(path)
    deps = Deps(
        registry=CollectorRegistry(),
        standalone=load_cluster(EXAMPLES / "standalone-cluster.yaml"),
    )
    verbs_app = make_app(config, deps)
    verbs = await aiohttp_client(verbs_app)
    permits = await aiohttp_client(make_permits_app(config, verbs_app))
    return verbs, permits, config.auth.static_token


def _pg1_batch(requested_vcpus: int, **extra: Any) -> dict[str, Any]:
    """The standalone cluster's pg-1 on node-a, at 4 vCPUs, asking for ``requested_vcpus``."""
    pod = {"namespace": "vms", "name": "pg-1", "uid": "00000000-0000-0000-0000-000000000001"}
    four = {"vcpus": 4, "memoryBytes": 4 * 2**30}
    requested = {"vcpus": requested_vcpus, "memoryBytes": 4 * 2**30}
    request = {"pod": pod, "node": "node-a", "current": four, "requested": requested, **extra}
    return {"protocol": {"min": 1, "max": 1}, "node": "node-a", "requests": [request]}


async def test_every_json_the_extender_emits_is_camel_case(running):
    verbs, permits, token = running
    batch = _pg1_batch(6, load={"load1": 5.2})
    answers = {
        "GET /state": await verbs.get("/state"),
        "GET /v1/queue": await verbs.get("/v1/queue"),
        "POST /v1/recommend": await verbs.post("/v1/recommend?diagnostics=full"),
        "POST /v1/recommend (bad)": await verbs.post("/v1/recommend", json={"nodes": 3}),
        "GET /v1/recommendation": await verbs.get("/v1/recommendation"),
        "POST /filter (bad)": await verbs.post("/filter", data=b"nope"),
        "POST /v1/permits": await permits.post(
            "/v1/permits", json=batch, headers={"Authorization": f"Bearer {token}"}
        ),
        "POST /v1/permits (no token)": await permits.post("/v1/permits", json=batch),
    }
    for name, answer in answers.items():
        assert answer.content_type == "application/json", name
        body = await answer.json()
        assert _non_camel_keys(body) == [], name
    queue = await (await verbs.get("/v1/queue")).json()
    assert queue["namespaces"]["vms"]["waiting"][0]["pod"] == "vms/pg-2"
    assert "quotasLoaded" in queue and "admissionTtlSeconds" in queue


def _state_example() -> Any:
    section = API.read_text().split("### GET /state", 1)[1]
    return json.loads(section.split("```json", 1)[1].split("```", 1)[0])


def _shape(value: Any) -> Any:
    """Keys all the way down; a list by its first item."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


async def test_the_state_example_has_the_keys_state_serves(running):
    """/state's example in docs/API.md, key for key, is what the extender serves for the same
    VM once its agent has reported (the standalone cluster's pg-1 on node-a)."""
    verbs, permits, token = running
    answer = await permits.post(
        "/v1/permits", json=_pg1_batch(4), headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status == 200
    served = await (await verbs.get("/state")).json()
    example = _state_example()
    (node,) = [n for n in served["nodes"] if n["name"] == "node-a"]
    assert _shape(example["nodes"][0]) == _shape(node)
    assert set(example) == set(served)
    assert example["nodes"][0]["allocations"][0]["vm"] == node["allocations"][0]["vm"]
