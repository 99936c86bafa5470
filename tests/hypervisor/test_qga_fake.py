"""QgaClient and QgaVcpuHypervisor against a fake qemu-guest-agent on a real unix socket:
resynchronising, timeouts, garbage, reconnects, a guest that changes fewer vCPUs than asked,
and memory still going through QMP."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler_agent.hypervisor.base import MemoryState, VcpuState
from autoscaler_agent.hypervisor.errors import (
    HypervisorUnavailable,
    QgaCommandFailed,
    ResizeRejected,
    UnexpectedResponse,
    VcpuResizeIncomplete,
)
from autoscaler_agent.hypervisor.factory import hypervisor_from_url
from autoscaler_agent.hypervisor.qga import (
    GuestLogicalProcessor,
    QgaClient,
    QgaVcpuHypervisor,
    plan_online,
)
from autoscaler_agent.hypervisor.qmp import QmpClient
from tests.hypervisor.fake_qga import FakeQga
from tests.hypervisor.fake_qmp import FakeQmp

TIMEOUT = 0.5  # seconds; every wait below is bounded by it, none is asserted on


@pytest.fixture
async def qga(sock_dir):
    fake = FakeQga()
    async with fake.serve(sock_dir / "vm.qga.sock") as path:
        client = QgaClient(path, command_timeout_seconds=TIMEOUT, set_vcpus_timeout_seconds=TIMEOUT)
        hv = QgaVcpuHypervisor(client, QmpClient(sock_dir / "absent-qmp.sock"))
        yield fake, hv
        await hv.close()


async def test_first_call_resynchronises_then_reads_online_and_present(qga):
    fake, hv = qga
    assert await hv.vcpus() == VcpuState(current=1, max=4)
    assert fake.commands() == ["guest-sync-delimited", "guest-get-vcpus"]
    assert await hv.vcpus() == VcpuState(current=1, max=4)
    assert fake.connections == 1  # one connection, synchronised once


async def test_stale_answers_and_noise_before_the_sync_are_skipped(qga):
    fake, hv = qga
    # What an earlier connection's late answers and a half-written line look like.
    fake.on_connect = [b'{"return": 3}\n', b'\xff{"return": 12345}\n', b"garbage\n"]
    assert await hv.vcpus() == VcpuState(current=1, max=4)


async def test_grow_onlines_the_lowest_offline_vcpus(qga):
    fake, hv = qga
    assert await hv.resize(3) == VcpuState(current=3, max=4)
    assert fake.online == {0: True, 1: True, 2: True, 3: False}
    (request,) = [r for r in fake.received if r["execute"] == "guest-set-vcpus"]
    assert request["arguments"]["vcpus"] == [
        {"logical-id": 1, "online": True},
        {"logical-id": 2, "online": True},
    ]


async def test_shrink_offlines_the_highest_online_vcpus(qga):
    fake, hv = qga
    fake.online = {0: True, 1: True, 2: False, 3: True}
    assert await hv.resize(2) == VcpuState(current=2, max=4)
    assert fake.online == {0: True, 1: True, 2: False, 3: False}


async def test_same_size_sends_no_change(qga):
    fake, hv = qga
    assert await hv.resize(1) == VcpuState(current=1, max=4)
    assert "guest-set-vcpus" not in fake.commands()


@pytest.mark.parametrize("vcpus", [0, 5], ids=["zero", "above-present"])
async def test_out_of_range_is_rejected_without_asking_the_guest(qga, vcpus):
    fake, hv = qga
    with pytest.raises(ResizeRejected):
        await hv.resize(vcpus)
    assert "guest-set-vcpus" not in fake.commands()
    assert fake.online_count == 1


async def test_guest_that_offlines_fewer_than_asked_reports_what_is_online(qga):
    fake, hv = qga
    fake.online = {0: True, 1: True, 2: True, 3: True}
    fake.refuse = {2}  # cpu3 goes, cpu2 cannot: the guest stops there (qemu-ga does)
    with pytest.raises(VcpuResizeIncomplete, match="changed 1 of 3 vCPUs") as info:
        await hv.resize(1)
    assert info.value.state == VcpuState(current=3, max=4)
    assert not info.value.is_retryable
    assert fake.online == {0: True, 1: True, 2: True, 3: False}


async def test_guest_refusing_the_first_change_is_incomplete_with_its_reason(qga):
    fake, hv = qga
    fake.refuse = {1}
    with pytest.raises(VcpuResizeIncomplete, match="Device busy") as info:
        await hv.resize(2)
    assert info.value.state == VcpuState(current=1, max=4)


async def test_unanswered_command_is_unavailable_then_a_new_connection_resyncs(qga):
    fake, hv = qga
    fake.silent.add("guest-get-vcpus")
    with pytest.raises(HypervisorUnavailable, match="guest-get-vcpus got no answer") as info:
        await hv.vcpus()
    assert info.value.is_retryable
    fake.silent.clear()
    assert await hv.vcpus() == VcpuState(current=1, max=4)
    assert fake.connections == 2
    assert fake.commands().count("guest-sync-delimited") == 2


async def test_late_answer_to_a_timed_out_resize_is_not_taken_for_the_next_one(qga):
    """The guest finishes a slow guest-set-vcpus after we gave up, and its answer (2) arrives
    on our next connection before the sync: it must be skipped, and the read must be the
    guest's real state."""
    fake, hv = qga
    fake.delays["guest-set-vcpus"] = TIMEOUT * 1.5
    with pytest.raises(HypervisorUnavailable, match="guest-set-vcpus got no answer"):
        await hv.resize(3)
    fake.delays.clear()
    assert await hv.vcpus() == VcpuState(current=3, max=4)
    assert fake.connections == 2


async def test_garbage_answer_is_unexpected_and_the_next_call_recovers(qga):
    fake, hv = qga
    fake.garbage.add("guest-get-vcpus")
    with pytest.raises(UnexpectedResponse, match="not a QGA reply"):
        await hv.vcpus()
    fake.garbage.clear()
    assert await hv.vcpus() == VcpuState(current=1, max=4)


async def test_guest_agent_not_running_is_unavailable(qga):
    fake, hv = qga
    fake.silent.add("guest-sync-delimited")  # booting, or no qemu-ga: nobody answers
    with pytest.raises(HypervisorUnavailable, match="did not answer guest-sync-delimited"):
        await hv.vcpus()


async def test_hang_up_mid_command_is_unavailable_then_reconnects(qga):
    fake, hv = qga
    fake.close_after = 1  # answers the sync, then hangs up
    fake.silent.add("guest-get-vcpus")
    with pytest.raises(HypervisorUnavailable):
        await hv.vcpus()
    fake.close_after = None
    fake.silent.clear()
    assert await hv.vcpus() == VcpuState(current=1, max=4)


async def test_command_error_carries_class_and_desc(qga):
    _, hv = qga
    with pytest.raises(QgaCommandFailed) as info:
        await hv.qga.execute("guest-exec")
    assert (info.value.error_class, info.value.desc) == ("CommandNotFound", "guest-exec not found")


@pytest.mark.parametrize(
    "answer",
    [[], [{"logical-id": 0, "online": True}] * 2, {"not": "a list"}],
    ids=["no-vcpu", "duplicate-id", "wrong-shape"],
)
async def test_implausible_vcpu_lists_are_unexpected(sock_dir, answer):
    fake = FakeQga()
    fake._answer = lambda command, arguments: (  # type: ignore[method-assign]
        (b"\xff", {"return": arguments["id"]})
        if command == "guest-sync-delimited"
        else (b"", {"return": answer})
    )
    async with fake.serve(sock_dir / "q.sock") as path:
        client = QgaClient(path, command_timeout_seconds=TIMEOUT)
        with pytest.raises(UnexpectedResponse, match="guest-get-vcpus"):
            await client.processors()
        await client.close()


async def test_missing_socket_is_unavailable(sock_dir):
    client = QgaClient(sock_dir / "absent.sock")
    with pytest.raises(HypervisorUnavailable, match="is unreachable"):
        await client.processors()
    await client.close()


async def test_qmp_qga_url_sets_vcpus_through_qga_and_reads_memory_through_qmp(sock_dir):
    """The factory's composition, both sockets real: vCPUs from the guest agent beside the QMP
    socket (the runner's default name), memory from QMP."""
    qmp, qga = FakeQmp(), FakeQga()
    qmp.script["query-memory-size-summary"] = [[{"return": {"base-memory": 512 * 2**20}}]]
    qmp.script["query-memory-devices"] = [[{"return": []}]]
    async with (
        qmp.serve(sock_dir / "vm.sock"),
        qga.serve(sock_dir / "vm.qga.sock"),
    ):
        hv = hypervisor_from_url("qmp+qga:///vm.sock", root=sock_dir, timeout_seconds=TIMEOUT)
        assert isinstance(hv, QgaVcpuHypervisor)
        try:
            assert await hv.resize(4) == VcpuState(current=4, max=4)
            assert await hv.memory() == MemoryState(
                current=512 * 2**20, min=512 * 2**20, max=512 * 2**20, block=0
            )
        finally:
            await hv.close()
    assert qga.online_count == 4
    assert "query-cpus-fast" not in qmp.commands()  # vCPUs never went to QMP
    assert "guest-set-vcpus" in qga.commands()
    assert json.dumps(qga.received[0]).startswith('{"execute": "guest-sync-delimited"')


# -- the plan, as a property -------------------------------------------------------------------

processors_strategy = st.lists(
    st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=16
).map(
    lambda flags: [
        # cpu0 is online and cannot be offlined, as on x86 Linux.
        GuestLogicalProcessor(logical_id=i, online=on or i == 0, can_offline=can and i != 0)
        for i, (on, can) in enumerate(flags)
    ]
)


@given(processors=processors_strategy, data=st.data())
def test_plan_reaches_the_target_or_offlines_all_it_can(processors, data):
    target = data.draw(st.integers(min_value=1, max_value=len(processors)))
    plan = plan_online(processors, target)
    by_id = {p.logical_id: p for p in processors}
    after = {p.logical_id: p.online for p in processors}
    for logical_id, online in plan:
        assert after[logical_id] != online, "a change that changes nothing"
        assert online or by_id[logical_id].can_offline, "offlining one the guest cannot"
        after[logical_id] = online
    online_now = sum(p.online for p in processors)
    removable = sum(p.online and p.can_offline for p in processors)
    expected = target if target >= online_now - removable else online_now - removable
    assert sum(after.values()) == expected
    # Grow onlines the lowest offline ids; shrink offlines the highest removable ones.
    ids = [i for i, _ in plan]
    assert ids == (sorted(ids) if target > online_now else sorted(ids, reverse=True))
