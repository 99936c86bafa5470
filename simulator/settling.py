"""Skipping a settled VM's scrapes: when the policy would act next, and the scrape that matters.

A *settled* VM skips scrapes: when nothing is in flight and it holds a size the policy keeps
(``goal == current``, no shrink window open, no permit owed to the extender), its next scrape
that matters is the first one at which the real ``goal_vcpus`` would not hold. Within a segment
load1 moves monotonically towards the level and the policy's sizes are monotone in load1, so
that scrape is found by galloping and bisecting over the scrape grid (or there is none before
the next breakpoint). The engine wakes the VM on that grid, so skipping changes how much work
is done, never a decision (``tests/simulator`` runs every library scenario and two small
fleets both ways and compares).

Pure: no I/O, no clock. This module only predicts what the real policy would do, by calling it
on projected samples; it must not decide anything the agent would not (a wrong prediction here
is a changed decision, which the tests above catch). The one state it changes is the agent's,
through the scrape it takes when a skipped one matters (``catch_up``, ``skipped_scrape``),
exactly as that scrape would have.
"""

from __future__ import annotations

import math

import msgspec

from autoscaler_agent.core import Actions, CoreConfig, VmState
from autoscaler_agent.policy import PolicyState, Samples, goal_vcpus
from simulator.records import VmRecord
from simulator.world import GuestLoad


class Settling:
    """The skipping rules for one run: its agents' config, its end, and its work counters."""

    __slots__ = ("core", "counts", "end_seconds")

    def __init__(self, core: CoreConfig, *, end_seconds: float, counts: dict[str, int]) -> None:
        self.core = core
        self.end_seconds = end_seconds
        # The engine's counters (``scrapes``, ``scrapes_skipped``): the scrapes taken here count.
        self.counts = counts

    def catch_up(self, vm: VmRecord, st: VmState, guest: GuestLoad, at: float) -> None:
        """Take the skipped scrape at ``at`` (the one just before the VM's next real one), so
        the agent's previous CPU counters are one interval old, as without skipping. It holds
        with a quiet state, as every skipped one would have: the policy state is then exactly
        what the skipped scrapes would have left."""
        if at > vm.last_scrape_at + 1e-9:
            self.skipped_scrape(vm, st, at, guest.samples(at))

    def skipped_scrape(self, vm: VmRecord, st: VmState, at: float, samples: Samples) -> None:
        interval = self.core.scrape_interval_seconds
        self.counts["scrapes_skipped"] += round((at - vm.last_scrape_at) / interval) - 1
        st.scrape_started(at)
        st.metrics_scraped(at, samples)
        vm.last_scrape_at = at
        self.counts["scrapes"] += 1

    def holds(
        self,
        vm: VmRecord,
        st: VmState,
        *,
        current: int,
        before: PolicyState,
        samples: Samples,
        at: float,
    ) -> bool:
        """Would the real policy keep ``current``, quietly, if it scraped ``samples`` at ``at``
        after a scrape that left ``before``?"""
        goal = goal_vcpus(
            samples,
            vm.vm_spec,
            before,
            current_vcpus=current,
            top_vcpus=st.vcpus.top,
            config=self.core.policy,
            now=at,
            explain=False,
        )
        return goal.vcpus == current and goal.state.is_quiet

    def settled_until(
        self, vm: VmRecord, st: VmState, guest: GuestLoad, actions: Actions
    ) -> float | None:
        """How long scrapes may be skipped (see the module docstring): None, not at all; inf,
        until the next breakpoint; else the first scrape time at which the policy would act.

        The first scrape ahead is checked as it will be (its interval may hold a resize). From
        the second on, within a segment, the busy fraction is constant and load1 moves
        monotonically from its value now towards the level; the policy's sizes are monotone in
        load1, so the load1 values at which it holds form one interval: the trajectory leaves
        it at most once, found by bisection over the scrape grid with the real ``goal_vcpus``.
        The run queue is noise, but it only counts when the VM is saturated below its top:
        such a VM is not skipped.
        """
        goal = st.goal
        current = st.vcpus.current
        if (
            actions.read_vcpus
            or actions.resize is not None
            or actions.request_permit is not None
            or actions.notify_extender is not None
            or goal is None
            or current is None
            or goal.vcpus != current
            or not goal.state.is_quiet
            or st.vcpus.permitted != current
            or st.is_extender_degraded
        ):
            return None
        return self.holds_until(
            vm, st, guest, current=current, start=vm.last_scrape_at, before=goal.state
        )

    def holds_until(
        self,
        vm: VmRecord,
        st: VmState,
        guest: GuestLoad,
        *,
        current: int,
        start: float,
        before: PolicyState,
    ) -> float | None:
        """Over the grid ``start + k * interval`` (k >= 1) up to the next breakpoint, the first
        scrape time at which the policy would not hold quietly: None if that is the first one,
        inf if there is none. ``before`` is the state after a scrape at ``start``."""
        if (
            current < st.vcpus.top
            and min(guest.demand, current) / current >= self.core.policy.saturated_busy_fraction
        ):
            return None
        interval = self.core.scrape_interval_seconds
        end = guest.next_breakpoint()
        limit = end if end is not None else self.end_seconds + interval
        # Grid points start + k * interval with k in [1, last] lie strictly before the end.
        last = math.ceil((limit - start) / interval - 1e-9) - 1
        if last < 1:
            return math.inf

        def inputs_at(k: int) -> tuple[Samples, PolicyState]:
            """The samples a scrape at k would see, and the state the scrape before it left."""
            at = start + k * interval
            if k == 1:  # its interval may hold a resize: the run queue may count
                return guest.projected_samples(at), before
            # Not saturated below the top (checked above): the run queue is unread.
            cpu, idle = guest.projected_counters(at - interval)
            prev = PolicyState(
                cpu_seconds_total=cpu, cpu_idle_seconds_total=idle, cpu_count=guest.vcpus
            )
            return guest.projected_samples(at, is_run_queue_exact=False), prev

        def holds_at(k: int) -> bool:
            now, prev = inputs_at(k)
            return self.holds(
                vm, st, current=current, before=prev, samples=now, at=start + k * interval
            )

        if not holds_at(1):
            return None
        if last < 2:
            return math.inf
        at = start + 2 * interval
        now, prev = inputs_at(2)
        if not self.holds(vm, st, current=current, before=prev, samples=now, at=at):
            return at
        # At the level (load1 = demand, reached only in the limit) with the steady counters.
        level = msgspec.structs.replace(now, load1=guest.demand)
        if self.holds(vm, st, current=current, before=prev, samples=level, at=at):
            return math.inf

        # Gallop (k = 2, 3, 5, ...) then bisect: a VM in the middle of an approach usually
        # leaves the interval within a few scrapes, and this finds that in a call or two.
        lo, step = 2, 1  # holds at lo
        hi = last + 1  # first k known not to hold; last + 1: none up to the end
        while lo + step < hi:
            if holds_at(lo + step):
                lo += step
                step *= 2
            else:
                hi = lo + step
                break
        lo += 1
        while lo < hi:
            mid = (lo + hi) // 2
            if holds_at(mid):
                lo = mid + 1
            else:
                hi = mid
        return math.inf if lo > last else start + lo * interval
