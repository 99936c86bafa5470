"""``POST /v1/moves``: the vm-controller reserves (and cancels) a live migration's room on its
target node (``protocol.moves``; the rules: ``Extender.move`` and the ledger's *Moves*).

Shell, thin, on the verbs listener: the Extender (and its ledger) lives in that process; the
permit port may run in a separate front process whose channel carries only permits. The order
of checks is the order of statuses a caller can get: 401 (no token, or one that does not
verify for the permit port's audience), 403 (not the vm-controller's ServiceAccount), 413/415
(the body), 400 (not a ``MoveRequest``: the field is named), 503 (not synced, not the leader),
then the ledger's refusals: 404 (unknown pod or node), 409 ``MoveRefused`` (``NoRoom`` on the
target node; ``Conflict``: not a bound VM of ours, already moving, the node it is on). Every
refusal leaves the ledger unchanged.
"""

from __future__ import annotations

import structlog
from aiohttp import web

from protocol import codec
from protocol.moves import MoveRequest
from scheduler_extender.config import AuthMode, Config, ConfigError
from scheduler_extender.http.keys import EXTENDER
from scheduler_extender.errors import ProtocolError
from scheduler_extender.http.middleware import read_body
from scheduler_extender.kube.auth import (
    Authenticator,
    ControllerAuth,
    StaticTokenAuth,
    TokenBucket,
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
    auth = config.auth
    if auth.mode is AuthMode.STATIC:
        assert auth.static_token is not None  # Config.__post_init__ checked it
        return StaticTokenAuth(auth.static_token)
    if link is None:
        raise ConfigError(
            "standalone mode has no API server for TokenReviews: set auth.mode static"
        )
    audiences = [auth.audience]
    return ControllerAuth(
        lambda token: link.review_token(token, audiences=audiences),
        controller_service_account=auth.controller_service_account,
        audience=auth.audience,
        budget=TokenBucket(rate_per_second=REVIEW_RATE_PER_SECOND, burst=REVIEW_BURST),
        metrics=metrics,
    )


async def moves(request: web.Request) -> web.Response:
    identity = await request.app[MOVES_AUTHENTICATOR].authenticate(
        request.headers.get("Authorization")
    )
    structlog.contextvars.bind_contextvars(caller=identity.username)
    body = await read_body(request)
    try:
        move: MoveRequest = codec.decode(MoveRequest, body)  # type: ignore[arg-type]
    except codec.ProtocolError as e:
        raise ProtocolError(f"MoveRequest: {e}") from e
    answer = request.app[EXTENDER].move(move)
    structlog.contextvars.bind_contextvars(reason=f"{answer.op}d")
    return web.Response(body=codec.encode(answer), content_type="application/json")


def install(app: web.Application, config: Config, link: KubeLink | None, metrics: Metrics) -> None:
    app[MOVES_AUTHENTICATOR] = controller_authenticator(config, link, metrics)
    app.router.add_post("/v1/moves", moves, name="moves")
