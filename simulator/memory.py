"""The simulator's model of a VM's memory: what its guest uses over time, and the agent-like
policy that sizes it.

Pure: no I/O, no clock (callers pass ``now``), no randomness. The real agent's memory policy
lives with the agent (``autoscaler_agent``); this is a small stand-in with the same shape, so
that the simulator can show the extender's memory accounting under load without depending on
it. Its rules, per scrape:

* **grow** at once, in one step, when the guest uses more than ``target_used_fraction`` of its
  memory: to the smallest size (``min + k * unit``) at which it uses no more than that;
* **shrink** only after the guest has used less than ``shrink_used_fraction`` for
  ``shrink_after_seconds`` (hysteresis), to that same smallest size, and never below what it
  uses plus ``margin_bytes``.

The guest model: ``used`` is memory the guest's processes hold (anonymous, not reclaimable).
Memory above ``used`` is free or page cache and can be given back; memory below it cannot. So
a shrink ends where the guest stopped: at the asked size, or at ``used`` rounded up to the
unit, whichever is larger. A guest whose ``used`` exceeds its memory is out of memory: the
report counts those moments (``ooms``) and their time.
"""

from __future__ import annotations

import math

import msgspec

from protocol.annotations import VmSpec

MemorySegments = tuple[tuple[float, int], ...]  # (from_seconds, used_bytes), sorted, from 0


class MemoryPolicyConfig(msgspec.Struct, frozen=True, kw_only=True):
    target_used_fraction: float = 0.75
    shrink_used_fraction: float = 0.5
    shrink_after_seconds: float = 60.0
    margin_bytes: int = 256 * 2**20


class MemoryPolicyState(msgspec.Struct, frozen=True, kw_only=True):
    # Since when the guest has used less than the shrink fraction; None: it does not.
    low_since: float | None = None


def round_up_memory(spec: VmSpec, value: int) -> int:
    """The smallest allowed size >= ``value`` (``min + k * unit``), at most the top size."""
    if value <= spec.min_memory_bytes:
        return spec.min_memory_bytes
    unit = spec.memory_unit_bytes
    steps = -(-(value - spec.min_memory_bytes) // unit)
    return min(spec.top_memory_bytes, spec.min_memory_bytes + steps * unit)


def memory_goal(
    spec: VmSpec,
    state: MemoryPolicyState,
    *,
    used: int,
    current: int,
    config: MemoryPolicyConfig,
    now: float,
) -> tuple[int, MemoryPolicyState]:
    """The size to aim at now, and the policy's state after this scrape."""
    fit = round_up_memory(spec, math.ceil(used / config.target_used_fraction))
    if used > config.target_used_fraction * current:
        return max(fit, current), MemoryPolicyState()
    if used >= config.shrink_used_fraction * current:
        return current, MemoryPolicyState()
    low_since = state.low_since if state.low_since is not None else now
    if now - low_since < config.shrink_after_seconds:
        return current, MemoryPolicyState(low_since=low_since)
    goal = max(fit, round_up_memory(spec, used + config.margin_bytes))
    return min(goal, current), MemoryPolicyState(low_since=low_since)


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
