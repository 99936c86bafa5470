"""KubeClient against the fake API server over real HTTP: what it sends, how errors are typed."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from kube_io import (
    Conflict,
    Forbidden,
    Gone,
    KubeClient,
    NotFound,
    NotSupported,
    ObjectReference,
    ServerError,
    TokenReviewResult,
    Unauthorized,
    Unavailable,
)
from protocol.codec import decode
from protocol.kube import Pod
from testkit.kube_api import FakeKubeApi, TokenIdentity, dumps, node_object, pod_object
from testkit.ports import free_port

UID = "4b6c3e39-e55d-4723-b8d1-4af64111331d"


async def test_list_pods_follows_continue_pages(kube_api, client):
    for i in range(7):
        kube_api.add_pod(pod_object(f"vm-{i}", namespace="vms"))
    pods, rv = await client.list_pods(page_size=3)
    assert [p.metadata.name for p in pods] == [f"vm-{i}" for i in range(7)]
    assert rv == str(kube_api.resource_version)
    pages = [r for r in kube_api.requests if r.path == "/api/v1/pods"]
    assert [r.query.get("limit") for r in pages] == ["3", "3", "3"]
    assert "continue" not in pages[0].query
    assert all(r.query.get("continue") for r in pages[1:])


async def test_list_restarts_when_the_continue_token_expired(kube_api, client):
    for i in range(4):
        kube_api.add_pod(pod_object(f"vm-{i}"))
    kube_api.fail_next(410, path="/api/v1/pods", method="GET", times=1)
    # The injected 410 hits the first page (no continue token): nothing to restart, raised.
    with pytest.raises(Gone):
        await client.list_pods(page_size=2)


async def test_list_with_expired_continue_starts_over(kube_api, client):
    for i in range(4):
        kube_api.add_pod(pod_object(f"vm-{i}"))
    original = kube_api._list

    calls = []

    def compact_after_first_page(request, kind, namespace):
        calls.append(request.query.get("continue"))
        response = original(request, kind, namespace)
        if len(calls) == 1:
            kube_api.compact()  # the snapshot behind the continue token is gone
        return response

    kube_api._list = compact_after_first_page
    pods, _ = await client.list_pods(page_size=2)
    assert len(pods) == 4
    assert calls[0] is None
    assert calls[1] is not None
    assert calls[2] is None  # started over


async def test_list_nodes_with_selectors(kube_api, client):
    kube_api.add_node(node_object("node-a", labels={"type": "vm"}))
    kube_api.add_node(node_object("node-b"))
    nodes, _ = await client.list_nodes(label_selector="type=vm")
    assert [n.metadata.name for n in nodes] == ["node-a"]
    pods, _ = await client.list_pods(field_selector="spec.nodeName=node-a")
    assert pods == []
    assert kube_api.requests[-1].query["fieldSelector"] == "spec.nodeName=node-a"


async def test_bind_pod_posts_a_binding_with_the_uid_precondition(kube_api, client):
    kube_api.add_pod(pod_object("vm-1", namespace="vms", uid=UID))
    await client.bind_pod("vms", "vm-1", uid=UID, node="node-a")
    assert kube_api.get_pod("vms", "vm-1")["spec"]["nodeName"] == "node-a"
    request = kube_api.requests[-1]
    assert (request.method, request.path) == ("POST", "/api/v1/namespaces/vms/pods/vm-1/binding")
    assert request.body == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "vm-1", "namespace": "vms", "uid": UID},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
    }


async def test_bind_pod_errors_carry_the_api_message(kube_api, client):
    kube_api.add_pod(pod_object("vm-1", namespace="vms", uid=UID, node_name="node-a"))
    kube_api.add_pod(pod_object("vm-2", namespace="vms"))
    with pytest.raises(Conflict, match='already assigned to node "node-a"') as assigned:
        await client.bind_pod("vms", "vm-1", uid=UID, node="node-b")
    assert (assigned.value.status, assigned.value.reason) == (409, "Conflict")
    with pytest.raises(Conflict, match="Precondition failed: UID in precondition: wrong"):
        await client.bind_pod("vms", "vm-2", uid="wrong", node="node-b")
    with pytest.raises(NotFound, match='pods "nope" not found') as missing:
        await client.bind_pod("vms", "nope", uid=UID, node="node-b")
    assert type(missing.value) is NotFound
    assert not missing.value.is_retryable


async def test_patch_pod_annotations_merges_and_removes(kube_api, client):
    kube_api.add_pod(pod_object("vm-1", namespace="vms", annotations={"old": "1", "keep": "k"}))
    pod = await client.patch_pod_annotations("vms", "vm-1", {"new": "2", "old": None})
    assert pod.metadata.annotations == {"keep": "k", "new": "2"}
    assert pod.metadata.resource_version == str(kube_api.resource_version)
    request = kube_api.requests[-1]
    assert request.content_type == "application/merge-patch+json"
    assert request.body == {"metadata": {"annotations": {"new": "2", "old": None}}}


async def test_resize_pod_cpu_patches_the_resize_subresource(kube_api, client):
    kube_api.add_pod(pod_object("vm-1", namespace="vms", node_name="node-a"))
    pod = await client.resize_pod_cpu("vms", "vm-1", container="vm", cpu="3")
    assert pod.metadata.generation == 2
    assert pod.spec.containers is not None
    resources = pod.spec.containers[0].resources
    assert resources is not None
    assert resources.requests == {"cpu": "3", "memory": "1Gi"}
    assert resources.limits == {"cpu": "3", "memory": "1Gi"}
    request = kube_api.requests[-1]
    assert request.path == "/api/v1/namespaces/vms/pods/vm-1/resize"
    assert request.content_type == "application/strategic-merge-patch+json"
    assert request.body == {
        "spec": {
            "containers": [
                {"name": "vm", "resources": {"requests": {"cpu": "3"}, "limits": {"cpu": "3"}}}
            ]
        }
    }
    pod = await client.resize_pod_cpu("vms", "vm-1", container="vm", cpu="2", memory="2Gi")
    assert pod.spec.containers is not None
    resources = pod.spec.containers[0].resources
    assert resources is not None
    assert resources.limits == {"cpu": "2", "memory": "2Gi"}


async def test_resize_of_a_missing_pod_is_not_found(client):
    with pytest.raises(NotFound) as info:
        await client.resize_pod_cpu("vms", "nope", container="vm", cpu="2")
    assert type(info.value) is NotFound


async def test_resize_without_the_subresource_is_not_supported():
    async with FakeKubeApi(is_resize_supported=False) as api:
        api.add_pod(pod_object("vm-1", namespace="vms"))
        async with KubeClient.for_url(api.url) as client:
            with pytest.raises(NotSupported, match="in-place pod resize is not supported"):
                await client.resize_pod_cpu("vms", "vm-1", container="vm", cpu="2")


async def test_create_event(kube_api, client):
    pod = kube_api.add_pod(pod_object("vm-1", namespace="vms", uid=UID))
    involved = ObjectReference.to_pod(decode(Pod, dumps(pod)))
    await client.create_event(
        involved, reason="Scaled", message="2 -> 3 vCPUs", component="autoscaler-agent", host="n"
    )
    [event] = kube_api.events
    assert kube_api.requests[-1].path == "/api/v1/namespaces/vms/events"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "vm-1",
        "namespace": "vms",
        "uid": pod["metadata"]["uid"],
    }
    assert (event["reason"], event["type"], event["count"]) == ("Scaled", "Normal", 1)
    assert event["source"] == {"component": "autoscaler-agent", "host": "n"}
    assert event["firstTimestamp"] == event["lastTimestamp"]
    assert event["metadata"]["name"].startswith("vm-1.")


async def test_review_token(kube_api, client):
    jwt = kube_api.add_token(
        "jwt",
        TokenIdentity(username="system:serviceaccount:x:agent", node_name="node-a", pod_name="a-1"),
    )
    ok = await client.review_token(jwt, audiences=["vm-autoscaling-extender"])
    assert ok == TokenReviewResult(
        authenticated=True,
        username="system:serviceaccount:x:agent",
        node_name="node-a",
        pod_name="a-1",
        groups=("system:serviceaccounts", "system:authenticated"),
        uid="d288229f-5a36-481d-94fe-28d5d8e963cb",
    )
    wrong = await client.review_token(jwt, audiences=["someone-else"])
    assert not wrong.authenticated
    assert wrong.node_name is None
    assert wrong.error is not None
    assert 'target audiences ["someone-else"]' in wrong.error
    unknown = await client.review_token("forged", audiences=["vm-autoscaling-extender"])
    assert not unknown.authenticated


async def test_bearer_token_is_sent_and_a_wrong_one_is_unauthorized():
    async with FakeKubeApi(token="right") as api:
        async with KubeClient.for_url(api.url, token="right") as client:
            await client.list_nodes()
        assert api.requests[-1].authorization == "Bearer right"
        async with KubeClient.for_url(api.url, token="wrong") as client:
            with pytest.raises(Unauthorized) as info:
                await client.list_nodes()
        assert (info.value.status, info.value.is_retryable) == (401, False)


@pytest.mark.parametrize(
    ("status", "error_type", "is_retryable"),
    [(403, Forbidden, False), (500, ServerError, True), (503, ServerError, True)],
    ids=["403", "500", "503"],
)
async def test_http_errors_are_typed(kube_api, client, status, error_type, is_retryable):
    kube_api.fail_next(status, message="boom")
    with pytest.raises(error_type, match="boom") as info:
        await client.list_pods()
    assert info.value.status == status
    assert info.value.is_retryable is is_retryable


async def test_too_many_requests_carries_retry_after(kube_api, client):
    kube_api.fail_next(429)
    with pytest.raises(ServerError) as info:
        await client.list_nodes()
    assert info.value.retry_after_seconds == 1.0


async def test_connection_refused_is_unavailable():
    async with KubeClient.for_url(f"http://127.0.0.1:{free_port()}") as client:
        with pytest.raises(Unavailable) as info:
            await client.list_pods()
    assert info.value.is_retryable
    assert info.value.status == 0


async def test_connect_reads_a_kubeconfig(tmp_path):
    async with FakeKubeApi(token="from-kubeconfig") as api:
        api.add_node(node_object("node-a"))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            f"""
apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster: {{server: "{api.url}"}}
users:
- name: tester
  user: {{token: from-kubeconfig}}
contexts:
- name: other
  context: {{cluster: fake, user: nobody}}
- name: fake
  context: {{cluster: fake, user: tester}}
current-context: other
"""
        )
        client = await KubeClient.connect(str(kubeconfig), context="fake")
        try:
            nodes, _ = await client.list_nodes()
        finally:
            await client.close()
    assert [n.metadata.name for n in nodes] == ["node-a"]
    assert api.requests[-1].authorization == "Bearer from-kubeconfig"


class CountingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.submitted = 0

    def submit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.submitted += 1
        return super().submit(*args, **kwargs)


async def test_requests_take_no_executor_threads(kube_api, client, monkeypatch):
    # aiohttp's trust_env looked up a proxy and ~/.netrc in a thread for every request: two
    # thread hops per Binding POST on the loop that also answers kube-scheduler's filters.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    executor = CountingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    for i in range(3):
        kube_api.add_pod(pod_object(f"vm-{i}", namespace="vms", uid=f"uid-{i}"))
        await client.bind_pod("vms", f"vm-{i}", uid=f"uid-{i}", node="node-a")
    await client.list_pods()
    assert kube_api.get_pod("vms", "vm-2")["spec"]["nodeName"] == "node-a"
    assert executor.submitted == 0


async def test_a_proxy_named_in_the_environment_is_still_used(kube_api, monkeypatch):
    # The proxy here is a second fake API server: an absolute-form request line reaches its
    # handlers as the same path, so what the client lists shows which server answered.
    kube_api.add_node(node_object("direct"))
    async with FakeKubeApi() as proxy:
        proxy.add_node(node_object("through-the-proxy"))
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        for name in ("NO_PROXY", "no_proxy", "http_proxy"):
            monkeypatch.delenv(name, raising=False)
        async with KubeClient.for_url(kube_api.url) as client:
            nodes, _ = await client.list_nodes()
    assert [n.metadata.name for n in nodes] == ["through-the-proxy"]
