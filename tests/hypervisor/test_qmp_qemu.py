"""QmpClient against a real QEMU (no guest OS: hot-plug works, unplug cannot complete)."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from autoscaler_agent.hypervisor.base import MemoryState, VcpuState
from autoscaler_agent.hypervisor.errors import (
    MemoryResizeIncomplete,
    ResizeRejected,
    UnplugNotCompleted,
)
from autoscaler_agent.hypervisor.qmp import QmpClient
from tests.support import require_binary

pytestmark = pytest.mark.qemu


def _spawn_qemu(sock, *machine):
    qemu = require_binary("qemu-system-x86_64")
    return subprocess.Popen(
        [qemu, "-machine", "q35,accel=tcg", "-nodefaults", "-display", "none", *machine,
         "-qmp", f"unix:{sock},server=on,wait=off"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def _stop(proc):
    proc.kill()
    proc.wait(timeout=10)
    proc.stderr.close()


@pytest.fixture
def qemu_socket(sock_dir):
    sock = sock_dir / "qmp.sock"
    proc = _spawn_qemu(sock, "-m", "128", "-smp", "1,maxcpus=4")
    try:
        yield sock, proc
    finally:
        _stop(proc)


@pytest.fixture
async def client(qemu_socket):
    async for c in _connected(qemu_socket):
        yield c


async def _connected(qemu_socket):
    sock, proc = qemu_socket
    # The socket file appears at bind(), a moment before QEMU listens: on a loaded machine a
    # connect in between is refused. Wait until a connection is accepted (QEMU then serves
    # the next client once this probe hangs up).
    for _ in range(200):
        if proc.poll() is not None:
            break
        try:
            _, writer = await asyncio.open_unix_connection(sock)
        except (FileNotFoundError, ConnectionRefusedError):
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        break
    assert proc.poll() is None, "QEMU exited at start"
    # A bound against a hang, not a measure: QEMU's main loop, on a machine busy with other
    # tests, once took over 5 s to greet the client after the probe hung up.
    c = QmpClient(sock, command_timeout_seconds=30, unplug_timeout_seconds=1)
    yield c
    await c.close()


async def test_grow_to_three_then_shrink_without_a_guest(client):
    assert await client.vcpus() == VcpuState(current=1, max=4)

    assert await client.resize(3) == VcpuState(current=3, max=4)
    slots = json.loads(await client.execute("query-hotpluggable-cpus"))
    occupied = {s["props"]["core-id"]: s.get("qom-path") for s in slots}
    assert occupied == {
        0: "/machine/unattached/device[0]",
        1: "/machine/peripheral/vcpu-s0-c1-t0",
        2: "/machine/peripheral/vcpu-s0-c2-t0",
        3: None,
    }

    with pytest.raises(ResizeRejected, match="maxcpus=4"):
        await client.resize(5)

    with pytest.raises(UnplugNotCompleted) as info:
        await client.resize(2)
    assert info.value.state == VcpuState(current=3, max=4)
    assert "a running guest must release the vCPU" in str(info.value)
    assert "acpi: device unplug request for not supported device type" in info.value.detail
    assert await client.vcpus() == VcpuState(current=3, max=4)


async def test_reconnects_after_the_connection_drops(client):
    assert await client.vcpus() == VcpuState(current=1, max=4)
    await client.close()  # QEMU serves one QMP client at a time; a new one must handshake again
    assert await client.resize(2) == VcpuState(current=2, max=4)


MIB = 2**20


@pytest.fixture
def qemu_vmem_socket(sock_dir):
    """QEMU with a virtio-mem device as vm_runner starts it (no guest: nothing gets plugged)."""
    sock = sock_dir / "qmp.sock"
    proc = _spawn_qemu(
        sock, "-m", "128M,maxmem=384M", "-object", "memory-backend-ram,id=vmem0-ram,size=256M",
        "-device", "virtio-mem-pci,id=vmem0,memdev=vmem0-ram,block-size=2M,requested-size=0",
    )  # fmt: skip
    try:
        yield sock, proc
    finally:
        _stop(proc)


@pytest.fixture
async def vmem_client(qemu_vmem_socket):
    async for c in _connected(qemu_vmem_socket):
        c.memory_stall_seconds = 0.5
        yield c


async def test_memory_of_a_virtio_mem_vm_and_a_grow_no_guest_plugs(vmem_client):
    client = vmem_client
    state = await client.memory()
    assert state == MemoryState(current=128 * MIB, min=128 * MIB, max=384 * MIB, block=2 * MIB)

    with pytest.raises(ResizeRejected, match="outside"):
        await client.resize_memory(512 * MIB)
    with pytest.raises(ResizeRejected, match="whole 2097152-byte blocks"):
        await client.resize_memory(129 * MIB)

    # No guest driver: the requested size is set, nothing is plugged, the wait stalls and the
    # device is pinned back at what is really there.
    with pytest.raises(MemoryResizeIncomplete) as info:
        await client.resize_memory(256 * MIB)
    assert info.value.state.current == 128 * MIB
    devices = json.loads(await client.execute("query-memory-devices"))
    assert devices[0]["data"]["requested-size"] == 0
    assert devices[0]["data"]["size"] == 0
