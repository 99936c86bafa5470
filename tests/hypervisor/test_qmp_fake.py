"""QmpClient against a scripted QMP server: handshake, id routing, events, timeouts, reconnect."""

from __future__ import annotations

import pytest

from autoscaler_agent.hypervisor.base import MemoryState, VcpuState
from autoscaler_agent.hypervisor.errors import (
    HypervisorUnavailable,
    MemoryResizeIncomplete,
    QmpCommandFailed,
    ResizeRejected,
    UnplugNotCompleted,
)
from autoscaler_agent.hypervisor.qmp import QmpClient
from tests.hypervisor.fake_qmp import FakeQmp

BOOT = "/machine/unattached/device[0]"
HOT1 = "/machine/peripheral/vcpu-s0-c1-t0"
HOT2 = "/machine/peripheral/vcpu-s0-c2-t0"
CPU_TYPE = "qemu64-x86_64-cpu"


def cpus(*paths):
    return [
        {
            "cpu-index": i,
            "qom-path": p,
            "thread-id": 100 + i,
            "target": "x86_64",
            "props": {"socket-id": 0, "core-id": i, "thread-id": 0},
        }
        for i, p in enumerate(paths)
    ]


def slots(*paths):
    """Four slots on socket 0; ``paths[i]`` occupies core i (None: free)."""
    out = []
    for core in range(3, -1, -1):  # QEMU lists the highest first
        slot = {
            "props": {"core-id": core, "thread-id": 0, "socket-id": 0},
            "vcpus-count": 1,
            "type": CPU_TYPE,
        }
        if core < len(paths) and paths[core] is not None:
            slot["qom-path"] = paths[core]
        out.append(slot)
    return out


def ret(value):
    return [{"return": value}]


def event(name, **data):
    return {"event": name, "data": data, "timestamp": {"seconds": 1, "microseconds": 0}}


@pytest.fixture
async def qmp(sock_dir):
    fake = FakeQmp()
    async with fake.serve(sock_dir / "qmp.sock") as path:
        client = QmpClient(path, command_timeout_seconds=1, unplug_timeout_seconds=0.3)
        yield fake, client
        await client.close()


async def test_handshake_then_vcpus_with_an_event_interleaved(qmp):
    fake, client = qmp
    fake.script["query-cpus-fast"] = [[event("RTC_CHANGE", offset=0), {"return": cpus(BOOT, HOT1)}]]
    fake.script["query-hotpluggable-cpus"] = [ret(slots(BOOT, HOT1))]
    with client.subscribe() as events:
        assert await client.vcpus() == VcpuState(current=2, max=4)
        assert events.get_nowait().name == "RTC_CHANGE"
    assert fake.commands() == ["qmp_capabilities", "query-cpus-fast", "query-hotpluggable-cpus"]
    assert [r["id"] for r in fake.received] == ["1", "2", "3"]


async def test_grow_plugs_the_lowest_free_slots_with_their_props(qmp):
    fake, client = qmp
    fake.script["query-cpus-fast"] = [ret(cpus(BOOT)), ret(cpus(BOOT, HOT1, HOT2))]
    fake.script["query-hotpluggable-cpus"] = [
        ret(slots(BOOT)),
        ret(slots(BOOT)),
        ret(slots(BOOT, HOT1, HOT2)),
    ]
    assert await client.resize(3) == VcpuState(current=3, max=4)
    adds = [r["arguments"] for r in fake.received if r["execute"] == "device_add"]
    assert adds == [
        {"driver": CPU_TYPE, "id": "vcpu-s0-c1-t0", "socket-id": 0, "core-id": 1, "thread-id": 0},
        {"driver": CPU_TYPE, "id": "vcpu-s0-c2-t0", "socket-id": 0, "core-id": 2, "thread-id": 0},
    ]


async def test_device_add_error_is_rejected_with_qemus_text(qmp):
    fake, client = qmp
    fake.script["query-cpus-fast"] = [ret(cpus(BOOT))]
    fake.script["query-hotpluggable-cpus"] = [ret(slots(BOOT))]
    fake.script["device_add"] = [[{"error": {"class": "GenericError", "desc": "no more room"}}]]
    with pytest.raises(ResizeRejected, match="refused to plug vCPU vcpu-s0-c1-t0") as info:
        await client.resize(2)
    assert info.value.detail == "no more room"
    assert "(1 of 2 vCPUs in effect)" in str(info.value)


# What QEMU 7.2 sent when the minimal guest ejected a vCPU (probed by hand): no DEVICE_DELETED
# for the vCPU itself, only for its lapic child.
QEMU_7_2_EJECT = [
    event("ACPI_DEVICE_OST", info={"device": "vcpu-s0-c2-t0", "source": 3, "status": 132}),
    event("DEVICE_DELETED", path=HOT2 + "/lapic"),
    event("ACPI_DEVICE_OST", info={"source": 3, "status": 0, "slot": "2", "slot-type": "CPU"}),
]
DEVICE_EVENT = [
    event("ACPI_DEVICE_OST", info={"source": 3, "status": 0}),
    event("DEVICE_DELETED", device="vcpu-s0-c2-t0", path=HOT2),
]


@pytest.mark.parametrize(
    ("event_first", "deleted"),
    [(False, DEVICE_EVENT), (True, DEVICE_EVENT), (False, QEMU_7_2_EJECT)],
    ids=["reply-then-event", "event-then-reply", "qemu-7.2-child-path-only"],
)
async def test_shrink_waits_for_device_deleted(qmp, event_first, deleted):
    fake, client = qmp
    fake.script["query-cpus-fast"] = [ret(cpus(BOOT, HOT1, HOT2)), ret(cpus(BOOT, HOT1))]
    fake.script["query-hotpluggable-cpus"] = [
        ret(slots(BOOT, HOT1, HOT2)),
        ret(slots(BOOT, HOT1, HOT2)),
        ret(slots(BOOT, HOT1)),
    ]
    fake.script["device_del"] = [deleted + ret({}) if event_first else ret({}) + deleted]
    assert await client.resize(2) == VcpuState(current=2, max=4)
    dels = [r["arguments"] for r in fake.received if r["execute"] == "device_del"]
    assert dels == [{"id": HOT2}]  # the highest hot-plugged vCPU, never the boot one


async def test_shrink_without_the_guest_releasing_times_out(qmp):
    fake, client = qmp
    fake.script["query-cpus-fast"] = [ret(cpus(BOOT, HOT1, HOT2))]
    fake.script["query-hotpluggable-cpus"] = [ret(slots(BOOT, HOT1, HOT2))]
    with pytest.raises(UnplugNotCompleted) as info:
        await client.resize(1)
    assert info.value.state == VcpuState(current=3, max=4)
    assert info.value.vcpus_in_effect == 3
    assert "the guest did not release 2 vCPU(s) within 0.3 s; 3 vCPUs are in effect" in str(
        info.value
    )
    assert not info.value.is_retryable


async def test_shrink_below_the_boot_vcpus_is_rejected_without_device_del(qmp):
    fake, client = qmp
    fake.script["query-cpus-fast"] = [ret(cpus(BOOT, "/machine/unattached/device[1]"))]
    fake.script["query-hotpluggable-cpus"] = [ret(slots(BOOT, "/machine/unattached/device[1]"))]
    with pytest.raises(ResizeRejected, match="boot vCPUs cannot be removed"):
        await client.resize(1)
    assert "device_del" not in fake.commands()


async def test_unanswered_command_times_out_as_unavailable(qmp):
    fake, client = qmp
    fake.silent.add("query-cpus-fast")
    with pytest.raises(HypervisorUnavailable, match="query-cpus-fast got no reply within 1 s"):
        await client.vcpus()


async def test_closed_socket_fails_the_pending_command_then_reconnects(qmp):
    fake, client = qmp
    fake.close_after = 2  # qmp_capabilities, query-cpus-fast, then hang up
    fake.script["query-cpus-fast"] = [ret(cpus(BOOT))]
    fake.script["query-hotpluggable-cpus"] = [ret(slots(BOOT))]
    with pytest.raises(HypervisorUnavailable):
        await client.vcpus()
    fake.close_after = None
    assert await client.vcpus() == VcpuState(current=1, max=4)
    assert fake.connections == 2
    assert fake.commands().count("qmp_capabilities") == 2


async def test_command_error_carries_class_and_desc(qmp):
    fake, client = qmp
    fake.script["query-status"] = [[{"error": {"class": "CommandNotFound", "desc": "nope"}}]]
    with pytest.raises(QmpCommandFailed) as info:
        await client.execute("query-status")
    assert (info.value.error_class, info.value.desc) == ("CommandNotFound", "nope")


async def test_missing_socket_is_unavailable(sock_dir):
    client = QmpClient(sock_dir / "absent.sock")
    with pytest.raises(HypervisorUnavailable, match="is unreachable") as info:
        await client.vcpus()
    assert info.value.is_retryable
    await client.close()


MIB = 2**20


def vmem(size, requested, *, max_size=1024 * MIB):
    """query-memory-devices as QEMU 7.2 answers it (seen in test_qmp_qemu and a booted guest)."""
    return [
        {
            "type": "virtio-mem",
            "data": {
                "memdev": "/objects/vmem0-ram",
                "memaddr": 4294967296,
                "block-size": 2 * MIB,
                "size": size,
                "node": 0,
                "max-size": max_size,
                "requested-size": requested,
                "id": "vmem0",
            },
        }
    ]


def memory_script(fake, *, size, sizes_after):
    fake.script["query-memory-size-summary"] = [
        ret({"base-memory": 512 * MIB, "plugged-memory": size})
    ]
    fake.script["query-memory-devices"] = [ret(vmem(size, size))]
    fake.script["qom-get"] = [ret(s) for s in sizes_after]


def qom_sets(fake):
    return [r["arguments"]["value"] for r in fake.received if r["execute"] == "qom-set"]


async def test_memory_grow_sets_requested_size_and_waits_for_the_guest(qmp):
    fake, client = qmp
    client.memory_stall_seconds = 1.0
    memory_script(fake, size=0, sizes_after=[0, 128 * MIB, 384 * MIB, 512 * MIB])
    after = await client.resize_memory(1024 * MIB)
    assert after == MemoryState(current=1024 * MIB, min=512 * MIB, max=1536 * MIB, block=2 * MIB)
    assert qom_sets(fake) == [512 * MIB]
    set_request = next(r for r in fake.received if r["execute"] == "qom-set")
    assert set_request["arguments"]["path"] == "/machine/peripheral/vmem0"
    assert set_request["arguments"]["property"] == "requested-size"


async def test_memory_shrink_the_guest_cannot_finish_ends_at_what_it_gave_back(qmp):
    fake, client = qmp
    client.memory_stall_seconds = 0.2
    memory_script(fake, size=1024 * MIB, sizes_after=[896 * MIB, 768 * MIB, 768 * MIB])
    with pytest.raises(MemoryResizeIncomplete, match="stopped at") as info:
        await client.resize_memory(512 * MIB)
    assert info.value.state.current == 512 * MIB + 768 * MIB
    # The device is pinned at the size reached, so the guest stops trying and stays there.
    assert qom_sets(fake) == [0, 768 * MIB]
    assert not MemoryResizeIncomplete.is_retryable


async def test_memory_without_a_virtio_mem_device_is_fixed_and_cannot_resize(qmp):
    fake, client = qmp
    fake.script["query-memory-size-summary"] = [ret({"base-memory": 512 * MIB})]
    fake.script["query-memory-devices"] = [ret([])]
    state = await client.memory()
    assert state == MemoryState(current=512 * MIB, min=512 * MIB, max=512 * MIB, block=0)
    assert await client.resize_memory(512 * MIB) == state
    with pytest.raises(ResizeRejected, match="no virtio-mem device"):
        await client.resize_memory(1024 * MIB)
    assert "qom-set" not in fake.commands()


async def test_memory_qom_set_error_is_a_rejected_resize(qmp):
    fake, client = qmp
    memory_script(fake, size=0, sizes_after=[0])
    fake.script["qom-set"] = [
        [
            {
                "error": {
                    "class": "GenericError",
                    "desc": "'requested-size' cannot exceed the memory backend size",
                }
            }
        ]
    ]
    with pytest.raises(ResizeRejected, match="cannot exceed"):
        await client.resize_memory(1024 * MIB)
