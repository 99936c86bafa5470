"""The agent's decisions for one VM: a state machine driven by events and an explicit ``now``.

Pure: no I/O, no awaits, no clock, no randomness (backoff jitter arrives as an argument), no
logging. The runner (``runner.py``) asks ``VmState.next_actions(now)`` what to do, marks each
action as started, does the I/O, and feeds the outcome back through a past-tense event method.

Why this shape (after neondatabase/autoscaling's ``pkg/agent/core/state.go``): every source of
truth here is eventually consistent. Metrics are a second old, the extender may have restarted
and the hypervisor may have refused a resize. Rather than a sequence of steps that assumes each
one worked, the state records what is *known* and ``next_actions`` works out, from scratch each
time, which single step brings the VM closer to its goal. A lost answer or a failure therefore
never wedges the VM: the next call simply proposes the step again (after a backoff).

The rules the actions obey:

* **Grow:** ask the extender first; resize only up to the permit held, never above it; if the
  permit covers part of the goal, use that part now and ask for the rest later
  (``permit_retry_seconds``), or at once if the goal has grown since.
* **Shrink:** resize first, then tell the extender (a decrease request is a notice). Shrinking
  needs no permit, so it works while the extender is down.
* **Extender trouble** (unreachable, slow, 5xx, item errors, or a permit that breaks the
  protocol): keep at or below the last permit, retry with exponential backoff and jitter. A
  failure never disables growth for good (the old design did, after one scheduler error).
* **Extender restart:** the extender's answers carry its epoch; when the runner sees it change
  it calls ``extender_restarted`` and every VM reports its size and permit (a ``REPORT``) as
  soon as nothing else is in flight. A rebuilt ledger holds VMs it has not heard from at their
  maximum, so the report is what gives their unused room back to the node.
* **Memory** (when the hypervisor reports a memory hot-plug device): decided by
  ``memory_policy.goal_memory`` beside the vCPUs, by the same rules: grow only within the
  permit, shrink first and tell the extender after. Both resources go in *one* request per VM
  (each read on its own on the wire: a request, a notice or steady). A shrink the guest cannot
  complete (memory in use) ends where the guest stopped: the VM's memory is then that size,
  and the notice that follows gives the extender back only what was really unplugged. A
  memory resize that lands while a scrape is in flight makes that scrape's numbers stale for
  memory (MemAvailable from before, the size from after): that scrape holds the memory goal.
* **Bounds:** never resize above ``max_vcpus`` (nor the hypervisor's own maximum) or the permit,
  never below ``min_vcpus``; sizes are always ``min + k * scaling_unit``.
* **Hypervisor failure:** the agent's view becomes unknown and is re-read from the hypervisor
  before anything else; retryable errors back off, the others hold that target for a while.

At most one hypervisor-or-extender operation is in flight per VM (scraping runs alongside):
serialising them keeps every request's ``current`` equal to what the VM really has, which the
protocol needs, and costs nothing in the common path, where the steps are sequential anyway.
"""

from __future__ import annotations

import enum

import msgspec

from autoscaler_agent.memory_policy import (
    MemoryGoal,
    MemoryPolicyConfig,
    MemoryPolicyState,
    couple,
    goal_memory,
)
from autoscaler_agent.policy import (
    Goal,
    PolicyConfig,
    PolicyState,
    Samples,
    cpu_busy_fraction,
    goal_vcpus,
    memory_used_fraction,
)
from protocol.annotations import VmSpec


class CoreConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Timing knobs of the state machine. Units are in the names."""

    scrape_interval_seconds: float = 1.0
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    # After a denied or partial grant, ask again for the same amount no sooner than this.
    permit_retry_seconds: float = 5.0
    # Exponential backoff for extender and hypervisor failures: initial * 2**(n-1), capped, and
    # then shortened by up to ``jitter_fraction`` so that the VMs of a node spread their retries.
    backoff_initial_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    backoff_jitter_fraction: float = 0.5
    # After a resize error that retrying will not fix, wait this long before the same target.
    # Also after a memory shrink the guest could not complete.
    resize_failure_hold_seconds: float = 60.0
    memory: MemoryPolicyConfig = msgspec.field(default_factory=MemoryPolicyConfig)


class CallKind(enum.StrEnum):
    REQUEST = "request"  # requested > current: asking for more
    NOTICE = "notice"  # requested < current: already shrunk, giving back
    # requested = the permit held (>= current): telling a restarted extender what this VM
    # runs and holds, so that its rebuilt ledger stops holding the VM at its maximum.
    REPORT = "report"


# gc=False on PermitCall, Resize and Actions, as on the policy's values: frozen, made of scalars
# and each other, never part of a reference cycle; next_actions makes one per step of every VM.
class PermitCall(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One ResourceRequest the runner should send (the wire form is built by the client)."""

    kind: CallKind
    current_vcpus: int  # ``current`` on the wire
    requested_vcpus: int
    last_permit_vcpus: int | None
    # The vCPUs the VM has when asking: a valid answer lies in [usage, requested].
    usage_vcpus: int
    load1: float | None = None
    cpu_busy_fraction: float | None = None
    memory_used_fraction: float | None = None
    reason: str
    # Memory, read like the vCPUs: ``current``/``requested``/``lastPermit`` on the wire, and
    # what the VM has (a valid answer lies in [usage, requested]). None: memory is not managed
    # (no hot-plug device known), and the wire carries the VM's minimum as steady.
    current_memory_bytes: int | None = None
    requested_memory_bytes: int | None = None
    last_permit_memory_bytes: int | None = None
    usage_memory_bytes: int | None = None


class Resize(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    vcpus: int
    reason: str


class MemoryResize(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    memory_bytes: int
    reason: str


class Actions(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What to do now. ``wait_seconds``: when to ask again if no event comes first (None: only
    an event can change anything)."""

    scrape: bool = False
    read_vcpus: bool = False
    request_permit: PermitCall | None = None
    resize: Resize | None = None
    notify_extender: PermitCall | None = None
    wait_seconds: float | None = None
    resize_memory: MemoryResize | None = None


class PermitOutcome(enum.StrEnum):
    GRANTED = "granted"
    PARTIAL = "partial"
    DENIED = "denied"
    RELEASED = "released"
    # The answer broke the protocol (above the request, vCPUs below usage, memory below the
    # VM's minimum): ignored.
    REJECTED = "rejected"


_NOTHING: tuple[None, None, None] = (None, None, None)
_Decision = tuple[Resize | MemoryResize | None, PermitCall | None, PermitCall | None]


class _Busy(enum.Enum):
    READ = "read"
    RESIZE = "resize"
    RESIZE_MEMORY = "resize_memory"
    PERMIT = "permit"


class VmState:
    """Everything the agent knows about one VM, and the rules for what to do next.

    Invariants (each may be briefly false only where noted):

    * ``permit_vcpus >= current_vcpus`` whenever both are known, except right after a read that
      shows the VM larger than any permit we knew of; the first read then adopts the VM's size
      as the permit (the VM already runs with it, and the extender learns it from lastPermit).
    * ``current_vcpus`` is None exactly when the hypervisor must be (re-)read: at start and
      after a failed resize, because a failed resize may have half happened.
    * At most one of read / resize / permit call is in flight (``_busy``).
    """

    # One per VM on the node (20,000 in the simulator's fleet): slots keep each small.
    __slots__ = (
        "_ask_again_at",
        "_ask_again_memory_at",
        "_asked_memory",
        "_asked_vcpus",
        "_busy",
        "_call",
        "_cpu_busy",
        "_explain",
        "_extender_retry_at",
        "_failed_memory_target",
        "_failed_resize_target",
        "_hypervisor_max_vcpus",
        "_memory_ceiling",
        "_memory_changed_at",
        "_memory_policy_state",
        "_memory_resize_failures",
        "_memory_retry_at",
        "_memory_target",
        "_next_scrape_at",
        "_policy_state",
        "_read_failures",
        "_read_retry_at",
        "_report_due",
        "_resize_failures",
        "_resize_retry_at",
        "_resize_target",
        "_scrape_in_flight",
        "_scrape_started_at",
        "_top_memory",
        "_top_vcpus",
        "config",
        "current_memory",
        "current_vcpus",
        "extender_failures",
        "goal",
        "memory_goal",
        "memory_room",
        "permit_memory",
        "permit_vcpus",
        "samples",
        "scrape_failures",
        "spec",
    )

    def __init__(
        self,
        *,
        spec: VmSpec,
        config: CoreConfig,
        now: float,
        permit_vcpus: int | None = None,
        permit_memory: int | None = None,
        memory_room: int | None = None,
        explain: bool = True,
    ) -> None:
        # Fixed for the life of the state: new bounds come with a new pod, so a new VmState.
        self.spec = spec
        self.config = config
        # False: goals carry no reason sentence (nor do the resizes and calls that quote it).
        # For the simulator, which decides exactly the same but never reads the sentences.
        self._explain = explain
        self.current_vcpus: int | None = None
        self._hypervisor_max_vcpus: int | None = None
        # top_vcpus, kept up to date by the hypervisor_max_vcpus setter: it is read several
        # times per scrape of every VM, and only changes when the hypervisor says so.
        self._top_vcpus = spec.top_vcpus
        self.permit_vcpus: int | None = permit_vcpus
        self.goal: Goal | None = None
        self.samples: Samples | None = None
        self._policy_state = PolicyState()
        self._cpu_busy: float | None = None

        self._next_scrape_at = now
        self._scrape_in_flight = False
        self._scrape_started_at = now
        self.scrape_failures = 0

        # Memory: None until a read reports a hot-plug device (then the agent manages it).
        self.current_memory: int | None = None
        self._top_memory = spec.top_memory_bytes
        self.permit_memory: int | None = permit_memory
        # The guest memory the VM container's memory limit, as the kubelet has applied it,
        # leaves room for (None: no limit known). A grant raises the limit through the pod's
        # in-place resize, which the kubelet applies a moment later: plugging memory the guest
        # then touches before that would run QEMU into the old limit and the OOM killer.
        # Growth waits for it (``memory_room_seen``); the permit is not asked for again.
        self.memory_room: int | None = memory_room
        self.memory_goal: MemoryGoal | None = None
        self._memory_policy_state = MemoryPolicyState()
        self._memory_changed_at: float | None = None
        self._memory_target: int | None = None
        self._memory_resize_failures = 0
        self._memory_retry_at = now
        self._failed_memory_target: int | None = None
        self._asked_memory: int | None = None
        self._ask_again_memory_at = now
        # A permit below the memory the VM has: the extender counts no more than this (it did
        # not hold the rest, and the node has no room for it), so the VM must shrink to it.
        self._memory_ceiling: int | None = None

        self._busy: _Busy | None = None
        self._call: PermitCall | None = None
        self._resize_target: int | None = None

        self._read_failures = 0
        self._read_retry_at = now

        self.extender_failures = 0  # consecutive; > 0 means degraded
        self._extender_retry_at = now
        self._asked_vcpus: int | None = None  # last request that was not fully granted
        self._ask_again_at = now

        self._resize_failures = 0
        self._resize_retry_at = now
        self._failed_resize_target: int | None = None

        self._report_due = False  # the extender restarted and has not heard from this VM

    # -- derived values ------------------------------------------------------------------

    @property
    def hypervisor_max_vcpus(self) -> int | None:
        """The hypervisor's own maximum for this VM, once it has said (None until then)."""
        return self._hypervisor_max_vcpus

    @hypervisor_max_vcpus.setter
    def hypervisor_max_vcpus(self, value: int | None) -> None:
        self._hypervisor_max_vcpus = value
        top = self.spec.top_vcpus
        if value is not None:
            top = min(top, self.spec.round_vcpus_down(value))
        self._top_vcpus = top

    @property
    def top_vcpus(self) -> int:
        """Largest allowed size: max_vcpus, lowered to the hypervisor's maximum if known."""
        return self._top_vcpus

    @property
    def is_resizing_vcpus(self) -> bool:
        """A vCPU resize is in flight: the size is about to change."""
        return self._busy is _Busy.RESIZE

    @property
    def desired_vcpus(self) -> int | None:
        """The goal clamped to the bounds, or the current size when there is no fresh goal."""
        current = self.current_vcpus
        if current is None:
            return None
        return self._desired(current)

    def _desired(self, current: int, *, coupled: bool = True) -> int:
        goal = self.goal
        # "hold" means keep whatever the VM has now, even if that changed since the sample.
        target = current if goal is None or goal.vcpus == goal.current_vcpus else goal.vcpus
        # max(min_vcpus, min(target, top)), spelled out: this runs at every step of every VM.
        top, low = self._top_vcpus, self.spec.min_vcpus
        target = top if target > top else target
        target = target if target > low else low
        mem = self.current_memory
        if coupled and mem is not None and self.config.memory.memory_per_vcpu_bytes > 0:
            mem_goal = self.memory_goal
            target, _ = couple(
                target,
                mem if mem_goal is None else mem_goal.memory_bytes,
                self.spec,
                top_vcpus=top,
                top_memory_bytes=self._top_memory,
                memory_per_vcpu_bytes=self.config.memory.memory_per_vcpu_bytes,
            )
        return target

    @property
    def top_memory(self) -> int:
        """Largest allowed memory: max-memory, lowered to the hypervisor's maximum if known."""
        return self._top_memory

    @property
    def desired_memory(self) -> int | None:
        """The memory goal clamped to the bounds (coupled to the vCPUs if configured), or the
        current size when there is no fresh goal; None while memory is not managed."""
        current = self.current_memory
        if current is None:
            return None
        return self._desired_memory(current)

    def _desired_memory(self, current: int) -> int:
        goal = self.memory_goal
        target = current if goal is None else goal.memory_bytes
        ratio = self.config.memory.memory_per_vcpu_bytes
        if ratio > 0 and self.current_vcpus is not None:
            _, target = couple(
                self._desired(self.current_vcpus, coupled=False),
                target,
                self.spec,
                top_vcpus=self._top_vcpus,
                top_memory_bytes=self._top_memory,
                memory_per_vcpu_bytes=ratio,
            )
        if self._memory_ceiling is not None:
            target = min(target, self._memory_ceiling)
        return max(self.spec.min_memory_bytes, min(target, self._top_memory))

    @property
    def is_extender_degraded(self) -> bool:
        return self.extender_failures > 0

    def _backoff(self, failures: int, jitter: float) -> float:
        c = self.config
        delay = min(c.backoff_max_seconds, c.backoff_initial_seconds * 2.0 ** (failures - 1))
        return delay * (1.0 - c.backoff_jitter_fraction * min(1.0, max(0.0, jitter)))

    # -- the decision --------------------------------------------------------------------

    def next_actions(self, now: float) -> Actions:
        deadlines: list[float] = []
        scrape = False
        if not self._scrape_in_flight:
            if now >= self._next_scrape_at:
                scrape = True
                deadlines.append(now + self.config.scrape_interval_seconds)
            else:
                deadlines.append(self._next_scrape_at)

        read = False
        resize: Resize | MemoryResize | None = None
        request: PermitCall | None = None
        notice: PermitCall | None = None
        if self._busy is None:
            current = self.current_vcpus
            if current is None:
                if now >= self._read_retry_at:
                    read = True
                else:
                    deadlines.append(self._read_retry_at)
            else:
                resize, request, notice = self._decide(now, current, deadlines)

        wait = None
        if deadlines:
            wait = min(deadlines) - now
            if not wait > 0.0:
                wait = 0.0
        return Actions(
            scrape=scrape,
            read_vcpus=read,
            request_permit=request,
            resize=resize if isinstance(resize, Resize) else None,
            resize_memory=resize if isinstance(resize, MemoryResize) else None,
            notify_extender=notice,
            wait_seconds=wait,
        )

    def _decide(self, now: float, current: int, deadlines: list[float]) -> _Decision:
        desired = self._desired(current)
        permit = self.permit_vcpus if self.permit_vcpus is not None else current
        mem = self.current_memory
        if mem is None:
            mem_desired = mem_permit = 0
        else:
            mem_desired = self._desired_memory(mem)
            mem_permit = self.permit_memory if self.permit_memory is not None else mem
        if (
            desired == current
            and permit == current
            and mem_desired == mem_permit == (mem or 0)
            and not self._report_due
        ):
            return _NOTHING  # the common case, settled: none of the branches below applies
        why = self.goal.reason if self.goal is not None else "no fresh metrics: hold"

        # 1. A resize, if one is due: a shrink needs no permit; a grow goes as far as the permit.
        target: int | None = None
        if desired < current:
            target, verb = desired, "shrink"
        elif desired > current:
            allowed = min(desired, self.spec.round_vcpus_down(permit), self._top_vcpus)
            if allowed > current:
                target = allowed
                verb = "grow" if allowed == desired else f"grow within permit {permit}"
        if target is not None:
            if now >= self._resize_retry_at or target != self._failed_resize_target:
                return Resize(vcpus=target, reason=f"{verb}: {why}"), None, None
            deadlines.append(self._resize_retry_at)
        mem_why = ""
        if mem is not None:
            mem_goal = self.memory_goal
            mem_why = mem_goal.reason if mem_goal is not None else "no fresh metrics: hold"
            mem_target: int | None = None
            if mem_desired < mem:
                mem_target, verb = mem_desired, "shrink memory"
            elif mem_desired > mem:
                room = self.memory_room
                within = mem_permit if room is None else min(mem_permit, room)
                allowed = min(mem_desired, self.spec.round_memory_down(within), self._top_memory)
                if allowed > mem:
                    mem_target = allowed
                    if allowed == mem_desired:
                        verb = "grow memory"
                    elif within < mem_permit:
                        verb = f"grow memory within the container's applied limit ({within})"
                    else:
                        verb = f"grow memory within permit {mem_permit}"
            if mem_target is not None:
                if now >= self._memory_retry_at or mem_target != self._failed_memory_target:
                    return (
                        MemoryResize(memory_bytes=mem_target, reason=f"{verb}: {mem_why}"),
                        None,
                        None,
                    )
                deadlines.append(self._memory_retry_at)

        # 2. Talk to the extender, unless it is backing off. One call carries both resources.
        extender_ready = now >= self._extender_retry_at
        cpu_wants = desired > permit
        if cpu_wants:
            asked = self._asked_vcpus
            if asked is not None and desired <= asked and now < self._ask_again_at:
                deadlines.append(self._ask_again_at)
                cpu_wants = False
        mem_wants = mem is not None and mem_desired > mem_permit
        if mem_wants:
            asked_mem = self._asked_memory
            if (
                asked_mem is not None
                and mem_desired <= asked_mem
                and now < self._ask_again_memory_at
            ):
                deadlines.append(self._ask_again_memory_at)
                mem_wants = False
        cpu_gives = permit > current and desired <= current
        mem_gives = mem is not None and mem_permit > mem and mem_desired <= mem
        kind: CallKind | None = None
        if cpu_wants or mem_wants:
            kind = CallKind.REQUEST
            reason = why if cpu_wants else mem_why
        elif cpu_gives or mem_gives:
            kind = CallKind.NOTICE
            parts = []
            if cpu_gives:
                parts.append(f"give back {permit - current} unused vCPUs: {why}")
            if mem_gives:
                parts.append(f"give back {mem_permit - (mem or 0)} bytes of memory: {mem_why}")
            reason = "; ".join(parts)
        elif self._report_due:
            kind = CallKind.REPORT
            reason = f"extender restarted: report {current} vCPUs, permit {permit}"
            if mem is not None:
                reason += f"; memory {mem}, permit {mem_permit}"
        if kind is None:
            return _NOTHING
        if not extender_ready:
            deadlines.append(self._extender_retry_at)
            return _NOTHING
        # Each resource on the wire: a request (current -> desired), a notice (permit ->
        # current, already shrunk), or what the VM has and holds (current -> permit).
        if kind is CallKind.REPORT:
            wire = (current, permit)
        elif desired > permit:
            wire = (current, desired)
        elif cpu_gives:
            wire = (permit, current)
        else:
            wire = (current, permit)
        call = self._call_for(kind, wire[0], wire[1], permit, reason)
        if mem is None:
            return (None, call, None) if kind is not CallKind.NOTICE else (None, None, call)
        if kind is CallKind.REPORT:
            mem_wire = (mem, mem_permit)
        elif mem_desired > mem_permit:
            mem_wire = (mem, mem_desired)
        elif mem_gives:
            mem_wire = (mem_permit, mem)
        else:
            mem_wire = (mem, mem_permit)
        call = msgspec.structs.replace(
            call,
            current_memory_bytes=mem_wire[0],
            requested_memory_bytes=mem_wire[1],
            last_permit_memory_bytes=mem_permit,
            usage_memory_bytes=mem,
        )
        return (None, call, None) if kind is not CallKind.NOTICE else (None, None, call)

    def _call_for(
        self, kind: CallKind, wire_current: int, requested: int, permit: int, reason: str
    ) -> PermitCall:
        samples = self.samples
        return PermitCall(
            kind=kind,
            current_vcpus=wire_current,
            requested_vcpus=requested,
            last_permit_vcpus=permit,
            usage_vcpus=self.current_vcpus if self.current_vcpus is not None else wire_current,
            load1=samples.load1 if samples is not None else None,
            cpu_busy_fraction=self._cpu_busy,
            memory_used_fraction=memory_used_fraction(samples) if samples is not None else None,
            reason=reason,
        )

    # -- events: scraping ----------------------------------------------------------------

    def scrape_started(self, now: float) -> None:
        self._scrape_in_flight = True
        self._scrape_started_at = now
        # Scheduled from the start, so the interval does not drift by the scrape's duration.
        self._next_scrape_at = now + self.config.scrape_interval_seconds

    def metrics_scraped(self, now: float, samples: Samples) -> Goal | None:
        """New samples: recompute the goal. Returns it (None while the size is unknown)."""
        self._scrape_in_flight = False
        self.scrape_failures = 0
        self._cpu_busy = cpu_busy_fraction(self.samples, samples)
        self.samples = samples
        if self.current_vcpus is None:
            self.goal = None
            return None
        self.goal = goal_vcpus(
            samples,
            self.spec,
            self._policy_state,
            current_vcpus=self.current_vcpus,
            top_vcpus=self.top_vcpus,
            config=self.config.policy,
            now=now,
            explain=self._explain,
        )
        self._policy_state = self.goal.state
        self._memory_scraped(now, samples)
        return self.goal

    def _memory_scraped(self, now: float, samples: Samples) -> None:
        mem = self.current_memory
        if mem is None:
            self.memory_goal = None
            return
        changed = self._memory_changed_at
        if changed is not None and changed >= self._scrape_started_at:
            # The size changed while this scrape was in flight: its MemAvailable may be from
            # before, the size is from after. Hold for one scrape, windows untouched.
            self.memory_goal = None
            return
        self.memory_goal = goal_memory(
            samples.memory_total_bytes,
            samples.memory_available_bytes,
            self.spec,
            self._memory_policy_state,
            current_bytes=mem,
            top_bytes=self._top_memory,
            config=self.config.memory,
            now=now,
        )
        self._memory_policy_state = self.memory_goal.state

    def scrape_failed(self, now: float, error: str) -> None:
        """No metrics: hold the current size (never act on stale data) and restart hysteresis."""
        self._scrape_in_flight = False
        self.scrape_failures += 1
        self.goal = None
        self._policy_state = PolicyState()
        self.memory_goal = None
        self._memory_policy_state = MemoryPolicyState()

    # -- events: hypervisor --------------------------------------------------------------

    def memory_room_seen(self, now: float, room: int | None) -> None:
        """The pod's VM container now has a memory limit (as applied) with room for ``room``
        bytes of guest memory; None when no limit is known. A later ``next_actions`` grows
        into it when a permit already covers more."""
        self.memory_room = room

    def vcpus_read_started(self, now: float) -> None:
        self._busy = _Busy.READ

    def vcpus_read(
        self,
        now: float,
        *,
        current_vcpus: int,
        max_vcpus: int | None,
        current_memory: int | None = None,
        max_memory: int | None = None,
    ) -> None:
        """The hypervisor's view. ``current_memory``/``max_memory``: given only when the VM has
        a memory hot-plug device (max above its boot memory); memory is managed from then on."""
        self._busy = None
        self._read_failures = 0
        self.current_vcpus = current_vcpus
        self.hypervisor_max_vcpus = max_vcpus
        if self.permit_vcpus is None or self.permit_vcpus < current_vcpus:
            self.permit_vcpus = current_vcpus
        if current_memory is not None:
            self._memory_is(now, current_memory)
            if max_memory is not None:
                self._top_memory = min(
                    self.spec.top_memory_bytes, self.spec.round_memory_down(max_memory)
                )

    def _memory_is(self, now: float, current_memory: int) -> None:
        if current_memory != self.current_memory:
            self._memory_changed_at = now
        self.current_memory = current_memory
        if self._memory_ceiling is not None and current_memory <= self._memory_ceiling:
            self._memory_ceiling = None  # given back: the permit covers the VM again
        if self._memory_ceiling is None and (
            self.permit_memory is None or self.permit_memory < current_memory
        ):
            self.permit_memory = current_memory

    def vcpus_read_failed(self, now: float, error: str, *, jitter: float) -> None:
        self._busy = None
        self._read_failures += 1
        self._read_retry_at = now + self._backoff(self._read_failures, jitter)

    def resize_started(self, now: float, vcpus: int) -> None:
        self._busy = _Busy.RESIZE
        self._resize_target = vcpus

    def resize_succeeded(self, now: float, *, current_vcpus: int, max_vcpus: int | None) -> None:
        self._busy = None
        self._resize_failures = 0
        self._failed_resize_target = None
        self.current_vcpus = current_vcpus
        if max_vcpus is not None:
            self.hypervisor_max_vcpus = max_vcpus

    def resize_failed(self, now: float, error: str, *, is_retryable: bool, jitter: float) -> None:
        self._busy = None
        self._resize_failures += 1
        self._failed_resize_target = self._resize_target
        hold = (
            self._backoff(self._resize_failures, jitter)
            if is_retryable
            else self.config.resize_failure_hold_seconds
        )
        self._resize_retry_at = now + hold
        # The resize may have half happened: only the hypervisor knows the size now.
        self.current_vcpus = None

    def memory_resize_started(self, now: float, memory_bytes: int) -> None:
        self._busy = _Busy.RESIZE_MEMORY
        self._memory_target = memory_bytes

    def memory_resized(self, now: float, *, current_memory: int) -> None:
        self._busy = None
        self._memory_resize_failures = 0
        self._failed_memory_target = None
        self._memory_is(now, current_memory)

    def memory_resize_failed(
        self,
        now: float,
        error: str,
        *,
        is_retryable: bool,
        jitter: float,
        current_memory: int | None = None,
    ) -> None:
        """The resize failed. ``current_memory``: the size in effect, when the hypervisor said
        (a shrink the guest could not complete); otherwise the size is unknown and re-read."""
        self._busy = None
        self._memory_resize_failures += 1
        self._failed_memory_target = self._memory_target
        hold = (
            self._backoff(self._memory_resize_failures, jitter)
            if is_retryable
            else self.config.resize_failure_hold_seconds
        )
        self._memory_retry_at = now + hold
        if current_memory is not None:
            self._memory_is(now, current_memory)
        else:
            # Only a read tells the size now; it reads the vCPUs too.
            self.current_memory = None
            self.current_vcpus = None

    # -- events: extender ----------------------------------------------------------------

    def permit_requested(self, now: float, call: PermitCall) -> None:
        self._busy = _Busy.PERMIT
        self._call = call

    def permit_granted(
        self, now: float, vcpus: int, *, memory_bytes: int | None = None, jitter: float = 0.0
    ) -> PermitOutcome:
        """The extender answered ``vcpus`` (and ``memory_bytes``) for the call in flight.
        Validates it first."""
        call = self._call
        self._busy = None
        self._call = None
        assert call is not None, "permit_granted without permit_requested"
        has_memory = call.requested_memory_bytes is not None and call.usage_memory_bytes is not None
        is_valid = call.usage_vcpus <= vcpus <= call.requested_vcpus
        if has_memory:
            assert call.requested_memory_bytes is not None and call.usage_memory_bytes is not None
            # Memory may come back below what the VM has: the extender believes memory it did
            # not hold only where it fits, and the VM must give the rest back (docs/API.md).
            is_valid = is_valid and (
                memory_bytes is not None
                and self.spec.min_memory_bytes <= memory_bytes <= call.requested_memory_bytes
            )
        if not is_valid:
            # Above the request is a grant we never asked for; vCPUs below usage would take away
            # vCPUs the VM is running on (memory below it is an order to give it back, but never
            # below the VM's minimum). Either way the extender is confused: keep the old permit
            # and back off as for any other failure.
            self._extender_failed(now, jitter)
            return PermitOutcome.REJECTED
        self.extender_failures = 0
        self.permit_vcpus = vcpus
        # Any answered call told the extender this VM's size and permit.
        self._report_due = False
        # Per resource asked for more: fully, partly or not at all.
        results: list[str] = []
        if vcpus >= call.requested_vcpus:
            self._asked_vcpus = None
            if call.requested_vcpus > call.usage_vcpus:
                results.append("full")
        else:
            self._asked_vcpus = call.requested_vcpus
            self._ask_again_at = now + self.config.permit_retry_seconds
            results.append("none" if vcpus <= call.usage_vcpus else "part")
        if has_memory and memory_bytes is not None:
            assert call.requested_memory_bytes is not None and call.usage_memory_bytes is not None
            self.permit_memory = memory_bytes
            self._memory_ceiling = memory_bytes if memory_bytes < call.usage_memory_bytes else None
            if memory_bytes >= call.requested_memory_bytes:
                self._asked_memory = None
                if call.requested_memory_bytes > call.usage_memory_bytes:
                    results.append("full")
            else:
                self._asked_memory = call.requested_memory_bytes
                self._ask_again_memory_at = now + self.config.permit_retry_seconds
                results.append("none" if memory_bytes <= call.usage_memory_bytes else "part")
        if call.kind is CallKind.NOTICE:
            return PermitOutcome.RELEASED
        if all(r == "full" for r in results):
            return PermitOutcome.GRANTED
        if all(r == "none" for r in results):
            return PermitOutcome.DENIED
        return PermitOutcome.PARTIAL

    def extender_restarted(self, now: float) -> None:
        """The extender's epoch changed: report this VM as soon as nothing else is in flight
        (a request or notice that goes first carries the same facts and also clears it)."""
        self._report_due = True

    def permit_failed(self, now: float, error: str, *, jitter: float) -> None:
        """The call failed (unreachable, timeout, 5xx, 4xx, or an error item for this VM)."""
        self._busy = None
        self._call = None
        self._extender_failed(now, jitter)

    def _extender_failed(self, now: float, jitter: float) -> None:
        self.extender_failures += 1
        self._extender_retry_at = now + self._backoff(self.extender_failures, jitter)

    # -- introspection -------------------------------------------------------------------

    def dump(self) -> dict[str, object]:
        """A plain snapshot for logs and debugging."""
        return {
            "current_vcpus": self.current_vcpus,
            "desired_vcpus": self.desired_vcpus,
            "current_memory": self.current_memory,
            "desired_memory": self.desired_memory,
            "permit_memory": self.permit_memory,
            "permit_vcpus": self.permit_vcpus,
            "top_vcpus": self.top_vcpus,
            "busy": self._busy.value if self._busy else None,
            "extender_failures": self.extender_failures,
            "goal": self.goal.reason if self.goal else None,
            "memory_goal": self.memory_goal.reason if self.memory_goal else None,
        }
