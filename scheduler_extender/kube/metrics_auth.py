"""Who may read ``/metrics`` on the metrics listener.

Shell: the reviews are I/O, through callables passed in (normally ``KubeLink.review_token`` and
``KubeLink.review_access``). The same delegated authentication and authorization that
kube-scheduler and kube-controller-manager put in front of their own metrics: the scraper
(Prometheus) sends its ServiceAccount token; a TokenReview for the API server's own audiences
says who it is, and a SubjectAccessReview says whether that user may ``get`` the non-resource
URL ``/metrics``. Grant that with the ClusterRole ``vm-autoscaling-metrics-reader`` from
``manifests/rbac-extender.yaml``.

Decisions are kept in a ``TokenCache``, the permit port's type (``kube.token_cache``: by the
token's SHA-256, allowed ones for ``ttl_seconds``, refusals for ``negative_ttl_seconds`` apart
so that garbage never evicts a scraper), with a ``TokenBucket`` of this listener's own (503
with Retry-After above it), so a flood on this port never reaches the API server and never
spends the agents' review budget. A scraper asks every 15-60 s with one token: one review
pair per token per TTL.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Protocol

import structlog

from kube_io.errors import KubeError
from kube_io.objects import SubjectAccessReviewStatus, TokenReviewResult
from scheduler_extender.errors import Forbidden, Unauthenticated, Unavailable
from scheduler_extender.kube.auth import ReviewToken, TokenBucket, bearer_token
from scheduler_extender.kube.token_cache import Refused, TokenCache

log = structlog.get_logger(__name__)

METRICS_PATH = "/metrics"


class ReviewAccess(Protocol):
    def __call__(
        self, user: str, *, groups: Sequence[str], uid: str | None, path: str, verb: str
    ) -> Awaitable[SubjectAccessReviewStatus]: ...


class MetricsGuard(Protocol):
    async def check(self, authorization: str | None) -> None:
        """Return if the caller may read the metrics; raise the HTTP error otherwise."""
        ...


class OpenMetrics:
    """``listen.metrics.auth: none``: anyone who reaches the port reads the metrics."""

    async def check(self, authorization: str | None) -> None:
        return None


class DelegatedMetricsAuth:
    """TokenReview then SubjectAccessReview, cached; see the module docstring."""

    def __init__(
        self,
        review_token: ReviewToken,
        review_access: ReviewAccess,
        *,
        ttl_seconds: float,
        negative_ttl_seconds: float,
        max_entries: int,
        budget: TokenBucket,
    ) -> None:
        self._review_token = review_token
        self._review_access = review_access
        # The username of each scraper allowed.
        self._users = TokenCache(
            self._decide,
            ttl_seconds=ttl_seconds,
            negative_ttl_seconds=negative_ttl_seconds,
            max_entries=max_entries,
            negative_max_entries=max_entries,
            budget=budget,
        )

    async def check(self, authorization: str | None) -> None:
        await self._users.get(bearer_token(authorization))

    async def _decide(self, token: str) -> str | Refused:
        try:
            who: TokenReviewResult = await self._review_token(token)
            if not who.authenticated or not who.username:
                reason = who.error or "the API server did not authenticate the token"
                log.info("metrics_token_rejected", error=reason)
                return Refused(Unauthenticated, f"invalid token: {reason}")
            access = await self._review_access(
                who.username, groups=who.groups, uid=who.uid, path=METRICS_PATH, verb="get"
            )
        except KubeError as e:
            log.warning("metrics_review_failed", error=str(e), status=e.status)
            raise Unavailable(
                f"cannot check the caller now (review failed: {e.message})",
                retry_after_seconds=1,
                reason="ReviewFailed",
            ) from e
        if not access.allowed:
            why = access.reason or access.evaluation_error or "no RBAC rule allows it"
            log.info("metrics_access_refused", username=who.username, reason=why)
            return Refused(
                Forbidden,
                f"{who.username} may not get {METRICS_PATH} ({why}); bind it to the ClusterRole"
                " vm-autoscaling-metrics-reader",
            )
        log.info("metrics_access_allowed", username=who.username)
        return who.username
