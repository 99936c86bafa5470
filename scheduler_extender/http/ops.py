"""Operability endpoints: ``/healthz``, ``/readyz``, ``/metrics``, ``/state``, ``/v1/queue``.

Shell. ``/healthz`` is liveness: it fails when a background task (the watches, the
durability writer, the event poster) has died, so that the kubelet restarts the process, and
when this replica is ``stalled`` (``core/leadership.py``): its kube-scheduler leads but it
cannot hold the extender's Lease. kube-scheduler's liveness probe in the same pod is this
``/healthz`` (manifests/extender.yaml), so the kubelet then restarts kube-scheduler too, which
releases its Lease, and the standby pair takes over.
``/readyz`` turns true once the first node and pod lists are in and this replica leads (with
two replicas, the standby is never ready: it decides nothing); ``/readyz?exclude=leader``
leaves leadership out, as kube-apiserver's ``?exclude=`` leaves out a named check: a warm
standby passes it (the kubelet's readiness probe, so that a PodDisruptionBudget counts the
standby as available and the leader's node can drain). ``/v1/queue`` is the
admission queue as a user sees it: per namespace its quota, usage, admitted and waiting pods in
order, each with its reason.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scheduler_extender.admission.view import queue_numbers, queue_view
from scheduler_extender.http.keys import EXTENDER, EXTRA_METRICS, METRICS_GUARD, TASKS
from scheduler_extender.http.middleware import METRICS, json_response
from scheduler_extender.metrics import exposition
from scheduler_extender.service import Extender
from scheduler_extender.state import dump_namespaces, dump_state


def health_problem(tasks: list[asyncio.Task[None]], extender: Extender) -> str | None:
    """Why ``/healthz`` fails (a background task ended, or the pair is stalled), or None."""
    dead = [t.get_name() for t in tasks if t.done()]
    if dead:
        return f"background task(s) ended: {', '.join(dead)}\n"
    elector = extender.elector
    if elector is not None and elector.stalled(extender.clock()):
        return (
            "stalled: this pod's kube-scheduler leads, but this extender cannot hold the"
            " extender Lease (the API server does not answer it); the pair must step down\n"
        )
    return None


def ready_problem(extender: Extender, *, is_leader_checked: bool = True) -> str | None:
    """Why ``/readyz`` fails (not synced yet, or the standby), or None."""
    if not extender.is_synced:
        return "waiting for the first node and pod lists\n"
    if is_leader_checked and not extender.is_leading:
        return "standby: the other replica holds the extender Lease\n"
    return None


def is_leader_checked(request: web.Request) -> bool:
    """``?exclude=leader`` drops the leadership check (kube-apiserver's ``/readyz`` style)."""
    return "leader" not in request.query.getall("exclude", [])


async def healthz(request: web.Request) -> web.Response:
    problem = health_problem(request.app.get(TASKS, []), request.app[EXTENDER])
    if problem is not None:
        return web.Response(status=503, text=problem)
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    problem = ready_problem(request.app[EXTENDER], is_leader_checked=is_leader_checked(request))
    if problem is not None:
        return web.Response(status=503, text=problem)
    return web.Response(text="ok\n")


async def metrics(request: web.Request) -> web.Response:
    found = request.app[METRICS]
    extender = request.app[EXTENDER]
    found.refresh(extender.ledger)
    found.refresh_namespaces(queue_numbers(extender.admission))
    extra = request.app.get(EXTRA_METRICS)
    body = (
        generate_latest(found.registry)
        if extra is None
        else exposition(found.registry, await extra())
    )
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def guarded_metrics(request: web.Request) -> web.Response:
    """``/metrics`` on the metrics listener: only for callers ``METRICS_GUARD`` lets in."""
    await request.app[METRICS_GUARD].check(request.headers.get("Authorization"))
    return await metrics(request)


async def state(request: web.Request) -> web.Response:
    extender = request.app[EXTENDER]
    body = dump_state(extender.ledger, extender.relief_book)
    body["namespaces"] = dump_namespaces(queue_numbers(extender.admission))
    body["synced"] = {"nodes": extender.has_nodes, "pods": extender.has_pods}
    return json_response(body)


async def queue(request: web.Request) -> web.Response:
    extender = request.app[EXTENDER]
    # Expired admissions go back to the queue before the view is taken, like any call would.
    extender.recheck_queue()
    now = asyncio.get_running_loop().time()
    return json_response(queue_view(extender.admission, now=now))
