"""Only the agent gets permits, and no flood of tokens reaches the API server (issue 16).

Tokens are what a real TokenReview answers for pod-bound tokens (tests/reference/kube/api/
tokenreview-ok.json, token-claims.json: user.extra names the pod, its uid and its node), and
the pods are looked up in the fake API server like in a real one. The same cases should run on
the real control plane with TokenRequest tokens: a tenant pod's token, another ServiceAccount's,
a deleted agent pod's, and an agent's batch for another node.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from scheduler_extender.kube.auth import TokenBucket
from testkit.kube_api import FakeKubeApi, TokenIdentity, fake_jwt, node_object, pod_object
from tests.extender.conftest import Running, StartExtender, make_config, wait_until
from tests.extender.helpers import (
    agent_pod,
    permit_batch,
    pod_token,
    vm_pod,
)

TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"


def _config(**auth: Any) -> Any:
    return make_config(auth={"mode": "tokenreview", **auth})


def _cluster(kube_api: FakeKubeApi) -> None:
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_node(node_object("node-b", cpu="8"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", max_vcpus=4))
    kube_api.add_token("agent-a", pod_token(kube_api.add_pod(agent_pod("node-a"))))


async def _post(running: Running, token: str, body: Any) -> Any:
    response = await running.permits.post(
        "/v1/permits",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {fake_jwt(token)}"},
    )
    return response.status, await response.json()


def _reviews(kube_api: FakeKubeApi) -> int:
    return sum(1 for r in kube_api.requests if r.path == TOKENREVIEWS)


async def test_a_tenant_pods_token_cannot_shrink_or_grow_anyones_vm(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    tenant = pod_object("attacker", namespace="vms", uid="u-x", node_name="node-a", cpu="10m")
    tenant["spec"]["serviceAccountName"] = "default"
    tenant["status"]["phase"] = "Running"
    kube_api.add_token("tenant", pod_token(kube_api.add_pod(tenant)))
    running = await start_extender(_config())
    # The agent holds vm-1 at 4 vCPUs.
    status, _ = await _post(running, "agent-a", permit_batch("node-a", uid="u-1", requested=4))
    assert status == 200
    held = running.extender.ledger.pods["u-1"]
    shrink = permit_batch("node-a", uid="u-1", current=4, requested=1)
    status, body = await _post(running, "tenant", shrink)
    assert status == 403, body
    assert body["reason"] == "NotTheAgent"
    assert "system:serviceaccount:vms:default is not the agent's ServiceAccount" in body["message"]
    claim = permit_batch("node-a", uid="u-1", current=4, requested=4, last_permit=4)
    assert (await _post(running, "tenant", claim))[0] == 403
    assert running.extender.ledger.pods["u-1"] == held
    assert held.vcpus == 4


async def test_another_service_account_in_the_agents_namespace_is_refused(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    other = kube_api.add_pod(
        agent_pod("node-a", name="debug", uid="p-2", service_account="default")
    )
    kube_api.add_token("other-sa", pod_token(other))
    running = await start_extender(_config())
    status, body = await _post(running, "other-sa", permit_batch("node-a", uid="u-1"))
    assert (status, body["reason"]) == (403, "NotTheAgent")


async def test_the_agent_identity_is_configurable(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    mine = agent_pod("node-a", name="my-agent", uid="p-3", namespace="ops", service_account="a")
    kube_api.add_token("mine", pod_token(kube_api.add_pod(mine)))
    running = await start_extender(_config(agent_service_account="ops/a"))
    assert (await _post(running, "mine", permit_batch("node-a", uid="u-1")))[0] == 200
    status, body = await _post(running, "agent-a", permit_batch("node-a", uid="u-1"))
    assert (status, body["reason"]) == (403, "NotTheAgent")


async def test_a_deleted_agent_pods_token_stops_working_within_the_pod_ttl(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    running = await start_extender(_config(agent_pod_cache_ttl_seconds=0.05))
    steady = permit_batch("node-a", uid="u-1", current=1, requested=1)
    assert (await _post(running, "agent-a", steady))[0] == 200
    kube_api.delete_pod("vm-autoscaling", "autoscaler-agent-node-a")
    answers: list[tuple[int, Any]] = []

    def refused_with(says: str) -> Any:
        async def check() -> bool:
            answers.append(await _post(running, "agent-a", steady))
            status, body = answers[-1]
            return status == 403 and says in body["message"]

        return check

    await wait_until_async(refused_with("no longer exists"))
    assert answers[-1][1]["reason"] == "NotAnAgentPod"
    # Recreated under the same name (a DaemonSet rollout): the old token's pod is still gone.
    kube_api.add_pod(agent_pod("node-a", uid="agent-pod-node-a-2"))
    await wait_until_async(refused_with("was deleted (a new pod has its name)"))


async def wait_until_async(check: Any) -> None:
    """Poll an async condition (wait_until's bound: five seconds)."""
    done = [await check()]

    async def poll() -> None:
        done[0] = await check()

    while not done[0]:
        await wait_until(lambda: True)
        await poll()


async def test_an_agent_pod_that_is_not_running_on_its_node_is_refused(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    pending = kube_api.add_pod(agent_pod("node-b", phase="Pending"))
    kube_api.add_token("pending", pod_token(pending))
    moved = kube_api.add_pod(agent_pod("node-b", name="agent-moved", uid="p-4"))
    # What a token of a pod that the API server now places elsewhere would say.
    kube_api.add_token(
        "moved", TokenIdentity(**{**pod_token(moved).__dict__, "node_name": "node-a"})
    )
    running = await start_extender(_config())
    status, body = await _post(running, "pending", permit_batch("node-b", uid="u-1"))
    assert (status, body["reason"]) == (403, "NotAnAgentPod")
    assert "is Pending, not Running" in body["message"]
    status, body = await _post(running, "moved", permit_batch("node-a", uid="u-1"))
    assert "runs on node-b, not on node-a" in body["message"]


async def test_the_agent_of_another_node_cannot_speak_for_this_one(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    kube_api.add_token("agent-b", pod_token(kube_api.add_pod(agent_pod("node-b"))))
    running = await start_extender(_config())
    before = await running.state()
    status, body = await _post(running, "agent-b", permit_batch("node-a", uid="u-1"))
    assert (status, body["reason"]) == (403, "WrongNode")
    assert await running.state() == before


async def test_new_tokens_are_reviewed_within_a_global_rate(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    running = await start_extender(_config(review_rate_per_second=0.001, review_burst=5))
    body = permit_batch("node-a", uid="u-1", current=1, requested=1)
    assert (await _post(running, "agent-a", body))[0] == 200
    statuses = [(await _post(running, f"garbage-{i}", body))[0] for i in range(40)]
    # Four more reviews in the burst, then 503 with Retry-After; the API server saw five.
    assert statuses == [401] * 4 + [503] * 36
    assert _reviews(kube_api) == 5
    throttled = await running.permits.post(
        "/v1/permits", json=body, headers={"Authorization": f"Bearer {fake_jwt('garbage-99')}"}
    )
    assert throttled.headers["Retry-After"] == "1000"
    assert (await throttled.json())["reason"] == "TokenReviewsThrottled"
    # The agent, already verified, is never throttled.
    assert (await _post(running, "agent-a", body))[0] == 200


async def test_rejected_tokens_never_evict_an_agents_identity(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    running = await start_extender(
        _config(identity_cache_max_entries=2, negative_cache_max_entries=3)
    )
    body = permit_batch("node-a", uid="u-1", current=1, requested=1)
    assert (await _post(running, "agent-a", body))[0] == 200
    for i in range(50):
        assert (await _post(running, f"garbage-{i}", body))[0] == 401
    reviews = _reviews(kube_api)
    assert (await _post(running, "agent-a", body))[0] == 200
    assert _reviews(kube_api) == reviews  # still cached: no new review
    # The negative cache is bounded: the first garbage token was forgotten, the last is not.
    assert (await _post(running, "garbage-0", body))[0] == 401
    assert _reviews(kube_api) == reviews + 1
    assert (await _post(running, "garbage-49", body))[0] == 401
    assert _reviews(kube_api) == reviews + 1


@given(
    rate=st.floats(0.1, 100.0),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=200),
)
def test_the_review_budget_never_grants_more_than_burst_plus_rate_times_time(
    rate: float, burst: int, gaps: list[float]
) -> None:
    budget = TokenBucket(rate_per_second=rate, burst=burst)
    now, granted = 0.0, 0
    for gap in gaps:
        now += gap
        wait = budget.take(now)
        assert wait >= 0.0
        if wait == 0.0:
            granted += 1
        else:
            # Waiting as long as told is enough for the next one.
            assert copy.deepcopy(budget).take(now + wait * 1.001) == 0.0
        assert granted <= burst + rate * now + 1e-6


async def test_tokens_their_own_claims_rule_out_cost_no_review_and_no_budget(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """Not a JWT, a JWT for another audience, an expired one: none could pass a TokenReview,
    so none is sent and none spends the budget that agents need after a restart."""
    _cluster(kube_api)
    running = await start_extender(_config(review_rate_per_second=0.001, review_burst=1))
    body = permit_batch("node-a", uid="u-1", current=1, requested=1)
    hopeless = {
        "garbage": "not a ServiceAccount token (not a JWT)",
        "a.b": "not a ServiceAccount token (not a JWT)",
        "e30.bm90IGpzb24.c2ln": "its claims are not a JSON object",
        fake_jwt("elsewhere", audiences=("kubernetes",)): '["kubernetes"] is invalid for the'
        ' target audiences ["vm-autoscaling-extender"]',
        fake_jwt("old", exp=1_000_000_000): "token has expired",
    }
    for token, says in hopeless.items():
        for _ in range(3):
            response = await running.permits.post(
                "/v1/permits", json=body, headers={"Authorization": f"Bearer {token}"}
            )
            assert response.status == 401
            assert says in (await response.json())["message"]
    assert _reviews(kube_api) == 0
    # The whole budget (one review) is still there for the agent.
    assert (await _post(running, "agent-a", body))[0] == 200
    assert _reviews(kube_api) == 1


async def test_one_agents_flood_spends_only_its_own_budget(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """A compromised node's agent sending valid batches back to back gets 429 beyond its
    burst, before its bodies are read; the ledger is as its last accepted batch left it, and
    another node's agent is answered as usual."""
    _cluster(kube_api)
    kube_api.add_pod(vm_pod("vm-2", uid="u-2", node="node-b", max_vcpus=4))
    kube_api.add_token("agent-b", pod_token(kube_api.add_pod(agent_pod("node-b"))))
    running = await start_extender(
        make_config(
            auth={"mode": "tokenreview"},
            limits={"permit_requests_per_second": 0.001, "permit_requests_burst": 5},
        )
    )
    body = permit_batch("node-a", uid="u-1", current=1, requested=1)
    statuses = [(await _post(running, "agent-a", body))[0] for _ in range(20)]
    assert statuses == [200] * 5 + [429] * 15
    before = await running.state()
    grow = permit_batch("node-a", uid="u-1", current=1, requested=4)
    response = await running.permits.post(
        "/v1/permits", json=grow, headers={"Authorization": f"Bearer {fake_jwt('agent-a')}"}
    )
    assert response.status == 429
    assert response.headers["Retry-After"] == "1000"
    assert (await response.json())["reason"] == "TooManyRequests"
    assert await running.state() == before
    other = permit_batch("node-b", uid="u-2", name="vm-2", current=1, requested=2)
    status, answer = await _post(running, "agent-b", other)
    assert status == 200
    assert answer["permits"][0]["status"] == "granted", answer
