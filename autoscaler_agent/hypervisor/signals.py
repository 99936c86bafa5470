"""The guest's memory-pressure signals: lines on a virtio-serial port, read from its host end.

Shell. With memory hot-plug, ``vm_runner`` gives the VM a virtio-serial port named
``org.vm-autoscaling.memory.0`` whose host end is a unix socket beside the QMP socket
(``factory.memory_signal_socket_beside``; QEMU listens). The guest's ``memory-watch``
(vm_image/guest) writes one line, ``high <count>``, when its workload crossed the cgroup's
memory.high: the kernel is throttling the workload, and the agent should look now rather than
at its next scrape. The line's content is not trusted for anything: each line is one signal.

QEMU serves one client per chardev socket, and the guest's line waits in the guest while
nobody holds the socket: ``watch`` connects, calls ``on_signal`` for each line, and when the
socket is missing, refuses or closes (a VM starting or stopping, QEMU restarting) it tries
again after ``retry_seconds``, for as long as it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Final

import structlog

log = structlog.get_logger(__name__)

# "high <count>" is a dozen bytes; a longer line is not memory-watch's.
MAX_LINE_BYTES: Final = 256


async def watch(
    socket_path: Path, on_signal: Callable[[], None], *, retry_seconds: float = 1.0
) -> None:
    """Call ``on_signal`` once per line the guest writes; runs until cancelled."""
    is_connected_before = False
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(
                str(socket_path), limit=MAX_LINE_BYTES
            )
        except OSError as e:
            if is_connected_before:
                log.info("memory_signals_lost", socket=str(socket_path), error=str(e))
                is_connected_before = False
            await asyncio.sleep(retry_seconds)
            continue
        if not is_connected_before:
            log.info("memory_signals_connected", socket=str(socket_path))
        is_connected_before = True
        try:
            await _read_lines(reader, on_signal)
        finally:
            writer.close()
        await asyncio.sleep(retry_seconds)


async def _read_lines(reader: asyncio.StreamReader, on_signal: Callable[[], None]) -> None:
    while True:
        try:
            line = await reader.readline()
        except ValueError:
            # Longer than MAX_LINE_BYTES: the reader drops it (or what it buffered of it; the
            # rest may then read as one more line). Not memory-watch's; at worst one more
            # signal, which only brings a scrape forward.
            continue
        except OSError:
            return
        if not line:
            return
        if line.strip():
            on_signal()
