"""The quota section's schema and errors, and the /v1/queue view and gauges."""

import pytest

from scheduler_extender.admission.queue import admit
from scheduler_extender.admission.quota import (
    NamespaceQuota,
    QueueingStrategy,
    QuotaConfig,
    QuotaConfigError,
    load_quota_config,
)
from scheduler_extender.admission.view import NamespaceNumbers, queue_numbers, queue_view

from .helpers import GI, T0, cluster, place, quotas, vm

GOOD = b"""
admission_ttl_seconds: 90
namespaces:
  team-a:
    vcpus: 16
    memory_bytes: 68719476736
    queueing_strategy: StrictFIFO
    cohort: research
    borrowing_limit: {vcpus: 8, memory_bytes: 0}
  team-b:
    vcpus: 8
    memory_bytes: 34359738368
    cohort: research
"""


def test_a_full_section_loads():
    config = load_quota_config(GOOD)
    assert config.admission_ttl_seconds == 90
    a = config.namespaces["team-a"]
    assert (a.vcpus, a.queueing_strategy, a.cohort) == (
        16,
        QueueingStrategy.STRICT_FIFO,
        "research",
    )
    assert config.namespaces["team-b"].queueing_strategy is QueueingStrategy.BEST_EFFORT_FIFO
    assert config.cohort_members() == {"research": ("team-a", "team-b")}


@pytest.mark.parametrize("raw", [b"", b"{}", b"namespaces: {}"], ids=["empty", "object", "none"])
def test_an_empty_section_means_no_quotas(raw):
    assert load_quota_config(raw) == QuotaConfig()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            b"namespaces: {team-a: {vcpus: 1, memory_bytes: 1, cohrt: x}}",
            "Object contains unknown field `cohrt` - at `$.namespaces.team-a`",
        ),
        (
            b"namespaces: {team-a: {vcpus: -1, memory_bytes: 1}}",
            "Expected `int` >= 0 - at `$.namespaces.team-a.vcpus`",
        ),
        (
            b"namespaces: {team-a: {vcpus: 1}}",
            "Object missing required field `memory_bytes` - at `$.namespaces.team-a`",
        ),
        (
            b"namespaces: {team-a: {vcpus: 1, memory_bytes: 1, queueing_strategy: LIFO}}",
            "Invalid enum value 'LIFO' - at `$.namespaces.team-a.queueing_strategy`",
        ),
        (
            b"namespaces: {team-a: {vcpus: 1, memory_bytes: 1,"
            b" borrowing_limit: {vcpus: 1, memory_bytes: 0}}}",
            "borrowing_limit needs a cohort to borrow from - at `$.namespaces.team-a`",
        ),
        (
            b"namespaces: {Team_A: {vcpus: 1, memory_bytes: 1}}",
            "Expected `str` matching regex",
        ),
        (b"admission_ttl_seconds: 0", "Expected `float` > 0.0 - at `$.admission_ttl_seconds`"),
        (b"quotas: {}", "Object contains unknown field `quotas` - at `$`"),
        (b"[1, 2]", "Expected `object`, got `list` - at `$`"),
        (b"namespaces: [", "not valid YAML"),
    ],
    ids=[
        "typo",
        "negative",
        "missing",
        "strategy",
        "borrow-without-cohort",
        "bad-namespace-name",
        "ttl",
        "unknown-top",
        "not-object",
        "not-yaml",
    ],
)
def test_errors_name_their_path(raw, message):
    with pytest.raises(QuotaConfigError) as caught:
        load_quota_config(raw)
    assert message in str(caught.value)


def test_quota_struct_is_frozen_and_converts_vcpus_to_millicores():
    quota = NamespaceQuota(vcpus=3, memory_bytes=GI)
    assert quota.nominal.cpu_millis == 3000


def test_queue_view_shows_quota_usage_borrowing_and_both_queues_in_order():
    config = quotas(
        team_a={"vcpus": 2, "cohort": "c", "memory_bytes": 8 * GI},
        team_b={"vcpus": 2, "cohort": "c", "memory_bytes": 8 * GI},
    )
    ledger, state = cluster(config)
    running = vm("running", vcpus=3)  # borrows 1 vCPU from team-b
    admit(state, running, now=T0)
    place(ledger, running)
    admitted = vm("admitted", ns="team-b", vcpus=1)
    admit(state, admitted, now=T0)
    waiting = vm("waiting", vcpus=1)
    admit(state, waiting, now=T0)

    view = queue_view(state, now=T0 + 30)

    assert view["quotasLoaded"] is True
    assert view["admissionTtlSeconds"] == 120.0
    a = view["namespaces"]["team-a"]
    assert a["quota"] == {"cpuMillis": 2000, "memoryBytes": 8 * GI}
    assert a["usage"] == {"cpuMillis": 3000, "memoryBytes": GI}
    assert a["borrowed"] == {"cpuMillis": 1000, "memoryBytes": 0}
    assert (a["cohort"], a["queueingStrategy"], a["borrowingLimit"]) == (
        "c",
        "BestEffortFIFO",
        None,
    )
    assert a["admitted"] == []
    assert a["waiting"] == [
        {
            "pod": "team-a/waiting",
            "uid": "uid-team-a-waiting",
            "state": "waiting",
            "position": 1,
            "priority": 0,
            "demand": {"cpuMillis": 1000, "memoryBytes": GI},
            "reason": "waiting for quota in namespace team-a (position 1): needs 1000m cpu,"
            " 0m left in cohort c",
        }
    ]
    b = view["namespaces"]["team-b"]
    assert b["reserved"] == {"cpuMillis": 1000, "memoryBytes": GI}
    [item] = b["admitted"]
    assert (item["pod"], item["state"], item["expiresInSeconds"]) == (
        "team-b/admitted",
        "admitted",
        90.0,
    )
    assert queue_numbers(state) == [
        NamespaceNumbers(
            namespace="team-a",
            quota_cpu_millis=2000,
            quota_memory_bytes=8 * GI,
            usage_cpu_millis=3000,
            usage_memory_bytes=GI,
            borrowed_cpu_millis=1000,
            borrowed_memory_bytes=0,
            admitted_pods=0,
            waiting_pods=1,
        ),
        NamespaceNumbers(
            namespace="team-b",
            quota_cpu_millis=2000,
            quota_memory_bytes=8 * GI,
            usage_cpu_millis=1000,
            usage_memory_bytes=GI,
            borrowed_cpu_millis=0,
            borrowed_memory_bytes=0,
            admitted_pods=1,
            waiting_pods=0,
        ),
    ]


def test_view_before_the_quota_loads_and_for_unlimited_namespaces():
    _ledger, state = cluster(None)
    state.observe_pending(vm("early", ns="free"))
    view = queue_view(state)
    assert view["quotasLoaded"] is False
    free = view["namespaces"]["free"]
    assert free["quota"] is None
    assert free["waiting"][0]["reason"] == (
        "waiting for the quota configuration to load, in namespace free (position 1)"
    )
    [numbers] = queue_numbers(state)
    assert (numbers.quota_cpu_millis, numbers.waiting_pods) == (None, 1)
