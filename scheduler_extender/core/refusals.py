"""Why the core refuses a permit batch, or one VM's request in it: typed, with no HTTP status.

Pure: declarations only. ``Refusal``'s values are the stable CamelCase words agents read in the
answer's ``reason``; the message is for humans. Which HTTP status each refusal gets is the
edge's choice, made once (``http.permit_port.ERRORS``), not the core's.
"""

from __future__ import annotations

import enum
from typing import Final

import msgspec


class Refusal(enum.StrEnum):
    # The whole batch (nothing of it is applied).
    UNSUPPORTED_VERSION = "UnsupportedVersion"  # no protocol version in common
    NODE_MISMATCH = "NodeMismatch"  # a request names another node than its batch
    # The batch, or one VM's request: the caller speaks for another node than the pod's (or,
    # for the batch, than its token's).
    WRONG_NODE = "WrongNode"
    # One VM's request.
    UNKNOWN_POD = "UnknownPod"  # the ledger holds nothing for that uid
    STALE_REQUEST = "StaleRequest"  # the uid now belongs to another pod
    NOT_A_VM = "NotAVm"  # a pod, but not a VM of this scheduler
    NOT_BOUND = "NotBound"  # still being bound
    OUT_OF_BOUNDS = "OutOfBounds"  # requested outside the VM's min..max
    SEQUENCE_MISSING = "SequenceMissing"  # v2 without a seq
    SEQUENCE_REQUIRED = "SequenceRequired"  # no seq, for a VM whose agent sent one before
    STALE_SEQUENCE = "StaleSequence"  # a seq not above the last applied: replayed or reordered


# The refusals of ``sequences``: decided before the ledger is asked anything.
SEQUENCE_REFUSALS: Final = frozenset(
    {Refusal.SEQUENCE_MISSING, Refusal.SEQUENCE_REQUIRED, Refusal.STALE_SEQUENCE}
)


class Refused(msgspec.Struct, frozen=True):
    kind: Refusal
    message: str
