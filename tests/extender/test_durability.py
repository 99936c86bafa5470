"""Permits are written to the pods off the request path, coalesced, and a restart rebuilds them."""

from __future__ import annotations

from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import (
    STATIC_TOKEN,
    Running,
    StartExtender,
    make_config,
    wait_until,
)
from tests.extender.helpers import ask_memory, permit_batch, vm_pod

POD = "/api/v1/namespaces/vms/pods/vm-1"
AUTH = {"Authorization": f"Bearer {STATIC_TOKEN}"}


def _cluster(kube_api: FakeKubeApi) -> None:
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", max_vcpus=6))


def _annotations(kube_api: FakeKubeApi) -> dict[str, str]:
    found: dict[str, str] = kube_api.get_pod("vms", "vm-1")["metadata"].get("annotations", {})
    return found


def _cpu(kube_api: FakeKubeApi) -> str:
    container = kube_api.get_pod("vms", "vm-1")["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"] == container["resources"]["limits"]["cpu"]
    cpu: str = container["resources"]["requests"]["cpu"]
    return cpu


async def test_permit_is_recorded_in_annotations_and_resized_in_place(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    running = await start_extender()
    body = permit_batch("node-a", uid="u-1", current=1, requested=3)
    response = await running.permits.post("/v1/permits", json=body, headers=AUTH)
    assert (await response.json())["permits"][0]["status"] == "granted"
    recorder = running.extender.recorder
    assert recorder is not None
    await recorder.wait_idle()
    assert _annotations(kube_api)["vm-autoscaling.io/permitted-vcpus"] == "3"
    assert _annotations(kube_api)["vm-autoscaling.io/permitted-memory"] == "1Gi"
    assert _cpu(kube_api) == "3"


async def test_writes_are_coalesced_latest_wins(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    running = await start_extender(
        make_config(durability={"retry_initial_seconds": 0.2, "retry_max_seconds": 0.2})
    )
    recorder = running.extender.recorder
    assert recorder is not None
    # The first write fails and backs off; the permits granted meanwhile replace it.
    kube_api.fail_next(503, method="PATCH", path=POD)
    for current, requested in ((1, 2), (2, 3), (3, 4), (4, 5)):
        body = permit_batch("node-a", uid="u-1", current=current, requested=requested)
        response = await running.permits.post("/v1/permits", json=body, headers=AUTH)
        assert response.status == 200
    await recorder.wait_idle()
    assert _annotations(kube_api)["vm-autoscaling.io/permitted-vcpus"] == "5"
    assert _cpu(kube_api) == "5"
    patches = [r for r in kube_api.requests if r.method == "PATCH" and r.path == POD]
    assert len(patches) <= 3  # the failed one, perhaps one in flight, the latest


async def test_resize_not_supported_is_remembered(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    # A cluster without in-place resize: annotations still written, resize tried only once.
    kube_api.is_resize_supported = False
    _cluster(kube_api)
    running = await start_extender()
    recorder = running.extender.recorder
    assert recorder is not None
    for current, requested in ((1, 2), (2, 3)):
        body = permit_batch("node-a", uid="u-1", current=current, requested=requested)
        assert (await running.permits.post("/v1/permits", json=body, headers=AUTH)).status == 200
        await recorder.wait_idle()
    assert _annotations(kube_api)["vm-autoscaling.io/permitted-vcpus"] == "3"
    assert _cpu(kube_api) == "1"
    assert len([r for r in kube_api.requests if r.path == POD + "/resize"]) == 1


async def test_restart_rebuilds_the_same_state(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    _cluster(kube_api)
    kube_api.add_pod(vm_pod("vm-2", uid="u-2", node="node-a", min_vcpus=2))
    first = await start_extender()

    async def report(running: Running, uid: str, name: str, vcpus: int) -> None:
        # What an agent sends when it sees a new extender epoch: steady, with its last permit.
        body = permit_batch(
            "node-a", uid=uid, name=name, current=vcpus, requested=vcpus, last_permit=vcpus
        )
        assert (await running.permits.post("/v1/permits", json=body, headers=AUTH)).status == 200

    # Both VMs were bound before this extender started: until their agents report, they may
    # run up to their maximum, and that room is kept free.
    await report(first, "u-1", "vm-1", 1)
    await report(first, "u-2", "vm-2", 2)
    for uid, name, current, requested in (("u-1", "vm-1", 1, 4), ("u-2", "vm-2", 2, 3)):
        body = permit_batch("node-a", uid=uid, name=name, current=current, requested=requested)
        assert (await first.permits.post("/v1/permits", json=body, headers=AUTH)).status == 200
    assert first.extender.recorder is not None
    await first.extender.recorder.wait_idle()
    # The first extender sees its own writes come back through the watch.
    ledger = first.extender.ledger
    await wait_until(lambda: ledger.pods["u-1"].requests.cpu_millis == 4000)
    before = await first.state()
    second = await start_extender()
    rebuilt = await second.state()
    # The same holds, each marked unverified (with its room up to its maximum kept free)
    # until its agent reports.
    rebuilt_allocations = [dict(a) for n in rebuilt["nodes"] for a in n["allocations"]]
    assert all(a.pop("unverified") for a in rebuilt_allocations)
    assert rebuilt_allocations == [a for n in before["nodes"] for a in n["allocations"]]
    await report(second, "u-1", "vm-1", 4)
    await report(second, "u-2", "vm-2", 2)
    assert await second.state() == before
    # 6400m usable: vm-1 got 4, vm-2 stayed at 2 (3 would not fit).
    assert before["nodes"][0]["allocated"]["cpuMillis"] == 6000


async def test_memory_is_recorded_and_resized_in_place_both_ways(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """A VM whose memory scales: the container's memory request and limit follow the permit
    up and down with the annotation; a restart rebuilds the same memory holds."""
    gib = 2**30
    kube_api.add_node(node_object("node-a", cpu="8", memory="16Gi"))
    memory = {
        "vm-autoscaling.io/min-memory": "1Gi",
        "vm-autoscaling.io/max-memory": "8Gi",
        "vm-autoscaling.io/memory-unit": "512Mi",
    }
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", extra=memory))
    first = await start_extender()

    async def ask(
        current: int, requested: int, last: int, *, on: Running | None = None
    ) -> dict[str, object]:
        return await _ask_and_record(on or first, current, requested, last)

    def container_memory() -> str:
        return _container_memory(kube_api)

    await ask(gib, gib, gib)
    assert (await ask(gib, 5 * gib, gib))["permit"] == {"vcpus": 1, "memoryBytes": 5 * gib}
    assert _annotations(kube_api)["vm-autoscaling.io/permitted-memory"] == "5Gi"
    assert container_memory() == "5Gi"
    assert _cpu(kube_api) == "1"
    # The guest gave back down to 2.5Gi: the record and the container follow that.
    permit = await ask(5 * gib, 5 * gib // 2, 5 * gib)
    assert permit["status"] == "released"
    assert _annotations(kube_api)["vm-autoscaling.io/permitted-memory"] == "2560Mi"
    assert container_memory() == "2560Mi"
    ledger = first.extender.ledger
    await wait_until(lambda: ledger.pods["u-1"].requests.memory_bytes == 5 * gib // 2)
    before = await first.state()
    second = await start_extender()
    rebuilt = await second.state()
    (entry,) = rebuilt["nodes"][0]["allocations"]
    assert entry["resources"]["memoryBytes"] == 5 * gib // 2
    assert entry["unverified"]["uncertain"]["memoryBytes"] == 8 * gib - 5 * gib // 2
    await ask(5 * gib // 2, 5 * gib // 2, 5 * gib // 2, on=second)
    assert await second.state() == before


async def test_a_resized_vm_container_keeps_its_memory_above_the_guests(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    """The container was written 512Mi above the guest's minimum (QEMU's own memory): every
    resize keeps that, the record says so, and a restart holds the same."""
    gib, mib = 2**30, 2**20
    kube_api.add_node(node_object("node-a", cpu="8", memory="16Gi"))
    memory = {
        "vm-autoscaling.io/min-memory": "1Gi",
        "vm-autoscaling.io/max-memory": "8Gi",
        "vm-autoscaling.io/memory-unit": "512Mi",
    }
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", extra=memory, memory="1536Mi"))
    first = await start_extender()

    async def ask(current: int, requested: int, last: int) -> dict[str, object]:
        return await _ask_and_record(first, current, requested, last)

    def container_memory() -> str:
        return _container_memory(kube_api)

    await ask(gib, gib, gib)
    assert (await ask(gib, 5 * gib, gib))["permit"] == {"vcpus": 1, "memoryBytes": 5 * gib}
    assert _annotations(kube_api)["vm-autoscaling.io/permitted-memory"] == "5Gi"
    assert _annotations(kube_api)["vm-autoscaling.io/memory-overhead"] == "512Mi"
    assert container_memory() == "5632Mi"
    ledger = first.extender.ledger
    assert ledger.pods["u-1"].held.memory_bytes == 5 * gib + 512 * mib
    await ask(5 * gib, 5 * gib // 2, 5 * gib)
    assert container_memory() == "3Gi"
    await wait_until(lambda: ledger.pods["u-1"].requests.memory_bytes == 3 * gib)
    assert ledger.pods["u-1"].held.memory_bytes == 3 * gib
    second = await start_extender()
    assert second.extender.ledger.pods["u-1"].held.memory_bytes == 3 * gib
    assert second.extender.ledger.pods["u-1"].memory_bytes == 5 * gib // 2


async def _ask_and_record(
    running: Running, current: int, requested: int, last: int
) -> dict[str, object]:
    """One memory permit through the permit port, once its durable write has landed."""
    permit = await ask_memory(
        running.permits, AUTH, current=current, requested=requested, last=last
    )
    assert running.extender.recorder is not None
    await running.extender.recorder.wait_idle()
    return permit


def _container_memory(kube_api: FakeKubeApi) -> str:
    """The VM container's memory (request and limit move together)."""
    resources = kube_api.get_pod("vms", "vm-1")["spec"]["containers"][0]["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    found: str = resources["requests"]["memory"]
    return found
