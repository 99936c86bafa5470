"""Filter's answer cache: reused only for the same size, mode and node list, and never once the
ledger changed which nodes reject that size."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from protocol.kube import Pod
from scheduler_extender.core.podinfo import Demand
from scheduler_extender.errors import ProtocolError
from scheduler_extender.http.verbs import Answers, PodInfos, _Cached, fingerprint
from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import StartExtender
from tests.extender.helpers import bind_body, filter_body, vm_pod

SIZE = Demand(2000, 2**30)


def nocache_body(pod: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


def passed(answer: dict[str, Any]) -> list[str]:
    if answer["NodeNames"] is not None:
        return list(answer["NodeNames"])
    return [n["metadata"]["name"] for n in answer["Nodes"]["items"]]


@pytest.mark.parametrize("mode", ["cache", "nocache"])
async def test_a_bind_changes_the_next_answer_for_the_same_body(
    kube_api: FakeKubeApi, start_extender: StartExtender, mode: str
) -> None:
    nodes = [node_object("node-a", cpu="4"), node_object("node-b", cpu="2")]
    for node in nodes:
        kube_api.add_node(node)
    first = kube_api.add_pod(vm_pod("vm-1", uid="u-1", min_vcpus=2))
    second = kube_api.add_pod(vm_pod("vm-2", uid="u-2", min_vcpus=2))
    running = await start_extender()

    def body(pod: dict[str, Any]) -> dict[str, Any]:
        if mode == "cache":
            return filter_body(pod, ["node-a", "node-b"])
        return nocache_body(pod, nodes)

    async def filter_(pod: dict[str, Any]) -> dict[str, Any]:
        response = await running.verbs.post("/filter", json=body(pod))
        assert response.status == 200
        answer: dict[str, Any] = await response.json()
        return answer

    # Twice, so that the second answer comes from the cache.
    for _ in range(2):
        answer = await filter_(second)
        assert passed(answer) == ["node-a"]
        assert answer["FailedAndUnresolvableNodes"] == {
            "node-b": "node too small: pod needs 2000m cpu, more than it can ever give"
        }
    bound = await running.verbs.post("/bind", json=bind_body(first, "node-a"))
    assert await bound.json() == {"Error": ""}
    answer = await filter_(second)
    assert passed(answer) == []
    assert answer["FailedNodes"] == {"node-a": "insufficient cpu: pod needs 2000m"}
    if mode == "nocache":
        assert answer["Nodes"]["items"] == []
    # Counted: the second call's answer was kept, the first and the last were computed.
    registry = running.extender.metrics.registry
    counted = {
        result: registry.get_sample_value(
            "vmautoscale_extender_answers_total", {"verb": "filter", "result": result}
        )
        for result in ("kept", "computed")
    }
    assert counted == {"kept": 1.0, "computed": 2.0}


def test_lists_with_the_same_fingerprint_get_their_own_answers() -> None:
    names = [f"node-{i:05d}" for i in range(2000)]
    one = msgspec.json.encode(names)
    assert len(one) > 16 * 1024  # long enough to be fingerprinted by slices
    # Byte 300 lies between the first two sampled slices: same length, same fingerprint.
    other = one[:300] + (b"9" if one[300:301] != b"9" else b"8") + one[301:]
    assert fingerprint(msgspec.Raw(one)) == fingerprint(msgspec.Raw(other))
    answers = Answers()
    key = (SIZE, True, len(one))
    answers.put(key, _Cached((1, 1), msgspec.Raw(one), b"one", "", True))
    assert answers.get(key, msgspec.Raw(other), (1, 1)) is None
    found = answers.get(key, msgspec.Raw(bytes(one)), (1, 1))
    assert found is not None and found.body == b"one"
    assert answers.get(key, msgspec.Raw(one), (1, 2)) is None  # the index moved on


def test_answers_are_bounded_by_bytes_lists_included() -> None:
    answers = Answers(max_bytes=1000)
    lists = [msgspec.Raw(msgspec.json.encode([f"n{i}"] * 40)) for i in range(4)]
    for i, listed in enumerate(lists):
        key = (Demand(1000 * (i + 1), 0), True, len(listed))
        answers.put(key, _Cached((0, 0), listed, b"x" * 200, "", True))
    size = len(lists[0]) + 200
    assert size * 3 > 1000 >= size * 2
    kept = [
        i
        for i, listed in enumerate(lists)
        if answers.get((Demand(1000 * (i + 1), 0), True, len(listed)), listed, (0, 0))
    ]
    assert kept == [2, 3]  # the oldest went first


def _pod(uid: str, rv: str, *, max_vcpus: int = 4) -> Pod:
    obj = vm_pod("vm", uid=uid, max_vcpus=max_vcpus)
    obj["metadata"]["uid"] = uid  # also when empty (the builder would make one up)
    if rv:
        obj["metadata"]["resourceVersion"] = rv
    return msgspec.convert(obj, Pod)


def test_pod_infos_are_kept_by_uid_and_resource_version() -> None:
    infos = PodInfos("vm-scheduler", max_entries=2)
    first = infos.get(_pod("u-1", "10"))
    assert infos.get(_pod("u-1", "10")) is first
    # A new version of the pod is read again, whatever it says.
    newer = infos.get(_pod("u-1", "11", max_vcpus=6))
    assert newer is not first and newer.vm is not None and newer.vm.max_vcpus == 6
    # Without a resourceVersion nothing is kept: two reads, two answers.
    assert infos.get(_pod("u-2", "")) is not infos.get(_pod("u-2", ""))
    # Bounded: the least recently used version goes first.
    infos.get(_pod("u-3", "1"))
    assert infos.get(_pod("u-1", "11")) is newer
    assert infos.get(_pod("u-1", "10")) is not first
    # Nor without a uid: two uid-less pods of one resourceVersion are not the same pod.
    assert infos.get(_pod("", "7")) is not infos.get(_pod("", "7"))


def test_a_pod_with_bad_requests_is_refused_every_time() -> None:
    infos = PodInfos("vm-scheduler")
    bad = vm_pod("vm", uid="u-9")
    bad["metadata"]["resourceVersion"] = "5"
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    for _ in range(2):
        with pytest.raises(ProtocolError, match="lots"):
            infos.get(msgspec.convert(bad, Pod))


@pytest.mark.parametrize("mode", ["cache", "nocache"])
async def test_a_bind_changes_the_next_prioritize_answer_for_the_same_body(
    kube_api: FakeKubeApi, start_extender: StartExtender, mode: str
) -> None:
    nodes = [node_object("node-a", cpu="8"), node_object("node-b", cpu="8")]
    for node in nodes:
        kube_api.add_node(node)
    first = kube_api.add_pod(vm_pod("vm-1", uid="u-1", min_vcpus=4))
    second = kube_api.add_pod(vm_pod("vm-2", uid="u-2", min_vcpus=1, max_vcpus=2))
    running = await start_extender()
    body = (
        filter_body(second, ["node-a", "node-b"])
        if mode == "cache"
        else nocache_body(second, nodes)
    )

    async def prioritize() -> list[dict[str, Any]]:
        response = await running.verbs.post("/prioritize", json=body)
        assert response.status == 200
        answer: list[dict[str, Any]] = await response.json()
        return answer

    # Twice, so that the second answer comes from the cache.
    before = [await prioritize(), await prioritize()]
    assert before[0] == before[1]
    assert before[0][0]["Score"] == before[0][1]["Score"]  # two empty nodes score alike
    bound = await running.verbs.post("/bind", json=bind_body(first, "node-a"))
    assert await bound.json() == {"Error": ""}
    after = {entry["Host"]: entry["Score"] for entry in await prioritize()}
    # Spread (the default): the node half taken by vm-1 now scores below the empty one.
    assert after["node-a"] < after["node-b"] == before[0][1]["Score"]
