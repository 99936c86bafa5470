"""kube-scheduler's per-pod verbs (filter, prioritize, bind) served straight off the connection.

Shell. Speed: every scheduled pod costs three calls, and on a busy machine the extender's CPU
is what paces kube-scheduler (its one thread gets a fair share of a core, and kube-scheduler's
serial cycle waits on filter and prioritize). Through aiohttp, a small keep-alive POST costs
the server more CPU before any handler runs (the request and response objects, the router,
the middleware's coroutine, the handler task's wake-ups) than reading a head and writing an
answer on the connection itself costs in all (``scripts/bench_scheduling.py`` prints the
extender's CPU per scheduled pod). So the plain calls that
kube-scheduler makes take a shorter road: ``connections`` parses the head, and when it is
exactly such a call (see ``parse_head``), the body is answered here, synchronously for filter
and prioritize (in the event-loop turn the last bytes arrived in), with the same functions,
errors, metrics and log line as the aiohttp path (``verbs``, ``middleware``).

Refusals that need only the head are answered here too, because a flood of them is the
cheapest way to make the event loop that filter runs on busy: not synced yet (503, as the
handlers answer before they read a body), a compressed body (415, kube-scheduler never
compresses) and a declared length over the endpoint's limit (413). The answer is the one the
aiohttp path gives (status, error body, request id, log line and metric), the body is never
read, and the connection is closed after it, as aiohttp closes one whose body it did not read
(aiohttp sends no ``Connection: close`` first; this path does). Through aiohttp such a
refusal cost the loop several times as much (its request handler, request, middleware and
handler task for one answer; ``scripts/bench_attacks.py`` runs such floods).

Everything else on the listener, and every request that is not plainly one of these three
(another method or path, HTTP/1.0, a query string, ``Transfer-Encoding``, ``Content-Encoding:
identity``, ``Connection`` other than keep-alive, ``Expect``, ``Upgrade``, no or a doubtful
``Content-Length``, a length over ``MAX_BODY`` but within the endpoint's limit, control
characters, a head over ``MAX_HEAD``), is handed to aiohttp with every byte received so far,
and the connection stays with aiohttp: it answers exactly as if it had read them itself
(400, the body timeout...). So this path adds no parser anyone hostile can reach beyond
recognising a plain head, and every #16 guard still applies (``connections``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Final, NamedTuple

import structlog
from aiohttp import web

from protocol import codec
from protocol.permits import ErrorBody
from scheduler_extender.errors import ExtenderError
from scheduler_extender.http import verbs
from scheduler_extender.http.bodies import BODIES, refused_unread
from scheduler_extender.http.keys import EXTENDER
from scheduler_extender.http.middleware import METRICS, begin_call, end_call, unexpected

# A head longer than this goes to aiohttp (whose own limits then apply).
MAX_HEAD: Final = 8192
# Bodies above this go to aiohttp: they are not the per-pod calls of a cache-mode scheduler,
# and aiohttp streams them against the in-flight budget as they arrive.
MAX_BODY: Final = 2**20
# A body that has not fully arrived this long after its head goes to aiohttp, whose body
# timeout then applies (kube-scheduler's bodies arrive within milliseconds on loopback).
BODY_WINDOW_SECONDS: Final = 0.5

_ROUTES: Final = {b"/filter": "filter", b"/prioritize": "prioritize", b"/bind": "bind"}
# Bytes no plain head carries (CR and LF only as the line ends, checked separately).
_CONTROL: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f-\xff]")
_HANDED: Final = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"te", b"trailer"})
_IDENTITY: Final = frozenset({b"", b"identity"})


class Head(NamedTuple):
    route: str
    path: str
    length: int  # of the body
    size: int  # of the head, its blank line included
    request_id: str | None


class Refusal(NamedTuple):
    """A verb call refused from its head alone; its body is not read, its connection closed."""

    route: str
    path: str
    request_id: str | None
    error: ExtenderError


class Handover(NamedTuple):
    """Not a plain verb call: aiohttp takes the connection."""


HANDOVER: Final = Handover()


def parse_head(
    buffer: bytes | bytearray, limits: Callable[[str], int]
) -> Head | Refusal | Handover | None:
    """The head at the start of ``buffer`` if it is a plain verb call, or its refusal if it is
    one ``bodies`` would refuse unread; ``None``: not all here."""
    end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD)
    if end < 0:
        return HANDOVER if len(buffer) >= MAX_HEAD else None
    lines = bytes(buffer[:end]).split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1":
        return HANDOVER
    route = _ROUTES.get(parts[1])
    if route is None:
        return HANDOVER
    length: int | None = None
    request_id: str | None = None
    encoding: bytes | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or _CONTROL.search(line) or b" " in name or b"\t" in name:
            return HANDOVER
        key = name.lower()
        value = value.strip(b" \t")
        if key == b"content-length":
            if length is not None or not value.isdigit() or len(value) > 12:
                return HANDOVER
            length = int(value)
        elif key == b"content-encoding":
            if encoding is None:  # the first, as aiohttp's ``headers.get``
                encoding = value.lower()
        elif key in _HANDED:
            return HANDOVER
        elif key == b"connection":
            if value.lower() != b"keep-alive":
                return HANDOVER
        elif key == b"x-request-id" and request_id is None:  # the first, as aiohttp's
            request_id = value.decode("ascii") or None
    path = parts[1].decode("ascii")
    if encoding in _IDENTITY:
        return HANDOVER  # aiohttp reads it (kube-scheduler sends no Content-Encoding at all)
    refusal = refused_unread(
        "" if encoding is None else encoding.decode("ascii"), length, limits(route)
    )
    if refusal is not None:
        return Refusal(route, path, request_id, refusal)
    if length is None or length > MAX_BODY:
        return HANDOVER
    return Head(route, path, length, end + 4, request_id)


class FastVerbs:
    """The verbs app's three per-pod verbs, for ``GuardedSite(fast=...)``."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._extender = app[EXTENDER]
        self.bodies = app[BODIES]
        self._metrics = app[METRICS]
        self.answered = 0  # calls answered here (the rest went to aiohttp)
        self.refused = 0  # heads refused here (``Refusal``)

    def limit(self, route: str) -> int:
        limits = self.bodies.limits
        return limits.bind_max_body_bytes if route == "bind" else limits.verbs_max_body_bytes

    def parse(self, buffer: bytes | bytearray) -> Head | Refusal | Handover | None:
        parsed = parse_head(buffer, self.limit)
        if isinstance(parsed, Head | Refusal):
            # As the handlers do, before the body is read: not synced is a 503 that costs no
            # body (and closes the connection, the body unread, as aiohttp does).
            try:
                self._extender.require_synced()
            except ExtenderError as e:
                return Refusal(parsed.route, parsed.path, parsed.request_id, e)
        return parsed

    def refuse(self, refusal: Refusal) -> bytes:
        """The whole response to a refused head (``Connection: close``: its body is unread)."""
        self.refused += 1
        head = Head(refusal.route, refusal.path, 0, 0, refusal.request_id)
        request_id = begin_call(refusal.request_id)
        start = asyncio.get_running_loop().time()
        return self._error(head, refusal.error, request_id, start, close=True)

    def answer(self, head: Head, body: bytes) -> bytes | Awaitable[bytes]:
        """The whole response: bytes now (filter, prioritize), or later (bind)."""
        self.answered += 1
        request_id = begin_call(head.request_id)
        loop = asyncio.get_running_loop()
        start = loop.time()
        if head.route == "bind":
            return self._bind(head, body, request_id, start)
        try:
            if head.route == "filter":
                encoded = verbs.filter_answer(self._app, body)
            else:
                encoded = verbs.prioritize_answer(self._app, body)
        except ExtenderError as e:
            return self._error(head, e, request_id, start)
        except Exception:
            return self._error(head, unexpected(), request_id, start)
        return self._done(head, 200, encoded, request_id, start)

    async def _bind(self, head: Head, body: bytes, request_id: str, start: float) -> bytes:
        try:
            encoded = await verbs.bind_answer(self._app, body)
        except ExtenderError as e:
            return self._error(head, e, request_id, start)
        except Exception:
            return self._error(head, unexpected(), request_id, start)
        return self._done(head, 200, encoded, request_id, start)

    def _error(
        self,
        head: Head,
        error: ExtenderError,
        request_id: str,
        start: float,
        *,
        close: bool = False,
    ) -> bytes:
        """``middleware.error_response``'s answer, as bytes."""
        structlog.contextvars.bind_contextvars(reason=error.message)
        body = codec.encode(
            ErrorBody(error=type(error).__name__, reason=error.reason, message=error.message)
        )
        headers = {**error.headers, "Connection": "close"} if close else error.headers
        return self._done(head, error.status, body, request_id, start, headers=headers)

    def _done(
        self,
        head: Head,
        status: int,
        body: bytes,
        request_id: str,
        start: float,
        *,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        end_call(
            self._metrics,
            head.route,
            method="POST",
            path=head.path,
            status=status,
            seconds=asyncio.get_running_loop().time() - start,
        )
        return response_bytes(status, body, request_id, headers)


# Answers no well-behaved client earns (``penalties``): its body was malformed (400), too large
# (413) or compressed (415). Not 404 or 409: kube-scheduler gets those in races.
_OFFENDING: Final = frozenset({b"400", b"413", b"415"})


def offends(response: bytes) -> bool:
    """Whether a response made here (``response_bytes``) counts against its client."""
    return response[9:12] in _OFFENDING


def response_bytes(
    status: int, body: bytes, request_id: str, headers: dict[str, str] | None = None
) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"X-Request-Id: {request_id}\r\n{extra}\r\n"
    ).encode("latin-1") + body
