"""bind is the commit point: reserve (re-checking the fit), POST the Binding, undo on failure."""

from __future__ import annotations

import pytest

from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import StartExtender, wait_until
from tests.extender.helpers import bind_body, filter_body, vm_pod

BINDING = "/api/v1/namespaces/vms/pods/{}/binding"


async def test_bind_success_posts_binding_and_holds(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a", cpu="4"))
    pod = kube_api.add_pod(vm_pod("vm-1", uid="u-1", min_vcpus=2))
    running = await start_extender()
    response = await running.verbs.post("/bind", json=bind_body(pod, "node-a"))
    assert (response.status, await response.json()) == (200, {"Error": ""})
    binding = [r for r in kube_api.requests if r.path == BINDING.format("vm-1")]
    assert binding[0].body["metadata"]["uid"] == "u-1"  # the UID precondition
    assert binding[0].body["target"]["name"] == "node-a"
    await wait_until(lambda: not running.extender.ledger.pods["u-1"].is_tentative)
    (node,) = (await running.state())["nodes"]
    assert [a["pod"] for a in node["allocations"]] == ["vms/vm-1"]
    assert node["allocated"]["cpuMillis"] == 2000
    # No NODE_ALLOC Event for the bind: kube-scheduler's own Scheduled Event says where the
    # pod went. Its release does get one (Events go out in order, so a bind Event would come
    # first), and nothing in the initial list does.
    kube_api.delete_pod("vms", "vm-1")
    await wait_until(lambda: len(kube_api.events) == 1)
    (event,) = kube_api.events
    assert event["reason"] == "NODE_ALLOC"
    assert event["involvedObject"]["name"] == "vm-1"
    assert "released from node node-a" in event["message"]


@pytest.mark.parametrize(
    ("status", "expected"),
    [(409, "already assigned"), (404, "not found")],
    ids=["409-conflict", "404-gone"],
)
async def test_bind_failure_releases_the_reservation(
    status: int, expected: str, kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a", cpu="4"))
    pod = kube_api.add_pod(vm_pod("vm-1", uid="u-1"))
    running = await start_extender()
    before = await running.state()
    kube_api.fail_next(status, path=BINDING.format("vm-1"), message=f"pod vm-1 {expected}")
    response = await running.verbs.post("/bind", json=bind_body(pod, "node-a"))
    assert response.status == 200
    error = (await response.json())["Error"]
    assert "binding vms/vm-1 to node-a failed" in error and expected in error
    assert await running.state() == before
    assert "u-1" not in running.extender.ledger.pods
    running.extender.ledger.check_invariants()


async def test_bind_rechecks_fit_when_the_node_filled_up_after_filter(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a", cpu="4"))  # 3200m usable after the 20% reserve
    first = kube_api.add_pod(vm_pod("vm-1", uid="u-1", min_vcpus=2))
    second = kube_api.add_pod(vm_pod("vm-2", uid="u-2", min_vcpus=2))
    running = await start_extender()
    for pod in (first, second):
        answer = await (
            await running.verbs.post("/filter", json=filter_body(pod, ["node-a"]))
        ).json()
        assert answer["NodeNames"] == ["node-a"]
    assert (await (await running.verbs.post("/bind", json=bind_body(first, "node-a"))).json()) == {
        "Error": ""
    }
    answer = await (await running.verbs.post("/bind", json=bind_body(second, "node-a"))).json()
    assert "insufficient cpu" in answer["Error"]
    assert not any(r.path == BINDING.format("vm-2") for r in kube_api.requests)
    (node,) = (await running.state())["nodes"]
    assert [a["pod"] for a in node["allocations"]] == ["vms/vm-1"]


async def test_bind_of_a_pod_the_watch_has_not_seen_fails_clearly(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a"))
    running = await start_extender()
    pod = vm_pod("ghost", uid="u-ghost")
    answer = await (await running.verbs.post("/bind", json=bind_body(pod, "node-a"))).json()
    assert "not known to the extender yet" in answer["Error"]
    assert not any(r.path.endswith("/binding") for r in kube_api.requests)


@pytest.mark.parametrize(
    ("drop", "extra", "named"),
    [
        (("vm-autoscaling.io/min-vcpus",), {}, "vm-autoscaling.io/min-vcpus"),
        ((), {"vm-autoscaling.io/max-vcpus": "0"}, "vm-autoscaling.io/max-vcpus"),
        (
            (),
            {"vm-autoscaling.io/min-vcpus": "4", "vm-autoscaling.io/max-vcpus": "2"},
            "vm-autoscaling.io/max-vcpus",
        ),
    ],
    ids=["missing", "malformed", "contradictory"],
)
async def test_filter_rejects_a_vm_pod_with_bad_annotations_naming_the_key(
    drop: tuple[str, ...],
    extra: dict[str, str],
    named: str,
    kube_api: FakeKubeApi,
    start_extender: StartExtender,
) -> None:
    kube_api.add_node(node_object("node-a"))
    kube_api.add_node(node_object("node-b"))
    running = await start_extender()
    pod = vm_pod("bad", uid="u-bad", drop=drop, extra=extra)
    response = await running.verbs.post("/filter", json=filter_body(pod, ["node-a", "node-b"]))
    assert response.status == 200
    answer = await response.json()
    assert answer["NodeNames"] == []
    assert set(answer["FailedAndUnresolvableNodes"]) == {"node-a", "node-b"}
    assert all(named in reason for reason in answer["FailedAndUnresolvableNodes"].values())


async def test_malformed_verb_body_is_400_and_state_untouched(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a"))
    running = await start_extender()
    before = await running.state()
    for verb in ("filter", "prioritize", "bind", "preempt"):
        response = await running.verbs.post(f"/{verb}", data=b"{not json")
        assert response.status == 400, verb
        assert "malformed JSON" in (await response.json())["message"]
        response = await running.verbs.post(f"/{verb}", json={"Pod": 3, "PodName": 3})
        assert response.status == 400, verb
    assert await running.state() == before
