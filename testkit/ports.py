"""A free loopback port, for servers given a port number rather than bound to port 0.

Asking the OS (bind to port 0, close, hand the number out) was not enough: the OS may give
the same number to the next ask, before anything listens on the first, and one CI run started
an extender whose verbs and metrics ports were the same. Nor does it keep the number from the
ports ``connect()`` takes for its own end (the ephemeral range, 32768-60999 by default).

So every test process on the machine (pytest workers, the benchmarks they start, a second
pytest beside the first) draws from one counter, kept in a file under a lock, over a range
below the ephemeral one; a number is handed out only if a bind on it succeeds right then.
Two asks get the same number only after the counter went round the whole range, and then
only if the first one's server is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import tempfile
from pathlib import Path

FIRST, LAST = 20000, 32000
_COUNTER = Path(tempfile.gettempdir()) / f"vma-test-ports-{os.getuid()}"


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, and no other test process was given."""
    fd = os.open(_COUNTER, os.O_RDWR | os.O_CREAT, 0o600)
    with contextlib.closing(os.fdopen(fd, "r+")) as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)
        text = counter.read().strip()
        port = int(text) if text.isdigit() else FIRST + os.getpid() % (LAST - FIRST)
        for _ in range(LAST - FIRST):
            port = port + 1 if FIRST <= port < LAST else FIRST
            if _bindable(port):
                counter.seek(0)
                counter.truncate()
                counter.write(str(port))
                return port
    raise RuntimeError(f"no free port in {FIRST}-{LAST} on 127.0.0.1")
