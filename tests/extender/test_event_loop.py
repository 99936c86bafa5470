"""The loop the commands run on: uvloop when installed (it is: a dependency), asyncio's on
request; and the listeners, guards included, serve on uvloop as on asyncio's loop (the tests'
own loops are asyncio's: only this file runs the server on the loop ``serve`` picks)."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import msgspec
import uvloop
from prometheus_client import CollectorRegistry

from scheduler_extender.event_loop import EventLoop, loop_factory, loop_name, run
from scheduler_extender.http.app import (
    Deps,
    bound_port,
    make_app,
    make_permits_app,
    start_listeners,
    stop_listeners,
)
from scheduler_extender.kube.standalone import StandaloneCluster
from tests.extender.conftest import make_config


def test_auto_is_uvloop_and_asyncio_opts_out() -> None:
    assert loop_factory(EventLoop.AUTO) is uvloop.new_event_loop
    assert loop_factory(EventLoop.ASYNCIO) is None
    assert run(_loop_name(), EventLoop.ASYNCIO) == "asyncio"


async def _loop_name() -> str:
    return loop_name(asyncio.get_running_loop())


async def _serve_once() -> tuple[str, list[int], bool]:
    config = make_config(listen={"verbs": {"port": 1, "header_timeout_seconds": 0.2}})
    listen = config.listen
    config = msgspec.structs.replace(
        config,
        listen=msgspec.structs.replace(
            listen,
            verbs=msgspec.structs.replace(listen.verbs, port=0),
            permits=msgspec.structs.replace(listen.permits, port=0),
        ),
    )
    app = make_app(
        config,
        Deps(registry=CollectorRegistry(), standalone=StandaloneCluster(nodes=[], pods=[])),
    )
    started = await start_listeners(config, app, make_permits_app(config, app))
    try:
        statuses = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            for _, site in started:  # the verbs listener, then the permit port
                url = f"http://127.0.0.1:{bound_port(site)}/healthz"
                async with session.get(url) as answer:
                    statuses.append(answer.status)
        # A connection that says nothing is still reaped by the header timeout's timer.
        verbs = started[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", bound_port(verbs))
        async with asyncio.timeout(verbs.header_timeout + 5):
            is_closed = await reader.read() == b""
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    finally:
        await stop_listeners(started)
    return loop_name(asyncio.get_running_loop()), statuses, is_closed


def test_the_guarded_listeners_serve_on_uvloop() -> None:
    # uvloop's transports are not asyncio.Transport subclasses: the guard once refused them all.
    assert run(_serve_once(), EventLoop.AUTO) == ("uvloop", [200, 200], True)
