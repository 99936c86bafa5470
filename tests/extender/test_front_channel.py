"""The permit front's channel is a transport: across it the permit port answers as in process.

The same calls (every status a caller can get, and the probes) go to two extenders, each on a
fake API server of its own holding the same cluster: one whose permit port calls the desk in
process (``make_permits_app``), one whose permit front reaches it across the socketpair
(``ChannelDesk`` to ``MainSide``, as ``serve`` runs them, only in one process). Their answers,
statuses, bodies and headers, must be the same, call for call. What the permit port decides is
tested in process (test_permits.py, test_permit_auth.py, test_permit_replay.py, test_ops.py);
what only the channel does (its end, the merged /metrics, the real two processes) is in
test_permit_front.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from testkit.kube_api import FakeKubeApi, TokenIdentity, fake_jwt, node_object, pod_object
from tests.extender.conftest import STATIC_TOKEN, Running, launch, make_config, wait_until
from tests.extender.helpers import agent_pod, permit_batch, pod_token, vm_pod

# The answers carry the extender's epoch, one per extender: the one field that must differ.
_OWN = ("epoch",)


def _cluster(api: FakeKubeApi) -> None:
    api.add_node(node_object("node-a", cpu="6"))
    api.add_node(node_object("node-b", cpu="6"))
    api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", max_vcpus=4))
    api.add_pod(vm_pod("vm-2", uid="u-2", node="node-a", max_vcpus=4))
    api.add_token("agent-a", pod_token(api.add_pod(agent_pod("node-a"))))
    tenant = pod_object("tenant", namespace="vms", uid="u-t", node_name="node-a", cpu="10m")
    tenant["spec"]["serviceAccountName"] = "default"
    tenant["status"]["phase"] = "Running"
    api.add_token("tenant", pod_token(api.add_pod(tenant)))
    api.add_token("unbound", TokenIdentity(username="system:serviceaccount:x:y"))


def _v2(uid: str, seq: int, current: int, requested: int, last: int | None) -> dict[str, Any]:
    batch = permit_batch(
        "node-a",
        uid=uid,
        name=uid.replace("u-", "vm-"),
        current=current,
        requested=requested,
        last_permit=last,
        protocol=(1, 2),
    )
    batch["requests"][0]["seq"] = seq
    return batch


def _bearer(name: str) -> dict[str, str]:
    """The static token is itself; the other names stand for their JWTs (``add_token``)."""
    return {"Authorization": f"Bearer {name if name == STATIC_TOKEN else fake_jwt(name)}"}


Call = tuple[str, str, str | None, Any]

# (method, path, token, body): one of each answer the permit port gives, in an order whose
# answers depend on the calls before them (the node's room, a shrink, a replay).
CALLS: list[Call] = [
    ("GET", "/healthz", None, None),
    ("GET", "/readyz", None, None),
    ("POST", "/v1/permits", "agent-a", permit_batch("node-a", uid="u-1", requested=2)),
    ("POST", "/v1/permits", "agent-a", _v2("u-2", 10, 1, 4, 1)),  # partial: 1 of 3 is left
    ("POST", "/v1/permits", "agent-a", _v2("u-2", 11, 2, 1, 2)),  # shrink
    ("POST", "/v1/permits", "agent-a", _v2("u-2", 10, 1, 4, 1)),  # the grow replayed
    ("POST", "/v1/permits", None, permit_batch("node-a", uid="u-1")),
    ("POST", "/v1/permits", "nobody-knows-me", permit_batch("node-a", uid="u-1")),
    ("POST", "/v1/permits", "unbound", permit_batch("node-a", uid="u-1")),
    ("POST", "/v1/permits", "tenant", permit_batch("node-a", uid="u-1", current=3, requested=1)),
    ("POST", "/v1/permits", "agent-a", permit_batch("node-b", uid="u-1")),
    ("POST", "/v1/permits", "agent-a", b"{nope"),
    ("POST", "/v1/permits", "agent-a", permit_batch("node-a", uid="u-1", protocol=(3, 4))),
    ("POST", "/v1/permits", "agent-a", b"[" * 2048),  # beyond permits_max_body_bytes
    ("POST", "/v1/permits", STATIC_TOKEN, permit_batch("node-a", uid="u-1")),
]


@pytest.fixture
async def other_kube_api() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi() as api:
        yield api


@pytest.fixture
async def cleanups() -> AsyncIterator[list[Callable[[], Awaitable[None]]]]:
    pending: list[Callable[[], Awaitable[None]]] = []
    yield pending
    for cleanup in reversed(pending):
        await cleanup()


async def _answers(running: Running, calls: list[Call]) -> list[tuple[int, str, Any]]:
    """Each call's status, its Content-Type and Retry-After, and its body (JSON decoded)."""
    answers = []
    for method, path, token, body in calls:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        headers = _bearer(token) if token is not None else {}
        response = await running.permits.request(method, path, data=data, headers=headers)
        text = await response.text()
        answer = json.loads(text) if response.content_type == "application/json" else text
        if isinstance(answer, dict):
            answer = {k: v for k, v in answer.items() if k not in _OWN}
        kept = {k: response.headers.get(k) for k in ("Content-Type", "Retry-After")}
        answers.append((response.status, json.dumps(kept), answer))
    return answers


async def test_the_channel_answers_every_call_as_the_desk_in_process(
    kube_api: FakeKubeApi,
    other_kube_api: FakeKubeApi,
    aiohttp_client: Any,
    cleanups: list[Callable[[], Awaitable[None]]],
) -> None:
    config = make_config(auth={"mode": "tokenreview"}, limits={"permits_max_body_bytes": 1024})
    answers = {}
    for via, api in (("local", kube_api), ("channel", other_kube_api)):
        _cluster(api)
        running = await launch(api, aiohttp_client, cleanups, config, via=via)
        answers[via] = await _answers(running, CALLS)
    assert answers["channel"] == answers["local"]
    # And the calls reached every answer they are there for.
    statuses = [status for status, _, _ in answers["local"]]
    assert statuses == [200, 200, 200, 200, 200, 200, 401, 401, 403, 403, 403, 400, 400, 413, 401]
    permits = [a[2]["permits"][0]["status"] for a in answers["local"][2:6]]
    assert permits == ["denied", "partial", "released", None]  # None: refused, 409 in "error"
    assert answers["local"][5][2]["permits"][0]["error"]["reason"] == "StaleSequence"


async def test_before_the_first_lists_the_channel_answers_503_as_in_process(
    kube_api: FakeKubeApi,
    other_kube_api: FakeKubeApi,
    aiohttp_client: Any,
    cleanups: list[Callable[[], Awaitable[None]]],
) -> None:
    calls: list[Call] = [
        ("POST", "/v1/permits", STATIC_TOKEN, permit_batch("node-a", uid="u-1")),
        ("GET", "/readyz", None, None),
        ("GET", "/healthz", None, None),
    ]
    answers = {}
    for via, api in (("local", kube_api), ("channel", other_kube_api)):
        _cluster(api)
        api.fail_next(503, path="/api/v1/pods", times=10_000)  # the pods list never comes
        running = await launch(api, aiohttp_client, cleanups, via=via, wait_synced=False)
        await wait_until(lambda running=running: running.extender.has_nodes)
        answers[via] = await _answers(running, calls)
    assert answers["channel"] == answers["local"]
    assert [status for status, _, _ in answers["local"]] == [503, 503, 200]
    assert json.loads(answers["local"][0][1])["Retry-After"] == "1"
