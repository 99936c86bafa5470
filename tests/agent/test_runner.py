"""The VM loops and their supervisor over real loopback HTTP (fake extender and metrics).

In loop time (looptime): every sleep and timeout of the agent's is virtual, so the tests take
milliseconds and what they assert of time is the agent's own schedule.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import msgspec
import pytest
import structlog
import structlog.testing

from autoscaler_agent.hypervisor import ResizeInProgress, ResizeRejected
from autoscaler_agent.runner import Supervisor, first_scrape_offset_seconds
from tests.agent.conftest import BATCH_WINDOW_SECONDS, CORE, NODE, eventually

pytestmark = pytest.mark.looptime


async def test_load_step_leads_to_a_permit_and_a_resize(world):
    target = world.vm("vm-1", current=2, load=0.5)
    hv = world.hypervisors[target.key]
    await world.supervisor.apply({target.key: target})
    await asyncio.sleep(0.25)  # a couple of quiet ticks: nothing to do at load 0.5 on 2 vCPUs
    assert hv.calls == []

    loop = asyncio.get_running_loop()
    stepped_at = loop.time()
    world.metrics_app.loads["vm-1"] = 5.0  # needs ceil(5 / 0.9) = 6
    await eventually(lambda: hv.current == 6)
    latency = hv.resized_at[-1][0] - stepped_at
    # Loop time (virtual): the agent's own schedule, not the host's speed. The first scrape
    # after the step decides, then one batching window to the permit, and the resize.
    assert latency <= CORE.scrape_interval_seconds + BATCH_WINDOW_SECONDS, latency
    assert hv.calls == [6]  # one step, not doubling
    assert world.extender.reserved["uid-vm-1"] == 6
    req = world.extender.batches[-1].requests[0]
    assert (req.current.vcpus, req.requested.vcpus, req.last_permit.vcpus) == (2, 6, 2)
    assert req.load.load1 == 5.0 and req.load.memory_used_fraction == 0.5
    await eventually(
        lambda: world.sample("vmautoscale_agent_vm_current_vcpus", ("vm", target.key)) == 6
    )
    assert world.sample("vmautoscale_agent_vm_permitted_vcpus", ("vm", target.key)) == 6


async def test_the_guests_load_and_the_vms_maximum_are_exported_until_it_leaves(world):
    """What the alert "at its maximum and still under pressure" compares (manifests/monitoring)."""
    target = world.vm("vm-1", current=2, max_vcpus=3, load=0.5)
    vm = ("vm", target.key)
    await world.supervisor.apply({target.key: target})
    await eventually(lambda: world.sample("vmautoscale_agent_vm_load1", vm) == 0.5)
    assert world.sample("vmautoscale_agent_vm_max_vcpus", vm) == 3
    world.metrics_app.loads["vm-1"] = 5.0  # wants 6, may have 3
    await eventually(lambda: world.sample("vmautoscale_agent_vm_current_vcpus", vm) == 3)
    await eventually(lambda: world.sample("vmautoscale_agent_vm_load1", vm) == 5.0)
    await world.supervisor.apply({})
    assert world.sample("vmautoscale_agent_vm_load1", vm) is None
    assert world.sample("vmautoscale_agent_vm_max_vcpus", vm) is None


async def test_vms_share_one_batch_and_a_full_node_gives_partial_and_denied(world):
    world.deps.stagger_scrapes = False  # in step, so that both ask in the same batch
    world.extender.capacity_vcpus = 8
    a = world.vm("a", current=2, load=0.5)
    b = world.vm("b", current=2, load=0.5)
    world.extender.reserved.update({"uid-a": 2, "uid-b": 2})
    await world.supervisor.apply({a.key: a, b.key: b})
    await asyncio.sleep(0.15)
    world.metrics_app.loads.update(a=5.0, b=5.0)  # both want 6: 4 more each, 4 free in total
    await eventually(lambda: sum(world.extender.reserved.values()) == 8)
    await eventually(
        lambda: world.hypervisors[a.key].current + world.hypervisors[b.key].current == 8
    )
    assert any(len(batch.requests) == 2 for batch in world.extender.batches)
    assert max(h.current for h in world.hypervisors.values()) <= 6
    denied = world.sample("vmautoscale_agent_permit_denials_total") or 0
    partial = world.sample("vmautoscale_agent_permit_partial_grants_total") or 0
    assert denied + partial >= 1


async def test_growth_resumes_after_the_extender_comes_back(world):
    target = world.vm("vm-1", current=2, load=5.0)
    hv = world.hypervisors[target.key]
    world.extender.fail_status = 503
    await world.supervisor.apply({target.key: target})
    await eventually(
        lambda: (
            (world.sample("vmautoscale_agent_extender_errors_total", ("kind", "unavailable")) or 0)
            >= 3
        )
    )
    assert hv.current == 2  # never above the last permit while it is down
    world.extender.fail_status = None
    await eventually(lambda: hv.current == 6)


async def test_shrink_resizes_then_gives_back(world):
    target = world.vm("vm-1", current=6, load=0.5, permitted=6)
    world.extender.reserved["uid-vm-1"] = 6
    hv = world.hypervisors[target.key]
    await world.supervisor.apply({target.key: target})
    await eventually(lambda: hv.current == 1)
    await eventually(lambda: world.extender.reserved["uid-vm-1"] == 1)
    notice = world.extender.batches[-1].requests[0]
    assert (notice.current.vcpus, notice.requested.vcpus) == (6, 1)


async def test_protocol_error_permit_is_rejected_and_counted(world):
    target = world.vm("vm-1", current=2, load=5.0)
    world.extender.override["uid-vm-1"] = 7  # more than the 6 asked for
    hv = world.hypervisors[target.key]
    await world.supervisor.apply({target.key: target})
    await eventually(
        lambda: (world.sample("vmautoscale_agent_permit_protocol_errors_total") or 0) >= 2
    )
    assert hv.calls == []
    del world.extender.override["uid-vm-1"]
    await eventually(lambda: hv.current == 6)


async def test_hypervisor_errors_reread_and_retry(world):
    target = world.vm("vm-1", current=2, load=5.0, permitted=6)
    hv = world.hypervisors[target.key]
    hv.errors = [ResizeInProgress("busy"), ResizeRejected("no")]
    await world.supervisor.apply({target.key: target})
    await eventually(lambda: hv.current == 6)
    assert hv.calls == [6, 6, 6]
    assert (
        world.sample("vmautoscale_agent_resizes_total", ("direction", "grow"), ("result", "error"))
        == 2
    )


async def test_malformed_metrics_keep_the_size_and_count(world):
    target = world.vm("vm-1", current=2, load=5.0)
    world.metrics_app.broken.add("vm-1")
    await world.supervisor.apply({target.key: target})
    await eventually(
        lambda: (
            (world.sample("vmautoscale_agent_scrape_errors_total", ("kind", "malformed")) or 0) >= 2
        )
    )
    assert world.hypervisors[target.key].calls == []
    assert world.extender.batches == []


async def test_supervisor_stops_removed_vms_once_and_forgets_their_series(world):
    target = world.vm("vm-1", current=2, load=0.5)
    hv = world.hypervisors[target.key]
    await world.supervisor.apply({target.key: target})
    await eventually(
        lambda: world.sample("vmautoscale_agent_vm_current_vcpus", ("vm", target.key)) == 2
    )
    assert world.sample("vmautoscale_agent_vms") == 1
    await world.supervisor.apply({})
    await world.supervisor.apply({})
    assert hv.closed == 1
    assert world.sample("vmautoscale_agent_vm_current_vcpus", ("vm", target.key)) is None
    assert world.sample("vmautoscale_agent_vms") == 0


async def test_supervisor_binds_vm_and_node_and_restarts_crashed_loops(world):
    seen = []

    async def run_vm(target):
        seen.append(structlog.contextvars.get_contextvars())
        if len(seen) == 1:
            raise RuntimeError("boom")
        await asyncio.Event().wait()

    sup = Supervisor(run_vm, node=NODE, metrics=world.metrics, restart_delay_seconds=0.01)
    target = world.vm("vm-1")
    await sup.apply({target.key: target})
    await eventually(lambda: len(seen) == 2)
    assert seen[0] == {"vm": "default/vm-1", "node": NODE}
    assert world.sample("vmautoscale_agent_vm_loop_restarts_total") == 1
    # The extender's permit record (an annotation it writes after each grant) changes the
    # target but not the loop: restarting would drop the loop's windows and the resize in
    # flight. The supervisor keeps the newest target.
    recorded = msgspec.structs.replace(target, permitted_vcpus=3, permitted_memory=2**30)
    await sup.apply({recorded.key: recorded})
    await asyncio.sleep(0.05)
    assert len(seen) == 2
    assert sup.vms == {recorded.key: recorded}
    # A changed target (here: new bounds) restarts the loop with fresh state.
    changed = world.vm("vm-1", max_vcpus=4)
    await sup.apply({changed.key: changed})
    await eventually(lambda: len(seen) == 3)
    await sup.close()
    assert sup.vms == {}


async def test_a_permit_recorded_on_the_pod_does_not_restart_the_vm_loop(world):
    """On a cluster every grant comes back as a pod update (the permitted-* annotations): the
    loop that asked goes on, with its state, and grows on as the load asks."""
    target = world.vm("vm-1", current=2, load=5.0)
    hv = world.hypervisors[target.key]
    await world.supervisor.apply({target.key: target})
    await eventually(lambda: hv.current == 6)
    await world.supervisor.apply({target.key: msgspec.structs.replace(target, permitted_vcpus=6)})
    world.metrics_app.loads["vm-1"] = 7.0  # needs 8
    await eventually(lambda: hv.current == 8)
    # One hypervisor connection all along: the loop was never stopped.
    assert hv.closed == 0
    assert world.sample("vmautoscale_agent_vm_loop_restarts_total") == 0


def test_first_scrapes_are_spread_over_the_interval_by_uid():
    offsets = [first_scrape_offset_seconds(f"uid-{i}", 1.0) for i in range(200)]
    assert all(0.0 <= o < 1.0 for o in offsets)
    # The same uid always starts at the same place (runs repeat; a restarted loop keeps it) ...
    assert offsets == [first_scrape_offset_seconds(f"uid-{i}", 1.0) for i in range(200)]
    assert first_scrape_offset_seconds("uid-7", 2.0) == 2 * offsets[7]
    # ... and 200 VMs cover the interval: every tenth of it holds some of them.
    assert {int(o * 10) for o in offsets} == set(range(10))


async def test_a_new_extender_epoch_makes_every_vm_report(world):
    """After an extender restart, each VM tells it its size and permit (and an idle node
    learns of the restart from its periodic empty batch)."""
    target = world.vm("vm-1", current=2, load=0.5)
    await world.supervisor.apply({target.key: target})
    client = world.deps.permits._client
    failures: list[object] = []
    checker = asyncio.create_task(
        client.keep_epoch_fresh(interval_seconds=0.2, failed=failures.append)
    )
    try:
        # The first epoch this agent sees counts: the extender may have found the VM running.
        await eventually(lambda: _reports(world, "uid-vm-1") >= 1)
        world.extender.epoch = "epoch-2"  # the extender restarted
        seen = _reports(world, "uid-vm-1")
        await eventually(lambda: _reports(world, "uid-vm-1") > seen)
        assert client.epochs.epoch == "epoch-2"
        assert any(not b.requests for b in world.extender.batches)  # the empty epoch checks
        assert failures == []
    finally:
        checker.cancel()
        await asyncio.gather(checker, return_exceptions=True)


def _reports(world, uid: str) -> int:
    """Steady requests for ``uid``: requested == current, with the permit as lastPermit."""
    return sum(
        1
        for batch in world.extender.batches
        for r in batch.requests
        if r.pod.uid == uid
        and r.requested.vcpus == r.current.vcpus == 2
        and r.last_permit is not None
        and r.last_permit.vcpus == 2
    )


def _fast_grow(world, *, stuck_after_seconds):
    """VM loops created from here on grow on the first saturated scrape and call a wanted
    change stuck after ``stuck_after_seconds``."""
    policy = msgspec.structs.replace(CORE.policy, grow_after_seconds=0.0)
    world.deps.core = msgspec.structs.replace(CORE, policy=policy)
    world.deps.stuck_after_seconds = stuck_after_seconds


async def test_grow_latency_runs_to_the_cpus_online_in_the_guest_and_a_lagging_guest_is_stuck(
    world,
):
    _fast_grow(world, stuck_after_seconds=0.5)
    target = world.vm("vm-1", current=2, max_vcpus=8, load=0.5)
    vm = ("vm", target.key)
    world.metrics_app.online["vm-1"] = 2  # the guest's node_cpu_seconds_total covers 2 CPUs
    hv = world.hypervisors[target.key]
    await world.supervisor.apply({target.key: target})
    await eventually(lambda: world.sample("vmautoscale_agent_vm_online_vcpus", vm) == 2)
    loop = asyncio.get_running_loop()
    stepped_at = loop.time()
    world.metrics_app.loads["vm-1"] = 5.0  # saturated at 2: needs 6
    await eventually(lambda: hv.current == 6)
    # Plugged, but the guest has not onlined them: nothing is timed yet, and the wanted
    # change stays pending until the VM counts as stuck.
    await eventually(lambda: world.sample("vmautoscale_agent_vm_stuck", vm) == 1)
    assert world.sample("vmautoscale_agent_grow_to_online_seconds_count") == 0
    onlined_at = loop.time()
    world.metrics_app.online["vm-1"] = 6
    await eventually(lambda: world.sample("vmautoscale_agent_grow_to_online_seconds_count") == 1)
    latency = world.sample("vmautoscale_agent_grow_to_online_seconds_sum")
    # From the decision (after the step, before the resize) to the scrape that saw 6 online
    # (after the guest onlined them, before now): bounds that follow from the order of events.
    assert onlined_at - hv.resized_at[-1][0] <= latency <= loop.time() - stepped_at
    await eventually(lambda: world.sample("vmautoscale_agent_vm_stuck", vm) == 0)
    assert world.sample("vmautoscale_agent_vm_online_vcpus", vm) == 6
    # Busy time covers the 2 CPUs online: the 4 plugged ones idle in the guest are not taken
    # for demand (that would have asked for 7).
    assert hv.calls == [6]
    await world.supervisor.apply({})
    assert world.sample("vmautoscale_agent_vm_stuck", vm) is None
    assert world.sample("vmautoscale_agent_vm_online_vcpus", vm) is None


@pytest.mark.parametrize("recovers", ["before-it-lands", "after-it-lands"])
async def test_scrapes_failing_while_a_grow_is_in_flight_do_not_abandon_its_latency(
    world, recovers
):
    """Onlining CPUs stalls a TCG guest for a moment, so its node_exporter misses scrapes while
    the grow is landing. Without metrics for longer than it keeps its last decision (here not
    at all) the agent has no wish (it holds), and once they come back its hysteresis restarts
    with a hold: neither is "the load went away", so the grow is still timed once the guest
    shows its CPUs online."""
    interval = CORE.scrape_interval_seconds
    policy = msgspec.structs.replace(CORE.policy, grow_after_seconds=3 * interval)
    world.deps.core = msgspec.structs.replace(CORE, policy=policy, scrape_keep_goal_seconds=0.0)
    world.deps.stuck_after_seconds = 60.0
    target = world.vm("vm-1", current=2, max_vcpus=8, load=0.5)
    world.metrics_app.online["vm-1"] = 2
    hv = world.hypervisors[target.key]
    hv.resize_seconds = 15 * interval
    vm = ("vm", target.key)
    await world.supervisor.apply({target.key: target})
    await eventually(lambda: world.sample("vmautoscale_agent_vm_online_vcpus", vm) == 2)
    world.metrics_app.loads["vm-1"] = 5.0  # saturated at 2: needs 6
    await eventually(lambda: hv.calls == [6])
    world.metrics_app.broken.add("vm-1")  # the guest stalls while the resize is in flight
    await eventually(
        lambda: (
            (world.sample("vmautoscale_agent_scrape_errors_total", ("kind", "malformed")) or 0) >= 2
        )
    )
    if recovers == "before-it-lands":
        world.metrics_app.broken.discard("vm-1")  # back, with a restarted hysteresis: a hold
        await eventually(lambda: world.sample("vmautoscale_agent_vm_desired_vcpus", vm) == 2)
    await eventually(lambda: hv.current == 6, within_seconds=10)
    world.metrics_app.online["vm-1"] = 6
    world.metrics_app.broken.discard("vm-1")
    await eventually(lambda: world.sample("vmautoscale_agent_grow_to_online_seconds_count") == 1)
    assert world.sample("vmautoscale_agent_grows_abandoned_total") in (None, 0)


async def test_a_permit_denied_for_long_marks_the_vm_stuck_until_it_grows(world):
    _fast_grow(world, stuck_after_seconds=0.5)
    world.extender.capacity_vcpus = 2  # all of it is this VM's already
    target = world.vm("vm-1", current=2, load=5.0)
    vm = ("vm", target.key)
    hv = world.hypervisors[target.key]
    await world.supervisor.apply({target.key: target})
    await eventually(lambda: world.sample("vmautoscale_agent_vm_stuck", vm) == 1)
    assert (world.sample("vmautoscale_agent_permit_denials_total") or 0) >= 1
    assert hv.calls == []
    world.extender.capacity_vcpus = 16
    await eventually(lambda: hv.current == 6)
    await eventually(lambda: world.sample("vmautoscale_agent_vm_stuck", vm) == 0)
    # No CPU counters from this guest: the grow cannot be timed to "online", so it is not.
    assert world.sample("vmautoscale_agent_grow_to_online_seconds_count") == 0


MiB = 2**20
KEPT = 88 * MiB  # what a guest kernel keeps of its memory: MemTotal = VM size - KEPT


def guest_memory(world, target, used):
    """The guest's meminfo follows the fake hypervisor's size; ``used`` is a dict to change."""
    hv = world.hypervisors[target.key]

    def meminfo():
        total = hv.memory_current - KEPT
        return float(total), float(max(0, total - used["bytes"]))

    world.metrics_app.memory[target.name] = meminfo


async def test_memory_grows_under_pressure_and_shrinks_back_with_the_extender_told(world):
    target = world.vm("vm-1", current=1, load=0.1, memory=512 * MiB, max_memory=2 * 1024 * MiB)
    hv = world.hypervisors[target.key]
    used = {"bytes": 100 * MiB}
    guest_memory(world, target, used)
    await world.supervisor.apply({target.key: target})
    await asyncio.sleep(0.3)
    assert hv.memory_calls == []

    used["bytes"] = 400 * MiB  # 24 MiB left: grow in one step
    await eventually(lambda: hv.memory_current > 512 * MiB)
    # One step, to at least 768 MiB (more: a jump this fast also projects ahead).
    (grown,) = hv.memory_calls
    assert grown >= 768 * MiB
    grow = next(
        r
        for b in world.extender.batches
        for r in b.requests
        if r.requested.memory_bytes > r.current.memory_bytes
    )
    assert (grow.current.memory_bytes, grow.requested.memory_bytes) == (512 * MiB, grown)
    assert grow.last_permit.memory_bytes == 512 * MiB
    assert world.extender.reserved_memory["uid-vm-1"] == grown
    key = ("vm", target.key)
    await eventually(lambda: world.sample("vmautoscale_agent_vm_memory_bytes", key) == grown)
    await eventually(
        lambda: (world.sample("vmautoscale_agent_memory_grow_to_online_seconds_count") or 0) == 1
    )
    assert world.sample("vmautoscale_agent_vm_online_memory_bytes", key) == grown

    used["bytes"] = 100 * MiB  # the allocation ended: back to the minimum, extender told after
    await eventually(lambda: world.extender.reserved_memory["uid-vm-1"] == 512 * MiB)
    assert hv.memory_current == 512 * MiB
    shrinks = ("direction", "shrink"), ("result", "ok")
    assert world.sample("vmautoscale_agent_memory_resizes_total", *shrinks) >= 1


async def test_a_refused_memory_shrink_is_reported_at_the_size_it_reached(world):
    target = world.vm(
        "vm-1", current=1, load=0.1, memory=512 * MiB, max_memory=2048 * MiB, permitted=1
    )
    hv = world.hypervisors[target.key]
    hv.memory_current = 2048 * MiB
    hv.memory_in_use = 1536 * MiB  # the guest cannot give back more than 512 MiB
    used = {"bytes": 100 * MiB}
    guest_memory(world, target, used)
    await world.supervisor.apply({target.key: target})
    await eventually(lambda: world.extender.reserved_memory.get("uid-vm-1") == 1536 * MiB)
    assert hv.memory_calls[0] == 512 * MiB  # asked for all of it...
    assert hv.memory_current == 1536 * MiB  # ...got part, and the extender holds exactly that
    notice = world.extender.batches[-1].requests[0]
    assert (notice.current.memory_bytes, notice.requested.memory_bytes) == (2048 * MiB, 1536 * MiB)
    # At least once: the target is held for resize_failure_hold_seconds and then tried again,
    # which a slow machine can reach before the assertion; each try ends at the same size.
    assert (
        world.sample(
            "vmautoscale_agent_memory_resizes_total",
            ("direction", "shrink"),
            ("result", "incomplete"),
        )
        >= 1
    )
    assert set(hv.memory_calls) == {512 * MiB}


async def test_memory_waits_for_the_kubelet_to_apply_the_containers_new_limit(world):
    """On a cluster the pod's memory room arrives with pod updates: the loop is told, not
    restarted, and grows once the applied limit has room."""
    target = world.vm("vm-1", current=1, load=0.1, memory=512 * MiB, max_memory=2 * 1024 * MiB)
    target = msgspec.structs.replace(target, memory_room_bytes=512 * MiB)
    hv = world.hypervisors[target.key]
    used = {"bytes": 400 * MiB}
    guest_memory(world, target, used)
    await world.supervisor.apply({target.key: target})
    await eventually(lambda: world.extender.reserved_memory.get("uid-vm-1", 0) > 512 * MiB)
    await asyncio.sleep(0.3)  # granted, but the applied limit has no room yet
    assert hv.memory_calls == []
    granted = world.extender.reserved_memory["uid-vm-1"]
    roomy = msgspec.structs.replace(target, memory_room_bytes=granted)
    await world.supervisor.apply({target.key: roomy})
    await eventually(lambda: hv.memory_current == granted)
    assert hv.closed == 0  # the same loop all along


class FakeCgroup:
    """The VM container's ``cpu.stat`` as the kernel keeps it (cgroup v1's keys), below a
    cgroup root of the test's own: one CFS period per 100 ms of loop time, each of them
    throttled while ``is_throttled()`` says so."""

    def __init__(self, root, name, is_throttled):
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.is_throttled = is_throttled
        self.periods = self.throttled = 0
        self._write()

    def _write(self):
        text = f"nr_periods {self.periods}\nnr_throttled {self.throttled}\nthrottled_time 0\n"
        (self.dir / "cpu.stat").write_text(text)

    async def run(self):
        while True:
            await asyncio.sleep(0.1)
            self.periods += 1
            self.throttled += 1 if self.is_throttled() else 0
            self._write()


async def test_a_vm_throttled_at_its_quota_asks_on_every_scrape_until_granted(world):
    """The real node's case: 1 vCPU under 8 clients, its container throttled at its 1-core
    quota, the guest reading 39% busy with load1 7.7, and the node with no room. The goal
    never drops back to a hold (which would end the request and restart the grow window):
    from the first request on, every scrape wants 4 and a denied request is made again at
    each permit retry, until the node has room; then the VM grows once."""
    world.extender.capacity_vcpus = 1
    world.extender.reserved["uid-vm-1"] = 1
    target = world.vm("vm-1", current=1, max_vcpus=4, load=7.7, permitted=1)
    target = msgspec.structs.replace(target, cgroup_dirs=("absent/vm-1", "vm-1"))
    world.metrics_app.online["vm-1"] = 1
    world.metrics_app.busy["vm-1"] = 0.39
    # No run queue on the page: the container's throttling alone shows the demand (the
    # guest's run queue would too, tests/agent/test_policy.py).
    hv = world.hypervisors[target.key]
    cgroup = FakeCgroup(world.tmp_path / "cgroup", "vm-1", lambda: hv.current < 4)
    world.deps.cgroup_root = world.tmp_path / "cgroup"
    loop = asyncio.get_running_loop()
    wanted: list[tuple[float, float | None]] = []

    async def watch_desired():
        while True:
            desired = world.sample("vmautoscale_agent_vm_desired_vcpus", ("vm", target.key))
            if not wanted or wanted[-1][1] != desired:
                wanted.append((loop.time(), desired))
            await asyncio.sleep(0.01)

    async with asyncio.TaskGroup() as tasks:
        kernel = tasks.create_task(cgroup.run())
        watcher = tasks.create_task(watch_desired())
        await world.supervisor.apply({target.key: target})
        await eventually(lambda: len(world.extender.batches) >= 8, within_seconds=10)
        denied_until = loop.time()
        world.extender.capacity_vcpus = 8
        await eventually(lambda: hv.current == 4, within_seconds=2)
        # Unthrottled at 4, the guest onlines them and shows its load as busy time: it stays.
        world.metrics_app.online["vm-1"] = 4
        del world.metrics_app.busy["vm-1"]
        await asyncio.sleep(1.0)
        kernel.cancel()
        watcher.cancel()
    assert hv.calls == [4]
    asks = [
        (r.current.vcpus, r.requested.vcpus)
        for batch in world.extender.batches
        for r in batch.requests
    ]
    assert set(asks[:8]) == {(1, 4)}, asks
    # Once it first wanted 4, it wanted 4 at every scrape until the grow landed.
    first = next(i for i, (_, d) in enumerate(wanted) if d == 4)
    assert [d for _, d in wanted[first:]] == [4], wanted
    # Eight requests, one per permit retry: no gap in which a hold restarted the grow window
    # (3 s of its own).
    between = denied_until - wanted[first][0]
    retry = CORE.permit_retry_seconds + CORE.scrape_interval_seconds
    assert 7 * CORE.permit_retry_seconds <= between <= 8 * retry, (between, wanted)
    assert (world.sample("vmautoscale_agent_permit_denials_total") or 0) >= 7


async def test_a_guest_memory_signal_brings_the_next_scrape_forward(world):
    sock_dir = Path(tempfile.mkdtemp(prefix="sig-", dir="/tmp"))  # unix paths are short
    path = sock_dir / "vm.memory.sock"
    guest_ends: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        guest_ends.append(writer)

    server = await asyncio.start_unix_server(serve, path=str(path))
    # Scrapes 30 s apart, starting at once: any second scrape soon after is the signal's.
    world.deps.core = msgspec.structs.replace(CORE, scrape_interval_seconds=30.0)
    world.deps.stagger_scrapes = False
    world.deps.memory_signal_socket = lambda target: path
    target = world.vm("vm-1", current=1, load=0.1, memory=512 * MiB, max_memory=2048 * MiB)
    used = {"bytes": 100 * MiB}
    guest_memory(world, target, used)

    def scrapes() -> float:
        return world.sample("vmautoscale_agent_scrapes_total") or 0.0

    try:
        await world.supervisor.apply({target.key: target})
        await eventually(lambda: bool(guest_ends) and scrapes() == 1)
        await asyncio.sleep(5.0)
        assert scrapes() == 1  # the next is 25 s away
        used["bytes"] = 480 * MiB  # the guest filled up: the signal's scrape asks to grow
        with structlog.testing.capture_logs() as logs:
            guest_ends[0].write(b"high 1\n")
            await eventually(lambda: scrapes() == 2, within_seconds=1.0)
            await eventually(lambda: any(e["event"] == "memory_goal" for e in logs))
        assert world.sample("vmautoscale_agent_memory_signals_total") == 1
        # The grow's line says what the signal gained: the scrape alone would have come at
        # its interval, 25 s after the signal.
        goal = next(e for e in logs if e["event"] == "memory_goal")
        assert goal["desired_memory_bytes"] > 512 * MiB
        assert 0 <= goal["signal_to_goal_seconds"] < 1.0
        assert goal["scrape_later_seconds"] == pytest.approx(25.0, abs=0.5)
    finally:
        await world.supervisor.close()
        for writer in guest_ends:
            writer.close()
        server.close()
        await server.wait_closed()
        shutil.rmtree(sock_dir, ignore_errors=True)
