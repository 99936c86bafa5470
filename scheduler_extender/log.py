"""structlog configuration, done once by ``__main__``.

Shell. JSON lines when stderr is not a terminal (a pod's log), a readable console otherwise.
Context bound with ``structlog.contextvars`` (request id, pod, node) is merged into every line.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(*, level: str = "info", is_json: bool | None = None) -> None:
    if is_json is None:
        is_json = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
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
