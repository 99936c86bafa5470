"""Who may decide: the extender's own Lease, as a state machine with an explicit ``now``.

Pure: no I/O, no awaits, no clock of its own. The shell (``kube/leader.py``) reads and writes
the ``coordination.k8s.io/v1`` Lease and feeds the answers in; ``step(now)`` says what to do
next (read, write which record, or wait how long), and ``is_leading(now)`` is asked before
every decision (a bind, a permit).

Two replicas run; the one that holds the Lease decides, the other keeps its ledger warm and
refuses. The Lease is the extender's own (``vm-scheduler-extender``), not kube-scheduler's:

* kube-scheduler releases its Lease when it stops (client-go ``ReleaseOnCancel``, set by
  ``cmd/kube-scheduler/app/options``): the other kube-scheduler may then take it at once, while
  a follower of that Lease would go on deciding until it next reads it. Only a holder knows
  when its hold ends, so the extender holds a Lease of its own.
* It still *follows* kube-scheduler's Lease, for liveness only: it stands for its own Lease only
  while the kube-scheduler of its pod holds the scheduler's (``candidacy``), and resigns when
  that one leads elsewhere, because kube-scheduler calls only its own pod's extender.

Why two extenders never both decide. client-go's elector (``tools/leaderelection``) takes over
a Lease only after it has seen the *same* record for ``leaseDurationSeconds`` on its own clock
(``observedTime``, not the record's timestamps), so wall-clock offsets do not matter; what it
assumes is that clocks *run* at nearly the same rate. This machine does the same as a
candidate (``expired``), and as the holder it decides only until ``sent + duration /
(1 + drift)**2``, where ``sent`` is when it sent the write that the API server accepted under a
``resourceVersion`` precondition. That write happened after ``sent``; any other candidate saw
it no earlier, and waits ``duration`` of its own clock (at least ``duration / (1 + drift)`` of
real time) before it may write, while this holder's deadline is at most ``duration / (1 +
drift)`` of real time after ``sent``. Every write carries the ``resourceVersion`` it read, so
two candidates racing for an expired Lease cannot both win. Resigning stops deciding *before*
the release is sent.

A pair that cannot decide steps down (``stalled``). The extender stands only while its own
kube-scheduler leads, and the standby stands only while *its* kube-scheduler leads; so an
extender that loses the API server while its kube-scheduler keeps leading would leave nobody
deciding for as long as the cut lasts. It says so instead: a candidate whose hold ran out
(its renewals went unanswered) and was not renewed within a retry period, or a candidate
that has not held the Lease for a whole duration and two retry periods since it began to
stand (longer than any take-over from a live holder: the holder either renews or lets its
record stand still for a duration), is ``stalled``. ``/healthz`` fails on it, and
kube-scheduler's liveness probe is the extender's ``/healthz``, so the kubelet restarts
kube-scheduler; it releases its Lease on the way out, the standby pair's kube-scheduler takes
it, and the standby extender stands and takes the extender's Lease, which the stalled one
could not renew.

What the deadline does not cover, and what covers it (fencing, not timing): a deposed leader's
answers may still be on their way, and its agents apply them after the new leader took over.
The new leader holds every VM it has not heard from in this term at the VM's maximum (the
ledger's *unverified* room, the same as after a restart; ``Ledger.forget_agents``), and an
agent reports a VM only after it has received or abandoned its previous answer, so a late
grant from the old term is always inside room the new term keeps free.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import msgspec

# Rate drift between two nodes' monotonic clocks that the deadline tolerates (client-go's own
# assumption is "nearly the same rate"; NTP-disciplined clocks drift by parts per million).
DEFAULT_DRIFT: Final = 0.01


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What this machine needs of a Lease: its holder ("" when released), for how long a
    holder's record stays valid, how often it changed hands, and its ``resourceVersion``."""

    holder: str
    duration_seconds: float
    transitions: int
    version: str = ""


class Write(NamedTuple):
    """Write ``record`` (create it when ``version`` is "") if the Lease still has ``version``."""

    record: LeaseRecord
    version: str


class Step(NamedTuple):
    """The shell's next move: ``read`` the Lease, send ``write``, or wait ``wait_seconds``."""

    read: bool = False
    write: Write | None = None
    wait_seconds: float = 0.0


class Elector:
    """One replica's view of the Lease.

    Events are named in the past tense and take the local monotonic time. The shell calls
    ``step`` after each event, does what it says, and reports the outcome.
    """

    def __init__(
        self,
        identity: str,
        *,
        duration_seconds: float,
        renew_seconds: float,
        retry_seconds: float,
        drift: float = DEFAULT_DRIFT,
    ) -> None:
        if not 0 < renew_seconds < duration_seconds / (1 + drift) ** 2:
            raise ValueError("renew_seconds must be positive and well inside the Lease duration")
        self.identity = identity
        self.duration_seconds = duration_seconds
        self.renew_seconds = renew_seconds
        self.retry_seconds = retry_seconds
        self.drift = drift
        # Our kube-scheduler holds the scheduler's Lease: we may stand (module docstring).
        self.is_candidate = False
        # When we began to stand without a hold: candidacy began, or an answer ended our hold.
        self.stood_at = 0.0
        # The record last seen (read, or written by us) and when it was first seen: client-go's
        # ``observedRecord`` / ``observedTime``. ``observed_absent``: the last read found none.
        self.observed: LeaseRecord | None = None
        self.observed_at = 0.0
        self.observed_absent = False
        self.read_at: float | None = None
        # Ours: until when we decide, when we last wrote, and the term (transitions) we hold.
        self.leads_until: float | None = None
        self.wrote_at = 0.0
        self.term: int | None = None
        # Resigned while holding: release the Lease (we already stopped deciding).
        self.must_release = False
        # A write or read failed: try again at this time.
        self.retry_at = 0.0

    # -- the one question ------------------------------------------------------------------

    def is_leading(self, now: float) -> bool:
        return self.leads_until is not None and now < self.leads_until

    def may_write(self, now: float, term: int | None) -> bool:
        """May a write of a replica that began writing in ``term`` go out now? Only while it
        leads, and in that same term: a replica deposed and leading again (another held the
        Lease in between) sends nothing it decided before. The one question every write to
        the API server asks right before it is sent (``kube/link.py``); the Lease's own
        writes are the election itself and ask none (the release that follows a loss is one
        of them, and the only write a deposed replica makes)."""
        return term is not None and term == self.term and self.is_leading(now)

    def stalled(self, now: float) -> bool:
        """Our kube-scheduler leads (as last seen) but we cannot decide: the pair must step
        down (module docstring)."""
        if not self.is_candidate or self.is_leading(now):
            return False
        if self.leads_until is not None:
            # Our hold ran out by time, no answer ended it: our renewals went unanswered.
            return now >= self.leads_until + self.retry_seconds
        return now >= self.stood_at + self.duration_seconds + 2 * self.retry_seconds

    # -- events ------------------------------------------------------------------------------

    def candidacy_changed(self, now: float, *, is_candidate: bool) -> None:
        """Our kube-scheduler gained or lost the scheduler's Lease."""
        if is_candidate and not self.is_candidate:
            self.stood_at = now
        self.is_candidate = is_candidate
        if not is_candidate and self.leads_until is not None:
            # Stop deciding now; the release goes out after this.
            self.leads_until = None
            self.must_release = True

    def read(self, now: float, record: LeaseRecord | None) -> None:
        """A GET answered at ``now`` (``None``: no Lease yet)."""
        self.read_at = now
        self.observed_absent = record is None
        if record is None:
            self.observed = None
            self.leads_until = None
            return
        if self.observed is None or record.version != self.observed.version:
            self.observed = record
            self.observed_at = now
        if record.holder != self.identity:
            # Someone else wrote it: whatever we thought, we no longer hold it.
            if self.leads_until is not None:
                self.stood_at = now
            self.leads_until = None
            self.must_release = False

    def wrote(self, sent_at: float, record: LeaseRecord) -> None:
        """Our write, sent at ``sent_at``, was accepted; ``record`` is what the API server
        now holds (its new ``resourceVersion``)."""
        self.observed = record
        self.observed_at = sent_at
        self.observed_absent = False
        self.read_at = sent_at  # as good as a read, and no later than what it says
        self.wrote_at = sent_at
        self.retry_at = 0.0
        if record.holder == self.identity:
            self.leads_until = sent_at + self.duration_seconds / (1 + self.drift) ** 2
            self.term = record.transitions
        else:
            if self.leads_until is not None:
                self.stood_at = sent_at
            self.leads_until = None
            self.must_release = False

    def write_conflicted(self, now: float) -> None:
        """409: the Lease is not what we last read. Someone else wrote it; stop, re-read."""
        if self.leads_until is not None:
            self.stood_at = now
        self.leads_until = None
        self.must_release = False
        self.read_at = None

    def failed(self, now: float) -> None:
        """A read or write got no answer (or a retryable error). A hold stays valid until its
        deadline: that bound never depended on hearing back."""
        self.retry_at = now + self.retry_seconds

    # -- what to do next -----------------------------------------------------------------------

    def step(self, now: float) -> Step:
        if now < self.retry_at:
            return Step(wait_seconds=self._wake(now, self.retry_at))
        if self.must_release and self.observed is not None:
            self.must_release = False
            released = LeaseRecord(
                holder="",
                duration_seconds=1,
                transitions=self.observed.transitions,
            )
            return Step(write=Write(released, self.observed.version))
        if self.is_leading(now):
            assert self.observed is not None
            renew_at = self.wrote_at + self.renew_seconds
            if now >= renew_at:
                return Step(
                    write=Write(self._ours(self.observed.transitions), self.observed.version)
                )
            return Step(wait_seconds=self._wake(now, renew_at))
        if self.read_at is None or now >= self.read_at + self.retry_seconds:
            return Step(read=True)
        if self.is_candidate:
            if self.observed_absent:
                return Step(write=Write(self._ours(0), ""))
            observed = self.observed
            assert observed is not None
            if observed.holder in ("", self.identity) or self.expired(now):
                transitions = observed.transitions + (observed.holder != self.identity)
                return Step(write=Write(self._ours(transitions), observed.version))
        return Step(wait_seconds=self._wake(now, self.read_at + self.retry_seconds))

    def expired(self, now: float) -> bool:
        """The observed record has stood unchanged for its duration on our clock."""
        observed = self.observed
        return observed is not None and now >= self.observed_at + observed.duration_seconds

    def _ours(self, transitions: int) -> LeaseRecord:
        return LeaseRecord(
            holder=self.identity,
            duration_seconds=self.duration_seconds,
            transitions=transitions,
        )

    def _wake(self, now: float, at: float) -> float:
        # Also wake at our own deadline, so the shell notices a hold that lapsed.
        if self.leads_until is not None and self.leads_until > now:
            at = min(at, self.leads_until)
        return max(0.0, at - now)
