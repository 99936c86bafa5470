"""Scenario tests of the pure state machine: step through events, assert whole Actions."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler_agent.core import (
    Actions,
    Ask,
    CallKind,
    CoreConfig,
    PermitCall,
    PermitOutcome,
    Resize,
    Resource,
    VmState,
)
from autoscaler_agent.memory_policy import MemoryPolicyConfig
from autoscaler_agent.policy import PolicyConfig, Samples
from protocol.annotations import VmSpec
from tests.agent.clock import FakeClock
from tests.agent.test_policy import Guest, kernel_load1

GiB = 2**30
SPEC = VmSpec(min_vcpus=1, max_vcpus=8, min_memory_bytes=GiB, max_memory_bytes=GiB)
CONFIG = CoreConfig(
    scrape_interval_seconds=1.0,
    policy=PolicyConfig(shrink_after_seconds=3.0),
    permit_retry_seconds=5.0,
    backoff_initial_seconds=0.5,
    backoff_max_seconds=4.0,
    backoff_jitter_fraction=0.5,
    resize_failure_hold_seconds=60.0,
)


@pytest.fixture
def clock():
    return FakeClock()


def started(clock, *, current=2, permit=None, load1=None, spec=SPEC, config=CONFIG):
    """A VM whose size has been read (``current``) and, if given, one scrape seen."""
    vm = VmState(spec=spec, config=config, now=clock.now, permit_vcpus=permit)
    assert vm.next_actions(clock.now) == Actions(scrape=True, read_vcpus=True, wait_seconds=1.0)
    vm.scrape_started(clock.now)
    vm.vcpus_read_started(clock.now)
    assert vm.next_actions(clock.now) == Actions()  # only an event can change anything now
    vm.vcpus_read(clock.now, current_vcpus=current, max_vcpus=spec.max_vcpus)
    if load1 is None:
        vm.scrape_failed(clock.now, "not yet")
    else:
        vm.metrics_scraped(clock.now, Samples(load1=load1))
    return vm


def scrape(vm, clock, load1):
    """Advance to the next scrape and feed it ``load1``."""
    clock.advance(1.0)
    assert vm.next_actions(clock.now).scrape
    vm.scrape_started(clock.now)
    return vm.metrics_scraped(clock.now, Samples(load1=load1))


def request(vm, *, current, requested, permit, usage=None, kind=CallKind.REQUEST, reason=None):
    load1 = vm.samples.load1 if vm.samples else None
    return PermitCall(
        kind=kind,
        vcpus=Ask(
            current=current,
            requested=requested,
            last_permit=permit,
            usage=current if usage is None else usage,
        ),
        load1=load1,
        reason=reason if reason is not None else vm.goal.reason,
    )


def test_grow_asks_first_then_resizes_to_the_permit(clock):
    vm = started(clock, current=2, load1=5.0)  # ceil(5 / 0.9) = 6
    assert vm.goal.reason.startswith("grow 2 -> 6")
    call = request(vm, current=2, requested=6, permit=2)
    assert vm.next_actions(clock.now) == Actions(request_permit=call, wait_seconds=1.0)

    vm.permit_requested(clock.now, call)
    assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)  # nothing twice
    clock.advance(0.01)
    assert vm.permit_granted(clock.now, 6) is PermitOutcome.GRANTED
    resize = Resize(resource=Resource.VCPUS, target=6, reason="grow: " + vm.goal.reason)
    assert vm.next_actions(clock.now) == Actions(resize=resize, wait_seconds=pytest.approx(0.99))

    vm.resize_started(clock.now, Resource.VCPUS, 6)
    clock.advance(0.05)
    vm.resized(clock.now, Resource.VCPUS, current=6, maximum=8)
    assert vm.next_actions(clock.now) == Actions(wait_seconds=pytest.approx(0.94))
    assert (vm.vcpus.current, vm.vcpus.permitted, vm.desired_vcpus) == (6, 6, 6)
    # Steady afterwards: 5.0 / 6 = 0.83 per vCPU, no more calls.
    scrape(vm, clock, 5.0)
    assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)


def test_vcpus_grow_only_into_the_cpu_limit_the_kubelet_has_applied(clock):
    """As memory: the permit resizes the pod, the kubelet raises the cgroup's quota a moment
    later; a vCPU onlined before then would run under the old quota (the real node showed the
    agent 80 ms ahead of the kubelet)."""
    vm = started(clock, current=2, load1=5.0)
    vm.vcpu_room_seen(clock.now, 2)
    call = request(vm, current=2, requested=6, permit=2)
    vm.permit_requested(clock.now, call)
    assert vm.permit_granted(clock.now, 6) is PermitOutcome.GRANTED
    assert vm.next_actions(clock.now).resize is None  # granted, not yet applied
    vm.vcpu_room_seen(clock.now, 4)  # the kubelet applied part of it so far
    resize = vm.next_actions(clock.now).resize
    assert resize == Resize(
        resource=Resource.VCPUS,
        target=4,
        reason="grow within the container's applied limit (4): " + vm.goal.reason,
    )
    vm.resize_started(clock.now, Resource.VCPUS, 4)
    vm.resized(clock.now, Resource.VCPUS, current=4, maximum=8)
    vm.vcpu_room_seen(clock.now, 6)
    assert vm.next_actions(clock.now).resize == Resize(
        resource=Resource.VCPUS, target=6, reason="grow: " + vm.goal.reason
    )


def test_partial_permit_uses_what_it_got_and_asks_again_later(clock):
    vm = started(clock, current=2, load1=5.0)
    vm.permit_requested(clock.now, vm.next_actions(clock.now).request_permit)
    assert vm.permit_granted(clock.now, 4) is PermitOutcome.PARTIAL
    reason = "grow within permit 4: " + vm.goal.reason
    assert vm.next_actions(clock.now) == Actions(
        resize=Resize(resource=Resource.VCPUS, target=4, reason=reason), wait_seconds=1.0
    )
    vm.resize_started(clock.now, Resource.VCPUS, 4)
    vm.resized(clock.now, Resource.VCPUS, current=4, maximum=8)
    # The rest is asked for no sooner than permit_retry_seconds (5 s) after the answer.
    for _ in range(4):
        scrape(vm, clock, 5.0)
        assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)
    scrape(vm, clock, 5.0)
    call = request(vm, current=4, requested=6, permit=4)
    assert vm.next_actions(clock.now) == Actions(request_permit=call, wait_seconds=1.0)
    vm.permit_requested(clock.now, call)
    assert vm.permit_granted(clock.now, 6) is PermitOutcome.GRANTED
    assert vm.next_actions(clock.now).resize == Resize(
        resource=Resource.VCPUS, target=6, reason="grow: " + vm.goal.reason
    )


def test_partial_then_bigger_goal_asks_at_once(clock):
    vm = started(clock, current=2, load1=5.0)
    vm.permit_requested(clock.now, vm.next_actions(clock.now).request_permit)
    vm.permit_granted(clock.now, 2)  # denied
    scrape(vm, clock, 7.0)  # needs 8 > the 6 that was denied: no reason to wait
    assert vm.next_actions(clock.now).request_permit == request(
        vm, current=2, requested=8, permit=2
    )


def test_denied_permit_keeps_size_and_retries_later(clock):
    vm = started(clock, current=2, load1=5.0)
    vm.permit_requested(clock.now, vm.next_actions(clock.now).request_permit)
    assert vm.permit_granted(clock.now, 2) is PermitOutcome.DENIED
    assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)
    for _ in range(4):
        scrape(vm, clock, 5.0)
        assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)
    scrape(vm, clock, 5.0)
    assert vm.next_actions(clock.now).request_permit is not None
    assert vm.vcpus.current == 2


def shrink_to_two(vm, clock):
    """8 vCPUs at load 1.0 since the start: shrink size ceil(1 / 0.6) = 2 after 3 s low."""
    for _ in range(2):
        goal = scrape(vm, clock, 1.0)
        assert goal.vcpus == 8 and goal.reason.startswith("hold: shrink to 2 pending")
        assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)
    goal = scrape(vm, clock, 1.0)
    assert goal.vcpus == 2 and goal.reason.startswith("shrink 8 -> 2 after 3s low")


def test_shrink_resizes_first_then_notifies(clock):
    vm = started(clock, current=8, permit=8, load1=1.0)
    shrink_to_two(vm, clock)
    resize = Resize(resource=Resource.VCPUS, target=2, reason="shrink: " + vm.goal.reason)
    assert vm.next_actions(clock.now) == Actions(resize=resize, wait_seconds=1.0)
    vm.resize_started(clock.now, Resource.VCPUS, 2)
    assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)  # no notice yet
    vm.resized(clock.now, Resource.VCPUS, current=2, maximum=8)
    notice = request(
        vm,
        kind=CallKind.NOTICE,
        current=8,
        requested=2,
        permit=8,
        usage=2,
        reason="give back 6 unused vCPUs: " + vm.goal.reason,
    )
    assert vm.next_actions(clock.now) == Actions(notify_extender=notice, wait_seconds=1.0)
    vm.permit_requested(clock.now, notice)
    assert vm.permit_granted(clock.now, 2) is PermitOutcome.RELEASED
    assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)
    assert vm.vcpus.permitted == 2


def test_hysteresis_spike_inside_window_restarts_it(clock):
    vm = started(clock, current=8, permit=8, load1=1.0)
    scrape(vm, clock, 1.0)
    scrape(vm, clock, 6.0)  # shrink size 10 >= 8: not low any more
    for _ in range(3):
        assert scrape(vm, clock, 1.0).vcpus == 8
        assert vm.next_actions(clock.now).resize is None
    assert scrape(vm, clock, 1.0).vcpus == 2


def fail_permit(vm, clock, *, jitter=0.0):
    call = vm.next_actions(clock.now).request_permit
    assert call is not None
    vm.permit_requested(clock.now, call)
    clock.advance(0.1)
    vm.permit_failed(clock.now, "connection refused", jitter=jitter)
    return call


def test_extender_down_backs_off_never_exceeds_permit_and_still_shrinks(clock):
    vm = started(clock, current=4, permit=4, load1=5.0)
    fail_permit(vm, clock)  # 1st failure: 0.5 s
    assert vm.is_extender_degraded
    assert vm.next_actions(clock.now) == Actions(wait_seconds=pytest.approx(0.5))
    clock.advance(0.5)
    fail_permit(vm, clock)  # 2nd: 1.0 s
    assert vm.next_actions(clock.now) == Actions(wait_seconds=pytest.approx(0.3))  # scrape first
    clock.advance(0.3)
    vm.scrape_started(clock.now)
    vm.metrics_scraped(clock.now, Samples(load1=5.0))
    assert vm.next_actions(clock.now) == Actions(wait_seconds=pytest.approx(0.7))
    clock.advance(0.7)
    fail_permit(vm, clock, jitter=1.0)  # 3rd: 2.0 s, jitter 1.0 takes half off: 1.0 s
    assert vm.next_actions(clock.now).wait_seconds == pytest.approx(0.2)  # next scrape
    assert vm.vcpus.current == 4 and vm.vcpus.permitted == 4  # never above the last permit

    # The load drops: the VM still shrinks, without the extender...
    for _ in range(3):
        scrape(vm, clock, 0.5)
    scrape(vm, clock, 0.5)
    actions = vm.next_actions(clock.now)
    assert actions.resize == Resize(
        resource=Resource.VCPUS, target=1, reason="shrink: " + vm.goal.reason
    )
    vm.resize_started(clock.now, Resource.VCPUS, 1)
    vm.resized(clock.now, Resource.VCPUS, current=1, maximum=8)
    # ... and tells it once it is back (the backoff has long passed by now).
    assert vm.next_actions(clock.now).notify_extender.vcpus.requested == 1


def test_growth_resumes_after_errors(clock):
    """The old design stopped growing a VM for good after one scheduler error."""
    vm = started(clock, current=2, load1=5.0)
    for delay in (0.5, 1.0, 2.0, 4.0, 4.0):  # capped at backoff_max_seconds
        fail_permit(vm, clock)
        clock.advance(delay)
    call = vm.next_actions(clock.now).request_permit
    assert call == request(vm, current=2, requested=6, permit=2)
    vm.permit_requested(clock.now, call)
    assert vm.permit_granted(clock.now, 6) is PermitOutcome.GRANTED
    assert not vm.is_extender_degraded
    assert vm.next_actions(clock.now).resize.target == 6


@pytest.mark.parametrize(
    ("granted", "why"),
    [pytest.param(7, "above-request", id="above-request"), pytest.param(1, "below", id="below")],
)
def test_protocol_error_permit_is_rejected(clock, granted, why):
    vm = started(clock, current=2, load1=5.0)
    vm.permit_requested(clock.now, vm.next_actions(clock.now).request_permit)
    assert vm.permit_granted(clock.now, granted) is PermitOutcome.REJECTED
    assert vm.vcpus.permitted == 2  # the old permit stands
    assert vm.next_actions(clock.now) == Actions(wait_seconds=pytest.approx(0.5))  # backoff
    clock.advance(0.5)
    assert vm.next_actions(clock.now).request_permit is not None  # and then it asks again


def test_retryable_resize_error_rereads_and_retries_after_backoff(clock):
    vm = started(clock, current=2, permit=6, load1=5.0)
    resize = vm.next_actions(clock.now).resize
    assert resize.target == 6
    vm.resize_started(clock.now, Resource.VCPUS, 6)
    vm.resize_failed(
        clock.now, Resource.VCPUS, "429 removal pending", is_retryable=True, jitter=0.0
    )
    assert vm.vcpus.current is None
    assert vm.next_actions(clock.now) == Actions(read_vcpus=True, wait_seconds=1.0)
    vm.vcpus_read_started(clock.now)
    vm.vcpus_read(clock.now, current_vcpus=3, max_vcpus=8)  # half happened
    assert vm.next_actions(clock.now) == Actions(wait_seconds=pytest.approx(0.5))
    clock.advance(0.5)
    assert vm.next_actions(clock.now).resize == resize


def test_fatal_resize_error_holds_that_target(clock):
    vm = started(clock, current=2, permit=6, load1=5.0)
    vm.resize_started(clock.now, Resource.VCPUS, 6)
    vm.resize_failed(clock.now, Resource.VCPUS, "rejected", is_retryable=False, jitter=0.0)
    vm.vcpus_read_started(clock.now)
    vm.vcpus_read(clock.now, current_vcpus=2, max_vcpus=8)
    for _ in range(59):
        scrape(vm, clock, 5.0)
        assert vm.next_actions(clock.now).resize is None
    clock.advance(1.0)
    assert vm.next_actions(clock.now).resize.target == 6


def test_hypervisor_read_failure_backs_off(clock):
    vm = VmState(spec=SPEC, config=CONFIG, now=clock.now)
    vm.vcpus_read_started(clock.now)
    vm.vcpus_read_failed(clock.now, "no socket", jitter=0.0)
    assert vm.next_actions(clock.now) == Actions(scrape=True, wait_seconds=pytest.approx(0.5))
    clock.advance(0.5)
    assert vm.next_actions(clock.now).read_vcpus


def test_never_above_max_nor_hypervisor_max(clock):
    vm = VmState(spec=SPEC, config=CONFIG, now=clock.now)
    vm.vcpus_read_started(clock.now)
    vm.vcpus_read(clock.now, current_vcpus=2, max_vcpus=4)
    vm.scrape_started(clock.now)
    vm.metrics_scraped(clock.now, Samples(load1=100.0))
    assert vm.next_actions(clock.now).request_permit.vcpus.requested == 4


def test_a_failed_scrape_keeps_the_last_decision_while_the_last_good_one_is_recent(clock):
    """A guest under load misses the scrape timeout now and then: its goal, and the permit
    asked for it, stay; once no scrape has succeeded for ``scrape_keep_goal_seconds``, the VM
    holds its current size and its windows start again."""
    vm = started(clock, current=2, load1=5.0)
    goal = vm.desired_vcpus
    assert goal == 6
    for _ in range(3):  # 1, 2 and 3 s after the last good scrape: kept
        clock.advance(1.0)
        vm.scrape_started(clock.now)
        assert vm.scrape_failed(clock.now, "timeout")
        assert vm.desired_vcpus == goal
        assert vm.next_actions(clock.now).request_permit.vcpus.requested == goal
    clock.advance(1.0)
    vm.scrape_started(clock.now)
    assert not vm.scrape_failed(clock.now, "timeout")  # 4 s: stale
    assert vm.desired_vcpus == 2
    assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)


def test_a_failed_first_scrape_holds_the_size(clock):
    vm = VmState(spec=SPEC, config=CONFIG, now=clock.now)
    vm.vcpus_read_started(clock.now)
    vm.vcpus_read(clock.now, current_vcpus=2, max_vcpus=4)
    vm.scrape_started(clock.now)
    assert not vm.scrape_failed(clock.now, "timeout")
    assert vm.desired_vcpus == 2


def test_first_read_adopts_a_larger_running_size_as_the_permit(clock):
    vm = started(clock, current=4, permit=2)
    assert vm.vcpus.permitted == 4


def test_after_an_extender_restart_an_idle_vm_reports_its_size_and_permit(clock):
    """A rebuilt ledger holds VMs it has not heard from at their maximum; the report frees it."""
    vm = started(clock, current=2, permit=2, load1=1.6)  # ceil(1.6 / 0.9) = 2: hold
    idle = vm.next_actions(clock.now)
    assert idle.request_permit is None and idle.notify_extender is None

    vm.extender_restarted(clock.now)
    call = vm.next_actions(clock.now).request_permit
    assert call is not None and call.kind is CallKind.REPORT
    assert (call.vcpus.current, call.vcpus.requested, call.vcpus.last_permit) == (2, 2, 2)
    vm.permit_requested(clock.now, call)
    assert vm.permit_granted(clock.now, 2) is PermitOutcome.GRANTED
    after = vm.next_actions(clock.now)
    assert after.request_permit is None and after.notify_extender is None


def test_a_failed_report_is_retried_after_backoff(clock):
    vm = started(clock, current=2, permit=2, load1=1.6)
    vm.extender_restarted(clock.now)
    call = vm.next_actions(clock.now).request_permit
    assert call is not None and call.kind is CallKind.REPORT
    vm.permit_requested(clock.now, call)
    vm.permit_failed(clock.now, "connection refused", jitter=0.0)
    assert vm.next_actions(clock.now).request_permit is None
    clock.advance(CONFIG.backoff_initial_seconds)
    again = vm.next_actions(clock.now).request_permit
    assert again is not None and again.kind is CallKind.REPORT


def test_a_stopped_load_is_shrunk_and_given_back_within_a_minute(clock):
    """The whole loop in fake time with the default policy: 7 busy threads on 8 vCPUs stop;
    load1 decays as the kernel's. The resize to the minimum and the notice that gives the
    permit back both come within 60 s of the stop."""
    config = CoreConfig(scrape_interval_seconds=1.0)  # the agent's defaults
    vm = started(clock, current=8, permit=8, config=config)
    guest = Guest(8)
    stopped_at = clock.now + 10
    shrunk_at = given_back_at = None
    while clock.now < stopped_at + 60 and given_back_at is None:
        actions = vm.next_actions(clock.now)
        if actions.scrape:
            vm.scrape_started(clock.now)
            since = clock.now - stopped_at
            demand, load1 = (7.0, 7.0) if since < 0 else (0.05, kernel_load1(7.0, 0.05, since))
            vm.metrics_scraped(clock.now, guest.scrape(demand, load1=load1))
        if actions.resize is not None:
            assert clock.now >= stopped_at, "shrunk under load"
            vm.resize_started(clock.now, Resource.VCPUS, actions.resize.target)
            guest.vcpus = actions.resize.target
            vm.resized(clock.now, Resource.VCPUS, current=guest.vcpus, maximum=8)
            shrunk_at = clock.now
        if actions.notify_extender is not None:
            vm.permit_requested(clock.now, actions.notify_extender)
            assert vm.permit_granted(clock.now, 1) is PermitOutcome.RELEASED
            given_back_at = clock.now
        clock.advance(actions.wait_seconds or 0.0)
    assert shrunk_at is not None and given_back_at is not None
    assert (vm.vcpus.current, vm.vcpus.permitted) == (1, 1)
    assert shrunk_at - stopped_at <= 32  # the first idle scrape, then the 30 s window
    assert vm.samples is not None and vm.samples.load1 is not None and vm.samples.load1 > 3.0


# -- memory -----------------------------------------------------------------------------------

MiB = 2**20
MEM_SPEC = VmSpec(min_vcpus=1, max_vcpus=8, min_memory_bytes=512 * MiB, max_memory_bytes=4 * GiB)
KEPT = 88 * MiB  # what the guest kernel keeps: MemTotal = VM size - KEPT


def mem_samples(current_memory, used, load1=0.5):
    total = current_memory - KEPT
    return Samples(
        load1=load1, memory_total_bytes=float(total), memory_available_bytes=float(total - used)
    )


def mem_started(clock, *, memory=512 * MiB, permit_memory=None, current=1, config=CONFIG):
    vm = VmState(spec=MEM_SPEC, config=config, now=clock.now, permit_memory=permit_memory)
    vm.next_actions(clock.now)
    vm.scrape_started(clock.now)
    vm.vcpus_read_started(clock.now)
    vm.vcpus_read(
        clock.now, current_vcpus=current, max_vcpus=8, current_memory=memory, max_memory=4 * GiB
    )
    vm.scrape_failed(clock.now, "not yet")
    return vm


def mem_scrape(vm, clock, used):
    clock.advance(1.0)
    assert vm.next_actions(clock.now).scrape
    vm.scrape_started(clock.now)
    vm.metrics_scraped(clock.now, mem_samples(vm.memory.current, used))


def test_memory_grow_asks_for_both_resources_in_one_request_then_resizes(clock):
    vm = mem_started(clock)
    mem_scrape(vm, clock, used=400 * MiB)  # 24 MiB available: grow to 768 MiB
    assert vm.desired_memory == 768 * MiB
    actions = vm.next_actions(clock.now)
    call = actions.request_permit
    assert call is not None and actions.resize is None  # permit first
    assert (call.vcpus.current, call.vcpus.requested) == (1, 1)  # vCPUs steady
    assert (call.memory.current, call.memory.requested) == (512 * MiB, 768 * MiB)
    assert (call.memory.last_permit, call.memory.usage) == (512 * MiB, 512 * MiB)
    assert call.kind is CallKind.REQUEST
    vm.permit_requested(clock.now, call)
    assert vm.permit_granted(clock.now, 1, memory_bytes=768 * MiB) is PermitOutcome.GRANTED
    assert vm.next_actions(clock.now).resize == Resize(
        resource=Resource.MEMORY, target=768 * MiB, reason=f"grow memory: {vm.memory_goal.reason}"
    )
    vm.resize_started(clock.now, Resource.MEMORY, 768 * MiB)
    vm.resized(clock.now, Resource.MEMORY, current=768 * MiB, maximum=None)
    assert vm.next_actions(clock.now).wait_seconds is not None
    assert vm.next_actions(clock.now).request_permit is None


def mem_granted(vm, clock, memory_bytes):
    """Pressure (24 MiB available: the VM wants 768 MiB), a request, and ``memory_bytes``
    granted; returns the outcome."""
    mem_scrape(vm, clock, used=400 * MiB)
    call = vm.next_actions(clock.now).request_permit
    vm.permit_requested(clock.now, call)
    return vm.permit_granted(clock.now, 1, memory_bytes=memory_bytes)


def test_memory_partial_permit_grows_within_it_and_asks_again_later(clock):
    vm = mem_started(clock)
    assert mem_granted(vm, clock, 640 * MiB) is PermitOutcome.PARTIAL
    resize = vm.next_actions(clock.now).resize
    assert resize is not None and resize.target == 640 * MiB
    assert resize.reason.startswith("grow memory within permit")


def test_memory_shrinks_first_then_gives_back_with_a_notice(clock):
    vm2 = mem_started(
        clock,
        memory=2 * GiB,
        permit_memory=2 * GiB,
        config=msgspec.structs.replace(CONFIG, memory=MemoryPolicyConfig(shrink_after_seconds=2.0)),
    )
    for _ in range(3):
        mem_scrape(vm2, clock, used=100 * MiB)
    resize = vm2.next_actions(clock.now).resize
    assert resize is not None and resize.target == 512 * MiB
    assert vm2.next_actions(clock.now).notify_extender is None  # shrink first
    vm2.resize_started(clock.now, Resource.MEMORY, 512 * MiB)
    vm2.resized(clock.now, Resource.MEMORY, current=512 * MiB, maximum=None)
    notice = vm2.next_actions(clock.now).notify_extender
    assert notice is not None and notice.kind is CallKind.NOTICE
    assert (notice.memory.current, notice.memory.requested) == (2 * GiB, 512 * MiB)
    assert (notice.vcpus.current, notice.vcpus.requested) == (1, 1)
    vm2.permit_requested(clock.now, notice)
    assert vm2.permit_granted(clock.now, 1, memory_bytes=512 * MiB) is PermitOutcome.RELEASED
    assert vm2.memory.permitted == 512 * MiB


def test_a_shrink_the_guest_cannot_finish_reports_the_real_size_and_holds(clock):
    config = msgspec.structs.replace(CONFIG, memory=MemoryPolicyConfig(shrink_after_seconds=2.0))
    vm = mem_started(clock, memory=2 * GiB, permit_memory=2 * GiB, config=config)
    for _ in range(3):
        mem_scrape(vm, clock, used=250 * MiB)
    resize = vm.next_actions(clock.now).resize
    assert resize == Resize(
        resource=Resource.MEMORY,
        target=512 * MiB,
        reason=f"shrink memory: {vm.memory_goal.reason}",
    )
    vm.resize_started(clock.now, Resource.MEMORY, resize.target)
    # The guest gave back only 512 MiB of the 1.5 GiB asked.
    vm.resize_failed(
        clock.now,
        Resource.MEMORY,
        "stopped short",
        is_retryable=False,
        jitter=0.0,
        current=1536 * MiB,
    )
    assert vm.memory.current == 1536 * MiB and vm.vcpus.current == 1
    notice = vm.next_actions(clock.now).notify_extender
    # The extender is told what was really unplugged, never the size that was asked for.
    assert (notice.memory.current, notice.memory.requested) == (2 * GiB, 1536 * MiB)
    vm.permit_requested(clock.now, notice)
    vm.permit_granted(clock.now, 1, memory_bytes=1536 * MiB)
    # The same shrink is not retried, however many windows (and failure holds) pass...
    for _ in range(3 * int(CONFIG.resize_failure_hold_seconds)):
        mem_scrape(vm, clock, used=250 * MiB)
        assert vm.desired_memory == 1536 * MiB
        assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)
    assert vm.memory_goal.reason.startswith(
        "hold at 1536 MiB, what the guest kept of the shrink to 512 MiB, until the goal changes"
    )
    # ...until the goal really changes: the guest's use fell by a memory unit (what held the
    # blocks may be gone), and the next window tries again, once.
    for _ in range(3):
        mem_scrape(vm, clock, used=100 * MiB)
    assert vm.next_actions(clock.now).resize.target == 512 * MiB


def residue_vm(clock):
    """The issue's VM: 640 MiB, shrunk towards its 512 MiB minimum, the guest keeping two
    2 MiB blocks (516 MiB, off the memory grid); the extender told, and granted it."""
    config = msgspec.structs.replace(CONFIG, memory=MemoryPolicyConfig(shrink_after_seconds=2.0))
    vm = mem_started(clock, memory=640 * MiB, permit_memory=640 * MiB, config=config)
    for _ in range(3):
        mem_scrape(vm, clock, used=100 * MiB)
    assert vm.next_actions(clock.now).resize.target == 512 * MiB
    vm.resize_started(clock.now, Resource.MEMORY, 512 * MiB)
    clock.advance(3.0)  # QEMU waited for the guest this long before giving up
    vm.resize_failed(
        clock.now,
        Resource.MEMORY,
        "stopped at 516 MiB",
        is_retryable=False,
        jitter=0.0,
        current=516 * MiB,
    )
    notice = vm.next_actions(clock.now).notify_extender
    assert (notice.memory.current, notice.memory.requested) == (640 * MiB, 516 * MiB)
    vm.permit_requested(clock.now, notice)
    assert vm.permit_granted(clock.now, 1, memory_bytes=516 * MiB) is PermitOutcome.RELEASED
    return vm


def test_an_off_grid_residue_is_held_without_retries_until_the_goal_changes(clock):
    vm = residue_vm(clock)
    # Ten minutes of the same use: every scrape holds at 516 MiB, nothing but scrapes.
    reasons = set()
    for _ in range(600):
        clock.advance(1.0)
        assert vm.next_actions(clock.now) == Actions(scrape=True, wait_seconds=1.0)
        vm.scrape_started(clock.now)
        vm.metrics_scraped(clock.now, mem_samples(vm.memory.current, 100 * MiB))
        assert vm.desired_memory == 516 * MiB
        assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)
        reasons.add(vm.memory_goal.reason.split(":")[0])
    assert reasons == {
        "hold at 516 MiB, what the guest kept of the shrink to 512 MiB, until the goal changes",
        "hold",  # a scrape whose own goal is to hold needs no word of the residue
    }
    # The goal changes: the use grows, the VM grows (a new size: the residue is history)...
    mem_scrape(vm, clock, used=400 * MiB)
    call = vm.next_actions(clock.now).request_permit
    assert call.memory.current == 516 * MiB and call.memory.requested > 516 * MiB
    vm.permit_requested(clock.now, call)
    vm.permit_granted(clock.now, 1, memory_bytes=call.memory.requested)
    grow = vm.next_actions(clock.now).resize
    vm.resize_started(clock.now, Resource.MEMORY, grow.target)
    vm.resized(clock.now, Resource.MEMORY, current=grow.target, maximum=None)
    assert vm.memory.residue is None
    # ... and once the use falls back, the shrink to the minimum is tried again.
    for _ in range(3):
        mem_scrape(vm, clock, used=100 * MiB)
    assert vm.next_actions(clock.now).resize.target == 512 * MiB


def drive(vm, clock, *, seconds, used, kept):
    """Run ``vm`` for ``seconds``: a guest whose use is ``used(now)`` and which never gives
    back memory below ``kept``; the extender grants what is asked. Returns the unplugs
    issued as (size before, target)."""
    unplugs = []
    end = clock.now + seconds
    while clock.now < end:
        a = vm.next_actions(clock.now)
        if a.scrape:
            vm.scrape_started(clock.now)
            vm.metrics_scraped(clock.now, mem_samples(vm.memory.current, used(clock.now)))
            continue
        if a.resize is not None:
            r = a.resize
            vm.resize_started(clock.now, r.resource, r.target)
            if r.resource is Resource.MEMORY and r.target < vm.memory.current:
                unplugs.append((vm.memory.current, r.target))
            landed = max(r.target, kept) if r.resource is Resource.MEMORY else r.target
            if landed != r.target:
                vm.resize_failed(
                    clock.now, r.resource, "stopped", is_retryable=False, jitter=0.0, current=landed
                )
            else:
                vm.resized(clock.now, r.resource, current=landed, maximum=None)
            continue
        call = a.request_permit or a.notify_extender
        if call is not None:
            vm.permit_requested(clock.now, call)
            memory = call.memory.requested if call.memory is not None else None
            vm.permit_granted(clock.now, call.vcpus.requested, memory_bytes=memory)
            continue
        clock.advance(max(a.wait_seconds or 1.0, 1e-3))
    return unplugs


@settings(max_examples=60, deadline=None)
@given(
    start_units=st.integers(1, 12),
    kept_blocks=st.integers(1, 64),
    used_mib=st.floats(50, 170),
    noise=st.lists(st.floats(-0.025, 0.025), min_size=1, max_size=50),
)
def test_no_unplug_is_issued_twice_for_the_same_unchanged_goal(
    start_units, kept_blocks, used_mib, noise
):
    """Whatever the VM's size, whatever the guest keeps (2 MiB blocks above the minimum), and
    however its use wanders (±2.5%, less than a trend; the goal stays the minimum): each
    unplug (from a size, to a target) is issued at most once."""
    clock = FakeClock()
    config = msgspec.structs.replace(CONFIG, memory=MemoryPolicyConfig(shrink_after_seconds=2.0))
    start = 512 * MiB + start_units * 128 * MiB
    vm = mem_started(clock, memory=start, permit_memory=start, config=config)
    kept = min(start, 512 * MiB + kept_blocks * 2 * MiB)
    begin = clock.now

    def used(now):
        return used_mib * MiB * (1 + noise[int(now - begin) % len(noise)])

    unplugs = drive(vm, clock, seconds=600, used=used, kept=kept)
    assert len(unplugs) == len(set(unplugs)), unplugs
    assert unplugs and unplugs[0] == (start, 512 * MiB)
    assert vm.memory.current == kept


def test_a_scrape_that_overlapped_a_memory_resize_holds_the_memory_goal(clock):
    vm = mem_started(clock)
    mem_scrape(vm, clock, used=400 * MiB)
    call = vm.next_actions(clock.now).request_permit
    vm.permit_requested(clock.now, call)
    vm.permit_granted(clock.now, 1, memory_bytes=768 * MiB)
    clock.advance(1.0)
    vm.scrape_started(clock.now)  # in flight while the resize lands
    vm.resize_started(clock.now, Resource.MEMORY, 768 * MiB)
    clock.advance(0.2)
    vm.resized(clock.now, Resource.MEMORY, current=768 * MiB, maximum=None)
    # Numbers from before the plug (24 MiB available) with the size after: not acted on.
    vm.metrics_scraped(clock.now, mem_samples(512 * MiB, 400 * MiB))
    assert vm.memory_goal is None
    assert vm.next_actions(clock.now).request_permit is None


def test_a_permit_below_the_memory_in_use_is_rejected(clock):
    vm = mem_started(clock)
    mem_scrape(vm, clock, used=400 * MiB)
    call = vm.next_actions(clock.now).request_permit
    vm.permit_requested(clock.now, call)
    assert vm.permit_granted(clock.now, 1, memory_bytes=256 * MiB) is PermitOutcome.REJECTED
    assert vm.memory.permitted == 512 * MiB


def test_coupled_memory_raises_the_vcpus_in_the_same_request(clock):
    config = msgspec.structs.replace(
        CONFIG, memory=MemoryPolicyConfig(memory_per_vcpu_bytes=512 * MiB)
    )
    vm = mem_started(clock, config=config)
    mem_scrape(vm, clock, used=400 * MiB)  # memory wants 768 MiB: 2 units of 512 MiB
    call = vm.next_actions(clock.now).request_permit
    assert (call.vcpus.current, call.vcpus.requested) == (1, 2)
    assert call.memory.requested == 1024 * MiB


def test_a_permit_below_the_memory_the_vm_has_is_obeyed_by_shrinking_to_it(clock):
    """The extender believes memory it did not hold only where the node has room (after a
    restart that lost a record, say): its answer is then below what the VM has, and the VM
    gives the rest back instead of running on memory nobody counts."""
    vm = mem_started(clock, memory=2 * GiB)  # adopted: the VM runs with 2 GiB
    mem_scrape(vm, clock, used=300 * MiB)
    vm.extender_restarted(clock.now)  # a new epoch: every VM reports its size
    actions = vm.next_actions(clock.now)
    call = actions.request_permit or actions.notify_extender
    assert call is not None and call.memory.usage == 2 * GiB
    vm.permit_requested(clock.now, call)
    assert vm.permit_granted(clock.now, 1, memory_bytes=1 * GiB) is not PermitOutcome.REJECTED
    assert vm.memory.permitted == 1 * GiB
    resize = vm.next_actions(clock.now).resize
    assert resize is not None and resize.target == 1 * GiB
    vm.resize_started(clock.now, Resource.MEMORY, 1 * GiB)
    vm.resized(clock.now, Resource.MEMORY, current=1 * GiB, maximum=None)
    # At the permit again: nothing more to give back, and later reads keep the permit.
    assert (vm.memory.current, vm.memory.permitted) == (1 * GiB, 1 * GiB)
    assert vm.next_actions(clock.now).notify_extender is None
    mem_scrape(vm, clock, used=300 * MiB)
    assert vm.memory.permitted == 1 * GiB


def test_memory_grows_only_into_the_room_the_applied_container_limit_leaves(clock):
    """The permit raises the pod's memory limit by an in-place resize, which the kubelet
    applies a moment later: until then the VM grows only as far as the applied limit allows,
    then into the rest of its permit, without asking again."""
    vm = mem_started(clock)
    vm.memory_room_seen(clock.now, 640 * MiB)
    assert mem_granted(vm, clock, 768 * MiB) is PermitOutcome.GRANTED
    resize = vm.next_actions(clock.now).resize
    assert resize is not None and resize.target == 640 * MiB
    assert resize.reason.startswith("grow memory within the container's applied limit")
    vm.resize_started(clock.now, Resource.MEMORY, 640 * MiB)
    vm.resized(clock.now, Resource.MEMORY, current=640 * MiB, maximum=None)
    actions = vm.next_actions(clock.now)
    assert actions.resize is None and actions.request_permit is None
    vm.memory_room_seen(clock.now, 768 * MiB)  # the kubelet applied the resize
    assert vm.next_actions(clock.now).resize == Resize(
        resource=Resource.MEMORY, target=768 * MiB, reason=f"grow memory: {vm.memory_goal.reason}"
    )


def test_no_room_known_leaves_growth_to_the_permit_alone(clock):
    vm = mem_started(clock)
    vm.memory_room_seen(clock.now, None)
    assert mem_granted(vm, clock, 768 * MiB) is PermitOutcome.GRANTED
    assert vm.next_actions(clock.now).resize.target == 768 * MiB


def test_a_hold_from_a_scrape_during_a_plug_does_not_shrink_the_vm_back(clock):
    """A plug takes seconds and scrapes go on meanwhile: their goals judge the size from
    before it. A "hold" there is not a wish to shrink back once the plug lands (the
    simulator, running this core, showed VMs shrinking after every grow)."""
    vm = mem_started(clock)
    assert mem_granted(vm, clock, 768 * MiB) is PermitOutcome.GRANTED
    vm.resize_started(clock.now, Resource.MEMORY, 768 * MiB)
    mem_scrape(vm, clock, used=200 * MiB)  # at 512 MiB, 224 MiB available: hold
    assert vm.memory_goal.reason.startswith("hold")
    vm.resized(clock.now, Resource.MEMORY, current=768 * MiB, maximum=None)
    assert vm.desired_memory == 768 * MiB
    assert vm.next_actions(clock.now).resize is None


def test_a_moving_vm_is_neither_resized_nor_grown_and_is_read_afresh_after(clock):
    """While the VM moves live (its pod's migration annotation) the agent still scrapes but
    neither asks for more nor resizes; once the move is over, it reads the size the
    destination really has before deciding anything."""
    vm = started(clock, current=2, load1=5.0)  # would grow 2 -> 6
    vm.moving_seen(clock.now, True)
    assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)
    scrape(vm, clock, 5.0)
    assert vm.next_actions(clock.now) == Actions(wait_seconds=1.0)
    vm.moving_seen(clock.now, False)
    assert vm.next_actions(clock.now) == Actions(read_vcpus=True, wait_seconds=1.0)
    vm.vcpus_read_started(clock.now)
    vm.vcpus_read(clock.now, current_vcpus=3, max_vcpus=8)
    assert vm.vcpus.current == 3
    assert vm.next_actions(clock.now).request_permit == request(
        vm, current=3, requested=6, permit=3
    )


def test_a_memory_signal_brings_the_next_scrape_forward_and_its_samples_decide(clock):
    vm = mem_started(clock)
    mem_scrape(vm, clock, used=100 * MiB)  # plenty available: steady
    assert vm.desired_memory == 512 * MiB
    clock.advance(0.3)
    assert not vm.next_actions(clock.now).scrape  # the next one is due 0.7 s from now
    assert vm.memory_signalled(clock.now) == pytest.approx(clock.now + 0.7)
    actions = vm.next_actions(clock.now)
    assert actions.scrape  # at once, not at the interval
    vm.scrape_started(clock.now)
    clock.advance(0.05)
    vm.metrics_scraped(clock.now, mem_samples(512 * MiB, 400 * MiB))
    # The policy decides on those samples (a use rising this fast is projected ahead, so
    # the grow is larger than the use alone asks): grown without waiting for the interval.
    assert vm.desired_memory is not None and vm.desired_memory > 512 * MiB
    assert vm.next_actions(clock.now).request_permit is not None


def test_memory_signals_scrape_no_sooner_than_the_minimum_interval(clock):
    vm = mem_started(clock)
    mem_scrape(vm, clock, used=100 * MiB)
    started_at = clock.now
    # A signal during the scrape's own minimum interval waits for it; a burst asks for one.
    clock.advance(0.05)
    for _ in range(5):
        vm.memory_signalled(clock.now)
    actions = vm.next_actions(clock.now)
    assert not actions.scrape
    assert actions.wait_seconds == pytest.approx(
        started_at + CONFIG.memory_signal_min_interval_seconds - clock.now
    )
    clock.advance(actions.wait_seconds)
    assert vm.next_actions(clock.now).scrape


def test_a_memory_signal_during_a_scrape_in_flight_scrapes_again_after_it(clock):
    vm = mem_started(clock)
    clock.advance(1.0)
    assert vm.next_actions(clock.now).scrape
    vm.scrape_started(clock.now)
    clock.advance(0.3)
    vm.memory_signalled(clock.now)
    assert not vm.next_actions(clock.now).scrape  # one scrape at a time
    vm.metrics_scraped(clock.now, mem_samples(512 * MiB, 100 * MiB))
    assert vm.next_actions(clock.now).scrape  # the signal came after it started
