"""Versions of the agent<->extender permit protocol, and their negotiation.

Pure. Callers ask capability methods rather than compare numbers, so that adding a version is
one place to change. Each side advertises the range it speaks; the extender answers in the
newest version both share, or with a 400 that names both ranges.
"""

from __future__ import annotations

import enum
from typing import Final

import msgspec

from protocol.bounds import Int32


class ProtocolVersion(enum.IntEnum):
    # V1: batched ResourceRequest/Permit per node; whole vCPUs and memory in bytes;
    # decrease = already done (informative), equal = steady, increase = request; lastPermit
    # lets a restarted extender rebuild.
    V1 = 1
    # V2: every ResourceRequest carries ``seq``, a number per VM that only grows (issue 16). The
    # extender applies a request only if its seq is above the last one it applied for that VM
    # and answers 409 ``StaleSequence`` (with that last seq in ``Permit.seq``) otherwise, so a
    # replayed or reordered request cannot undo a newer decision. The extender keeps the last
    # seqs in memory only: a restarted extender accepts any seq once per VM, so a live agent
    # is never locked out; an agent learns the floor from ``Permit.seq`` after its own restart.
    # V1 requests are still understood, except for a VM whose agent has sent a seq before
    # (409 ``SequenceRequired``: a seq-less request for it could be a replay).
    V2 = 2

    def has_batches(self) -> bool:
        return self >= ProtocolVersion.V1

    def has_memory(self) -> bool:
        return self >= ProtocolVersion.V1

    def has_sequence_numbers(self) -> bool:
        return self >= ProtocolVersion.V2

    def __str__(self) -> str:
        return f"v{self.value}"


# The newest version this code knows (iterating the enum for it costs more than the rest of a
# negotiation, which every permit batch runs).
_NEWEST: Final = max(ProtocolVersion)


class VersionRange(msgspec.Struct, frozen=True, kw_only=True):
    """An inclusive range of protocol versions, ``{"min": 1, "max": 1}`` on the wire."""

    min: Int32
    max: Int32

    def __post_init__(self) -> None:
        if self.min < 1:
            raise ValueError("protocol.min must be >= 1")
        if self.max < self.min:
            raise ValueError(f"protocol.max ({self.max}) must be >= protocol.min ({self.min})")

    def __str__(self) -> str:
        return f"v{int(self.min)}..v{int(self.max)}"

    def latest_shared(self, other: VersionRange) -> ProtocolVersion | None:
        """The newest version in both ranges that this code knows, or None."""
        top = min(self.max, other.max, _NEWEST)
        bottom = max(self.min, other.min)
        return ProtocolVersion(top) if top >= bottom else None


SUPPORTED = VersionRange(min=ProtocolVersion.V1, max=ProtocolVersion.V2)
