"""``autoscaler-agent``: the per-node agent that keeps each VM's vCPUs matched to its load.

Shell: parse the flags, load the config (exit 3 if unusable), check that the API server answers
(unless standalone), and only then bind the HTTP port (``/healthz``, ``/metrics``) and run the
supervisor of the VM loops until SIGTERM or SIGINT. Every operator mistake ends in one line and
the exit code of its class (``observability.exits``). No policy here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from autoscaler_agent.config import Config, ConfigError, load_config
from autoscaler_agent.discovery import (
    DiscoveryError,
    KubeSource,
    StandaloneSource,
    VmSource,
    VmTarget,
)
from autoscaler_agent.extender_client import (
    EpochWatch,
    ExtenderClient,
    ExtenderError,
    PermitBatcher,
    TokenFile,
)
from autoscaler_agent.hypervisor import (
    Hypervisor,
    hypervisor_from_url,
    memory_signal_socket_from_url,
)
from autoscaler_agent.metrics import AgentMetrics
from autoscaler_agent.runner import (
    RESIZE_DIRECTIONS,
    RESIZE_RESULTS,
    RunnerDeps,
    Supervisor,
    VmLoops,
)
from observability.exits import EXIT_CODES_HELP, ExitCode, OneLineParser, fail
from observability.log import configure_logging
from observability.running import run_service

log = structlog.get_logger("autoscaler_agent")

PROG = "autoscaler-agent"
EXIT_CONFIG = ExitCode.CONFIG
# The start-up check of the API server waits at most this long for an answer (seconds).
PREFLIGHT_TIMEOUT_SECONDS = 10.0

DESCRIPTION = """\
Keep the vCPUs of each VM on this node matched to its load. Every scrape interval the agent
reads each VM's node_exporter, asks the scheduler extender for a permit before growing, resizes
the VM through its hypervisor, and tells the extender after shrinking.

The node is taken from the NODE_NAME environment variable (set it from the downward API:
spec.nodeName); in standalone mode it defaults to this host's name.
"""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        required=True,
        metavar="FILE",
        help="agent config (YAML): scrape, policy, extender, retry, hypervisor, http and log"
        " sections; every key is optional (an empty file gives the defaults). Unknown keys and"
        " bad values exit with status 3 and the $.path of the problem.",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="PATH",
        default=None,
        help="kubeconfig used to watch this node's pods; default: the pod's in-cluster service"
        " account. The API server must answer before the HTTP port is bound (exit 4, 5 or 6"
        " otherwise). Ignored with --standalone.",
    )
    p.add_argument(
        "--standalone",
        metavar="VMS.yaml",
        default=None,
        help="manage the VMs listed in this file instead of watching Kubernetes (one machine,"
        " no cluster). Each entry: name, namespace, uid, node, min_vcpus, max_vcpus,"
        " scaling_unit, memory, hypervisor, metrics_url. The file is re-read when it changes.",
    )
    return p


HEALTH = web.AppKey("registry", CollectorRegistry)


def make_app(registry: CollectorRegistry) -> web.Application:
    """``/healthz`` (the process and its loop are alive) and ``/metrics``."""
    app = web.Application()
    app[HEALTH] = registry

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(request.app[HEALTH])
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str, port: int) -> AsyncIterator[None]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("http_listening", host=host, port=port)
        yield
    finally:
        await runner.cleanup()


async def run_agent(config: Config, *, node: str, source: VmSource) -> None:
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry)
    # Every kind of failed call at 0 from the start, so that a rate or increase over the
    # counter sees the first failure too (a series born at 1 shows no increase).
    for error in ExtenderError.__subclasses__():
        metrics.extender_errors.labels(kind=error.kind)
    # The same for resizes, each direction and result of both resources: the dashboard's
    # resize latency is a rate over the histogram, which a VM's first grow would not move.
    for direction in RESIZE_DIRECTIONS:
        for histogram in (metrics.resize_duration, metrics.memory_resize_duration):
            histogram.labels(direction=direction)
        for result in RESIZE_RESULTS:
            for counter in (metrics.resizes, metrics.memory_resizes):
                counter.labels(direction=direction, result=result)
    root = Path(config.hypervisor.socket_root)

    def hypervisor_for(target: VmTarget) -> Hypervisor:
        return hypervisor_from_url(
            target.hypervisor_url,
            root=root,
            timeout_seconds=config.hypervisor.timeout_seconds,
            unplug_timeout_seconds=config.hypervisor.unplug_timeout_seconds,
            memory_stall_seconds=config.hypervisor.memory_stall_seconds,
            memory_resize_timeout_seconds=config.hypervisor.memory_resize_timeout_seconds,
        )

    def memory_signal_socket(target: VmTarget) -> Path | None:
        return memory_signal_socket_from_url(target.hypervisor_url, root=root)

    token = TokenFile(Path(config.extender.token_file) if config.extender.token_file else None)
    # One pool per node for every scrape: hundreds of VMs, each one short GET per second.
    # No DNS cache of our own (aiohttp keeps an answer 10 s by default, whatever its TTL): a
    # VM's metrics URL names its pod's record in the VM's headless Service, and after a live
    # move that record leads to the new pod; a cached answer kept the agent scraping the old
    # pod's address for up to 10 s after the cut-over, its guest gone, the VM unsized. The
    # cluster's DNS caches by the records' TTLs; connections are kept alive, so a lookup is made
    # only for a new connection.
    connector = aiohttp.TCPConnector(limit=256, use_dns_cache=False)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        serving(make_app(registry), config.http.host, config.http.port),
    ):
        epochs = EpochWatch()
        client = ExtenderClient(
            session,
            base_url=config.extender.url,
            node=node,
            token=token,
            timeout_seconds=config.extender.timeout_seconds,
            epochs=epochs,
        )
        batcher = PermitBatcher(client, window_seconds=config.extender.batch_window_seconds)
        deps = RunnerDeps(
            core=config.core(),
            node=node,
            session=session,
            permits=batcher,
            hypervisor_for=hypervisor_for,
            metrics=metrics,
            scrape_timeout_seconds=config.scrape.timeout_seconds,
            stuck_after_seconds=config.metrics.stuck_after_seconds,
            cgroup_root=Path(config.scrape.cgroup_root) if config.scrape.cgroup_root else None,
            epochs=epochs,
            memory_signal_socket=memory_signal_socket if config.memory.guest_signals else None,
        )
        loops = VmLoops(deps)
        supervisor = Supervisor(loops.run, node=node, metrics=metrics, update_vm=loops.update)
        epoch_check = asyncio.create_task(
            client.keep_epoch_fresh(
                interval_seconds=config.extender.epoch_check_seconds,
                failed=lambda e: metrics.extender_errors.labels(kind=e.kind).inc(),
            ),
            name="epoch-check",
        )
        try:
            await supervisor.run(source)
        finally:
            epoch_check.cancel()
            await asyncio.gather(epoch_check, return_exceptions=True)
            await batcher.close()


async def _main_async(
    config: Config, *, node: str, source: VmSource, kubeconfig: str | None, standalone: bool
) -> None:
    if not standalone:
        # Before the port is bound: a bad kubeconfig or a silent API server is one line now.
        from kube_io.preflight import check_api_server  # noqa: PLC0415 (kube_io stays optional)

        await check_api_server(kubeconfig, timeout_seconds=PREFLIGHT_TIMEOUT_SECONDS)
    log.info("agent_starting", standalone=standalone)
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await run_agent(config, node=node, source=source)
    log.info("agent_stopped")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        return fail(PROG, f"config error: {e}", EXIT_CONFIG)
    configure_logging(config.log.level)
    node = os.environ.get("NODE_NAME", "")
    source: VmSource
    if args.standalone:
        node = node or socket.gethostname()
        source = StandaloneSource(Path(args.standalone), node=node)
        try:
            source.load()  # fail fast (exit 3) on a broken file, before anything starts
        except DiscoveryError as e:
            return fail(PROG, str(e), EXIT_CONFIG)
    else:
        if not node:
            return fail(
                PROG,
                "NODE_NAME is not set: set it from the downward API (spec.nodeName), or pass"
                " --standalone VMS.yaml",
                EXIT_CONFIG,
            )
        source = KubeSource(kubeconfig=args.kubeconfig, node=node)
    structlog.contextvars.bind_contextvars(node=node)
    main_task = _main_async(
        config,
        node=node,
        source=source,
        kubeconfig=args.kubeconfig,
        standalone=bool(args.standalone),
    )
    where = f"{config.http.host}:{config.http.port} (http in {args.config})"
    return run_service(PROG, main_task, listening_on=where)


if __name__ == "__main__":
    sys.exit(main())
