"""ChRemoteClient running the ch-remote stand-in against the emulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler_agent.hypervisor.base import VcpuState
from autoscaler_agent.hypervisor.ch_remote import ChRemoteClient
from autoscaler_agent.hypervisor.errors import (
    HypervisorUnavailable,
    ResizeInProgress,
    ResizeRejected,
    VmNotFound,
)

FAKE_CH_REMOTE = str(Path(__file__).parent.parent / "fakes" / "ch_remote.py")


@pytest.fixture
def client(ch_socket):
    return ChRemoteClient(ch_socket, binary=FAKE_CH_REMOTE, timeout_seconds=10)


async def test_reads_and_resizes(client, emulator):
    assert await client.vcpus() == VcpuState(current=2, max=4)
    assert await client.resize(3) == VcpuState(current=3, max=4)
    assert emulator.boot_vcpus == 3
    puts = [json.loads(body) for method, _, body in emulator.requests if method == "PUT"]
    assert puts == [{"desired_vcpus": 3}]


@pytest.mark.parametrize("target", [0, 5], ids=["zero", "above-max"])
async def test_out_of_range_never_runs_resize(client, emulator, target):
    with pytest.raises(ResizeRejected, match=f"cannot resize to {target} vCPUs"):
        await client.resize(target)
    assert all(method == "GET" for method, _, _ in emulator.requests)


@pytest.mark.parametrize("error_format", ["v47", "text"])
async def test_statuses_map_like_the_http_client(client, emulator, error_format):
    emulator.error_format = error_format
    emulator.busy_resizes_after_shrink = 1
    await client.resize(1)
    with pytest.raises(ResizeInProgress) as busy:
        await client.resize(2)
    assert busy.value.is_retryable
    assert busy.value.detail.endswith("Removal of vCPU is still pending")

    emulator.resize_max_vcpus = 3
    with pytest.raises(ResizeRejected, match="answered 500: Error from API") as rejected:
        await client.resize(4)
    assert rejected.value.detail.endswith("Desired vCPUs 4 is outside 1..3")
    assert await client.vcpus() == VcpuState(current=1, max=4)

    emulator.is_created = False
    with pytest.raises(VmNotFound, match=r"answered 404 .*The VM is not created"):
        await client.vcpus()


async def test_missing_socket_is_unavailable_with_the_cli_message(sock_dir):
    client = ChRemoteClient(sock_dir / "absent.sock", binary=FAKE_CH_REMOTE)
    with pytest.raises(HypervisorUnavailable, match="Error opening HTTP socket") as info:
        await client.vcpus()
    assert info.value.is_retryable


async def test_missing_binary_is_unavailable(ch_socket, sock_dir):
    client = ChRemoteClient(ch_socket, binary=str(sock_dir / "no-such-ch-remote"))
    with pytest.raises(HypervisorUnavailable, match=r"cannot run .*no-such-ch-remote"):
        await client.vcpus()


async def test_hung_cli_is_killed_at_the_timeout(ch_socket, emulator):
    emulator.delay_seconds = 2.0
    client = ChRemoteClient(ch_socket, binary=FAKE_CH_REMOTE, timeout_seconds=0.5)
    with pytest.raises(HypervisorUnavailable, match=r"info did not finish within 0\.5 s"):
        await client.vcpus()


async def test_resizes_memory_with_the_memory_flag(client, emulator):
    mib = 2**20
    after = await client.resize_memory(1024 * mib)
    assert (after.current, after.max) == (1024 * mib, 1536 * mib)
    puts = [json.loads(body) for method, _, body in emulator.requests if method == "PUT"]
    assert puts == [{"desired_ram": 1024 * mib}]
    assert (await client.resize_memory(512 * mib)).current == 512 * mib
