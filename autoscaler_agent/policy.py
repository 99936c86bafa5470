"""How many vCPUs a VM should have, from what its guest's node_exporter says.

Pure: no I/O, no clock, no randomness. ``goal_vcpus`` is a function of the samples, the VM's
bounds, the small hysteresis state it returned last time and an explicit ``now``.

The rule, and why it does not oscillate:

* **Grow in one step.** ``need = ceil(load1 / target_load_per_vcpu)``, rounded *up* to the
  scaling unit and clamped to ``[min, top]``. If that is above the current size, it is the goal
  at once. (The old design doubled above 0.9 load per vCPU, so a VM that needed 4x took two
  round trips through the extender and two resizes.)
* **Shrink late, and not too far.** The shrink size is computed with a *lower* load per vCPU
  (``shrink_load_per_vcpu``, default 0.6), so after shrinking the load per vCPU is at most 0.6,
  well below the grow threshold: the next sample cannot ask to grow back under the same load.
  The VM shrinks only once that size has stayed below the current size for
  ``shrink_after_seconds``, and then to the *largest* shrink size seen during that window, so a
  spike inside the window keeps the VM bigger.

Under a steady load the size therefore changes at most once (a grow or a shrink) and then stays
put; ``tests/agent/test_policy.py`` checks that with hypothesis.
"""

from __future__ import annotations

import math

import msgspec

from protocol.annotations import VmSpec


class Samples(msgspec.Struct, frozen=True, kw_only=True):
    """The few node_exporter values the agent reads from one scrape; None when absent."""

    load1: float | None = None
    # Sums over all CPUs and modes (total) and over all CPUs in mode="idle"; rates are taken
    # between two scrapes because the counters are since boot.
    cpu_seconds_total: float | None = None
    cpu_idle_seconds_total: float | None = None
    memory_available_bytes: float | None = None
    memory_total_bytes: float | None = None


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The knobs of the default policy. Units are in the names."""

    # Load (runnable + uninterruptible tasks, 1-minute average) that one vCPU should carry.
    target_load_per_vcpu: float = 0.9
    # Lower threshold used to size a shrink; must be below the target, or sizes would flap.
    shrink_load_per_vcpu: float = 0.6
    # How long the shrink size must stay below the current size before the VM shrinks.
    shrink_after_seconds: float = 30.0


class PolicyState(msgspec.Struct, frozen=True, kw_only=True):
    """What the policy carries from one sample to the next (the hysteresis window)."""

    # Since when (monotonic seconds) the shrink size has been below the current size; None if not.
    low_since: float | None = None
    # The largest shrink size seen since ``low_since``.
    low_peak_vcpus: int | None = None


class Goal(msgspec.Struct, frozen=True, kw_only=True):
    """The goal and the parts that explain it; ``reason`` is the sentence that gets logged."""

    vcpus: int
    current_vcpus: int
    load1: float | None
    grow_vcpus: int | None  # the one-step grow size (need at the target load), or None
    shrink_vcpus: int | None  # the size a shrink would go to (at the lower load), or None
    state: PolicyState
    reason: str


def round_up_to_unit(vcpus: int, spec: VmSpec, *, top_vcpus: int) -> int:
    """The smallest allowed size >= ``vcpus``, clamped to ``[min, top]``."""
    if vcpus <= spec.min_vcpus:
        return spec.min_vcpus
    steps = -(-(vcpus - spec.min_vcpus) // spec.scaling_unit)
    return min(spec.min_vcpus + steps * spec.scaling_unit, top_vcpus)


def _size_for(load1: float, load_per_vcpu: float, spec: VmSpec, top_vcpus: int) -> int:
    # A tiny epsilon keeps 1.8 / 0.9 == 2.0000000000000004 from becoming 3 vCPUs.
    need = max(1, math.ceil(load1 / load_per_vcpu - 1e-9))
    return round_up_to_unit(need, spec, top_vcpus=top_vcpus)


def goal_vcpus(
    samples: Samples,
    spec: VmSpec,
    state: PolicyState,
    *,
    current_vcpus: int,
    top_vcpus: int,
    config: PolicyConfig,
    now: float,
) -> Goal:
    """The vCPUs this VM should have now, with the reason, and the next policy state.

    ``top_vcpus`` is the largest size allowed (``spec.top_vcpus``, possibly lowered by the
    hypervisor's own maximum).
    """
    load1 = samples.load1
    if load1 is None or not math.isfinite(load1) or load1 < 0:
        return Goal(
            vcpus=current_vcpus,
            current_vcpus=current_vcpus,
            load1=None,
            grow_vcpus=None,
            shrink_vcpus=None,
            state=PolicyState(),
            reason="hold: no usable node_load1 in the samples",
        )
    grow = _size_for(load1, config.target_load_per_vcpu, spec, top_vcpus)
    # max() with grow: with a sane config it is already >= grow; this guards a misordered one.
    shrink = max(grow, _size_for(load1, config.shrink_load_per_vcpu, spec, top_vcpus))
    parts = (
        f"load1 {load1:.2f} at {config.target_load_per_vcpu} per vCPU needs {grow}"
        f" (shrink size {shrink} at {config.shrink_load_per_vcpu})"
    )

    def goal(vcpus: int, new_state: PolicyState, verdict: str) -> Goal:
        return Goal(
            vcpus=vcpus,
            current_vcpus=current_vcpus,
            load1=load1,
            grow_vcpus=grow,
            shrink_vcpus=shrink,
            state=new_state,
            reason=f"{verdict}: {parts}",
        )

    if current_vcpus < spec.min_vcpus:
        return goal(max(grow, spec.min_vcpus), PolicyState(), f"grow to min {spec.min_vcpus}")
    if current_vcpus > top_vcpus:
        # Above max (bounds lowered under a running VM): back to max now, without waiting;
        # any further shrink goes through the usual hysteresis from there.
        return goal(top_vcpus, PolicyState(), f"shrink to max {top_vcpus}")
    if grow > current_vcpus:
        return goal(grow, PolicyState(), f"grow {current_vcpus} -> {grow}")
    if shrink >= current_vcpus:
        return goal(current_vcpus, PolicyState(), "hold")
    low_since = state.low_since if state.low_since is not None else now
    peak = max(shrink, state.low_peak_vcpus or shrink)
    low_for = now - low_since
    if low_for >= config.shrink_after_seconds:
        return goal(
            peak,
            PolicyState(),
            f"shrink {current_vcpus} -> {peak} after {low_for:.0f}s low",
        )
    return goal(
        current_vcpus,
        PolicyState(low_since=low_since, low_peak_vcpus=peak),
        f"hold: shrink to {peak} pending, low for {low_for:.0f}s of"
        f" {config.shrink_after_seconds:.0f}s",
    )


def cpu_busy_fraction(previous: Samples | None, current: Samples) -> float | None:
    """The fraction of CPU time not idle between two scrapes, or None if it cannot be told."""
    if previous is None:
        return None
    t0, t1 = previous.cpu_seconds_total, current.cpu_seconds_total
    i0, i1 = previous.cpu_idle_seconds_total, current.cpu_idle_seconds_total
    if t0 is None or t1 is None or i0 is None or i1 is None:
        return None
    total, idle = t1 - t0, i1 - i0
    if total <= 0 or idle < 0:
        return None  # counters reset (guest reboot) or no time passed
    return min(1.0, max(0.0, 1.0 - idle / total))


def memory_used_fraction(samples: Samples) -> float | None:
    avail, total = samples.memory_available_bytes, samples.memory_total_bytes
    if avail is None or total is None or total <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - avail / total))
