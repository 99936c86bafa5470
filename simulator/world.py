"""The only simulated parts: a VM's load and its guest's metrics, and the durable API view.

Pure: no I/O, no clock, no randomness. Time is an explicit ``t`` (virtual seconds).

Load is *demand* in vCPUs (runnable threads), piecewise constant (``scenario.segments``).
What the agent scrapes is derived from it the way a Linux guest would show it:

* ``node_load1`` counts runnable tasks, so it is **not** capped by the VM's vCPUs (a queue
  forms; that is how the policy sees that it needs more). Under ``Load1Model.KERNEL`` it is the
  kernel's 1-minute exponential average, ``load1(t) = L + (l0 - L) * exp(-(t - t0) / 60)`` for
  the level ``L`` since ``t0``; computed in closed form, so no per-tick state is needed.
* CPU busy time is capped: the VM can run at most ``vcpus`` threads, so the busy fraction is
  ``min(1, demand / vcpus)``; the counters are integrated exactly between changes, and the
  number of CPUs they cover is ``vcpus`` (a resize is a hot-plug).
* ``node_procs_running`` is an instant count of runnable tasks: ``demand`` rounded up or down
  at random (so that its mean is the demand), plus 1 for the exporter reading /proc/stat,
  plus a spike of -1 or +1 task one scrape in ten, never below 1. The randomness is a hash of
  the guest's ``noise_seed`` and the scrape time, not a random stream: a scrape the simulator
  skips draws nothing, so skipping cannot change what a later scrape sees.

Memory, for a VM whose memory scales, is the guest's *use* over time (``memory_segments``):
memory its processes hold (anonymous, not reclaimable). Memory above it is free or page cache
and can be given back; memory below it cannot, so a shrink ends where the guest stopped
(``given_back_to``), as a virtio-mem unplug of memory in use does. A guest whose use exceeds
its memory is out of memory: the report counts those stretches.
"""

from __future__ import annotations

import math
from typing import Final

from autoscaler_agent.policy import Samples
from protocol.annotations import VmSpec
from simulator.scenario import Load1Model, Segments

LOAD1_TAU_SECONDS: Final = 60.0
MEMORY_TOTAL_BYTES: Final = 4 * 2**30
_MEMORY_AVAILABLE_BYTES: Final = MEMORY_TOTAL_BYTES / 2
_MASK64: Final = 2**64 - 1
SEED_MIX: Final = 0x9E3779B97F4A7C15


def noise_bits(seed_mix: int, t: float) -> int:
    """64 pseudo-random bits for (seed, t to the millisecond): splitmix64's finaliser.
    ``seed_mix`` is ``seed * SEED_MIX``, its first step, taken once per guest."""
    # mix64 inlined: this runs at every scrape.
    x = (seed_mix + round(t * 1000)) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mix64(x: int) -> int:
    """splitmix64's finaliser: 64 well-mixed bits from ``x`` (taken mod 2**64)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def procs_running(demand: float, bits: int) -> float:
    """What node_procs_running shows for ``demand`` runnable threads, given a scrape's
    ``noise_bits`` (see above)."""
    count = math.floor(demand + (bits >> 11) / 2**53) + 1
    spike = bits & 0xFF
    if spike < 26:
        count -= 1
    elif spike < 52:
        count += 1
    return float(max(1, count))


class GuestLoad:
    """One VM's demand trace, its smoothed load1 and its CPU counters. Mutable, engine-only."""

    __slots__ = (
        "cpu_seconds",
        "demand",
        "idle_seconds",
        "index",
        "is_instant",
        "l0",
        "model",
        "noise_seed",
        "over_target_seconds",
        "seed_mix",
        "segments",
        "t0",
        "target_load_per_vcpu",
        "updated_at",
        "vcpus",
    )

    def __init__(
        self,
        segments: Segments,
        *,
        model: Load1Model,
        vcpus: int,
        t: float,
        target_load_per_vcpu: float,
        noise_seed: int = 0,
    ) -> None:
        self.segments = segments
        self.noise_seed = noise_seed
        self.seed_mix = noise_seed * SEED_MIX
        self.model = model
        self.is_instant = model is Load1Model.INSTANT
        self.index = 0
        while self.index + 1 < len(segments) and segments[self.index + 1][0] <= t:
            self.index += 1
        self.demand = segments[self.index][1]
        # The guest boots with load at its current demand (no history before it existed).
        self.l0 = self.demand
        self.t0 = t
        self.vcpus = vcpus
        self.updated_at = t
        self.cpu_seconds = 0.0
        # Its own counter, as a kernel keeps it: flat (exactly) while every vCPU is busy. Taken
        # as ``cpu_seconds - busy_seconds`` it could step back by a rounding error, which the
        # agent rightly reads as a counter reset, and where it did depended on how the steps
        # were summed, so skipping settled scrapes changed decisions.
        self.idle_seconds = 0.0
        self.over_target_seconds = 0.0
        self.target_load_per_vcpu = target_load_per_vcpu

    def next_breakpoint(self) -> float | None:
        i = self.index + 1
        return self.segments[i][0] if i < len(self.segments) else None

    def load1(self, t: float) -> float:
        if self.is_instant:
            return self.demand
        return self.demand + (self.l0 - self.demand) * math.exp(-(t - self.t0) / LOAD1_TAU_SECONDS)

    def _integrate(self, t: float) -> None:
        dt = t - self.updated_at
        if dt <= 0:
            return
        self.cpu_seconds += self.vcpus * dt
        self.idle_seconds += self._idle_rate() * dt
        if self.demand > self.target_load_per_vcpu * self.vcpus:
            self.over_target_seconds += dt
        self.updated_at = t

    def advance_segment(self, t: float) -> None:
        """Move to the segment that starts at ``t`` (a breakpoint)."""
        self._integrate(t)
        self.l0 = self.load1(t)
        self.t0 = t
        self.index += 1
        self.demand = self.segments[self.index][1]

    def resized(self, t: float, vcpus: int) -> None:
        self._integrate(t)
        self.vcpus = vcpus

    def finish(self, t: float) -> None:
        self._integrate(t)

    def demand_at(self, t: float) -> float:
        """The demand at ``t`` (now or later in this segment), the next level from a breakpoint
        on even before ``advance_segment`` ran: at a breakpoint the new level counts."""
        nb = self.next_breakpoint()
        if nb is not None and t >= nb:
            return self.segments[self.index + 1][1]
        return self.demand

    def samples(self, t: float) -> Samples:
        self._integrate(t)
        return self._samples(t, self.cpu_seconds, self.idle_seconds)

    def projected_samples(self, t: float, *, is_run_queue_exact: bool = True) -> Samples:
        """What a scrape at ``t`` would show, without moving the guest: valid for ``t`` from
        the last change (scrape, resize) up to the next breakpoint. Without
        ``is_run_queue_exact`` procs_running is its mean, for callers that know it is unread."""
        dt = t - self.updated_at
        return self._samples(
            t,
            self.cpu_seconds + self.vcpus * dt,
            self.idle_seconds + self._idle_rate() * dt,
            is_run_queue_exact=is_run_queue_exact,
        )

    def projected_counters(self, t: float) -> tuple[float, float]:
        """(cpu seconds, idle seconds) at ``t``, valid as for ``projected_samples``."""
        dt = t - self.updated_at
        return self.cpu_seconds + self.vcpus * dt, self.idle_seconds + self._idle_rate() * dt

    def _idle_rate(self) -> float:
        """Idle vCPU-seconds per second now: 0.0 exactly when demand fills every vCPU."""
        idle = self.vcpus - self.demand
        return idle if idle > 0 else 0.0

    def _samples(
        self, t: float, cpu_seconds: float, idle_seconds: float, *, is_run_queue_exact: bool = True
    ) -> Samples:
        return Samples(
            load1=round(self.load1(t), 4),
            procs_running=procs_running(self.demand_at(t), noise_bits(self.seed_mix, t))
            if is_run_queue_exact
            else self.demand + 1,
            cpu_seconds_total=cpu_seconds,
            cpu_idle_seconds_total=idle_seconds,
            cpu_count=self.vcpus,
            memory_available_bytes=_MEMORY_AVAILABLE_BYTES,
            memory_total_bytes=MEMORY_TOTAL_BYTES,
        )


MemorySegments = tuple[tuple[float, int], ...]  # (from_seconds, used_bytes), sorted, from 0


def round_up_memory(spec: VmSpec, value: int) -> int:
    """The smallest allowed size >= ``value`` (``min + k * unit``), at most the top size."""
    return spec.memory_bounds.round_up(value)


def given_back_to(spec: VmSpec, *, asked: int, used: int) -> int:
    """Where a shrink to ``asked`` ends: the guest cannot give back memory its processes hold."""
    return max(asked, round_up_memory(spec, used))


def used_at(segments: MemorySegments, index: int, t: float) -> tuple[int, int]:
    """``(used bytes at t, the segment index)``, searching forward from ``index``."""
    while index + 1 < len(segments) and segments[index + 1][0] <= t:
        index += 1
    return segments[index][1], index


def memory_segments(
    uses: list[tuple[float, int, float]] | None, memory: int, *, step_seconds: float = 1.0
) -> MemorySegments:
    """A VM's ``memory_used`` ``(at, used, over_seconds)`` as segments from 0, a ramp in steps
    of ``step_seconds``; before its first (or without any), the guest uses a quarter of the
    VM's least memory."""
    level = memory // 4
    out: list[tuple[float, int]] = [(0.0, level)]
    for at, used, over in uses or ():
        steps = max(1, math.ceil(over / step_seconds))
        for k in range(1, steps + 1):
            t = float(at) + (k - 1) * over / steps
            value = level + (used - level) * k // steps
            if out[-1][0] == t:
                out[-1] = (t, value)
            else:
                out.append((t, value))
        level = used
    return tuple(out)
