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
the ``_MAX_ADDRESSES`` most recent kept; over it a connection is closed at once with a canned
503, before aiohttp sees it): a flood of short hostile connections then costs the event loop
that kube-scheduler's calls share an accept and a close each, not a request, and it spends
the flooder's allowance, never the kubelet's or another node's agent's. At ``max_connections`` a new
connection evicts the one that has been quiet longest among those with no request in progress
(an idle keep-alive or a head still dribbling in), and is refused with a canned 503 only when
every connection is busy. So a flood of idle or slowloris connections costs the flooder its
own connections, while kube-scheduler's and the kubelet's next connections get in; and each
listener has its own cap, so one cannot take the other's file descriptors.
"""

from __future__ import annotations

import asyncio
import socket
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from scheduler_extender.config import Listen
from scheduler_extender.kube.auth import TokenBucket

log = structlog.get_logger(__name__)

# Client addresses whose connection rate is tracked (the least recently seen is forgotten).
_MAX_ADDRESSES: Final = 16_384
_REFUSED: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 34\r\n\r\ntoo many connections; retry later\n"
)


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
    and a close, nothing of aiohttp's."""

    def __init__(self, site: GuardedSite, make: Callable[[], RequestHandler]) -> None:
        self._site = site
        self._make = make
        self._inner: RequestHandler | None = None
        self.transport: asyncio.Transport | None = None
        self.last_active = 0.0
        self._head_timer: asyncio.TimerHandle | None = None

    @property
    def is_busy(self) -> bool:
        # aiohttp sets this while a request is being handled (its body read included), and
        # offers nothing public that says so. tests/extender/test_hostile_clients.py checks
        # that a busy connection survives eviction, so an aiohttp change cannot go unnoticed.
        inner = self._inner
        return inner is not None and inner._current_request is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.last_active = asyncio.get_running_loop().time()
        if not self._site.admit(self):
            transport.write(_REFUSED)
            transport.close()
            return
        self._inner = self._make()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        self.last_active = loop.time()
        inner = self._inner
        if inner is None:
            return
        if self._head_timer is None and not self.is_busy:
            # The first bytes of a request head: all of it must follow within the timeout.
            # (aiohttp counts the heads it has parsed; nothing public says so.)
            self._head_timer = loop.call_later(
                self._site.header_timeout, self._head_due, inner._request_count
            )
        inner.data_received(data)

    def _head_due(self, heads_before: int) -> None:
        self._head_timer = None
        inner = self._inner
        if inner is not None and inner._request_count == heads_before and not self.is_busy:
            self._site.heads_timed_out += 1
            self.close()

    def eof_received(self) -> None:
        if self._inner is not None:
            self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._site.forget(self)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._inner is not None:
            self._inner.connection_lost(exc)
            self._inner = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class GuardedSite(web.BaseSite):
    """A TCP listener with at most ``listen.max_connections`` open connections."""

    def __init__(
        self,
        runner: web.BaseRunner,
        listen: Listen,
        *,
        sock: socket.socket | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("backlog", listen.accept_backlog)
        super().__init__(runner, **kwargs)
        self._listen = listen
        # A listening socket bound elsewhere (the permit front inherits its own).
        self._sock = sock
        self._open: set[_Guarded] = set()
        self._rates: OrderedDict[str, TokenBucket] = OrderedDict()
        self.header_timeout = listen.header_timeout_seconds
        self.evicted = 0
        self.refused = 0
        self.heads_timed_out = 0
        self.bound_port = listen.port

    @property
    def name(self) -> str:
        return f"http://{self._listen.host}:{self.bound_port}"

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def _rate(self, conn: _Guarded) -> TokenBucket:
        peer = conn.transport.get_extra_info("peername") if conn.transport else None
        address = str(peer[0]) if peer else ""
        rate = self._rates.get(address)
        if rate is None:
            rate = self._rates[address] = TokenBucket(
                rate_per_second=self._listen.new_connections_per_second,
                burst=self._listen.new_connections_burst,
            )
            if len(self._rates) > _MAX_ADDRESSES:
                self._rates.popitem(last=False)
        else:
            self._rates.move_to_end(address)
        return rate

    def admit(self, conn: _Guarded) -> bool:
        if self._rate(conn).take(conn.last_active) > 0.0:
            self.refused += 1
            if self.refused & (self.refused - 1) == 0:  # 1, 2, 4, 8...: a flood logs little
                log.warning("connections_over_rate", listener=self.name, total=self.refused)
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
            self._server = await loop.create_server(
                lambda: _Guarded(self, server), sock=self._sock, backlog=self._backlog
            )
        else:
            self._server = await loop.create_server(
                lambda: _Guarded(self, server),
                self._listen.host,
                self._listen.port,
                backlog=self._backlog,
            )
        if self._server.sockets:
            self.bound_port = self._server.sockets[0].getsockname()[1]
