"""The imperative shell around ``core.VmState``: one loop per VM, and their supervisor.

Shell: I/O and logging only; no policy. Each VM loop follows the executor shape of
neondatabase/autoscaling (STYLE.md §2): take a snapshot of the state, ask ``next_actions(now)``,
mark each action as started (so the next call does not propose it again), run its I/O in a
task, and feed the outcome back through the matching past-tense event with the time it
finished. The loop then sleeps until a task reports (``changed``) or ``wait_seconds`` passes.
It never decides anything itself: if a question starts with "should we", it belongs in core.

Each loop starts at its own place in the scrape interval (``first_scrape_offset_seconds``, a
hash of the VM's uid): loops started together would otherwise scrape, decide and ask the
extender in lockstep, and a node's worth of VMs stepped at once would all queue behind each
other at the same instant (the agent benchmark measured 200 VMs needing 1.226 s for what one
needs in ~1 s).

``Supervisor`` starts a loop when a VM appears on this node and stops it when it goes. It binds
``vm`` and ``node`` in structlog's contextvars *before* ``create_task``, because a task copies
the context when it is created; every line a VM's loop logs then says which VM it is about.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import aiohttp
import msgspec
import structlog

from autoscaler_agent.core import (
    Actions,
    CoreConfig,
    PermitCall,
    PermitOutcome,
    Resize,
    Resource,
    VmState,
)
from autoscaler_agent.discovery import Snapshot, VmSource, VmTarget
from autoscaler_agent.extender_client import (
    EpochWatch,
    ExtenderError,
    permit_memory_bytes,
    permit_vcpus,
)
from autoscaler_agent.hypervisor import Hypervisor, HypervisorError, MemoryResizeIncomplete
from autoscaler_agent.hypervisor import signals as memory_signals
from autoscaler_agent.hypervisor.base import MemoryState, VcpuState
from autoscaler_agent.metrics import AgentMetrics
from autoscaler_agent.progress import ScalingProgress
from autoscaler_agent.scrape import ScrapeError, fetch_samples, find_cpu_stat, read_cfs_counters
from autoscaler_agent.wire import resource_request
from protocol.permits import Permit, ResourceRequest

log = structlog.get_logger(__name__)
MIB = 2**20


class PermitClient(Protocol):
    """Sends one VM's ResourceRequest (batched with the others by the implementation)."""

    async def request(self, request: ResourceRequest) -> Permit: ...


HypervisorFactory = Callable[[VmTarget], Hypervisor]
# The unix socket of a VM's memory-pressure port (hypervisor/signals.py), or None: no port.
MemorySignalSocket = Callable[[VmTarget], Path | None]


class RunnerDeps:
    """What every VM loop shares. Plain attributes: this is wiring, not state."""

    def __init__(
        self,
        *,
        core: CoreConfig,
        node: str,
        session: aiohttp.ClientSession,
        permits: PermitClient,
        hypervisor_for: HypervisorFactory,
        metrics: AgentMetrics,
        scrape_timeout_seconds: float,
        rng: random.Random | None = None,
        stagger_scrapes: bool = True,
        epochs: EpochWatch | None = None,
        stuck_after_seconds: float = 60.0,
        cgroup_root: Path | None = None,
        memory_signal_socket: MemorySignalSocket | None = None,
    ) -> None:
        self.core = core
        self.node = node
        self.session = session
        self.permits = permits
        self.hypervisor_for = hypervisor_for
        self.metrics = metrics
        self.scrape_timeout_seconds = scrape_timeout_seconds
        # Jitter only: seeded in tests and benchmarks, so runs are repeatable.
        self.rng = rng or random.Random()
        # Off only where a test needs VMs to scrape in step (e.g. to share a permit batch).
        self.stagger_scrapes = stagger_scrapes
        # Tells every VM loop when the extender's epoch changes (it then reports the VM).
        self.epochs = epochs
        # A wanted size change pending this long marks the VM stuck (progress.py).
        self.stuck_after_seconds = stuck_after_seconds
        # The host's cgroup filesystem, where each scrape also reads the VM container's CPU
        # throttling (None: not read, the policy goes by the guest's own signs).
        self.cgroup_root = cgroup_root
        # Where each VM's guest signals memory pressure; None: the agent does not listen.
        self.memory_signal_socket = memory_signal_socket


_MIN_WAIT_SECONDS = 2 * time.get_clock_info("monotonic").resolution
# How often a VM loop looks again for its container's cpu.stat while it has not found it.
_FIND_CPU_STAT_SECONDS = 30.0
# The labels of the resize metrics (``resizes_total``, ``resize_duration_seconds`` and their
# memory twins), as ``_resize`` sets them: every value is exported at 0 from the start
# (``__main__``).
RESIZE_DIRECTIONS = ("grow", "shrink")
RESIZE_RESULTS = ("ok", "error", "incomplete")


def first_scrape_offset_seconds(uid: str, interval_seconds: float) -> float:
    """Where in the scrape interval a VM's loop starts, in [0, interval): from a hash of its
    uid, so it is spread evenly over a node's VMs, the same on every run and after a restart
    of the loop (a random offset would make runs unrepeatable)."""
    return zlib.crc32(uid.encode()) / 2**32 * interval_seconds


class VmRunner:
    """The loop of one VM. ``state`` is exposed for debugging and tests."""

    def __init__(self, target: VmTarget, deps: RunnerDeps) -> None:
        self.target = target
        self._deps = deps
        self._loop = asyncio.get_running_loop()
        self.state = VmState(
            spec=target.spec,
            config=deps.core,
            now=self._loop.time(),
            permit_vcpus=target.permitted_vcpus,
            permit_memory=target.permitted_memory,
            memory_room=target.memory_room_bytes,
            vcpu_room=target.vcpu_room,
        )
        self.state.moving_seen(self._loop.time(), target.is_moving)
        self._changed = asyncio.Event()
        self.progress = ScalingProgress(stuck_after_seconds=deps.stuck_after_seconds)
        self._is_stuck = False
        # Memory progress, in MiB: "online" is the guest's MemTotal plus what its kernel keeps
        # back (the VM's size minus MemTotal, measured over a scrape during which the size did
        # not change: one that overlaps a resize mixes a MemTotal from before with a size from
        # after).
        self.memory_progress = ScalingProgress(stuck_after_seconds=deps.stuck_after_seconds)
        self._is_memory_stuck = False
        self._memory_changes = 0  # memory resizes finished, to tell a scrape that overlapped one
        self._memory_overhead: int | None = None
        # The first memory signal since the last scrape started, and when that scrape was due
        # without it; handed to the next scrape, whose grow says what the signal gained.
        self._signal: tuple[float, float] | None = None
        # The VM container's cpu.stat once found, and when to look again while it is not.
        self._cpu_stat: Path | None = None
        self._find_cpu_stat_at = self._loop.time()

    def _now(self) -> float:
        return self._loop.time()

    def update(self, target: VmTarget) -> None:
        """The same VM, newer facts from its pod (``VmTarget.same_loop``): the memory room
        its container's applied limit leaves."""
        self.target = target
        if target.memory_room_bytes != self.state.memory.room:
            self.state.memory_room_seen(self._now(), target.memory_room_bytes)
            self._changed.set()
        if target.vcpu_room != self.state.vcpus.room:
            self.state.vcpu_room_seen(self._now(), target.vcpu_room)
            self._changed.set()
        if target.is_moving != self.state.is_moving:
            self.state.moving_seen(self._now(), target.is_moving)
            self._changed.set()

    def _extender_restarted(self) -> None:
        self.state.extender_restarted(self._now())
        self._changed.set()

    async def run(self) -> None:
        hypervisor = self._deps.hypervisor_for(self.target)
        offset = (
            first_scrape_offset_seconds(self.target.uid, self._deps.core.scrape_interval_seconds)
            if self._deps.stagger_scrapes
            else 0.0
        )
        log.info(
            "vm_loop_started",
            spec=self.target.spec,
            metrics_url=self.target.metrics_url,
            first_scrape_offset_seconds=round(offset, 3),
        )
        epochs = self._deps.epochs
        unsubscribe = epochs.subscribe(self._extender_restarted) if epochs is not None else None
        try:
            # Before the first next_actions, so the state's scrape grid starts at the offset
            # (the first hypervisor read waits with it: less than one interval, once).
            await asyncio.sleep(offset)
            async with asyncio.TaskGroup() as tasks:
                signal_socket = (
                    self._deps.memory_signal_socket(self.target)
                    if self._deps.memory_signal_socket is not None
                    else None
                )
                if signal_socket is not None:
                    # Cancelled with the loop (the TaskGroup ends when the loop is cancelled).
                    tasks.create_task(memory_signals.watch(signal_socket, self._memory_signalled))
                while True:
                    # Clear before deciding: a task finishing from here on sets it again, so
                    # the wait below cannot miss an event.
                    self._changed.clear()
                    actions = self.state.next_actions(self._now())
                    self._start(actions, tasks, hypervisor)
                    self._observe()
                    await self._sleep(actions.wait_seconds)
        finally:
            if unsubscribe is not None:
                unsubscribe()
            # Shielded: a cancelled loop still closes its hypervisor connection exactly once.
            await asyncio.shield(hypervisor.close())

    async def _sleep(self, seconds: float | None) -> None:
        if seconds is None:
            await self._changed.wait()
            return
        with contextlib.suppress(TimeoutError):
            # asyncio runs a timer up to one clock resolution early, so a deadline a few ulps
            # ahead (``next_scrape_at - now``: 2e-16 s) ends the wait at once with the clock
            # still short of it, and the state asks for the same wait again: on a clock that
            # moves in steps (looptime's) that spins for ever. Wait at least two resolutions.
            async with asyncio.timeout(max(seconds, _MIN_WAIT_SECONDS)):
                await self._changed.wait()

    def _memory_signalled(self) -> None:
        self._deps.metrics.memory_signals.inc()
        now = self._now()
        due = self.state.memory_signalled(now)
        if self._signal is None:
            self._signal = (now, due)
        log.debug("memory_signalled", reason="the guest's workload crossed its memory.high")
        self._changed.set()

    def _start(self, actions: Actions, tasks: asyncio.TaskGroup, hypervisor: Hypervisor) -> None:
        now = self._now()
        state = self.state
        if actions.scrape:
            state.scrape_started(now)
            signal, self._signal = self._signal, None
            tasks.create_task(self._scrape(self._memory_changes, now, signal))
        if actions.read_vcpus:
            state.vcpus_read_started(now)
            tasks.create_task(self._read(hypervisor))
        if actions.resize is not None:
            resize = actions.resize
            state.resize_started(now, resize.resource, resize.target)
            tasks.create_task(self._resize(hypervisor, resize))
        for call in (actions.request_permit, actions.notify_extender):
            if call is not None:
                state.permit_requested(now, call)
                tasks.create_task(self._permit(call))

    def _observe(self) -> None:
        s = self.state
        m = self._deps.metrics
        now = self._now()
        current, desired = s.vcpus.current, s.desired_vcpus
        online = s.samples.cpu_count if s.samples is not None else None
        # Without a fresh goal (a failed scrape) the core holds the current size, and after one
        # its hysteresis restarts with a "hold": neither is "the load went away", so while a
        # resize is in flight, or with no goal, the wish is unknown and cannot end a grow as
        # abandoned. (Onlining vCPUs stalls a TCG guest's node_exporter for a
        # scrape or two just as the grow lands; taken as a wish, such grows went untimed.)
        wish = desired if s.goal is not None and not s.is_resizing(Resource.VCPUS) else None
        progress = self.progress.observe(now, current=current, desired=wish, online=online)
        if progress.grow_latency_seconds is not None:
            m.grow_to_online.observe(progress.grow_latency_seconds)
            log.info(
                "grow_online",
                online_vcpus=online,
                decision_to_online_seconds=round(progress.grow_latency_seconds, 3),
            )
        if progress.grow_abandoned:
            m.grows_abandoned.inc()
        if progress.is_stuck != self._is_stuck:
            self._is_stuck = progress.is_stuck
            pending = progress.pending_since
            # One line when it starts and one when it ends, with what the core knows.
            (log.warning if progress.is_stuck else log.info)(
                "vm_stuck" if progress.is_stuck else "vm_unstuck",
                pending_seconds=round(now - pending, 1) if pending is not None else None,
                online_vcpus=online,
                **s.dump(),
            )
        m.observe_vm(
            self.target.key,
            current=current,
            desired=desired,
            permitted=s.vcpus.permitted,
            online=online,
            is_stuck=progress.is_stuck,
            max_vcpus=s.vcpus.top,
            load1=s.samples.load1 if s.samples is not None else None,
        )
        if s.memory.current is not None:
            self._observe_memory(now)

    def _observe_memory(self, now: float) -> None:
        s = self.state
        m = self._deps.metrics
        current, desired = s.memory.current, s.desired_memory
        total = s.samples.memory_total_bytes if s.samples is not None else None
        overhead = self._memory_overhead
        online = int(total) + overhead if total is not None and overhead is not None else None
        progress = self.memory_progress.observe(
            now,
            current=None if current is None else current // MIB,
            desired=None if desired is None else desired // MIB,
            # Rounded to the nearest MiB: MemTotal is counted in KiB pages.
            online=None if online is None else (online + MIB // 2) // MIB,
        )
        if progress.grow_latency_seconds is not None:
            m.memory_grow_to_online.observe(progress.grow_latency_seconds)
            log.info(
                "memory_grow_online",
                online_memory_bytes=online,
                decision_to_online_seconds=round(progress.grow_latency_seconds, 3),
            )
        if progress.is_stuck != self._is_memory_stuck:
            self._is_memory_stuck = progress.is_stuck
            pending = progress.pending_since
            (log.warning if progress.is_stuck else log.info)(
                "vm_memory_stuck" if progress.is_stuck else "vm_memory_unstuck",
                pending_seconds=round(now - pending, 1) if pending is not None else None,
                online_memory_bytes=online,
                **s.dump(),
            )
        m.observe_vm_memory(
            self.target.key,
            current=current,
            desired=desired,
            permitted=s.memory.permitted,
            online=online,
            is_stuck=progress.is_stuck,
        )

    def _jitter(self) -> float:
        return self._deps.rng.random()

    # -- the I/O of each action; each ends by feeding its outcome back --------------------

    async def _scrape(
        self,
        memory_changes_at_start: int,
        started: float,
        signal: tuple[float, float] | None,
    ) -> None:
        """``signal``: (when, due) of the first memory signal before this scrape started, and
        when the scrape was due without it."""
        m = self._deps.metrics
        m.scrapes.inc()
        try:
            samples = await fetch_samples(
                self._deps.session, self.target.metrics_url, self._deps.scrape_timeout_seconds
            )
        except ScrapeError as e:
            m.scrape_errors.labels(kind=e.kind).inc()
            kept = self.state.scrape_failed(self._now(), str(e))
            log.warning(
                "scrape_failed",
                error=str(e),
                failures=self.state.scrape_failures,
                reason="keeping the last decision" if kept else "holding the current size",
            )
        else:
            cfs = self._cfs_counters()
            if cfs is not None:
                samples = msgspec.structs.replace(
                    samples, cfs_periods_total=cfs[0], cfs_throttled_periods_total=cfs[1]
                )
            mem = self.state.memory.current
            total = samples.memory_total_bytes
            if (
                mem is not None
                and total is not None
                and self._memory_changes == memory_changes_at_start
            ):
                self._memory_overhead = mem - int(total)
            before = self.state.desired_vcpus
            mem_before = self.state.desired_memory
            goal = self.state.metrics_scraped(self._now(), samples)
            after = self.state.desired_vcpus
            if goal is not None:
                # info only when the decision changes: one line per decision, not per tick.
                level = log.info if after != before else log.debug
                level("goal", desired_vcpus=after, load1=goal.load1, reason=goal.reason)
            mem_goal = self.state.memory_goal
            if mem_goal is not None:
                mem_after = self.state.desired_memory
                if mem_goal.stalled_seconds:
                    m.memory_stalled_seconds.inc(mem_goal.stalled_seconds)
                is_new = mem_after != mem_before
                if is_new and mem_goal.is_pressure_grow:
                    m.memory_pressure_grows.inc()
                # A decision on a scrape a guest's signal brought forward: how long after the
                # signal it came, and how much later the scrape alone would have started.
                signalled = (
                    {
                        "signal_to_goal_seconds": round(self._now() - signal[0], 3),
                        "scrape_later_seconds": round(max(0.0, signal[1] - started), 3),
                    }
                    if signal is not None
                    else {}
                )
                (log.info if is_new else log.debug)(
                    "memory_goal",
                    desired_memory_bytes=mem_after,
                    waiting_fraction=mem_goal.waiting_fraction,
                    stalled_seconds=mem_goal.stalled_seconds,
                    is_pressure_grow=mem_goal.is_pressure_grow,
                    reason=mem_goal.reason,
                    **signalled,
                )
        finally:
            self._changed.set()

    def _cfs_counters(self) -> tuple[float, float] | None:
        """The VM container's CFS counters, None while its cgroup is unknown. Its cpu.stat is
        looked for once, and again at most every ``_FIND_CPU_STAT_SECONDS`` while not found or
        gone (a search reads directories; a scrape should read one file)."""
        root = self._deps.cgroup_root
        if root is None or not self.target.cgroup_dirs:
            return None
        now = self._now()
        if self._cpu_stat is None and now >= self._find_cpu_stat_at:
            self._find_cpu_stat_at = now + _FIND_CPU_STAT_SECONDS
            self._cpu_stat = find_cpu_stat(root, self.target.cgroup_dirs)
            log.info("vm_cgroup", cpu_stat=str(self._cpu_stat) if self._cpu_stat else None)
        if self._cpu_stat is None:
            return None
        cfs = read_cfs_counters(self._cpu_stat)
        if cfs is None:
            self._cpu_stat = None
        return cfs

    async def _read(self, hypervisor: Hypervisor) -> None:
        try:
            vcpus = await hypervisor.vcpus()
            memory = await hypervisor.memory()
        except HypervisorError as e:
            self._deps.metrics.hypervisor_errors.labels(error=type(e).__name__).inc()
            self.state.vcpus_read_failed(self._now(), str(e), jitter=self._jitter())
            log.warning("vcpus_read_failed", error=str(e), error_class=type(e).__name__)
        else:
            # Memory is managed only with a hot-plug device (room above the boot memory).
            is_memory_managed = memory.max > memory.min
            self.state.vcpus_read(
                self._now(),
                current_vcpus=vcpus.current,
                max_vcpus=vcpus.max,
                current_memory=memory.current if is_memory_managed else None,
                max_memory=memory.max if is_memory_managed else None,
            )
            log.info(
                "vcpus_read",
                current_vcpus=vcpus.current,
                max_vcpus=vcpus.max,
                current_memory_bytes=memory.current,
                max_memory_bytes=memory.max,
            )
        finally:
            self._changed.set()

    async def _resize(self, hypervisor: Hypervisor, resize: Resize) -> None:
        """One path for both resources: the hypervisor call, the metric, the log line and the
        event differ only by the resource's name (``memory_`` on the memory ones)."""
        m = self._deps.metrics
        is_memory = resize.resource is Resource.MEMORY
        prefix, unit, size_field = _LOGGED[resize.resource]
        count, duration = (
            (m.memory_resizes, m.memory_resize_duration)
            if is_memory
            else (m.resizes, m.resize_duration)
        )
        before = self.state.resource(resize.resource).current or 0
        direction = "grow" if resize.target > before else "shrink"
        log.info(
            prefix + "resize_started",
            **{f"from_{unit}": before, f"to_{unit}": resize.target},
            reason=resize.reason,
        )
        started = self._now()
        result: VcpuState | MemoryState
        try:
            if is_memory:
                result = await hypervisor.resize_memory(resize.target)
            else:
                result = await hypervisor.resize(resize.target)
        except MemoryResizeIncomplete as e:
            duration.labels(direction=direction).observe(self._now() - started)
            count.labels(direction=direction, result="incomplete").inc()
            self.state.resize_failed(
                self._now(),
                resize.resource,
                str(e),
                is_retryable=e.is_retryable,
                jitter=self._jitter(),
                current=e.state.current,
            )
            log.warning(
                "memory_resize_incomplete",
                to_bytes=resize.target,
                current_memory_bytes=e.state.current,
                error=str(e),
                reason="the VM keeps the memory the guest did not give back, and is held there"
                " until its goal changes; the extender is told the real size",
            )
        except HypervisorError as e:
            duration.labels(direction=direction).observe(self._now() - started)
            count.labels(direction=direction, result="error").inc()
            m.hypervisor_errors.labels(error=type(e).__name__).inc()
            self.state.resize_failed(
                self._now(),
                resize.resource,
                str(e),
                is_retryable=e.is_retryable,
                jitter=self._jitter(),
            )
            log.warning(
                prefix + "resize_failed",
                **{f"to_{unit}": resize.target},
                error=str(e),
                error_class=type(e).__name__,
                is_retryable=e.is_retryable,
                reason="re-reading the size from the hypervisor",
            )
        else:
            duration.labels(direction=direction).observe(self._now() - started)
            count.labels(direction=direction, result="ok").inc()
            self.state.resized(
                self._now(), resize.resource, current=result.current, maximum=result.max
            )
            log.info(
                prefix + "resize_succeeded",
                **{size_field: result.current},
                **{f"to_{unit}": resize.target},
            )
        finally:
            if is_memory:
                self._memory_changes += 1
            self._changed.set()

    def _wire_request(self, call: PermitCall) -> ResourceRequest:
        return resource_request(
            call, pod=self.target.pod, node=self._deps.node, spec=self.target.spec
        )

    async def _permit(self, call: PermitCall) -> None:
        m = self._deps.metrics
        m.permit_requests.labels(kind=call.kind.value).inc()
        log.info(
            "permit_requested",
            kind=call.kind.value,
            current_vcpus=call.vcpus.current,
            requested_vcpus=call.vcpus.requested,
            current_memory_bytes=call.memory.current if call.memory is not None else None,
            requested_memory_bytes=call.memory.requested if call.memory is not None else None,
            reason=call.reason,
        )
        try:
            answer = await self._deps.permits.request(self._wire_request(call))
        except ExtenderError as e:
            m.extender_errors.labels(kind=e.kind).inc()
            m.permit_outcomes.labels(outcome="error").inc()
            self.state.permit_failed(self._now(), str(e), jitter=self._jitter())
            log.warning(
                "permit_failed",
                error=str(e),
                error_kind=e.kind,
                failures=self.state.extender_failures,
                reason="staying within the last permit; shrinking still allowed",
            )
        else:
            vcpus = permit_vcpus(answer)
            memory = permit_memory_bytes(answer)
            outcome = self.state.permit_granted(
                self._now(), vcpus, memory_bytes=memory, jitter=self._jitter()
            )
            m.permit_outcomes.labels(outcome=outcome.value).inc()
            if outcome is PermitOutcome.REJECTED:
                m.permit_protocol_errors.inc()
                log.error(
                    "permit_rejected",
                    permit_vcpus=vcpus,
                    permit_memory_bytes=memory,
                    usage_vcpus=call.vcpus.usage,
                    requested_vcpus=call.vcpus.requested,
                    extender_reason=answer.reason,
                    reason="permit outside [usage, requested] breaks the protocol; ignored",
                )
            else:
                if outcome is PermitOutcome.DENIED:
                    m.permit_denials.inc()
                elif outcome is PermitOutcome.PARTIAL:
                    m.permit_partial_grants.inc()
                log.info(
                    "permit_answered",
                    outcome=outcome.value,
                    permit_vcpus=vcpus,
                    permit_memory_bytes=memory,
                    requested_vcpus=call.vcpus.requested,
                    extender_reason=answer.reason,
                )
        finally:
            self._changed.set()


# Per resource, for the resize's log lines: the event's prefix, the unit in the field names,
# and the name of the size field.
_LOGGED = {
    Resource.VCPUS: ("", "vcpus", "current_vcpus"),
    Resource.MEMORY: ("memory_", "bytes", "current_memory_bytes"),
}

RunVm = Callable[[VmTarget], Awaitable[None]]
UpdateVm = Callable[[VmTarget], None]


class Supervisor:
    """Keeps exactly one loop running per VM in the latest snapshot.

    A loop that crashes (a bug, or a hypervisor URL that cannot be used) is logged and
    restarted after ``restart_delay_seconds`` with fresh state: re-reading the VM from the
    hypervisor is always safe, and the state machine needs no memory of the crash.
    """

    def __init__(
        self,
        run_vm: RunVm,
        *,
        node: str,
        metrics: AgentMetrics,
        restart_delay_seconds: float = 5.0,
        update_vm: UpdateVm | None = None,
    ) -> None:
        self._run_vm = run_vm
        # Told of a running VM's newer target when its loop goes on (``VmTarget.same_loop``).
        self._update_vm = update_vm
        self._node = node
        self._metrics = metrics
        self._restart_delay = restart_delay_seconds
        self._loops: dict[str, tuple[VmTarget, asyncio.Task[None]]] = {}

    @property
    def vms(self) -> dict[str, VmTarget]:
        return {key: target for key, (target, _) in self._loops.items()}

    async def run(self, source: VmSource) -> None:
        try:
            async for snapshot in source.snapshots():
                await self.apply(snapshot)
        finally:
            await asyncio.shield(self.close())

    async def apply(self, snapshot: Snapshot) -> None:
        for key, (target, task) in list(self._loops.items()):
            new = snapshot.get(key)
            if new is None or not new.same_loop(target):
                # Gone, or changed (bounds, URLs, a new pod under the same name): the loop's
                # state was built for the old target, so restart it.
                await self._stop(key, why="gone" if new is None else "changed")
            elif new != target:
                # Only the permit record or the memory room moved (the extender writes the
                # record after every grant, the kubelet applies the resize after it): restarting
                # would drop the loop's windows and cancel the resize in flight.
                self._loops[key] = (new, task)
                if self._update_vm is not None:
                    self._update_vm(new)
        for key, target in snapshot.items():
            if key not in self._loops:
                self._start(target)
        self._metrics.vms.set(len(self._loops))

    async def close(self) -> None:
        for key in list(self._loops):
            await self._stop(key, why="shutdown")
        self._metrics.vms.set(0)

    def _start(self, target: VmTarget) -> None:
        with structlog.contextvars.bound_contextvars(vm=target.key, node=self._node):
            task = asyncio.create_task(self._keep_running(target), name=f"vm {target.key}")
        self._loops[target.key] = (target, task)
        log.info("vm_added", vm=target.key, node=self._node, uid=target.uid)

    async def _stop(self, key: str, *, why: str) -> None:
        # pop first: whatever happens next, this VM is never stopped (or forgotten) twice.
        _, task = self._loops.pop(key)
        task.cancel()
        await asyncio.wait([task])
        self._metrics.forget_vm(key)
        log.info("vm_removed", vm=key, node=self._node, why=why)

    async def _keep_running(self, target: VmTarget) -> None:
        while True:
            try:
                await self._run_vm(target)
                return
            except Exception:
                # A task boundary: log it, and try again later with a fresh state.
                self._metrics.vm_loop_restarts.inc()
                log.exception("vm_loop_crashed", restart_in_seconds=self._restart_delay)
            await asyncio.sleep(self._restart_delay)


class VmLoops:
    """``run`` for the supervisor's loops, and ``update`` to tell a running one of its VM's
    newer target."""

    def __init__(self, deps: RunnerDeps) -> None:
        self._deps = deps
        self._running: dict[str, VmRunner] = {}

    async def run(self, target: VmTarget) -> None:
        runner = VmRunner(target, self._deps)
        self._running[target.key] = runner
        try:
            await runner.run()
        finally:
            if self._running.get(target.key) is runner:
                del self._running[target.key]

    def update(self, target: VmTarget) -> None:
        runner = self._running.get(target.key)
        if runner is not None:
            runner.update(target)
