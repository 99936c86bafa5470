"""Hostile request bodies (issue 16): nothing is read or inflated before authentication,
compressed bodies are refused or bounded by their inflated size, limits fit real use, and bad
bytes get 400, never 500.

Raw sockets where the point is what the server does *before* the client has sent everything:
an HTTP client library would not let a test stop half-way through a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.base_protocol import BaseProtocol
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from scheduler_extender.errors import ProtocolError
from scheduler_extender.http.bodies import BODIES, Bodies
from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import (
    STATIC_TOKEN,
    Running,
    StartExtender,
    make_config,
    wait_until,
)
from tests.extender.helpers import VM_LABELS, permit_batch, vm_pod

REFERENCE_NODE = Path(__file__).parents[1] / "reference/kube/extender/nocache/001-filter-nodes.json"
# Generous: the answers under test come in milliseconds; today's code lingered 10 s (or
# waited forever for a body it meant to read), which is what these bounds tell apart.
ANSWER_WITHIN = 5.0


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {STATIC_TOKEN}"}


def _bomb(expanded: int) -> bytes:
    """gzip of ``expanded`` zero bytes (about a thousandth of that on the wire)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(2**20)
    parts = [packer.compress(block) for _ in range(expanded // len(block))]
    return b"".join(parts) + packer.flush()


@contextlib.asynccontextmanager
async def _raw(
    port: int, head: str, body: bytes = b""
) -> AsyncIterator[tuple[bytes, asyncio.StreamReader]]:
    """Send a request head and part of a body; yield the answer's head and the reader."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        await writer.drain()
        async with asyncio.timeout(ANSWER_WITHIN):
            answer = await reader.readuntil(b"\r\n\r\n")
        yield answer, reader
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _port(client: Any) -> int:
    port: int = client.server.port
    return port


async def _synced_cluster(
    kube_api: FakeKubeApi, start_extender: StartExtender, **cfg: Any
) -> Running:
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a"))
    return await start_extender(make_config(**cfg))


async def test_unauthenticated_body_is_never_read_and_the_connection_is_closed(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    running = await _synced_cluster(kube_api, start_extender)
    bomb = _bomb(64 * 2**20)
    head = (
        "POST /v1/permits HTTP/1.1\nHost: x\nContent-Type: application/json\n"
        f"Content-Encoding: gzip\nContent-Length: {len(bomb)}\n"
    )
    # Half the body: the answer must not wait for the rest, nor read (inflate) what came.
    async with _raw(_port(running.permits), head, bomb[: len(bomb) // 2]) as (answer, reader):
        assert answer.startswith(b"HTTP/1.1 401 "), answer
        # Closed, not drained: aiohttp used to linger 10 s reading (and inflating) the rest.
        async with asyncio.timeout(ANSWER_WITHIN):
            while await reader.read(2**16):
                pass


async def test_a_declared_length_over_the_limit_is_refused_before_reading(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    running = await _synced_cluster(kube_api, start_extender)
    head = (
        f"POST /v1/permits HTTP/1.1\nHost: x\nAuthorization: Bearer {STATIC_TOKEN}\n"
        "Content-Type: application/json\nContent-Length: 1000000000\n"
    )
    async with _raw(_port(running.permits), head) as (answer, _):  # and no body at all
        assert answer.startswith(b"HTTP/1.1 413 "), answer
    bind = "POST /bind HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: 100000\n"
    async with _raw(_port(running.verbs), bind) as (answer, _):
        assert answer.startswith(b"HTTP/1.1 413 "), answer


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind", "/preempt"])
async def test_the_verbs_refuse_compressed_bodies(
    kube_api: FakeKubeApi, start_extender: StartExtender, path: str
) -> None:
    running = await _synced_cluster(kube_api, start_extender)
    response = await running.verbs.post(
        path,
        data=_bomb(8 * 2**20),
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert response.status == 415, await response.text()
    assert (await response.json())["reason"] == "UnsupportedEncoding"


async def test_permits_inflate_gzip_after_auth_within_the_inflated_limit(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    running = await _synced_cluster(kube_api, start_extender)
    headers = {**_auth(), "Content-Encoding": "gzip", "Content-Type": "application/json"}
    body = gzip.compress(json.dumps(permit_batch("node-a", uid="u-1")).encode())
    ok = await running.permits.post("/v1/permits", data=body, headers=headers)
    assert ok.status == 200, await ok.text()
    assert (await ok.json())["permits"][0]["status"] == "granted"
    # 2 MiB is the limit; this inflates to 64 MiB from 64 KiB on the wire.
    bomb = await running.permits.post("/v1/permits", data=_bomb(64 * 2**20), headers=headers)
    assert bomb.status == 413, await bomb.text()
    assert "inflates to over 2097152 bytes" in (await bomb.json())["message"]
    assert running.extender.ledger.pods["u-1"].vcpus == 2  # the refusal changed nothing


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"this is not gzip at all", id="not-gzip"),
        pytest.param(gzip.compress(b"{}")[:-6], id="truncated"),
        pytest.param(gzip.compress(b"{}") + b"junk", id="trailing-junk"),
    ],
)
async def test_a_body_labelled_gzip_that_is_not_is_a_400(
    kube_api: FakeKubeApi, start_extender: StartExtender, body: bytes
) -> None:
    running = await _synced_cluster(kube_api, start_extender)
    headers = {**_auth(), "Content-Encoding": "gzip", "Content-Type": "application/json"}
    response = await running.permits.post("/v1/permits", data=body, headers=headers)
    assert response.status == 400, await response.text()


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/preempt", "/bind", "/v1/permits"])
async def test_deep_nesting_is_a_400(
    kube_api: FakeKubeApi, start_extender: StartExtender, path: str
) -> None:
    running = await _synced_cluster(kube_api, start_extender)
    client = running.permits if path == "/v1/permits" else running.verbs
    body = b'{"x":' + b"[" * 1000 + b"]" * 1000 + b"}"  # 2 KB
    response = await client.post(path, data=body, headers=_auth())
    assert response.status == 400, await response.text()
    assert "nested too deeply" in (await response.json())["message"]


async def test_bodies_in_flight_are_bounded_across_requests(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    limit = 2 * 2**20
    running = await _synced_cluster(
        kube_api,
        start_extender,
        limits={
            "bodies_in_flight_bytes": limit,
            "verbs_max_body_bytes": limit,
            "permits_max_body_bytes": limit,
        },
    )
    head = (
        f"POST /v1/permits HTTP/1.1\nHost: x\nAuthorization: Bearer {STATIC_TOKEN}\n"
        f"Content-Type: application/json\nContent-Length: {limit}\n\n"
    )
    # The first body is declared in full and still arriving: it holds the whole budget.
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(running.permits))
    writer.write(head.replace("\n", "\r\n").encode() + b"{")
    await writer.drain()
    try:
        response = await running.permits.post(
            "/v1/permits", json=permit_batch("node-a", uid="u-1"), headers=_auth()
        )
        assert response.status == 503, await response.text()
        assert response.headers["Retry-After"] == "1"
        assert (await response.json())["reason"] == "BodiesInFlight"
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    # The budget comes back when the slow body is abandoned.
    bodies = running.permits.server.app[BODIES]  # type: ignore[attr-defined]
    await wait_until(lambda: bodies.in_flight == 0)
    again = await running.permits.post(
        "/v1/permits", json=permit_batch("node-a", uid="u-1"), headers=_auth()
    )
    assert again.status == 200, await again.text()
    assert reader is not None


async def test_a_body_whose_connection_was_lost_before_it_was_read_is_a_400() -> None:
    """Seen in the node tier: an agent gave up on its permit call while the extender checked
    its token with the API server; the body had arrived whole, but aiohttp's reader raises the
    connection's loss at the next read. That was a 500 with a traceback; it is the caller's
    doing, named, and the in-flight budget comes back."""
    loop = asyncio.get_running_loop()
    body = json.dumps(permit_batch("node-a", uid="u-1")).encode()
    content = StreamReader(BaseProtocol(loop), 2**16, loop=loop)
    content.feed_data(body)
    content.feed_eof()
    content.set_exception(ConnectionResetError("Connection lost"))
    request = make_mocked_request(
        "POST", "/v1/permits", headers={"Content-Length": str(len(body))}, payload=content
    )
    bodies = Bodies(make_config().limits)
    with pytest.raises(ProtocolError) as refused:
        await bodies.read(request, limit=2**20)
    assert (refused.value.status, refused.value.reason) == (400, "ConnectionLost")
    assert bodies.in_flight == 0


def _reference_nodes(count: int) -> list[dict[str, Any]]:
    """``count`` nodes built like kube-scheduler's recorded non-cache filter sample."""
    sample = json.loads(REFERENCE_NODE.read_text())["request"]["Nodes"]["items"][0]
    nodes = []
    for i in range(count):
        node = json.loads(json.dumps(sample))
        name = f"node-{i:05d}"
        node["metadata"]["name"] = name
        node["metadata"]["uid"] = f"00000000-0000-0000-0000-{i:012d}"
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        nodes.append(node)
    return nodes


async def test_a_5000_node_non_cache_filter_fits_the_default_limit(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    running = await _synced_cluster(kube_api, start_extender)
    nodes = _reference_nodes(5000)
    pod = vm_pod("vm-2", uid="u-2")
    assert pod["metadata"]["labels"] == VM_LABELS
    body = json.dumps({"Pod": pod, "Nodes": {"items": nodes}, "NodeNames": None}).encode()
    limit = make_config().limits.verbs_max_body_bytes
    # Measured: ~6.4 MB for kind's nodes; the limit leaves room for nodes ten times larger.
    assert len(body) * 8 < limit
    response = await running.verbs.post(
        "/filter", data=io.BytesIO(body), headers={"Content-Type": "application/json"}
    )
    assert response.status == 200, await response.text()
    answer = await response.json()
    assert len(answer["FailedNodes"]) + len(answer["FailedAndUnresolvableNodes"]) == 5000


async def test_a_1024_vm_permit_batch_fits_the_default_limit() -> None:
    batch = permit_batch("node-a", uid="u-1")
    (one,) = batch["requests"]
    batch["requests"] = [
        {
            **one,
            "pod": {
                "namespace": "tenant-" + "x" * 40,
                "name": f"vm-{i:04d}-" + "y" * 40,
                "uid": f"00000000-0000-0000-0000-{i:012d}",
            },
            "node": "node-" + "z" * 40,
            "lastPermit": one["current"],
            "load": {"load1": 1.25, "cpuBusyFraction": 0.5, "memoryUsedFraction": 0.5},
            "seq": 2**62,
        }
        for i in range(1024)
    ]
    size = len(json.dumps(batch).encode())
    # Measured: ~0.5 MB with long names; the limit leaves four times that.
    assert size * 4 < make_config().limits.permits_max_body_bytes
