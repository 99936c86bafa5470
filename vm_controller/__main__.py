"""``vm-controller``: run the VirtualMachine controller until SIGTERM or SIGINT.

Shell: parse the flags, check that the API server answers (one line and an exit code if not,
``observability.exits``), bind ``/healthz``, ``/readyz`` (true once its four watches have
listed: VMs, pods, Services, migrations) and ``/metrics``, then run ``Controller`` and
``Migrator``. No policy here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from observability.exits import EXIT_CODES_HELP, ExitCode, OneLineParser
from observability.log import configure_logging
from observability.running import run_service
from vm_controller.controller import Controller
from vm_controller.metrics import ControllerMetrics
from vm_controller.migrator import DEFAULT_TARGET_POD_TIMEOUT_SECONDS, ExtenderMoves, Migrator
from vm_runner.migration import MigrationConfig

log = structlog.get_logger("vm_controller")

PROG = "vm-controller"
PREFLIGHT_TIMEOUT_SECONDS = 10.0
DEFAULT_EXTENDER_URL = "http://scheduler-extender.vm-autoscaling.svc:10299"
DEFAULT_TOKEN_FILE = "/var/run/secrets/vm-autoscaling/extender/token"

DESCRIPTION = """\
Turn each VirtualMachine (vm-autoscaling.io/v1alpha1) into a runner pod annotated as the
scheduler extender and the autoscaler agent read VM pods, and a headless Service (a Service of
the VM's name that another owns is left alone, and the VM says so); report the pod's phase,
node and sizes in the VirtualMachine's status; make the pod or the Service again when one goes.
Move VMs live as VirtualMachineMigrations ask (the target's room reserved by the extender).
Needs the CRDs of manifests/vm-controller/crds/ installed (kubectl apply -k manifests/).
"""

CONTROLLER = web.AppKey("controller", Controller)
MIGRATOR = web.AppKey("migrator", Migrator)
REGISTRY = web.AppKey("registry", CollectorRegistry)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--kubeconfig",
        metavar="PATH",
        default=None,
        help="kubeconfig to reach the API server; default: the pod's in-cluster service account",
    )
    p.add_argument(
        "--http-host", default="0.0.0.0", help="address of /healthz, /readyz and /metrics"
    )
    p.add_argument("--http-port", type=int, default=8080, help="their port (default: 8080)")
    moves = p.add_argument_group("live migration (VirtualMachineMigration)")
    moves.add_argument(
        "--extender-url",
        default=DEFAULT_EXTENDER_URL,
        help="the scheduler extender's permit port, where the target's room is reserved "
        "(POST /v1/moves) (default: %(default)s)",
    )
    moves.add_argument(
        "--extender-token-file",
        metavar="PATH",
        default=DEFAULT_TOKEN_FILE,
        help="a token the extender accepts: a projected ServiceAccount token for its audience "
        "(re-read at each call), or the extender's static token in local runs "
        "(default: %(default)s)",
    )
    moves.add_argument(
        "--migration-downtime-ms",
        type=int,
        default=MigrationConfig.downtime_limit_ms,
        help="QEMU's downtime limit for the final pause (default: %(default)s)",
    )
    moves.add_argument(
        "--migration-deadline-seconds",
        type=float,
        default=MigrationConfig.converge_deadline_seconds,
        help="a transfer not completed by then is cancelled; the source runs on "
        "(default: %(default)s)",
    )
    moves.add_argument(
        "--migration-target-pod-timeout-seconds",
        type=float,
        default=DEFAULT_TARGET_POD_TIMEOUT_SECONDS,
        help="a target pod not Running with an IP by then fails the move; the source runs on "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="least severe log level written (default: info)",
    )
    return p


def make_app(
    controller: Controller, migrator: Migrator, registry: CollectorRegistry
) -> web.Application:
    app = web.Application()
    app[CONTROLLER] = controller
    app[MIGRATOR] = migrator
    app[REGISTRY] = registry

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        # The migrations' list too: a replica that served before it would not yet act on (or
        # recover) a move it is responsible for.
        if request.app[CONTROLLER].is_synced and request.app[MIGRATOR].listed.is_set():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="watches not listed yet\n")

    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(request.app[REGISTRY])
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def run(args: argparse.Namespace) -> None:
    from kube_io import NotFound  # noqa: PLC0415
    from kube_io.preflight import StartupProblem, check_api_server, connect  # noqa: PLC0415

    await check_api_server(args.kubeconfig, timeout_seconds=PREFLIGHT_TIMEOUT_SECONDS)
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    registry = CollectorRegistry()
    client = await connect(args.kubeconfig)
    try:
        await client.list_virtual_machines(page_size=1)
        await client.list_virtual_machine_migrations(page_size=1)
    except NotFound as e:
        await client.close()
        raise StartupProblem(
            "the VirtualMachine CRDs are not installed: kubectl apply -k manifests/",
            ExitCode.CONFIG,
        ) from e
    config: MigrationConfig = args.migration_config
    metrics = ControllerMetrics(registry)
    controller = Controller(client, metrics)
    extender = ExtenderMoves(args.extender_url, args.extender_token_file)
    migrator = Migrator(
        controller,
        extender,
        metrics,
        config,
        target_pod_timeout_seconds=args.migration_target_pod_timeout_seconds,
    )
    runner = web.AppRunner(make_app(controller, migrator, registry), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.http_host, args.http_port).start()
        log.info("vm_controller_started", host=args.http_host, port=args.http_port)
        with contextlib.suppress(asyncio.CancelledError):
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(controller.run())
                tasks.create_task(migrator.run())
    finally:
        await extender.close()
        await runner.cleanup()
        await client.close()
    log.info("vm_controller_stopped")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Operator mistakes in the migration flags: one line and exit 2, before any connection.
    try:
        args.migration_config = MigrationConfig(
            downtime_limit_ms=args.migration_downtime_ms,
            converge_deadline_seconds=args.migration_deadline_seconds,
        )
    except ValueError as e:
        parser.error(str(e))
    if args.migration_target_pod_timeout_seconds <= 0:
        parser.error("--migration-target-pod-timeout-seconds must be > 0")
    configure_logging(args.log_level)
    where = f"{args.http_host}:{args.http_port}"
    return run_service(PROG, run(args), listening_on=where)


if __name__ == "__main__":
    sys.exit(main())
