"""structlog set-up for the extender, the agent and the VM runner, done once by each ``__main__``.

Shell. JSON lines when stderr is not a terminal (a pod's log), a readable console otherwise.
Context bound with ``structlog.contextvars`` (request id, pod, node) is merged into every line.

JSON is encoded with msgspec rather than ``json.dumps``, which is faster, and the extender
writes one per permit batch. Values it cannot encode are written as their ``repr``,
as structlog's own renderer does.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import structlog

_ENCODER = msgspec.json.Encoder(enc_hook=repr)


def _dumps(event: Any, **_: Any) -> str:
    return _ENCODER.encode(event).decode()


def configure_logging(level: str = "info", *, is_json: bool | None = None) -> None:
    """``level`` is a logging level name (``debug``, ``info``, ...); ``is_json`` defaults to
    "stderr is not a terminal"."""
    if is_json is None:
        is_json = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=_dumps)
        if is_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
