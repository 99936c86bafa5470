"""The guest's memory-pressure lines read from a real unix socket (QEMU's end of the port is a
listening socket; here a server that writes what a guest's memory-watch would)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from autoscaler_agent.hypervisor import signals

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(path: Path, handler: Handler) -> AsyncIterator[None]:
    """A unix server whose every connection is closed on the way out."""
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await handler(reader, writer)

    server = await asyncio.start_unix_server(serve, path=str(path))
    try:
        yield
    finally:
        server.close()
        for writer in writers:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def watching(path: Path, on_signal: Callable[[], None]) -> AsyncIterator[None]:
    watcher = asyncio.create_task(signals.watch(path, on_signal, retry_seconds=0.01))
    try:
        yield
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def test_each_line_is_one_signal_across_reconnects(sock_dir):
    path = sock_dir / "vm.memory.sock"
    sessions = [
        [b"high 1\n", b"\n", b"high 2\n"],  # blank lines are not signals
        [b"high 3\n"],  # after the guest's end closed: the watcher connected again
    ]
    got = 0
    third = asyncio.Event()

    def on_signal() -> None:
        nonlocal got
        got += 1
        if got == 3:
            third.set()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if sessions:
            for chunk in sessions.pop(0):
                writer.write(chunk)
            await writer.drain()
        if sessions:
            writer.close()

    async with serving(path, handler), watching(path, on_signal):
        async with asyncio.timeout(10):
            await third.wait()
        await asyncio.sleep(0.05)  # the held-open connection brings no more
        assert got == 3
        assert not sessions


async def test_a_missing_socket_is_retried_until_it_appears(sock_dir):
    path = sock_dir / "vm.memory.sock"
    signalled = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"high 7\n")
        await writer.drain()

    async with watching(path, signalled.set):
        await asyncio.sleep(0.05)  # the VM is not up yet: nothing to connect to
        assert not signalled.is_set()
        async with serving(path, handler), asyncio.timeout(10):
            await signalled.wait()
