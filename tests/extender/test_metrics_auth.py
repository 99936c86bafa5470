"""Who reads /metrics on the metrics listener: TokenReview, then SubjectAccessReview, cached.

The reviews are fakes that answer what a real API server answers (the real ones run in
tests/controlplane/test_api.py); here: what is cached, for how long, what a flood costs, and
what each outcome looks like over HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from kube_io.errors import Unavailable as KubeUnavailable
from kube_io.objects import SubjectAccessReviewStatus, TokenReviewResult
from scheduler_extender.config import Config, ConfigError, parse_config
from scheduler_extender.errors import Forbidden, Unauthenticated, Unavailable
from scheduler_extender.http.app import Deps, make_app, make_metrics_app
from scheduler_extender.kube.auth import TokenBucket
from scheduler_extender.kube.metrics_auth import DelegatedMetricsAuth
from scheduler_extender.kube.standalone import StandaloneCluster

USERS = {
    "prometheus-token": "system:serviceaccount:monitoring:prometheus",
    "tenant-token": "system:serviceaccount:vms:default",
}
READERS = {"system:serviceaccount:monitoring:prometheus"}


class FakeApi:
    def __init__(self) -> None:
        self.token_reviews: list[str] = []
        self.access_reviews: list[tuple[str, str, str]] = []
        self.failing = False

    async def review_token(self, token: str) -> TokenReviewResult:
        self.token_reviews.append(token)
        await asyncio.sleep(0)  # a round trip: other requests run meanwhile
        if self.failing:
            raise KubeUnavailable("connection refused")
        user = USERS.get(token)
        if user is None:
            return TokenReviewResult(authenticated=False, error="invalid bearer token")
        return TokenReviewResult(
            authenticated=True, username=user, groups=("system:serviceaccounts",), uid="u"
        )

    async def review_access(
        self, user: str, *, groups: Sequence[str], uid: str | None, path: str, verb: str
    ) -> SubjectAccessReviewStatus:
        self.access_reviews.append((user, path, verb))
        return SubjectAccessReviewStatus(
            allowed=user in READERS, reason=None if user in READERS else ""
        )


def _guard(api: FakeApi, *, burst: int = 100) -> DelegatedMetricsAuth:
    return DelegatedMetricsAuth(
        api.review_token,
        api.review_access,
        ttl_seconds=300.0,
        negative_ttl_seconds=10.0,
        max_entries=3,
        budget=TokenBucket(rate_per_second=1.0, burst=burst),
    )


async def test_an_allowed_scraper_is_reviewed_once_per_ttl() -> None:
    api = FakeApi()
    guard = _guard(api)
    for _ in range(5):
        await guard.check("Bearer prometheus-token")
    assert api.token_reviews == ["prometheus-token"]
    assert api.access_reviews == [
        ("system:serviceaccount:monitoring:prometheus", "/metrics", "get")
    ]


@pytest.mark.looptime
async def test_decisions_expire_after_their_ttls() -> None:
    api = FakeApi()
    guard = _guard(api)
    await guard.check("Bearer prometheus-token")
    with pytest.raises(Forbidden):
        await guard.check("Bearer tenant-token")
    await asyncio.sleep(11)  # the refusal expired, the permission has not
    await guard.check("Bearer prometheus-token")
    with pytest.raises(Forbidden):
        await guard.check("Bearer tenant-token")
    assert api.token_reviews == ["prometheus-token", "tenant-token", "tenant-token"]
    await asyncio.sleep(300)
    await guard.check("Bearer prometheus-token")
    assert api.token_reviews.count("prometheus-token") == 2


async def test_concurrent_checks_with_one_new_token_share_one_review() -> None:
    api = FakeApi()
    guard = _guard(api, burst=1)
    await asyncio.gather(*(guard.check("Bearer prometheus-token") for _ in range(5)))
    assert api.token_reviews == ["prometheus-token"]


async def test_a_cached_refusal_is_raised_anew_each_time() -> None:
    # One exception instance raised again would grow its traceback with every request.
    api = FakeApi()
    guard = _guard(api)
    refusals = []
    for _ in range(3):
        with pytest.raises(Forbidden) as refused:
            await guard.check("Bearer tenant-token")
        refusals.append(refused.value)
    assert len({id(e) for e in refusals}) == 3
    assert api.token_reviews == ["tenant-token"]


async def test_refusals_say_who_and_why() -> None:
    api = FakeApi()
    guard = _guard(api)
    with pytest.raises(Unauthenticated, match="missing Authorization"):
        await guard.check(None)
    with pytest.raises(Unauthenticated, match="invalid bearer token"):
        await guard.check("Bearer garbage")
    with pytest.raises(Forbidden, match="system:serviceaccount:vms:default may not get /metrics"):
        await guard.check("Bearer tenant-token")
    # A token the API server rejected is never sent to the authorizer.
    assert [user for user, _, _ in api.access_reviews] == ["system:serviceaccount:vms:default"]


async def test_a_failed_review_is_503_and_not_remembered() -> None:
    api = FakeApi()
    guard = _guard(api)
    api.failing = True
    with pytest.raises(Unavailable) as failed:
        await guard.check("Bearer prometheus-token")
    assert failed.value.reason == "ReviewFailed"
    api.failing = False
    await guard.check("Bearer prometheus-token")


async def test_a_flood_of_new_tokens_is_throttled_and_never_evicts_the_scraper() -> None:
    api = FakeApi()
    guard = _guard(api, burst=5)
    await guard.check("Bearer prometheus-token")
    throttled = 0
    for n in range(50):
        try:
            await guard.check(f"Bearer garbage-{n}")
        except Unauthenticated:
            pass
        except Unavailable as e:
            assert e.reason == "TokenReviewsThrottled"
            throttled += 1
    # The burst's 5 tokens, less the scraper's: the API server heard of 4 garbage tokens.
    assert len(api.token_reviews) == 5
    assert throttled == 46
    # More garbage than the caches hold went by; the scraper's permission is still cached.
    await guard.check("Bearer prometheus-token")
    assert api.token_reviews.count("prometheus-token") == 1


def _standalone_metrics_config(auth: str) -> Config:
    return parse_config(
        {
            "listen": {
                "verbs": {"port": 10298},
                "permits": {"port": 10299},
                "metrics": {"port": 10300, "auth": auth},
            },
            "auth": {"mode": "static", "static_token": "t"},
        }
    )


def test_each_listener_needs_its_own_address() -> None:
    with pytest.raises(ConfigError, match="permits and metrics must listen on different"):
        parse_config({"listen": {"metrics": {"host": "0.0.0.0", "port": 10299}}})


def test_kubernetes_auth_needs_an_api_server() -> None:
    config = _standalone_metrics_config("kubernetes")
    deps = Deps(registry=CollectorRegistry(), standalone=StandaloneCluster(nodes=[], pods=[]))
    with pytest.raises(ConfigError, match=r"listen\.metrics\.auth none"):
        make_app(config, deps)


async def test_the_open_metrics_listener_serves_metrics_and_probes_only(aiohttp_client) -> None:
    config = _standalone_metrics_config("none")
    verbs = make_app(
        config, Deps(registry=CollectorRegistry(), standalone=StandaloneCluster(nodes=[], pods=[]))
    )
    client = await aiohttp_client(verbs)
    metrics = await aiohttp_client(make_metrics_app(config, verbs))
    assert (await client.get("/readyz")).status == 200
    answer = await metrics.get("/metrics")
    assert answer.status == 200
    assert "vmautoscale_extender_" in await answer.text()
    assert (await metrics.get("/state")).status == 404
    assert (await metrics.post("/filter", data=b"{}")).status in (404, 405)


async def test_the_metrics_listener_serves_the_permit_fronts_families_too(aiohttp_client) -> None:
    """The front (a child process) times the permit calls; Prometheus scrapes this listener,
    so its families must be merged here as on the verbs listener (the dashboard's permit
    latency panel was empty in the node tier without it)."""
    from prometheus_client.metrics_core import HistogramMetricFamily

    from scheduler_extender.http.app import EXTRA_METRICS

    config = _standalone_metrics_config("none")
    verbs = make_app(
        config, Deps(registry=CollectorRegistry(), standalone=StandaloneCluster(nodes=[], pods=[]))
    )
    family = HistogramMetricFamily(
        "vmautoscale_extender_verb_duration_seconds", "x", labels=["verb"]
    )
    family.add_metric(["permits"], buckets=[("0.01", 3), ("+Inf", 3)], sum_value=0.01)

    async def front_families() -> list:
        return [family]

    verbs[EXTRA_METRICS] = front_families
    metrics = await aiohttp_client(make_metrics_app(config, verbs))
    text = await (await metrics.get("/metrics")).text()
    assert 'vmautoscale_extender_verb_duration_seconds_count{verb="permits"} 3.0' in text
