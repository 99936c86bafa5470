"""The event loop the extender's processes run on: uvloop when it is installed, else asyncio's.

Shell. Every request kube-scheduler sends is parsed, dispatched and answered by the loop and
its transports; uvloop (libuv, with the HTTP transports in C) does that for less CPU per
request than asyncio's own loop, and on a control-plane node that CPU is kube-scheduler's,
the API server's and etcd's too. It is a dependency wherever it builds (pyproject: CPython,
not Windows) and optional in the code: without it the extender runs on asyncio's loop with
the same behaviour, only dearer. ``--event-loop asyncio`` chooses asyncio's loop anyway, to
compare the two or to rule the loop out when chasing a fault. Tests run on their own loops
(pytest-asyncio's, looptime's virtual one): only the commands choose.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class EventLoop(enum.StrEnum):
    AUTO = "auto"  # uvloop if it is installed, else asyncio's
    ASYNCIO = "asyncio"


def loop_factory(choice: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the loop ``choice`` stands for (None: asyncio's default)."""
    if choice is EventLoop.ASYNCIO:
        return None
    try:
        import uvloop  # noqa: PLC0415 (optional: absent on platforms it does not build for)
    except ImportError:
        return None
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """For the start-up log line: which loop runs (``uvloop`` or ``asyncio``)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], choice: EventLoop = EventLoop.AUTO) -> T:
    """``asyncio.run(main)`` on the loop ``choice`` stands for."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
