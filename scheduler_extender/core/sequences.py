"""Per-VM sequence numbers of permit requests (protocol v2): replays and reorders are refused.

Pure: no I/O, no clock. ``SequenceBook.split`` sorts a batch's requests into those to apply and
the refused ones (each a ``Decision`` with its typed refusal and the VM's last applied seq), and
``applied`` records what was applied. ``batches.decide`` calls both around ``decide_batch`` with
nothing in between, so a check and its record are atomic with respect to other batches.

Where the last seqs live: here, in memory, by pod uid, and nowhere durable. A restarted
extender therefore accepts any seq once per VM (it must: it cannot tell the agent's live
counter from a replay, and refusing would lock a live agent out), and the agent's next
report after the epoch change settles the VM's size anyway. Entries of pods no longer in the
ledger are dropped as the book grows.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Final, NamedTuple

import msgspec

from protocol.permits import Permit, ResourceRequest
from scheduler_extender.core.permits import Decision
from scheduler_extender.core.refusals import Refusal, Refused

_SLACK: Final = 1024


class Split(NamedTuple):
    apply: list[ResourceRequest]
    # Index in the batch -> the refusal to answer there.
    refused: dict[int, Decision]


class SequenceBook:
    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._last)

    def last(self, uid: str) -> int | None:
        return self._last.get(uid)

    def split(self, requests: Sequence[ResourceRequest], *, uses_seq: bool) -> Split:
        """``uses_seq``: the negotiated version has sequence numbers (every request needs one)."""
        apply: list[ResourceRequest] = []
        refused: dict[int, Decision] = {}
        seen: dict[str, int] = {}  # within this batch: a later entry must be newer too
        for i, req in enumerate(requests):
            uid = req.pod.uid
            last = max(self._last.get(uid, 0), seen.get(uid, 0)) or None
            why: Refused | None = None
            if req.seq is None:
                if uses_seq:
                    why = Refused(
                        Refusal.SEQUENCE_MISSING,
                        f"protocol v2 requests carry a seq; {req.pod.key}'s has none",
                    )
                elif last is not None:
                    why = Refused(
                        Refusal.SEQUENCE_REQUIRED,
                        f"{req.pod.key}'s agent sent seq {last} before; a request"
                        " without one could be a replay",
                    )
            elif last is not None and req.seq <= last:
                why = Refused(
                    Refusal.STALE_SEQUENCE,
                    f"seq {req.seq} for {req.pod.key} is not above {last}, the last"
                    " applied: a replayed or reordered request",
                )
            if why is not None:
                refused[i] = Decision(Permit(pod=req.pod, seq=last), why)
                continue
            if req.seq is not None:
                seen[uid] = req.seq
            apply.append(req)
        return Split(apply, refused)

    def applied(
        self, decisions: Sequence[Decision], requests: Sequence[ResourceRequest]
    ) -> list[Decision]:
        """Record the seqs of the requests that were applied; their Decisions, with ``seq``."""
        answered = []
        for decision, req in zip(decisions, requests, strict=True):
            if req.seq is not None and decision.refused is None:
                self._last[req.pod.uid] = req.seq
                permit = msgspec.structs.replace(decision.permit, seq=req.seq)
                answered.append(decision._replace(permit=permit))
            else:
                answered.append(decision)
        return answered

    def forget_gone(self, live: Container[str], live_count: int) -> None:
        """Drop the entries of pods no longer live, once the book outgrows them."""
        if len(self._last) > 2 * live_count + _SLACK:
            self._last = {uid: seq for uid, seq in self._last.items() if uid in live}


def merge(applied: list[Decision], refused: dict[int, Decision]) -> list[Decision]:
    """The answers in the batch's order: refusals at their index, the rest in turn."""
    if not refused:
        return applied
    out: list[Decision] = []
    rest = iter(applied)
    for i in range(len(applied) + len(refused)):
        out.append(refused[i] if i in refused else next(rest))
    return out
