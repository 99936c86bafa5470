"""The standby of two replicas over real HTTP: warm, not ready, refusing with a retryable 503;
and what it does on taking the Lease (the restart path's uncertainty, a new epoch)."""

from __future__ import annotations

import asyncio

from scheduler_extender.admission.queue import PodKey
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


def patches_of(kube_api: FakeKubeApi, name: str) -> int:
    path = f"/api/v1/namespaces/vms/pods/{name}"
    return sum(1 for r in kube_api.requests if r.method == "PATCH" and r.path == path)


async def test_a_bind_follows_our_own_touch_of_the_pod_instead_of_failing_on_it(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """The leader's wake-up patch of a waiting pod is on its way when kube-scheduler binds the
    pod: the bind waits for it and carries the version it made, so the Binding does not fail
    its resourceVersion precondition on our own write (a 409 costs the pod kube-scheduler's
    back-off)."""
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_pod(vm_pod("vm-2", uid="u-2", node=None))
    running = await start_extender()
    extender = running.extender
    extender.elector = leads("ha-a_1", extender.clock(), transitions=1)
    extender.leadership_gained(extender.elector)
    await wait_until(lambda: extender.fenced_term == 1)
    touched = patches_of(kube_api, "vm-2")
    patch_gate = kube_api.hold("/api/v1/namespaces/vms/pods/vm-2")
    bind_gate = kube_api.hold("/api/v1/namespaces/vms/pods/vm-2/binding")
    extender.notices.admitted([PodKey(namespace="vms", name="vm-2", uid="u-2")])
    await wait_until(lambda: patches_of(kube_api, "vm-2") == touched + 1)
    # kube-scheduler binds the pod while our touch is held: the bind reaches its first await.
    bind = asyncio.create_task(
        extender.bind(namespace="vms", name="vm-2", uid="u-2", node="node-a")
    )
    await asyncio.sleep(0)
    patch_gate.set()
    await wait_until(lambda: extender.notices.touched_total == 1)
    bind_gate.set()
    assert await bind == ""
    assert kube_api.get_pod("vms", "vm-2")["spec"]["nodeName"] == "node-a"


async def test_a_deposed_leader_sends_none_of_its_queued_touches(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """Touches queued when the Lease is lost never go out; the one on its way is cancelled
    (it was sent while this replica led, before any new leader's fence)."""
    kube_api.add_node(node_object("node-a", cpu="8"))
    for name, uid in (("vm-2", "u-2"), ("vm-3", "u-3")):
        kube_api.add_pod(vm_pod(name, uid=uid, node=None))
    running = await start_extender()
    extender = running.extender
    # As ``make_app`` wires it with leader election on: the standby posts and touches nothing.
    extender.reporter.is_quiet = lambda: not extender.is_leading
    extender.elector = leads("ha-a_1", extender.clock(), transitions=1)
    extender.leadership_gained(extender.elector)
    await wait_until(lambda: extender.fenced_term == 1)
    before = {name: patches_of(kube_api, name) for name in ("vm-2", "vm-3")}
    gate = kube_api.hold("/api/v1/namespaces/vms/pods/vm-2")
    extender.notices.admitted(
        [
            PodKey(namespace="vms", name="vm-2", uid="u-2"),
            PodKey(namespace="vms", name="vm-3", uid="u-3"),
        ]
    )
    await wait_until(lambda: patches_of(kube_api, "vm-2") == before["vm-2"] + 1)
    assert extender.notices.pending_touches == 1  # vm-3's, behind vm-2's
    extender.elector = standby(extender.clock())
    extender.leadership_lost(extender.elector)
    gate.set()
    await wait_until(
        lambda: extender.notices.pending_touches == 0 and not extender.notices.is_touching
    )
    assert patches_of(kube_api, "vm-3") == before["vm-3"]
    assert extender.notices.touched_total == 0
    # Nothing queues while it is the standby either.
    extender.notices.admitted([PodKey(namespace="vms", name="vm-3", uid="u-3")])
    assert extender.notices.pending_touches == 0
