"""How a service's main coroutine runs, and how it ends on an operator's mistake.

Apart from ``exits`` because it needs asyncio, which the pure packages and the simulator
(which share ``exits``) never import.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Coroutine
from typing import Any, Final

from observability.exits import ExitCode, Problem, fail

LISTEN_ERRNOS: Final = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL})
"""What binding a listen address taken or forbidden raises: the operator's to fix."""


def run_service(prog: str, main: Coroutine[Any, Any, object], *, listening_on: str) -> int:
    """``asyncio.run(main)``, with a ``Problem`` or a listen address it cannot bind (named by
    ``listening_on``) ending it as one line and its exit code; anything else is a bug and
    propagates with its traceback."""
    try:
        asyncio.run(main)
    except OSError as e:
        if e.errno not in LISTEN_ERRNOS:
            raise
        message = f"cannot listen on {listening_on}: {e.strerror or e}"
        return fail(prog, message, ExitCode.PORT_IN_USE)
    except Problem as e:
        return fail(prog, str(e), e.code)
    return 0
