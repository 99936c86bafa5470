"""Who is calling the permit port, and which node may they speak for.

Shell: the TokenReview itself is I/O (through a callable passed in, normally
``KubeClient.review_token``). Two modes, chosen by ``auth.mode``:

* ``TokenReviewAuth``: the agent sends a ServiceAccount token bound to its own pod, issued for
  our audience. The API server's TokenReview says whether it is valid and names the node the
  pod runs on (``status.user.extra["authentication.kubernetes.io/node-name"]``). Verified
  identities are cached by the token's SHA-256 (never the token itself) for
  ``identity_cache_ttl_seconds``; rejections for ``negative_cache_ttl_seconds``. Concurrent
  requests with the same unknown token share one review (single flight). The permit path must
  sustain tens of thousands of VM permits a second, and a TokenReview is a round trip to the
  API server, so reviewing per request is not an option.
* ``StaticTokenAuth``: one shared token that may speak for *any* node. For local runs, the
  standalone mode and tests only.

Times are the event loop's monotonic clock, so the TTLs run in virtual time under looptime.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import NamedTuple, Protocol

import structlog

from kube_io.errors import KubeError
from kube_io.objects import TokenReviewResult
from scheduler_extender.errors import Unauthenticated, Unavailable, WrongNode
from scheduler_extender.metrics import Metrics

log = structlog.get_logger(__name__)

ReviewToken = Callable[[str], Awaitable[TokenReviewResult]]


class Identity(NamedTuple):
    username: str
    # The node this caller may speak for; None means any node (static token only).
    node: str | None


class Authenticator(Protocol):
    async def authenticate(self, authorization: str | None) -> Identity:
        """Raise ``Unauthenticated`` (401) or ``WrongNode`` (403); never return a non-identity."""
        ...


def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise Unauthenticated("missing Authorization: Bearer <token> header")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("the Authorization header is not of the form 'Bearer <token>'")
    return token


class StaticTokenAuth:
    """One shared secret for every node (local runs only; see the module docstring)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def authenticate(self, authorization: str | None) -> Identity:
        token = bearer_token(authorization)
        # Constant time: the comparison must not tell an attacker how much of a guess was right.
        if not hmac.compare_digest(token.encode(), self._token):
            raise Unauthenticated("invalid token")
        return Identity(username="static-token", node=None)


class _Cached(NamedTuple):
    expires_at: float
    identity: Identity | None
    # Why a rejected token was rejected (repeated in every 401 while cached).
    error: str


class TokenReviewAuth:
    def __init__(
        self,
        review: ReviewToken,
        *,
        ttl_seconds: float,
        negative_ttl_seconds: float,
        max_entries: int,
        metrics: Metrics,
    ) -> None:
        self._review = review
        self._ttl = ttl_seconds
        self._negative_ttl = negative_ttl_seconds
        self._max_entries = max_entries
        self._metrics = metrics
        self._cache: dict[bytes, _Cached] = {}
        self._in_flight: dict[bytes, asyncio.Task[_Cached]] = {}

    async def authenticate(self, authorization: str | None) -> Identity:
        token = bearer_token(authorization)
        key = hashlib.sha256(token.encode()).digest()
        loop = asyncio.get_running_loop()
        found = self._cache.get(key)
        if found is None or found.expires_at <= loop.time():
            found = await self._lookup(key, token)
        if found.identity is None:
            raise Unauthenticated(found.error)
        if found.identity.node is None:
            raise WrongNode(
                f"the token of {found.identity.username} is not bound to a pod on a node;"
                " agents must send a pod-bound ServiceAccount token",
                reason="TokenNotNodeBound",
            )
        return found.identity

    async def _lookup(self, key: bytes, token: str) -> _Cached:
        task = self._in_flight.get(key)
        if task is None:
            # One review per token however many requests wait for it. It runs as its own task
            # so that a waiter being cancelled (a client hanging up) does not cancel it for the
            # others; ``shield`` below is what keeps it alive.
            task = asyncio.get_running_loop().create_task(self._verify(token))
            self._in_flight[key] = task
            task.add_done_callback(lambda t: self._finished(key, t))
        return await asyncio.shield(task)

    def _finished(self, key: bytes, task: asyncio.Task[_Cached]) -> None:
        del self._in_flight[key]
        if task.cancelled():
            return
        if task.exception() is None:  # also marks a failure as retrieved if nobody waits
            self._store(key, task.result())

    async def _verify(self, token: str) -> _Cached:
        now = asyncio.get_running_loop().time()
        try:
            result = await self._review(token)
        except KubeError as e:
            self._metrics.token_reviews.labels("error").inc()
            log.warning("token_review_failed", error=str(e), status=e.status)
            raise Unavailable(
                f"cannot verify the token now (TokenReview failed: {e.message})",
                retry_after_seconds=1,
                reason="TokenReviewFailed",
            ) from e
        if not result.authenticated:
            self._metrics.token_reviews.labels("rejected").inc()
            error = result.error or "the API server did not authenticate the token"
            log.info("token_rejected", error=error)
            return _Cached(now + self._negative_ttl, None, f"invalid token: {error}")
        self._metrics.token_reviews.labels("authenticated").inc()
        identity = Identity(username=result.username or "", node=result.node_name)
        log.info("token_authenticated", username=identity.username, token_node=identity.node)
        return _Cached(now + self._ttl, identity, "")

    def _store(self, key: bytes, entry: _Cached) -> None:
        self._cache.pop(key, None)
        self._cache[key] = entry
        while len(self._cache) > self._max_entries:
            # Insertion order: the oldest verification goes first.
            del self._cache[next(iter(self._cache))]
