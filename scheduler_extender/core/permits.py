"""Answering agents' ResourceRequests with Permits (the rules of ``protocol.permits``).

Pure: no I/O, no awaits, no HTTP. ``decide_batch`` validates the whole batch first, so a batch
that is refused as a whole (another node's pod) leaves the ledger exactly as it was, and then
applies each VM's request in order. Because nothing awaits, a batch is atomic for its node.
Refusals are returned, typed (``refusals``), never raised: the edge picks their statuses.

Each resource (vCPUs, memory) is decided on its own, because a VM holds, per resource, the larger
of its pod's requests and its permitted size:

* decrease (``requested < current``): the agent already shrank; hold ``requested`` from now on.
* steady (``requested == current``): the permit is ``current`` (never above the request); the
  hold becomes ``max(current, min(held, lastPermit))``: nothing the agent still claims is
  released, and nothing it no longer claims is kept (a stale hold would leak).
* increase: ``permit = max(current, min(round_down(requested), round_down(fit)))`` where ``fit``
  is the largest size the node can hold for this VM after giving back what it holds now, and
  ``round_down`` goes to ``min + k * unit``. So ``current <= permit <= requested``, and a grant
  never makes the node over-committed. ``current`` is reality and is always counted, except
  for memory above what the VM holds (``_Side``): memory only grows through a permit,
  so such a claim is believed only where it fits, and the permit answered is then below it.

After an extender restart the ledger starts from the pod's ``permitted-*`` annotations; if those
were lost, the agent's ``lastPermit`` is adopted when it fits, so a restart never shrinks a VM's
entitlement behind its back. Until its agent reports, such a VM holds its maximum (see
``ledger``), so the space it may really use is never handed to anyone else meanwhile.

Quotas. ``decide`` takes ``quota_room`` (namespace -> how much more it may hold, None when it
has no quota): an increase is limited by the node's room *and* by what the VM holds plus its
namespace's room, read before the VM's size changes. Upscales are never queued: what does not
fit the quota is denied (or granted in part) at once, and the agent asks again later.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Final, NamedTuple

from protocol.annotations import VmSpec
from protocol.permits import (
    Permit,
    PermitStatus,
    ResourceRequest,
    Resources,
)
from protocol.sizes import Bounds
from scheduler_extender.core.ledger import Ledger, Owner
from scheduler_extender.core.podinfo import Demand
from scheduler_extender.core.refusals import Refusal, Refused

CPU_MILLIS_PER_VCPU: Final = 1000
# namespace -> how much more it may hold now (never negative), or None: no quota.
QuotaRoom = Callable[[str], Demand | None]


class ShortOf(enum.StrEnum):
    """What held a short answer (denied or partial) back: the node's free room, or the
    namespace's quota. The same choice as the reason's words (``_status``)."""

    NODE = "node"
    QUOTA = "quota"


class Decision(NamedTuple):
    """One VM's answer. ``refused`` set: its request was refused, and ``permit`` carries only
    the pod (and, for a sequence refusal, the last seq applied); the edge adds the error.
    ``short_of`` set on a denied or partial answer: what held it back."""

    permit: Permit
    refused: Refused | None = None
    short_of: ShortOf | None = None


def _refuse(req: ResourceRequest, kind: Refusal, message: str) -> Decision:
    return Decision(Permit(pod=req.pod), Refused(kind, message))


def check_batch(ledger: Ledger, node: str, requests: list[ResourceRequest]) -> Refused | None:
    """Refuse the whole batch if any request speaks for a pod on another node.

    An agent may only speak for VMs on its own node; one that does not is misconfigured or
    hostile, and none of its batch is applied.
    """
    for req in requests:
        if req.node != node:
            return Refused(
                Refusal.NODE_MISMATCH,
                f"request for {req.pod.key} names node {req.node} inside a batch for node {node}",
            )
        entry = ledger.pods.get(req.pod.uid)
        if entry is not None and entry.node != node:
            return Refused(
                Refusal.WRONG_NODE,
                f"pod {req.pod.key} runs on node {entry.node}, not on {node}",
            )
    return None


def decide(
    ledger: Ledger,
    req: ResourceRequest,
    quota_room: QuotaRoom | None = None,
    *,
    growth_cap_millis: int | None = None,
    growth_cap_bytes: int | None = None,
) -> Decision:
    """Apply one VM's request to the ledger and return its Permit (or its refusal).

    ``growth_cap_millis`` limits how much CPU an increase may add on top of ``current`` (the
    fair share ``decide_batch`` gives each VM when several compete for a node's room), and
    ``growth_cap_bytes`` how much memory."""
    entry = ledger.pods.get(req.pod.uid)
    if entry is None:
        return _refuse(
            req, Refusal.UNKNOWN_POD, f"pod {req.pod.key} (uid {req.pod.uid}) holds nothing here"
        )
    if entry.namespace != req.pod.namespace or entry.name != req.pod.name:
        return _refuse(
            req,
            Refusal.STALE_REQUEST,
            f"uid {req.pod.uid} belongs to {entry.key}, not {req.pod.key}",
        )
    if entry.owner is not Owner.OWN or entry.vm is None:
        return _refuse(req, Refusal.NOT_A_VM, f"pod {req.pod.key} is not a VM of this scheduler")
    if entry.node != req.node:
        return _refuse(req, Refusal.WRONG_NODE, f"pod {req.pod.key} runs on node {entry.node}")
    if entry.is_tentative:
        return _refuse(req, Refusal.NOT_BOUND, f"pod {req.pod.key} is still being bound")
    if ledger.moves and entry.uid in ledger.moves:
        # Its target node was reserved at the size it holds: it may shrink or stay, not grow.
        growth_cap_millis = growth_cap_bytes = 0
    vm = entry.vm
    want = req.requested
    bad = _bounds_error(vm, req)
    if bad is not None:
        return _refuse(req, Refusal.OUT_OF_BOUNDS, bad)
    state = ledger.nodes[entry.node]
    free = state.free
    last = req.last_permit
    cpu = _Side(
        bounds=vm.vcpu_bounds,
        scale=CPU_MILLIS_PER_VCPU,
        extra=0,
        room=free.cpu_millis + entry.held.cpu_millis + entry.uncertain.cpu_millis,
        requests=entry.requests.cpu_millis,
        held=entry.vcpus if entry.vcpus is not None else vm.min_vcpus,
        current=req.current.vcpus,
        requested=want.vcpus,
        last=last.vcpus if last is not None else None,
        is_claim_checked=False,
    )
    mem = _Side(
        bounds=vm.memory_bounds,
        scale=1,
        extra=entry.memory_extra,
        room=free.memory_bytes + entry.held.memory_bytes + entry.uncertain.memory_bytes,
        requests=entry.requests.memory_bytes,
        held=entry.memory_bytes if entry.memory_bytes is not None else vm.min_memory_bytes,
        current=req.current.memory_bytes,
        requested=want.memory_bytes,
        last=last.memory_bytes if last is not None else None,
        is_claim_checked=True,
    )
    if not entry.has_agent and last is not None:
        assert entry.vcpus is not None and entry.memory_bytes is not None
        cpu, mem = cpu.adopt_last_permit(), mem.adopt_last_permit()
    # What an increase may reach: the node's room, and the namespace's quota on top of what
    # the VM holds now. Read before resize_vm (the ledger, and so the room, moves with it),
    # and only for increases: a steady or shrinking VM takes no new quota.
    left = None
    if quota_room is not None and (cpu.is_increase or mem.is_increase):
        left = quota_room(entry.namespace)
    cpu_fit = cpu.reach(left.cpu_millis if left is not None else None, growth_cap_millis)
    mem_fit = mem.reach(left.memory_bytes if left is not None else None, growth_cap_bytes)
    vcpus, answer_vcpus = cpu.decide(cpu_fit)
    memory, answer_memory = mem.decide(mem_fit)
    current_mem = mem.current
    ledger.resize_vm(entry.uid, vcpus=vcpus, memory_bytes=memory)
    quota = None
    cpu_short, mem_short = cpu_fit.is_below_room, mem_fit.is_below_room
    if left is not None and (cpu_short or mem_short):
        # Name the resource the quota held back: CPU unless only memory was asked for.
        is_cpu = cpu_short and (cpu.is_increase or not mem_short)
        quota = _QuotaLimit(entry.namespace, left, is_cpu=is_cpu)
    status, reason = _status(req, vcpus, memory, free=free, node=state.name, quota=quota)
    if answer_memory < current_mem and want.memory_bytes >= current_mem:
        # More memory reported than the VM holds, and more than fits: not believed.
        reason = (
            f"{reason}; memory held at {answer_memory} bytes, not the {current_mem} reported:"
            f" node {state.name} has no room for more"
        )
    permit = Permit(
        pod=req.pod,
        permit=Resources(vcpus=answer_vcpus, memory_bytes=answer_memory),
        status=status,
        reason=reason,
    )
    if status is PermitStatus.DENIED or status is PermitStatus.PARTIAL:
        return Decision(permit, short_of=ShortOf.NODE if quota is None else ShortOf.QUOTA)
    return Decision(permit)


def decide_batch(
    ledger: Ledger,
    node: str,
    requests: list[ResourceRequest],
    quota_room: QuotaRoom | None = None,
) -> list[Decision] | Refused:
    """Decide a node's batch (or refuse it whole, before touching the ledger).

    Everything that frees or keeps room goes first; then, when several VMs ask to grow, they
    share the node's free room fairly, per resource, instead of the first in the batch taking
    it all: each may first add an equal share of the free CPU (of the VMs growing CPU) and of
    the free memory (of the VMs growing memory), then what is left goes round in batch order
    (a max-min split in two rounds; deterministic, no randomness)."""
    refused = check_batch(ledger, node, requests)
    if refused is not None:
        return refused
    cpu_growing = mem_growing = 0
    growing = []
    for i, r in enumerate(requests):
        cpu_up = r.requested.vcpus > r.current.vcpus
        mem_up = r.requested.memory_bytes > r.current.memory_bytes
        if cpu_up or mem_up:
            growing.append(i)
            cpu_growing += cpu_up
            mem_growing += mem_up
    if len(growing) < 2:
        return [decide(ledger, req, quota_room) for req in requests]
    decisions: list[Decision | None] = [None] * len(requests)
    is_growing = set(growing)
    for i, req in enumerate(requests):
        if i not in is_growing:
            decisions[i] = decide(ledger, req, quota_room)
    state = ledger.nodes.get(node)
    free = state.free if state is not None else Demand(0, 0)
    cpu_share = max(0, free.cpu_millis) // max(1, cpu_growing)
    mem_share = max(0, free.memory_bytes) // max(1, mem_growing)
    for i in growing:
        decisions[i] = decide(
            ledger,
            requests[i],
            quota_room,
            growth_cap_millis=cpu_share,
            growth_cap_bytes=mem_share if mem_growing > 1 else None,
        )
    for i in growing:
        first = decisions[i]
        assert first is not None
        granted = first.permit.permit
        want = requests[i].requested
        if granted is not None and (
            granted.vcpus < want.vcpus or granted.memory_bytes < want.memory_bytes
        ):
            # The second round: the same request again, now against what the others left.
            decisions[i] = decide(ledger, requests[i], quota_room)
    return [d for d in decisions if d is not None]


class _QuotaLimit(NamedTuple):
    """The namespace's quota, not the node, stopped an increase short."""

    namespace: str
    left: Demand
    is_cpu: bool

    def __str__(self) -> str:
        if self.is_cpu:
            return f"namespace {self.namespace} has {self.left.cpu_millis}m cpu of quota left"
        return (
            f"namespace {self.namespace} has {self.left.memory_bytes} bytes of memory of quota left"
        )


def _bounds_error(vm: VmSpec, req: ResourceRequest) -> str | None:
    want = req.requested
    for value, bounds, what in (
        (want.vcpus, vm.vcpu_bounds, "vCPUs"),
        (want.memory_bytes, vm.memory_bounds, "bytes of memory"),
    ):
        if not bounds.contains(value):
            return (
                f"requested {value} {what} is outside this VM's bounds {bounds.min}..{bounds.max}"
            )
    return None


class _Reach(NamedTuple):
    fit: int  # the largest size the VM may reach (0: not even its pod's requests fit)
    is_below_room: bool  # the quota or a fair share held it below the node's room


class _Side(NamedTuple):
    """One resource of one VM's request: the permit rule, written once for vCPUs and memory.

    Sizes (``held``, ``current``, ``requested``, ``last``) are in the resource's unit (vCPUs,
    bytes); the pod's numbers (``room``, ``requests``, ``extra``) in the ledger's (millicores,
    bytes), ``scale`` of them per size unit. ``extra``: what the pod holds beyond the VM's size
    (memory: QEMU's own and other containers; CPU: nothing).

    ``is_claim_checked`` (memory): a size *above what the VM holds* is believed only as far as
    the node has room for it. A VM's memory only grows through a permit (the agent plugs memory
    after the grant), so an agent claiming more than it holds is wrong, and counting the claim
    would over-commit the node's memory for real. So ``current`` (and a notice's
    ``requested``) count up to ``ceiling`` (what the VM holds, or more where it fits), and the
    permit answered may then be *below* ``current``: the agent must give the rest back. A
    notice's ``requested`` is the size the guest really reached (a shrink the guest could not
    complete is reported at what it gave back): the extender frees only down to that.
    Without it (vCPUs), ``current`` is reality and always counted.
    """

    bounds: Bounds
    scale: int
    extra: int
    room: int  # the most the VM's pod could hold: the node's free room plus what it holds now
    requests: int
    held: int
    current: int
    requested: int
    last: int | None
    is_claim_checked: bool

    @property
    def is_increase(self) -> bool:
        return self.requested > self.current

    def adopt_last_permit(self) -> _Side:
        """A rebuilt ledger meets the agent for the first time: keep the larger of our record
        and the agent's last permit, where it fits (it did fit before the restart, unless the
        node changed meanwhile)."""
        last = self.last
        if (
            last is not None
            and self.held < last <= self.bounds.top
            and last * self.scale + self.extra <= self.room
        ):
            return self._replace(held=last)
        return self

    def reach(self, quota_left: int | None, growth_cap: int | None) -> _Reach:
        """How far an increase may go: the node's room, the namespace's quota (``quota_left``)
        on top of the VM's recorded size, and its fair share of a contended node
        (``growth_cap``, on top of what it has)."""
        grow = self.room
        if quota_left is not None:
            # On top of the VM's recorded size (after adopting lastPermit), not of what it
            # held: that is the quota it already uses.
            base = max(self.requests, self.held * self.scale + self.extra)
            grow = min(grow, base + quota_left)
        # The pod holds the VM's size plus ``extra``: the VM may have what is left after that.
        grow -= self.extra
        if growth_cap is not None:
            has = max(self.held, self.current) if self.is_claim_checked else self.current
            grow = min(grow, has * self.scale + growth_cap)
        below_room = grow + self.extra < self.room
        if self.requests > grow + self.extra:
            return _Reach(0, below_room)
        return _Reach(grow // self.scale, below_room)

    def decide(self, reach: _Reach) -> tuple[int, int]:
        """``(what the VM holds from now on, the permit answered)``."""
        current, requested, held = self.current, self.requested, self.held
        if requested == current == held:
            return current, current  # steady at what it holds: what the rule below answers
        fit = reach.fit
        limit = self.bounds.round_down(fit)
        if limit > fit:  # not even the VM's minimum fits: nothing above what it has
            limit = held if self.is_claim_checked else current
        real, real_requested = current, requested
        if self.is_claim_checked:
            ceiling = max(held, limit)
            real, real_requested = min(current, ceiling), min(requested, ceiling)
        if requested < current:
            return real_requested, real_requested
        if requested == current:
            claimed = held if self.last is None else min(held, self.last)
            return max(real, claimed), real
        grant = max(real, min(self.bounds.round_down(requested), limit))
        return grant, grant


def _status(
    req: ResourceRequest,
    vcpus: int,
    memory: int,
    *,
    free: Demand,
    node: str,
    quota: _QuotaLimit | None,
) -> tuple[PermitStatus, str]:
    """The permit's status and reason. The limit's words are built only for a short grant;
    they name memory only when memory was asked to grow and came short (CPU-only agents read
    exactly the words they always did)."""
    cur, want = req.current, req.requested
    cpu_up = want.vcpus > cur.vcpus
    mem_up = want.memory_bytes > cur.memory_bytes
    if cpu_up or mem_up:
        cpu_short = cpu_up and vcpus < want.vcpus
        mem_short = mem_up and memory < want.memory_bytes
        if not cpu_short and not mem_short:
            return PermitStatus.GRANTED, f"granted {vcpus} vCPUs, {memory} bytes"
        if quota is not None:
            limit = str(quota)
        elif mem_short and not cpu_short:
            limit = f"node {node} had {max(0, free.memory_bytes)} bytes of memory free"
        else:
            limit = f"node {node} had {max(0, free.cpu_millis)}m cpu free"
        if (not cpu_up or vcpus == cur.vcpus) and (not mem_up or memory <= cur.memory_bytes):
            if quota is not None:
                return PermitStatus.DENIED, f"no room to grow: {quota}"
            room = (
                f"{max(0, free.memory_bytes)} bytes of memory free"
                if mem_short and not cpu_short
                else f"{max(0, free.cpu_millis)}m cpu free"
            )
            return PermitStatus.DENIED, f"node {node} has no room to grow ({room})"
        parts = []
        if cpu_short or not mem_short:
            parts.append(f"{vcpus} of {want.vcpus} vCPUs")
        if mem_short:
            parts.append(f"{memory} of {want.memory_bytes} bytes of memory")
        return PermitStatus.PARTIAL, f"granted {' and '.join(parts)}: {limit}"
    if want.vcpus < cur.vcpus or want.memory_bytes < cur.memory_bytes:
        return PermitStatus.RELEASED, f"released down to {vcpus} vCPUs, {memory} bytes"
    return PermitStatus.STEADY, f"steady at {vcpus} vCPUs"
