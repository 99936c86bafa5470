"""Connections: aiohttp's server options for every listener, and the guards of the listeners
other pods reach.

Shell. Who reaches which listener is the threat model in docs/DEPLOY.md ("Who reaches which
listener"): the verbs listener is loopback in the scheduler's pod and its only client is
kube-scheduler, so it runs with aiohttp's options and the header timeout alone (a
``GuardedSite`` of a plain ``Listen``); the permit port (every agent, behind the
NetworkPolicy; every pod without one) and the metrics port (every pod: it authenticates) run
as ``GuardedSite`` of a ``GuardedListen``, with every guard below.

``server_options(listen)`` are aiohttp's public settings, for every listener and the tests'
servers alike:

* ``auto_decompress=False``: aiohttp would otherwise inflate a gzip body in its parser, before
  any handler could authenticate the caller or bound the inflated size (``bodies`` does both);
* ``lingering_time=0``: a body the handler refused without reading (401, 413, 415) is not
  drained; the connection is closed after the answer instead;
* ``keepalive_timeout``: aiohttp closes a connection that has no complete request head this
  long after it opened or after its last answer: the idle timeout. One timer for both, so it
  cannot be short: it must stay above the clients' own keep-alive idle (Go's 90 s for
  kube-scheduler), or the server closes a connection just as kube-scheduler reuses it for a
  POST, which Go does not retry, and a scheduling cycle fails;
* ``max_line_size``, ``max_field_size``, ``max_headers``: aiohttp's own bounds on a head (400
  beyond them), written out so that they are ours to read.

``GuardedSite`` adds what aiohttp has no option for, each in ``_Guarded``, a protocol that
forwards every callback to aiohttp's request handler (made only once a connection is
admitted) and reads nothing of it. Each guard, the threat it answers and what measures it
(``scripts/bench_attacks.py``: the filter p99 while hostile clients work the permit and metrics
ports; the figures are in its output and docs/DEPLOY.md):

* the header timeout, on every listener: a new connection's first request head, and every
  later one from its first bytes, must arrive whole within ``header_timeout_seconds``. A
  slowloris head from any pod, or a connection that opens and says nothing, is otherwise kept
  until the idle timeout (120 s on the verbs listener, held above kube-scheduler's keep-alive
  idle, see above). Whether a request is in progress comes from the middleware (``serving``).
  The benchmark's phases are shorter than the timeout, so it does not measure this one;
  ``tests/extender/test_hostile_connections.py`` fails without it. It is the only guard of
  the verbs listener: its one client, kube-scheduler, sends its request as soon as it
  connects, so nothing it does is cut; what it reaps there is a connection leaked by
  whatever else reaches the pod's loopback (an operator's port-forward), not an attacker;
* new connections per client address (``new_connections_per_second``, a token bucket per
  address, ``penalties.AddressBuckets``): over it a connection is answered a canned 503 and
  closed before aiohttp makes anything for it, and the flooder spends its own allowance,
  never the kubelet's or another node's agent's. It is what makes a connection flood an
  offence for the penalties below (``metrics_token_churn``, ``garbage_token_flood``);
* ``max_connections``: a new connection evicts the one that has been quiet longest among
  those with no request in progress (an idle keep-alive or a head still dribbling in), and is
  refused with a canned 503 only when every connection is busy; each listener has its own
  cap, so one cannot take the other's file descriptors (``idle_connection_flood``,
  ``slowloris_heads`` and their metrics-port twins open more connections than the process
  has descriptors, while the kubelet's probe keeps getting in);
* penalties (``penalties``): an address that keeps offending has its new connections dropped
  by the kernel for a while (kept by ``--penalties off``, see there).
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable
from typing import Any, Final, cast

import structlog
from aiohttp import web

from scheduler_extender.config import GuardedListen, Listen
from scheduler_extender.http.penalties import AddressBuckets, PenaltyBox

log = structlog.get_logger(__name__)

# aiohttp's defaults, written out (see the module docstring).
MAX_LINE_SIZE: Final = 8190
MAX_FIELD_SIZE: Final = 8190
MAX_HEADERS: Final = 128
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
        "max_line_size": MAX_LINE_SIZE,
        "max_field_size": MAX_FIELD_SIZE,
        "max_headers": MAX_HEADERS,
    }


class _Guarded(asyncio.Protocol):
    """One connection of a ``GuardedSite``: aiohttp's handler behind its guards."""

    def __init__(self, site: GuardedSite) -> None:
        self._site = site
        self._inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.last_active = 0.0
        self.address = ""  # the client's
        self.busy = 0  # requests in progress (the middleware's ``serving``)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport by how the server was made (``create_server``); a cast, not an
        # isinstance check: uvloop's transports implement asyncio.Transport without being
        # subclasses of it.
        self.transport = stream = cast(asyncio.Transport, transport)
        self.last_active = asyncio.get_running_loop().time()
        self.address = _address(transport.get_extra_info("peername"))
        if not self._site.admit(self):
            stream.write(_REFUSED)
            stream.close()
            return
        self._inner = self._site.handler()
        self._inner.connection_made(transport)
        # Its first request head must arrive whole within the timeout, as every later one.
        self._head_timer = asyncio.get_running_loop().call_later(
            self._site.header_timeout, self._head_due
        )

    def data_received(self, data: bytes) -> None:
        inner = self._inner
        if inner is None:
            return  # refused; closing
        loop = asyncio.get_running_loop()
        self.last_active = loop.time()
        if not self.busy and self._head_timer is None:
            # The first bytes of a request head: all of it must follow within the timeout.
            self._head_timer = loop.call_later(self._site.header_timeout, self._head_due)
        inner.data_received(data)

    def _head_due(self) -> None:
        # No request began since the head's first bytes (``began`` cancels the timer).
        self._head_timer = None
        self._site.heads_timed_out += 1
        if self._site.penalties is not None:
            self._site.penalties.offence(self.address)
        self.close()

    def began(self) -> None:
        """A request's head is complete and its handler runs (``serving``)."""
        self.busy += 1
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def ended(self) -> None:
        self.busy -= 1
        self.last_active = asyncio.get_running_loop().time()

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._site.forget(self)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._inner is not None:
            self._inner.connection_lost(exc)
            self._inner = None
        self.transport = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def serving(request: web.Request) -> _Guarded | None:
    """The guarded connection ``request`` arrived on, marked busy (``ended()`` it after); None
    on an unguarded listener (the verbs). Through asyncio's public ``get_protocol``."""
    transport = request.transport
    conn = transport.get_protocol() if transport is not None else None
    if isinstance(conn, _Guarded):
        conn.began()
        return conn
    return None


def resolve(host: str, port: int) -> list[tuple[Any, ...]]:
    """The addresses a listener on ``host`` binds; ``OSError`` (not ``gaierror``) naming the
    address when it does not resolve (``__main__`` turns that into one line)."""
    try:
        return socket.getaddrinfo(
            host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )
    except socket.gaierror as e:
        raise OSError(
            errno.EADDRNOTAVAIL,
            f"cannot resolve {host!r}: {e.strerror} (while attempting to bind on address"
            f" {(host, port)!r})",
        ) from None


def listening_sockets(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening, non-blocking TCP sockets on every address ``host`` resolves to, as asyncio's
    ``create_server`` binds them (IPv6 ones IPv6-only). ``OSError`` names the address when
    one cannot be resolved or bound (``__main__`` turns that into one line)."""
    found = resolve(host, port)
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


class GuardedSite:
    """A TCP listener whose connections are guarded (see the module docstring): what
    aiohttp's ``TCPSite`` does, through public API only (``runner.server`` is the handler
    factory). A plain ``Listen`` (the verbs) gets the header timeout only; a
    ``GuardedListen`` every guard. Stop it before ``runner.cleanup()``, which closes the
    connections."""

    def __init__(
        self,
        runner: web.BaseRunner,
        listen: Listen,
        *,
        sock: socket.socket | None = None,
    ) -> None:
        self._runner = runner
        self._listen = listen
        # A listening socket bound elsewhere (the permit front inherits its own).
        self._sock = sock
        self._server: asyncio.Server | None = None
        self._open: set[_Guarded] = set()
        self._stopping = False
        self.header_timeout = listen.header_timeout_seconds
        self.evicted = 0
        self.refused = 0
        self.heads_timed_out = 0
        self.bound_port = listen.port
        # The admission guards: only where other pods connect.
        self._guarded = listen if isinstance(listen, GuardedListen) else None
        self._rates: AddressBuckets | None = None
        self.penalties: PenaltyBox | None = None
        if isinstance(listen, GuardedListen):
            self._rates = AddressBuckets(
                per_second=listen.new_connections_per_second, burst=listen.new_connections_burst
            )
            self.penalties = PenaltyBox(
                listener=lambda: self.name,
                seconds=listen.penalty_seconds,
                offences=AddressBuckets(
                    per_second=listen.offences_per_second, burst=listen.offence_burst
                ),
                sockets=lambda: self._server.sockets if self._server is not None else (),
            )

    @property
    def name(self) -> str:
        return f"http://{self._listen.host}:{self.bound_port}"

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def handler(self) -> asyncio.Protocol:
        server = self._runner.server
        assert server is not None
        return server()

    def admit(self, conn: _Guarded) -> bool:
        """Whether a new connection gets in: not penalized, within its address's rate, and
        under ``max_connections`` (none once the site is stopping); on the verbs, any."""
        if self._stopping:
            return False
        guarded, rates, penalties = self._guarded, self._rates, self.penalties
        if guarded is None or rates is None or penalties is None:
            self._open.add(conn)
            return True
        if penalties.holds(conn.address):
            return False  # penalized: in the kernel's queue before its filter was attached
        if not rates.take(conn.address, asyncio.get_running_loop().time()):
            self._refuse("connections_over_rate")
            penalties.offence(conn.address)
            return False
        if len(self._open) >= guarded.max_connections:
            idle = [c for c in self._open if not c.busy]
            if not idle:
                self._refuse("connections_refused")
                return False
            victim = min(idle, key=lambda c: c.last_active)
            self._open.discard(victim)
            victim.close()
            self.evicted += 1
            if self.evicted & (self.evicted - 1) == 0:  # 1, 2, 4, 8...: a flood logs little
                log.warning("idle_connections_evicted", listener=self.name, total=self.evicted)
        self._open.add(conn)
        return True

    def _refuse(self, event: str) -> None:
        self.refused += 1
        if self.refused & (self.refused - 1) == 0:  # 1, 2, 4, 8...: a flood logs little
            log.warning(event, listener=self.name, total=self.refused)

    def forget(self, conn: _Guarded) -> None:
        self._open.discard(conn)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        factory: Callable[[], _Guarded] = lambda: _Guarded(self)  # noqa: E731
        backlog = self._listen.accept_backlog
        if self._sock is not None:
            self._server = await loop.create_server(factory, sock=self._sock, backlog=backlog)
        else:
            resolve(self._listen.host, self._listen.port)
            self._server = await loop.create_server(
                factory, self._listen.host, self._listen.port, backlog=backlog, reuse_address=True
            )
        if self.penalties is not None:
            self.penalties.reset()
        self.bound_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening (the connections are the runner's: ``runner.cleanup()``)."""
        self._stopping = True
        if self.penalties is not None:
            self.penalties.close()
        if self._server is not None:
            self._server.close()
