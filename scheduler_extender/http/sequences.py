"""Per-VM sequence numbers of permit requests (protocol v2): replays and reorders are refused.

No I/O, no clock: ``SequenceBook.split`` sorts a batch's requests into those to apply and
the refused ones (each with its Permit carrying the error), and ``applied`` records what was
applied. The handler calls both around the ``Extender``'s synchronous ``permits`` with no
await in between, so a check and its record are atomic with respect to other requests.

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

from protocol.permits import ItemError, Permit, ResourceRequest

_SLACK: Final = 1024


class Split(NamedTuple):
    apply: list[ResourceRequest]
    # Index in the batch -> the refusal to answer there.
    refused: dict[int, Permit]


class SequenceBook:
    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._last)

    def last(self, uid: str) -> int | None:
        return self._last.get(uid)

    def split(self, requests: Sequence[ResourceRequest], *, uses_seq: bool) -> Split:
        apply: list[ResourceRequest] = []
        refused: dict[int, Permit] = {}
        seen: dict[str, int] = {}  # within this batch: a later entry must be newer too
        for i, req in enumerate(requests):
            uid = req.pod.uid
            last = max(self._last.get(uid, 0), seen.get(uid, 0)) or None
            error: ItemError | None = None
            if req.seq is None:
                if uses_seq:
                    error = ItemError(
                        status=400,
                        reason="SequenceMissing",
                        message=f"protocol v2 requests carry a seq; {req.pod.key}'s has none",
                    )
                elif last is not None:
                    error = ItemError(
                        status=409,
                        reason="SequenceRequired",
                        message=f"{req.pod.key}'s agent sent seq {last} before; a request"
                        " without one could be a replay",
                    )
            elif last is not None and req.seq <= last:
                error = ItemError(
                    status=409,
                    reason="StaleSequence",
                    message=f"seq {req.seq} for {req.pod.key} is not above {last}, the last"
                    " applied: a replayed or reordered request",
                )
            if error is not None:
                refused[i] = Permit(pod=req.pod, error=error, seq=last)
                continue
            if req.seq is not None:
                seen[uid] = req.seq
            apply.append(req)
        return Split(apply, refused)

    def applied(
        self, permits: Sequence[Permit], requests: Sequence[ResourceRequest]
    ) -> list[Permit]:
        """Record the seqs of the requests that were applied; their Permits, with ``seq``."""
        answered = []
        for permit, req in zip(permits, requests, strict=True):
            if req.seq is not None and permit.error is None:
                self._last[req.pod.uid] = req.seq
                answered.append(msgspec.structs.replace(permit, seq=req.seq))
            else:
                answered.append(permit)
        return answered

    def forget_gone(self, live: Container[str], live_count: int) -> None:
        """Drop the entries of pods no longer live, once the book outgrows them."""
        if len(self._last) > 2 * live_count + _SLACK:
            self._last = {uid: seq for uid, seq in self._last.items() if uid in live}


def merge(applied: list[Permit], refused: dict[int, Permit]) -> list[Permit]:
    """The answers in the batch's order: refusals at their index, the rest in turn."""
    if not refused:
        return applied
    out: list[Permit] = []
    rest = iter(applied)
    for i in range(len(applied) + len(refused)):
        out.append(refused[i] if i in refused else next(rest))
    return out
