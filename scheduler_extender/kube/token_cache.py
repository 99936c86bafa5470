"""``TokenCache``: what was decided about each bearer token, one type for every listener that
reviews tokens (the permit port's ``kube.auth``, the metrics port's ``kube.metrics_auth``).

Shell: asyncio, and the decision itself is a coroutine passed in (a TokenReview, then whatever
that listener checks of the user). Decisions are kept by the token's SHA-256, never the token
itself: accepted ones for ``ttl_seconds``, refused ones for ``negative_ttl_seconds``, each kind
in a bounded cache of its own (the oldest entry goes first when full), so that a flood of
garbage never evicts a caller that was accepted. An expired accepted entry is kept until then,
and its token is decided again without the budget (it was a good caller's). Any other token
the cache does not hold first meets ``refuse_unseen`` (what it costs nothing to rule out, such
as a token's own claims), then the ``budget``: above it the caller gets 503 with Retry-After
and the API server never hears of the token. Requests with the same token share one decision
(single flight).

Times are the event loop's monotonic clock, so the TTLs run in virtual time under looptime.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Callable, Coroutine
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from scheduler_extender.errors import ExtenderError, Unavailable

_T = TypeVar("_T")


class Budget(Protocol):
    """How many decisions of new tokens may go ahead (``kube.auth.TokenBucket``)."""

    def take(self, now: float) -> float:
        """0.0 when one may go ahead now (and counts it), otherwise the seconds until one may."""
        ...


class Refused(NamedTuple):
    """A token decided against. Every request with it gets a fresh ``kind(message)``: one
    exception instance raised again and again would grow its traceback with every raise."""

    kind: type[ExtenderError]
    message: str
    reason: str | None = None

    def error(self) -> ExtenderError:
        return self.kind(self.message, reason=self.reason)


class _Entry(NamedTuple, Generic[_T]):
    expires_at: float
    decision: _T


class TokenCache(Generic[_T]):
    """Decisions (``_T``, or ``Refused``) about bearer tokens; see the module docstring."""

    def __init__(
        self,
        decide: Callable[[str], Coroutine[Any, Any, _T | Refused]],
        *,
        ttl_seconds: float,
        negative_ttl_seconds: float,
        max_entries: int,
        negative_max_entries: int,
        budget: Budget,
        refuse_unseen: Callable[[str], Refused | None] = lambda token: None,
        on_throttled: Callable[[], None] = lambda: None,
    ) -> None:
        self._decide = decide
        self._ttl = ttl_seconds
        self._negative_ttl = negative_ttl_seconds
        self._max_entries = max_entries
        self._negative_max_entries = negative_max_entries
        self._budget = budget
        self._refuse_unseen = refuse_unseen
        self._on_throttled = on_throttled
        self._accepted: dict[bytes, _Entry[_T]] = {}
        self._refused: dict[bytes, _Entry[Refused]] = {}
        self._in_flight: dict[bytes, asyncio.Task[_T | Refused]] = {}

    async def get(self, token: str) -> _T:
        """The decision about ``token``; raises its refusal's error, or ``Unavailable`` when
        over the budget (or when ``decide`` raised it: a failure is not remembered)."""
        key = hashlib.sha256(token.encode()).digest()
        now = asyncio.get_running_loop().time()
        accepted = self._accepted.get(key)
        if accepted is not None and accepted.expires_at > now:
            return accepted.decision
        refused = self._refused.get(key)
        if refused is not None and refused.expires_at > now:
            raise refused.decision.error()
        if accepted is None:
            refusal = self._refuse_unseen(token)
            if refusal is not None:
                # No decision and no budget spent: it could never be accepted.
                self._store(key, refusal)
                raise refusal.error()
        found = await self._lookup(key, token, was_accepted=accepted is not None, now=now)
        if isinstance(found, Refused):
            raise found.error()
        return found

    async def _lookup(
        self, key: bytes, token: str, *, was_accepted: bool, now: float
    ) -> _T | Refused:
        task = self._in_flight.get(key)
        if task is None:
            if not was_accepted:
                wait = self._budget.take(now)
                if wait > 0.0:
                    self._on_throttled()
                    raise Unavailable(
                        "too many new tokens to review right now; retry",
                        retry_after_seconds=max(1, math.ceil(wait)),
                        reason="TokenReviewsThrottled",
                    )
            # One decision per token however many requests wait for it. It runs as its own
            # task so that a waiter being cancelled (a client hanging up) does not cancel it
            # for the others; ``shield`` below is what keeps it alive.
            task = asyncio.get_running_loop().create_task(self._decide(token))
            self._in_flight[key] = task
            task.add_done_callback(lambda t: self._finished(key, t))
        return await asyncio.shield(task)

    def _finished(self, key: bytes, task: asyncio.Task[_T | Refused]) -> None:
        del self._in_flight[key]
        if task.cancelled():
            return
        if task.exception() is None:  # also marks a failure as retrieved if nobody waits
            self._store(key, task.result())

    def _store(self, key: bytes, decision: _T | Refused) -> None:
        now = asyncio.get_running_loop().time()
        if isinstance(decision, Refused):
            self._accepted.pop(key, None)
            entry = _Entry(now + self._negative_ttl, decision)
            _put_bounded(self._refused, key, entry, self._negative_max_entries)
        else:
            self._refused.pop(key, None)
            _put_bounded(self._accepted, key, _Entry(now + self._ttl, decision), self._max_entries)


def _put_bounded(cache: dict[bytes, _Entry[_T]], key: bytes, entry: _Entry[_T], limit: int) -> None:
    cache.pop(key, None)
    cache[key] = entry
    while len(cache) > limit:
        # Insertion order: the oldest decision goes first.
        del cache[next(iter(cache))]
