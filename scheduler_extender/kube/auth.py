"""Who is calling the permit port, and which node may they speak for.

Shell: the TokenReview itself is I/O (through a callable passed in, normally
``KubeClient.review_token``). Two modes, chosen by ``auth.mode``:

* ``TokenReviewAuth``: the agent sends a ServiceAccount token bound to its own pod, issued for
  our audience. The API server's TokenReview says whether it is valid and names the node the
  pod runs on (``status.user.extra["authentication.kubernetes.io/node-name"]``). What the
  reviews said is kept in a ``TokenCache`` (``kube.token_cache``: by the token's SHA-256, for
  ``identity_cache_ttl_seconds``, rejections for ``negative_cache_ttl_seconds`` apart, reviews
  of new tokens within a budget, one review per token at a time). The permit path must
  sustain tens of thousands of VM permits a second, and a TokenReview is a round trip to the
  API server, so reviewing per request is not an option. A valid token is not enough: only
  the agent's ServiceAccount, from a running agent pod on the node it names, gets permits
  (see the class).
* ``StaticTokenAuth``: one shared token that may speak for *any* node. For local runs, the
  standalone mode and tests only.

Times are the event loop's monotonic clock, so the TTLs run in virtual time under looptime.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple, Protocol

import structlog

from kube_io.errors import KubeError, NotFound
from kube_io.objects import TokenReviewResult
from protocol.kube import Pod
from scheduler_extender.config import AuthConfig, AuthMode, ConfigError
from scheduler_extender.errors import (
    NotTheAgent,
    NotTheController,
    Unauthenticated,
    Unavailable,
)
from scheduler_extender.kube.link import KubeLink
from scheduler_extender.kube.token_cache import Refused, TokenCache
from scheduler_extender.kube.token_shape import local_refusal
from scheduler_extender.metrics import Metrics

log = structlog.get_logger(__name__)

ReviewToken = Callable[[str], Awaitable[TokenReviewResult]]


async def reviewed(review: ReviewToken, token: str, metrics: Metrics) -> TokenReviewResult:
    """One TokenReview, counted by its outcome (both ports' authenticators spend theirs here).
    The API server failing to answer is 503 with a retry in a second, never a refusal."""
    try:
        result = await review(token)
    except KubeError as e:
        metrics.token_reviews.labels("error").inc()
        log.warning("token_review_failed", error=str(e), status=e.status)
        raise Unavailable(
            f"cannot verify the token now (TokenReview failed: {e.message})",
            retry_after_seconds=1,
            reason="TokenReviewFailed",
        ) from e
    metrics.token_reviews.labels("authenticated" if result.authenticated else "rejected").inc()
    return result


def by_config(
    auth: AuthConfig,
    link: KubeLink | None,
    reviewing: Callable[[ReviewToken, KubeLink], Authenticator],
) -> Authenticator:
    """The authenticator ``auth`` asks for on one port: the static token (local runs), or
    ``reviewing`` given TokenReviews for the extender's audience through ``link``."""
    if auth.mode is AuthMode.STATIC:
        assert auth.static_token is not None  # Config.__post_init__ checked it
        return StaticTokenAuth(auth.static_token)
    if link is None:
        raise ConfigError(
            "standalone mode has no API server for TokenReviews: set auth.mode static"
        )
    audiences = [auth.audience]
    return reviewing(lambda token: link.review_token(token, audiences=audiences), link)


# (namespace, name) -> the pod as the API server has it; raises kube_io's NotFound.
LookupPod = Callable[[str, str], Awaitable[Pod]]
_POD_REFUSAL_TTL_SECONDS = 2.0


class Identity(NamedTuple):
    username: str
    # The node this caller may speak for; None means any node (static token only).
    node: str | None


class Authenticator(Protocol):
    async def authenticate(self, authorization: str | None) -> Identity:
        """Raise ``Unauthenticated`` (401), ``NotTheAgent`` (403) or ``Unavailable`` (503);
        never return a non-identity."""
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


class TokenUser(NamedTuple):
    """What a TokenReview said about a valid token (see tokenreview-ok.json)."""

    username: str
    node: str | None
    pod_name: str | None
    pod_uid: str | None


class _PodCheck(NamedTuple):
    expires_at: float
    # Why the pod does not qualify; empty when it is a running agent pod on its node.
    error: str


class TokenBucket:
    """A token bucket: ``burst`` at once, refilled at ``rate_per_second`` (TokenReviews here,
    new connections in ``http.connections``).

    Pure: the caller passes the time. ``take(now)`` answers 0.0 when a review may go ahead
    (and counts it), otherwise the seconds until one may.
    """

    def __init__(self, *, rate_per_second: float, burst: int) -> None:
        self._rate = rate_per_second
        self._burst = float(burst)
        self._tokens = float(burst)
        self._at: float | None = None

    def take(self, now: float) -> float:
        if self._at is not None:
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate


class TokenReviewAuth:
    """Pod-bound tokens of the agent's ServiceAccount, from a running agent pod on their node.

    What TokenReviews said is cached (``TokenCache``: verified and rejected tokens kept
    apart, so that garbage never evicts an agent). Tokens the cache does not hold that their
    own claims already rule out (``token_shape``: not a JWT, another audience, expired) are
    refused without a review; the rest are reviewed within a global ``TokenBucket``; above it
    they get 503 with Retry-After and the API server never hears of them. Then authorisation:
    the token's user must be ``agent_username``, bound to a pod (``extra``
    pod-name/pod-uid/node-name), and that pod, looked up through the API server and trusted
    for ``pod_ttl_seconds``, must be the very pod (uid), Running, not being deleted, on the
    token's node, running as the agent's ServiceAccount. Anything else is 403 ``NotTheAgent``
    with the reason.
    """

    def __init__(
        self,
        review: ReviewToken,
        lookup_pod: LookupPod,
        *,
        agent_service_account: str,
        ttl_seconds: float,
        negative_ttl_seconds: float,
        max_entries: int,
        negative_max_entries: int,
        budget: TokenBucket,
        pod_ttl_seconds: float,
        metrics: Metrics,
        audience: str,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._review = review
        self._audience = audience
        self._wall_clock = wall_clock
        self._lookup_pod = lookup_pod
        self._agent_namespace, _, self._agent_name = agent_service_account.partition("/")
        self._agent_username = f"system:serviceaccount:{self._agent_namespace}:{self._agent_name}"
        self._max_entries = max_entries
        self._pod_ttl = pod_ttl_seconds
        self._metrics = metrics
        self._pods: dict[str, _PodCheck] = {}
        self._users = TokenCache(
            self._verify,
            ttl_seconds=ttl_seconds,
            negative_ttl_seconds=negative_ttl_seconds,
            max_entries=max_entries,
            negative_max_entries=negative_max_entries,
            budget=budget,
            refuse_unseen=self._refuse_unseen,
            on_throttled=metrics.token_reviews.labels("throttled").inc,
        )

    async def authenticate(self, authorization: str | None) -> Identity:
        user = await self._users.get(bearer_token(authorization))
        return await self._authorize(user)

    def _refuse_unseen(self, token: str) -> Refused | None:
        refusal = local_refusal(token, audience=self._audience, now=self._wall_clock())
        if refusal is None:
            return None
        self._metrics.token_reviews.labels("refused_locally").inc()
        return Refused(Unauthenticated, f"invalid token: {refusal}")

    async def _authorize(self, user: TokenUser) -> Identity:
        if user.username != self._agent_username:
            raise NotTheAgent(
                f"{user.username or 'this token'} is not the agent's ServiceAccount"
                f" ({self._agent_username}); only the autoscaler agent may ask for permits",
            )
        if user.node is None or user.pod_name is None or user.pod_uid is None:
            raise NotTheAgent(
                f"the token of {user.username} is not bound to a pod on a node;"
                " agents must send a pod-bound ServiceAccount token",
                reason="TokenNotPodBound",
            )
        now = asyncio.get_running_loop().time()
        check = self._pods.get(user.pod_uid)
        if check is None or check.expires_at <= now:
            error = await self._check_pod(user)
            # A refusal is kept briefly: an agent that asked just before the kubelet reported
            # its pod Running must not wait a whole TTL (only agent tokens get this far).
            ttl = min(self._pod_ttl, _POD_REFUSAL_TTL_SECONDS) if error else self._pod_ttl
            check = _PodCheck(asyncio.get_running_loop().time() + ttl, error)
            self._pods[user.pod_uid] = check
            self._forget_expired_pods(now)
        if check.error:
            raise NotTheAgent(check.error, reason="NotAnAgentPod")
        return Identity(username=user.username, node=user.node)

    async def _check_pod(self, user: TokenUser) -> str:
        """Why the token's pod is not a running agent pod on the token's node ("" if it is)."""
        assert user.pod_name is not None
        key = f"{self._agent_namespace}/{user.pod_name}"
        try:
            pod = await self._lookup_pod(self._agent_namespace, user.pod_name)
        except NotFound:
            return f"the token's pod {key} no longer exists"
        except KubeError as e:
            log.warning("agent_pod_lookup_failed", pod=key, error=str(e), status=e.status)
            raise Unavailable(
                f"cannot check the token's pod {key} now: {e.message}",
                retry_after_seconds=1,
                reason="AgentPodLookupFailed",
            ) from e
        error = ""
        if pod.metadata.uid != user.pod_uid:
            error = f"the token's pod {key} was deleted (a new pod has its name)"
        elif pod.metadata.deletion_timestamp is not None:
            error = f"the token's pod {key} is being deleted"
        elif pod.spec.service_account_name != self._agent_name:
            error = f"the token's pod {key} does not run as the agent's ServiceAccount"
        elif pod.spec.node_name != user.node:
            error = f"the token's pod {key} runs on {pod.spec.node_name}, not on {user.node}"
        elif pod.status.phase != "Running":
            error = f"the token's pod {key} is {pod.status.phase or 'in no phase'}, not Running"
        log.info("agent_pod_checked", pod=key, token_node=user.node, error=error or None)
        return error

    def _forget_expired_pods(self, now: float) -> None:
        # Bounded by the agent pods that passed TokenReview (one per node and rollout).
        if len(self._pods) > 2 * self._max_entries:
            for uid in [u for u, c in self._pods.items() if c.expires_at <= now]:
                del self._pods[uid]

    async def _verify(self, token: str) -> TokenUser | Refused:
        result = await reviewed(self._review, token, self._metrics)
        if not result.authenticated:
            error = result.error or "the API server did not authenticate the token"
            log.info("token_rejected", error=error)
            return Refused(Unauthenticated, f"invalid token: {error}")
        user = TokenUser(
            username=result.username or "",
            node=result.node_name,
            pod_name=result.pod_name,
            pod_uid=result.pod_uid,
        )
        log.info("token_authenticated", username=user.username, token_node=user.node)
        return user


class ControllerAuth:
    """``POST /v1/moves``: only the vm-controller's ServiceAccount may reserve or cancel a move.

    A move is a rare call (one or two per migration), so every token is reviewed (a TokenReview
    for the permit port's ``audience``; the controller asks for a token of that audience) and
    nothing is cached: a revoked token stops working at once. Tokens whose own claims rule them
    out are refused without a review, and reviews are spent within ``budget``, so a flood of
    tokens never reaches the API server. The reviewed user must be
    ``system:serviceaccount:<namespace>:<name>`` of ``controller_service_account``; anything
    else is 403 with the user named.
    """

    def __init__(
        self,
        review: ReviewToken,
        *,
        controller_service_account: str,
        audience: str,
        budget: TokenBucket,
        metrics: Metrics,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._review = review
        namespace, _, name = controller_service_account.partition("/")
        self._username = f"system:serviceaccount:{namespace}:{name}"
        self._audience = audience
        self._budget = budget
        self._metrics = metrics
        self._wall_clock = wall_clock

    async def authenticate(self, authorization: str | None) -> Identity:
        token = bearer_token(authorization)
        refusal = local_refusal(token, audience=self._audience, now=self._wall_clock())
        if refusal is not None:
            raise Unauthenticated(f"invalid token: {refusal}")
        wait = self._budget.take(asyncio.get_running_loop().time())
        if wait > 0.0:
            self._metrics.token_reviews.labels("throttled").inc()
            raise Unavailable(
                "too many tokens to review now; retry",
                retry_after_seconds=max(1, int(wait) + 1),
                reason="TokenReviewsThrottled",
            )
        result = await reviewed(self._review, token, self._metrics)
        if not result.authenticated:
            raise Unauthenticated(f"invalid token: {result.error or 'not authenticated'}")
        if result.username != self._username:
            raise NotTheController(
                f"{result.username or 'this token'} is not the vm-controller's ServiceAccount"
                f" ({self._username}); only the vm-controller may reserve moves"
            )
        return Identity(username=self._username, node=None)
