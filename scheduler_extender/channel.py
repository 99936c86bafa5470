"""A channel between the extender's main process and one of its child processes: the two ends
of a socketpair the child inherits (no socket file to secure), carrying length-prefixed msgpack
frames of one tagged union per channel.

Shell. The permit front (``http.front``) and the binding worker (``kube.binding_worker``) each
speak their own frames over it; ``send`` never waits (the bytes are buffered, the other side
reads them), ``receive`` returns the next frame or raises ``ChannelClosed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Final, Generic, TypeVar

import msgspec

# A frame's length prefix, and the largest frame either side accepts by default (a permit body
# is at most ``limits.permits_max_body_bytes``, inflated; the front's metrics are a few KB).
_HEADER: Final = struct.Struct(">I")
MAX_FRAME: Final = 64 * 2**20
_ENCODER: Final = msgspec.msgpack.Encoder()

F = TypeVar("F")


class ChannelClosed(Exception):
    """The other process closed the channel (or sent something unreadable)."""


class Channel(Generic[F]):
    """One end of the socketpair; ``decoder`` reads this channel's frames."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        decoder: msgspec.msgpack.Decoder[F],
        *,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = decoder
        self._max_frame = max_frame

    @classmethod
    async def open(
        cls, sock: socket.socket, decoder: msgspec.msgpack.Decoder[F], *, max_frame: int = MAX_FRAME
    ) -> Channel[F]:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=max_frame)
        return cls(reader, writer, decoder, max_frame=max_frame)

    def send(self, frame: msgspec.Struct) -> None:
        if self._writer.is_closing():
            return
        data = _ENCODER.encode(frame)
        self._writer.write(_HEADER.pack(len(data)) + data)

    async def receive(self) -> F:
        try:
            (size,) = _HEADER.unpack(await self._reader.readexactly(_HEADER.size))
            if size > self._max_frame:
                raise ChannelClosed(f"a frame of {size} bytes")
            frame: F = self._decoder.decode(await self._reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            raise ChannelClosed("end of the channel") from e
        except msgspec.DecodeError as e:
            raise ChannelClosed(f"an unreadable frame: {e}") from e
        return frame

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
