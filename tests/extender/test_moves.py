"""``POST /v1/moves``: the vm-controller reserves a moving VM's room on its target node.

Over real HTTP against the extender's permit port (in process and across the permit front's
channel), the extender's own client on the fake
API server (its TokenReview answers are the recorded samples'). What a call causes is read
back from ``/state`` (the ledger as the extender reports it): every refusal leaves it as it was.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from testkit.kube_api import FakeKubeApi, TokenIdentity, fake_jwt, node_object
from tests.extender.conftest import STATIC_TOKEN, Running, StartExtender, make_config
from tests.extender.helpers import vm_pod

SOURCE_UID = "0b7d0f52-2a5e-4c57-9d3e-9a1e2b3c4d5e"
OTHER_UID = "1c8e1a63-3b6f-4d68-8e4f-ab2f3c4d5e6f"
CONTROLLER = "system:serviceaccount:vm-autoscaling:vm-controller"


@pytest.fixture(params=["local", "channel"])
def front_via(request: pytest.FixtureRequest) -> str:
    """Both ways the permit port reaches the Extender: the answers must be the same."""
    param: str = request.param
    return param


def _cluster(kube_api: FakeKubeApi, *, node_b_cpu: str = "8") -> None:
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_node(node_object("node-b", cpu=node_b_cpu))
    kube_api.add_pod(vm_pod("vm-1", uid=SOURCE_UID, node="node-a", min_vcpus=2))


def _reserve(**over: Any) -> dict[str, Any]:
    body = {
        "op": "reserve",
        "sourceUid": SOURCE_UID,
        "targetPod": "vm-1-m1",
        "targetNode": "node-b",
    }
    return {k: v for k, v in {**body, **over}.items() if v is not None}


async def _post(running: Running, body: Any, token: str | None = STATIC_TOKEN) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await running.permits.post("/v1/moves", data=data, headers=headers)


def _node(state: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in state["nodes"] if n["name"] == name)


async def test_reserve_then_cancel(kube_api: FakeKubeApi, start_extender: StartExtender) -> None:
    _cluster(kube_api)
    running = await start_extender()
    before = await running.state()
    response = await _post(running, _reserve())
    assert response.status == 200, await response.text()
    answer = await response.json()
    assert answer["op"] == "reserve" and answer["reservedMillicpu"] == 2000
    during = await running.state()
    # The target node holds the VM's room; the source node still holds it too.
    assert _node(during, "node-b") != _node(before, "node-b")
    assert _node(during, "node-a") == _node(before, "node-a")
    # A second reservation of the same VM: it is already moving.
    again = await _post(running, _reserve(targetPod="vm-1-m2"))
    assert again.status == 409
    assert (await again.json())["reason"] == "Conflict"
    cancel = await _post(running, {"op": "cancel", "sourceUid": SOURCE_UID})
    assert cancel.status == 200, await cancel.text()
    assert await running.state() == before
    # Cancelling again changes nothing and is not an error (a driver retries after a restart).
    assert (await _post(running, {"op": "cancel", "sourceUid": SOURCE_UID})).status == 200
    assert await running.state() == before


@pytest.mark.parametrize(
    ("body", "status", "reason", "names"),
    [
        (b"{", 400, "BadRequest", "MoveRequest"),
        (_reserve(op="teleport"), 400, "BadRequest", "op"),
        (_reserve(targetNode=1), 400, "BadRequest", "targetNode"),
        (_reserve(targetPod="Not_A_Name"), 400, "BadRequest", "targetPod"),
        (_reserve(sourceUid="u-1"), 400, "BadRequest", "sourceUid"),
        (_reserve(extra=1), 400, "BadRequest", "extra"),
        (_reserve(sourceUid=OTHER_UID), 404, "UnknownPod", OTHER_UID),
        (_reserve(targetNode="node-z"), 404, "UnknownNode", "node-z"),
        (_reserve(targetNode="node-a"), 409, "Conflict", "node-a"),
        (_reserve(targetPod="vm-1"), 409, "Conflict", "vm-1"),
    ],
)
async def test_bad_input_is_refused_and_changes_nothing(  # noqa: PLR0917
    kube_api: FakeKubeApi,
    start_extender: StartExtender,
    body: Any,
    status: int,
    reason: str,
    names: str,
) -> None:
    _cluster(kube_api)
    running = await start_extender()
    before = await running.state()
    response = await _post(running, body)
    assert response.status == status, await response.text()
    error = await response.json()
    assert error["reason"] == reason
    assert names in error["message"]
    assert await running.state() == before


async def test_no_room_on_the_target_is_refused(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api, node_b_cpu="1")
    running = await start_extender()
    before = await running.state()
    response = await _post(running, _reserve())
    assert response.status == 409
    assert (await response.json())["reason"] == "NoRoom"
    assert await running.state() == before


async def test_a_move_without_a_target_goes_where_relief_would_send_the_vm(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """No targetNode: the extender chooses (``core.relief.choose_target``: never the VM's own
    node), holds the room there, and names the node in its answer."""
    _cluster(kube_api)
    running = await start_extender()
    before = await running.state()
    response = await _post(running, _reserve(targetNode=None))
    assert response.status == 200, await response.text()
    answer = await response.json()
    assert (answer["targetNode"], answer["reservedMillicpu"]) == ("node-b", 2000)
    assert _node(await running.state(), "node-b") != _node(before, "node-b")


async def test_a_move_without_a_target_and_no_node_with_room_is_refused(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api, node_b_cpu="1")
    running = await start_extender()
    before = await running.state()
    response = await _post(running, _reserve(targetNode=None))
    assert response.status == 409
    error = await response.json()
    assert error["reason"] == "NoRoom" and "node-a" in error["message"], error
    assert await running.state() == before


@pytest.mark.parametrize(
    ("token", "status"),
    [
        (None, 401),
        ("not-a-jwt", 401),
        ("agent", 403),
        ("controller", 200),
    ],
)
async def test_only_the_controller_may_reserve(
    kube_api: FakeKubeApi, start_extender: StartExtender, token: str | None, status: int
) -> None:
    _cluster(kube_api)
    kube_api.add_token("controller", TokenIdentity(username=CONTROLLER))
    kube_api.add_token(
        "agent", TokenIdentity(username="system:serviceaccount:vm-autoscaling:autoscaler-agent")
    )
    running = await start_extender(make_config(auth={"mode": "tokenreview"}))
    before = await running.state()
    bearer = token if token in (None, "not-a-jwt") else fake_jwt(token)
    response = await _post(running, _reserve(), token=bearer)
    assert response.status == status, await response.text()
    if status != 200:
        assert await running.state() == before


async def test_a_restarted_extender_holds_a_moves_target_again_from_the_source_pods_marks(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """The ledger's moves are not in the API server: a fresh extender finds the source pod
    marked (``migration`` and ``migration-to``) and no target pod yet, and holds the target's
    room as the vm-controller had reserved it; the controller's cancel then releases it."""
    _cluster(kube_api)
    marks = {
        "vm-autoscaling.io/migration": "move-1",
        "vm-autoscaling.io/migration-to": "node-b/vm-1-m1",
    }
    kube_api.update_pod("vms", "vm-1", {"metadata": {"annotations": marks}})
    running = await start_extender()
    rebuilt = await running.state()
    # As reserved by hand on an extender that never restarted (the other tests' figures).
    again = await _post(running, _reserve())
    assert again.status == 409 and (await again.json())["reason"] == "Conflict"
    assert (await _post(running, {"op": "cancel", "sourceUid": SOURCE_UID})).status == 200
    released = await running.state()
    assert _node(released, "node-b") != _node(rebuilt, "node-b")
    reserved = await _post(running, _reserve())
    assert reserved.status == 200
    assert _node(await running.state(), "node-b") == _node(rebuilt, "node-b")


@pytest.mark.parametrize("value", ["node-b", "/vm-1-m1", "node-b/", "node-b/a/b", ""], ids=repr)
async def test_a_malformed_move_mark_rebuilds_nothing(
    kube_api: FakeKubeApi, start_extender: StartExtender, value: str
) -> None:
    _cluster(kube_api)
    running = await start_extender()
    clean = await running.state()
    kube_api.update_pod(
        "vms",
        "vm-1",
        {"metadata": {"annotations": {"vm-autoscaling.io/migration": "m",
                                      "vm-autoscaling.io/migration-to": value}}},
    )  # fmt: skip
    restarted = await start_extender()
    assert _node(await restarted.state(), "node-b") == _node(clean, "node-b")
