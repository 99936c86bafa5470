"""A fake qemu-guest-agent behind a unix socket, behaving as the real pair does.

The real pair: QEMU listens on a unix socket that is the host end of a virtio-serial port, and
one qemu-ga in the guest reads commands from the port one at a time, answering each in turn.
The guest's end outlives host connections, so an answer to a command sent on an old
connection is written to whichever host connection is open when the guest gets to it. This
fake keeps exactly that: one guest worker, one queue of command lines for all connections,
answers written to the current connection.

Knobs: ``silent`` commands are never answered; ``garbage`` commands are answered with a line
that is not JSON; ``delays`` makes a command take that long (holding up the ones behind it, as
the real single-threaded agent does); ``refuse`` lists logical ids the guest cannot change
(guest-set-vcpus stops there, as qemu-ga does); ``on_connect`` lines are written to every new
connection first (stale answers, noise); ``close_after`` hangs up after that many answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class FakeQga:
    online: dict[int, bool] = field(default_factory=lambda: {0: True, 1: False, 2: False, 3: False})
    silent: set[str] = field(default_factory=set)
    garbage: set[str] = field(default_factory=set)
    delays: dict[str, float] = field(default_factory=dict)
    refuse: set[int] = field(default_factory=set)
    on_connect: list[bytes] = field(default_factory=list)
    close_after: int | None = None
    received: list[dict] = field(default_factory=list)
    connections: int = 0
    _writer: asyncio.StreamWriter | None = None
    _answered: int = 0
    _queue: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)

    def commands(self) -> list[str]:
        return [r["execute"] for r in self.received]

    @property
    def online_count(self) -> int:
        return sum(self.online.values())

    # -- the host side: connections --------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._answered = 0
        if self._writer is not None:
            self._writer.close()
        self._writer = writer
        for line in self.on_connect:
            writer.write(line)
        with contextlib.suppress(OSError):
            while line := await reader.readline():
                await self._queue.put(line)
        if self._writer is writer:
            self._writer = None
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    def _send(self, data: bytes) -> None:
        writer = self._writer
        if writer is None or writer.is_closing():
            return  # nobody listening: the answer is lost, as on a real port
        writer.write(data)
        self._answered += 1
        if self.close_after is not None and self._answered >= self.close_after:
            writer.close()

    # -- the guest side: one agent, one command at a time ----------------------------------

    async def _guest(self) -> None:
        while True:
            line = (await self._queue.get()).lstrip(b"\xff").strip()
            if not line:
                continue
            try:
                request = json.loads(line)
            except ValueError:
                self._send(b'{"error": {"class": "GenericError", "desc": "Invalid JSON"}}\n')
                continue
            self.received.append(request)
            command = request.get("execute")
            if command in self.delays:
                await asyncio.sleep(self.delays[command])
            if command in self.silent:
                continue
            if command in self.garbage:
                self._send(b"<html>not the guest agent</html>\n")
                continue
            prefix, answer = self._answer(command, request.get("arguments") or {})
            self._send(prefix + json.dumps(answer).encode() + b"\n")

    def _answer(self, command: str, arguments: dict) -> tuple[bytes, dict]:
        if command == "guest-sync-delimited":
            return b"\xff", {"return": arguments["id"]}
        if command == "guest-sync":
            return b"", {"return": arguments["id"]}
        if command == "guest-get-vcpus":
            return b"", {
                "return": [
                    {"logical-id": i, "online": on, "can-offline": i != 0}
                    for i, on in sorted(self.online.items())
                ]
            }
        if command == "guest-set-vcpus":
            done = 0
            for change in arguments["vcpus"]:
                i, on = change["logical-id"], change["online"]
                if i not in self.online or i in self.refuse or (i == 0 and not on):
                    if done == 0:
                        return b"", {
                            "error": {"class": "GenericError", "desc": f"cpu{i}: Device busy"}
                        }
                    break
                self.online[i] = on
                done += 1
            return b"", {"return": done}
        return b"", {"error": {"class": "CommandNotFound", "desc": f"{command} not found"}}

    @contextlib.asynccontextmanager
    async def serve(self, path: Path):
        guest = asyncio.create_task(self._guest())
        server = await asyncio.start_unix_server(self._connection, str(path))
        try:
            yield path
        finally:
            server.close()
            if self._writer is not None:
                self._writer.close()
            guest.cancel()
            await asyncio.wait([guest])
            await server.wait_closed()
