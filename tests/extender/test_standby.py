"""The standby of two replicas over real HTTP: warm, not ready, refusing with a retryable 503;
and what it does on taking the Lease (the restart path's uncertainty, a new epoch)."""

from __future__ import annotations

import asyncio

from scheduler_extender.core.leadership import Elector, LeaseRecord
from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import STATIC_TOKEN, StartExtender, wait_until
from tests.extender.helpers import bind_body, filter_body, permit_batch, vm_pod

AUTH = {"Authorization": f"Bearer {STATIC_TOKEN}"}


def standby(now: float) -> Elector:
    e = Elector("ha-b_1", duration_seconds=15, renew_seconds=2, retry_seconds=2)
    e.read(now, LeaseRecord(holder="ha-a_1", duration_seconds=15, transitions=0, version="1"))
    return e


async def test_the_standby_is_warm_but_refuses_to_decide(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a"))
    pending = vm_pod("vm-2", uid="u-2", node=None)
    kube_api.add_pod(pending)
    running = await start_extender()
    extender = running.extender
    extender.elector = elector = standby(extender.clock())

    for client in (running.verbs, running.permits):
        ready = await client.get("/readyz")
        assert ready.status == 503
        assert "standby" in await ready.text()
        assert (await client.get("/readyz?exclude=leader")).status == 200
    for path, body in (
        ("/filter", filter_body(pending, ["node-a"])),
        ("/bind", bind_body(pending, "node-a")),
    ):
        answer = await running.verbs.post(path, json=body)
        assert answer.status == 503
        assert answer.headers["Retry-After"] == "1"
        assert (await answer.json())["reason"] == "NotLeader"
    refused = await running.permits.post(
        "/v1/permits",
        json=permit_batch("node-a", uid="u-1", current=1, requested=2),
        headers=AUTH,
    )
    assert refused.status == 503
    assert refused.headers["Retry-After"] == "1"
    body = await refused.json()
    assert body["reason"] == "NotLeader" and "ha-a_1" in body["message"]
    # Warm: the ledger follows the cluster, and holds the VM up to its maximum (unverified).
    (node,) = (await running.state())["nodes"]
    (vm,) = node["allocations"]
    assert "unverified" in vm

    # It takes the Lease: a new epoch, and it decides.
    epoch = extender.epoch
    now = extender.clock()
    elector.wrote(
        now, LeaseRecord(holder="ha-b_1", duration_seconds=15, transitions=1, version="2")
    )
    extender.leadership_gained(elector)
    assert extender.epoch != epoch
    # Before its first decision it fences the old leader's binds: the waiting pod is written to
    # (a new resourceVersion), so a Binding sent for its old version fails.
    stale = kube_api.get_pod("vms", "vm-2")["metadata"]["resourceVersion"]
    await wait_until(lambda: extender.fenced_term == elector.term)
    fenced = kube_api.get_pod("vms", "vm-2")["metadata"]
    assert fenced["annotations"]["vm-autoscaling.io/leader-term"] == str(elector.term)
    assert fenced["resourceVersion"] != stale
    assert (await running.verbs.get("/readyz")).status == 200
    granted = await running.permits.post(
        "/v1/permits",
        json=permit_batch("node-a", uid="u-1", current=1, requested=2),
        headers=AUTH,
    )
    assert granted.status == 200
    assert (await granted.json())["epoch"] == extender.epoch


def leads(identity: str, now: float, *, transitions: int) -> Elector:
    """An elector that has just written the Lease as its holder."""
    e = Elector(identity, duration_seconds=15, renew_seconds=2, retry_seconds=2)
    e.wrote(
        now,
        LeaseRecord(
            holder=identity, duration_seconds=15, transitions=transitions, version=str(transitions)
        ),
    )
    return e


async def test_a_binding_the_old_leader_sent_before_the_takeover_cannot_land(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """Fencing, not timing: the old leader decided a bind while it led, but its Binding is held
    back (a partition) until the new leader has taken over. The new leader's fence wrote to the
    waiting pod, so the Binding fails its resourceVersion precondition and nothing lands."""
    kube_api.add_node(node_object("node-a", cpu="8"))
    pending = vm_pod("vm-2", uid="u-2", node=None)
    kube_api.add_pod(pending)
    old, new = await start_extender(), await start_extender()
    old.extender.elector = leads("ha-a_1", old.extender.clock(), transitions=1)
    old.extender.leadership_gained(old.extender.elector)
    await wait_until(lambda: old.extender.fenced_term == 1)
    new.extender.elector = standby(new.extender.clock())
    gate = kube_api.hold("/api/v1/namespaces/vms/pods/vm-2/binding")
    answer = asyncio.create_task(old.verbs.post("/bind", json=bind_body(pending, "node-a")))
    await wait_until(lambda: "u-2" in old.extender.binds_in_flight)
    # The old leader's term ends; the new one takes the Lease and fences before deciding.
    old.extender.elector = standby(old.extender.clock())
    new.extender.elector = leads("ha-b_1", new.extender.clock(), transitions=2)
    new.extender.leadership_gained(new.extender.elector)
    await wait_until(lambda: new.extender.fenced_term == 2)
    gate.set()
    response = await answer
    assert response.status == 200
    error = (await response.json())["Error"]
    assert "Precondition failed: ResourceVersion" in error, error
    assert kube_api.get_pod("vms", "vm-2")["spec"].get("nodeName") is None
    assert "u-2" not in old.extender.ledger.pods
