"""``scheduler-extender``: the command line.

Shell: parse arguments, load the config (exit 3 on any config error, naming ``$.path``),
check that the API server answers with the credentials given (before binding any port),
configure logging once, serve until SIGTERM. Every operator mistake ends in one line and the
exit code of its class (``observability.exits``); only a bug gets a traceback.
Subcommands leave room for offline tools (``recommend``) next to ``serve``, which is the default
when none is named, so ``scheduler-extender --config FILE`` keeps working. The simulator is not
one of them: it is its own command (``vm-simulator``), so the extender never imports it.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
import structlog
from prometheus_client import CollectorRegistry

from kube_io.client import KubeClient
from kube_io.preflight import StartupProblem, check_api_server
from observability.exits import EXIT_CODES_HELP, ExitCode, OneLineParser, fail
from observability.log import configure_logging
from observability.running import LISTEN_ERRNOS
from scheduler_extender.config import Config, ConfigError, Listen, load_config
from scheduler_extender.event_loop import EventLoop
from scheduler_extender.event_loop import run as run_loop
from scheduler_extender.http.app import Deps, serve
from scheduler_extender.http.front import COMMAND as FRONT_COMMAND
from scheduler_extender.http.front import run_front
from scheduler_extender.kube.standalone import load_cluster
from scheduler_extender.recommender import (
    DiagnosticsLevel,
    SnapshotError,
    encode_recommendation,
    encode_scale_down,
    load_snapshot,
    recommend,
    recommend_scale_down,
)

PROG: Final = "scheduler-extender"
EXIT_CONFIG: Final = ExitCode.CONFIG
EXIT_STARTUP: Final = ExitCode.FAILED
COMMANDS: Final = ("serve", "recommend")
# The start-up check of the API server waits at most this long for an answer (seconds).
PREFLIGHT_TIMEOUT_SECONDS: Final = 10.0

_DESCRIPTION = """\
Capacity-accounting kube-scheduler extender for VMs that grow and shrink vCPUs live.

Commands:
  serve   (default) answer kube-scheduler's filter/prioritize/bind/preempt on the verbs
          listener, the agents' permit requests on the permit listener (served by a child
          process, the permit front, unless permit_front.mode is inline) and, when
          listen.metrics is set, Prometheus's scrapes of /metrics on the metrics listener
          (behind a TokenReview and SubjectAccessReview unless listen.metrics.auth is none).
  recommend SNAPSHOT.yaml [--config FILE] [--diagnostics full|summary] [--scale-down]
          print the scale-up recommendation for a ClusterSnapshot (YAML or JSON) as JSON,
          or with --scale-down which nodes could be removed; exit 3 naming each bad $.path
          (see examples/snapshots/basic.yaml and docs/RECOMMENDER.md).
  permit-front
          internal: the permit port's process, which `serve` starts itself (see
          docs/DEPLOY.md); never run it by hand.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description=_DESCRIPTION,
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve_parser = commands.add_parser(
        "serve",
        help="serve the extender (the default command)",
        description=_DESCRIPTION,
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve_parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="YAML config file (see examples/extender-config.yaml); every key has a default, "
        "so it may be omitted",
    )
    source = serve_parser.add_mutually_exclusive_group()
    source.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig for the API server; without it (and without --standalone) the pod's "
        "in-cluster service account is used. Before any port is bound the API server must "
        "answer GET /version (exit 4, 5 or 6 otherwise)",
    )
    source.add_argument(
        "--standalone",
        type=Path,
        metavar="FILE",
        help="no API server: nodes and pods come from this YAML file "
        "(see examples/standalone-cluster.yaml); bind only records; needs auth.mode static",
    )
    serve_parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="lowest level logged (default: info); JSON lines unless stderr is a terminal",
    )
    serve_parser.add_argument(
        "--event-loop",
        default=EventLoop.AUTO.value,
        choices=[e.value for e in EventLoop],
        help="auto (default): uvloop when it is installed (it is wherever it builds), else"
        " asyncio's own loop; asyncio: asyncio's loop anyway (same behaviour, more CPU per"
        " request)",
    )
    recommend_parser = commands.add_parser(
        "recommend",
        help="print the scale-up recommendation for a ClusterSnapshot file",
        description="Print the scale-up recommendation for SNAPSHOT (YAML, or JSON when the"
        " name ends in .json) as JSON on stdout. Exit 3 when the snapshot or config is invalid"
        " (each error names its $.path).",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    recommend_parser.add_argument(
        "snapshot",
        type=Path,
        metavar="SNAPSHOT",
        help="a ClusterSnapshot: the cluster's nodes, its pending VM pods and the node pools it"
        " could add (YAML, or JSON when the name ends in .json; see"
        " examples/snapshots/basic.yaml)",
    )
    recommend_parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="extender config whose scheduler_name, system_reserve, recommender.scorers,"
        " recommender.plan_search_steps and recommender.diagnostics apply",
    )
    recommend_parser.add_argument(
        "--diagnostics",
        choices=[d.value for d in DiagnosticsLevel],
        help="how much of the greedy rounds to print: full (every candidate of every round,"
        " with its score and pods) or summary (one line per round: its winner and new node;"
        " faster, and far smaller on large snapshots). Everything else in the answer is the"
        " same. Default: the config's recommender.diagnostics, summary unless set",
    )
    recommend_parser.add_argument(
        "--scale-down",
        action="store_true",
        help="instead of the scale-up, print which existing nodes could be removed with every"
        " pod still placed (the config's recommender.scale_down: growth_headroom,"
        " max_nodes_at_once)",
    )
    return parser


def recommend_command(args: argparse.Namespace) -> int:
    """Offline: read, check, simulate, print. No logging setup: stdout is the JSON alone."""
    try:
        full_config = load_config(args.config)
        config = full_config.recommender_config()
    except ConfigError as e:
        return fail(PROG, f"config error: {e}", EXIT_CONFIG)
    if args.diagnostics is not None:
        config = msgspec.structs.replace(config, diagnostics=DiagnosticsLevel(args.diagnostics))
    path: Path = args.snapshot
    try:
        data = path.read_bytes()
    except OSError as e:
        return fail(PROG, f"{path}: cannot read: {e.strerror}", EXIT_CONFIG)
    fmt: Literal["json", "yaml"] = "json" if path.suffix == ".json" else "yaml"
    try:
        prepared = load_snapshot(data, fmt=fmt, scheduler_name=config.scheduler_name)
        if args.scale_down:
            down = recommend_scale_down(
                prepared, config=config, scale_down=full_config.recommender.scale_down
            )
            answer = encode_scale_down(down)
        else:
            answer = encode_recommendation(recommend(prepared, config=config))
    except SnapshotError as e:
        for error in e.errors:
            print(
                f"scheduler-extender: {path}: {error.message} - at `{error.path}`", file=sys.stderr
            )
        return EXIT_CONFIG
    sys.stdout.buffer.write(answer + b"\n")
    sys.stdout.flush()
    return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    args = list(argv)
    if not args or args[0] not in COMMANDS:
        # ``serve`` is the default: ``scheduler-extender --config F`` and ``--help`` both
        # reach the serve parser, whose help lists every flag.
        args = ["serve", *args]
    return build_parser().parse_args(args)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [FRONT_COMMAND]:
        return run_front(argv[1:])
    args = parse_args(argv)
    if args.command == "recommend":
        return recommend_command(args)
    try:
        config = load_config(args.config)
        cluster = load_cluster(args.standalone) if args.standalone is not None else None
    except ConfigError as e:
        return fail(PROG, f"config error: {e}", EXIT_CONFIG)
    kubeconfig: str | None = args.kubeconfig
    whoami = _whoami()
    # Each replica its own user agent: the two share a ServiceAccount, and the API server's
    # audit log tells their requests apart by it.
    user_agent = f"scheduler-extender ({whoami['host']})"

    async def connect() -> KubeClient:
        return await KubeClient.connect(kubeconfig, user_agent=user_agent)

    deps = Deps(
        registry=CollectorRegistry(),
        connect_kube=None if cluster is not None else connect,
        standalone=cluster,
        freeze_gc=True,
        kubeconfig=kubeconfig,
        log_level=args.log_level,
        **whoami,
    )

    async def start() -> None:
        if cluster is None:
            # Before any port is bound: a bad kubeconfig or a silent API server is one line
            # now, not a traceback, nor a watch retrying forever behind a healthy-looking port.
            await check_api_server(kubeconfig, timeout_seconds=PREFLIGHT_TIMEOUT_SECONDS)
        configure_logging(level=args.log_level)
        # Which loop runs is said on the "listening" lines (serve), once the config has
        # passed: an operator's mistake stays one line.
        await serve(config, deps)

    try:
        run_loop(start(), EventLoop(args.event_loop))
    except StartupProblem as e:
        return fail(PROG, str(e), e.code)
    except ConfigError as e:
        return fail(PROG, f"config error: {e}", EXIT_CONFIG)
    except OSError as e:
        if e.errno in LISTEN_ERRNOS:
            return fail(PROG, _listen_problem(config, args.config, e), ExitCode.PORT_IN_USE)
        structlog.get_logger(__name__).exception("startup_failed")
        return EXIT_STARTUP
    except Exception:
        # A bug, not an operator's mistake: keep the traceback for the report.
        structlog.get_logger(__name__).exception("startup_failed")
        return EXIT_STARTUP
    return 0


def _listen_problem(config: Config, path: Path | None, error: OSError) -> str:
    """Which listener could not bind, and the key that sets it."""
    source = f" in {path}" if path is not None else " (the default; set it in --config FILE)"
    listeners: list[tuple[str, Listen]] = [
        ("listen.verbs", config.listen.verbs),
        ("listen.permits", config.listen.permits),
    ]
    if config.listen.metrics is not None:
        listeners.append(("listen.metrics", config.listen.metrics))
    for key, listen in listeners:
        if f", {listen.port})" in str(error):
            return (
                f"cannot listen on {listen.host}:{listen.port} ({key}{source}):"
                f" {error.strerror or error}"
            )
    return f"cannot listen: {error}"


def _whoami() -> dict[str, Any]:
    """The pod this replica runs in, from the Downward API (``$POD_NAME``, ``$POD_NAMESPACE``);
    the host name alone outside a pod. kube-scheduler names itself by the host name, which in
    a pod is the pod's name."""
    name = os.environ.get("POD_NAME")
    namespace = os.environ.get("POD_NAMESPACE")
    return {
        "host": name or socket.gethostname(),
        "pod": (namespace, name) if name and namespace else None,
    }


if __name__ == "__main__":
    sys.exit(main())
