"""The binding worker: the Binding POSTs of ``/bind``, sent by a child process of the extender.

Shell. kube-scheduler waits on the extender's filter and prioritize answers in its serial
scheduling cycle, and binds in the background: while it asks about the next pod, the extender
is POSTing the last one's Binding. In one process, that POST (aiohttp's client: the request,
the TLS record, the answer's head and body) runs on the event loop that answers filter and
prioritize, and each call that arrives meanwhile waits for it. Here the decision stays where
it was (``Extender.bind``: admission, the fit, the reservation, the write gate) and only the
POST moves: the main process sends the worker a ``BindAsk`` (a few dozen bytes over a
socketpair, ``scheduler_extender.channel``) and awaits its ``BindDone``; the worker sends the
Binding on its own API client (the same kubeconfig or in-cluster credentials, the same user
agent) and answers with the outcome, a ``KubeError`` carried as its class name, status and
message.

What the main process sees is what ``KubeClient.bind_pod`` would have raised: success, the
API's error (a 409 is still ``Conflict``), or ``Unavailable`` when the worker cannot say (it
died with the ask in flight, or did not answer within the request timeout and a margin), which
``Extender.bind`` treats as it treats a POST that timed out: the reservation is released,
kube-scheduler retries, and a Binding that did land shows on the pod watch. While no worker is
running (before it starts, while it restarts) ``KubeLink`` sends the Binding itself.

Lifecycle: ``serve`` starts it with the listeners and stops it after them (the binds in flight
are answered first). A worker that exits is restarted after a bounded back-off, one line each
time; a main process that dies closes the channel, and the worker exits when it reads the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import msgspec
import structlog

from kube_io import errors as kube_errors
from kube_io.client import KubeClient
from kube_io.errors import KubeError, Unavailable
from observability.log import configure_logging
from scheduler_extender.channel import Channel, ChannelClosed
from scheduler_extender.event_loop import run as run_loop

__all__ = ["COMMAND", "BindingWorker", "run_worker", "serve_binds"]

log = structlog.get_logger(__name__)

COMMAND: Final = "binding-worker"
# Beyond the worker's own request timeout (``KubeClient``'s 30 s): how long the main process
# waits for an answer before it calls the Binding's outcome unknown.
_ANSWER_MARGIN_SECONDS: Final = 5.0
_REQUEST_TIMEOUT_SECONDS: Final = 30.0
# Restart back-off after the worker exits, as the permit front's.
_RESTART_FIRST_SECONDS: Final = 0.5
_RESTART_MAX_SECONDS: Final = 30.0
_STABLE_SECONDS: Final = 60.0
# A Binding ask and its answer are small; anything larger is not one of ours.
_MAX_FRAME: Final = 2**20
# The worker's niceness: below the main process, whose loop kube-scheduler's serial cycle
# waits on, so that on a shared CPU filter and prioritize win over a Binding (which
# kube-scheduler awaits off its cycle).
NICENESS: Final = 5


class WorkerStart(msgspec.Struct, frozen=True, kw_only=True, tag="start"):
    """Main to worker, first: how to reach the API server, and as whom."""

    kubeconfig: str | None
    user_agent: str
    log_level: str


class BindAsk(msgspec.Struct, frozen=True, kw_only=True, tag="bind"):
    id: int
    namespace: str
    name: str
    uid: str
    node: str
    resource_version: str | None


class BindDone(msgspec.Struct, frozen=True, kw_only=True, tag="done"):
    """The outcome of one ``BindAsk``: ``error`` is empty when the Binding was created, else
    the ``kube_io.errors`` class the worker's client raised, with its fields."""

    id: int
    error: str = ""
    message: str = ""
    status: int = 0
    reason: str = ""
    retry_after_seconds: float | None = None


Frame = WorkerStart | BindAsk | BindDone
FRAMES: Final = msgspec.msgpack.Decoder(Frame)

# The errors a Binding POST can raise, by name (anything else arrives as ``KubeError``).
_ERRORS: Final[dict[str, type[KubeError]]] = {
    cls.__name__: cls
    for cls in (
        kube_errors.KubeError,
        kube_errors.NotFound,
        kube_errors.Conflict,
        kube_errors.Gone,
        kube_errors.Unauthorized,
        kube_errors.Forbidden,
        kube_errors.Invalid,
        kube_errors.BadResponse,
        kube_errors.ServerError,
        kube_errors.Unavailable,
    )
}


def _error(done: BindDone) -> KubeError:
    cls = _ERRORS.get(done.error, KubeError)
    return cls(
        done.message,
        status=done.status,
        reason=done.reason,
        retry_after_seconds=done.retry_after_seconds,
    )


class BindingWorker:
    """The worker process, seen from the main process (see the module docstring)."""

    def __init__(
        self,
        *,
        kubeconfig: str | None,
        user_agent: str,
        log_level: str,
        python: Sequence[str] = (sys.executable,),
    ) -> None:
        self._start = WorkerStart(kubeconfig=kubeconfig, user_agent=user_agent, log_level=log_level)
        self._python = list(python)
        self._process: asyncio.subprocess.Process | None = None
        self._channel: Channel[Frame] | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[BindDone]] = {}
        self._stopping = False
        self.restarts = 0

    @property
    def is_up(self) -> bool:
        """A worker is running and reading its channel: ``bind_pod`` may be called."""
        return self._channel is not None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def bind_pod(
        self, namespace: str, name: str, *, uid: str, node: str, resource_version: str | None
    ) -> None:
        """As ``KubeClient.bind_pod``, sent by the worker (only while ``is_up``)."""
        channel = self._channel
        if channel is None:
            raise Unavailable("the binding worker is not running")
        ask_id = next(self._ids)
        future: asyncio.Future[BindDone] = asyncio.get_running_loop().create_future()
        self._pending[ask_id] = future
        try:
            channel.send(
                BindAsk(
                    id=ask_id,
                    namespace=namespace,
                    name=name,
                    uid=uid,
                    node=node,
                    resource_version=resource_version,
                )
            )
            async with asyncio.timeout(_REQUEST_TIMEOUT_SECONDS + _ANSWER_MARGIN_SECONDS):
                done = await future
        except TimeoutError as e:
            raise Unavailable("the binding worker did not answer in time") from e
        finally:
            self._pending.pop(ask_id, None)
        if done.error:
            raise _error(done)

    async def run(self) -> None:
        """Start the worker and keep it running until ``stop`` (a background task)."""
        loop = asyncio.get_running_loop()
        delay = _RESTART_FIRST_SECONDS
        while not self._stopping:
            started = loop.time()
            returncode = await self._run_once()
            if self._is_stopping():
                return
            if loop.time() - started >= _STABLE_SECONDS:
                delay = _RESTART_FIRST_SECONDS
            log.warning("binding_worker_exited", returncode=returncode, restart_in_seconds=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RESTART_MAX_SECONDS)
            self.restarts += 1

    async def _run_once(self) -> int:
        ours, theirs = socket.socketpair()
        try:
            process = await asyncio.create_subprocess_exec(
                *self._python,
                "-m",
                "scheduler_extender",
                COMMAND,
                "--channel-fd",
                str(theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self._process = process
        channel = await Channel.open(ours, FRAMES, max_frame=_MAX_FRAME)
        channel.send(self._start)
        reading = self.attach(channel)
        log.info("binding_worker_started", pid=process.pid)
        try:
            return await process.wait()
        finally:
            self._channel = None
            await channel.close()
            await asyncio.gather(reading, return_exceptions=True)

    def _is_stopping(self) -> bool:
        # A method, not the attribute: ``stop`` sets it while ``run`` awaits.
        return self._stopping

    def attach(self, channel: Channel[Frame]) -> asyncio.Task[None]:
        """Send the asks on ``channel`` from now on, and read its answers: the task ends with
        the channel, failing the asks still waiting (``run`` attaches each worker it starts)."""
        self._channel = channel
        return asyncio.create_task(self._read(channel), name="binding-worker-channel")

    async def _read(self, channel: Channel[Frame]) -> None:
        """The worker's answers, until the channel ends; then every ask still waiting fails."""
        try:
            while True:
                frame = await channel.receive()
                if isinstance(frame, BindDone):
                    future = self._pending.get(frame.id)
                    if future is not None and not future.done():
                        future.set_result(frame)
        except ChannelClosed:
            pass
        finally:
            if self._channel is channel:
                self._channel = None
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(
                        Unavailable("the binding worker exited with this Binding in flight")
                    )

    async def stop(self, *, timeout_seconds: float = 10.0) -> None:
        """SIGTERM the worker (it answers the binds in flight, then exits) and wait for it."""
        self._stopping = True
        process = self._process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(timeout_seconds):
                await process.wait()
        except TimeoutError:
            log.warning("binding_worker_killed", pid=process.pid)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


# --- the worker's process ---------------------------------------------------------------------


def run_worker(argv: Sequence[str]) -> int:
    """``python -m scheduler_extender binding-worker --channel-fd N``: started by ``serve``
    only (the channel brings the rest)."""
    parser = argparse.ArgumentParser(
        prog=f"scheduler-extender {COMMAND}",
        description="Internal: the binding worker, started by `serve` (see docs/DEPLOY.md). It "
        "POSTs the Bindings the parent process asks for, over an inherited socketpair, and "
        "answers with each one's outcome.",
    )
    parser.add_argument("--channel-fd", type=int, required=True, help="the socketpair's end")
    args = parser.parse_args(argv)
    # Ctrl-C in a terminal reaches the whole process group: the main process stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=args.channel_fd)
    try:
        run_loop(_worker(sock))
    except Exception:
        structlog.get_logger(__name__).exception("binding_worker_failed")
        return 1
    return 0


async def _worker(sock: socket.socket) -> None:
    channel = await Channel.open(sock, FRAMES, max_frame=_MAX_FRAME)
    start = await channel.receive()
    if not isinstance(start, WorkerStart):
        raise ChannelClosed(f"expected the start frame, got {type(start).__name__}")
    configure_logging(level=start.log_level)
    try:
        os.nice(NICENESS)
    except OSError as e:  # a seccomp profile may refuse it: run on, and say so
        log.warning("binding_worker_priority_unchanged", error=str(e))
    client = await KubeClient.connect(start.kubeconfig, user_agent=start.user_agent)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await serve_binds(channel, client.bind_pod, stop=stop)
    finally:
        await channel.close()
        await client.close()


Bind = Callable[..., Awaitable[None]]


async def serve_binds(
    channel: Channel[Frame], bind_pod: Bind, *, stop: asyncio.Event | None = None
) -> None:
    """Each ``BindAsk`` read from ``channel`` POSTed by ``bind_pod`` (``KubeClient.bind_pod``),
    concurrently, and answered with its ``BindDone``; until the channel ends (the binds in
    flight are then dropped: nobody is left to answer) or ``stop`` is set (they are answered
    first)."""
    binds: set[asyncio.Task[None]] = set()

    async def one(ask: BindAsk) -> None:
        try:
            await bind_pod(
                ask.namespace,
                ask.name,
                uid=ask.uid,
                node=ask.node,
                resource_version=ask.resource_version,
            )
        except KubeError as e:
            channel.send(
                BindDone(
                    id=ask.id,
                    error=type(e).__name__,
                    message=e.message,
                    status=e.status,
                    reason=e.reason,
                    retry_after_seconds=e.retry_after_seconds,
                )
            )
        else:
            channel.send(BindDone(id=ask.id))

    async def read() -> None:
        while True:
            frame = await channel.receive()
            if isinstance(frame, BindAsk):
                task = asyncio.create_task(one(frame))
                binds.add(task)
                task.add_done_callback(binds.discard)

    reading = asyncio.create_task(read())
    stopping = asyncio.create_task((stop or asyncio.Event()).wait())
    try:
        await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stopping.done() and binds:
            await asyncio.wait(set(binds))
    finally:
        for task in (reading, stopping, *binds):
            task.cancel()
        await asyncio.gather(reading, stopping, *binds, return_exceptions=True)
