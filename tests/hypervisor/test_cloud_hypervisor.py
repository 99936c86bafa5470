"""CloudHypervisorClient against the emulator, over a real unix socket."""

from __future__ import annotations

import json

import aiohttp
import pytest

from autoscaler_agent.hypervisor import ch_api
from autoscaler_agent.hypervisor.base import MemoryState, VcpuState
from autoscaler_agent.hypervisor.cloud_hypervisor import CloudHypervisorClient
from autoscaler_agent.hypervisor.errors import (
    HypervisorUnavailable,
    ResizeInProgress,
    ResizeRejected,
    VmNotFound,
)

FORMATS = pytest.mark.parametrize("error_format", ["v47", "text"])


@pytest.fixture
async def client(ch_socket):
    c = CloudHypervisorClient(ch_socket, timeout_seconds=2)
    yield c
    await c.close()


def emulator_view(emulator):
    cpus = emulator.vm_info()["config"]["cpus"]
    return VcpuState(current=cpus["boot_vcpus"], max=cpus["max_vcpus"])


async def test_reads_vcpus_from_vm_info(client, emulator):
    assert await client.vcpus() == VcpuState(current=2, max=4)
    assert emulator.requests == [("GET", "/api/v1/vm.info", b"")]


@pytest.mark.parametrize("target", [4, 1], ids=["grow", "shrink"])
async def test_resize_puts_desired_vcpus_and_returns_the_new_view(client, emulator, target):
    assert await client.resize(target) == VcpuState(current=target, max=4)
    assert emulator.boot_vcpus == target
    puts = [json.loads(body) for method, _, body in emulator.requests if method == "PUT"]
    assert puts == [{"desired_vcpus": target}]


async def test_resize_to_current_count_sends_nothing(client, emulator):
    assert await client.resize(2) == VcpuState(current=2, max=4)
    assert [m for m, _, _ in emulator.requests] == ["GET"]


@pytest.mark.parametrize("target", [0, -1, 5], ids=["zero", "negative", "above-max"])
async def test_out_of_range_is_rejected_without_a_resize_call(client, emulator, target):
    with pytest.raises(ResizeRejected, match=f"cannot resize to {target} vCPUs"):
        await client.resize(target)
    assert all(method == "GET" for method, _, _ in emulator.requests)
    assert emulator.boot_vcpus == 2


@FORMATS
async def test_no_vm_created_is_vm_not_found(client, emulator, error_format):
    emulator.is_created = False
    emulator.error_format = error_format
    with pytest.raises(VmNotFound) as info:
        await client.vcpus()
    assert str(info.value) == (
        "cloud-hypervisor vm.info answered 404 (no VM created): "
        "Error from API: The VM is not created"
    )
    assert not info.value.is_retryable


@FORMATS
async def test_pending_removal_is_resize_in_progress_then_succeeds(client, emulator, error_format):
    emulator.error_format = error_format
    emulator.busy_resizes_after_shrink = 1
    assert await client.resize(1) == VcpuState(current=1, max=4)
    with pytest.raises(ResizeInProgress) as info:
        await client.resize(3)
    assert info.value.is_retryable
    assert "answered 429" in str(info.value)
    assert info.value.detail == (
        "Error from API: The VM could not be resized: Error resizing VM: CPU manager error: "
        "Removal of vCPU is still pending"
    )
    assert await client.vcpus() == emulator_view(emulator) == VcpuState(current=1, max=4)
    assert await client.resize(3) == VcpuState(current=3, max=4)


@FORMATS
async def test_500_above_the_vmm_ceiling_is_rejected(client, emulator, error_format):
    emulator.error_format = error_format
    emulator.resize_max_vcpus = 3  # vm.info still says 4
    with pytest.raises(ResizeRejected) as info:
        await client.resize(4)
    assert str(info.value).startswith("cloud-hypervisor vm.resize answered 500: Error from API")
    assert info.value.detail.endswith("Desired vCPUs 4 is outside 1..3")
    assert await client.vcpus() == emulator_view(emulator) == VcpuState(current=2, max=4)


@FORMATS
async def test_emulator_answers_a_bad_body_with_400_which_maps_to_rejected(
    ch_socket, emulator, error_format
):
    emulator.error_format = error_format
    connector = aiohttp.UnixConnector(path=str(ch_socket))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.put("http://localhost/api/v1/vm.resize", data=b'{"desired_vcpus": "two"}') as r,
    ):
        status, body = r.status, await r.read()
    assert status == 400
    if error_format == "v47":
        assert json.loads(body)[0] == "Error from API"
    error = ch_api.error_for_status(status, body, operation="vm.resize")
    assert isinstance(error, ResizeRejected)
    assert "Failed to parse request body: invalid value for desired_vcpus: 'two'" in str(error)
    assert emulator.boot_vcpus == 2


async def test_emulator_pings(ch_socket):
    connector = aiohttp.UnixConnector(path=str(ch_socket))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get("http://localhost/api/v1/vmm.ping") as r,
    ):
        assert r.status == 200
        assert (await r.json())["version"].startswith("v")


async def test_missing_socket_is_unavailable_and_retryable(sock_dir):
    client = CloudHypervisorClient(sock_dir / "absent.sock")
    try:
        with pytest.raises(HypervisorUnavailable, match=r"absent\.sock is unreachable") as info:
            await client.resize(2)
        assert info.value.is_retryable
    finally:
        await client.close()


async def test_slow_vmm_times_out_as_unavailable(ch_socket, emulator):
    emulator.delay_seconds = 1.0
    client = CloudHypervisorClient(ch_socket, timeout_seconds=0.1)
    try:
        with pytest.raises(HypervisorUnavailable, match=r"did not answer within 0\.1 s"):
            await client.vcpus()
    finally:
        await client.close()


MIB = 2**20


async def test_reads_memory_from_vm_info_config(client, emulator):
    emulator.hotplugged_size = 256 * MIB
    assert await client.memory() == MemoryState(
        current=768 * MIB, min=512 * MIB, max=1536 * MIB, block=2 * MIB
    )


@pytest.mark.parametrize(
    ("start", "target"), [(None, 1024 * MIB), (512 * MIB, 512 * MIB)], ids=["grow", "shrink"]
)
async def test_resize_memory_puts_desired_ram_the_whole_size(client, emulator, start, target):
    emulator.hotplugged_size = start
    after = await client.resize_memory(target)
    assert after.current == target
    puts = [json.loads(body) for method, _, body in emulator.requests if method == "PUT"]
    assert puts == [{"desired_ram": target}]
    assert emulator.vm_info()["config"]["memory"]["hotplugged_size"] == (target - 512 * MIB or None)


@pytest.mark.parametrize(
    "target", [256 * MIB, 2048 * MIB, 512 * MIB + 1], ids=["below-boot", "above-max", "not-blocks"]
)
async def test_memory_out_of_range_is_rejected_without_a_resize_call(client, emulator, target):
    with pytest.raises(ResizeRejected, match=f"cannot resize memory to {target} bytes"):
        await client.resize_memory(target)
    assert all(method == "GET" for method, _, _ in emulator.requests)


async def test_memory_resize_refused_by_the_vmm_is_rejected(client, emulator):
    # The VMM enforces less room than vm.info shows: the 500 path.
    emulator.resize_hotplug_size = 128 * MIB
    with pytest.raises(ResizeRejected, match="Invalid amount of memory"):
        await client.resize_memory(768 * MIB)
    assert emulator.hotplugged_size is None
