"""The permit port: authentication, authorisation, validation, and that refusals change nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from testkit.kube_api import FakeKubeApi, TokenIdentity, fake_jwt, node_object
from tests.extender.conftest import STATIC_TOKEN, Running, StartExtender, make_config, wait_until
from tests.extender.helpers import (
    AGENT_USER,
    agent_pod,
    permit_batch,
    pod_token,
    vm_pod,
)

TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
AGENT = AGENT_USER


def _cluster(kube_api: FakeKubeApi) -> None:
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_node(node_object("node-b", cpu="8"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a"))
    agent = kube_api.add_pod(agent_pod("node-a"))
    kube_api.add_token("agent-a", pod_token(agent))
    kube_api.add_token("other-audience", pod_token(agent, audiences=("someone-else",)))
    kube_api.add_token("unbound", TokenIdentity(username=AGENT))


def _auth(token: str) -> dict[str, str]:
    # Names given to FakeKubeApi.add_token stand for their JWTs; the static token is itself.
    bearer = token if token == STATIC_TOKEN or "." in token else fake_jwt(token)
    return {"Authorization": f"Bearer {bearer}"}


async def _post(running: Running, body: Any, token: str | None, **kw: Any) -> Any:
    headers = _auth(token) if token is not None else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await running.permits.post("/v1/permits", data=data, headers=headers, **kw)


TOKENREVIEW = {"auth": {"mode": "tokenreview"}}


def _naming_node_b() -> bytes:
    batch = permit_batch("node-a", uid="u-1")
    batch["requests"][0]["node"] = "node-b"
    return json.dumps(batch).encode()


async def test_grant_with_tokenreview(kube_api: FakeKubeApi, start_extender: StartExtender) -> None:
    _cluster(kube_api)
    running = await start_extender(make_config(**TOKENREVIEW))
    response = await _post(running, permit_batch("node-a", uid="u-1"), "agent-a")
    assert response.status == 200, await response.text()
    answer = await response.json()
    assert answer["protocol"] == 1 and answer["node"] == "node-a"
    (permit,) = answer["permits"]
    assert permit["status"] == "granted"
    assert permit["permit"] == {"vcpus": 2, "memoryBytes": 2**30}
    assert running.extender.ledger.pods["u-1"].vcpus == 2


@pytest.mark.parametrize(
    ("token", "status", "says"),
    [
        (None, 401, "missing Authorization"),
        ("nobody-knows-me", 401, "invalid token"),
        (
            fake_jwt("other-audience", audiences=("someone-else",)),
            401,
            "is invalid for the target audiences",
        ),
        ("unbound", 403, "not bound to a pod on a node"),
    ],
    ids=["missing", "bad", "wrong-audience", "not-node-bound"],
)
async def test_unauthenticated_is_refused_and_changes_nothing(
    token: str | None,
    status: int,
    says: str,
    kube_api: FakeKubeApi,
    start_extender: StartExtender,
) -> None:
    _cluster(kube_api)
    running = await start_extender(make_config(**TOKENREVIEW))
    before = await running.state()
    response = await _post(running, permit_batch("node-a", uid="u-1"), token)
    assert response.status == status
    body = await response.json()
    assert says in body["message"]
    assert await running.state() == before


async def test_batch_for_another_node_is_403(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    running = await start_extender(make_config(**TOKENREVIEW))
    before = await running.state()
    response = await _post(running, permit_batch("node-b", uid="u-1"), "agent-a")
    assert response.status == 403
    assert "speaks for node node-a, not for node node-b" in (await response.json())["message"]
    assert await running.state() == before


@pytest.mark.parametrize(
    ("uid", "requested", "error"),
    [("u-zz", 2, (404, "UnknownPod")), ("u-1", 99, (400, "OutOfBounds"))],
    ids=["unknown-pod", "out-of-bounds"],
)
async def test_one_vms_refusal_is_an_item_error_with_its_own_status(
    uid: str,
    requested: int,
    error: tuple[int, str],
    kube_api: FakeKubeApi,
    start_extender: StartExtender,
) -> None:
    _cluster(kube_api)
    running = await start_extender()
    before = await running.state()
    response = await _post(
        running, permit_batch("node-a", uid=uid, requested=requested), STATIC_TOKEN
    )
    assert response.status == 200
    (permit,) = (await response.json())["permits"]
    assert (permit["error"]["status"], permit["error"]["reason"]) == error
    assert permit["permit"] is None and permit["status"] is None
    assert await running.state() == before


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{nope", "malformed JSON"),
        (
            json.dumps({"protocol": {"min": 1, "max": 1}, "node": 5, "requests": []}).encode(),
            "$.node",
        ),
        (
            json.dumps(permit_batch("node-a", uid="u-1", current=-1)).encode(),
            "$.requests[0].current.vcpus",
        ),
        (
            json.dumps(permit_batch("node-a", uid="u-1", protocol=(3, 4))).encode(),
            "agent speaks v3..v4, extender speaks v1..v2",
        ),
        (_naming_node_b(), "names node node-b inside a batch for node node-a"),
    ],
    ids=["malformed-json", "wrong-type", "negative", "version-mismatch", "node-mismatch"],
)
async def test_bad_requests_are_400_naming_the_problem(
    body: bytes, says: str, kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    running = await start_extender()
    before = await running.state()
    response = await _post(running, body, STATIC_TOKEN)
    assert response.status == 400
    assert says in (await response.json())["message"]
    assert await running.state() == before


async def test_oversized_body_is_413(kube_api: FakeKubeApi, start_extender: StartExtender) -> None:
    _cluster(kube_api)
    running = await start_extender(make_config(limits={"permits_max_body_bytes": 1024}))
    before = await running.state()
    response = await _post(running, b" " * 4096, STATIC_TOKEN)
    assert response.status == 413
    assert (await response.json())["reason"] == "BodyTooLarge"
    assert await running.state() == before


async def test_everything_is_503_before_the_first_lists(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    kube_api.fail_next(503, path="/api/v1/pods", times=10_000)
    running = await start_extender(wait_synced=False)
    # The nodes list is in (the state below shows node-a); only the pods list never comes.
    await wait_until(lambda: running.extender.has_nodes)
    response = await _post(running, permit_batch("node-a", uid="u-1"), STATIC_TOKEN)
    assert response.status == 503
    assert response.headers["Retry-After"] == "1"
    assert (await response.json())["reason"] == "NotSynced"
    for verb in ("filter", "prioritize", "bind", "preempt"):
        assert (await running.verbs.post(f"/{verb}", data=b"{}")).status == 503
    assert (await running.verbs.get("/readyz")).status == 503
    assert (await running.permits.get("/readyz")).status == 503
    assert (await running.verbs.get("/healthz")).status == 200
    assert (await running.state())["nodes"][0]["allocations"] == []


async def test_identity_cache_reviews_each_token_once(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    running = await start_extender(make_config(**TOKENREVIEW))
    body = permit_batch("node-a", uid="u-1", current=1, requested=1)
    # Concurrent first requests share one review; later ones hit the cache.
    first = await asyncio.gather(*(_post(running, body, "agent-a") for _ in range(10)))
    rest = [await _post(running, body, "agent-a") for _ in range(20)]
    assert {r.status for r in [*first, *rest]} == {200}
    # A bad token is remembered too (negative cache).
    bad = [await _post(running, body, "nobody-knows-me") for _ in range(5)]
    assert {r.status for r in bad} == {401}
    reviews = [r for r in kube_api.requests if r.path == TOKENREVIEWS]
    assert len(reviews) == 2
    assert reviews[0].body["spec"]["audiences"] == ["vm-autoscaling-extender"]


async def test_every_answer_carries_the_extenders_epoch_and_an_empty_batch_learns_it(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """A restarted extender has a new epoch; an agent learns it even with nothing to ask."""
    _cluster(kube_api)
    empty = {"protocol": {"min": 1, "max": 1}, "node": "node-a", "requests": []}
    first = await start_extender(make_config(**TOKENREVIEW))
    answer = await (await _post(first, empty, "agent-a")).json()
    assert answer["permits"] == [] and len(answer["epoch"]) == 32
    again = await (await _post(first, permit_batch("node-a", uid="u-1"), "agent-a")).json()
    assert again["epoch"] == answer["epoch"]
    restarted = await start_extender(make_config(**TOKENREVIEW))
    other = await (await _post(restarted, empty, "agent-a")).json()
    assert other["epoch"] != answer["epoch"]
