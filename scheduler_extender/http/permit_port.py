"""``POST /v1/permits``: the agents' batched ResourceRequests, answered with Permits.

Shell, thin. The order of checks is the order of the statuses a caller can get: 401 (who are
you), 413/400 (what did you send), 403 (the batch is for another node than your token's),
400 (no protocol version in common), 503 (not synced), then the pure ``decide_batch``. Every
refusal happens before the ledger is touched, and ``decide_batch`` itself applies all or
nothing.
"""

from __future__ import annotations

import structlog
from aiohttp import web

from protocol.permits import ResourceRequestBatch
from scheduler_extender.http.keys import AUTHENTICATOR, EXTENDER
from scheduler_extender.http.middleware import decode, json_response, read_body


async def permits(request: web.Request) -> web.Response:
    identity = await request.app[AUTHENTICATOR].authenticate(request.headers.get("Authorization"))
    structlog.contextvars.bind_contextvars(caller=identity.username, token_node=identity.node)
    batch = decode(ResourceRequestBatch, await read_body(request))
    structlog.contextvars.bind_contextvars(node=batch.node, vms=len(batch.requests))
    answer, statuses = request.app[EXTENDER].permits(batch, identity)
    # One canonical line per batch (the middleware writes it), never one per VM.
    structlog.contextvars.bind_contextvars(reason=statuses)
    return json_response(answer)
