"""Hostile connections (issue 16): idle and slowloris connections are bounded per listener, by
time and by count, without locking out kube-scheduler or the kubelet's probes.

The listeners run exactly as ``serve`` starts them (``start_listeners``: ``GuardedSite`` for
each, the server options), on loopback ports the OS picks. The verbs listener has aiohttp's
guards and the header timeout only: its one client is kube-scheduler (docs/DEPLOY.md, "Who
reaches which listener").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import yaml
from aiohttp import ClientSession

from scheduler_extender.config import Config, parse_config
from scheduler_extender.http.connections import listening_sockets
from testkit.controlplane import Extender as ProcessExtender
from testkit.ports import free_port
from tests.extender.conftest import STATIC_TOKEN, Start, wait_until
from tests.extender.conftest import open_connections as _connections

# Generous: what is awaited takes milliseconds (or the idle timeout the test sets, 0.3 s);
# today's code kept these connections for an hour.
WITHIN = 5.0


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        async with asyncio.timeout(WITHIN):
            while await reader.read(2**16):
                pass
    except ConnectionResetError:
        return True  # closed while our last bytes were in flight: the kernel answers RST
    return reader.at_eof()


async def _get(port: int, path: str) -> int:
    async with ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status


def test_the_verbs_listener_binds_loopback_by_default() -> None:
    config = parse_config({"listen": {"verbs": {"port": 10298}, "permits": {"port": 10299}}})
    assert config.listen.verbs.host == "127.0.0.1"
    assert Config().listen.verbs.host == "127.0.0.1"
    assert Config().listen.permits.host == "0.0.0.0"


async def test_an_idle_flood_evicts_itself_and_probes_still_get_in(listeners: Start) -> None:
    verbs, permits = await listeners(permits={"port": 1, "max_connections": 8})
    async with _connections(permits.bound_port, 20) as flood:
        # Each connection past the cap closed the longest-quiet one: at most 8 stay open.
        closed = [await _closed_by_server(reader) for reader, _ in flood[:12]]
        assert all(closed)
        assert permits.open_connections <= 8 and permits.evicted >= 12
        # The kubelet's probe and kube-scheduler's next call still get in.
        assert await _get(permits.bound_port, "/readyz") == 200
        assert await _get(verbs.bound_port, "/healthz") == 200  # the caps are the listener's own


async def test_slowloris_heads_are_closed_after_the_header_timeout(listeners: Start) -> None:
    _, permits = await listeners(
        permits={"port": 1, "idle_timeout_seconds": 3600, "header_timeout_seconds": 0.3}
    )
    port = permits.bound_port
    async with _connections(port, 3, b"GET /readyz HTTP/1.1\r\nHost: x\r\n") as slow:
        for reader, writer in slow:
            writer.write(b"X-Dribble: 1\r\n")  # bytes keep coming, the head never ends
            assert await _closed_by_server(reader)
    assert permits.heads_timed_out == 3
    # A connection that completes its heads in time is kept, across requests and idle gaps
    # longer than the header timeout (that is the idle timeout's business).
    async with ClientSession() as session:
        for _ in range(3):
            async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                assert response.status == 200
            await asyncio.sleep(0.4)
    assert permits.heads_timed_out == 3 and permits.evicted == 0


async def test_silent_connections_are_closed_after_the_header_timeout_on_every_listener(
    listeners: Start,
) -> None:
    """A connection that opens and never sends a request is closed once its header timeout
    runs out, long before the idle timeout, on the verbs listener as on the others."""
    quick = {"idle_timeout_seconds": 3600, "header_timeout_seconds": 0.3}
    verbs, permits = await listeners(
        verbs={"port": 1, **quick},
        permits={"port": 1, **quick},
        # Its own loopback address: the OS picks every port, and two listeners may not share
        # a host and port in a config.
        metrics={"port": 2, "host": "127.0.0.2", "auth": "none", **quick},
    )
    assert listeners.metrics is not None
    sites = ((verbs, "127.0.0.1"), (permits, "127.0.0.1"), (listeners.metrics, "127.0.0.2"))
    silent = [
        await asyncio.open_connection(host, site.bound_port) for site, host in sites for _ in "abc"
    ]
    try:
        for reader, _ in silent:
            assert await _closed_by_server(reader)
    finally:
        for _, writer in silent:
            writer.close()
    for site, _ in sites:
        await wait_until(lambda site=site: site.open_connections == 0)
        assert site.heads_timed_out == 3
    # The verbs listener has no admission guards: nothing refused or evicted, no penalty.
    assert verbs.penalties is None and verbs.refused == verbs.evicted == 0
    # A client that speaks at once (kube-scheduler) is served, and kept across idle gaps
    # longer than the header timeout (that is the idle timeout's business).
    async with ClientSession() as session:
        for pause in (0.4, 0.0):
            async with session.get(f"http://127.0.0.1:{verbs.bound_port}/healthz") as answer:
                assert answer.status == 200
            await asyncio.sleep(pause)
    assert verbs.heads_timed_out == 3


async def test_idle_keepalives_are_closed_after_the_idle_timeout(listeners: Start) -> None:
    _, permits = await listeners(permits={"port": 1, "idle_timeout_seconds": 0.3})
    async with _connections(permits.bound_port, 2) as idle:
        for reader, _ in idle:
            assert await _closed_by_server(reader)
    await wait_until(lambda: permits.open_connections == 0)


async def test_a_busy_connection_is_never_evicted_and_a_full_house_is_refused(
    listeners: Start,
) -> None:
    _, permits = await listeners(permits={"port": 1, "max_connections": 2})
    port = permits.bound_port
    head = (
        f"POST /v1/permits HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {STATIC_TOKEN}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )
    # Two requests whose bodies are still arriving: both connections are busy.
    async with _connections(port, 2, head.encode()) as busy:
        await wait_until(lambda: permits.open_connections == 2)
        async with _connections(port, 1) as (refused,):
            answer = await refused[0].read()
            assert answer.startswith(b"HTTP/1.1 503 "), answer
            assert permits.refused == 1 and permits.evicted == 0
        # Neither busy request was cut off: each still gets its answer (a 400: "{" + spaces
        # is not a batch) once its body is complete.
        for reader, writer in busy:
            writer.write(b" " * 99)
            await writer.drain()
            async with asyncio.timeout(WITHIN):
                status = await reader.readline()
            assert status.startswith(b"HTTP/1.1 400 "), status


async def test_new_connections_over_the_rate_are_closed_before_aiohttp_sees_them(
    listeners: Start,
) -> None:
    verbs, permits = await listeners(
        permits={"port": 1, "new_connections_per_second": 0.001, "new_connections_burst": 3}
    )
    port = permits.bound_port
    async with ClientSession() as keeps_alive:
        url = f"http://127.0.0.1:{port}/readyz"
        async with keeps_alive.get(url) as first:
            assert first.status == 200  # one of 127.0.0.1's three
        # A flooder on another address spends its own allowance (Linux routes all of 127/8 to
        # loopback: two addresses, one machine).
        async with _connections(port, 5, source="127.0.0.2") as flood:
            answers = [await reader.read() for reader, _ in flood[3:]]
        assert all(a.startswith(b"HTTP/1.1 503 ") for a in answers), answers
        assert permits.refused == 2
        # 127.0.0.1 still has two new connections, and then it is its turn to be refused.
        async with _connections(port, 3) as mine:
            last = await mine[2][0].read()
        assert last.startswith(b"HTTP/1.1 503 ") and permits.refused == 3
        # A client that keeps its connection alive is not affected; nor is the other listener.
        for _ in range(5):
            async with keeps_alive.get(url) as again:
                assert again.status == 200
    assert await _get(verbs.bound_port, "/healthz") == 200


def test_a_listener_binds_every_address_its_host_resolves_to() -> None:
    resolved = {info[4][0] for info in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)}
    sockets = listening_sockets("localhost", 0, 8)
    try:
        assert {sock.getsockname()[0] for sock in sockets} == resolved
        for sock in sockets:  # listening: a client gets in
            with socket.create_connection(sock.getsockname()[:2], timeout=WITHIN):
                pass
    finally:
        for sock in sockets:
            sock.close()


async def test_oversized_heads_get_a_400_on_every_listener(listeners: Start) -> None:
    # aiohttp's own head bounds (``connections.server_options``), on both kinds of site.
    verbs, permits = await listeners()
    heads = [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8200 + b"\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Many: 1\r\n" * 130 + b"\r\n",
        b"GET /healthz?" + b"q" * 8200 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    for port in (verbs.bound_port, permits.bound_port):
        for head in heads:
            async with _connections(port, 1, head) as ((reader, _),):
                async with asyncio.timeout(WITHIN):
                    status = await reader.readline()
            assert status.split(b" ")[1] == b"400", (port, head[:40], status)


def test_the_real_process_closes_silent_connections_on_every_listener(tmp_path: Path) -> None:
    """As deployed: ``scheduler-extender serve`` with its permit front in a process of its own
    (``permit_front.mode: process``, the default). Silent connections to each of its three
    listeners (verbs, permits, metrics; the probes are served on each) are closed by the
    server once the configured header timeout runs out, long before the idle timeout."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"nodes": [{"name": "n", "cpu": "4", "memory": "8Gi"}]}))
    quick = {"host": "127.0.0.1", "idle_timeout_seconds": 3600, "header_timeout_seconds": 0.3}
    config = {
        "auth": {"mode": "static", "static_token": STATIC_TOKEN},
        "shutdown_timeout_seconds": 1,
        "listen": {
            "verbs": {"port": free_port(), **quick},
            "permits": {"port": free_port(), **quick},
            "metrics": {"port": free_port(), "auth": "none", **quick},
        },
    }
    extender = ProcessExtender(tmp_path, None, config, standalone=cluster, log_level="info")
    extender.start()
    try:
        ports = (extender.verbs_port, extender.permits_port, extender.metrics_port)
        silent = [socket.create_connection(("127.0.0.1", port)) for port in ports for _ in "abc"]
        try:
            for sock in silent:
                sock.settimeout(WITHIN)
                # The server's FIN (no answer), or its RST: closed by the server either way.
                with contextlib.suppress(ConnectionResetError):
                    assert sock.recv(1) == b""
        finally:
            for sock in silent:
                sock.close()
        for port in ports:  # and a client that speaks at once is served
            assert extender.get("/healthz", port=port)[0] == 200
    finally:
        extender.stop()
