"""Opening a hypervisor's unix socket with a bounded wait and typed errors (QMP and QGA).

Shell: one helper, so every client says the same thing when a socket is missing or silent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from autoscaler_agent.hypervisor.errors import HypervisorUnavailable


async def open_unix_stream(
    socket_path: Path, *, protocol: str, timeout_seconds: float, limit: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect within ``timeout_seconds``; ``HypervisorUnavailable`` naming ``protocol`` and
    the socket otherwise. ``limit`` is the longest line the reader accepts."""
    try:
        async with asyncio.timeout(timeout_seconds):
            return await asyncio.open_unix_connection(str(socket_path), limit=limit)
    except TimeoutError as e:
        raise HypervisorUnavailable(
            f"{protocol} on {socket_path} did not accept a connection within {timeout_seconds} s"
        ) from e
    except OSError as e:
        raise HypervisorUnavailable(
            f"{protocol} on {socket_path} is unreachable", detail=str(e)
        ) from e
