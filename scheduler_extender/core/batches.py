"""A permit batch, from its caller to its decisions: the rules in the order they apply.

Pure: no I/O, no clock, no HTTP. The shell calls ``admit`` (may this caller send this batch,
and in which protocol version), checks its own readiness (synced, leading), then ``decide``:
the sequence rules (``sequences``), then ``permits.decide_batch`` on what they let through,
then the record of the applied seqs, with nothing in between. Every refusal is returned typed
(``refusals``); a refusal of the whole batch leaves the ledger and the sequence book as they
were.
"""

from __future__ import annotations

from protocol.permits import ResourceRequestBatch
from protocol.versions import SUPPORTED, ProtocolVersion, VersionRange
from scheduler_extender.core.ledger import Ledger
from scheduler_extender.core.permits import Decision, QuotaRoom, decide_batch
from scheduler_extender.core.refusals import Refusal, Refused
from scheduler_extender.core.sequences import SequenceBook, merge


def negotiate(theirs: VersionRange, ours: VersionRange = SUPPORTED) -> ProtocolVersion | Refused:
    """The newest version both sides speak: the one the answer is in, and whose capabilities
    (``has_sequence_numbers``) the rules follow."""
    version = ours.latest_shared(theirs)
    if version is None:
        return Refused(
            Refusal.UNSUPPORTED_VERSION,
            f"no protocol version in common: agent speaks {theirs}, extender speaks {ours}",
        )
    return version


def admit(batch: ResourceRequestBatch, *, token_node: str | None) -> ProtocolVersion | Refused:
    """Who may send it (``token_node``: the node the caller's token speaks for, None for a
    static token, which speaks for every node), then the version: the batch's answer."""
    if token_node is not None and batch.node != token_node:
        return Refused(
            Refusal.WRONG_NODE,
            f"this token speaks for node {token_node}, not for node {batch.node}",
        )
    return negotiate(batch.protocol)


def decide(
    ledger: Ledger,
    book: SequenceBook,
    batch: ResourceRequestBatch,
    version: ProtocolVersion,
    quota_room: QuotaRoom | None = None,
) -> list[Decision] | Refused:
    """Each VM's decision, in the batch's order; or the whole batch refused."""
    split = book.split(batch.requests, uses_seq=version.has_sequence_numbers())
    decided = decide_batch(ledger, batch.node, split.apply, quota_room)
    if isinstance(decided, Refused):
        return decided
    decisions = merge(book.applied(decided, split.apply), split.refused)
    book.forget_gone(ledger.pods, len(ledger.pods))
    return decisions
