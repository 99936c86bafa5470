"""The fake API server answers like the recorded kube-apiserver: keys, order, statuses, framing.

Other tests trust the fake; these tests are why they may.
"""

from __future__ import annotations

import json

import aiohttp
import pytest

from kube_io.objects import TokenReview, TokenReviewResult
from protocol.codec import decode
from testkit.kube_api import FakeKubeApi, TokenIdentity, dumps, node_object, pod_object
from tests.kube_io.conftest import sample_answer, sample_bytes

SAMPLE_POD = json.loads(sample_bytes("list-pods.json"))["items"][0]
VM2_UID = "7e850eb4-52eb-4703-8cbd-afd21872d6a8"


@pytest.fixture
async def http(kube_api):
    async with aiohttp.ClientSession(kube_api.url) as session:
        yield session


def without_resource_version(obj):
    obj = json.loads(json.dumps(obj))
    obj["metadata"].pop("resourceVersion", None)
    return obj


async def test_pod_list_matches_sample(kube_api, http):
    kube_api.add_pod(SAMPLE_POD)
    async with http.get("/api/v1/pods", params={"limit": "500"}) as response:
        assert response.status == 200
        body = await response.json()
    sample = json.loads(sample_bytes("list-pods.json"))
    assert list(body) == list(sample) == ["kind", "apiVersion", "metadata", "items"]
    assert list(body["metadata"]) == list(sample["metadata"])
    assert body["metadata"]["resourceVersion"] == str(kube_api.resource_version)
    [item] = body["items"]
    assert list(item) == list(sample["items"][0])
    assert without_resource_version(item) == without_resource_version(sample["items"][0])


async def test_node_list_items_match_sample(kube_api, http):
    sample = json.loads(sample_bytes("node.json"))
    kube_api.add_node(sample)
    async with http.get("/api/v1/nodes") as response:
        body = await response.json()
    assert body["kind"] == "NodeList"
    [item] = body["items"]
    sample.pop("kind")
    sample.pop("apiVersion")
    assert without_resource_version(item) == without_resource_version(sample)


async def test_watch_events_are_json_lines_like_the_sample(kube_api, http):
    rv = kube_api.resource_version
    kube_api.add_pod(SAMPLE_POD)
    kube_api.delete_pod("vms", "vm-1")
    params = {"watch": "1", "resourceVersion": str(rv), "allowWatchBookmarks": "true"}
    async with http.get("/api/v1/pods", params=params) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/json"
        await kube_api.wait_for_watches()
        kube_api.send_bookmarks()
        kube_api.close_watches()
        lines = (await response.read()).splitlines()
    sample_lines = sample_bytes("watch-pods.jsonl").splitlines()
    added, deleted, bookmark = (json.loads(line) for line in lines)
    assert [added["type"], deleted["type"], bookmark["type"]] == ["ADDED", "DELETED", "BOOKMARK"]
    sample_added = json.loads(sample_lines[1])
    assert list(added) == list(sample_added) == ["type", "object"]
    assert list(added["object"])[:3] == list(sample_added["object"])[:3]
    # The bookmark is byte for byte the recorded one, at the fake's resourceVersion.
    expected = sample_lines[-1].replace(b'"243"', f'"{kube_api.resource_version}"'.encode())
    assert lines[-1] == expected


async def test_compacted_watch_is_a_200_stream_with_the_sample_error_line(kube_api, http):
    kube_api.add_pod(SAMPLE_POD)
    kube_api.compact()
    params = {"watch": "1", "resourceVersion": "1", "allowWatchBookmarks": "true"}
    async with http.get("/api/v1/pods", params=params) as response:
        body = await response.read()
    status, sample = sample_answer("watch-410.txt")
    assert response.status == status == 200
    assert body == sample + b"\n"


async def test_compacted_watch_as_http_410():
    async with FakeKubeApi(is_expired_http_410=True) as api, aiohttp.ClientSession(api.url) as http:
        api.compact(50)
        async with http.get("/api/v1/nodes", params={"watch": "1", "resourceVersion": "1"}) as r:
            body = await r.json()
    assert r.status == 410
    assert (body["reason"], body["code"]) == ("Expired", 410)


async def bind(http, namespace, name, *, uid, node):
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/binding"
    async with http.post(path, json=binding) as response:
        return response.status, await response.read()


@pytest.mark.parametrize(
    "sample",
    [
        "binding-201.txt",
        "binding-404-no-pod.txt",
        "binding-409-already-assigned.txt",
        "binding-409-uid-precondition.txt",
    ],
)
async def test_binding_answers_match_samples(kube_api, http, sample):
    kube_api.add_pod(SAMPLE_POD)
    kube_api.add_pod(pod_object("vm-2", namespace="vms", uid=VM2_UID))
    vm1_uid = SAMPLE_POD["metadata"]["uid"]
    if sample == "binding-201.txt":
        answer = await bind(http, "vms", "vm-1", uid=vm1_uid, node="node-a")
        assert kube_api.get_pod("vms", "vm-1")["spec"]["nodeName"] == "node-a"
    elif sample == "binding-404-no-pod.txt":
        answer = await bind(http, "vms", "nope", uid="x", node="node-a")
    elif sample == "binding-409-already-assigned.txt":
        await bind(http, "vms", "vm-1", uid=vm1_uid, node="node-a")
        answer = await bind(http, "vms", "vm-1", uid=vm1_uid, node="node-b")
    else:
        answer = await bind(
            http, "vms", "vm-2", uid="00000000-0000-0000-0000-000000000000", node="n"
        )
    status, body = sample_answer(sample)
    assert answer[0] == status
    assert json.loads(answer[1]) == json.loads(body)
    assert list(json.loads(answer[1])) == list(json.loads(body))


async def test_resize_answers_like_the_sample(kube_api, http):
    kube_api.add_pod(SAMPLE_POD)
    await bind(http, "vms", "vm-1", uid=SAMPLE_POD["metadata"]["uid"], node="node-a")
    patch = {
        "spec": {
            "containers": [
                {"name": "vm", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}}
            ]
        }
    }
    headers = {"Content-Type": "application/strategic-merge-patch+json"}
    async with http.patch(
        "/api/v1/namespaces/vms/pods/vm-1/resize", data=dumps(patch), headers=headers
    ) as response:
        body = await response.json()
    status, sample_body = sample_answer("resize-patch.txt")
    sample = json.loads(sample_body)
    assert response.status == status
    assert list(body) == list(sample)
    assert body["metadata"]["generation"] == sample["metadata"]["generation"] == 2
    assert body["spec"]["containers"] == sample["spec"]["containers"]
    assert body["spec"]["nodeName"] == "node-a"


# What the real kube-apiserver v1.36 answers to a memory request raised alone on a Guaranteed
# pod (tests/controlplane/test_api.py asserts the same words against it).
QOS_REFUSAL = (
    'Pod "vm-1" is invalid: [spec.containers[0].resources.requests: Invalid value: "2Gi": must'
    ' be less than or equal to memory limit of 1Gi, spec: Invalid value: "Guaranteed": Pod QOS'
    " Class may not change as a result of resizing]"
)


async def test_resize_moves_memory_both_ways_and_refuses_a_qos_change(kube_api, http):
    kube_api.add_pod(SAMPLE_POD)
    headers = {"Content-Type": "application/strategic-merge-patch+json"}
    path = "/api/v1/namespaces/vms/pods/vm-1/resize"

    async def resize(resources):
        patch = {"spec": {"containers": [{"name": "vm", "resources": resources}]}}
        async with http.patch(path, data=dumps(patch), headers=headers) as response:
            return response.status, await response.json()

    status, body = await resize({"requests": {"memory": "2Gi"}})
    assert (status, body["reason"], body["message"]) == (422, "Invalid", QOS_REFUSAL)
    for memory in ("3Gi", "512Mi"):  # up, and down below the pod's first size
        status, body = await resize({"requests": {"memory": memory}, "limits": {"memory": memory}})
        assert status == 200, body
        resources = body["spec"]["containers"][0]["resources"]
        assert resources["requests"]["memory"] == resources["limits"]["memory"] == memory


async def test_annotation_merge_patch_answers_like_the_sample(kube_api, http):
    kube_api.add_pod(SAMPLE_POD)
    before = kube_api.resource_version
    headers = {"Content-Type": "application/merge-patch+json"}
    patch = {"metadata": {"annotations": {"example.dev/approved-vcpus": "2"}}}
    async with http.patch(
        "/api/v1/namespaces/vms/pods/vm-1", data=dumps(patch), headers=headers
    ) as response:
        body = await response.json()
    sample = json.loads(sample_bytes("patch-annotation.json"))
    assert response.status == 200
    assert list(body) == list(sample)
    assert list(body["metadata"]["annotations"].items()) == list(
        sample["metadata"]["annotations"].items()
    )
    assert int(body["metadata"]["resourceVersion"]) == before + 1


async def test_missing_routes_answer_the_generic_404(http):
    async with http.get("/apis/nope/v1/things") as response:
        body = await response.json()
    assert response.status == 404
    assert body["details"] == {}
    assert body["message"] == "the server could not find the requested resource"


async def review(http, token, audiences):
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token, "audiences": audiences},
    }
    async with http.post("/apis/authentication.k8s.io/v1/tokenreviews", json=body) as response:
        assert response.status == 201
        return await response.read()


AGENT = TokenIdentity(
    username="system:serviceaccount:vm-autoscaling:autoscaler-agent",
    groups=(
        "system:serviceaccounts",
        "system:serviceaccounts:vm-autoscaling",
        "system:authenticated",
    ),
    node_name="node-a",
    node_uid="f8c3301c-2ea4-4b22-8958-7767895ecaa9",
    pod_name="autoscaler-agent-x7k2p",
    pod_uid="8aa5b392-448e-407f-a6c9-d69efc980634",
)


async def test_token_review_matches_samples(kube_api, http):
    jwt = kube_api.add_token("jwt", AGENT)
    ok = await review(http, jwt, ["vm-autoscaling-extender"])
    sample_ok = json.loads(sample_bytes("tokenreview-ok.json"))
    assert list(json.loads(ok)) == list(sample_ok)
    got = json.loads(ok)["status"]
    assert list(got) == list(sample_ok["status"])
    assert list(got["user"]["extra"]) == list(sample_ok["status"]["user"]["extra"])
    decoded = TokenReviewResult.from_review(decode(TokenReview, ok))
    expected = TokenReviewResult.from_review(decode(TokenReview, json.dumps(sample_ok)))
    assert decoded == expected

    wrong = json.loads(await review(http, jwt, ["someone-else"]))
    sample_wrong = json.loads(sample_bytes("tokenreview-wrong-audience.json"))
    assert wrong["status"] == sample_wrong["status"]


async def test_bearer_token_is_checked():
    async with FakeKubeApi(token="secret") as api, aiohttp.ClientSession(api.url) as http:
        async with http.get("/api/v1/nodes") as response:
            body = await response.json()
        assert response.status == 401
        assert body["reason"] == "Unauthorized"
        headers = {"Authorization": "Bearer secret"}
        async with http.get("/api/v1/nodes", headers=headers) as response:
            assert response.status == 200
        assert api.requests[-1].authorization == "Bearer secret"


async def test_selectors_filter_lists(kube_api, http):
    kube_api.add_node(node_object("node-a"))
    kube_api.add_pod(pod_object("a", node_name="node-a", labels={"app": "pg"}))
    kube_api.add_pod(pod_object("b", node_name="node-b", labels={"app": "pg"}))
    kube_api.add_pod(pod_object("c", node_name="node-a", labels={"app": "web"}))
    params = {"fieldSelector": "spec.nodeName=node-a", "labelSelector": "app=pg"}
    async with http.get("/api/v1/pods", params=params) as response:
        body = await response.json()
    assert [p["metadata"]["name"] for p in body["items"]] == ["a"]
