"""``POST /v1/permits``: the agents' batched ResourceRequests, answered with Permits.

Shell, thin, in two halves. The handler (the permit front's: ``front``) authenticates, spends
the caller's budget, reads and decodes the batch; only then does it hand the identity and the
batch to a ``PermitDesk``, the ``Extender``'s side (``LocalDesk``), which does the replay checks
and the decisions and answers the status and body. In ``serve`` the two halves run in two
processes (``front``); ``make_permits_app`` joins them in one for tests and tools.

The order of checks is the order of the statuses a caller can get: 401 (who are you), 403 (not the
agent, or not its pod), 429 (this caller's request budget is spent, ``CallerBudgets``), 413/415/400
(what did you send; the body is read only now); then at the desk: 403 (the batch is for another
node than your token's), 400 (no protocol version in common), 503 (not synced), then per VM:
409/400 for a replayed, reordered or seq-less request (``sequences``), then the pure
``decide_batch``. Every refusal happens before the ledger is touched, and ``decide_batch`` itself
applies all or nothing.
"""

from __future__ import annotations

import asyncio
import math
from typing import Literal, Protocol

import msgspec
import structlog
from aiohttp import web

from protocol import codec
from protocol.permits import PermitBatch, ResourceRequestBatch
from protocol.versions import SUPPORTED
from scheduler_extender.errors import ExtenderError, TooManyRequests
from scheduler_extender.http import ops
from scheduler_extender.http.keys import AUTHENTICATOR
from scheduler_extender.http.middleware import JSON, decode, error_body, read_body
from scheduler_extender.http.sequences import SequenceBook, merge
from scheduler_extender.kube.auth import Identity, TokenBucket
from scheduler_extender.service import Extender


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


class DeskAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """What the desk answers: the HTTP status, body and headers, and what the one ``request``
    log line of the call says as its ``reason`` (the statuses counted, or the error)."""

    status: int
    body: bytes
    headers: dict[str, str] = {}
    reason: dict[str, int] | str | None = None


class PermitDesk(Protocol):
    """Where an authenticated, budgeted, decoded batch is decided, and where the permit port's
    probes get their answer: the ``Extender``'s process. ``LocalDesk`` is that process's own
    side; ``front.ChannelDesk`` reaches it from the permit front's process."""

    async def permits(self, identity: Identity, batch: ResourceRequestBatch) -> DeskAnswer: ...

    async def probe(self, name: Probe) -> DeskAnswer: ...


# "warm": ``/readyz?exclude=leader`` (``ops.ready_problem``).
Probe = Literal["healthz", "readyz", "warm"]


class LocalDesk:
    """The ``Extender``'s side: the replay checks, the decisions, the probes' answers. Every
    method is synchronous (no await between the seq checks and their records), so it answers
    the same whether called in process or from the front's channel."""

    def __init__(self, extender: Extender, tasks: list[asyncio.Task[None]]) -> None:
        self.extender = extender
        self.tasks = tasks
        self.sequences = SequenceBook()

    def answer_permits(self, identity: Identity, batch: ResourceRequestBatch) -> DeskAnswer:
        try:
            answer, statuses = self._decide(identity, batch)
        except ExtenderError as e:
            return DeskAnswer(
                status=e.status, body=error_body(e), headers=e.headers, reason=e.message
            )
        return DeskAnswer(status=200, body=codec.encode(answer), reason=statuses)

    def _decide(
        self, identity: Identity, batch: ResourceRequestBatch
    ) -> tuple[PermitBatch, dict[str, int]]:
        extender = self.extender
        book = self.sequences
        version = SUPPORTED.latest_shared(batch.protocol)
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
        return answer, statuses

    def answer_probe(self, name: Probe) -> DeskAnswer:
        problem = (
            ops.health_problem(self.tasks)
            if name == "healthz"
            else ops.ready_problem(self.extender, is_leader_checked=name == "readyz")
        )
        if problem is not None:
            return DeskAnswer(status=503, body=problem.encode(), reason=problem.strip())
        return DeskAnswer(status=200, body=b"ok\n")

    async def permits(self, identity: Identity, batch: ResourceRequestBatch) -> DeskAnswer:
        return self.answer_permits(identity, batch)

    async def probe(self, name: Probe) -> DeskAnswer:
        return self.answer_probe(name)


DESK = web.AppKey("desk", PermitDesk)
BUDGETS = web.AppKey("budgets", CallerBudgets)


async def permits(request: web.Request) -> web.Response:
    identity = await request.app[AUTHENTICATOR].authenticate(request.headers.get("Authorization"))
    structlog.contextvars.bind_contextvars(caller=identity.username, token_node=identity.node)
    # A static token (local runs) speaks for every node at once: not one caller to budget.
    if identity.node is not None:
        await _spend_budget(request, identity)
    batch = decode(ResourceRequestBatch, await read_body(request))
    structlog.contextvars.bind_contextvars(node=batch.node, vms=len(batch.requests))
    answer = await request.app[DESK].permits(identity, batch)
    # One canonical line per batch (the middleware writes it), never one per VM.
    structlog.contextvars.bind_contextvars(reason=answer.reason)
    return _response(answer, content_type=JSON)


async def healthz(request: web.Request) -> web.Response:
    return _response(await request.app[DESK].probe("healthz"), content_type="text/plain")


async def readyz(request: web.Request) -> web.Response:
    name: Probe = "readyz" if ops.is_leader_checked(request) else "warm"
    return _response(await request.app[DESK].probe(name), content_type="text/plain")


def _response(answer: DeskAnswer, *, content_type: str) -> web.Response:
    response = web.Response(body=answer.body, status=answer.status, content_type=content_type)
    response.headers.update(answer.headers)
    return response


async def _spend_budget(request: web.Request, identity: Identity) -> None:
    wait = request.app[BUDGETS].take(identity, asyncio.get_running_loop().time())
    if wait > 0.0:
        raise TooManyRequests(
            f"{identity.username} (node {identity.node}) sent more than its share of permit"
            " requests; retry",
            retry_after_seconds=max(1, math.ceil(wait)),
        )
