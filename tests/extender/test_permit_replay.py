"""Replayed and reordered permit requests cannot undo a newer decision (issue 16, protocol v2).

The attack from the issue: a grow to 4, then a shrink to 1; the grow, replayed, re-reserved 4
vCPUs. The agent's own client (``autoscaler_agent.extender_client``) against the real
extender app shows that a live agent is never locked out: not by an extender restart, not by
its own restart with a clock that stepped back.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import structlog

from autoscaler_agent.extender_client import ExtenderClient, TokenFile
from protocol.codec import decode
from protocol.permits import ResourceRequest
from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import STATIC_TOKEN, Running, StartExtender
from tests.extender.helpers import (
    permit_batch,
    vm_pod,
)


def _cluster(kube_api: FakeKubeApi) -> None:
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", max_vcpus=4))


def _v2(seq: int | None, **kw: Any) -> dict[str, Any]:
    batch = permit_batch("node-a", uid="u-1", protocol=(1, 2), **kw)
    if seq is not None:
        batch["requests"][0]["seq"] = seq
    return batch


async def _post(running: Running, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = await running.permits.post(
        "/v1/permits",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {STATIC_TOKEN}"},
    )
    return response.status, await response.json()


async def test_a_replayed_grow_after_a_shrink_is_refused(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    running = await start_extender()
    grow = _v2(10, current=1, requested=4)
    status, answer = await _post(running, grow)
    assert status == 200 and answer["protocol"] == 2
    assert answer["permits"][0]["seq"] == 10 and answer["permits"][0]["status"] == "granted"
    assert (await _post(running, _v2(11, current=4, requested=1)))[0] == 200
    assert running.extender.ledger.pods["u-1"].vcpus == 1
    # The grow again, byte for byte.
    merge = structlog.contextvars.merge_contextvars
    with structlog.testing.capture_logs(processors=[merge]) as logs:
        status, answer = await _post(running, grow)
    assert status == 200
    # The one line of the call counts the refusal, and names the batch (decoded by the desk).
    (line,) = [e for e in logs if e["event"] == "request"]
    assert (line["reason"], line["node"], line["vms"]) == ({"stale": 1}, "node-a", 1)
    (permit,) = answer["permits"]
    assert permit["error"]["status"] == 409 and permit["error"]["reason"] == "StaleSequence"
    assert permit["seq"] == 11 and permit["permit"] is None
    assert running.extender.ledger.pods["u-1"].vcpus == 1


async def test_v1_is_understood_until_the_vm_has_sent_a_seq(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    running = await start_extender()
    v1 = permit_batch("node-a", uid="u-1", current=1, requested=2)
    status, answer = await _post(running, v1)
    assert status == 200 and answer["protocol"] == 1
    assert answer["permits"][0]["status"] == "granted"
    assert (await _post(running, _v2(5, current=2, requested=1)))[0] == 200
    # Now a seq-less request for this VM could be a replay of an old v1 one: refused, clearly.
    status, answer = await _post(running, permit_batch("node-a", uid="u-1", current=1, requested=3))
    assert answer["permits"][0]["error"]["reason"] == "SequenceRequired"
    assert running.extender.ledger.pods["u-1"].vcpus == 1
    # A v2 request without a seq is malformed for that VM alone.
    status, answer = await _post(running, _v2(None, current=1, requested=1))
    assert answer["permits"][0]["error"]["reason"] == "SequenceMissing"


async def test_reordered_requests_within_one_batch_keep_the_newer(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    running = await start_extender()
    batch = _v2(20, current=1, requested=1)
    older = {**batch["requests"][0], "seq": 19, "requested": {"vcpus": 4, "memoryBytes": 2**30}}
    batch["requests"].append(older)
    status, answer = await _post(running, batch)
    assert status == 200
    assert [p.get("error") and p["error"]["reason"] for p in answer["permits"]] == [
        None,
        "StaleSequence",
    ]
    assert running.extender.ledger.pods["u-1"].vcpus == 1


async def test_the_agents_client_survives_restarts_on_either_side(
    kube_api: FakeKubeApi, start_extender: StartExtender, tmp_path: Any
) -> None:
    _cluster(kube_api)
    token = tmp_path / "token"
    token.write_text(STATIC_TOKEN)
    body = permit_batch("node-a", uid="u-1", current=1, requested=2)
    request = decode(ResourceRequest, json.dumps(body["requests"][0]).encode())
    clock = [1_000_000]
    async with aiohttp.ClientSession() as session:

        def client(running: Running) -> ExtenderClient:
            url = str(running.permits.make_url(""))
            return ExtenderClient(
                session,
                base_url=url,
                node="node-a",
                token=TokenFile(token),
                timeout_seconds=5,
                wall_clock_us=lambda: clock[0],
            )

        first = await start_extender()
        agent = client(first)
        assert (await agent.post_batch([request]))["u-1"].permit is not None
        # The extender restarts: it knows no seqs, and takes the agent's next one.
        second = await start_extender()
        agent = client(second)
        assert (await agent.post_batch([request]))["u-1"].seq == 1_000_000
        clock[0] += 5_000_000
        assert (await agent.post_batch([request]))["u-1"].seq == 6_000_000
        # The agent restarts with its clock stepped back a minute: refused once, with the floor,
        # and its next request goes through.
        clock[0] -= 60_000_000
        agent = client(second)
        refused = (await agent.post_batch([request]))["u-1"]
        assert refused.error is not None and refused.error.reason == "StaleSequence"
        assert refused.seq == 6_000_000
        again = (await agent.post_batch([request]))["u-1"]
        assert again.error is None and again.seq == 6_000_001
