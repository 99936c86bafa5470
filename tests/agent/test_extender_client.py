"""The batched permit client against the fake extender over real HTTP."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import structlog.testing
from aiohttp import web

from autoscaler_agent.extender_client import (
    ExtenderClient,
    ExtenderError,
    ExtenderProtocolError,
    ExtenderRejected,
    ExtenderUnavailable,
    PermitBatcher,
    PermitItemError,
    TokenFile,
)
from protocol.permits import ItemError, PodRef, ResourceRequest, Resources
from testkit.agent_fakes import FakeExtender, serving
from testkit.ports import free_port
from tests.agent.conftest import NODE, TOKEN, eventually

GiB = 2**30


def req(name, current=2, requested=4, last=None):
    return ResourceRequest(
        pod=PodRef(namespace="default", name=name, uid=f"uid-{name}"),
        node=NODE,
        current=Resources(vcpus=current, memory_bytes=GiB),
        requested=Resources(vcpus=requested, memory_bytes=GiB),
        last_permit=Resources(vcpus=last, memory_bytes=GiB) if last else None,
    )


@pytest.fixture
async def setup(tmp_path):
    ext = FakeExtender(node=NODE, capacity_vcpus=16, token=TOKEN)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    async with serving(ext.app()) as url, aiohttp.ClientSession() as session:
        client = ExtenderClient(
            session, base_url=url, node=NODE, token=TokenFile(token), timeout_seconds=0.3
        )
        yield ext, client, token, session, url


async def test_batcher_coalesces_concurrent_requests(setup):
    ext, client, *_ = setup
    ext.capacity_vcpus = 80
    batcher = PermitBatcher(client, window_seconds=0.005)
    answers = await asyncio.gather(*(batcher.request(req(f"vm{i}")) for i in range(20)))
    assert [a.permit.vcpus for a in answers] == [4] * 20
    assert len(ext.batches) == 1 and len(ext.batches[0].requests) == 20
    assert ext.batches[0].protocol.max == 2
    # Every request is numbered (protocol v2), and a VM's next one is numbered higher.
    seqs = {r.pod.uid: r.seq for r in ext.batches[0].requests}
    assert None not in seqs.values()
    await batcher.request(req("vm0"))
    (again,) = ext.batches[1].requests
    assert again.seq is not None and again.seq > seqs[again.pod.uid]
    await batcher.close()


async def test_token_is_reread_when_it_rotates(setup):
    ext, client, token, *_ = setup
    await client.post_batch([req("a")])
    ext.token = "rotated"
    token.write_text("rotated")
    await client.post_batch([req("a", current=4, requested=5)])
    ext.token = "other"
    with pytest.raises(ExtenderRejected) as e:
        await client.post_batch([req("a")])
    assert e.value.status == 401 and "bad_token" in str(e.value)


async def test_other_node_is_forbidden(setup):
    ext, client, *_ = setup
    ext.node = "node-b"
    with pytest.raises(ExtenderRejected) as e:
        await client.post_batch([req("a")])
    assert e.value.status == 403


@pytest.mark.parametrize("status", [500, 503, 429], ids=["500", "503", "429-own-budget"])
async def test_5xx_is_unavailable(setup, status):
    ext, client, *_ = setup
    ext.fail_status = status
    with pytest.raises(ExtenderUnavailable):
        await client.post_batch([req("a")])


async def test_timeout_and_refused_are_unavailable(setup):
    ext, client, _, session, _ = setup
    ext.delay_seconds = 0.6
    with pytest.raises(ExtenderUnavailable, match="no answer"):
        await client.post_batch([req("a")])
    refused = ExtenderClient(
        session,
        base_url=f"http://127.0.0.1:{free_port()}",
        node=NODE,
        token=TokenFile(None),
        timeout_seconds=1.0,
    )
    with pytest.raises(ExtenderUnavailable):
        await refused.post_batch([req("a")])


async def test_item_error_and_missing_item(setup):
    ext, client, *_ = setup
    ext.item_errors["uid-b"] = ItemError(status=404, reason="unknown_pod", message="not synced")
    batcher = PermitBatcher(client, window_seconds=0.005)
    a, b = await asyncio.gather(
        batcher.request(req("a")), batcher.request(req("b")), return_exceptions=True
    )
    assert a.permit.vcpus == 4
    assert isinstance(b, PermitItemError) and b.item.reason == "unknown_pod"
    await batcher.close()


async def test_unreadable_answer_is_a_protocol_error():
    async def bad(request):
        return web.Response(text='{"protocol": 1, "node": "x"}', content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/permits", bad)
    async with serving(app) as url, aiohttp.ClientSession() as session:
        client = ExtenderClient(
            session, base_url=url, node=NODE, token=TokenFile(None), timeout_seconds=1
        )
        with pytest.raises(ExtenderProtocolError, match="permits"):
            await client.post_batch([req("a")])
        batcher = PermitBatcher(client, window_seconds=0)
        with pytest.raises(ExtenderProtocolError):
            await batcher.request(req("a"))
        await batcher.close()


async def test_the_epoch_check_says_once_each_why_it_fails_and_outlives_any_error(setup):
    """An extender that fails over: the node's log says once each why the checks fail (a
    failover's timeouts or 503s may go on as a refusal, which is what an operator must read)
    and when an answer (the new epoch) came; an error nobody expected (here a listener's) is
    logged and does not end the only way a node of steady VMs learns of a new extender. Every
    failed check is handed on (the agent counts it in ``extender_errors_total``), each answer
    not."""
    ext, client, *_ = setup
    ext.fail_status = 503

    def listener() -> None:
        raise RuntimeError("a listener's bug")

    unsubscribe = client.epochs.subscribe(listener)
    with structlog.testing.capture_logs() as logs:
        failures: list[ExtenderError] = []
        checker = asyncio.create_task(
            client.keep_epoch_fresh(interval_seconds=0.02, failed=failures.append)
        )
        try:
            await eventually(lambda: ext.failed_answers >= 3)  # several checks, all 503
            ext.fail_status, refused = 401, ext.failed_answers
            await eventually(lambda: ext.failed_answers >= refused + 3)  # then refusals
            ext.fail_status = None
            await eventually(lambda: client.epochs.epoch == "epoch-1")
            unsubscribe()
            ext.epoch = "epoch-2"
            await eventually(lambda: client.epochs.epoch == "epoch-2")
        finally:
            checker.cancel()
            await asyncio.gather(checker, return_exceptions=True)
    events = [e["event"] for e in logs if e["log_level"] != "debug"]
    assert events == [
        "extender_unreachable",
        "extender_unreachable",  # the refusals: new news, not a repeat
        "extender_epoch_changed",
        "epoch_check_error",  # the listener raised: logged, and the checks went on
        "extender_epoch_changed",
        "extender_reachable",  # the first answer since the failures (the one with epoch-2)
    ], logs
    warned = [e for e in logs if e["event"] == "extender_unreachable"]
    assert warned[0]["kind"] == "unavailable" and "503" in warned[0]["error"], warned
    assert warned[1]["kind"] == "rejected" and "401" in warned[1]["error"], warned
    assert warned[0]["failing_seconds"] == 0 < warned[1]["failing_seconds"], warned
    # Counted by the fake's answers, not when the test stopped failing them: a check may be
    # in flight then, refused, and handed on after.
    assert ext.failed_answers >= 2 and len(failures) == ext.failed_answers, failures
    assert [e.kind for e in failures] == ["unavailable"] * refused + ["rejected"] * (
        len(failures) - refused
    ), failures
