"""Reading request bodies without letting a client choose how much memory or CPU they cost.

Shell. The servers run with aiohttp's own decompression off (``connections.server_options``),
so a body arrives here exactly as sent, and nothing is read or inflated before the handler
asks for it: the permit port authenticates from the headers first, so an unauthenticated body
is never read at all (and, with lingering off, never drained: the connection is closed).

``Bodies.read(request, limit=..., inflate=...)``, in order:

1. ``Content-Encoding`` other than identity: 415 unless the endpoint inflates (the permit port
   does; kube-scheduler never compresses, so the verbs refuse);
2. ``Content-Length`` above the endpoint's limit: 413 before a byte is read;
3. a share of the process-wide ``bodies_in_flight_bytes`` budget, taken as the bytes arrive
   (all of a declared length at once): 503 with Retry-After when it is spent, so many
   concurrent large bodies cannot add up past the pod's memory limit;
4. the bytes, within ``body_timeout_seconds`` (408 after; a body already in whole is taken at
   once, with no timer), inflated chunk by chunk with
   ``zlib``'s ``max_length`` so the *decompressed* size never exceeds the limit by more than
   one byte before it is refused (413). A body labelled gzip that is not: 400. A connection
   lost before its body was read: 400 ``ConnectionLost`` (nobody reads it; the log does).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Final

from aiohttp import web

from scheduler_extender.config import LimitsConfig
from scheduler_extender.errors import (
    BodyTimeout,
    BodyTooLarge,
    ExtenderError,
    ProtocolError,
    Unavailable,
    UnsupportedEncoding,
)

_IDENTITY: Final = frozenset({"", "identity"})
# gzip and zlib streams both; zlib tells them apart by their header.
_INFLATABLE: Final = frozenset({"gzip", "x-gzip", "deflate"})
_AUTO_HEADER_WBITS: Final = 32 + zlib.MAX_WBITS
_CHUNK: Final = 2**16


def refused_unread(
    encoding: str, declared: int | None, limit: int, *, inflate: bool = False
) -> ExtenderError | None:
    """Steps 1 and 2 of ``Bodies.read``: what a body is refused for before a byte of it is
    read (``encoding`` stripped and lower-case, ``declared`` its Content-Length)."""
    if encoding not in _IDENTITY and not (inflate and encoding in _INFLATABLE):
        takes = "gzip, deflate or identity" if inflate else "identity only"
        return UnsupportedEncoding(f"Content-Encoding {encoding!r} is not accepted here ({takes})")
    if declared is not None and declared > limit:
        return BodyTooLarge(f"the body is {declared} bytes; this endpoint takes {limit}")
    return None


class Bodies:
    """The limits and the in-flight budget, shared by both listeners."""

    def __init__(self, limits: LimitsConfig) -> None:
        self.limits = limits
        self.in_flight = 0

    def _take(self, size: int) -> None:
        if self.in_flight + size > self.limits.bodies_in_flight_bytes:
            raise Unavailable(
                "too many request bodies are being read at once; retry",
                reason="BodiesInFlight",
            )
        self.in_flight += size

    async def read(self, request: web.Request, *, limit: int, inflate: bool = False) -> bytes:
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        declared = request.content_length
        refusal = refused_unread(encoding, declared, limit, inflate=inflate)
        if refusal is not None:
            raise refusal
        compressed = encoding not in _IDENTITY
        taken = 0
        try:
            if declared is not None and not compressed:
                self._take(declared)
                taken = declared
                if request.content.is_eof():
                    # All of it arrived with the head (kube-scheduler's calls, as a rule):
                    # taken as it is, without a wait and so without the timeout's timer.
                    return _whole(request.content.read_nowait(-1), declared)
            async with asyncio.timeout(self.limits.body_timeout_seconds):
                if compressed:
                    body, taken = await self._inflate(request, limit, taken)
                else:
                    body, taken = await self._plain(request, limit, taken)
        except TimeoutError as e:
            raise BodyTimeout(
                f"the body did not arrive within {self.limits.body_timeout_seconds} s"
            ) from e
        except ConnectionResetError as e:
            # aiohttp's reader keeps the connection's loss and raises it at the next read, even
            # of bytes that had arrived (an agent that gave up while a TokenReview ran): the
            # caller is gone, which is no fault of ours (a 500 with a traceback, before).
            raise ProtocolError(
                "the connection was closed before the body was read", reason="ConnectionLost"
            ) from e
        finally:
            self.in_flight -= taken
        return body

    async def _plain(self, request: web.Request, limit: int, taken: int) -> tuple[bytes, int]:
        if taken and taken == request.content_length:
            try:
                return await request.content.readexactly(taken), taken
            except asyncio.IncompleteReadError as e:
                raise _ended(len(e.partial), taken) from e
        parts = bytearray()
        while chunk := await request.content.read(_CHUNK):
            parts += chunk
            if len(parts) > limit:
                raise BodyTooLarge(f"the body is over {limit} bytes, the limit here")
            if len(parts) > taken:
                self._take(len(parts) - taken)
                taken = len(parts)
        return bytes(parts), taken

    async def _inflate(self, request: web.Request, limit: int, taken: int) -> tuple[bytes, int]:
        inflater = zlib.decompressobj(_AUTO_HEADER_WBITS)
        out = bytearray()
        try:
            while chunk := await request.content.read(_CHUNK):
                if inflater.eof:
                    raise ProtocolError("data after the end of the compressed body")
                # One byte more than may remain: reaching it proves the limit is exceeded,
                # and nothing beyond it is ever inflated.
                out += inflater.decompress(chunk, limit - len(out) + 1)
                if len(out) > limit:
                    raise BodyTooLarge(f"the body inflates to over {limit} bytes, the limit here")
                if len(out) > taken:
                    self._take(len(out) - taken)
                    taken = len(out)
        except zlib.error as e:
            raise ProtocolError(f"the body is not valid gzip/deflate: {e}") from e
        if not inflater.eof:
            raise ProtocolError("the compressed body ends before its compressed stream does")
        return bytes(out), taken


def _whole(body: bytes, declared: int) -> bytes:
    if len(body) != declared:
        raise _ended(len(body), declared)
    return body


def _ended(read: int, declared: int) -> ProtocolError:
    return ProtocolError(f"the body ended after {read} of {declared} bytes")


BODIES = web.AppKey("bodies", Bodies)
