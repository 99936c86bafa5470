"""A scripted QMP server on a unix socket: greeting, handshake, then replies written as data.

``script`` maps a command name to its *turns*: each turn is the list of lines sent in answer to
one call (events are sent as they are; ``return``/``error`` lines get the request's id). Turns
are used in order and the last one repeats. Commands in ``silent`` are never answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

GREETING = {
    "QMP": {
        "version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": ""},
        "capabilities": ["oob"],
    }
}


@dataclass
class FakeQmp:
    script: dict[str, list[list[dict]]] = field(default_factory=dict)
    silent: set[str] = field(default_factory=set)
    # Close each connection after answering this many commands (qmp_capabilities included).
    close_after: int | None = None
    received: list[dict] = field(default_factory=list)
    connections: int = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        try:
            writer.write(json.dumps(GREETING).encode() + b"\r\n")
            while line := await reader.readline():
                request = json.loads(line)
                self.received.append(request)
                command = request["execute"]
                if command in self.silent:
                    continue
                turns = self.script.get(command, [[{"return": {}}]])
                turn = turns.pop(0) if len(turns) > 1 else turns[0]
                for message in turn:
                    line_out = message if "event" in message else {**message, "id": request["id"]}
                    writer.write(json.dumps(line_out).encode() + b"\r\n")
                await writer.drain()
                answered += 1
                if self.close_after is not None and answered >= self.close_after:
                    break
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    @contextlib.asynccontextmanager
    async def serve(self, path: Path):
        server = await asyncio.start_unix_server(self._handle, str(path))
        try:
            yield path
        finally:
            server.close()
            await server.wait_closed()

    def commands(self) -> list[str]:
        return [r["execute"] for r in self.received]
