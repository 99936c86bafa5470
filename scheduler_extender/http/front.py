"""The permit front: the agents' permit port, served by a child process of the extender.

Shell. Every pod in the cluster can reach the permit port, so it takes floods (connections,
gzip bombs, garbage tokens) that kube-scheduler's calls must not feel. In one Python process
all of it runs on the one event loop that also answers filter, prioritize and bind: each
refusal is cheap, but thousands a second add up to a good share of a core taken from
kube-scheduler (``scripts/bench_attacks.py`` runs such floods). So
``serve`` runs the permit port in a second process (``PermitFront``), at the lowest CPU
priority (``permit_front.scheduling``, ``SCHED_IDLE`` by default), and the extender's own
process sees only what got through.

What runs where:

* the front (``run_front``, started as ``python -m scheduler_extender permit-front``): the
  permit listener (``GuardedSite`` and its guards; the listening socket itself is bound by the
  main process and inherited, so a port in use is the main process's one-line error, and a
  restarted front takes over the same socket without losing its backlog), the body limits,
  the token checks and TokenReviews with their caches and budgets (its own API client, from
  the same kubeconfig or in-cluster credentials), the per-agent budgets;
* the main process (``PermitFront``): decoding the batch, once, the rules and the decisions
  (``LocalDesk``), and the answers of the permit port's probes (``/healthz``, ``/readyz``: the
  kubelet's).

The channel is a socketpair the child inherits (no socket file to secure), carrying length-prefixed
msgpack frames (``Frame``): the front ``Ask``s (the bytes of a batch's body, as the agent sent them
but inflated, with its caller's identity; or a probe) and the main process ``Answer``s
synchronously, without awaiting anything of the front's (its writes never wait for the front to
read); the main process asks for the front's metrics (``MetricsAsk``) when ``/metrics`` is scraped
and merges them into its own.

Lifecycle: SIGTERM/SIGINT reach the main process, which stops the front (SIGTERM: it closes its
listener and finishes the calls in flight) before its own listeners. A front that dies is
restarted after a bounded back-off (logged, one line each time); while it is gone new
connections wait in the listening socket's backlog. A main process that dies closes the
channel, and the front exits when it reads the end of it.

``make_front_app`` builds the front's app around any ``PermitDesk``: ``make_permits_app`` joins
it to a ``LocalDesk`` in one process (tests, benchmarks, ``permit_front.mode: inline``), and
``ChannelDesk`` is the same desk across the channel.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from typing import Final, Literal

import msgspec
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from kube_io.client import KubeClient
from observability.log import configure_logging
from scheduler_extender.config import (
    AuthMode,
    Config,
    FrontMode,
    FrontScheduling,
    PermitFrontConfig,
)
from scheduler_extender.errors import ExtenderError, Unavailable
from scheduler_extender.event_loop import run as run_loop
from scheduler_extender.http import moves
from scheduler_extender.http.answers import DeskAnswer, error_answer, internal_error
from scheduler_extender.http.bodies import BODIES, Bodies
from scheduler_extender.http.connections import GuardedSite, listening_sockets, server_options
from scheduler_extender.http.keys import AUTHENTICATOR
from scheduler_extender.http.middleware import METRICS, request_middleware
from scheduler_extender.http.permit_port import (
    BUDGETS,
    DESK,
    CallerBudgets,
    LocalDesk,
    PermitDesk,
    Probe,
)
from scheduler_extender.http.permit_port import healthz as front_healthz
from scheduler_extender.http.permit_port import permits as front_permits
from scheduler_extender.http.permit_port import readyz as front_readyz
from scheduler_extender.kube.auth import (
    Authenticator,
    Identity,
    TokenBucket,
    TokenReviewAuth,
    by_config,
)
from scheduler_extender.kube.link import KubeLink
from scheduler_extender.metrics import Metrics

__all__ = [
    "ChannelDesk",
    "FrontMode",
    "PermitFront",
    "authenticator",
    "make_front_app",
    "run_front",
]

log = structlog.get_logger(__name__)

COMMAND: Final = "permit-front"
# A frame's length prefix, and the largest frame either side accepts (a permit body is at most
# ``limits.permits_max_body_bytes``, inflated; the front's metrics are a few kilobytes).
_HEADER: Final = struct.Struct(">I")
_MAX_FRAME: Final = 64 * 2**20
# How long the front waits for the main process's answer before a 503 (it answers in
# microseconds unless it is gone).
ASK_TIMEOUT_SECONDS: Final = 10.0
# How long /metrics waits for the front's metrics before it serves its own alone.
METRICS_TIMEOUT_SECONDS: Final = 2.0
# Restart back-off after the front exits: doubling from the first to the last, back to the
# first once a front has lived ``_STABLE_SECONDS``.
_RESTART_FIRST_SECONDS: Final = 0.5
_RESTART_MAX_SECONDS: Final = 30.0
_STABLE_SECONDS: Final = 60.0


# --- the front's app, whichever process it runs in ----------------------------------------------


def authenticator(config: Config, link: KubeLink | None, metrics: Metrics) -> Authenticator:
    """Who may ask for permits: the static token, or TokenReviews through ``link``."""
    auth = config.auth
    return by_config(
        auth,
        link,
        lambda review, link: TokenReviewAuth(
            review,
            link.get_pod,
            agent_service_account=auth.agent_service_account,
            ttl_seconds=auth.identity_cache_ttl_seconds,
            negative_ttl_seconds=auth.negative_cache_ttl_seconds,
            max_entries=auth.identity_cache_max_entries,
            negative_max_entries=auth.negative_cache_max_entries,
            budget=TokenBucket(
                rate_per_second=auth.review_rate_per_second, burst=auth.review_burst
            ),
            pod_ttl_seconds=auth.agent_pod_cache_ttl_seconds,
            metrics=metrics,
            audience=auth.audience,
        ),
    )


def make_front_app(
    config: Config,
    *,
    desk: PermitDesk,
    auth: Authenticator,
    moves_auth: Authenticator,
    metrics: Metrics,
    bodies: Bodies,
) -> web.Application:
    """The agents' listener: ``POST /v1/permits`` and the probes, answered by ``desk``; and
    the vm-controller's ``POST /v1/moves`` (``http.moves``, ``moves_auth``).

    Probes only besides the permits: /state names every VM pod and its size, /metrics every
    namespace's numbers, and this port is open to every pod in the cluster. Both stay on the
    verbs listener (loopback in the manifests) and the metrics listener."""
    app = web.Application(
        middlewares=[request_middleware],
        client_max_size=config.limits.permits_max_body_bytes,
    )
    app[DESK] = desk
    app[AUTHENTICATOR] = auth
    app[METRICS] = metrics
    app[BODIES] = bodies
    app[BUDGETS] = CallerBudgets(
        rate_per_second=config.limits.permit_requests_per_second,
        burst=config.limits.permit_requests_burst,
    )
    app.router.add_post("/v1/permits", front_permits, name="permits")
    app.router.add_get("/healthz", front_healthz, name="healthz")
    app.router.add_get("/readyz", front_readyz, name="readyz")
    moves.install(app, moves_auth)
    return app


# --- the channel --------------------------------------------------------------------------------


class WireSample(msgspec.Struct, frozen=True, array_like=True):
    name: str
    labels: dict[str, str]
    value: float


class WireFamily(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    documentation: str
    type: str
    samples: list[WireSample]


class Start(msgspec.Struct, frozen=True, kw_only=True, tag="start"):
    """Main to front, first: everything the front needs (the config may hold the static
    token: it travels here, never on the command line)."""

    config: Config
    # Used when the front reviews tokens: a kubeconfig path, or None for in-cluster.
    kubeconfig: str | None
    log_level: str


class Ask(msgspec.Struct, frozen=True, kw_only=True, tag="ask"):
    """Front to main: decide this batch (its body's bytes, undecoded: msgpack carries them as
    one ``bin``) for this caller, or answer this probe."""

    id: int
    probe: Probe | None = None
    username: str = ""
    node: str | None = None
    body: bytes | None = None
    # Which desk method the body is for: a permit batch, or a move (``http.moves``).
    route: Literal["permits", "moves"] = "permits"


class Answer(msgspec.Struct, frozen=True, kw_only=True, tag="answer"):
    id: int
    answer: DeskAnswer


class MetricsAsk(msgspec.Struct, frozen=True, kw_only=True, tag="metrics_ask"):
    id: int


class MetricsAnswer(msgspec.Struct, frozen=True, kw_only=True, tag="metrics_answer"):
    id: int
    families: list[WireFamily]


Frame = Start | Ask | Answer | MetricsAsk | MetricsAnswer

_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(Frame)


class ChannelClosed(Exception):
    """The other process closed the channel (or sent something unreadable)."""


class Channel:
    """One end of the socketpair: ``send`` never waits (the bytes are buffered, the other side
    reads them), ``receive`` returns the next frame or raises ``ChannelClosed``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=_MAX_FRAME)
        return cls(reader, writer)

    def send(self, frame: Frame) -> None:
        if self._writer.is_closing():
            return
        data = _ENCODER.encode(frame)
        self._writer.write(_HEADER.pack(len(data)) + data)

    async def receive(self) -> Frame:
        try:
            (size,) = _HEADER.unpack(await self._reader.readexactly(_HEADER.size))
            if size > _MAX_FRAME:
                raise ChannelClosed(f"a frame of {size} bytes")
            frame: Frame = _DECODER.decode(await self._reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            raise ChannelClosed("end of the channel") from e
        except msgspec.DecodeError as e:
            raise ChannelClosed(f"an unreadable frame: {e}") from e
        return frame

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


def families_to_wire(metrics: Metrics) -> list[WireFamily]:
    """What the front counts: its permit calls' latency and errors, and its TokenReviews."""
    return [
        WireFamily(
            name=family.name,
            documentation=family.documentation,
            type=family.type,
            samples=[WireSample(s.name, dict(s.labels), s.value) for s in family.samples],
        )
        for metric in (metrics.verb_duration, metrics.verb_errors, metrics.token_reviews)
        for family in metric.collect()
    ]


def families_from_wire(families: Sequence[WireFamily]) -> list[Metric]:
    out = []
    for wire in families:
        family = Metric(wire.name, wire.documentation, wire.type)
        family.samples = [Sample(s.name, s.labels, s.value) for s in wire.samples]
        out.append(family)
    return out


class ChannelDesk:
    """The ``PermitDesk`` of the front's process: each call is an ``Ask`` to the main process.

    ``serve`` reads the channel until it ends: it resolves the asks and answers the main
    process's ``MetricsAsk`` with ``metrics``."""

    def __init__(self, channel: Channel, metrics: Metrics) -> None:
        self.channel = channel
        self._metrics = metrics
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[DeskAnswer]] = {}
        self._closed = False

    async def permits(self, identity: Identity, body: bytes) -> DeskAnswer:
        return await self._ask(username=identity.username, node=identity.node, body=body)

    async def moves(self, identity: Identity, body: bytes) -> DeskAnswer:
        return await self._ask(username=identity.username, node=identity.node, body=body,
                               route="moves")  # fmt: skip

    async def probe(self, name: Probe) -> DeskAnswer:
        try:
            return await self._ask(probe=name)
        except ExtenderError as e:
            return error_answer(e, is_text=True)

    async def _ask(
        self,
        *,
        probe: Probe | None = None,
        username: str = "",
        node: str | None = None,
        body: bytes | None = None,
        route: Literal["permits", "moves"] = "permits",
    ) -> DeskAnswer:
        if self._closed:
            raise Unavailable("the extender's main process is gone", reason="FrontOrphaned")
        ask_id = next(self._ids)
        future: asyncio.Future[DeskAnswer] = asyncio.get_running_loop().create_future()
        self._pending[ask_id] = future
        try:
            self.channel.send(
                Ask(id=ask_id, probe=probe, username=username, node=node, body=body, route=route)
            )
            async with asyncio.timeout(ASK_TIMEOUT_SECONDS):
                return await future
        except TimeoutError as e:
            raise Unavailable(
                "the extender's main process did not answer in time", reason="FrontTimeout"
            ) from e
        finally:
            self._pending.pop(ask_id, None)

    async def serve(self) -> None:
        """Read the channel until it closes; then fail every ask still waiting."""
        try:
            while True:
                frame = await self.channel.receive()
                if isinstance(frame, Answer):
                    future = self._pending.get(frame.id)
                    if future is not None and not future.done():
                        future.set_result(frame.answer)
                elif isinstance(frame, MetricsAsk):
                    self.channel.send(
                        MetricsAnswer(id=frame.id, families=families_to_wire(self._metrics))
                    )
        except ChannelClosed as e:
            log.info("permit_front_channel_closed", why=str(e))
        finally:
            self._closed = True
            gone = Unavailable("the extender's main process is gone", reason="FrontOrphaned")
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(gone)


class MainSide:
    """The main process's end of one front's channel: answers asks as they arrive (each one
    synchronously, in order), and asks the front for its metrics."""

    def __init__(self, channel: Channel, desk: LocalDesk) -> None:
        self.channel = channel
        self._desk = desk
        self._ids = itertools.count(1)
        self._metrics: dict[int, asyncio.Future[list[WireFamily]]] = {}

    async def serve(self) -> None:
        try:
            while True:
                frame = await self.channel.receive()
                if isinstance(frame, Ask):
                    self.channel.send(Answer(id=frame.id, answer=self._answer(frame)))
                    # Asks that arrived together are read without a pause: let the verbs'
                    # requests in between them.
                    await asyncio.sleep(0)
                elif isinstance(frame, MetricsAnswer):
                    future = self._metrics.get(frame.id)
                    if future is not None and not future.done():
                        future.set_result(frame.families)
        except ChannelClosed:
            pass
        finally:
            for future in self._metrics.values():
                if not future.done():
                    future.set_exception(ChannelClosed("the permit front is gone"))

    def _answer(self, ask: Ask) -> DeskAnswer:
        desk = self._desk
        try:
            if ask.probe is not None:
                return desk.answer_probe(ask.probe)
            if ask.body is None:
                raise ExtenderError("an ask with neither a probe nor a batch")
            if ask.route == "moves":
                return desk.answer_moves(Identity(ask.username, ask.node), ask.body)
            return desk.answer_permits(Identity(ask.username, ask.node), ask.body)
        except ExtenderError as e:
            return error_answer(e)
        except Exception:
            # Task boundary: a bug costs one call, as it would in the handler.
            log.exception("internal_error", where="permit_desk")
            return error_answer(internal_error())

    async def families(self) -> list[Metric]:
        ask_id = next(self._ids)
        future: asyncio.Future[list[WireFamily]] = asyncio.get_running_loop().create_future()
        self._metrics[ask_id] = future
        try:
            self.channel.send(MetricsAsk(id=ask_id))
            async with asyncio.timeout(METRICS_TIMEOUT_SECONDS):
                return families_from_wire(await future)
        finally:
            self._metrics.pop(ask_id, None)


# --- the main process's side: start, watch, restart, stop -------------------------------------


def bind_permit_socket(config: Config) -> socket.socket:
    """The permit port's listening socket, bound by the main process (``OSError`` when the
    address is taken: ``__main__`` names ``listen.permits`` in one line)."""
    listen = config.listen.permits
    # One socket, passed to the front: the first address the host resolves to.
    first, *others = listening_sockets(listen.host, listen.port, listen.accept_backlog)
    for sock in others:
        sock.close()
    return first


class PermitFront:
    """The front process, seen from the main process (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        desk: LocalDesk,
        *,
        kubeconfig: str | None,
        log_level: str,
        python: Sequence[str] = (sys.executable,),
    ) -> None:
        self._config = config
        self._desk = desk
        self._start = Start(config=config, kubeconfig=kubeconfig, log_level=log_level)
        self._python = list(python)
        self._sock: socket.socket | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._side: MainSide | None = None
        self._stopping = False
        self.restarts = 0

    @property
    def bound_port(self) -> int:
        assert self._sock is not None
        port: int = self._sock.getsockname()[1]
        return port

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def bind(self) -> None:
        self._sock = bind_permit_socket(self._config)

    async def run(self) -> None:
        """Start the front and keep it running until ``stop`` (a background task)."""
        assert self._sock is not None, "bind() first"
        loop = asyncio.get_running_loop()
        delay = _RESTART_FIRST_SECONDS
        while not self._stopping:
            started = loop.time()
            returncode = await self._run_once()
            if self._is_stopping():
                return
            if loop.time() - started >= _STABLE_SECONDS:
                delay = _RESTART_FIRST_SECONDS
            log.warning("permit_front_exited", returncode=returncode, restart_in_seconds=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RESTART_MAX_SECONDS)
            self.restarts += 1

    async def _run_once(self) -> int:
        assert self._sock is not None
        ours, theirs = socket.socketpair()
        try:
            process = await asyncio.create_subprocess_exec(
                *self._python,
                "-m",
                "scheduler_extender",
                COMMAND,
                "--channel-fd",
                str(theirs.fileno()),
                "--listen-fd",
                str(self._sock.fileno()),
                pass_fds=(theirs.fileno(), self._sock.fileno()),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self._process = process
        channel = await Channel.open(ours)
        side = self._side = MainSide(channel, self._desk)
        channel.send(self._start)
        log.info("permit_front_started", pid=process.pid)
        serving = asyncio.create_task(side.serve(), name="permit-front-channel")
        try:
            return await process.wait()
        finally:
            self._side = None
            await channel.close()
            await asyncio.gather(serving, return_exceptions=True)

    def _is_stopping(self) -> bool:
        # A method, not the attribute: ``stop`` sets it while ``run`` awaits.
        return self._stopping

    async def families(self) -> list[Metric]:
        """The front's metrics (none while it is restarting or slow to answer)."""
        side = self._side
        if side is None:
            return []
        try:
            return await side.families()
        except (TimeoutError, ChannelClosed):
            return []

    async def stop(self) -> None:
        """SIGTERM the front, wait for it to finish its calls in flight, close the socket."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(self._config.shutdown_timeout_seconds + 5.0):
                    await process.wait()
            except TimeoutError:
                log.warning("permit_front_killed", pid=process.pid)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if self._sock is not None:
            self._sock.close()
            self._sock = None


# --- the front's process ----------------------------------------------------------------------


def run_front(argv: Sequence[str]) -> int:
    """``python -m scheduler_extender permit-front --channel-fd N --listen-fd M``: started by
    ``serve`` only (the channel brings the config)."""
    parser = argparse.ArgumentParser(
        prog=f"scheduler-extender {COMMAND}",
        description="Internal: the permit front, started by `serve` (see docs/DEPLOY.md). It "
        "serves the permit port on an inherited listening socket and asks the parent process, "
        "over an inherited socketpair, for every decision.",
    )
    parser.add_argument("--channel-fd", type=int, required=True, help="the socketpair's end")
    parser.add_argument("--listen-fd", type=int, required=True, help="the listening socket")
    args = parser.parse_args(argv)
    # Ctrl-C in a terminal reaches the whole process group: the main process stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel_sock = socket.socket(fileno=args.channel_fd)
    listen_sock = socket.socket(fileno=args.listen_fd)
    try:
        run_loop(_front(channel_sock, listen_sock))
    except Exception:
        structlog.get_logger(__name__).exception("permit_front_failed")
        return 1
    return 0


def _lower_priority(config: PermitFrontConfig) -> None:
    """Below the main process's, so that on a shared core kube-scheduler's calls win."""
    try:
        if config.scheduling is FrontScheduling.IDLE:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.nice(config.niceness)
    except OSError as e:  # a seccomp profile may refuse it: run on, and say so
        log.warning("permit_front_priority_unchanged", scheduling=config.scheduling, error=str(e))


async def _front(channel_sock: socket.socket, listen_sock: socket.socket) -> None:
    channel = await Channel.open(channel_sock)
    start = await channel.receive()
    if not isinstance(start, Start):
        raise ChannelClosed(f"expected the start frame, got {type(start).__name__}")
    config = start.config
    configure_logging(level=start.log_level)
    _lower_priority(config.permit_front)
    metrics = Metrics(CollectorRegistry())
    client: KubeClient | None = None
    link: KubeLink | None = None
    if config.auth.mode is AuthMode.TOKENREVIEW:
        link = KubeLink()
        client = link.client = await KubeClient.connect(start.kubeconfig)
    desk = ChannelDesk(channel, metrics)
    app = make_front_app(
        config,
        desk=desk,
        auth=authenticator(config, link, metrics),
        moves_auth=moves.controller_authenticator(config, link, metrics),
        metrics=metrics,
        bodies=Bodies(config.limits),
    )
    listen = config.listen.permits
    runner = web.AppRunner(
        app,
        handle_signals=False,
        shutdown_timeout=config.shutdown_timeout_seconds,
        access_log=None,  # the middleware writes each request's one line
        **server_options(listen),
    )
    await runner.setup()
    site = GuardedSite(runner, listen, sock=listen_sock)
    await site.start()
    log.info("permit_front_listening", port=site.bound_port, pid=os.getpid())
    loop = asyncio.get_running_loop()
    serving = asyncio.create_task(desk.serve(), name="permit-front-channel")
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    # SIGTERM: the main process is still there to answer the calls in flight. End of the
    # channel: it is gone, and those calls have failed already.
    await site.stop()
    await runner.cleanup()
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    await channel.close()
    if client is not None:
        await client.close()
