"""The verbs listener's fast path (``http/fast.py``): kube-scheduler's plain filter, prioritize
and bind calls are answered off the connection, everything else by aiohttp, and either way
the answer and the #16 guards are the same.

Real listeners (``start_listeners``) on loopback, raw HTTP/1.1 bytes so that each test says
exactly what goes over the wire.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from scheduler_extender.http.connections import GuardedSite
from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import Start, open_connections, wait_until
from tests.extender.helpers import bind_body, filter_body, vm_pod

# Generous: what is awaited takes milliseconds, or the short timeouts the tests set.
WITHIN = 5.0

Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter


def request(
    path: str, body: bytes | dict[str, Any] | list[Any], *, headers: str = "", length: int = -1
) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    size = len(data) if length < 0 else length
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n{headers}\r\n"
    ).encode() + data


async def answer(reader: Reader) -> tuple[int, dict[str, str], bytes]:
    """One response: its status, headers (lower-case names) and body."""
    async with asyncio.timeout(WITHIN):
        status_line = await reader.readline()
        assert status_line.startswith(b"HTTP/1.1 "), status_line
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


async def exchange(conn: tuple[Reader, Writer], data: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = conn
    writer.write(data)
    await writer.drain()
    return await answer(reader)


def fast_of(site: GuardedSite) -> Any:
    assert site.fast is not None
    return site.fast


async def _cluster(kube_api: FakeKubeApi, pods: int) -> list[dict[str, Any]]:
    kube_api.add_node(node_object("node-b", cpu="2"))
    made = [kube_api.add_pod(vm_pod(f"vm-{i}", uid=f"uid-{i}")) for i in range(pods)]
    return made


async def test_plain_calls_are_answered_on_the_fast_path_as_aiohttp_answers_them(
    listeners: Start, kube_api: FakeKubeApi
) -> None:
    verbs, _ = await listeners()
    pods = await _cluster(kube_api, 2)
    nodes = ["node-a", "node-b", "node-gone"]
    non_cache = {"Pod": pods[0], "Nodes": {"items": [node_object("node-a", cpu="8")]}}
    calls: list[tuple[str, bytes | dict[str, Any]]] = [
        ("/filter", filter_body(pods[0], nodes)),
        ("/filter", non_cache),
        ("/prioritize", filter_body(pods[0], nodes)),
        ("/filter", b"{not json"),
        ("/prioritize", {"Pod": 7}),
        ("/bind", {"PodName": 1}),
        ("/filter", {"Pod": pods[0]}),  # neither NodeNames nor Nodes
    ]
    async with open_connections(verbs.bound_port, 2) as (fast, slow):
        for path, body in calls:
            before = fast_of(verbs).answered
            # The same call twice: plainly, and with a header that hands it to aiohttp (which
            # takes identity, as the fast path would have).
            plain = await exchange(fast, request(path, body))
            assert fast_of(verbs).answered == before + 1, path
            handed = await exchange(
                slow, request(path, body, headers="Content-Encoding: identity\r\n")
            )
            assert fast_of(verbs).answered == before + 1, path
            assert plain[0] == handed[0], (path, plain, handed)
            assert plain[2] == handed[2], (path, plain, handed)
            assert plain[1]["content-type"].startswith("application/json")
            assert len(plain[1]["x-request-id"]) == 32
        # bind: a pod each way, and both are bound for real.
        bound_fast = await exchange(fast, request("/bind", bind_body(pods[0], "node-a")))
        bound_slow = await exchange(
            slow,
            request(
                "/bind", bind_body(pods[1], "node-a"), headers="Content-Encoding: identity\r\n"
            ),
        )
    assert bound_fast[0] == bound_slow[0] == 200
    assert json.loads(bound_fast[2]) == json.loads(bound_slow[2]) == {"Error": ""}
    bindings = [r for r in kube_api.requests if r.path.endswith("/binding")]
    assert sorted(r.body["metadata"]["uid"] for r in bindings) == ["uid-0", "uid-1"]


async def test_the_callers_request_id_is_echoed_and_errors_keep_their_headers(
    listeners: Start, kube_api: FakeKubeApi
) -> None:
    verbs, _ = await listeners()
    pods = await _cluster(kube_api, 1)
    async with open_connections(verbs.bound_port, 1) as (conn,):
        ok = await exchange(
            conn,
            request("/filter", filter_body(pods[0], ["node-a"]), headers="X-Request-Id: r-1\r\n"),
        )
        bad = await exchange(conn, request("/filter", b"[]", headers="X-Request-Id: r-2\r\n"))
    assert (ok[0], ok[1]["x-request-id"]) == (200, "r-1")
    assert (bad[0], bad[1]["x-request-id"]) == (400, "r-2")
    assert json.loads(bad[2])["error"] == "ProtocolError"


async def test_pipelined_and_split_calls_are_answered_in_order(
    listeners: Start, kube_api: FakeKubeApi
) -> None:
    verbs, _ = await listeners()
    pods = await _cluster(kube_api, 1)
    one = request("/filter", filter_body(pods[0], ["node-a"]))
    two = request("/prioritize", filter_body(pods[0], ["node-a", "node-b"]))
    async with open_connections(verbs.bound_port, 1) as (conn,):
        reader, writer = conn
        writer.write(one + two)  # both at once
        first, second = await answer(reader), await answer(reader)
        # One call in three pieces, the head cut in the middle too.
        for piece in (two[:20], two[20:120], two[120:]):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)
        third = await answer(reader)
    assert json.loads(first[2])["NodeNames"] == ["node-a"]
    assert [h["Host"] for h in json.loads(second[2])] == ["node-a", "node-b"]
    assert third[2] == second[2]
    assert fast_of(verbs).answered == 3


async def test_what_is_not_a_plain_call_gets_aiohttps_answer(
    listeners: Start, kube_api: FakeKubeApi
) -> None:
    verbs, _ = await listeners(limits={"body_timeout_seconds": 0.3})
    pods = await _cluster(kube_api, 1)
    body = json.dumps(filter_body(pods[0], ["node-a"])).encode()
    async with open_connections(verbs.bound_port, 4) as (gz, big, chunked, slow):
        # Compressed: refused, as kube-scheduler never compresses.
        assert (await exchange(gz, request("/filter", body, headers="Content-Encoding: gzip\r\n")))[
            0
        ] == 415
        # Over bind's limit, refused before it is read.
        assert (await exchange(big, request("/bind", b"", length=2**20)))[0] == 413
        # Chunked: aiohttp reads it, and answers as the fast path would have.
        head = (
            b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n"
        )
        chunked_body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        status, _, answered = await exchange(chunked, head + chunked_body)
        assert status == 200 and json.loads(answered)["NodeNames"] == ["node-a"]
        # A body that stops arriving: aiohttp takes it over and its body timeout answers.
        status, _, answered = await exchange(slow, request("/filter", body[:10], length=len(body)))
        assert status == 408, answered
    assert fast_of(verbs).answered == 0
    assert fast_of(verbs).bodies.in_flight == 0


async def test_refusals_from_the_head_are_answered_unread_and_as_aiohttp_answers_them(
    listeners: Start, kube_api: FakeKubeApi
) -> None:
    verbs, _ = await listeners(limits={"verbs_max_body_bytes": 8192, "bind_max_body_bytes": 2048})
    pods = await _cluster(kube_api, 1)
    body = json.dumps(filter_body(pods[0], ["node-a"])).encode()
    # (path, headers, declared length): only the head and a few bytes of the body are sent.
    refused = [
        ("/filter", "Content-Encoding: gzip\r\n", len(body), 415),
        ("/prioritize", "Content-Encoding: Deflate \r\n", len(body), 415),
        ("/bind", "Content-Encoding: br\r\nContent-Encoding: gzip\r\n", 2**36, 415),
        ("/filter", "", 2**30, 413),
        ("/bind", "X-Request-Id: mine\r\n", 2049, 413),
    ]
    for path, headers, length, status in refused:
        data = request(path, body[:10], headers=headers, length=length)
        async with open_connections(verbs.bound_port, 2) as (fast, handed):
            # aiohttp's answer to the same bytes, on a connection a first call handed to it.
            first = request("/filter", body, headers="Content-Encoding: identity\r\n")
            assert (await exchange(handed, first))[0] == 200
            ours, theirs = await exchange(fast, data), await exchange(handed, data)
            assert ours[0] == theirs[0] == status, (path, ours, theirs)
            assert ours[2] == theirs[2], (path, ours, theirs)
            assert ours[1]["connection"] == "close"
            if "mine" in headers:
                assert ours[1]["x-request-id"] == "mine"
            # The rest of the body is never waited for: the connection is closed after it.
            async with asyncio.timeout(WITHIN):
                assert await fast[0].read() == b""
    assert fast_of(verbs).refused == len(refused)
    assert fast_of(verbs).answered == 0
    assert fast_of(verbs).bodies.in_flight == 0
    # Identity is not compressed: a plain call, here or by aiohttp, both fine.
    async with open_connections(verbs.bound_port, 1) as (conn,):
        plain = request("/filter", body, headers="Content-Encoding: identity\r\n")
        assert (await exchange(conn, plain))[0] == 200


async def test_before_the_lists_are_in_every_call_gets_the_same_503_unread(
    listeners: Start, kube_api: FakeKubeApi
) -> None:
    kube_api.fail_next(503, path="/api/v1/pods", times=10_000)  # the pods list never comes
    verbs, _ = await listeners(wait_synced=False)
    body = json.dumps(filter_body(vm_pod("vm-0", uid="uid-0"), ["node-a"])).encode()
    calls = [
        ("/filter", "", len(body)),
        ("/bind", "", len(body)),
        ("/filter", "Content-Encoding: gzip\r\n", len(body)),  # 503 first, as aiohttp
        ("/prioritize", "", 2**30),
    ]
    for path, headers, length in calls:
        data = request(path, body[:10], headers=headers, length=length)
        async with open_connections(verbs.bound_port, 2) as (fast, handed):
            first = request("/filter", body[:10], headers="Content-Encoding: identity\r\n")
            # aiohttp's answer, on a connection a first call hands to it (the same for any verb).
            theirs = await exchange(handed, first)
            ours = await exchange(fast, data)
            assert ours[0] == theirs[0] == 503, (path, ours, theirs)
            assert ours[2] == theirs[2] and json.loads(ours[2])["reason"] == "NotSynced"
            assert ours[1]["retry-after"] == theirs[1]["retry-after"]
            assert ours[1]["connection"] == "close"
            async with asyncio.timeout(WITHIN):  # the body is not waited for
                assert await fast[0].read() == b""
    assert fast_of(verbs).answered == 0 and fast_of(verbs).refused == len(calls)


async def test_the_fast_path_keeps_the_connection_guards(
    listeners: Start, kube_api: FakeKubeApi
) -> None:
    # Far apart, so that each connection is closed for one reason only.
    verbs, _ = await listeners(
        verbs={"port": 1, "idle_timeout_seconds": 1.0, "header_timeout_seconds": 0.2}
    )
    pods = await _cluster(kube_api, 1)
    async with open_connections(verbs.bound_port, 3) as (idle, dribble, used):
        # A head that never completes is closed after the header timeout...
        dribble[1].write(b"POST /filter HTTP/1.1\r\nHost: x\r\n")
        # ...a connection that never sends, and one quiet after its answer, after the idle one.
        assert (await exchange(used, request("/filter", filter_body(pods[0], ["node-a"]))))[
            0
        ] == 200
        for reader, _ in (idle, dribble, used):
            async with asyncio.timeout(WITHIN):
                assert await reader.read() == b""
    await wait_until(lambda: verbs.open_connections == 0)
    assert verbs.heads_timed_out == 1


async def test_a_busy_fast_connection_is_never_evicted_and_a_full_house_is_refused(
    listeners: Start, kube_api: FakeKubeApi
) -> None:
    verbs, _ = await listeners(verbs={"port": 1, "max_connections": 2})
    pods = await _cluster(kube_api, 1)
    body = json.dumps(filter_body(pods[0], ["node-a"])).encode()
    # Two calls whose bodies are still arriving: both connections are busy.
    async with open_connections(
        verbs.bound_port, 2, request("/filter", body[:5], length=len(body))
    ) as busy:
        await wait_until(lambda: verbs.open_connections == 2)
        async with open_connections(verbs.bound_port, 1) as (refused,):
            assert (await refused[0].read()).startswith(b"HTTP/1.1 503 ")
        assert verbs.refused == 1 and verbs.evicted == 0
        for reader, writer in busy:
            writer.write(body[5:])
            status, _, answered = await answer(reader)
            assert status == 200 and json.loads(answered)["NodeNames"] == ["node-a"]


async def test_stopping_answers_the_bind_in_flight_and_closes_idle_fast_connections(
    listeners: Start, kube_api: FakeKubeApi
) -> None:
    verbs, _ = await listeners()
    pods = await _cluster(kube_api, 1)
    gate = kube_api.hold("/api/v1/namespaces/vms/pods/vm-0/binding")
    async with open_connections(verbs.bound_port, 2) as (idle, binding):
        assert (await exchange(idle, request("/filter", filter_body(pods[0], ["node-a"]))))[
            0
        ] == 200
        binding[1].write(request("/bind", bind_body(pods[0], "node-a")))
        await wait_until(lambda: any(r.path.endswith("/binding") for r in kube_api.requests))
        stopping = asyncio.create_task(listeners.stop())
        async with asyncio.timeout(WITHIN):
            assert await idle[0].read() == b""  # the idle one at once
        assert not stopping.done()  # the busy one is waited for
        gate.set()
        status, _, answered = await answer(binding[0])
        assert (status, json.loads(answered)) == (200, {"Error": ""})
        async with asyncio.timeout(WITHIN):
            await stopping
            assert await binding[0].read() == b""
