"""QmpClient against a scripted QMP server: handshake, id routing, events, timeouts, reconnect."""

from __future__ import annotations

import pytest

from autoscaler_agent.hypervisor.base import VcpuState
from autoscaler_agent.hypervisor.errors import (
    HypervisorUnavailable,
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
