"""The standby of two replicas over real HTTP: warm, not ready, refusing with a retryable 503;
and what it does on taking the Lease (the restart path's uncertainty, a new epoch)."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from kube_io.objects import ObjectReference
from scheduler_extender.admission.queue import PodKey
from scheduler_extender.core.leadership import Elector, LeaseRecord
from scheduler_extender.kube.durability import PermitWrite
from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import STATIC_TOKEN, StartExtender, wait_until
from tests.extender.helpers import bind_body, filter_body, permit_batch, vm_pod

GIB = 2**30
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
        assert answer.headers["Connection"] == "close"
        assert (await answer.json())["reason"] == "NotLeader"
    refused = await running.permits.post(
        "/v1/permits",
        json=permit_batch("node-a", uid="u-1", current=1, requested=2),
        headers=AUTH,
    )
    assert refused.status == 503
    assert refused.headers["Retry-After"] == "1"
    # Closed after the answer: the agent's retry opens a new connection, which the Service
    # sends to the leader (a kept-alive one would stay on this pod; errors.NotLeader).
    assert refused.headers["Connection"] == "close"
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


async def test_healthz_fails_on_every_listener_while_the_pair_is_stalled(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """The leader's hold ran out unrenewed while its kube-scheduler leads: liveness fails
    (kube-scheduler's probe too), and passes again once its kube-scheduler no longer leads."""
    kube_api.add_node(node_object("node-a", cpu="8"))
    running = await start_extender()
    extender = running.extender
    now = extender.clock()
    elector = leads("ha-a_1", now - 30, transitions=1)  # renewed last 30 s ago
    elector.candidacy_changed(now - 30, is_candidate=True)
    extender.elector = elector
    assert elector.stalled(now)
    for client in (running.verbs, running.permits):
        answer = await client.get("/healthz")
        assert answer.status == 503
        assert (await answer.text()).startswith("stalled: this pod's kube-scheduler leads")
    elector.candidacy_changed(extender.clock(), is_candidate=False)
    for client in (running.verbs, running.permits):
        assert (await client.get("/healthz")).status == 200


def writes(kube_api: FakeKubeApi) -> list[str]:
    return [f"{r.method} {r.path}" for r in kube_api.requests if r.method != "GET"]


async def test_a_replica_writes_nothing_unless_it_leads_in_the_term_it_began_writing_in(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """Every write but the Lease's passes one gate, right before it is sent: the durability
    writer's patch, an Event, a touch. Refused while the Lease has lapsed (before the loop
    noticed: nothing told the writers), and while it leads again in a later term that it has
    not begun (another replica held the Lease in between); let through once it has."""
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a"))
    kube_api.add_pod(vm_pod("vm-2", uid="u-2", node=None))
    running = await start_extender()
    extender = running.extender
    recorder = extender.recorder
    assert recorder is not None
    extender.elector = leads("ha-a_1", extender.clock(), transitions=1)
    extender.leadership_gained(extender.elector)
    await wait_until(lambda: extender.fenced_term == 1)
    permit = PermitWrite(namespace="vms", name="vm-1", container=None, vcpus=2, memory_bytes=GIB)
    about_vm_1 = ObjectReference(api_version="v1", kind="Pod", name="vm-1", namespace="vms")
    vm_2 = PodKey(namespace="vms", name="vm-2", uid="u-2")

    async def try_every_writer(vcpus: int) -> None:
        with capture_logs() as logs:
            recorder.record("u-1", permit._replace(vcpus=vcpus))
            extender.reporter.post(about_vm_1, reason="Test", message="m")
            extender.notices.admitted([vm_2])
            await wait_until(
                lambda: (
                    {"permit_write_dropped", "node_alloc_event_failed", "pod_touch_failed"}
                    <= {e["event"] for e in logs}
                )
            )
        assert recorder.pending_count == 0

    before = writes(kube_api)
    # The hold ran out; the Lease loop has not noticed yet.
    extender.elector = standby(extender.clock())
    await try_every_writer(3)
    # Another replica held term 2; this one leads again in term 3 but has not begun it.
    extender.elector = leads("ha-a_1", extender.clock(), transitions=3)
    await try_every_writer(4)
    assert writes(kube_api) == before
    extender.leadership_gained(extender.elector)
    await wait_until(lambda: extender.fenced_term == 3)
    recorder.record("u-1", permit._replace(vcpus=4))
    await recorder.wait_idle()
    assert "PATCH /api/v1/namespaces/vms/pods/vm-1" in writes(kube_api)[len(before) :]
    annotations = kube_api.get_pod("vms", "vm-1")["metadata"]["annotations"]
    assert annotations["vm-autoscaling.io/permitted-vcpus"] == "4"
