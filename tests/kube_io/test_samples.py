"""Every recorded kube-apiserver sample decodes with the structs kube_io uses.

A new sample file without a decoder here fails ``test_every_sample_is_covered``: the samples
are the truth, so each one must be read by something.
"""

from __future__ import annotations

import json

import msgspec
import pytest

from kube_io import Conflict, Gone, NotFound, TokenReviewResult
from kube_io.errors import decode_status, error_from_response
from kube_io.objects import TokenReview
from kube_io.watch import Bookmark, Changed, interpret_event
from protocol.codec import decode
from protocol.kube import Node, Pod, PodList, Status, WatchEvent
from tests.kube_io.conftest import SAMPLES, sample_answer, sample_bytes


def check_list_pods():
    pods = decode(PodList, sample_bytes("list-pods.json"))
    assert pods.metadata.resource_version == "236"
    assert pods.items is not None
    [pod] = pods.items
    assert pod.metadata.name == "vm-1"
    assert pod.spec.containers is not None
    assert pod.spec.containers[0].resources is not None
    assert pod.spec.containers[0].resources.requests == {"cpu": "1", "memory": "1Gi"}


def check_watch_pods():
    lines = sample_bytes("watch-pods.jsonl").splitlines()
    items = [interpret_event(decode(WatchEvent, line), Pod) for line in lines if line.strip()]
    changes = [(i.type, i.object.metadata.name) for i in items if isinstance(i, Changed)]
    assert changes == [
        ("MODIFIED", "vm-1"),
        ("ADDED", "vm-2"),
        ("MODIFIED", "vm-1"),
        ("MODIFIED", "vm-1"),
        ("MODIFIED", "vm-2"),
        ("DELETED", "vm-2"),
    ]
    bookmarks = [i for i in items if isinstance(i, Bookmark)]
    assert bookmarks == [Bookmark(resource_version="243")] * 2


def check_watch_410():
    status, body = sample_answer("watch-410.txt")
    assert status == 200
    with pytest.raises(Gone) as info:
        interpret_event(decode(WatchEvent, body), Pod)
    assert info.value.status == 410
    assert info.value.reason == "Expired"
    assert info.value.message == "The resourceVersion for the provided watch is too old."


def check_binding_201():
    status, body = sample_answer("binding-201.txt")
    assert status == 201
    assert decode(Status, body) == Status(
        kind="Status", api_version="v1", status="Success", code=201
    )


@pytest.mark.parametrize(
    ("name", "error_type", "detail_kind"),
    [
        ("binding-404-no-pod.txt", NotFound, "pods"),
        ("binding-409-already-assigned.txt", Conflict, "pods/binding"),
        ("binding-409-uid-precondition.txt", Conflict, "pods"),
    ],
    ids=["404", "409-assigned", "409-uid"],
)
def test_binding_errors_map_to_typed_errors(name, error_type, detail_kind):
    status, body = sample_answer(name)
    error = error_from_response(status, body)
    assert type(error) is error_type
    assert error.status == status
    assert error.message == json.loads(body)["message"]
    assert error.details is not None
    assert error.details.kind == detail_kind
    assert not error.is_retryable


def check_binding_errors():
    for name in (
        "binding-404-no-pod.txt",
        "binding-409-already-assigned.txt",
        "binding-409-uid-precondition.txt",
    ):
        status, body = sample_answer(name)
        assert decode(Status, body).code == status
        assert decode_status(body) is not None


def check_pods():
    for name in ("patch-annotation.json", "pod-bound-resized.json"):
        pod = decode(Pod, sample_bytes(name))
        assert pod.spec.node_name == "node-a"
        assert pod.metadata.generation == 2
    status, body = sample_answer("resize-patch.txt")
    assert status == 200
    pod = decode(Pod, body)
    assert pod.spec.containers is not None
    resources = pod.spec.containers[0].resources
    assert resources is not None
    assert resources.requests == {"cpu": "2", "memory": "1Gi"}
    assert resources.limits == {"cpu": "2", "memory": "1Gi"}


def check_node():
    node = decode(Node, sample_bytes("node.json"))
    assert node.metadata.name == "node-a"
    assert node.status.allocatable is not None
    assert node.status.allocatable["cpu"] == "4"


def check_token_reviews():
    ok = TokenReviewResult.from_review(decode(TokenReview, sample_bytes("tokenreview-ok.json")))
    assert ok == TokenReviewResult(
        authenticated=True,
        username="system:serviceaccount:vm-autoscaling:autoscaler-agent",
        node_name="node-a",
        pod_name="autoscaler-agent-x7k2p",
        pod_uid="8aa5b392-448e-407f-a6c9-d69efc980634",
        groups=(
            "system:serviceaccounts",
            "system:serviceaccounts:vm-autoscaling",
            "system:authenticated",
        ),
        uid="d288229f-5a36-481d-94fe-28d5d8e963cb",
    )
    wrong = decode(TokenReview, sample_bytes("tokenreview-wrong-audience.json"))
    result = TokenReviewResult.from_review(wrong)
    assert not result.authenticated
    assert result.node_name is None
    assert result.error is not None
    assert "is invalid for the target audiences" in result.error


class _Claims(msgspec.Struct):
    aud: list[str]
    kubernetes_io: dict[str, object] = msgspec.field(name="kubernetes.io")


def check_token_claims():
    # kube_io never reads a JWT itself (the TokenReview does); the claims must agree with it.
    claims = decode(_Claims, sample_bytes("token-claims.json"))
    assert claims.aud == ["vm-autoscaling-extender"]
    assert claims.kubernetes_io["node"] == {
        "name": "node-a",
        "uid": "f8c3301c-2ea4-4b22-8958-7767895ecaa9",
    }


CHECKS = {
    "list-pods.json": check_list_pods,
    "watch-pods.jsonl": check_watch_pods,
    "watch-410.txt": check_watch_410,
    "binding-201.txt": check_binding_201,
    "binding-404-no-pod.txt": check_binding_errors,
    "binding-409-already-assigned.txt": check_binding_errors,
    "binding-409-uid-precondition.txt": check_binding_errors,
    "resize-patch.txt": check_pods,
    "pod-bound-resized.json": check_pods,
    "patch-annotation.json": check_pods,
    "node.json": check_node,
    "tokenreview-ok.json": check_token_reviews,
    "tokenreview-wrong-audience.json": check_token_reviews,
    "token-claims.json": check_token_claims,
}


def test_every_sample_is_covered():
    assert sorted(p.name for p in SAMPLES.iterdir()) == sorted(CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_sample_decodes(name):
    CHECKS[name]()
