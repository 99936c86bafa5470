"""The scale-up recommender on the verbs listener, and its auto-publish task.

Shell, thin: the decisions are pure (``recommender``, ``capacity_waits``); this module reads the
live state, times the call, and publishes.

* ``POST /v1/recommend``: the body is a ClusterSnapshot (JSON, or YAML when the Content-Type
  says so). A bad snapshot is a 400 listing every ``$.path``; nothing is stored, so nothing can
  be half-applied. An *empty* body means the live state: our pods still waiting for a node
  (the pod watch's ``unbound``, with their node selectors, affinity, tolerations and priority
  classes), the ledger's nodes and pods, the nodes' taints and cordons, and the node pools of
  the config (``snapshot_from_ledger``). The answer is the recommendation JSON with
  ``runTimeMillis``; a pending pod whose constraints the model cannot express is left out and
  named in ``diagnostics.notes``.
  How much of the rounds it records comes from the config's ``recommender.diagnostics``
  (``summary`` unless set), like the scorer chain; ``?diagnostics=full`` (or ``summary``)
  overrides it for one request. ``summary`` keeps one line per round instead of every
  candidate of every round, and does not build the rest; a level that is neither is a 400
  (``InvalidParameter``).
* ``GET /v1/recommendation`` (on the permits listener too, like ``/state``): the latest
  auto-published recommendation, with when and why.
  Its ``diagnostics.rounds`` are always the summary (see auto-publish); an empty
  ``POST /v1/recommend?diagnostics=full`` gives the full rounds for the live state.
* Auto-publish (a ``cleanup_ctx`` task): every ``check_interval_seconds``, if a pod has been
  refused by filter or an agent denied for capacity for longer than
  ``pending_threshold_seconds``, compute a live recommendation and publish it: the gauge
  ``vmautoscale_extender_recommended_nodes{pool,zone}``, a ``ScaleUpRecommended`` Event on the
  pod that waited longest (only when the scale-up differs from the last one posted, so a long
  wait is not an Event every interval), and ``GET /v1/recommendation``. None of these reads
  the rounds' candidates, so it computes at ``DiagnosticsLevel.SUMMARY`` whatever the config
  says: the same scale-up, unscheduled pods and reasons, without building the candidates'
  records (most of a large recommendation's work and size).

The live snapshot is read without an ``await`` between reading the ledger and finishing the
snapshot, so it is one consistent view. The simulation then runs on the loop too (tens of
milliseconds for a thousand pending pods): it is deterministic and holds no shared state, but
it does delay other requests for that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

import msgspec
import structlog
from aiohttp import web

from kube_io.objects import ObjectReference
from scheduler_extender.config import Config
from scheduler_extender.errors import ProtocolError
from scheduler_extender.http.keys import EXTENDER, TASKS
from scheduler_extender.http.middleware import METRICS, read_body
from scheduler_extender.recommender import (
    DiagnosticsLevel,
    FieldError,
    Recommendation,
    SnapshotError,
    encode_recommendation,
    load_snapshot,
    prepare_snapshot,
    recommend,
)
from scheduler_extender.recommender.capacity_waits import Overdue
from scheduler_extender.recommender.live import snapshot_from_ledger
from scheduler_extender.service import Extender

log = structlog.get_logger(__name__)

EVENT_REASON: Final = "ScaleUpRecommended"
_JSON: Final = "application/json"
_YAML_TYPES: Final = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"}
)


class _ErrorBody(msgspec.Struct, kw_only=True):
    error: str
    reason: str
    message: str
    errors: list[FieldError]


@dataclass(frozen=True, slots=True)
class Published:
    recommendation: Recommendation
    at_wall: float
    reason: str
    run_time_millis: int


class _PublishedBody(msgspec.Struct, rename="camel", kw_only=True):
    published_at: str
    reason: str
    run_time_millis: int
    recommendation: msgspec.Raw


@dataclass(slots=True)
class Recommendations:
    """The latest published recommendation and what was last announced."""

    latest: Published | None = None
    # The scale-up (pool, zone, count) of the last Event, to post only on a change.
    announced: tuple[tuple[str, str, int], ...] | None = None


RECOMMENDATIONS = web.AppKey("recommendations", Recommendations)


def install(app: web.Application, config: Config) -> None:
    """Routes, state and the auto-publish task; call after ``EXTENDER`` and ``METRICS`` are set."""
    app[RECOMMENDATIONS] = Recommendations()
    app.router.add_post("/v1/recommend", recommend_handler, name="recommend")
    app.router.add_get("/v1/recommendation", latest_handler, name="recommendation")
    if config.recommender.auto_publish:
        app.cleanup_ctx.append(_auto_publish_ctx)


def _bad_snapshot(e: SnapshotError, *, status: int, reason: str) -> web.Response:
    body = _ErrorBody(error="SnapshotError", reason=reason, message=str(e), errors=e.errors)
    return web.Response(body=msgspec.json.encode(body), status=status, content_type=_JSON)


def live_recommendation(
    extender: Extender, *, diagnostics: DiagnosticsLevel | None = None
) -> Recommendation:
    """From the ledger and the pods waiting for a node; raises ``SnapshotError`` when the live
    state does not match the configured pools (say, a node labelled with an unknown pool).
    ``diagnostics`` overrides the config's level."""
    config = extender.config
    pending = sorted(extender.unbound.values(), key=lambda p: p.key)
    specs = extender.unbound_specs
    left_out: list[str] = []
    snapshot = snapshot_from_ledger(
        extender.ledger,
        pending,
        config.recommender.node_pools,
        pod_specs={p.uid: specs[p.key] for p in pending if p.key in specs},
        node_taints=extender.node_taints,
        unschedulable_nodes=extender.cordoned,
        pool_label=config.recommender.pool_label,
        left_out=left_out,
    )
    rec_config = config.recommender_config()
    if diagnostics is not None:
        rec_config = msgspec.structs.replace(rec_config, diagnostics=diagnostics)
    prepared = prepare_snapshot(snapshot, scheduler_name=rec_config.scheduler_name)
    rec = recommend(prepared, config=rec_config)
    if left_out:
        # Said in the answer, not only logged: auto-publish recomputes every interval.
        notes = [*rec.diagnostics.notes, *left_out]
        rec = msgspec.structs.replace(
            rec, diagnostics=msgspec.structs.replace(rec.diagnostics, notes=notes)
        )
    return rec


def _diagnostics_asked(request: web.Request) -> DiagnosticsLevel | None:
    """The request's ``?diagnostics=``, or None to follow the config."""
    asked = request.query.get("diagnostics")
    if asked is None:
        return None
    try:
        return DiagnosticsLevel(asked)
    except ValueError:
        levels = " or ".join(repr(d.value) for d in DiagnosticsLevel)
        raise ProtocolError(
            f"diagnostics must be {levels}, not {asked!r}", reason="InvalidParameter"
        ) from None


async def recommend_handler(request: web.Request) -> web.Response:
    extender = request.app[EXTENDER]
    diagnostics = _diagnostics_asked(request)
    body = await read_body(request)
    start = time.perf_counter()
    if not body.strip():
        extender.require_synced()
        try:
            rec = live_recommendation(extender, diagnostics=diagnostics)
        except SnapshotError as e:
            request.app[METRICS].recommendations.labels("request", "failed").inc()
            # Not the caller's fault: the configured pools do not describe the cluster.
            return _bad_snapshot(e, status=409, reason="LiveStateMismatch")
    else:
        fmt: Literal["json", "yaml"] = "yaml" if request.content_type in _YAML_TYPES else "json"
        config = extender.config.recommender_config()
        if diagnostics is not None:
            config = msgspec.structs.replace(config, diagnostics=diagnostics)
        try:
            prepared = load_snapshot(body, fmt=fmt, scheduler_name=config.scheduler_name)
            rec = recommend(prepared, config=config)
        except SnapshotError as e:
            request.app[METRICS].recommendations.labels("request", "failed").inc()
            structlog.contextvars.bind_contextvars(reason=str(e))
            return _bad_snapshot(e, status=400, reason="InvalidSnapshot")
    millis = round((time.perf_counter() - start) * 1000)
    request.app[METRICS].recommendations.labels("request", "published").inc()
    structlog.contextvars.bind_contextvars(
        reason=f"{sum(s.increment_by for s in rec.scale_up)} new nodes,"
        f" {len(rec.unscheduled_pods)} pods unscheduled"
    )
    return web.Response(body=encode_recommendation(rec, run_time_millis=millis), content_type=_JSON)


async def latest_handler(request: web.Request) -> web.Response:
    latest = request.app[RECOMMENDATIONS].latest
    if latest is None:
        body = msgspec.json.encode(
            {"error": "NotFound", "reason": "NothingPublished", "message": "no recommendation"
             " has been published yet: no pod or agent has waited for capacity long enough"}
        )  # fmt: skip
        return web.Response(body=body, status=404, content_type=_JSON)
    answer = _PublishedBody(
        published_at=datetime.fromtimestamp(latest.at_wall, UTC).isoformat(),
        reason=latest.reason,
        run_time_millis=latest.run_time_millis,
        recommendation=msgspec.Raw(encode_recommendation(latest.recommendation)),
    )
    return web.Response(body=msgspec.json.encode(answer), content_type=_JSON)


def publish_if_overdue(app: web.Application, *, now: float) -> Published | None:
    """One check of the auto-publish task (no await inside: one consistent view)."""
    extender = app[EXTENDER]
    if not extender.is_synced:
        return None
    settings = extender.config.recommender
    waits = extender.capacity_waits
    waits.retain(
        pending={p.uid for p in extender.unbound.values()}, running=extender.ledger.pods.keys()
    )
    overdue = waits.overdue(now=now, threshold_seconds=settings.pending_threshold_seconds)
    if overdue is None:
        return None
    metrics = app[METRICS]
    start = time.perf_counter()
    try:
        # Nothing published reads the rounds' candidates: see the module docstring.
        rec = live_recommendation(extender, diagnostics=DiagnosticsLevel.SUMMARY)
    except SnapshotError as e:
        metrics.recommendations.labels("auto", "failed").inc()
        log.warning("recommendation_failed", reason=overdue.reason, error=str(e))
        return None
    published = Published(
        recommendation=rec,
        at_wall=extender.wall_clock(),
        reason=overdue.reason,
        run_time_millis=round((time.perf_counter() - start) * 1000),
    )
    state = app[RECOMMENDATIONS]
    state.latest = published
    metrics.recommendations.labels("auto", "published").inc()
    _set_gauge(app, rec)
    scale_up = tuple((s.node_pool, s.zone, s.increment_by) for s in rec.scale_up)
    log.info(
        "scale_up_recommended",
        reason=overdue.reason,
        scale_up=[f"{p}/{z}+{n}" for p, z, n in scale_up],
        unscheduled=len(rec.unscheduled_pods),
        run_time_millis=published.run_time_millis,
    )
    if scale_up != state.announced:
        state.announced = scale_up
        _post_event(extender, overdue, scale_up, len(rec.unscheduled_pods))
    return published


def _set_gauge(app: web.Application, rec: Recommendation) -> None:
    gauge = app[METRICS].recommended_nodes
    counts = {(s.node_pool, s.zone): s.increment_by for s in rec.scale_up}
    for pool in app[EXTENDER].config.recommender.node_pools:
        for zone in pool.zones:
            counts.setdefault((pool.name, zone), 0)
    # Pools and zones come from the config, so the label set is small and fixed; anything no
    # longer in the answer or the config is removed rather than left at a stale value.
    for labels in {tuple(s.labels.values()) for m in gauge.collect() for s in m.samples}:
        if labels not in counts:
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)
    for (pool_name, zone), count in counts.items():
        gauge.labels(pool_name, zone).set(count)


def _post_event(
    extender: Extender,
    overdue: Overdue,
    scale_up: tuple[tuple[str, str, int], ...],
    unscheduled: int,
) -> None:
    namespace, _, name = overdue.subject.partition("/")
    plan = ", ".join(f"{n} x {p}/{z}" for p, z, n in scale_up) or "no new node helps"
    message = (
        f"scale-up recommended: {plan}; {unscheduled} pod(s) left unscheduled;"
        f" because {overdue.reason}"
    )
    involved = ObjectReference(
        api_version="v1", kind="Pod", name=name, namespace=namespace, uid=overdue.uid
    )
    extender.reporter.post(involved, reason=EVENT_REASON, message=message)


async def _auto_publish_ctx(app: web.Application) -> AsyncIterator[None]:
    interval = app[EXTENDER].config.recommender.check_interval_seconds
    loop = asyncio.get_running_loop()

    async def run() -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                publish_if_overdue(app, now=loop.time())
            except Exception:
                # Task boundary: a failed recommendation must not stop the next one.
                log.exception("auto_publish_failed")

    task = loop.create_task(run(), name="recommend-auto-publish")
    app[TASKS].append(task)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(ValueError):
            app[TASKS].remove(task)
