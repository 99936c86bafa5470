"""``POST /v1/permits``: the agents' batched ResourceRequests, answered with Permits.

Shell, thin, in two halves. The handler (the permit front's: ``front``) authenticates, spends
the caller's budget and reads the body (within its limits, inflated); then it hands the identity
and the body's bytes, undecoded, to a ``PermitDesk``, the ``Extender``'s side (``LocalDesk``).
The desk decodes the batch, once, asks the ``Extender`` (``core.batches``: the rules) and turns
what the core returns into the status and body: the core's typed refusals get their statuses
here and nowhere else (``ERRORS``). In ``serve`` the two halves run in two processes
(``front``); ``make_permits_app`` joins them in one for tests and tools.

The order of checks is the order of the statuses a caller can get: 401 (who are you), 403 (not the
agent, or not its pod), 429 (this caller's request budget is spent, ``CallerBudgets``), 413/415
(what did you send; the body is read only now); then at the desk: 400 (not a batch), 403 (the
batch is for another node than your token's), 400 (no protocol version in common), 503 (not
synced, or not leading), 400/403 for the batch as a whole, then per VM: 409/400 for a replayed,
reordered or seq-less request, and the ``decide_batch`` refusals. Every refusal of the batch
happens before the ledger is touched, and ``decide_batch`` itself applies all or nothing.
"""

from __future__ import annotations

import asyncio
import math
from typing import Literal, Protocol

import msgspec
import structlog
from aiohttp import web

from protocol import codec
from protocol.moves import MoveRequest
from protocol.permits import ItemError, Permit, PermitBatch, ResourceRequestBatch
from scheduler_extender.core.permits import Decision
from scheduler_extender.core.refusals import Refusal, Refused
from scheduler_extender.errors import (
    ExtenderError,
    ProtocolError,
    StaleRequest,
    TooManyRequests,
    UnknownPod,
    UnsupportedVersion,
    WrongNode,
)
from scheduler_extender.http import ops
from scheduler_extender.http.answers import DeskAnswer, error_answer, response
from scheduler_extender.http.keys import AUTHENTICATOR
from scheduler_extender.http.middleware import decode, read_body
from scheduler_extender.kube.auth import Identity, TokenBucket
from scheduler_extender.service import Extender, PermitsDecided

# The edge: each refusal of the core answered as this error, with its class's status (for the
# whole batch, the HTTP status; for one VM, ``ItemError.status``, the status it would have on
# its own). The one place a permit refusal gets a status.
ERRORS: dict[Refusal, type[ExtenderError]] = {
    Refusal.UNSUPPORTED_VERSION: UnsupportedVersion,  # 400
    Refusal.NODE_MISMATCH: ProtocolError,  # 400
    Refusal.OUT_OF_BOUNDS: ProtocolError,  # 400
    Refusal.SEQUENCE_MISSING: ProtocolError,  # 400
    Refusal.WRONG_NODE: WrongNode,  # 403
    Refusal.UNKNOWN_POD: UnknownPod,  # 404
    Refusal.NOT_A_VM: UnknownPod,  # 404
    Refusal.STALE_REQUEST: StaleRequest,  # 409
    Refusal.NOT_BOUND: StaleRequest,  # 409
    Refusal.SEQUENCE_REQUIRED: StaleRequest,  # 409
    Refusal.STALE_SEQUENCE: StaleRequest,  # 409
}


def refusal_error(refused: Refused) -> ExtenderError:
    return ERRORS[refused.kind](refused.message, reason=refused.kind.value)


def wire_permit(decision: Decision) -> Permit:
    """One VM's answer on the wire: a refused request's with its ``ItemError``."""
    refused = decision.refused
    if refused is None:
        return decision.permit
    error = ItemError(
        status=ERRORS[refused.kind].status, reason=refused.kind.value, message=refused.message
    )
    return msgspec.structs.replace(decision.permit, error=error)


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


class PermitDesk(Protocol):
    """Where an authenticated, budgeted batch (its bytes, undecoded) is decided, and where the
    permit port's probes get their answer: the ``Extender``'s process. ``LocalDesk`` is that
    process's own side; ``front.ChannelDesk`` reaches it from the permit front's process."""

    async def permits(self, identity: Identity, body: bytes) -> DeskAnswer: ...

    async def probe(self, name: Probe) -> DeskAnswer: ...

    async def moves(self, identity: Identity, body: bytes) -> DeskAnswer:
        """``POST /v1/moves`` (``http.moves``): an authenticated caller's body, undecoded."""
        ...


# "warm": ``/readyz?exclude=leader`` (``ops.ready_problem``).
Probe = Literal["healthz", "readyz", "warm"]


class LocalDesk:
    """The ``Extender``'s side: the one decode, the decisions (``Extender.permits``), their
    statuses, the probes' answers. Every method is synchronous (no await between the seq checks
    and their records), so it answers the same whether called in process or from the front's
    channel."""

    def __init__(self, extender: Extender, tasks: list[asyncio.Task[None]]) -> None:
        self.extender = extender
        self.tasks = tasks

    def answer_permits(self, identity: Identity, body: bytes) -> DeskAnswer:
        batch: ResourceRequestBatch | None = None
        try:
            batch = decode(ResourceRequestBatch, body)
            decided = self.extender.permits(batch, token_node=identity.node)
            if isinstance(decided, Refused):
                raise refusal_error(decided)
        except ExtenderError as e:
            if batch is None:
                return error_answer(e)
            return error_answer(e, node=batch.node, vms=len(batch.requests))
        return DeskAnswer(
            status=200,
            body=codec.encode(self._answer(batch, decided)),
            reason=decided.counts,
            node=batch.node,
            vms=len(batch.requests),
        )

    def _answer(self, batch: ResourceRequestBatch, decided: PermitsDecided) -> PermitBatch:
        return PermitBatch(
            protocol=int(decided.version),
            node=batch.node,
            permits=[wire_permit(d) for d in decided.decisions],
            epoch=self.extender.epoch,
        )

    def answer_moves(self, identity: Identity, body: bytes) -> DeskAnswer:
        del identity  # authenticated as the vm-controller: any move is its to ask for
        try:
            try:
                move: MoveRequest = codec.decode(MoveRequest, body)  # type: ignore[arg-type]
            except codec.ProtocolError as e:
                raise ProtocolError(f"MoveRequest: {e}") from e
            answer = self.extender.move(move)
        except ExtenderError as e:
            return error_answer(e)
        return DeskAnswer(status=200, body=codec.encode(answer), reason=f"{answer.op}d")

    def answer_probe(self, name: Probe) -> DeskAnswer:
        problem = (
            ops.health_problem(self.tasks, self.extender)
            if name == "healthz"
            else ops.ready_problem(self.extender, is_leader_checked=name == "readyz")
        )
        if problem is not None:
            return DeskAnswer(status=503, body=problem.encode(), reason=problem.strip())
        return DeskAnswer(status=200, body=b"ok\n")

    async def permits(self, identity: Identity, body: bytes) -> DeskAnswer:
        return self.answer_permits(identity, body)

    async def probe(self, name: Probe) -> DeskAnswer:
        return self.answer_probe(name)

    async def moves(self, identity: Identity, body: bytes) -> DeskAnswer:
        return self.answer_moves(identity, body)


DESK = web.AppKey("desk", PermitDesk)
BUDGETS = web.AppKey("budgets", CallerBudgets)


async def permits(request: web.Request) -> web.Response:
    identity = await request.app[AUTHENTICATOR].authenticate(request.headers.get("Authorization"))
    structlog.contextvars.bind_contextvars(caller=identity.username, token_node=identity.node)
    # A static token (local runs) speaks for every node at once: not one caller to budget.
    if identity.node is not None:
        await _spend_budget(request, identity)
    answer = await request.app[DESK].permits(identity, await read_body(request))
    # One canonical line per batch (the middleware writes it), never one per VM.
    if answer.node is not None:
        structlog.contextvars.bind_contextvars(node=answer.node, vms=answer.vms)
    structlog.contextvars.bind_contextvars(reason=answer.reason)
    return response(answer)


async def healthz(request: web.Request) -> web.Response:
    return response(await request.app[DESK].probe("healthz"), content_type="text/plain")


async def readyz(request: web.Request) -> web.Response:
    name: Probe = "readyz" if ops.is_leader_checked(request) else "warm"
    return response(await request.app[DESK].probe(name), content_type="text/plain")


async def _spend_budget(request: web.Request, identity: Identity) -> None:
    wait = request.app[BUDGETS].take(identity, asyncio.get_running_loop().time())
    if wait > 0.0:
        raise TooManyRequests(
            f"{identity.username} (node {identity.node}) sent more than its share of permit"
            " requests; retry",
            retry_after_seconds=max(1, math.ceil(wait)),
        )
