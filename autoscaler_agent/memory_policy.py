"""How much memory a VM should have, from its guest's own numbers; and CPU/memory coupling.

Pure: no I/O, no clock, no randomness. ``goal_memory`` is a function of the samples, the VM's
bounds, the small state it returned last time and an explicit ``now``, like ``policy.goal_vcpus``.

What "used" means. ``used = MemTotal - MemAvailable``, both from the guest's node_exporter
(meminfo collector). ``MemAvailable`` is the kernel's own estimate of what could be given to a
new allocation without swapping: free memory plus the reclaimable part of the page cache and
slab. So a big page cache does not count as used (a VM that has read its whole disk once is not
grown for it), while tmpfs/shmem, anonymous memory and unreclaimable slab do. Every number is
a difference of two values from *one* scrape, so a memory resize landing between scrapes never
mixes an old MemTotal with a new VM size: the goal is ``current + (what the guest should have
available - what it has available)``, and both terms come from the guest.

The rule (sizes are ``min + k * memory_unit``, clamped to ``[min, top]``):

* **Headroom** for a given use: ``max(min_headroom_bytes, fraction * used)``. ``low`` uses
  ``low_headroom_fraction`` (0.2): below it the guest is close to reclaiming its cache hard, or
  to the OOM killer. ``target`` uses ``target_headroom_fraction`` (0.5): what a resize aims for.
* **Grow at once, in one step, before the guest runs out.** A *trend* is a use that rose by
  more than ``trend_min_fraction`` (6%) of itself in each of the last two scrape intervals; it
  is projected ``lookahead_seconds`` ahead at the smaller of the two rates; so is a single rise
  of more than twice that fraction (an allocation too fast to wait a second interval for).
  Noise is not a trend: a use that wanders ±5% can rise 10% at most, and not 6% twice in a
  row. If the (projected) available
  memory is below ``low``, the VM grows at once (no window: memory that runs out is an OOM
  kill, not a slowdown) to the larger of ``target`` headroom over the use now and ``low``
  headroom over the projected use, rounded *up* to the unit. The gap between ``low`` and
  ``target`` is what keeps a steady use from growing again on the next scrape.
* **Shrink after a window, never below use plus headroom.** The shrink size leaves ``target``
  headroom over the current use (rounded up). The VM shrinks only once that size has stayed
  below the current size for ``shrink_after_seconds`` (every scrape of it), and then to the
  *largest* shrink size seen in the window: a spike inside the window keeps the VM bigger. After
  a shrink the guest has ``target`` headroom, above ``low``, so the same use cannot ask to grow
  back. The shrink never goes below ``used + low headroom`` even when the unit rounds down: the
  size is always rounded up. A use on a trend (a rise in each of the last two intervals, as
  above; a single spike only raises the window's peak) closes the window, and a shrink due
  becomes a hold: the VM shrinks a whole window after the use stopped rising, never while a
  writer fills it (with a short window it did, and grew back on the next scrapes).
* **Grow on pressure, before a stall becomes an OOM.** MemAvailable counts memory the kernel
  could reclaim, in any zone; it says nothing of *where*. Page cache and kernel memory (slab:
  dentries, inodes) can fill the zones kernel allocations may use while hot-plugged memory
  sits free in ZONE_MOVABLE, which they cannot use: the guest then reclaims and stalls, and
  ends in the OOM killer, with MemAvailable looking fine throughout (neondatabase/autoscaling
  #1204 is that OOM). The kernel's pressure stall information says so first: ``some`` is the
  time in which some task waited for memory, ``full`` the time in which all of them did
  (Documentation/accounting/psi.rst). When ``some`` took more than ``pressure_fraction`` of
  the last scrape interval, the VM grows at once by ``pressure_grow_fraction`` of its size
  (at least a unit), whatever MemAvailable says; and it does not shrink: the shrink window
  closes, and a shrink due becomes a hold. Growing only
  helps if the new memory can hold what is stalling: that is why the guest onlines
  hot-plugged memory with the kernel's auto-movable policy (vm_runner/cmdline.py), which
  makes part of it normal. ``full`` is reported (``stalled_seconds``) for the metrics.
* **No usable numbers** (no MemTotal/MemAvailable, or nonsense): hold, and close the windows.

``couple`` ties vCPUs and memory together when ``memory_per_vcpu_bytes`` is set (compute-unit
style, e.g. 1 vCPU : 4 GiB): both are raised to the larger of the two needs, expressed in units.
Off by default: a database VM often needs memory for its cache long before it needs CPU.
"""

from __future__ import annotations

import math

import msgspec

from protocol.annotations import VmSpec


class MemoryPolicyConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The knobs of the memory policy. Units are in the names."""

    # Headroom, as a fraction of used memory, below which the VM grows.
    low_headroom_fraction: float = 0.2
    # Headroom a resize aims for; must be above the low one, or sizes would flap.
    target_headroom_fraction: float = 0.5
    # Headroom never counts as less than this (a small guest still needs room to fork).
    min_headroom_bytes: int = 128 * 2**20
    # How far ahead a rising use is projected: until a grow decided now is online (the next
    # scrape, the permit round trip and the plug; ~1.5 s with 1 s scrapes), with margin. Not
    # more: a one-off jump projected far ahead sizes the VM for a use that never comes.
    lookahead_seconds: float = 3.0
    # A rise counts towards a trend only above this fraction of the use, per scrape interval.
    trend_min_fraction: float = 0.06
    # How long the shrink size must stay below the current size before the VM shrinks.
    shrink_after_seconds: float = 30.0
    # Couple vCPUs and memory: this much memory per vCPU (0: not coupled).
    memory_per_vcpu_bytes: int = 0
    # Grow when some task waited for memory (PSI ``some``) for more than this fraction of the
    # last scrape interval: reclaim is already slowing the guest (0.1 = 100 ms per second).
    pressure_fraction: float = 0.1
    # ... by this fraction of the VM's size (at least one memory unit).
    pressure_grow_fraction: float = 0.25


class MemoryPolicyState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What the memory policy carries from one sample to the next."""

    # The previous scrape's use (MemTotal - MemAvailable) and when it was seen, for the rate.
    used_bytes: float | None = None
    used_at: float | None = None
    # The rate (bytes/s) of the previous interval, if it was a rise above trend_min_fraction.
    rise_per_second: float | None = None
    # Since when the shrink size has been below the current size, and its largest value since.
    low_since: float | None = None
    low_peak_bytes: int | None = None
    # The PSI counters (seconds since boot) at the previous scrape, for their rates.
    waiting_seconds: float | None = None
    stalled_seconds: float | None = None


class MemoryGoal(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The memory goal and the parts that explain it; ``reason`` is the logged sentence."""

    memory_bytes: int
    current_bytes: int
    used_bytes: float | None  # MemTotal - MemAvailable, None if unknown
    available_bytes: float | None
    grow_bytes: int | None  # the size a grow would go to now, or None
    shrink_bytes: int | None  # the size a shrink would go to now, or None
    state: MemoryPolicyState
    reason: str
    # Pressure over the last scrape interval: the fraction of it some task waited for memory,
    # and the seconds in which all of them were stalled (PSI ``full``); None if unknown.
    waiting_fraction: float | None = None
    stalled_seconds: float | None = None
    is_pressure_grow: bool = False  # this goal grows because of pressure (not MemAvailable)


def headroom(used: float, fraction: float, config: MemoryPolicyConfig) -> float:
    return max(float(config.min_headroom_bytes), fraction * max(0.0, used))


def round_memory_up(value: float, spec: VmSpec, *, top_bytes: int) -> int:
    """The smallest allowed size >= ``value``, clamped to ``[min, top]``."""
    return spec.memory_bounds.round_up(value, top=top_bytes)


def _usable(value: float | None) -> float | None:
    return value if value is not None and 0.0 <= value < math.inf else None


def goal_memory(
    samples_total: float | None,
    samples_available: float | None,
    spec: VmSpec,
    state: MemoryPolicyState,
    *,
    current_bytes: int,
    top_bytes: int,
    config: MemoryPolicyConfig,
    now: float,
    waiting_seconds_total: float | None = None,
    stalled_seconds_total: float | None = None,
) -> MemoryGoal:
    """The memory this VM should have now, with the reason, and the next state.

    ``samples_total``/``samples_available``: the guest's MemTotal and MemAvailable in bytes.
    ``top_bytes``: the largest size allowed (``spec.top_memory_bytes``, possibly lowered by
    the hypervisor's own maximum). ``waiting_seconds_total``/``stalled_seconds_total``: the
    guest's PSI memory ``some`` and ``full`` counters, when it exposes them.
    """
    goal = _goal_from_available(
        samples_total,
        samples_available,
        spec,
        state,
        current_bytes=current_bytes,
        top_bytes=top_bytes,
        config=config,
        now=now,
    )
    waiting, stalled = _usable(waiting_seconds_total), _usable(stalled_seconds_total)
    since = state.used_at
    fraction = stalled_delta = None
    if since is not None and now > since:
        if waiting is not None and state.waiting_seconds is not None:
            fraction = max(0.0, waiting - state.waiting_seconds) / (now - since)
        if stalled is not None and state.stalled_seconds is not None:
            stalled_delta = max(0.0, stalled - state.stalled_seconds)
    new_state = msgspec.structs.replace(
        goal.state, waiting_seconds=waiting, stalled_seconds=stalled
    )
    goal = msgspec.structs.replace(
        goal, state=new_state, waiting_fraction=fraction, stalled_seconds=stalled_delta
    )
    c = current_bytes
    if fraction is None or fraction <= config.pressure_fraction:
        return goal
    # Under pressure the shrink window closes, and a shrink due now becomes a hold: a guest
    # waiting for memory gives none back. (Without this, a guest streaming a disk larger than
    # any size grew to its maximum on pressure, shrank once the window passed, and grew again.)
    closed = msgspec.structs.replace(new_state, low_since=None, low_peak_bytes=None)
    mib = 2**20
    words = f"waited {fraction:.0%} of the last interval (stalled {stalled_delta or 0.0:.2f}s)"
    step = max(spec.memory_unit_bytes, config.pressure_grow_fraction * c)
    grow = round_memory_up(c + step, spec, top_bytes=top_bytes)
    if grow > c and grow > goal.memory_bytes:
        return msgspec.structs.replace(
            goal,
            memory_bytes=grow,
            state=closed,
            is_pressure_grow=True,
            reason=f"grow {c / mib:.0f} -> {grow / mib:.0f} MiB on memory pressure: {words}; "
            + goal.reason,
        )
    if goal.memory_bytes < c:
        return msgspec.structs.replace(
            goal,
            memory_bytes=c,
            state=closed,
            reason=f"hold on memory pressure: {words}; " + goal.reason,
        )
    return msgspec.structs.replace(goal, state=closed)


def _goal_from_available(
    samples_total: float | None,
    samples_available: float | None,
    spec: VmSpec,
    state: MemoryPolicyState,
    *,
    current_bytes: int,
    top_bytes: int,
    config: MemoryPolicyConfig,
    now: float,
) -> MemoryGoal:
    total, avail = _usable(samples_total), _usable(samples_available)
    c = current_bytes
    if total is None or avail is None or avail > total or total <= 0:
        return MemoryGoal(
            memory_bytes=c,
            current_bytes=c,
            used_bytes=None,
            available_bytes=None,
            grow_bytes=None,
            shrink_bytes=None,
            state=MemoryPolicyState(),
            reason="hold: no usable MemTotal/MemAvailable in the samples",
        )
    used = total - avail
    rise: float | None = None  # this interval's rate, if it is a rise that counts
    rate = 0.0
    prev = state.used_bytes
    since = state.used_at
    if (
        prev is not None
        and since is not None
        and now > since
        and used - prev > config.trend_min_fraction * prev
    ):
        rise = (used - prev) / (now - since)
        if state.rise_per_second is not None:
            rate = min(rise, state.rise_per_second)
        elif used - prev > 2 * config.trend_min_fraction * prev:
            rate = rise
    projected = used + rate * config.lookahead_seconds
    projected_avail = avail - (projected - used)
    # Sizes as "current + the available memory missing to reach the headroom".
    grow = round_memory_up(
        c
        + max(
            headroom(used, config.target_headroom_fraction, config) - avail,
            headroom(projected, config.low_headroom_fraction, config) - projected_avail,
        ),
        spec,
        top_bytes=top_bytes,
    )
    shrink = round_memory_up(
        c + headroom(used, config.target_headroom_fraction, config) - avail,
        spec,
        top_bytes=top_bytes,
    )
    is_low = projected_avail < headroom(projected, config.low_headroom_fraction, config)
    carried = MemoryPolicyState(used_bytes=used, used_at=now, rise_per_second=rise)
    mib = 2**20
    numbers = (
        f"used {used / mib:.0f} MiB, available {avail / mib:.0f} MiB"
        f"{f', rising {rate / mib:.1f} MiB/s' if rate > 0 else ''}"
    )
    if c < spec.min_memory_bytes:
        target = max(grow, spec.min_memory_bytes)
        new_state, verdict = carried, f"grow to min {spec.min_memory_bytes}"
    elif c > top_bytes:
        target, new_state, verdict = top_bytes, carried, f"shrink to max {top_bytes}"
    elif is_low and grow > c:
        target, new_state = grow, carried
        verdict = f"grow {c / mib:.0f} -> {grow / mib:.0f} MiB"
    elif shrink >= c or is_low:
        target, new_state, verdict = c, carried, "hold"
    elif rise is not None and state.rise_per_second is not None:
        # A use on a trend (a rise in each of the last two intervals; one spike is not one)
        # is not low for long: the window closes, and a shrink due now becomes a hold (it
        # would shrink to a size the next scrapes outgrow).
        target, new_state, verdict = c, carried, "hold: no shrink while the use rises"
    else:
        # A window whose peak is not below the size now began before a shrink landed: its
        # scrapes judged the larger size, and one taken while the shrink was landing may even
        # ask for more than the size now (seen on a real guest), which would make the "shrink"
        # a grow. The window starts again from this scrape, the first judged at this size
        # (not one scrape later: each shrink that lands would cost its next one a scrape).
        is_stale = state.low_peak_bytes is not None and state.low_peak_bytes >= c
        if state.low_since is None or is_stale:
            low_since, peak = now, shrink
        else:
            low_since, peak = state.low_since, max(shrink, state.low_peak_bytes or shrink)
        low_for = now - low_since
        if low_for >= config.shrink_after_seconds:
            target, new_state = peak, carried
            verdict = f"shrink {c / mib:.0f} -> {peak / mib:.0f} MiB after {low_for:.0f}s"
        else:
            target = c
            new_state = MemoryPolicyState(
                used_bytes=used,
                used_at=now,
                rise_per_second=rise,
                low_since=low_since,
                low_peak_bytes=peak,
            )
            verdict = (
                f"hold: shrink to {peak / mib:.0f} MiB pending, low for {low_for:.0f}s of"
                f" {config.shrink_after_seconds:.0f}s"
            )
    return MemoryGoal(
        memory_bytes=target,
        current_bytes=c,
        used_bytes=used,
        available_bytes=avail,
        grow_bytes=grow,
        shrink_bytes=shrink,
        state=new_state,
        reason=f"{verdict}: {numbers}",
    )


def couple(
    vcpus: int,
    memory_bytes: int,
    spec: VmSpec,
    *,
    top_vcpus: int,
    top_memory_bytes: int,
    memory_per_vcpu_bytes: int,
) -> tuple[int, int]:
    """Both goals raised to the larger need in compute units (vCPU + its memory); as given if
    coupling is off. Each is then rounded up to its own unit and clamped to its bounds, so a
    VM whose bounds do not allow the ratio gets as close as they allow."""
    if memory_per_vcpu_bytes <= 0:
        return vcpus, memory_bytes
    units = max(vcpus, math.ceil(memory_bytes / memory_per_vcpu_bytes - 1e-9))
    v = spec.vcpu_bounds.round_up(units, top=top_vcpus)
    m = round_memory_up(units * memory_per_vcpu_bytes, spec, top_bytes=top_memory_bytes)
    return v, m
