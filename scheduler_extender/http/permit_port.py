"""``POST /v1/permits``: the agents' batched ResourceRequests, answered with Permits.

Shell, thin. The order of checks is the order of the statuses a caller can get: 401 (who are
you), 403 (not the agent, or not its pod), 429 (this caller's request budget is spent,
``CallerBudgets``), 413/415/400 (what did you send; the body is read
only now), 403 (the batch is for another node than your token's), 400 (no protocol version in
common), 503 (not synced), then per VM: 409/400 for a replayed, reordered or seq-less request
(``sequences``), then the pure ``decide_batch``. Every refusal happens before the ledger is
touched, and ``decide_batch`` itself applies all or nothing.
"""

from __future__ import annotations

import asyncio
import math

import msgspec
import structlog
from aiohttp import web

from protocol.permits import ResourceRequestBatch
from protocol.versions import SUPPORTED
from scheduler_extender.errors import TooManyRequests
from scheduler_extender.http.keys import AUTHENTICATOR, EXTENDER
from scheduler_extender.http.middleware import decode, json_response, read_body
from scheduler_extender.http.sequences import SequenceBook, merge
from scheduler_extender.kube.auth import Identity, TokenBucket


class CallerBudgets:
    """A ``TokenBucket`` per authenticated caller (its username and node): one node's agent,
    however many requests it sends, spends only its own budget. Buckets that have refilled
    are dropped, so the map holds only callers active within the last ``burst / rate`` s."""

    def __init__(self, *, rate_per_second: float, burst: int) -> None:
        self._rate = rate_per_second
        self._burst = burst
        self._buckets: dict[tuple[str, str | None], tuple[TokenBucket, float]] = {}
        self._full_after = burst / rate_per_second
        self._swept_at = 0.0

    def take(self, identity: Identity, now: float) -> float:
        key = (identity.username, identity.node)
        found = self._buckets.get(key)
        bucket = found[0] if found else TokenBucket(rate_per_second=self._rate, burst=self._burst)
        self._buckets[key] = (bucket, now)
        if now - self._swept_at > self._full_after:
            self._swept_at = now
            for k in [k for k, (_, at) in self._buckets.items() if now - at > self._full_after]:
                del self._buckets[k]
        return bucket.take(now)

    def __len__(self) -> int:
        return len(self._buckets)


SEQUENCES = web.AppKey("sequences", SequenceBook)
BUDGETS = web.AppKey("budgets", CallerBudgets)


async def permits(request: web.Request) -> web.Response:
    identity = await request.app[AUTHENTICATOR].authenticate(request.headers.get("Authorization"))
    structlog.contextvars.bind_contextvars(caller=identity.username, token_node=identity.node)
    # A static token (local runs) speaks for every node at once: not one caller to budget.
    if identity.node is not None:
        await _spend_budget(request, identity)
    batch = decode(ResourceRequestBatch, await read_body(request))
    structlog.contextvars.bind_contextvars(node=batch.node, vms=len(batch.requests))
    extender = request.app[EXTENDER]
    book = request.app[SEQUENCES]
    version = SUPPORTED.latest_shared(batch.protocol)
    # No await from here on: the seq checks, the decisions and the seq records are atomic.
    split = book.split(
        batch.requests, uses_seq=version is not None and version.has_sequence_numbers()
    )
    if split.refused:
        batch = msgspec.structs.replace(batch, requests=split.apply)
    answer, statuses = extender.permits(batch, identity)
    if split.refused or any(r.seq is not None for r in split.apply):
        permits = merge(book.applied(answer.permits, split.apply), split.refused)
        answer = msgspec.structs.replace(answer, permits=permits)
        if split.refused:
            statuses = {**statuses, "stale": len(split.refused)}
        book.forget_gone(extender.ledger.pods, len(extender.ledger.pods))
    # One canonical line per batch (the middleware writes it), never one per VM.
    structlog.contextvars.bind_contextvars(reason=statuses)
    return json_response(answer)


async def _spend_budget(request: web.Request, identity: Identity) -> None:
    wait = request.app[BUDGETS].take(identity, asyncio.get_running_loop().time())
    if wait > 0.0:
        raise TooManyRequests(
            f"{identity.username} (node {identity.node}) sent more than its share of permit"
            " requests; retry",
            retry_after_seconds=max(1, math.ceil(wait)),
        )
