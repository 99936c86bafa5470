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
* ``POST /v1/scale-down``: which existing nodes could be removed (``recommender.scale_down``)
  for the snapshot in the body; an empty body is a 400 (no live mode: see its handler).
* ``GET /v1/recommendation`` (verbs listener only, like ``/state``): the latest
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
snapshot, so it is one consistent view. The simulation then runs in a worker process
(``recommend_worker``): on the loop it delayed every filter, bind and permit call for as long
as it ran (``scripts/bench_recommend_hotpath.py`` measures this).
"""

from __future__ import annotations

import asyncio
import contextlib
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
from scheduler_extender.http.recommend_worker import Job, RecommendWorker, compute
from scheduler_extender.recommender import (
    DiagnosticsLevel,
    FieldError,
    Recommendation,
    SnapshotError,
    encode_recommendation,
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
RECOMMEND_WORKER = web.AppKey("recommend_worker", RecommendWorker)


async def _worker_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    app[RECOMMEND_WORKER].close()


def install(app: web.Application, config: Config) -> None:
    """Routes, state, the worker and the auto-publish task; call after ``EXTENDER`` and
    ``METRICS`` are set."""
    app[RECOMMENDATIONS] = Recommendations()
    app[RECOMMEND_WORKER] = RecommendWorker(config.recommender.worker)
    app.cleanup_ctx.append(_worker_ctx)
    app.router.add_post("/v1/recommend", recommend_handler, name="recommend")
    app.router.add_get("/v1/recommendation", latest_handler, name="recommendation")
    app.router.add_post("/v1/scale-down", scale_down_handler, name="scale_down")
    if config.recommender.auto_publish:
        app.cleanup_ctx.append(_auto_publish_ctx)


def _bad_snapshot(e: SnapshotError, *, status: int, reason: str) -> web.Response:
    body = _ErrorBody(error="SnapshotError", reason=reason, message=str(e), errors=e.errors)
    return web.Response(body=msgspec.json.encode(body), status=status, content_type=_JSON)


def live_job(
    extender: Extender, *, diagnostics: DiagnosticsLevel | None = None, is_kept: bool = False
) -> Job:
    """The live state as a job for the worker: read from the ledger and the pods waiting for a
    node, on the loop and without an await (one consistent view), and encoded. Raises
    ``SnapshotError`` when the live state does not match the configured pools (say, a node
    labelled with an unknown pool). ``diagnostics`` overrides the config's level."""
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
        # VMs' bounds only travel when a plan for growth needs them.
        vm_scheduler_name=config.scheduler_name if config.recommender.growth_headroom else None,
    )
    rec_config = config.recommender_config()
    if diagnostics is not None:
        rec_config = msgspec.structs.replace(rec_config, diagnostics=diagnostics)
    return Job(
        snapshot=msgspec.json.encode(snapshot),
        fmt="json",
        config=rec_config,
        notes=left_out,
        is_kept=is_kept,
    )


def live_recommendation(
    extender: Extender, *, diagnostics: DiagnosticsLevel | None = None
) -> Recommendation:
    """The live recommendation computed right here (tests and tools; the handlers hand the job
    to the worker). Raises ``SnapshotError`` as ``live_job`` does."""
    result = compute(live_job(extender, diagnostics=diagnostics, is_kept=True))
    if result.recommendation is None:
        raise SnapshotError(result.errors)
    return result.recommendation


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
    metrics = request.app[METRICS]
    if not body.strip():
        extender.require_synced()
        try:
            job = live_job(extender, diagnostics=diagnostics)
        except SnapshotError as e:
            metrics.recommendations.labels("request", "failed").inc()
            # Not the caller's fault: the configured pools do not describe the cluster.
            return _bad_snapshot(e, status=409, reason="LiveStateMismatch")
        result = await request.app[RECOMMEND_WORKER].run(job)
        if result.errors:  # the live snapshot passed the same checks when it was read
            metrics.recommendations.labels("request", "failed").inc()
            error = SnapshotError(result.errors)
            return _bad_snapshot(error, status=409, reason="LiveStateMismatch")
    else:
        fmt: Literal["json", "yaml"] = "yaml" if request.content_type in _YAML_TYPES else "json"
        config = extender.config.recommender_config()
        if diagnostics is not None:
            config = msgspec.structs.replace(config, diagnostics=diagnostics)
        # The body goes to the worker as received: decoding a large snapshot is work too.
        result = await request.app[RECOMMEND_WORKER].run(Job(snapshot=body, fmt=fmt, config=config))
        if result.errors:
            metrics.recommendations.labels("request", "failed").inc()
            structlog.contextvars.bind_contextvars(reason=result.message)
            error = SnapshotError(result.errors)
            return _bad_snapshot(error, status=400, reason="InvalidSnapshot")
    metrics.recommendations.labels("request", "published").inc()
    structlog.contextvars.bind_contextvars(
        reason=f"{result.new_nodes} new nodes, {result.unscheduled} pods unscheduled"
    )
    return web.Response(body=result.answer, content_type=_JSON)


async def scale_down_handler(request: web.Request) -> web.Response:
    """Which existing nodes could go (``recommender.scale_down``) for the snapshot in the body;
    a bad one is a 400 as for ``POST /v1/recommend``. No live mode: the ledger does not keep
    what the check needs of placed pods (VM bounds, constraints, labels for budgets, static
    pods), and answering without them would remove nodes it should keep."""
    extender = request.app[EXTENDER]
    body = await read_body(request)
    if not body.strip():
        raise ProtocolError(
            "POST a ClusterSnapshot: the live state lacks what the scale-down check needs of"
            " placed pods (VM bounds, constraints, labels, static pods)",
            reason="SnapshotRequired",
        )
    fmt: Literal["json", "yaml"] = "yaml" if request.content_type in _YAML_TYPES else "json"
    job = Job(
        snapshot=body,
        fmt=fmt,
        config=extender.config.recommender_config(),
        scale_down=extender.config.recommender.scale_down,
    )
    result = await request.app[RECOMMEND_WORKER].run(job)
    if result.errors:
        return _bad_snapshot(SnapshotError(result.errors), status=400, reason="InvalidSnapshot")
    return web.Response(body=result.answer, content_type=_JSON)


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


async def publish_if_overdue(app: web.Application, *, now: float) -> Published | None:
    """One check of the auto-publish task. The live snapshot is read without an await (one
    consistent view); the recommendation runs in the worker."""
    extender = app[EXTENDER]
    if not extender.is_synced or not extender.is_leading:
        # The standby publishes nothing: the leader does, from the ledger that decides.
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
    try:
        # Nothing published reads the rounds' candidates: see the module docstring.
        job = live_job(extender, diagnostics=DiagnosticsLevel.SUMMARY, is_kept=True)
    except SnapshotError as e:
        metrics.recommendations.labels("auto", "failed").inc()
        log.warning("recommendation_failed", reason=overdue.reason, error=str(e))
        return None
    result = await app[RECOMMEND_WORKER].run(job)
    rec = result.recommendation
    if rec is None:
        metrics.recommendations.labels("auto", "failed").inc()
        log.warning("recommendation_failed", reason=overdue.reason, error=result.message)
        return None
    published = Published(
        recommendation=rec,
        at_wall=extender.wall_clock(),
        reason=overdue.reason,
        run_time_millis=result.run_time_millis,
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
                await publish_if_overdue(app, now=loop.time())
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
