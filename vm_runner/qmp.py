"""A minimal QMP client for the runner's private control socket: handshake, then commands.

Shell: speaks JSON lines over a unix socket. It knows only what shutdown needs; the autoscaler
agent's hot-plug client lives in ``autoscaler_agent/hypervisor/qmp.py``. Asynchronous events
(``POWERDOWN``, ``SHUTDOWN`` ...) that arrive between a command and its answer are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from types import TracebackType
from typing import Self


class QmpError(Exception):
    """QEMU answered a command with an error, or the connection broke; a retry rarely helps."""


class QmpClient:
    """One QMP session. Use ``await QmpClient.connect(path)`` and ``async with``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def connect(cls, path: str) -> Self:
        """``path``: a unix socket, or ``tcp:HOST:PORT`` (a runner's ``--migration-port``)."""
        if path.startswith("tcp:"):
            host, _, port = path.removeprefix("tcp:").rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port))
        else:
            reader, writer = await asyncio.open_unix_connection(path)
        client = cls(reader, writer)
        try:
            greeting = await client._read_message()
            if "QMP" not in greeting:
                raise QmpError(f"expected a QMP greeting, got {greeting!r}")
            await client.execute("qmp_capabilities")
        except BaseException:
            await client.close()
            raise
        return client

    async def _read_message(self) -> dict[str, object]:
        line = await self._reader.readline()
        if not line:
            raise QmpError("QMP connection closed")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise QmpError(f"QMP message is not an object: {line!r}")
        return message

    async def execute(self, command: str, arguments: dict[str, object] | None = None) -> object:
        request: dict[str, object] = {"execute": command}
        if arguments:
            request["arguments"] = arguments
        self._writer.write(json.dumps(request).encode() + b"\n")
        await self._writer.drain()
        while True:
            message = await self._read_message()
            if "return" in message:
                return message["return"]
            if "error" in message:
                raise QmpError(f"{command}: {message['error']}")

    async def close(self) -> None:
        self._writer.close()
        # QEMU may already be gone, which is the point of most of the commands we send.
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
