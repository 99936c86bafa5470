"""Penalties: client addresses whose new connections the kernel drops, for a while.

A connection the extender accepts costs its event loop an accept, a transport, an answer and a
close even when it is refused at once. A client with a core to spare opens thousands a second,
and no refusal made after the accept makes that cheaper. So an address that keeps doing what
no well-behaved client does (offences: connections over its rate, heads that time out) is
penalized: for ``penalty_seconds`` a classic BPF socket filter on the listening sockets drops
its packets, so its SYNs never become connections (its connect waits
for the kernel's SYN retries, and the flood with it) and the event loop never hears of them.

* Only new connections: a child socket keeps the filter its listener had when it was made, and
  one from a penalized address is never made, so an address's connections already open (a
  kube-scheduler or an agent that sent one bad request among many good ones) are not affected.
* The filter is rebuilt whenever the set changes (at most ``MAX_PENALIZED`` addresses, the one
  due out soonest making room), and detached when it is empty.
* A kernel that refuses socket filters (a seccomp profile, say) leaves the listener as it was:
  the refusal is logged once and the offender's connections are refused after their accept, as
  before.

Kept by a measurement against the threat model (docs/DEPLOY.md, "Who reaches which
listener"): on the guarded listeners only (permits, metrics; the verbs listener's one client is
kube-scheduler). ``scripts/bench_attacks.py --penalties off`` against the default: without
penalties, scrapes of the metrics port on connections of their own (``metrics_token_churn``,
the main process's loop) and an idle-connection flood of the permit port push the filter p99
past the 2x-idle guarantee; with them, every permit- and metrics-port attack stays under it.

``drop_program`` is pure (the filter's instructions); ``PenaltyBox`` is the shell.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import ipaddress
import socket
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

import structlog

from scheduler_extender.kube.auth import TokenBucket

log = structlog.get_logger(__name__)

# Linux's socket options (asm-generic; Python's socket module does not name them).
SO_ATTACH_FILTER: Final = 26
SO_DETACH_FILTER: Final = 27
# Addresses penalized at once, at most (an IPv6 one costs the filter nine instructions: far
# under the kernel's 4,096).
MAX_PENALIZED: Final = 256
# Client addresses with a bucket (the least recently seen is forgotten).
_MAX_ADDRESSES: Final = 16_384

# Classic BPF: load a word at an absolute offset, jump if equal, return.
_LD_W_ABS: Final = 0x20
_JEQ_K: Final = 0x15
_RET_K: Final = 0x06
# Offsets below this reach the packet's network (IP) header, whatever the socket's protocol.
_SKF_NET_OFF: Final = -0x100000
_SOURCE_OFFSET: Final[dict[int, int]] = {socket.AF_INET: 12, socket.AF_INET6: 8}
_KEEP: Final = 0xFFFFFFFF
_DROP: Final = 0


def _instruction(code: int, jump_true: int, jump_false: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jump_true, jump_false, k & 0xFFFFFFFF)


def drop_program(family: int, addresses: Iterable[str]) -> bytes:
    """The instructions of a filter that drops packets whose source is one of ``addresses``
    (those of ``family``: ``AF_INET`` or ``AF_INET6``) and keeps every other packet; empty
    when none is of that family. Each address is a block that compares the source a 32-bit
    word at a time and falls through to a drop when every word matched."""
    offset = _SOURCE_OFFSET[family]
    version = 4 if family == socket.AF_INET else 6
    words: list[tuple[int, ...]] = []
    for text in addresses:
        address = ipaddress.ip_address(text)
        if address.version == version:
            packed = address.packed
            words.append(struct.unpack(f"!{len(packed) // 4}I", packed))
    if not words:
        return b""
    program: list[bytes] = []
    for block in words:
        for i, word in enumerate(block):
            # Not this word: skip to the next block (past this block's remaining loads and
            # compares, and its drop).
            skip = 2 * (len(block) - 1 - i) + 1
            program.append(_instruction(_LD_W_ABS, 0, 0, _SKF_NET_OFF + offset + 4 * i))
            program.append(_instruction(_JEQ_K, 0, skip, word))
        program.append(_instruction(_RET_K, 0, 0, _DROP))
    program.append(_instruction(_RET_K, 0, 0, _KEEP))
    return b"".join(program)


def attach(sock: socket.socket, program: bytes) -> None:
    """Attach ``program`` to ``sock`` (replacing its filter), or detach it when empty."""
    if not program:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
        except OSError as e:
            if e.errno != errno.ENOENT:  # none attached
                raise
        return
    code = ctypes.create_string_buffer(program, len(program))
    # struct sock_fprog {unsigned short len; struct sock_filter *filter;} (the kernel copies
    # the instructions during the call).
    fprog = struct.pack("@HP", len(program) // 8, ctypes.addressof(code))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


class AddressBuckets:
    """A token bucket per client address (the ``_MAX_ADDRESSES`` most recently seen kept): a
    listener's new connections, and its offences (``PenaltyBox``)."""

    def __init__(self, *, per_second: float, burst: int) -> None:
        self._per_second = per_second
        self._burst = burst
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, address: str, now: float) -> bool:
        """Whether ``address`` had a token left (spending it)."""
        bucket = self._buckets.get(address)
        if bucket is None:
            bucket = self._buckets[address] = TokenBucket(
                rate_per_second=self._per_second, burst=self._burst
            )
            if len(self._buckets) > _MAX_ADDRESSES:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(address)
        return bucket.take(now) <= 0.0


class PenaltyBox:
    """The addresses penalized on one listener's sockets, each until its time is up."""

    def __init__(
        self,
        *,
        listener: Callable[[], str],
        seconds: float,
        offences: AddressBuckets,
        sockets: Callable[[], Iterable[socket.socket]],
    ) -> None:
        self._listener = listener
        self._seconds = seconds
        self._offences = offences
        self._sockets = sockets
        self._until: dict[str, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._unsupported = False
        self.penalized = 0  # penalties given, in all

    def holds(self, address: str) -> bool:
        return address in self._until

    @property
    def addresses(self) -> frozenset[str]:
        return frozenset(self._until)

    def offence(self, address: str) -> None:
        """One offence by ``address``; penalized once its allowance is spent."""
        if self._seconds <= 0 or not address or address in self._until:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._offences.take(address, now):
            return  # within its allowance
        if len(self._until) >= MAX_PENALIZED:
            del self._until[min(self._until, key=self._until.__getitem__)]
        self._until[address] = now + self._seconds
        self.penalized += 1
        log.warning(
            "address_penalized",
            listener=self._listener(),
            address=address,
            seconds=self._seconds,
            total=self.penalized,
        )
        self._apply()
        if self._timer is None:
            self._timer = loop.call_at(now + self._seconds, self._expire)

    def _expire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = [a for a, until in self._until.items() if until <= now]
        for address in due:
            del self._until[address]
        if due:
            self._apply()
        if self._until:
            self._timer = loop.call_at(min(self._until.values()), self._expire)

    def _apply(self) -> None:
        if self._unsupported:
            return
        for sock in self._sockets():
            if sock.fileno() < 0 or sock.family not in _SOURCE_OFFSET:
                continue
            try:
                attach(sock, drop_program(sock.family, self._until))
            except OSError as e:
                self._unsupported = True
                log.warning("penalty_filter_refused", listener=self._listener(), error=str(e))
                return

    def reset(self) -> None:
        """No address penalized, and no filter on the sockets: also one a previous server left
        on a socket it handed on (the permit front's, when a new front takes over)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._until.clear()
        self._apply()

    close = reset
