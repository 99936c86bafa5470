"""The agent's decisions for one VM: a state machine driven by events and an explicit ``now``.

Pure: no I/O, no awaits, no clock, no randomness (backoff jitter arrives as an argument), no
logging. The runner (``runner.py``) and the simulator (``simulator.engine``) ask
``VmState.next_actions(now)`` what to do, mark each action as started, do the I/O, and feed
the outcome back through a past-tense event method.

Why this shape (after neondatabase/autoscaling's ``pkg/agent/core/state.go``): every source of
truth here is eventually consistent. Metrics are a second old, the extender may have restarted
and the hypervisor may have refused a resize. Rather than a sequence of steps that assumes each
one worked, the state records what is *known* and ``next_actions`` works out, from scratch each
time, which single step brings the VM closer to its goal. A lost answer or a failure therefore
never wedges the VM: the next call simply proposes the step again (after a backoff).

The state, as in Neon's, is one generic value per resource and a small record per peer:

* ``Scaled`` (``vm.vcpus``, ``vm.memory``): one resource in its own unit (vCPUs, bytes): its
  bounds, the size the hypervisor says it has (``current``), the size the extender permits
  (``permitted``), the resize in flight, and the retry bookkeeping of each peer for it. Every
  rule below is written once over ``Scaled``; only the goals (``policy``, ``memory_policy``)
  and the words of the reasons differ per resource.
* ``_Scrapes`` (the guest's node_exporter), ``_HypervisorPeer`` (reads), ``_ExtenderPeer``
  (the call in flight, failures, the report owed after a restart).

The rules the actions obey, per resource:

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
* **Both resources in one call:** a VM asks once for both (each read on its own on the wire: a
  request, a notice or steady; ``wire.resource_request``). Memory is managed once a read
  reports a hot-plug device (``memory.current`` is then known).
* **Memory's own facts:** a shrink the guest cannot complete (memory in use) ends where the
  guest stopped: the VM's memory is then that size, and the notice that follows gives the
  extender back only what was really unplugged, and the VM is held at what it kept
  (``Scaled.residue``), without retrying the same shrink every window (each retry stalls the
  hypervisor for seconds and ends where the last did), until its goal really changes. A
  permit *below* the memory the VM has is an
  order to give the rest back (``Scaled.ceiling``). Growth stays within the room the pod's
  applied container limit leaves (``Scaled.room``). A memory resize that lands while a scrape
  is in flight makes that scrape's numbers stale for memory (MemAvailable from before, the
  size from after): that scrape holds the memory goal.
* **Bounds:** never resize above the maximum (nor the hypervisor's own) or the permit, never
  below the minimum; sizes are always ``min + k * unit``.
* **Hypervisor failure:** the agent's view becomes unknown and is re-read from the hypervisor
  before anything else; retryable errors back off, the others hold that target for a while.

At most one hypervisor-or-extender operation is in flight per VM (scraping runs alongside):
serialising them keeps every request's ``current`` equal to what the VM really has, which the
protocol needs, and costs nothing in the common path, where the steps are sequential anyway.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

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
from protocol.sizes import Bounds


class CoreConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Timing knobs of the state machine. Units are in the names."""

    scrape_interval_seconds: float = 1.0
    # A failed scrape keeps the last decision while the last good one is at most this old:
    # a guest under load (a TCG one on a busy host) misses the scrape timeout now and then,
    # and forgetting its goal there dropped a permit being asked for and restarted the grow
    # window (seen on the real node: a memory permit of 1152 MiB given back one scrape after
    # it was granted, the pod's limit resized up, down and up again within a second).
    scrape_keep_goal_seconds: float = 3.0
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
    # After the guest signals memory pressure (``memory_signalled``), scrape at once, but no
    # sooner than this after the last scrape started: a guest whose page cache turns over at
    # its memory.high signals many times a second.
    memory_signal_min_interval_seconds: float = 0.2


class Resource(enum.StrEnum):
    VCPUS = "vcpus"
    MEMORY = "memory"  # in bytes


class CallKind(enum.StrEnum):
    REQUEST = "request"  # requested > current: asking for more
    NOTICE = "notice"  # requested < current: already shrunk, giving back
    # requested = the permit held (>= current): telling a restarted extender what this VM
    # runs and holds, so that its rebuilt ledger stops holding the VM at its maximum.
    REPORT = "report"


# gc=False on the values below, as on the policy's: frozen, made of scalars and each other,
# never part of a reference cycle; next_actions makes some per step of every VM.
class Ask(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One resource of a permit call, read as on the wire (``current``/``requested``/
    ``lastPermit``) plus what the VM has (``usage``): a valid answer lies in
    ``[usage, requested]`` (for memory, in ``[min, requested]``: below usage it is an order
    to give memory back)."""

    current: int
    requested: int
    last_permit: int
    usage: int


class PermitCall(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One ResourceRequest the runner should send (``wire.resource_request`` builds it).
    ``memory`` None: memory is not managed (no hot-plug device known), and the wire carries
    the VM's minimum as steady."""

    kind: CallKind
    vcpus: Ask
    memory: Ask | None = None
    load1: float | None = None
    cpu_busy_fraction: float | None = None
    memory_used_fraction: float | None = None
    reason: str


class Resize(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Resize one resource to ``target`` (vCPUs or bytes)."""

    resource: Resource
    target: int
    reason: str


class Actions(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What to do now. ``wait_seconds``: when to ask again if no event comes first (None: only
    an event can change anything)."""

    scrape: bool = False
    read_vcpus: bool = False  # read the hypervisor: vCPUs and memory
    request_permit: PermitCall | None = None
    resize: Resize | None = None
    notify_extender: PermitCall | None = None
    wait_seconds: float | None = None


class PermitOutcome(enum.StrEnum):
    GRANTED = "granted"
    PARTIAL = "partial"
    DENIED = "denied"
    RELEASED = "released"
    # The answer broke the protocol (above the request, vCPUs below usage, memory below the
    # VM's minimum): ignored.
    REJECTED = "rejected"


class Residue(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A shrink the guest stopped short of: asked ``target``, the VM kept ``size`` (memory
    the guest could not give back), while its use was ``used_bytes`` (None if unknown)."""

    target: int
    size: int
    used_bytes: float | None


class _Words(NamedTuple):
    """How a reason names a resource: "grow" + ``verb_suffix``, "give back N ``unused``"."""

    verb_suffix: str
    unused: str
    report: str  # format(current, permitted)


_WORDS = {
    Resource.VCPUS: _Words("", "unused vCPUs", "{} vCPUs, permit {}"),
    Resource.MEMORY: _Words(" memory", "bytes of memory", "memory {}, permit {}"),
}


class Scaled:
    """One resource of one VM, in its own unit: what each peer says of it and the rules over it.

    Invariants (each may be briefly false only where noted):

    * ``permitted >= current`` whenever both are known, except (a) right after a read that
      shows the VM larger than any permit we knew of: the read then adopts the VM's size as
      the permit (the VM already runs with it, and the extender learns it from lastPermit);
      (b) memory under a ``ceiling``: the extender permitted less than the VM has, and the VM
      must shrink to it.
    * ``current`` is None while the hypervisor must be (re-)read (vCPUs: at start and after a
      failed resize, which may have half happened), or, for memory, while it is not managed.
    * ``in_flight`` is set exactly while a resize of this resource is under way.
    """

    # Two per VM on the node (20,000 VMs in the simulator's fleet): slots keep each small.
    __slots__ = (
        "ask_again_at",
        "asked",
        "bounds",
        "ceiling",
        "changed_at",
        "current",
        "failed_target",
        "in_flight",
        "permitted",
        "residue",
        "resize_failures",
        "resource",
        "retry_at",
        "room",
        "top",
    )

    def __init__(
        self,
        resource: Resource,
        bounds: Bounds,
        *,
        now: float,
        permitted: int | None,
        room: int | None = None,
    ) -> None:
        self.resource = resource
        self.bounds = bounds
        # The largest allowed size: the bounds' top, lowered to the hypervisor's maximum.
        self.top = bounds.top
        # The hypervisor's side.
        self.current: int | None = None
        self.changed_at: float | None = None  # when ``current`` last changed
        self.in_flight: int | None = None  # the target of the resize under way
        self.resize_failures = 0  # consecutive
        self.retry_at = now  # a failed target is not retried before this
        self.failed_target: int | None = None
        # The extender's side.
        self.permitted: int | None = permitted
        # A permit below what the VM has: the extender counts no more than this (it did not
        # hold the rest, and the node has no room for it), so the VM must shrink to it.
        self.ceiling: int | None = None
        self.asked: int | None = None  # the last request that was not fully granted
        self.ask_again_at = now
        # The container's side (memory only): the guest memory the VM container's memory
        # limit, as the kubelet has applied it, leaves room for (None: no limit known). A grant
        # raises the limit through the pod's in-place resize, which the kubelet applies a
        # moment later: plugging memory the guest then touches before that would run QEMU into
        # the old limit and the OOM killer. Growth waits for it; the permit is not asked again.
        self.room: int | None = room
        # The last shrink the guest could not finish, while the VM still has what it kept:
        # the VM is held there until its goal really changes (``VmState._memory_scraped``).
        self.residue: Residue | None = None

    def hypervisor_max_is(self, value: int | None) -> None:
        top = self.bounds.top
        self.top = top if value is None else min(top, self.bounds.round_down(value))

    def seen(self, now: float, current: int) -> None:
        """The hypervisor says the resource has ``current``."""
        if current != self.current:
            self.changed_at = now
        self.current = current
        if self.residue is not None and current != self.residue.size:
            self.residue = None  # the VM has another size now: what it kept is history
        if self.ceiling is not None and current <= self.ceiling:
            self.ceiling = None  # given back: the permit covers the VM again
        if self.ceiling is None and (self.permitted is None or self.permitted < current):
            self.permitted = current

    def resize_to(self, wanted: int, permitted: int) -> tuple[int, str] | None:
        """The resize due now, if any, and its verb: a shrink needs no permit; a grow goes
        as far as the permit (and the container's room) allows."""
        current = self.current
        assert current is not None
        if wanted == current:
            return None  # the common case: nothing to resize
        suffix = _WORDS[self.resource].verb_suffix
        if wanted < current:
            return wanted, "shrink" + suffix
        if wanted > current:
            room = self.room
            within = permitted if room is None or room >= permitted else room
            allowed = min(wanted, self.bounds.round_down(within), self.top)
            if allowed > current:
                if allowed == wanted:
                    return allowed, "grow" + suffix
                if within < permitted:
                    return allowed, f"grow{suffix} within the container's applied limit ({within})"
                return allowed, f"grow{suffix} within permit {permitted}"
        return None

    def ask(self, kind: CallKind, wanted: int, permitted: int) -> Ask:
        """This resource on the wire: a request (current -> wanted), a notice (permit ->
        current, already shrunk), or what the VM has and holds (current -> permit)."""
        current = self.current
        assert current is not None
        if kind is CallKind.REPORT:
            wire = (current, permitted)
        elif wanted > permitted:
            wire = (current, wanted)
        elif permitted > current and wanted <= current:
            wire = (permitted, current)
        else:
            wire = (current, permitted)
        return Ask(current=wire[0], requested=wire[1], last_permit=permitted, usage=current)

    def granted(self, now: float, ask: Ask, amount: int, *, retry_seconds: float) -> str:
        """The extender answered ``amount`` for ``ask``: "full", "part", "none", or "" when
        this resource asked for nothing more."""
        self.permitted = amount
        self.ceiling = amount if amount < ask.usage else None
        if amount >= ask.requested:
            self.asked = None
            return "full" if ask.requested > ask.usage else ""
        self.asked = ask.requested
        self.ask_again_at = now + retry_seconds
        return "none" if amount <= ask.usage else "part"


class _Busy(enum.Enum):
    READ = "read"
    RESIZE = "resize"
    PERMIT = "permit"


class _Scrapes:
    """The guest's node_exporter, as a peer."""

    __slots__ = ("failures", "in_flight", "next_at", "started_at", "succeeded_at")

    def __init__(self, now: float) -> None:
        self.in_flight = False
        self.next_at = now
        self.started_at = now
        self.succeeded_at: float | None = None
        self.failures = 0  # consecutive


class _HypervisorPeer:
    __slots__ = ("read_failures", "read_retry_at")

    def __init__(self, now: float) -> None:
        self.read_failures = 0
        self.read_retry_at = now


class _ExtenderPeer:
    __slots__ = ("call", "failures", "report_due", "retry_at")

    def __init__(self, now: float) -> None:
        self.call: PermitCall | None = None  # in flight
        self.failures = 0  # consecutive; > 0 means degraded
        self.retry_at = now
        self.report_due = False  # the extender restarted and has not heard from this VM


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None or a <= b else b


class VmState:
    """Everything the agent knows about one VM, and the rules for what to do next.

    At most one of read / resize / permit call is in flight (``_busy``).
    """

    # One per VM on the node (20,000 in the simulator's fleet): slots keep each small.
    __slots__ = (
        "_busy",
        "_cpu_busy",
        "_explain",
        "_extender",
        "_hypervisor",
        "_is_moving",
        "_memory_policy_state",
        "_policy_state",
        "_scrapes",
        "config",
        "goal",
        "memory",
        "memory_goal",
        "samples",
        "spec",
        "vcpus",
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
        vcpu_room: int | None = None,
        explain: bool = True,
    ) -> None:
        # Fixed for the life of the state: new bounds come with a new pod, so a new VmState.
        self.spec = spec
        self.config = config
        # False: goals carry no reason sentence (nor do the resizes and calls that quote it).
        # For the simulator, which decides exactly the same but never reads the sentences.
        self._explain = explain
        self.vcpus = Scaled(
            Resource.VCPUS,
            spec.vcpu_bounds,
            now=now,
            permitted=permit_vcpus,
            room=vcpu_room,
        )
        self.memory = Scaled(
            Resource.MEMORY,
            spec.memory_bounds,
            now=now,
            permitted=permit_memory,
            room=memory_room,
        )
        self.goal: Goal | None = None
        self.memory_goal: MemoryGoal | None = None
        self.samples: Samples | None = None
        self._policy_state = PolicyState()
        self._memory_policy_state = MemoryPolicyState()
        self._cpu_busy: float | None = None
        self._scrapes = _Scrapes(now)
        self._hypervisor = _HypervisorPeer(now)
        self._extender = _ExtenderPeer(now)
        self._busy: _Busy | None = None
        self._is_moving = False

    # -- derived values ------------------------------------------------------------------

    def resource(self, resource: Resource) -> Scaled:
        return self.vcpus if resource is Resource.VCPUS else self.memory

    @property
    def is_moving(self) -> bool:
        return self._is_moving

    def is_resizing(self, resource: Resource) -> bool:
        """A resize of ``resource`` is in flight: its size is about to change."""
        return self.resource(resource).in_flight is not None

    @property
    def desired_vcpus(self) -> int | None:
        """The goal clamped to the bounds, or the current size when there is no fresh goal."""
        current = self.vcpus.current
        return None if current is None else self._wanted_vcpus(current)

    @property
    def desired_memory(self) -> int | None:
        """The memory goal clamped to the bounds (coupled to the vCPUs if configured), or the
        current size when there is no fresh goal; None while memory is not managed."""
        current = self.memory.current
        return None if current is None else self._wanted_memory(current)

    def _wanted_vcpus(self, current: int, *, coupled: bool = True) -> int:
        goal = self.goal
        # "hold" means keep whatever the VM has now, even if that changed since the sample.
        target = current if goal is None or goal.vcpus == goal.current_vcpus else goal.vcpus
        # max(min_vcpus, min(target, top)), spelled out: this runs at every step of every VM.
        top, low = self.vcpus.top, self.spec.min_vcpus
        target = top if target > top else target
        target = target if target > low else low
        mem = self.memory.current
        if coupled and mem is not None and self.config.memory.memory_per_vcpu_bytes > 0:
            mem_goal = self.memory_goal
            target, _ = couple(
                target,
                mem if mem_goal is None else mem_goal.memory_bytes,
                self.spec,
                top_vcpus=top,
                top_memory_bytes=self.memory.top,
                memory_per_vcpu_bytes=self.config.memory.memory_per_vcpu_bytes,
            )
        return target

    def _wanted_memory(self, current: int) -> int:
        goal = self.memory_goal
        # A goal is a judgement of the size it was computed at (``current_bytes``), and a
        # plug takes seconds, during which scrapes go on: a grow goal is a floor (it never
        # asks to shrink a VM that grew past it meanwhile), a shrink goal holds only at the
        # size it judged, and "hold" keeps whatever the VM has now. (Taken as sizes, the
        # goals of scrapes taken during a plug shrank every VM back as soon as its plug
        # landed: the simulator, running this core, showed it flapping at every grow.)
        if goal is None or goal.memory_bytes == goal.current_bytes:
            target = current
        elif goal.memory_bytes > goal.current_bytes:
            target = max(goal.memory_bytes, current)
        else:
            target = goal.memory_bytes if current == goal.current_bytes else current
        ratio = self.config.memory.memory_per_vcpu_bytes
        if ratio > 0 and self.vcpus.current is not None:
            _, target = couple(
                self._wanted_vcpus(self.vcpus.current, coupled=False),
                target,
                self.spec,
                top_vcpus=self.vcpus.top,
                top_memory_bytes=self.memory.top,
                memory_per_vcpu_bytes=ratio,
            )
        if self.memory.ceiling is not None:
            target = min(target, self.memory.ceiling)
        return max(self.spec.min_memory_bytes, min(target, self.memory.top))

    @property
    def extender_failures(self) -> int:
        return self._extender.failures

    @property
    def is_extender_degraded(self) -> bool:
        return self._extender.failures > 0

    @property
    def scrape_failures(self) -> int:
        return self._scrapes.failures

    def _backoff(self, failures: int, jitter: float) -> float:
        c = self.config
        delay = min(c.backoff_max_seconds, c.backoff_initial_seconds * 2.0 ** (failures - 1))
        return delay * (1.0 - c.backoff_jitter_fraction * min(1.0, max(0.0, jitter)))

    # -- the decision --------------------------------------------------------------------

    def next_actions(self, now: float) -> Actions:
        s = self._scrapes
        scrape, wake = False, None
        if not s.in_flight:
            scrape = now >= s.next_at
            wake = now + self.config.scrape_interval_seconds if scrape else s.next_at
        read, resize, call = False, None, None
        # While the VM moves live, neither side is resized nor asks for more: the target node
        # was reserved at the VM's size, and a resize racing the copy would be lost or torn.
        if self._busy is None and not self._is_moving:
            if self.vcpus.current is None:
                read = now >= self._hypervisor.read_retry_at
                if not read:
                    wake = _earliest(wake, self._hypervisor.read_retry_at)
            else:
                resize, call, wake_at = self._decide(now)
                wake = _earliest(wake, wake_at)
        is_notice = call is not None and call.kind is CallKind.NOTICE
        return Actions(
            scrape=scrape,
            read_vcpus=read,
            request_permit=None if is_notice else call,
            resize=resize,
            notify_extender=call if is_notice else None,
            wait_seconds=None if wake is None else max(0.0, wake - now),
        )

    def _decide(self, now: float) -> tuple[Resize | None, PermitCall | None, float | None]:
        """One resize if one is due, else at most one call to the extender; and when to
        look again. Each managed resource as (its state, wanted, permitted, why)."""
        cpu, mem = self.vcpus, self.memory
        current = cpu.current
        assert current is not None
        wanted = self._wanted_vcpus(current)
        if (
            wanted == current
            and (cpu.permitted is None or cpu.permitted == current)
            and mem.current is None
            and not self._extender.report_due
        ):
            return None, None, None  # the common case, settled: nothing below applies
        managed = [self._terms(cpu, wanted, self.goal)]
        if mem.current is not None:
            managed.append(self._terms(mem, self._wanted_memory(mem.current), self.memory_goal))
            if not self._extender.report_due and all(
                w == permitted == r.current for r, w, permitted, _ in managed
            ):
                return None, None, None  # settled, both resources
        wake = None
        for r, wanted, permitted, why in managed:
            step = r.resize_to(wanted, permitted)
            if step is not None:
                target, verb = step
                if now >= r.retry_at or target != r.failed_target:
                    return (
                        Resize(resource=r.resource, target=target, reason=f"{verb}: {why}"),
                        None,
                        wake,
                    )
                wake = _earliest(wake, r.retry_at)
        call, wake_at = self._call(now, managed)
        return None, call, _earliest(wake, wake_at)

    def _terms(self, r: Scaled, wanted: int, goal: Goal | MemoryGoal | None) -> _Terms:
        assert r.current is not None
        permitted = r.permitted if r.permitted is not None else r.current
        return _Terms(
            r, wanted, permitted, goal.reason if goal is not None else "no fresh metrics: hold"
        )

    def _call(self, now: float, managed: list[_Terms]) -> tuple[PermitCall | None, float | None]:
        """The call the extender should hear now: a request for more, a notice of what was
        given back, or the report a restarted extender is owed; one call carries both."""
        ext = self._extender
        wake = None
        wants: list[str] = []
        gives: list[str] = []
        for r, wanted, permitted, why in managed:
            current = r.current
            assert current is not None
            if wanted > permitted:
                if r.asked is not None and wanted <= r.asked and now < r.ask_again_at:
                    wake = _earliest(wake, r.ask_again_at)  # denied too recently
                else:
                    wants.append(why)
            elif permitted > current and wanted <= current:
                gives.append(f"give back {permitted - current} {_WORDS[r.resource].unused}: {why}")
        if wants:
            kind, reason = CallKind.REQUEST, wants[0]
        elif gives:
            kind, reason = CallKind.NOTICE, "; ".join(gives)
        elif ext.report_due:
            kind = CallKind.REPORT
            reason = "extender restarted: report " + "; ".join(
                _WORDS[r.resource].report.format(r.current, permitted)
                for r, _, permitted, _ in managed
            )
        else:
            return None, wake
        if now < ext.retry_at:
            return None, _earliest(wake, ext.retry_at)
        asks = [r.ask(kind, wanted, permitted) for r, wanted, permitted, _ in managed]
        samples = self.samples
        return PermitCall(
            kind=kind,
            vcpus=asks[0],
            memory=asks[1] if len(asks) > 1 else None,
            load1=samples.load1 if samples is not None else None,
            cpu_busy_fraction=self._cpu_busy,
            memory_used_fraction=memory_used_fraction(samples) if samples is not None else None,
            reason=reason,
        ), wake

    # -- events: scraping ----------------------------------------------------------------

    def scrape_started(self, now: float) -> None:
        s = self._scrapes
        s.in_flight = True
        s.started_at = now
        # Scheduled from the start, so the interval does not drift by the scrape's duration.
        s.next_at = now + self.config.scrape_interval_seconds

    def metrics_scraped(self, now: float, samples: Samples) -> Goal | None:
        """New samples: recompute the goals. Returns the vCPU goal (None while the size is
        unknown)."""
        self._scrapes.in_flight = False
        self._scrapes.failures = 0
        self._scrapes.succeeded_at = now
        self._cpu_busy = cpu_busy_fraction(self.samples, samples)
        self.samples = samples
        current = self.vcpus.current
        if current is None:
            self.goal = None
            return None
        self.goal = goal_vcpus(
            samples,
            self.spec,
            self._policy_state,
            current_vcpus=current,
            top_vcpus=self.vcpus.top,
            config=self.config.policy,
            now=now,
            explain=self._explain,
        )
        self._policy_state = self.goal.state
        self._memory_scraped(now, samples)
        return self.goal

    def _memory_scraped(self, now: float, samples: Samples) -> None:
        mem = self.memory
        if mem.current is None:
            self.memory_goal = None
            return
        if mem.changed_at is not None and mem.changed_at >= self._scrapes.started_at:
            # The size changed while this scrape was in flight: its MemAvailable may be from
            # before, the size is from after. Hold for one scrape, windows untouched.
            self.memory_goal = None
            return
        self.memory_goal = goal_memory(
            samples.memory_total_bytes,
            samples.memory_available_bytes,
            self.spec,
            self._memory_policy_state,
            current_bytes=mem.current,
            top_bytes=mem.top,
            config=self.config.memory,
            now=now,
            waiting_seconds_total=samples.memory_waiting_seconds_total,
            stalled_seconds_total=samples.memory_stalled_seconds_total,
        )
        self._memory_policy_state = self.memory_goal.state
        self._hold_residue(mem)

    def _hold_residue(self, mem: Scaled) -> None:
        """A VM whose guest could not give back its last blocks is held at what it kept, with
        no retry, while the goal is the shrink that stopped short (or one between it and the
        size kept): each retry stalls the hypervisor for seconds and ends where the last one
        did (a guest that keeps two 2 MiB blocks off its memory grid keeps them). The goal
        really changes when it asks for a grow, for less than the shrink that stopped, or
        when the guest's use has fallen by a memory unit since (what held the blocks may be
        gone). One line says so: the warning of the shrink that stopped short."""
        res, goal, c = mem.residue, self.memory_goal, mem.current
        if res is None or goal is None or c is None or goal.memory_bytes == c:
            return
        used = goal.used_bytes
        has_freed = (
            used is not None
            and res.used_bytes is not None
            and used <= res.used_bytes - self.spec.memory_unit_bytes
        )
        if res.target <= goal.memory_bytes < c and not has_freed:
            mib = 2**20
            self.memory_goal = msgspec.structs.replace(
                goal,
                memory_bytes=c,
                reason=f"hold at {c / mib:.0f} MiB, what the guest kept of the shrink to"
                f" {res.target / mib:.0f} MiB, until the goal changes: {goal.reason}",
            )
        else:
            mem.residue = None

    def memory_signalled(self, now: float) -> float:
        """The guest says its workload crossed its memory.high (vm_image/guest/memory-watch):
        the kernel is throttling it now. Scrape at once rather than at the next interval
        (no sooner than ``memory_signal_min_interval_seconds`` after the last scrape started,
        and after the one in flight), and decide on those samples with the same policy: the
        signal brings the decision forward; what to do stays the memory policy's. Returns
        when the next scrape was due before the signal (what the scrapes alone would do)."""
        s = self._scrapes
        due = s.next_at
        soonest = max(now, s.started_at + self.config.memory_signal_min_interval_seconds)
        s.next_at = min(s.next_at, soonest)
        return due

    def scrape_failed(self, now: float, error: str) -> bool:
        """No metrics. While the last good scrape is at most ``scrape_keep_goal_seconds`` old,
        keep the decision made on it (goal, windows, the permit being asked for) and return
        True; after that, hold the current size (never act on stale data), restart the
        hysteresis and return False."""
        s = self._scrapes
        s.in_flight = False
        s.failures += 1
        if (
            s.succeeded_at is not None
            and now - s.succeeded_at <= self.config.scrape_keep_goal_seconds
        ):
            return True
        self.goal = None
        self._policy_state = PolicyState()
        self.memory_goal = None
        self._memory_policy_state = MemoryPolicyState()
        return False

    # -- events: hypervisor --------------------------------------------------------------

    def memory_room_seen(self, now: float, room: int | None) -> None:
        """The pod's VM container now has a memory limit (as applied) with room for ``room``
        bytes of guest memory; None when no limit is known. A later ``next_actions`` grows
        into it when a permit already covers more."""
        self.memory.room = room

    def vcpu_room_seen(self, now: float, room: int | None) -> None:
        """The pod's VM container now has a CPU limit (as applied) with room for ``room``
        vCPUs; None when no limit is known. As ``memory_room_seen``."""
        self.vcpus.room = room

    def moving_seen(self, now: float, is_moving: bool) -> None:
        """The VM started or stopped moving live (its pod's ``migration`` annotation). After a
        move its size is read afresh from the hypervisor: the destination's, whatever the
        source had."""
        if self._is_moving and not is_moving:
            self.vcpus.current = None
            self.memory.current = None
        self._is_moving = is_moving

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
        self._hypervisor.read_failures = 0
        self.vcpus.seen(now, current_vcpus)
        self.vcpus.hypervisor_max_is(max_vcpus)
        if current_memory is not None:
            self.memory.seen(now, current_memory)
            if max_memory is not None:
                self.memory.hypervisor_max_is(max_memory)

    def vcpus_read_failed(self, now: float, error: str, *, jitter: float) -> None:
        self._busy = None
        h = self._hypervisor
        h.read_failures += 1
        h.read_retry_at = now + self._backoff(h.read_failures, jitter)

    def resize_started(self, now: float, resource: Resource, target: int) -> None:
        self._busy = _Busy.RESIZE
        self.resource(resource).in_flight = target

    def resized(self, now: float, resource: Resource, *, current: int, maximum: int | None) -> None:
        """The resize finished: ``current`` is what the VM has now (``maximum``: the
        hypervisor's own, when it said)."""
        self._busy = None
        r = self.resource(resource)
        r.in_flight = None
        r.resize_failures = 0
        r.failed_target = None
        r.seen(now, current)
        if maximum is not None:
            r.hypervisor_max_is(maximum)

    def resize_failed(
        self,
        now: float,
        resource: Resource,
        error: str,
        *,
        is_retryable: bool,
        jitter: float,
        current: int | None = None,
    ) -> None:
        """The resize failed. ``current``: the size in effect, when the hypervisor said (a
        memory shrink the guest could not complete); otherwise the resize may have half
        happened, and only a read (of both resources) tells the size now."""
        self._busy = None
        r = self.resource(resource)
        r.resize_failures += 1
        r.failed_target = r.in_flight
        r.in_flight = None
        hold = (
            self._backoff(r.resize_failures, jitter)
            if is_retryable
            else self.config.resize_failure_hold_seconds
        )
        r.retry_at = now + hold
        if current is not None:
            target = r.failed_target
            if target is not None and target < current:
                goal = self.memory_goal if r is self.memory else None
                r.residue = Residue(
                    target=target,
                    size=current,
                    used_bytes=goal.used_bytes if goal is not None else None,
                )
            r.seen(now, current)
        else:
            r.current = None
            self.vcpus.current = None  # what makes the next step a read

    # -- events: extender ----------------------------------------------------------------

    def permit_requested(self, now: float, call: PermitCall) -> None:
        self._busy = _Busy.PERMIT
        self._extender.call = call

    def permit_granted(
        self, now: float, vcpus: int, *, memory_bytes: int | None = None, jitter: float = 0.0
    ) -> PermitOutcome:
        """The extender answered ``vcpus`` (and ``memory_bytes``) for the call in flight.
        Validates it first."""
        ext = self._extender
        call = ext.call
        self._busy = None
        ext.call = None
        assert call is not None, "permit_granted without permit_requested"
        # Above the request is a grant we never asked for; vCPUs below usage would take away
        # vCPUs the VM is running on; memory below usage is an order to give it back (the
        # extender believes memory it did not hold only where it fits, docs/API.md), but
        # never below the VM's minimum. Either way the extender is confused: keep the old
        # permit and back off as for any other failure.
        is_valid = call.vcpus.usage <= vcpus <= call.vcpus.requested
        mem = call.memory
        if mem is not None:
            is_valid = is_valid and (
                memory_bytes is not None and self.memory.bounds.min <= memory_bytes <= mem.requested
            )
        if not is_valid:
            self._extender_failed(now, jitter)
            return PermitOutcome.REJECTED
        ext.failures = 0
        # Any answered call told the extender this VM's size and permit.
        ext.report_due = False
        retry = self.config.permit_retry_seconds
        results = [self.vcpus.granted(now, call.vcpus, vcpus, retry_seconds=retry)]
        if mem is not None and memory_bytes is not None:
            results.append(self.memory.granted(now, mem, memory_bytes, retry_seconds=retry))
        results = [r for r in results if r]
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
        self._extender.report_due = True

    def permit_failed(self, now: float, error: str, *, jitter: float) -> None:
        """The call failed (unreachable, timeout, 5xx, 4xx, or an error item for this VM)."""
        self._busy = None
        self._extender.call = None
        self._extender_failed(now, jitter)

    def _extender_failed(self, now: float, jitter: float) -> None:
        ext = self._extender
        ext.failures += 1
        ext.retry_at = now + self._backoff(ext.failures, jitter)

    # -- introspection -------------------------------------------------------------------

    def dump(self) -> dict[str, object]:
        """A plain snapshot for logs and debugging."""
        return {
            "current_vcpus": self.vcpus.current,
            "desired_vcpus": self.desired_vcpus,
            "current_memory": self.memory.current,
            "desired_memory": self.desired_memory,
            "permit_memory": self.memory.permitted,
            "permit_vcpus": self.vcpus.permitted,
            "top_vcpus": self.vcpus.top,
            "busy": self._busy.value if self._busy else None,
            "extender_failures": self._extender.failures,
            "goal": self.goal.reason if self.goal else None,
            "memory_goal": self.memory_goal.reason if self.memory_goal else None,
        }


class _Terms(NamedTuple):
    """One managed resource as the decision sees it."""

    r: Scaled
    wanted: int
    permitted: int
    why: str
