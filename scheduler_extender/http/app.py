"""Building and serving the extender's listeners.

Shell. ``make_app(config, deps)`` builds kube-scheduler's listener (verbs, probes, metrics,
state); it owns the lifecycle through ``cleanup_ctx``: connect the kube client, start the
watches, the durability writer and the Event poster; on teardown, give pending permit writes a
moment, cancel the tasks (reverse order), close the client. ``make_permits_app`` builds the
agents' listener over the same ``Extender``, and ``make_metrics_app`` Prometheus's (when
``listen.metrics`` is set); they have no lifecycle of their own and must be started after, and
stopped before, the verbs app (``serve`` does so).

Nothing is global: every dependency arrives in ``Deps`` or the config and is stored under a
typed ``AppKey``, so a test builds as many independent apps as it likes.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from kube_io.client import KubeClient
from scheduler_extender.config import (
    Config,
    ConfigError,
    FrontMode,
    Listen,
    MetricsAuth,
    MetricsListen,
    QuotaSection,
)
from scheduler_extender.event_loop import loop_name
from scheduler_extender.http import moves, ops, recommend, verbs
from scheduler_extender.http.bodies import BODIES, Bodies
from scheduler_extender.http.connections import GuardedSite, server_options
from scheduler_extender.http.front import PermitFront, authenticator, make_front_app
from scheduler_extender.http.keys import (
    AUTHENTICATOR,
    EXTENDER,
    EXTRA_METRICS,
    METRICS_GUARD,
    TASKS,
)
from scheduler_extender.http.middleware import METRICS, request_middleware
from scheduler_extender.http.moves import MOVES_AUTHENTICATOR
from scheduler_extender.http.permit_port import LocalDesk
from scheduler_extender.kube.auth import TokenBucket
from scheduler_extender.kube.durability import PermitRecorder
from scheduler_extender.kube.leader import LeaderLoop
from scheduler_extender.kube.link import KubeLink
from scheduler_extender.kube.metrics_auth import DelegatedMetricsAuth, MetricsGuard, OpenMetrics
from scheduler_extender.kube.node_alloc import NodeAllocReporter
from scheduler_extender.kube.queue_notices import QueueNotices
from scheduler_extender.kube.standalone import StandaloneCluster
from scheduler_extender.metrics import Metrics
from scheduler_extender.quota_source import follow_quota_file, read_quota_file
from scheduler_extender.relief import run_relief
from scheduler_extender.service import Extender
from scheduler_extender.sync import follow_cluster

log = structlog.get_logger(__name__)

KubeConnector = Callable[[], Awaitable[KubeClient]]
# The verbs listener's (aiohttp's own) or a guarded one's.
Site = GuardedSite
# How long teardown waits for pending permit writes before cancelling them (the agents'
# lastPermit covers anything lost).
_FLUSH_SECONDS: Final = 2.0


@dataclass(frozen=True, kw_only=True)
class Deps:
    """What the app needs from outside. Exactly one of ``connect_kube``/``standalone``."""

    registry: CollectorRegistry
    connect_kube: KubeConnector | None = None
    standalone: StandaloneCluster | None = None
    # Wall-clock seconds, only for the allocation times shown in /state and logs.
    wall_clock: Callable[[], float] = time.time
    # gc.freeze() once the first lists are in (process-wide: the server sets it, tests don't).
    freeze_gc: bool = False
    # For the permit front's own API client (``serve``, mode process): the kubeconfig
    # ``connect_kube`` uses, None for in-cluster credentials; and its log level.
    kubeconfig: str | None = None
    log_level: str = "info"
    # Who this replica is, for leader election: its host (the pod's name: kube-scheduler's
    # holderIdentity starts with it), and its pod (namespace, name) to label, if known.
    host: str = ""
    pod: tuple[str, str] | None = None


def _metrics_guard(listen: MetricsListen, link: KubeLink | None) -> MetricsGuard:
    if listen.auth is MetricsAuth.NONE:
        return OpenMetrics()
    if link is None:
        raise ConfigError(
            "standalone mode has no API server to review scrapers' tokens:"
            " set listen.metrics.auth none"
        )
    return DelegatedMetricsAuth(
        lambda token: link.review_token(token, audiences=()),
        link.review_access,
        ttl_seconds=listen.allowed_cache_ttl_seconds,
        negative_ttl_seconds=listen.refused_cache_ttl_seconds,
        max_entries=listen.cache_max_entries,
        budget=TokenBucket(
            rate_per_second=listen.review_rate_per_second, burst=listen.review_burst
        ),
    )


def make_app(config: Config, deps: Deps) -> web.Application:
    """kube-scheduler's listener; owns the lifecycle of everything shared with the permit port."""
    if (deps.connect_kube is None) == (deps.standalone is None):
        raise ValueError("Deps needs exactly one of connect_kube and standalone")
    metrics = Metrics(deps.registry)
    link = KubeLink() if deps.connect_kube is not None else None
    reporter = NodeAllocReporter(metrics, link if config.kube.post_events else None)
    durability = config.durability
    recorder = (
        PermitRecorder(link, durability, metrics)
        if link is not None and (durability.write_annotations or durability.resize_pods)
        else None
    )
    notices = QueueNotices(reporter, link, wall_clock=deps.wall_clock)
    extender = Extender(
        config,
        metrics=metrics,
        reporter=reporter,
        recorder=recorder,
        binder=link,
        notices=notices,
        wall_clock=deps.wall_clock,
    )
    extender.freeze_gc_when_synced = deps.freeze_gc
    if link is not None:
        link.may_write = extender.may_write  # every write but the Lease's passes this gate
    app = web.Application(
        middlewares=[request_middleware],
        client_max_size=config.limits.verbs_max_body_bytes,
    )
    app[EXTENDER] = extender
    app[AUTHENTICATOR] = authenticator(config, link, metrics)
    if config.listen.metrics is not None:
        app[METRICS_GUARD] = _metrics_guard(config.listen.metrics, link)
    app[METRICS] = metrics
    app[BODIES] = Bodies(config.limits)
    app[TASKS] = []
    app[verbs.FILTER_ANSWERS] = verbs.Answers()
    # A quarter of filter's bound: a non-cache list is every passing Node object, and at
    # 5,000 nodes kube-scheduler's lists rarely repeat (with both caches at 64 MiB the
    # extender's RSS reached 269 MiB there, against the manifest's 512 MiB limit).
    app[verbs.PRIORITIZE_ANSWERS] = verbs.Answers(max_bytes=16 * 2**20)
    app[verbs.POD_INFOS] = verbs.PodInfos(config.scheduler_name)
    app.router.add_post("/filter", verbs.filter_nodes, name="filter")
    app.router.add_post("/prioritize", verbs.prioritize, name="prioritize")
    app.router.add_post("/bind", verbs.bind, name="bind")
    app.router.add_post("/preempt", verbs.preempt, name="preempt")
    _add_ops(app)
    _add_status(app)
    app.router.add_get("/v1/queue", ops.queue, name="queue")
    app[MOVES_AUTHENTICATOR] = moves.controller_authenticator(config, link, metrics)
    recommend.install(app, config)
    quota = config.quota
    if quota is not None and quota.file is not None:
        app.cleanup_ctx.append(_quota_file_ctx(extender, Path(quota.file), quota))

    if deps.standalone is not None:
        cluster = deps.standalone

        async def load_standalone(app: web.Application) -> AsyncIterator[None]:
            extender.nodes_listed(cluster.node_objects())
            extender.pods_listed(cluster.pod_objects(scheduler_name=config.scheduler_name))
            log.info("standalone_loaded", nodes=len(cluster.nodes), pods=len(cluster.pods))
            yield

        app.cleanup_ctx.append(load_standalone)
    else:
        assert deps.connect_kube is not None and link is not None
        connect = deps.connect_kube

        async def run_kube(app: web.Application) -> AsyncIterator[None]:
            client = await connect()
            link.client = client
            tasks = app[TASKS]
            tasks.append(_start(follow_cluster(client, extender), "cluster-watch"))
            leader: LeaderLoop | None = None
            if config.leader_election is not None:
                leader = LeaderLoop(
                    config.leader_election,
                    client,
                    extender,
                    labels=link,
                    host=deps.host,
                    pod=deps.pod,
                    clock=extender.clock,
                    wall_clock=deps.wall_clock,
                )
                extender.elector = leader.elector
                extender.metrics.leading.set(0)
                # The standby posts no Events and touches no pods: the leader does.
                reporter.is_quiet = lambda: not extender.is_leading
                leader_task = _start(leader.run(), "leader-election")
                tasks.append(leader_task)
            if recorder is not None:
                tasks.append(_start(recorder.run(), "durability-writer"))
            if config.kube.post_events:
                tasks.append(_start(reporter.run(), "node-alloc-events"))
            tasks.append(_start(notices.run(), "queue-notices"))
            if config.relief.enabled:
                relief = run_relief(
                    extender,
                    link,
                    reporter,
                    interval_seconds=config.relief.interval_seconds,
                    wall_clock=deps.wall_clock,
                )
                tasks.append(_start(relief, "relief"))
            try:
                yield
            finally:
                if leader is not None:
                    # First stop deciding and hand the Lease over (released), so the standby
                    # takes it within its next read rather than after the Lease runs out.
                    leader_task.cancel()
                    await asyncio.gather(leader_task, return_exceptions=True)
                    await leader.resign()
                if recorder is not None:
                    try:
                        async with asyncio.timeout(_FLUSH_SECONDS):
                            await recorder.wait_idle()
                    except TimeoutError:
                        log.warning("permit_writes_abandoned", pending=recorder.pending_count)
                for task in reversed(tasks):
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                tasks.clear()
                link.client = None
                await client.close()

        app.cleanup_ctx.append(run_kube)
    return app


def make_permits_app(config: Config, verbs_app: web.Application) -> web.Application:
    """The agents' listener in this process, sharing ``verbs_app``'s Extender (start it after
    that one): the permit front's app joined to a ``LocalDesk`` (``front``)."""
    desk = LocalDesk(verbs_app[EXTENDER], verbs_app[TASKS])
    return make_front_app(
        config,
        desk=desk,
        auth=verbs_app[AUTHENTICATOR],
        moves_auth=verbs_app[MOVES_AUTHENTICATOR],
        metrics=verbs_app[METRICS],
        bodies=verbs_app[BODIES],
    )


def make_metrics_app(config: Config, verbs_app: web.Application) -> web.Application:
    """Prometheus's listener (``listen.metrics``): ``/metrics`` behind ``METRICS_GUARD``, and
    the probes. Shares ``verbs_app``'s Extender and registry; start it after that one."""
    app = web.Application(middlewares=[request_middleware], client_max_size=1024)
    app[EXTENDER] = verbs_app[EXTENDER]
    app[METRICS] = verbs_app[METRICS]
    app[TASKS] = verbs_app[TASKS]
    app[METRICS_GUARD] = verbs_app[METRICS_GUARD]
    # The permit front's families (its permit latency, errors and token reviews), as on the
    # verbs listener's /metrics: without them Prometheus saw no permit latency at all.
    extra = verbs_app.get(EXTRA_METRICS)
    if extra is not None:
        app[EXTRA_METRICS] = extra
    app.router.add_get("/metrics", ops.guarded_metrics, name="metrics")
    _add_ops(app)
    return app


def _add_ops(app: web.Application) -> None:
    app.router.add_get("/healthz", ops.healthz, name="healthz")
    app.router.add_get("/readyz", ops.readyz, name="readyz")


def _add_status(app: web.Application) -> None:
    app.router.add_get("/metrics", ops.metrics, name="metrics")
    app.router.add_get("/state", ops.state, name="state")


def _quota_file_ctx(
    extender: Extender, path: Path, quota: QuotaSection
) -> Callable[[web.Application], AsyncIterator[None]]:
    """Load the quota file before serving (ConfigError when it fails), then follow it."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        raw, quotas = read_quota_file(path)
        extender.quotas_loaded(quotas)
        task = _start(
            follow_quota_file(
                path, extender, loaded=raw, interval_seconds=quota.reload_interval_seconds
            ),
            "quota-file",
        )
        app[TASKS].append(task)
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    return ctx


def _start(coro: Awaitable[None], name: str) -> asyncio.Task[None]:
    async def supervised() -> None:
        try:
            await coro
        except Exception:
            # Task boundary: /healthz reports the dead task; the log says why.
            log.exception("background_task_failed", task=name)
            raise

    return asyncio.get_running_loop().create_task(supervised(), name=name)


async def start_listeners(
    config: Config,
    verbs_app: web.Application,
    permits_app: web.Application | PermitFront,
    metrics_app: web.Application | None = None,
) -> list[tuple[web.AppRunner, Site]]:
    """Start the listeners, verbs first (it owns the lifecycle); each with its guards (the
    verbs: aiohttp's options and the header timeout alone, see ``connections``). A
    ``PermitFront`` only binds its socket here (in the listeners' order, so a port in use
    fails the start the same way); ``serve`` starts its process."""
    started: list[tuple[web.AppRunner, Site]] = []
    apps: list[tuple[web.Application | PermitFront, Listen]] = [
        (verbs_app, config.listen.verbs),
        (permits_app, config.listen.permits),
    ]
    if metrics_app is not None:
        assert config.listen.metrics is not None
        apps.append((metrics_app, config.listen.metrics))
    loop = loop_name(asyncio.get_running_loop())
    try:
        for app, listen in apps:
            if isinstance(app, PermitFront):
                app.bind()
                log.info("listening", host=listen.host, port=app.bound_port, front=True, loop=loop)
                continue
            runner = web.AppRunner(
                app,
                handle_signals=False,
                shutdown_timeout=config.shutdown_timeout_seconds,
                access_log=None,  # the middleware writes each request's one line
                **server_options(listen),
            )
            await runner.setup()
            # The verbs' (a plain ``Listen``) gets the header timeout only (``connections``).
            site = GuardedSite(runner, listen)
            started.append((runner, site))
            await site.start()
            log.info("listening", host=listen.host, port=bound_port(site), loop=loop)
    except BaseException:
        await stop_listeners(started)
        if isinstance(permits_app, PermitFront):
            await permits_app.stop()
        raise
    return started


def bound_port(site: Site) -> int:
    """The port a started site listens on (the one the OS picked for port 0)."""
    return site.bound_port


async def stop_listeners(started: list[tuple[web.AppRunner, Site]]) -> None:
    # Permits first: agents retry elsewhere-in-time; the verbs app owns the watches.
    for runner, site in reversed(started):
        await site.stop()
        await runner.cleanup()


async def serve(config: Config, deps: Deps) -> None:
    """Run the listeners until SIGTERM/SIGINT, then shut down in order (see module doc): the
    permit front first, then the metrics and verbs listeners."""
    verbs_app = make_app(config, deps)
    permits: web.Application | PermitFront
    front: PermitFront | None = None
    if config.permit_front.mode is FrontMode.INLINE:
        permits = make_permits_app(config, verbs_app)
    else:
        front = permits = PermitFront(
            config,
            LocalDesk(verbs_app[EXTENDER], verbs_app[TASKS]),
            kubeconfig=deps.kubeconfig,
            log_level=deps.log_level,
        )
        verbs_app[EXTRA_METRICS] = front.families
    metrics_app = make_metrics_app(config, verbs_app) if config.listen.metrics else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        started = await start_listeners(config, verbs_app, permits, metrics_app)
        try:
            if front is not None:
                # Its death makes /healthz fail, like any background task's.
                verbs_app[TASKS].append(_start(front.run(), "permit-front"))
            await stop.wait()
            log.info("shutting_down")
        finally:
            if front is not None:
                await front.stop()
            await stop_listeners(started)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
