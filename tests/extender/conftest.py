"""Fixtures for the extender's shell tests: a fake API server and running extender apps.

Everything goes over real HTTP: the extender's two listeners through ``aiohttp_client``, and
the extender's own kube client against ``testkit.kube_api.FakeKubeApi``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from kube_io.client import KubeClient
from scheduler_extender.config import Config, Listen, parse_config
from scheduler_extender.http.app import (
    Deps,
    make_app,
    make_metrics_app,
    make_permits_app,
    start_listeners,
    stop_listeners,
)
from scheduler_extender.http.bodies import Bodies
from scheduler_extender.http.connections import GuardedSite, server_options
from scheduler_extender.http.front import (
    Channel,
    ChannelDesk,
    MainSide,
    authenticator,
    make_front_app,
)
from scheduler_extender.http.keys import EXTENDER, EXTRA_METRICS, TASKS
from scheduler_extender.http.moves import controller_authenticator
from scheduler_extender.http.permit_port import LocalDesk
from scheduler_extender.kube.link import KubeLink
from scheduler_extender.metrics import Metrics
from scheduler_extender.service import Extender
from testkit.kube_api import FakeKubeApi, node_object

STATIC_TOKEN = "local-test-token"
# A round wall-clock instant, so that /state (which shows allocation times) is reproducible.
WALL_CLOCK = 1_800_000_000.0


def make_config(**sections: Any) -> Config:
    """Test defaults (static token, fast retries) with ``sections`` merged over them."""
    base: dict[str, Any] = {
        "auth": {"mode": "static", "static_token": STATIC_TOKEN},
        "durability": {"retry_initial_seconds": 0.01, "retry_max_seconds": 0.05},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
            if key == "auth" and value.get("mode") == "tokenreview":
                base[key].pop("static_token", None)
        else:
            base[key] = value
    return parse_config(copy.deepcopy(base))


@dataclass
class Running:
    verbs: TestClient[Any, Any]
    permits: TestClient[Any, Any]
    extender: Extender

    async def state(self) -> dict[str, Any]:
        response = await self.verbs.get("/state")
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


StartExtender = Callable[..., Awaitable[Running]]


async def wait_until(predicate: Callable[[], bool], *, timeout_seconds: float = 5.0) -> None:
    # Polling, not an Event: the conditions are about state owned by code under test, which
    # has no hook to signal on (and must not grow one for the tests' sake).
    async with asyncio.timeout(timeout_seconds):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def serving(app: web.Application, listen: Listen) -> TestServer:
    """A test server with the listener's own options (no aiohttp decompression, no lingering,
    the idle timeout), as ``serve`` runs them. (aiohttp_client's ``server_kwargs`` would be
    dropped: TestServer only takes them in ``start_server``.)"""
    server = TestServer(app)
    await server.start_server(**server_options(listen))
    return server


@pytest.fixture
async def kube_api() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi() as api:
        yield api


@pytest.fixture
def front_via() -> str:
    """How the permit port reaches the Extender: "local" (``make_permits_app``, one process)
    or "channel" (the permit front's app and its ``ChannelDesk``, across a socketpair to the
    main side, as ``serve`` runs them, only both in this process). The channel is a transport:
    test_front_channel.py holds it to the same answers as in process; test_permit_front.py
    overrides this fixture for what only the channel does."""
    return "local"


async def launch(
    kube_api: FakeKubeApi,
    aiohttp_client: Any,
    cleanups: list[Callable[[], Awaitable[None]]],
    config: Config | None = None,
    *,
    via: str = "local",
    wait_synced: bool = True,
) -> Running:
    """An extender on ``kube_api`` with its permit port ``via`` "local" or "channel" (see
    ``front_via``); what must be stopped after it goes into ``cleanups``."""
    config = config or make_config()

    async def connect() -> KubeClient:
        return KubeClient.for_url(kube_api.url)

    deps = Deps(registry=CollectorRegistry(), connect_kube=connect, wall_clock=lambda: WALL_CLOCK)
    verbs_app = make_app(config, deps)
    if via == "channel":
        permits_app = await _front_over_channel(config, verbs_app, connect, cleanups)
    else:
        permits_app = make_permits_app(config, verbs_app)
    verbs = await aiohttp_client(await serving(verbs_app, config.listen.verbs))
    permits = await aiohttp_client(await serving(permits_app, config.listen.permits))
    extender = verbs_app[EXTENDER]
    if wait_synced:
        await wait_until(lambda: extender.is_synced)
        await kube_api.wait_for_watches(2)
    return Running(verbs=verbs, permits=permits, extender=extender)


@pytest.fixture
async def start_extender(
    kube_api: FakeKubeApi, aiohttp_client: Any, front_via: str
) -> AsyncIterator[StartExtender]:
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def start(config: Config | None = None, *, wait_synced: bool = True) -> Running:
        return await launch(
            kube_api, aiohttp_client, cleanups, config, via=front_via, wait_synced=wait_synced
        )

    yield start
    for cleanup in reversed(cleanups):
        await cleanup()


async def _front_over_channel(
    config: Config,
    verbs_app: web.Application,
    connect: Callable[[], Awaitable[KubeClient]],
    cleanups: list[Callable[[], Awaitable[None]]],
) -> web.Application:
    """The permit front's app as its process builds it (own metrics, own API client, own
    bodies budget), its desk across a socketpair to the main side's ``LocalDesk``."""
    ours, theirs = socket.socketpair()
    main_side = MainSide(await Channel.open(ours), LocalDesk(verbs_app[EXTENDER], verbs_app[TASKS]))
    verbs_app[EXTRA_METRICS] = main_side.families
    front_metrics = Metrics(CollectorRegistry())
    front_channel = await Channel.open(theirs)
    desk = ChannelDesk(front_channel, front_metrics)
    link = KubeLink()
    link.client = await connect()
    tasks = [asyncio.create_task(main_side.serve()), asyncio.create_task(desk.serve())]

    async def stop() -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await main_side.channel.close()
        await front_channel.close()
        assert link.client is not None
        await link.client.close()

    cleanups.append(stop)
    return make_front_app(
        config,
        desk=desk,
        auth=authenticator(config, link, front_metrics),
        moves_auth=controller_authenticator(config, link, front_metrics),
        metrics=front_metrics,
        bodies=Bodies(config.limits),
    )


class Start:
    """The listeners exactly as ``serve`` starts them (``start_listeners``: ``GuardedSite``
    with the header timeout only for the verbs, with every guard for the permit port, the
    server options), on loopback ports the OS picks; ``await start(**listen)`` gives the
    (verbs, permits) sites (``metrics=...`` starts that listener too: ``self.metrics``),
    ``await start.stop()`` stops them as ``serve`` does (the fixture stops whatever is still
    running)."""

    def __init__(self, kube_api: FakeKubeApi) -> None:
        self._kube_api = kube_api
        self._running: list[Any] = []
        self.metrics: GuardedSite | None = None

    async def __call__(
        self, *, limits: dict[str, Any] | None = None, wait_synced: bool = True, **listen: Any
    ) -> tuple[GuardedSite, GuardedSite]:
        config = make_config(listen=listen, limits=limits or {})
        # Ports the OS picks (0 is not a valid port in a config file).
        metrics = config.listen.metrics
        config = msgspec.structs.replace(
            config,
            listen=msgspec.structs.replace(
                config.listen,
                verbs=msgspec.structs.replace(config.listen.verbs, port=0),
                permits=msgspec.structs.replace(config.listen.permits, port=0),
                metrics=msgspec.structs.replace(metrics, port=0) if metrics else None,
            ),
        )
        kube_api = self._kube_api

        async def connect() -> KubeClient:
            return KubeClient.for_url(kube_api.url)

        verbs_app = make_app(config, Deps(registry=CollectorRegistry(), connect_kube=connect))
        metrics_app = make_metrics_app(config, verbs_app) if metrics else None
        started = await start_listeners(
            config, verbs_app, make_permits_app(config, verbs_app), metrics_app
        )
        self._running.append(started)
        extender = verbs_app[EXTENDER]
        await wait_until(lambda: extender.is_synced if wait_synced else extender.has_nodes)
        verbs, permits = started[0][1], started[1][1]
        if metrics_app is not None:
            self.metrics = started[2][1]
        return verbs, permits

    async def stop(self) -> None:
        while self._running:
            await stop_listeners(self._running.pop())


@pytest.fixture
async def listeners(kube_api: FakeKubeApi) -> AsyncIterator[Start]:
    kube_api.add_node(node_object("node-a", cpu="8"))
    start = Start(kube_api)
    yield start
    await start.stop()


@contextlib.asynccontextmanager
async def open_connections(
    port: int, count: int, first_bytes: bytes = b"", *, source: str = "127.0.0.1"
) -> AsyncIterator[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    opened = []
    try:
        for _ in range(count):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(source, 0)
            )
            if first_bytes:
                writer.write(first_bytes)
                await writer.drain()
            opened.append((reader, writer))
        yield opened
    finally:
        for _, writer in opened:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
