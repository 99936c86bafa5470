"""``POST /v1/moves``: the vm-controller reserves (and cancels) a live migration's room on its
target node (``protocol.moves``; the rules: ``Extender.move`` and the ledger's *Moves*).

Shell, thin, on the permit port (the one listener other pods reach; the verbs are on
loopback), beside ``/v1/permits`` and built the same way: the handler (in the permit front's
process when it runs apart) authenticates and reads the body, and the desk (``LocalDesk``, the
Extender's process, across the front's channel or in process) decodes it and decides. The
order of checks is the order of statuses a caller can get: 401 (no token, or one that does not
verify for the permit port's audience), 403 (not the vm-controller's ServiceAccount), 413/415
(the body), 400 (not a ``MoveRequest``: the field is named), 503 (not synced, not the leader),
then the ledger's refusals: 404 (unknown pod or node), 409 ``MoveRefused`` (``NoRoom`` on the
target node; ``Conflict``: not a bound VM of ours, already moving, the node it is on). Every
refusal leaves the ledger unchanged.
"""

from __future__ import annotations

import structlog
from aiohttp import web

from scheduler_extender.config import Config
from scheduler_extender.http.answers import response
from scheduler_extender.http.middleware import read_body
from scheduler_extender.http.permit_port import DESK
from scheduler_extender.kube.auth import (
    Authenticator,
    ControllerAuth,
    TokenBucket,
    by_config,
)
from scheduler_extender.kube.link import KubeLink
from scheduler_extender.metrics import Metrics

MOVES_AUTHENTICATOR = web.AppKey("moves_authenticator", Authenticator)

# Moves are rare: a few a second across the cluster is far above any real need.
REVIEW_RATE_PER_SECOND = 5.0
REVIEW_BURST = 20


def controller_authenticator(
    config: Config, link: KubeLink | None, metrics: Metrics
) -> Authenticator:
    """Who may reserve moves: the static token (local runs), or the vm-controller's
    ServiceAccount by TokenReview through ``link``."""
    return by_config(
        config.auth,
        link,
        lambda review, _: ControllerAuth(
            review,
            controller_service_account=config.auth.controller_service_account,
            audience=config.auth.audience,
            budget=TokenBucket(rate_per_second=REVIEW_RATE_PER_SECOND, burst=REVIEW_BURST),
            metrics=metrics,
        ),
    )


async def moves(request: web.Request) -> web.Response:
    identity = await request.app[MOVES_AUTHENTICATOR].authenticate(
        request.headers.get("Authorization")
    )
    structlog.contextvars.bind_contextvars(caller=identity.username)
    answer = await request.app[DESK].moves(identity, await read_body(request))
    structlog.contextvars.bind_contextvars(reason=answer.reason)
    return response(answer)


def install(app: web.Application, auth: Authenticator) -> None:
    app[MOVES_AUTHENTICATOR] = auth
    app.router.add_post("/v1/moves", moves, name="moves")
