"""Is a VM's wanted size really happening? Grow latency to the guest, and the "stuck" signal.

Pure: no I/O, no clock (``now`` is passed in), no randomness. The runner feeds ``observe`` with
what the state machine knows after every step and turns the answer into metrics and log lines.

**Online** means online in the guest: a CPU the guest's kernel schedules tasks on. The agent
reads it from the guest's node_exporter: ``node_cpu_seconds_total`` comes from /proc/stat, and
the kernel lists only online CPUs there (``for_each_online_cpu``), so the number of distinct
``cpu`` labels is the online count (``Samples.cpu_count``). A vCPU the hypervisor has plugged
but the guest has not onlined (no udev rule, a slow guest) is therefore *not* online: it
cannot run anything yet. The count is as fresh as the last scrape, so a latency is up to one
scrape interval late.

**Grow latency** (decision -> online). An episode opens at the step where the agent first
wants more vCPUs than the VM has (``desired > current``: the policy's grow is due, before the
permit call and the resize), from the size it had then. It closes, observed, at the first step
after a grow landed (the VM has more than at the decision) where the guest has all of the
VM's vCPUs online: the time a user waits for the CPUs the decision brought. A permit that
allows part of the wish ends the episode once that part is online; the rest is a new
decision from there (and while it waits for room, the stuck signal below speaks). It closes
unobserved (*abandoned*) when nothing was plugged and the agent no longer wants more than the
size it started from (the load went away first). Without a CPU count from the guest it
cannot be observed and closes unobserved once a grow landed.

**Stuck.** A change is *pending* while the agent wants another size than the VM has
(``desired != current``), or while the guest has fewer CPUs online than the VM has plugged up
to the wanted size. A VM is *stuck* once a change has been pending for ``stuck_after_seconds``
without a break: the extender keeps denying the permit, the hypervisor keeps refusing, or the
guest never onlines a plugged vCPU. Steps where the size is unknown (re-reading it after a
failed resize) or the wish is (no fresh metrics: the runner passes ``desired=None``) neither
start nor end a pending change, nor a grow episode.
"""

from __future__ import annotations

import msgspec


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """What one ``observe`` found. ``grow_latency_seconds``: an episode closed observed now."""

    grow_latency_seconds: float | None = None
    grow_abandoned: bool = False
    is_stuck: bool = False
    # Since when (monotonic seconds) the pending change has been pending; None: none pending.
    pending_since: float | None = None


class ScalingProgress:
    """One VM's grow episode and pending change (see the module docstring)."""

    __slots__ = (
        "_grow_from",
        "_grow_since",
        "_pending_since",
        "stuck_after_seconds",
    )

    def __init__(self, *, stuck_after_seconds: float) -> None:
        self.stuck_after_seconds = stuck_after_seconds
        self._grow_since: float | None = None
        self._grow_from = 0
        self._pending_since: float | None = None

    @property
    def is_growing(self) -> bool:
        return self._grow_since is not None

    def observe(
        self, now: float, *, current: int | None, desired: int | None, online: int | None
    ) -> Progress:
        """After a step: ``current`` (hypervisor), ``desired`` (the agent's wish), ``online``
        (CPUs online in the guest at the last scrape); None where unknown."""
        latency: float | None = None
        abandoned = False
        if current is not None and desired is not None:
            if self._grow_since is None and desired > current:
                self._grow_since, self._grow_from = now, current
            since = self._grow_since
            if since is not None:
                if current > self._grow_from:  # a grow landed: wait for the guest
                    if online is None or online >= current:
                        # Timed only if the guest says; either way this decision is done.
                        latency = now - since if online is not None else None
                        self._grow_since = None
                        if desired > current:  # a partial permit: the rest is a new wait
                            self._grow_since, self._grow_from = now, current
                elif desired <= self._grow_from:
                    self._grow_since = None
                    abandoned = True

            is_not_online = online is not None and online < min(current, desired)
            if desired != current or is_not_online:
                if self._pending_since is None:
                    self._pending_since = now
            else:
                self._pending_since = None
        pending = self._pending_since
        return Progress(
            grow_latency_seconds=latency,
            grow_abandoned=abandoned,
            is_stuck=pending is not None and now - pending >= self.stuck_after_seconds,
            pending_since=pending,
        )
