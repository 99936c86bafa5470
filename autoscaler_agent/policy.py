"""How many vCPUs a VM should have, from what its guest's node_exporter says.

Pure: no I/O, no clock, no randomness. ``goal_vcpus`` is a function of the samples, the VM's
bounds, the small state it returned last time (hysteresis windows and the previous CPU
counters) and an explicit ``now``.

Why three signals. ``node_load1`` is the kernel's 1-minute exponential average: after a step
from 1 to 8 busy threads it needs ~3.5 minutes to say "8". Two faster signals come on the same
page: the CPU counters (busy fraction over the last scrape interval) and ``node_procs_running``
(runnable tasks *now*, from /proc/stat; the exporter itself is one of them).

The estimates, per scrape (``c`` = current vCPUs):

* ``busy`` = 1 - (idle + iowait) / total, over all CPUs, between the previous scrape and this
  one. Unknown on the first scrape, after a counter reset, or when the number of CPUs changed
  (a hot-plugged CPU brings its whole history into one delta).
* ``used = busy * online``: the vCPUs the guest really used (``online``: the CPUs the
  counters cover, normally ``c``). Below saturation this *is* the demand.
* ``saturated``: ``busy >= saturated_busy_fraction`` (0.9). Then the demand may be anything
  above ``c``, and only the run queue says how far: ``runnable = procs_running - 1``.
* ``demand_now = max(used, runnable, load1)`` when saturated, else ``used``.
* **Demand hidden by throttling** also counts as saturated. The VM's QEMU threads share its
  container's CPU quota: a guest that wants more than the quota does not read busier, it reads
  *less* busy (on the real node, under 8 pgbench clients, "busy 0.39 of 1 vCPUs" with load1
  7.70), because the time its vCPU threads sit throttled passes in the guest as time not run.
  Below saturation the busy time is then no measure of the demand. Two signs say so, each
  over the last scrape interval: the VM container was throttled in at least
  ``throttled_fraction`` (0.1) of its CFS periods (its cgroup's ``cpu.stat``, which the agent
  reads on its node: ``Samples.cfs_*``), or the hypervisor stole at least ``steal_fraction``
  (0.1) of the guest's CPU time (``mode="steal"``, reported by KVM guests, not TCG ones).
  Then the demand is the run queue and the load average, as neondatabase/autoscaling sizes
  on them alone (``pkg/agent/core/goalcu.go``: ``load average / LoadAverageFractionTarget``,
  0.9), and the VM does not shrink (below). The guest's own run queue and load1 are not a
  sign by themselves: after a load drops, load1 stays above the vCPUs for minutes, and one
  scrape's burst of short-lived tasks joined to it asked idle VMs to grow and closed their
  shrink windows (the simulator's fleet showed it). Each sign needs the evidence to last
  like any other pressure (the grow window); once it has, every scrape that still shows the
  sign keeps asking for the same size, so a request denied for lack of room is made again
  at its retry time rather than dropped by a scrape that reads the throttled guest as idle.

The rule, and why it neither lags nor oscillates:

* **Grow fast, in one step, on evidence that lasts.** ``need = ceil(demand / target_load_per_vcpu)``
  rounded *up* to the scaling unit and clamped to ``[min, top]``. While ``need(demand_now) > c``
  a *pressure window* is open; once it has lasted ``grow_after_seconds`` (3 s, i.e. four 1 s
  scrapes) the VM grows straight to ``need(second largest of the window's last 5 demand_now
  values)``. The wait ignores one noisy scrape. The second largest ignores one noisy run-queue
  sample, and sizes the VM for the upper part of the load's spread, not its middle: sized for
  the median, a VM sits exactly on its target (busy ~0.9, the saturation threshold too), half
  its scrapes ask for more, and under ±5% noise four in a row come soon enough that a large VM
  crept up one vCPU after another (hypothesis found 1 -> 40 -> 41 -> 42 under a steady demand
  of 36). The window stays open until the need no longer exceeds the size, so the goal holds
  while the permit and the resize are under way. A window is evidence about *one size*: once
  the VM has another (the grow landed, or a permit allowed part of it), the window starts
  again, and a second step needs ``grow_after_seconds`` of its own at the new size. Carried
  over, the old window let a single noisy scrape right after a grow to the target grow the VM
  again at once (the same 1 -> 40 -> 41 -> 42 showed that too). A step from 1 to 8 busy
  threads is then one resize, one window and a permit round trip after the load arrives (on
  load1 alone it was several resizes, one per step load1 crept up).
* **Shrink on what the guest did, after a window, and not too far.** The shrink size is
  ``need(used)`` at the *lower* ``shrink_load_per_vcpu`` (0.6), and never below
  ``need(demand_now)`` at the target: after shrinking the load per vCPU is at most 0.6, well
  below the grow threshold, so the next sample cannot ask to grow back under the same load.
  The VM shrinks only once that size has stayed below ``c`` for ``shrink_after_seconds`` (30 s,
  every scrape of it), and then to the *largest* shrink size seen during that window, so a
  spike inside it keeps the VM bigger; one busy scrape closes the window. A VM whose load
  stops is therefore back at its minimum ~``shrink_after_seconds`` plus one resize later.
  Why busy time and not load1: load1 decays with a 1-minute time constant, so 7 busy threads that
  stop leave it above 0.6 for ~2.5 minutes (``ln(7 / 0.6)`` time constants). The busy fraction is
  measured over the whole scrape interval, so it is the guest's real use, and it is as steady as the
  load: a steady load ±5% reads ~0.9 per vCPU at the target and needs a 33% drop, held for 30 s, to
  shrink. The run queue is left out on purpose: an instant count of short-lived tasks, it would make
  an idle VM's shrink size jump (an idle guest shows 0-2 runnable tasks), and below saturation the
  busy time is the demand. The window is the price: a load that pauses for longer than it (a batch
  every 2 minutes) gets a shrink and a grow per pause; the 1-minute load1 hid such pauses, and also
  held every VM a few minutes too big after every real stop.
  A VM held back (throttled or stolen from) never shrinks: its shrink size is at
  least its size, and such a scrape closes the shrink window like any busy one. Its busy time
  is a floor of its demand, not a measure of it.
* **Without a busy fraction for one interval** (first scrape, counters reset, CPUs hot-plugged
  since the last scrape) the policy holds, and keeps its windows as they were. **Without CPU
  counters at all** (an exporter with the cpu collector off) it is the load1-only rule: grow
  at once to ``need(load1)``, shrink as above on load1 alone (the slow rule: it waits for
  load1 to decay).

Under a steady load the size therefore changes at most once or twice (a grow, maybe one more
when run-queue noise pushes a VM that sits exactly on the target over it) and then stays put;
``tests/agent/test_policy.py`` checks that with hypothesis, also with noisy signals.

``PolicyState.is_quiet`` (no window open) is what the simulator needs to skip the scrapes of a
settled VM: a quiet state carries nothing but the previous CPU counters, so the decision at a
scrape depends only on that scrape's samples and the counters one interval before.
"""

from __future__ import annotations

import math

import msgspec

from protocol.annotations import VmSpec
from protocol.sizes import Bounds

# How many of the pressure window's per-scrape demand estimates the grow size is taken from (the
# second largest): enough to outvote a noisy run-queue sample, few enough to follow a rising load.
DEMAND_WINDOW_SAMPLES = 5
# More vCPUs than any VM has: what a load too large to count (inf) needs.
_HUGE_VCPUS = 2**31


# gc=False on Samples, PolicyState and Goal: frozen and holding only numbers, tuples of numbers
# and each other, they can never be part of a reference cycle, so the cyclic GC need not track
# them. A fleet simulation makes several per scrape of every VM.
class Samples(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The few node_exporter values the agent reads from one scrape; None when absent."""

    load1: float | None = None
    # Runnable tasks at the moment of the scrape (node_procs_running), the exporter included.
    procs_running: float | None = None
    # Sums over all CPUs and modes (total) and over all CPUs in mode idle or iowait (idle);
    # rates are taken between two scrapes because the counters are since boot.
    cpu_seconds_total: float | None = None
    cpu_idle_seconds_total: float | None = None
    # How many CPUs the counters cover (online CPUs): a change means a hot-plug.
    cpu_count: int | None = None
    # Of cpu_seconds_total, the time the hypervisor ran something else while a vCPU wanted to
    # run (mode="steal"); only guests with a paravirtual clock report it (KVM, not TCG).
    cpu_steal_seconds_total: float | None = None
    # Not the guest's: the VM container's CFS bandwidth counters (its cgroup's ``cpu.stat``),
    # which the agent reads on its node: scheduling periods, and those in which the container
    # ran out of its quota. None when the agent cannot read them.
    cfs_periods_total: float | None = None
    cfs_throttled_periods_total: float | None = None
    memory_available_bytes: float | None = None
    memory_total_bytes: float | None = None
    # PSI (node_exporter's pressure collector), seconds since boot: time in which some task
    # waited for memory (``some``), and in which all non-idle tasks did (``full``).
    memory_waiting_seconds_total: float | None = None
    memory_stalled_seconds_total: float | None = None


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The knobs of the default policy. Units are in the names."""

    # Load (runnable tasks) that one vCPU should carry; grow to ceil(demand / this).
    target_load_per_vcpu: float = 0.9
    # Lower threshold used to size a shrink; must be below the target, or sizes would flap.
    shrink_load_per_vcpu: float = 0.6
    # How long the shrink size must stay below the current size before the VM shrinks.
    shrink_after_seconds: float = 30.0
    # Busy fraction (0..1, over one scrape interval) from which the VM counts as saturated:
    # its demand may exceed its vCPUs, and the run queue is read to tell by how much.
    saturated_busy_fraction: float = 0.9
    # How long the fast demand estimate must stay above the current size before a grow. Four
    # 1 s scrapes in a row: with three, a VM sitting on the target under ±5% noise crept one
    # vCPU further now and then (1 in 3,000 random runs in tests/agent/test_policy.py).
    grow_after_seconds: float = 3.0
    # Demand hidden by throttling (see the module docstring): from this fraction of CFS periods
    # in which the VM container was throttled, or of CPU time stolen from the guest, over one
    # scrape interval, the guest's demand counts as above what its busy time shows.
    throttled_fraction: float = 0.1
    steal_fraction: float = 0.1


class PolicyState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What the policy carries from one sample to the next."""

    # Since when (monotonic seconds) the shrink size has been below the current size; None if not.
    low_since: float | None = None
    # The largest shrink size seen since ``low_since``, and when it was last seen.
    low_peak_vcpus: int | None = None
    low_peak_at: float | None = None
    # The samples after the last one at the peak: since when, and their largest shrink size.
    # When the window ends at the peak, they are a window already under way at that size.
    low_after_peak_since: float | None = None
    low_after_peak_vcpus: int | None = None
    # Since when the fast demand estimate has needed more than the current size; None if not.
    pressure_since: float | None = None
    # The last (at most DEMAND_WINDOW_SAMPLES) demand estimates since ``pressure_since``.
    pressure_demands: tuple[float, ...] = ()
    # The size the VM had while the pressure window gathered its evidence: a window is about
    # one size, and restarts when the VM has another (see the module docstring).
    pressure_vcpus: int | None = None
    # The previous scrape's CPU counters, for the busy fraction over the next interval.
    cpu_seconds_total: float | None = None
    cpu_idle_seconds_total: float | None = None
    cpu_count: int | None = None
    cpu_steal_seconds_total: float | None = None
    cfs_periods_total: float | None = None
    cfs_throttled_periods_total: float | None = None

    @property
    def is_quiet(self) -> bool:
        """No window open: the next decision depends on the next samples alone."""
        return self.low_since is None and self.pressure_since is None


class Goal(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The goal and the parts that explain it; ``reason`` is the sentence that gets logged."""

    vcpus: int
    current_vcpus: int
    load1: float | None
    busy_fraction: float | None = None  # over the last scrape interval, None if unknown
    demand_vcpus: float | None = None  # the fast demand estimate (demand_now), None if unknown
    grow_vcpus: int | None  # the one-step grow size (need at the target load), or None
    shrink_vcpus: int | None  # the size a shrink would go to (at the lower load), or None
    state: PolicyState
    reason: str
    # Over the last scrape interval: the fraction of CFS periods the VM container was
    # throttled in, and the fraction of CPU time stolen from the guest; None if unknown.
    throttled_fraction: float | None = None
    steal_fraction: float | None = None
    # Why the guest's demand counts as hidden (its container throttled, time stolen), or None.
    held_back: str | None = None


def _size_for(load: float, load_per_vcpu: float, bounds: Bounds, top_vcpus: int) -> int:
    """The smallest allowed size that carries ``load`` at ``load_per_vcpu`` (at least one vCPU),
    clamped to ``[min, top_vcpus]``. A load beyond any VM (1e308 / 0.9 is inf, which math.ceil
    refuses) needs "very many"."""
    ratio = load / load_per_vcpu - 1e-9
    low = bounds.min
    if ratio <= low:
        # ceil(ratio) <= min (an int, at least 1): the minimum, without building the need.
        return low
    need = math.ceil(ratio) if ratio < _HUGE_VCPUS else _HUGE_VCPUS
    return bounds.round_up(need, top=top_vcpus)


def _busy_fraction(
    cpu_before: float | None, idle_before: float | None, count_before: int | None, samples: Samples
) -> float | None:
    t0, t1 = cpu_before, samples.cpu_seconds_total
    i0, i1 = idle_before, samples.cpu_idle_seconds_total
    if t0 is None or t1 is None or i0 is None or i1 is None:
        return None
    if count_before != samples.cpu_count:
        return None  # hot-plug: the new CPU's counters since boot are in this delta
    total, idle = t1 - t0, i1 - i0
    if total <= 0 or idle < 0:
        return None  # counters reset (guest reboot) or no time passed
    busy = 1.0 - idle / total
    # min(1.0, max(0.0, busy)), spelled out: this runs a few times per scrape of every VM
    busy = busy if busy > 0.0 else 0.0
    return 1.0 if busy > 1.0 else busy


def _delta_fraction(
    part_before: float | None,
    part_after: float | None,
    whole_before: float | None,
    whole_after: float | None,
) -> float | None:
    # What share of the growth of one counter (``whole``) the growth of another was, between
    # two scrapes; None when either is unknown, no time passed, or the counters were reset.
    if part_before is None or part_after is None or whole_before is None or whole_after is None:
        return None
    part, whole = part_after - part_before, whole_after - whole_before
    if whole <= 0 or part < 0:
        return None
    return part / whole if part < whole else 1.0


def _usable(value: float | None) -> float | None:
    # Finite and not negative (NaN fails both comparisons).
    return value if value is not None and 0.0 <= value < math.inf else None


def _second_largest(values: tuple[float, ...]) -> float:
    ordered = sorted(values)
    return ordered[-2] if len(ordered) > 1 else ordered[-1]


def goal_vcpus(
    samples: Samples,
    spec: VmSpec,
    state: PolicyState,
    *,
    current_vcpus: int,
    top_vcpus: int,
    config: PolicyConfig,
    now: float,
    explain: bool = True,
) -> Goal:
    """The vCPUs this VM should have now, with the reason, and the next policy state.

    ``top_vcpus`` is the largest size allowed (``spec.top_vcpus``, possibly lowered by the
    hypervisor's own maximum). The formula is in the module docstring. ``explain=False`` skips
    formatting ``reason`` (left empty, unless it is a fixed sentence) and changes nothing else:
    for callers that only look at the decision (the simulator's search for a settled VM's next
    one), since formatting the sentence costs as much as the decision itself.
    """
    load1 = _usable(samples.load1)
    # The state after this scrape carries its counters, for the next busy fraction.
    cpu, idle, count = samples.cpu_seconds_total, samples.cpu_idle_seconds_total, samples.cpu_count
    carried = PolicyState(
        cpu_seconds_total=cpu,
        cpu_idle_seconds_total=idle,
        cpu_count=count,
        cpu_steal_seconds_total=samples.cpu_steal_seconds_total,
        cfs_periods_total=samples.cfs_periods_total,
        cfs_throttled_periods_total=samples.cfs_throttled_periods_total,
    )
    busy = _busy_fraction(
        state.cpu_seconds_total, state.cpu_idle_seconds_total, state.cpu_count, samples
    )
    throttled = _delta_fraction(
        state.cfs_throttled_periods_total,
        samples.cfs_throttled_periods_total,
        state.cfs_periods_total,
        samples.cfs_periods_total,
    )
    if load1 is None:
        return Goal(
            vcpus=current_vcpus,
            current_vcpus=current_vcpus,
            load1=None,
            busy_fraction=busy,
            grow_vcpus=None,
            shrink_vcpus=None,
            state=carried,
            reason="hold: no usable node_load1 in the samples",
            throttled_fraction=throttled,
        )
    c = current_vcpus
    min_vcpus, bounds = spec.min_vcpus, spec.vcpu_bounds
    if busy is None and cpu is not None and min_vcpus <= c <= top_vcpus:
        # The counters are there but give no fraction this time: hold for one interval, with
        # the windows as they were (a hot-plug must neither open nor close one).
        return Goal(
            vcpus=c,
            current_vcpus=c,
            load1=load1,
            grow_vcpus=None,
            shrink_vcpus=None,
            state=msgspec.structs.replace(
                carried,
                low_since=state.low_since,
                low_peak_vcpus=state.low_peak_vcpus,
                low_peak_at=state.low_peak_at,
                low_after_peak_since=state.low_after_peak_since,
                low_after_peak_vcpus=state.low_after_peak_vcpus,
                pressure_since=state.pressure_since,
                pressure_demands=state.pressure_demands,
                pressure_vcpus=state.pressure_vcpus,
            ),
            reason="hold: no busy fraction this interval (first scrape, hot-plug or reset)",
            throttled_fraction=throttled,
        )
    target = config.target_load_per_vcpu
    demand: float | None = None
    pressure_since: float | None = None
    demands: tuple[float, ...] = ()
    is_saturated = False
    held_back: str | None = None
    steal: float | None = None
    pressed_for = 0.0
    if busy is None:
        grow = _size_for(load1, target, bounds, top_vcpus)
        slow = load1
        is_grow_due = grow > c
    else:
        # busy is a fraction of the CPUs the counters cover: those online in the guest. A
        # vCPU plugged but not (yet) online ran nothing, and counting it would ask for more.
        online = count if count is not None else c
        used = busy * online
        steal = _delta_fraction(
            state.cpu_steal_seconds_total,
            samples.cpu_steal_seconds_total,
            state.cpu_seconds_total,
            cpu,
        )
        if throttled is not None and throttled >= config.throttled_fraction:
            held_back = f"throttled in {throttled:.0%} of CFS periods"
        elif steal is not None and steal >= config.steal_fraction:
            held_back = f"{steal:.0%} of CPU time stolen"
        is_saturated = busy >= config.saturated_busy_fraction or held_back is not None
        demand = used
        if is_saturated:
            runnable = _usable(samples.procs_running)
            queued = 0.0 if runnable is None else max(0.0, runnable - 1)  # the exporter is one
            demand = max(used, load1, queued)
        need_now = _size_for(demand, target, bounds, top_vcpus)
        grow = need_now
        if need_now > c:
            # A window opened at another size is no evidence for this one: after a grow, the
            # next step needs grow_after_seconds of its own at the new size (see the docstring).
            since = state.pressure_since
            is_same_size = since is not None and state.pressure_vcpus == c
            pressure_since = since if since is not None and is_same_size else now
            # Each value kept needs more than c, so the second largest does too.
            kept = [
                d
                for d in (state.pressure_demands if is_same_size else ())
                if _size_for(d, target, bounds, top_vcpus) > c
            ]
            kept.append(demand)
            demands = tuple(kept[-DEMAND_WINDOW_SAMPLES:])
            grow = _size_for(_second_largest(demands), target, bounds, top_vcpus)
            pressed_for = now - pressure_since
        slow = used  # the shrink size follows the busy time (see the module docstring)
        is_grow_due = pressure_since is not None and pressed_for >= config.grow_after_seconds
    # max() with grow: with a sane config it is already >= grow; this guards a misordered one,
    # and keeps a shrink from going below what the fast estimate needs now.
    shrink = _size_for(slow, config.shrink_load_per_vcpu, bounds, top_vcpus)
    shrink = shrink if shrink > grow else grow  # max(grow, shrink)
    if held_back is not None and shrink < c:
        shrink = c  # a guest held back shows less than it wants: it never shrinks on that

    # The decision: the size, the state to carry, and its verdict (formatted only if asked).
    verdict = "hold"
    if c < min_vcpus:
        vcpus = max(grow, min_vcpus)
        new_state = carried
        if explain:
            verdict = f"grow to min {min_vcpus}"
    elif c > top_vcpus:
        # Above max (bounds lowered under a running VM): back to max now, without waiting;
        # any further shrink goes through the usual hysteresis from there.
        vcpus = top_vcpus
        new_state = carried
        if explain:
            verdict = f"shrink to max {top_vcpus}"
    elif grow > c:
        # The window stays open, also once the grow is due: the scrapes until the resize lands
        # must keep asking for this size (a "hold" would drop a permit request still in
        # flight), and if the new size is still short, the next grow needs no second wait.
        new_state = msgspec.structs.replace(
            carried,
            pressure_since=pressure_since,
            pressure_demands=demands,
            pressure_vcpus=c if pressure_since is not None else None,
        )
        if is_grow_due:
            vcpus = grow
            if explain:
                verdict = f"grow {c} -> {grow}"
        else:
            vcpus = c
            verdict = "hold: grow pending"
    elif shrink >= c:
        vcpus = c
        new_state = carried
    else:
        low_since = state.low_since if state.low_since is not None else now
        peak, peak_at = state.low_peak_vcpus, state.low_peak_at
        after_since, after_peak = state.low_after_peak_since, state.low_after_peak_vcpus
        if peak is None or peak_at is None or shrink >= peak:
            peak, peak_at, after_since, after_peak = shrink, now, None, None
        else:
            after_since = after_since if after_since is not None else now
            after_peak = max(shrink, after_peak or shrink)
        low_for = now - low_since
        if low_for >= config.shrink_after_seconds:
            vcpus = peak
            # The samples since the peak was last seen needed less: they are a window already
            # under way at the new size. A load that stops while a window is open (its busy
            # seconds set the peak) is at the minimum one window after it stopped, not after a
            # first shrink to the peak and then a whole second window.
            new_state = msgspec.structs.replace(
                carried,
                low_since=after_since,
                low_peak_vcpus=after_peak,
                low_peak_at=now if after_since is not None else None,
            )
            if explain:
                verdict = f"shrink {c} -> {peak} after {low_for:.0f}s low"
        else:
            vcpus = c
            new_state = msgspec.structs.replace(
                carried,
                low_since=low_since,
                low_peak_vcpus=peak,
                low_peak_at=peak_at,
                low_after_peak_since=after_since,
                low_after_peak_vcpus=after_peak,
            )
            if explain:
                verdict = (
                    f"hold: shrink to {peak} pending, low for {low_for:.0f}s of"
                    f" {config.shrink_after_seconds:.0f}s"
                )

    reason = ""
    if explain:
        if busy is None:
            reason = (
                f"{verdict}: load1 {load1:.2f} at {target} per vCPU needs {grow}"
                f" (shrink size {shrink} at {config.shrink_load_per_vcpu})"
            )
        else:
            pressure = (
                f", pressure for {pressed_for:.0f}s of {config.grow_after_seconds:.0f}s"
                if pressure_since is not None and not is_grow_due
                else ""
            )
            saturated = (
                f" (held back: {held_back})"
                if held_back is not None
                else " (saturated)"
                if is_saturated
                else ""
            )
            reason = (
                f"{verdict}: busy {busy:.2f} of {c} vCPUs{saturated},"
                f" demand {demand:.2f} at {target} per vCPU needs {grow}{pressure},"
                f" load1 {load1:.2f} (shrink size {shrink} at {config.shrink_load_per_vcpu})"
            )
    return Goal(
        vcpus=vcpus,
        current_vcpus=c,
        load1=load1,
        busy_fraction=busy,
        demand_vcpus=demand,
        grow_vcpus=grow,
        shrink_vcpus=shrink,
        state=new_state,
        reason=reason,
        throttled_fraction=throttled,
        steal_fraction=steal,
        held_back=held_back,
    )


def cpu_busy_fraction(previous: Samples | None, current: Samples) -> float | None:
    """The fraction of CPU time not idle between two scrapes, or None if it cannot be told."""
    if previous is None:
        return None
    return _busy_fraction(
        previous.cpu_seconds_total,
        previous.cpu_idle_seconds_total,
        previous.cpu_count,
        current,
    )


def memory_used_fraction(samples: Samples) -> float | None:
    avail, total = samples.memory_available_bytes, samples.memory_total_bytes
    if avail is None or total is None or total <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - avail / total))
