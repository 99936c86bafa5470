"""Request context and error mapping for both listeners: one middleware.

Shell. ``request_middleware`` clears structlog's contextvars, binds ``request_id`` (from
``X-Request-Id`` or new), times the call into ``..._verb_duration_seconds`` and writes the one
canonical ``request`` log line, which carries whatever the handler bound (``pod``, ``node``,
``reason``), and marks a guarded connection busy meanwhile (``connections.serving``). It
turns ``ExtenderError``s into their answers (``answers``), aiohttp's 413 into
``BodyTooLarge``, and anything else into a generic 500 whose traceback is logged with the
request id: the boundary where ``except Exception`` belongs.

One middleware, not two: kube-scheduler waits on every filter call, and each aiohttp
middleware layer is another coroutine per request.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import msgspec
import structlog
from aiohttp import web

from protocol import codec
from scheduler_extender.errors import BodyTooLarge, ExtenderError, ProtocolError
from scheduler_extender.http.answers import JSON, error_response, internal_error
from scheduler_extender.http.bodies import BODIES
from scheduler_extender.http.connections import serving
from scheduler_extender.metrics import Metrics

log = structlog.get_logger("scheduler_extender.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")

METRICS = web.AppKey("metrics", Metrics)
# Routes named like this are timed per verb; the rest (probes, metrics) are not.
TIMED_ROUTES: Final = frozenset({"filter", "prioritize", "bind", "preempt", "permits"})
STATEFUL_ROUTES: Final = frozenset({"bind", "preempt", "permits"})


def json_response(value: object, *, status: int = 200) -> web.Response:
    return web.Response(body=codec.encode(value), status=status, content_type=JSON)


async def read_body(request: web.Request) -> bytes:
    """The whole body, within its endpoint's limits (see ``bodies``).

    The permit port's bodies may be compressed (inflated only after authentication: the handler
    authenticates before it calls this); everything else takes identity only.
    """
    bodies = request.app[BODIES]
    limits = bodies.limits
    route = request.match_info.route.name
    if route == "permits":
        return await bodies.read(request, limit=limits.permits_max_body_bytes, inflate=True)
    limit = limits.bind_max_body_bytes if route == "bind" else limits.verbs_max_body_bytes
    return await bodies.read(request, limit=limit)


def decode(type_: type[T], body: bytes | msgspec.Raw) -> T:
    try:
        return codec.decode(type_, body)
    except codec.ProtocolError as e:
        raise ProtocolError(f"{type_.__name__}: {e}") from e


@web.middleware
async def request_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    structlog.contextvars.clear_contextvars()
    # 32 hex digits, like a uuid4's: from the random module (seeded from the OS, reseeded in
    # a forked child), not a getrandom(2) call per request. An id to find a request's lines
    # by, not a secret.
    request_id = request.headers.get("X-Request-Id") or f"{random.getrandbits(128):032x}"
    structlog.contextvars.bind_contextvars(request_id=request_id)
    route = request.match_info.route.name or ""
    loop = asyncio.get_running_loop()  # its clock: monotonic, and virtual under looptime
    start = loop.time()
    status = 500
    # A request in progress on a guarded connection: not evicted, no header timeout.
    connection = serving(request)
    try:
        # The error mapping, in this coroutine rather than a helper's: one coroutine less
        # per request (see the module docstring).
        try:
            response = await handler(request)
        except ExtenderError as e:
            structlog.contextvars.bind_contextvars(reason=e.message)
            response = error_response(e)
        except web.HTTPRequestEntityTooLarge as e:
            response = error_response(BodyTooLarge(e.text or "request body too large"))
        except web.HTTPException:
            raise  # aiohttp's own answers (404 for unknown routes, 405)
        except Exception:
            # Task boundary: a bug must cost one request, not the process; a human must see it.
            log.exception("internal_error")
            response = error_response(internal_error())
        status = response.status
        response.headers["X-Request-Id"] = request_id
        return response
    except web.HTTPException as e:
        status = e.status
        raise
    finally:
        if connection is not None:
            connection.ended()
        seconds = loop.time() - start
        if route in TIMED_ROUTES:
            request.app[METRICS].observe_verb(route, seconds, is_error=status != 200)
        # filter and prioritize change nothing and run for every pod kube-scheduler tries:
        # their lines are debug (the histogram counts them), and not even built when debug
        # is off (structlog's public ``is_enabled_for``); what changes state, and errors, is
        # info.
        is_info = route in STATEFUL_ROUTES or status >= 400
        if is_info or log.is_enabled_for(logging.DEBUG):
            (log.info if is_info else log.debug)(
                "request",
                method=request.method,
                path=request.path,
                status=status,
                duration_seconds=round(seconds, 6),
            )
