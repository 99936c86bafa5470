"""Connections: the server options both listeners run with, and a cap per listener.

Shell. ``server_options(listen)`` are aiohttp server settings, used by ``serve`` and by the
tests' servers alike:

* ``auto_decompress=False``: aiohttp would otherwise inflate a gzip body in its parser, before
  any handler could authenticate the caller or bound the inflated size (``bodies`` does both);
* ``lingering_time=0``: a body the handler refused without reading (401, 413, 415) is not
  drained; the connection is closed after the answer instead;
* ``keepalive_timeout``: aiohttp closes a connection that has no complete request head this
  long after it opened or after its last answer: the idle timeout.

``GuardedSite`` adds the header timeout: once the first bytes of a request arrive, its whole
head must follow within ``header_timeout_seconds`` (a slowloris head is closed then, long
before the idle timeout).

``GuardedSite`` is a ``TCPSite`` whose connections are counted, and whose new connections are
rate-limited per client address (``new_connections_per_second``, a token bucket per address,
``penalties.AddressBuckets``; over it a connection is closed at once with a canned
503, before aiohttp sees it): a flood of short hostile connections then costs the event loop
that kube-scheduler's calls share an accept, a send and a close each, not a request, and it
spends the flooder's allowance, never the kubelet's or another node's agent's. The site
accepts connections itself (not asyncio's server), so a refused one never becomes a
transport, a protocol and a task (which would nearly double what the system calls alone
cost the loop), and each turn of the event loop accepts at most
``_ACCEPTS_PER_TURN`` or the listener's backlog if smaller (the rest wait in the kernel's
queue for the next turn): a connect flood adds a bounded amount of work to each turn, between
kube-scheduler's calls.

At ``max_connections`` a new connection evicts the one that has been quiet longest among
those with no request in progress (an idle keep-alive or a head still dribbling in), and is
refused with a canned 503 only when every connection is busy. So a flood of idle or slowloris
connections costs the flooder its own connections, while kube-scheduler's and the kubelet's
next connections get in; and each listener has its own cap, so one cannot take the other's
file descriptors.

On the verbs listener (``GuardedSite(fast=FastVerbs(app))``) a connection reads request heads
itself until one is not a plain filter, prioritize or bind call (``fast``), and only then
makes aiohttp's handler and hands it every byte not answered yet; the guards above hold on
both sides of that hand-over (see ``_Guarded``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Final

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from scheduler_extender.config import Listen
from scheduler_extender.http.fast import (
    BODY_WINDOW_SECONDS,
    MAX_BODY,
    MAX_HEAD,
    FastVerbs,
    Handover,
    Head,
    Refusal,
    offends,
)
from scheduler_extender.http.penalties import AddressBuckets, PenaltyBox

log = structlog.get_logger(__name__)

# New connections taken from the kernel's queue in one turn of the event loop, at most.
_ACCEPTS_PER_TURN: Final = 16
# accept() failing for want of descriptors or memory: stop accepting for a while, as asyncio's
# own server does, rather than spin on a listening socket that stays readable.
_OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_RETRY_SECONDS: Final = 1.0
# A refused first request's bytes already received are read (not more than this) before the
# answer and the close.
_DRAIN_READS: Final = 4
_DRAIN_CHUNK: Final = 2**16
_REFUSED: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 34\r\n\r\ntoo many connections; retry later\n"
)


def _address(peer: object) -> str:
    """A peer's address, as its rate and its offences are counted under."""
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


def server_options(listen: Listen) -> dict[str, Any]:
    """aiohttp server settings for a listener (see the module docstring)."""
    return {
        "auto_decompress": False,
        "lingering_time": 0,
        "keepalive_timeout": listen.idle_timeout_seconds,
    }


class _Guarded(asyncio.Protocol):
    """One connection: forwards everything to aiohttp's handler, notes when it last spoke.

    The handler is made only once the connection is admitted: a refused one costs an accept
    and a close, nothing of aiohttp's. On a listener with a ``fast`` path (the verbs), it is
    made only when a request is not a plain verb call (``fast.parse_head``): until then the
    connection reads heads itself, and guards them as aiohttp would (the header timeout, the
    idle timeout, the in-flight budget for a body still arriving; a body later than
    ``fast.BODY_WINDOW_SECONDS`` goes to aiohttp with its head, and aiohttp's body timeout
    applies from there). Answers go out in order, one request at a time; bytes that arrive
    meanwhile wait, and reading pauses while they exceed one request's worth or while the
    peer does not read its answers.
    """

    def __init__(
        self, site: GuardedSite, make: Callable[[], RequestHandler], fast: FastVerbs | None
    ) -> None:
        self._site = site
        self._make = make
        self._fast = fast
        self._inner: RequestHandler | None = None
        self.transport: asyncio.Transport | None = None
        self.last_active = 0.0
        self.address = ""  # the client's
        self._head_timer: asyncio.TimerHandle | None = None
        # The fast path's state (unused once aiohttp has the connection).
        self._buffer = bytearray()
        self._head: Head | None = None  # parsed; its body is still arriving
        self._taken = 0  # of the in-flight budget, for that body
        self._serving = False  # an answer is being computed (bind)
        self._write_paused = False
        self._read_paused = False
        self._heads = 0
        self._body_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def is_busy(self) -> bool:
        # aiohttp sets this while a request is being handled (its body read included), and
        # offers nothing public that says so. tests/extender/test_hostile_clients.py checks
        # that a busy connection survives eviction, so an aiohttp change cannot go unnoticed.
        inner = self._inner
        if inner is None:
            return self._serving or self._head is not None
        return inner._current_request is not None

    @property
    def is_fast(self) -> bool:
        """Admitted, and its requests are still read here rather than by aiohttp."""
        return self._fast is not None and self._inner is None

    def _heads_seen(self) -> int:
        # aiohttp counts the heads it has parsed; nothing public says so.
        return self._heads + (self._inner._request_count if self._inner is not None else 0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.last_active = asyncio.get_running_loop().time()
        self.address = _address(transport.get_extra_info("peername"))
        if not self._site.admit(self):
            self._fast = None
            transport.write(_REFUSED)
            transport.close()
            return
        if self._fast is None:
            self._inner = self._make()
            self._inner.connection_made(transport)
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:  # as aiohttp's handler does: dead peers are noticed
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        self.last_active = asyncio.get_running_loop().time()
        if self._inner is not None:
            self._to_inner(data)
        elif self._fast is not None:
            self._buffer += data
            self._advance()

    def _to_inner(self, data: bytes) -> None:
        inner = self._inner
        assert inner is not None
        if self._head_timer is None and not self.is_busy:
            # The first bytes of a request head: all of it must follow within the timeout.
            self._start_head_timer()
        inner.data_received(data)

    def _start_head_timer(self) -> None:
        self._head_timer = asyncio.get_running_loop().call_later(
            self._site.header_timeout, self._head_due, self._heads_seen()
        )

    def _head_due(self, heads_before: int) -> None:
        self._head_timer = None
        if self._heads_seen() == heads_before and not self.is_busy:
            self._site.heads_timed_out += 1
            self._site.penalties.offence(self.address)
            self.close()

    # -- the fast path -----------------------------------------------------------------------

    def _advance(self) -> None:
        """Answer every complete plain call in the buffer, in order, one at a time."""
        fast = self._fast
        assert fast is not None
        while not self._serving and self._inner is None and self.transport is not None:
            if self._write_paused or self.transport.is_closing():
                break
            head = self._head
            if head is None:
                if not self._buffer:
                    break
                parsed = fast.parse(self._buffer)
                if parsed is None:  # part of a head
                    if self._head_timer is None:
                        self._start_head_timer()
                    break
                if isinstance(parsed, Handover):
                    self._hand_over()
                    return
                if isinstance(parsed, Refusal):
                    self._heads += 1
                    self._cancel_timers(head=True, idle=True)
                    self._buffer.clear()
                    refusal = fast.refuse(parsed)
                    self.transport.write(refusal)
                    self.transport.close()  # after the answer is written; the body is unread
                    if offends(refusal):  # not a 503 while not synced: that one is ours
                        self._site.penalties.offence(self.address)
                    return
                head = self._head = parsed
                self._heads += 1
                self._cancel_timers(head=True, idle=True)
            end = head.size + head.length
            if len(self._buffer) < end:  # the body is still arriving
                if not self._taken and head.length:
                    if not fast.bodies.try_take(head.length):
                        self._hand_over()  # aiohttp answers the spent budget (503)
                        return
                    self._taken = head.length
                    self._body_timer = asyncio.get_running_loop().call_later(
                        BODY_WINDOW_SECONDS, self._hand_over
                    )
                break
            with memoryview(self._buffer) as view:
                body = bytes(view[head.size : end])
            del self._buffer[:end]
            self._release()
            self._head = None
            answer = fast.answer(head, body)
            if isinstance(answer, bytes):
                self._answered(answer)
            else:
                self._serving = True
                self._task = asyncio.get_running_loop().create_task(self._await(answer))
        self._pace_reading()

    async def _await(self, answer: Awaitable[bytes]) -> None:
        try:
            data = await answer
        finally:
            self._serving = False
            self._task = None
        self._answered(data)
        self._advance()

    def _answered(self, data: bytes) -> None:
        if offends(data):
            self._site.penalties.offence(self.address)
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(data)
        self._arm_idle()

    def _pace_reading(self) -> None:
        """Pause reading while answers wait for the peer, or unanswered bytes pile up."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        piled = self._serving and len(self._buffer) > MAX_HEAD + MAX_BODY
        if (self._write_paused or piled) and not self._read_paused:
            transport.pause_reading()
            self._read_paused = True
        elif self._read_paused and not (self._write_paused or piled):
            transport.resume_reading()
            self._read_paused = False

    def _hand_over(self) -> None:
        """aiohttp takes the connection, with every byte not answered yet."""
        if self._inner is not None or self.transport is None or self.transport.is_closing():
            return
        self._cancel_timers(idle=True)
        self._release()
        self._head = None
        self._inner = self._make()
        self._inner.connection_made(self.transport)
        if self._read_paused:
            self.transport.resume_reading()
            self._read_paused = False
        data = bytes(self._buffer)
        self._buffer.clear()
        if data:
            self._to_inner(data)

    def _release(self) -> None:
        if self._taken:
            assert self._fast is not None
            self._fast.bodies.release(self._taken)
            self._taken = 0
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _arm_idle(self) -> None:
        """aiohttp's keep-alive timeout, for a connection it has not seen yet."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = asyncio.get_running_loop().call_later(
            self._site.idle_timeout, self._idle_due
        )

    def _idle_due(self) -> None:
        self._idle_timer = None
        if self.is_fast and not self.is_busy:
            self.close()

    def _cancel_timers(self, *, head: bool = False, idle: bool = False) -> None:
        if head and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if idle and self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    # -- the rest of asyncio.Protocol ---------------------------------------------------------

    def eof_received(self) -> None:
        if self._inner is not None:
            self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()
        else:
            self._write_paused = True
            self._pace_reading()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
        elif self._write_paused:
            self._write_paused = False
            self._pace_reading()
            if self._fast is not None:
                self._advance()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._site.forget(self)
        self._cancel_timers(head=True, idle=True)
        self._release()
        if self._inner is not None:
            self._inner.connection_lost(exc)
            self._inner = None
            self._fast = None
        self.transport = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def listening_sockets(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening, non-blocking TCP sockets on every address ``host`` resolves to, as asyncio's
    ``create_server`` binds them (IPv6 ones IPv6-only). ``OSError`` names the address when
    one cannot be resolved or bound (``__main__`` turns that into one line)."""
    try:
        found = socket.getaddrinfo(
            host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )
    except socket.gaierror as e:
        raise OSError(
            errno.EADDRNOTAVAIL,
            f"cannot resolve {host!r}: {e.strerror} (while attempting to bind on address"
            f" {(host, port)!r})",
        ) from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as e:
                raise OSError(
                    e.errno,
                    f"{e.strerror} (while attempting to bind on address"
                    f" {(address[0], address[1])!r})",
                ) from None
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class _Listening(asyncio.AbstractServer):
    """A site's listening sockets, which ``GuardedSite._accept`` reads: what aiohttp's
    ``BaseSite.stop`` closes (it stops reading them and closes them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sockets: list[socket.socket]) -> None:
        self._loop = loop
        self._sockets = sockets

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def close(self) -> None:
        for sock in self._sockets:
            if sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
                sock.close()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return any(sock.fileno() >= 0 for sock in self._sockets)

    async def start_serving(self) -> None:
        return None  # serving from the start

    async def serve_forever(self) -> None:
        raise NotImplementedError("a site's listener is stopped with the site")

    async def wait_closed(self) -> None:
        return None


class GuardedSite(web.BaseSite):
    """A TCP listener with at most ``listen.max_connections`` open connections."""

    def __init__(
        self,
        runner: web.BaseRunner,
        listen: Listen,
        *,
        fast: FastVerbs | None = None,
        shutdown_timeout: float = 60.0,
        sock: socket.socket | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("backlog", listen.accept_backlog)
        super().__init__(runner, **kwargs)
        self._listen = listen
        self._fast = fast
        self._shutdown_timeout = shutdown_timeout
        # A listening socket bound elsewhere (the permit front inherits its own).
        self._sock = sock
        self._open: set[_Guarded] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._listening: tuple[socket.socket, Callable[[], _Guarded]] | None = None
        self._sockets: tuple[socket.socket, ...] = ()
        self._rates = AddressBuckets(
            per_second=listen.new_connections_per_second, burst=listen.new_connections_burst
        )
        self.header_timeout = listen.header_timeout_seconds
        self.idle_timeout = listen.idle_timeout_seconds
        self.evicted = 0
        self.refused = 0
        self.heads_timed_out = 0
        self.bound_port = listen.port
        self.penalties = PenaltyBox(
            listener=lambda: self.name,
            seconds=listen.penalty_seconds,
            offences=AddressBuckets(
                per_second=listen.offences_per_second, burst=listen.offence_burst
            ),
            sockets=lambda: self._sockets,
        )

    @property
    def name(self) -> str:
        return f"http://{self._listen.host}:{self.bound_port}"

    @property
    def fast(self) -> FastVerbs | None:
        return self._fast

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def within_rate(self, address: str, now: float) -> bool:
        """Whether a new connection from ``address`` is within its allowance (spending it)."""
        if self._rates.take(address, now):
            return True
        self.refused += 1
        if self.refused & (self.refused - 1) == 0:  # 1, 2, 4, 8...: a flood logs little
            log.warning("connections_over_rate", listener=self.name, total=self.refused)
        return False

    def admit(self, conn: _Guarded) -> bool:
        """Whether a connection within its rate gets in under ``max_connections`` (none once
        the site is stopping: one accepted just before is refused, not served after)."""
        if self._stopping:
            return False
        if len(self._open) >= self._listen.max_connections:
            idle = [c for c in self._open if not c.is_busy]
            if not idle:
                self.refused += 1
                if self.refused & (self.refused - 1) == 0:
                    log.warning("connections_refused", listener=self.name, total=self.refused)
                return False
            victim = min(idle, key=lambda c: c.last_active)
            self._open.discard(victim)
            victim.close()
            self.evicted += 1
            if self.evicted & (self.evicted - 1) == 0:  # 1, 2, 4, 8...: a flood logs little
                log.warning("idle_connections_evicted", listener=self.name, total=self.evicted)
        self._open.add(conn)
        return True

    def forget(self, conn: _Guarded) -> None:
        self._open.discard(conn)

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        if self._sock is not None:
            self._sock.setblocking(False)
            sockets = [self._sock]
        else:
            sockets = listening_sockets(self._listen.host, self._listen.port, self._backlog)

        def factory() -> _Guarded:
            return _Guarded(self, server, self._fast)

        self._server = _Listening(loop, sockets)
        self._sockets = tuple(sockets)
        self.penalties.reset()
        self.bound_port = sockets[0].getsockname()[1]
        self._listening = (sockets[0], factory)
        for sock in sockets:
            loop.add_reader(sock.fileno(), self._accept, sock, factory)

    def _accept(self, sock: socket.socket, factory: Callable[[], _Guarded]) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(min(self._backlog, _ACCEPTS_PER_TURN)):
            try:
                conn, peer = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES:
                    raise
                log.warning("accept_failed", listener=self.name, error=str(e))
                loop.remove_reader(sock.fileno())
                loop.call_later(_ACCEPT_RETRY_SECONDS, self._resume_accepting, sock, factory)
                return
            address = _address(peer)
            # Refused before it costs more than this: no transport, protocol or task. (A
            # penalized address's: in the kernel's queue before its filter was attached.)
            penalized = self.penalties.holds(address)
            if penalized or not self.within_rate(address, loop.time()):
                with contextlib.suppress(OSError):
                    conn.setblocking(False)
                    conn.send(_REFUSED)
                conn.close()
                if not penalized:
                    self.penalties.offence(address)
                continue
            conn.setblocking(False)
            if self._fast is not None and self._refused_from_peek(conn, address):
                continue
            task = loop.create_task(self._connect(conn, factory))
            self._connecting.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._connecting.discard)

    def _refused_from_peek(self, conn: socket.socket, address: str) -> bool:
        """Whether the first request already waiting on a new verbs connection is one the fast
        path refuses from its head (``fast.Refusal``): then it is answered and the connection
        closed here, before it costs a transport, a protocol and a task. The bytes are only
        peeked: anything else reaches the connection's protocol untouched."""
        fast = self._fast
        assert fast is not None
        try:
            peeked = conn.recv(MAX_HEAD, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return False  # nothing yet: the protocol will read it
        except OSError:
            conn.close()  # reset already
            return True
        parsed = fast.parse(peeked) if peeked else None
        if not isinstance(parsed, Refusal):
            return False
        with contextlib.suppress(OSError):
            # What has arrived is read first, as a transport would have read it: closing on
            # unread bytes sends a reset, which can cost the client the answer.
            for _ in range(_DRAIN_READS):
                if not conn.recv(_DRAIN_CHUNK):
                    break
        refusal = fast.refuse(parsed)
        with contextlib.suppress(OSError):
            conn.send(refusal)
        conn.close()
        if offends(refusal):
            self.penalties.offence(address)
        return True

    def _resume_accepting(self, sock: socket.socket, factory: Callable[[], _Guarded]) -> None:
        if sock.fileno() >= 0:  # not closed meanwhile
            asyncio.get_running_loop().add_reader(sock.fileno(), self._accept, sock, factory)

    @staticmethod
    async def _connect(conn: socket.socket, factory: Callable[[], _Guarded]) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(factory, conn)
        except OSError:  # the peer is gone already
            conn.close()
        except BaseException:
            conn.close()
            raise

    async def stop(self) -> None:
        """Stop listening; then, as aiohttp does for its own connections, close the idle
        connections of the fast path and give the busy ones ``shutdown_timeout`` to answer."""
        self._stopping = True
        self.penalties.close()
        await super().stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._shutdown_timeout
        while True:
            fast = [c for c in self._open if c.is_fast]
            for conn in fast:
                if not conn.is_busy:
                    conn.close()
            if not any(c.is_busy for c in fast) or loop.time() >= deadline:
                break
            await asyncio.sleep(0.01)
        for conn in [c for c in self._open if c.is_fast]:
            conn.close()
