"""Operability endpoints: ``/healthz``, ``/readyz``, ``/metrics``, ``/state``.

Shell. ``/healthz`` is liveness: it fails only when a background task (the watches, the
durability writer, the event poster) has died, so that the kubelet restarts the process.
``/readyz`` turns true once the first node and pod lists are in.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scheduler_extender.http.keys import EXTENDER, TASKS
from scheduler_extender.http.middleware import METRICS, json_response
from scheduler_extender.snapshot import dump_state


async def healthz(request: web.Request) -> web.Response:
    dead = [t.get_name() for t in request.app.get(TASKS, []) if t.done()]
    if dead:
        return web.Response(status=503, text=f"background task(s) ended: {', '.join(dead)}\n")
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    extender = request.app[EXTENDER]
    if not extender.is_synced:
        return web.Response(status=503, text="waiting for the first node and pod lists\n")
    return web.Response(text="ok\n")


async def metrics(request: web.Request) -> web.Response:
    found = request.app[METRICS]
    found.refresh(request.app[EXTENDER].ledger)
    return web.Response(
        body=generate_latest(found.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def state(request: web.Request) -> web.Response:
    extender = request.app[EXTENDER]
    body = dump_state(extender.ledger)
    body["synced"] = {"nodes": extender.has_nodes, "pods": extender.has_pods}
    return json_response(body)
