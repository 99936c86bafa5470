"""The one error boundary: an ``ExtenderError`` becomes an HTTP status, headers and body here.

Shell. Errors are typed where they arise (``errors``: each class carries its status and a
stable reason word); this module alone turns one into an answer, for every path that answers
one: the middleware of both listeners, the permit desk (in the extender's process and across
the permit front's channel) and the permit front's probes. The body is the JSON
``ErrorBody`` (``{"error", "reason", "message"}``), or for a probe, which speaks plain text,
the message on one line. ``DeskAnswer`` is the answer before it is a ``web.Response``: the
permit desk's answers cross the channel as it.
"""

from __future__ import annotations

from typing import Final

import msgspec
from aiohttp import web

from protocol import codec
from protocol.permits import ErrorBody
from scheduler_extender.errors import ExtenderError

JSON: Final = "application/json"
INTERNAL_ERROR: Final = "internal error; see the extender's log"


class DeskAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """What the desk answers: the HTTP status, body and headers, whether the connection is
    closed after it (``close``: the error's ``closes_connection``), and what the one
    ``request`` log line of the call says: its ``reason`` (the statuses counted, or the
    error), and the batch's ``node`` and number of ``vms`` once it is decoded."""

    status: int
    body: bytes
    headers: dict[str, str] = {}
    close: bool = False
    reason: dict[str, int] | str | None = None
    node: str | None = None
    vms: int | None = None


def error_answer(
    error: ExtenderError, *, is_text: bool = False, node: str | None = None, vms: int | None = None
) -> DeskAnswer:
    """``error`` as an answer: its status, its headers and its body (``is_text``: a probe's)."""
    if is_text:
        return DeskAnswer(
            status=error.status, body=f"{error.message}\n".encode(), reason=error.message
        )
    body = codec.encode(
        ErrorBody(error=type(error).__name__, reason=error.reason, message=error.message)
    )
    return DeskAnswer(
        status=error.status,
        body=body,
        headers=error.headers,
        close=error.closes_connection,
        reason=error.message,
        node=node,
        vms=vms,
    )


def internal_error() -> ExtenderError:
    """What a bug answers (its traceback goes to the log, never to the caller)."""
    return ExtenderError(INTERNAL_ERROR)


def response(answer: DeskAnswer, *, content_type: str = JSON) -> web.Response:
    out = web.Response(body=answer.body, status=answer.status, content_type=content_type)
    out.headers.update(answer.headers)
    if answer.close:
        out.force_close()
    return out


def error_response(error: ExtenderError) -> web.Response:
    return response(error_answer(error))
