"""Who has been waiting for capacity, since when: the trigger of auto-published recommendations.

Pure: no I/O, no clock (every method takes ``now``, monotonic seconds), no randomness. Fed by
the shell with filter and permit outcomes; ``overdue`` says whether a wait has lasted longer
than the threshold, and why, so the shell knows when to compute a recommendation.

Two kinds of wait:

* **pending**: filter found no node with room for one of our pods. It ends when a later filter
  finds room, or when the pod is bound or gone (the shell calls ``retain`` with the pods still
  unbound);
* **denied**: an agent asked for more and was denied or granted less (``partial``) for lack of
  room on its node. It ends with a full grant, a steady or lower request, or when the VM is gone.

A wait's start is its *first* refusal: retries every few seconds do not restart the clock, or a
pod refused forever would never look overdue.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, field

__all__ = ["CapacityWaits", "Overdue", "WaitKind"]


class WaitKind(enum.StrEnum):
    PENDING = "pending"
    DENIED = "denied"


@dataclass(frozen=True, slots=True)
class Overdue:
    """The longest wait past the threshold, and how many waits are past it."""

    kind: WaitKind
    uid: str
    subject: str  # "namespace/name" of the pod (the VM's pod for a denial)
    waited_seconds: float
    count: int

    @property
    def reason(self) -> str:
        what = (
            "filter found no node with room for pod"
            if self.kind is WaitKind.PENDING
            else "the agent was denied capacity for VM pod"
        )
        others = f" ({self.count - 1} more waiting too)" if self.count > 1 else ""
        return f"{what} {self.subject} for {self.waited_seconds:.0f}s{others}"


@dataclass(slots=True)
class _Wait:
    kind: WaitKind
    uid: str
    subject: str
    since: float


@dataclass(slots=True)
class CapacityWaits:
    """Waits by pod uid (one pod waits for one thing at a time)."""

    waits: dict[str, _Wait] = field(default_factory=dict)

    def filter_answered(self, uid: str, subject: str, *, has_room: bool, now: float) -> None:
        if has_room:
            self._end(uid, WaitKind.PENDING)
        else:
            self._start(uid, subject, WaitKind.PENDING, now)

    def permit_answered(self, uid: str, subject: str, *, is_short: bool, now: float) -> None:
        """``is_short``: denied or partial (the node had no room for the rest)."""
        if is_short:
            self._start(uid, subject, WaitKind.DENIED, now)
        else:
            self._end(uid, WaitKind.DENIED)

    def permit_met(self, uid: str) -> None:
        """``permit_answered(is_short=False)`` without the subject (the permit path calls this
        for every VM of every batch; only a wait needs the pod's name)."""
        self._end(uid, WaitKind.DENIED)

    def retain(self, *, pending: Collection[str], running: Collection[str]) -> None:
        """Drop the waits of pods no longer unbound (pending) or no longer running (denied)."""
        for uid in [
            u
            for u, w in self.waits.items()
            if u not in (pending if w.kind is WaitKind.PENDING else running)
        ]:
            del self.waits[uid]

    def overdue(self, *, now: float, threshold_seconds: float) -> Overdue | None:
        late = [w for w in self.waits.values() if now - w.since > threshold_seconds]
        if not late:
            return None
        # The longest wait; names break ties, so the reason is the same on every run.
        first = min(late, key=lambda w: (w.since, w.subject))
        return Overdue(
            kind=first.kind,
            uid=first.uid,
            subject=first.subject,
            waited_seconds=now - first.since,
            count=len(late),
        )

    def _start(self, uid: str, subject: str, kind: WaitKind, now: float) -> None:
        found = self.waits.get(uid)
        if found is None or found.kind is not kind:
            self.waits[uid] = _Wait(kind, uid, subject, now)

    def _end(self, uid: str, kind: WaitKind) -> None:
        found = self.waits.get(uid)
        if found is not None and found.kind is kind:
            del self.waits[uid]
