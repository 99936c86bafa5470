"""The admission queue: which pods of this scheduler may take their namespace's quota now.

Pure: no I/O, no awaits, no clock and no randomness. Every call that can admit takes ``now``
(monotonic seconds from the shell, ``loop.time()``); nothing here reads a clock. Like the
ledger, no call awaits, so each one is atomic on the extender's event loop.

Modelled on kueue: a manager holds waiting and admitted work, and a scheduling *pass* moves work
from waiting to admitted while there is room. Two things the design we follow got wrong are
right here: the quota is enforced (a pod is admitted only when its namespace's room covers
it), and pods that existed before the queue did are enqueued (``observe_pending`` from the
pod list), not dropped.

Lifecycle of a pod of this scheduler, as a user sees it (``PodState``)::

    requested --(pass: fits)--> admitted --(bind: the ledger holds it)--> running --> finished
        |                        |    ^
        +--(pass: no room)--> waiting |   admitted --(TTL, never bound)--> waiting
                                 +----+

Usage of a namespace = what the ledger's *own* entries in it hold (every pod of this scheduler
placed there, VMs at their permitted size, so vCPUs granted to agents count) + the demand of
its admitted pods not yet in the ledger. It is derived from the ledger, never kept beside it,
so it cannot drift: the ledger tells us which node changed, and that node's per-namespace sums
are recomputed at the next call (a dirty set; one pass over that node's own pods).

The shell's contract:

* ``admit`` in filter (reject every node with the reason when waiting) *and again in bind*,
  right before ``Ledger.reserve_for_bind``: an admission may have expired in between, just as
  a node's fit may have changed.
* ``observe_pending`` / ``forget`` from the pod watch and list; ``recheck`` after a pod stops,
  a VM shrinks, a node is added, or the list finished; nudge the pods it returns.
* ``AdmissionState.set_quotas`` whenever the quota section (re)loads; nudge what it returns.
* ``quota_room`` inside ``permits.decide``: a grant is limited by the node *and* the quota.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import math
from typing import Final, NamedTuple

import msgspec

from scheduler_extender.admission.quota import (
    NamespaceQuota,
    QueueingStrategy,
    QuotaConfig,
    at_least_zero,
    covers,
    minus,
    shortage,
    smaller,
)
from scheduler_extender.core.ledger import Ledger, Owner
from scheduler_extender.core.podinfo import ZERO, Demand, PodInfo

# (-priority, requeues, creation unknown, creation timestamp, name, uid): the queue's order.
# Priority first (higher first), then age; RFC 3339 timestamps from the API server all have the
# same shape, so they order as strings. A pod without one sorts as the newest. ``requeues``
# sits right after priority: a pod whose admission expired unbound goes behind the pods of its
# priority that never had their turn (kueue requeues evicted workloads the same way), else it
# would take the freed quota straight back. The uid makes the order total.
QueueOrder = tuple[int, int, bool, str, str, str]
_Group = tuple[str, str]  # ("cohort", name) or ("namespace", name): the unit of one pass
_NEVER: Final = math.inf


class AdmissionStatus(enum.StrEnum):
    ADMITTED = "admitted"
    WAITING = "waiting"


class AdmissionDecision(NamedTuple):
    """A decision is an enum plus a reason a human can read (filter sends it to every node)."""

    status: AdmissionStatus
    reason: str

    @property
    def is_admitted(self) -> bool:
        return self.status is AdmissionStatus.ADMITTED


class PodKey(msgspec.Struct, frozen=True, order=True):
    """Who to nudge: enough to post an Event or patch the pod with a uid precondition."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodState(enum.StrEnum):
    """What ``/v1/queue`` shows a user (see the lifecycle in the module docstring)."""

    REQUESTED = "requested"  # seen by nobody yet, or between a failed bind and its retry
    WAITING = "waiting"
    ADMITTED = "admitted"  # holds quota, not yet placed
    RUNNING = "running"  # the ledger holds it on a node (tentatively while the bind is posted)
    FINISHED = "finished"


def user_state(
    *, is_terminated: bool, is_held: bool, is_admitted: bool, is_waiting: bool
) -> PodState:
    """The one mapping from facts to what a user sees; later facts win."""
    if is_terminated:
        return PodState.FINISHED
    if is_held:
        return PodState.RUNNING
    if is_admitted:
        return PodState.ADMITTED
    if is_waiting:
        return PodState.WAITING
    return PodState.REQUESTED


class Waiter(msgspec.Struct, kw_only=True):
    """A pod in a namespace's queue. Mutable only inside this module."""

    uid: str
    namespace: str
    name: str
    demand: Demand
    priority: int
    created: str
    requeues: int = 0
    # A pass (or filter) told it to wait: when it is admitted later, the shell must nudge it,
    # because kube-scheduler parked it. A pod admitted on its first pass is not nudged.
    has_waited: bool = False
    # Why the last pass left it waiting (without the position, which moves).
    reason: str = "not considered yet"

    @property
    def order(self) -> QueueOrder:
        return (
            -self.priority,
            self.requeues,
            self.created == "",
            self.created,
            self.name,
            self.uid,
        )


class Reservation(msgspec.Struct, kw_only=True):
    """Quota held by an admitted pod the ledger does not hold yet.

    It ends when the ledger holds the pod (bound or being bound: then the ledger counts it),
    when the pod is forgotten (deleted, finished), or at ``expires_at`` (``now`` of admission
    plus the TTL), when the pod goes back into the queue. Without the TTL a pod no node can
    take would hold its namespace's quota for as long as it exists.
    """

    waiter: Waiter
    admitted_at: float
    expires_at: float


class NamespaceBreakdown(NamedTuple):
    running: Demand  # what the ledger's entries of the namespace hold
    reserved: Demand  # what its admitted, not yet bound pods were admitted for
    admitted_pods: int
    waiting_pods: int


class _Namespace:
    """One namespace's queue and usage.

    Invariants (``AdmissionState.check_invariants``):

    * ``order`` is sorted and holds exactly ``w.order`` for each ``w`` in ``waiting``.
    * ``reserved_total`` is the sum of ``reserved``'s demands; ``running`` is the sum of what
      the ledger's own entries in this namespace hold (once the dirty nodes are refreshed).
    * a uid is in at most one of ``waiting``, ``reserved`` and the ledger's own entries.
    """

    __slots__ = ("order", "reserved", "reserved_total", "running", "waiting")

    def __init__(self) -> None:
        self.waiting: dict[str, Waiter] = {}
        self.order: list[QueueOrder] = []
        self.reserved: dict[str, Reservation] = {}
        self.reserved_total = ZERO
        self.running = ZERO

    @property
    def usage(self) -> Demand:
        return self.running + self.reserved_total

    @property
    def is_empty(self) -> bool:
        return not self.waiting and not self.reserved and self.running == ZERO


class AdmissionState:
    """Quotas, queues and usage for every namespace. See the module docstring.

    ``quotas is None`` means the quota section has not been loaded yet (it may come from a
    ConfigMap the watch has not listed): every pod then *waits*, and no upscale is granted, so
    nothing slips past a quota that is about to arrive. Once loaded, a namespace the config
    does not list is unlimited. A shell with no quota source passes ``QuotaConfig()``.
    """

    def __init__(self, ledger: Ledger, quotas: QuotaConfig | None = None) -> None:
        self.ledger = ledger
        self.quotas = quotas
        self._cohorts = quotas.cohort_members() if quotas is not None else {}
        self._namespaces: dict[str, _Namespace] = {}
        # uid -> namespace, for every waiting or reserved pod.
        self._where: dict[str, str] = {}
        # How many pods wait, in all namespaces (``recheck`` has nothing to do without any).
        self._waiting_total = 0
        # node -> namespace -> what our pods there hold: the part of ``running`` from that node.
        self._node_totals: dict[str, dict[str, Demand]] = {}
        self._dirty_nodes: set[str] = set(ledger.nodes)
        # Groups whose room grew or whose queue changed since their last pass.
        self._dirty_groups: set[_Group] = set()
        self._nudges: dict[str, PodKey] = {}
        self._next_expiry = _NEVER
        ledger.subscribe(self._dirty_nodes.add)

    # -- quotas ------------------------------------------------------------------------------

    @property
    def ttl_seconds(self) -> float:
        return (self.quotas or QuotaConfig()).admission_ttl_seconds

    def set_quotas(self, quotas: QuotaConfig, *, now: float) -> list[PodKey]:
        """Adopt a (re)loaded quota section and re-check every queue.

        Nothing admitted or running is evicted when a quota shrinks: it only stops admissions
        and upscales until usage falls. A namespace whose quota was removed is unlimited, so its
        waiting pods are admitted at once (and returned, to be nudged).
        """
        self.quotas = quotas
        self._cohorts = quotas.cohort_members()
        for name, ns in self._namespaces.items():
            if ns.waiting:
                self._dirty_groups.add(self._group_of(name))
        return recheck(self, now=now)

    def quota_of(self, namespace: str) -> NamespaceQuota | None:
        return None if self.quotas is None else self.quotas.namespaces.get(namespace)

    def _group_of(self, namespace: str) -> _Group:
        quota = self.quota_of(namespace)
        if quota is not None and quota.cohort is not None:
            return ("cohort", quota.cohort)
        return ("namespace", namespace)

    def _members(self, group: _Group) -> tuple[str, ...]:
        kind, name = group
        return self._cohorts.get(name, ()) if kind == "cohort" else (name,)

    # -- usage -------------------------------------------------------------------------------

    def usage(self, namespace: str) -> Demand:
        self._refresh_nodes()
        ns = self._namespaces.get(namespace)
        return ns.usage if ns is not None else ZERO

    def breakdown(self, namespace: str) -> NamespaceBreakdown:
        """What ``usage`` is made of, and how many pods are admitted and waiting."""
        self._refresh_nodes()
        ns = self._namespaces.get(namespace)
        if ns is None:
            return NamespaceBreakdown(ZERO, ZERO, 0, 0)
        return NamespaceBreakdown(ns.running, ns.reserved_total, len(ns.reserved), len(ns.waiting))

    def _ns(self, namespace: str) -> _Namespace:
        ns = self._namespaces.get(namespace)
        if ns is None:
            ns = self._namespaces[namespace] = _Namespace()
        return ns

    def _tidy(self, namespace: str) -> None:
        ns = self._namespaces.get(namespace)
        if ns is not None and ns.is_empty:
            del self._namespaces[namespace]

    def _refresh_nodes(self) -> None:
        """Bring ``running`` up to date with the ledger for every node that changed."""
        while self._dirty_nodes:
            self._refresh_node(self._dirty_nodes.pop())

    def _refresh_node(self, node: str) -> None:
        state = self.ledger.nodes.get(node)
        new: dict[str, Demand] = {}
        if state is not None:
            for uid, entry in state.own.items():
                held = new.get(entry.namespace)
                new[entry.namespace] = entry.held if held is None else held + entry.held
                if uid in self._where:
                    # The ledger holds it now (bound, or a bind in flight) and counts it from
                    # here on; keeping the reservation too would count it twice.
                    self._drop(uid)
        old = self._node_totals.pop(node, {})
        if new:
            self._node_totals[node] = new
        for namespace in old.keys() | new.keys():
            before, after = old.get(namespace, ZERO), new.get(namespace, ZERO)
            if before == after:
                continue
            ns = self._ns(namespace)
            ns.running = ns.running + minus(after, before)
            if after.cpu_millis < before.cpu_millis or after.memory_bytes < before.memory_bytes:
                self._dirty_groups.add(self._group_of(namespace))
            self._tidy(namespace)

    def _refresh(self, now: float) -> None:
        self._refresh_nodes()
        if now >= self._next_expiry:
            self._expire(now)

    def _expire(self, now: float) -> None:
        next_expiry = _NEVER
        for ns in list(self._namespaces.values()):
            for uid, reservation in list(ns.reserved.items()):
                if reservation.expires_at > now:
                    next_expiry = min(next_expiry, reservation.expires_at)
                    continue
                waiter = reservation.waiter
                self._drop(uid)
                waiter.requeues += 1
                waiter.has_waited = True
                waiter.reason = (
                    f"its admission expired: not bound within {self.ttl_seconds:g}s of it"
                )
                self._enqueue_waiter(waiter)
        self._next_expiry = next_expiry

    # -- room ----------------------------------------------------------------------------------

    def _rooms(self, group: _Group) -> tuple[dict[str, Demand | None], Demand | None]:
        """Per member, ``limit - usage`` (None: no limit of its own); and the cohort's room."""
        rooms: dict[str, Demand | None] = {}
        cohort_nominal = cohort_usage = ZERO
        is_cohort = group[0] == "cohort"
        for name in self._members(group):
            quota = self.quota_of(name)
            ns = self._namespaces.get(name)
            usage = ns.usage if ns is not None else ZERO
            if quota is None:
                rooms[name] = None
                continue
            if not is_cohort:
                rooms[name] = minus(quota.nominal, usage)
                continue
            cohort_nominal = cohort_nominal + quota.nominal
            cohort_usage = cohort_usage + usage
            limit = quota.borrowing_limit
            rooms[name] = None if limit is None else minus(quota.nominal + limit.demand(), usage)
        return rooms, (minus(cohort_nominal, cohort_usage) if is_cohort else None)

    # -- the queue -------------------------------------------------------------------------------

    def observe_pending(self, pod: PodInfo) -> None:
        """A pod from the watch or list. Pending pods of this scheduler join the queue (no pass
        runs here: a list arrives in no particular order, and the first pass must see all of
        it to admit in the queue's order). Finished or foreign pods leave it. Bound pods are
        left to the ledger, which takes over their quota at the next call."""
        if not pod.is_ours or pod.is_terminated:
            self.forget(pod.uid)
            return
        if pod.node_name is not None or pod.uid in self.ledger.pods:
            return
        self._enqueue(pod)

    def forget(self, uid: str) -> None:
        """The pod is gone (deleted or finished): it neither waits nor holds quota."""
        if uid in self._where:
            self._drop(uid)
        self._nudges.pop(uid, None)

    def _enqueue(self, pod: PodInfo) -> Waiter | None:
        """Add or update a pending pod; returns its Waiter, or None if it is admitted."""
        namespace = self._where.get(pod.uid)
        if namespace is not None:
            ns = self._namespaces[namespace]
            demand = pod.initial_demand()
            reservation = ns.reserved.get(pod.uid)
            # An admission covers the demand it was made for: a pod that grew since (its
            # annotations changed) must be admitted again, or the bind would take more
            # quota than was reserved.
            if reservation is not None and reservation.waiter.demand == demand:
                return None
            waiter = ns.waiting[pod.uid] if reservation is None else reservation.waiter
            if reservation is None and waiter.demand == demand and waiter.priority == pod.priority:
                return waiter
            self._drop(pod.uid)
            waiter.demand = demand
            waiter.priority = pod.priority
            self._enqueue_waiter(waiter)
            return waiter
        waiter = Waiter(
            uid=pod.uid,
            namespace=pod.namespace,
            name=pod.name,
            demand=pod.initial_demand(),
            priority=pod.priority,
            created=pod.created,
        )
        self._enqueue_waiter(waiter)
        return waiter

    def _enqueue_waiter(self, waiter: Waiter) -> None:
        ns = self._ns(waiter.namespace)
        ns.waiting[waiter.uid] = waiter
        self._waiting_total += 1
        bisect.insort(ns.order, waiter.order)
        self._where[waiter.uid] = waiter.namespace
        self._dirty_groups.add(self._group_of(waiter.namespace))

    def _drop(self, uid: str) -> None:
        """Remove ``uid`` from its queue or reservation (it must be in one)."""
        namespace = self._where.pop(uid)
        ns = self._namespaces[namespace]
        waiter = ns.waiting.pop(uid, None)
        if waiter is not None:
            self._waiting_total -= 1
            del ns.order[bisect.bisect_left(ns.order, waiter.order)]
        reservation = ns.reserved.pop(uid, None)
        if reservation is not None:
            ns.reserved_total = minus(ns.reserved_total, reservation.waiter.demand)
        # Room grew, or a StrictFIFO head left: either may let someone else in.
        self._dirty_groups.add(self._group_of(namespace))
        self._tidy(namespace)

    def _reserve(self, waiter: Waiter, *, now: float) -> None:
        ns = self._namespaces[waiter.namespace]
        del ns.waiting[waiter.uid]
        self._waiting_total -= 1
        del ns.order[bisect.bisect_left(ns.order, waiter.order)]
        expires_at = now + self.ttl_seconds
        ns.reserved[waiter.uid] = Reservation(waiter=waiter, admitted_at=now, expires_at=expires_at)
        ns.reserved_total = ns.reserved_total + waiter.demand
        self._next_expiry = min(self._next_expiry, expires_at)
        if waiter.has_waited:
            self._nudges[waiter.uid] = PodKey(
                namespace=waiter.namespace, name=waiter.name, uid=waiter.uid
            )

    def _pass(self, group: _Group, *, now: float) -> None:
        """One scheduling pass over a namespace, or over a whole cohort in one merged order
        (so a cohort's shared room goes to its highest-priority, oldest pods first).

        Invariant at the end of a pass (the property tests check it after ``recheck``): every
        pod still waiting in a BestEffortFIFO namespace does not fit its room, and in a
        StrictFIFO namespace the head does not fit. Room only shrinks during a pass, so a pod
        that did not fit when it was visited does not fit at the end either.
        """
        self._dirty_groups.discard(group)
        if self.quotas is None:
            return
        members = [
            (name, ns)
            for name in self._members(group)
            if (ns := self._namespaces.get(name)) is not None and ns.waiting
        ]
        if not members:
            return
        rooms, cohort_room = self._rooms(group)
        blocked: set[str] = set()
        for order in list(heapq.merge(*(list(ns.order) for _, ns in members))):
            uid = order[-1]
            namespace = self._where[uid]
            waiter = self._namespaces[namespace].waiting[uid]
            if namespace in blocked:
                waiter.reason = "behind the head of its namespace's queue (StrictFIFO)"
                waiter.has_waited = True
                continue
            room = _tighter(rooms[namespace], cohort_room)
            if room is None or covers(room, waiter.demand):
                self._reserve(waiter, now=now)
                own = rooms[namespace]
                if own is not None:
                    rooms[namespace] = minus(own, waiter.demand)
                if cohort_room is not None:
                    cohort_room = minus(cohort_room, waiter.demand)
                continue
            waiter.reason = _why_short(waiter, rooms[namespace], cohort_room, group)
            waiter.has_waited = True
            quota = self.quota_of(namespace)
            if quota is not None and quota.queueing_strategy is QueueingStrategy.STRICT_FIFO:
                blocked.add(namespace)

    def _position(self, waiter: Waiter) -> int:
        return bisect.bisect_left(self._namespaces[waiter.namespace].order, waiter.order) + 1

    def waiting_reason(self, waiter: Waiter) -> str:
        where = f"namespace {waiter.namespace} (position {self._position(waiter)})"
        if self.quotas is None:
            return f"waiting for the quota configuration to load, in {where}"
        return f"waiting for quota in {where}: {waiter.reason}"

    def reservation(self, uid: str) -> Reservation | None:
        namespace = self._where.get(uid)
        return None if namespace is None else self._namespaces[namespace].reserved.get(uid)

    def waiter(self, uid: str) -> Waiter | None:
        namespace = self._where.get(uid)
        return None if namespace is None else self._namespaces[namespace].waiting.get(uid)

    def waiting_in_order(self, namespace: str) -> list[Waiter]:
        ns = self._namespaces.get(namespace)
        if ns is None:
            return []
        return [ns.waiting[order[-1]] for order in ns.order]

    def reserved_in(self, namespace: str) -> list[Reservation]:
        ns = self._namespaces.get(namespace)
        return [] if ns is None else sorted(ns.reserved.values(), key=lambda r: r.waiter.order)

    def namespaces(self) -> list[str]:
        """Every namespace with a quota, a queue, reservations or running pods, sorted."""
        self._refresh_nodes()
        names = set(self._namespaces)
        if self.quotas is not None:
            names.update(self.quotas.namespaces)
        return sorted(names)

    # -- checks ---------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant of ``_Namespace``."""
        self._refresh_nodes()
        # Summed as ints (the simulator runs this over every pod of its fleet once a minute).
        sums: dict[str, list[int]] = {}
        where = self._where
        for entry in self.ledger.pods.values():
            if entry.owner is Owner.OWN:
                held = entry.held
                pair = sums.get(entry.namespace)
                if pair is None:
                    sums[entry.namespace] = [held.cpu_millis, held.memory_bytes]
                else:
                    pair[0] += held.cpu_millis
                    pair[1] += held.memory_bytes
                if entry.uid in where:
                    raise AssertionError(f"{entry.key} is held by the ledger and queued too")
        running = {name: Demand(cpu, memory) for name, (cpu, memory) in sums.items()}
        seen = waiting = 0
        for name, ns in self._namespaces.items():
            waiting += len(ns.waiting)
            if ns.running != running.get(name, ZERO):
                raise AssertionError(f"{name}: running {ns.running} != ledger {running.get(name)}")
            if ns.order != sorted(w.order for w in ns.waiting.values()):
                raise AssertionError(f"{name}: queue order does not match its waiting pods")
            total = ZERO
            for reservation in ns.reserved.values():
                total = total + reservation.waiter.demand
            if total != ns.reserved_total:
                raise AssertionError(f"{name}: reserved {ns.reserved_total} != sum {total}")
            if ns.waiting.keys() & ns.reserved.keys():
                raise AssertionError(f"{name}: a pod both waits and is admitted")
            for uid in ns.waiting.keys() | ns.reserved.keys():
                if self._where.get(uid) != name:
                    raise AssertionError(f"{name}: {uid} is not indexed here")
                seen += 1
        if waiting != self._waiting_total:
            raise AssertionError(f"{waiting} pods wait but the count says {self._waiting_total}")
        if seen != len(self._where):
            raise AssertionError(f"{len(self._where)} pods indexed but {seen} queued or admitted")
        for name, held in running.items():
            if name not in self._namespaces and held != ZERO:
                raise AssertionError(f"{name}: the ledger holds {held} but it is not tracked")


def _tighter(a: Demand | None, b: Demand | None) -> Demand | None:
    if a is None:
        return b
    return a if b is None else smaller(a, b)


def _why_short(
    waiter: Waiter, own: Demand | None, cohort_room: Demand | None, group: _Group
) -> str:
    if own is not None and not covers(own, waiter.demand):
        return shortage(own, waiter.demand) + " of its quota"
    assert cohort_room is not None
    return shortage(cohort_room, waiter.demand) + f" in cohort {group[1]}"


# -- the API the shell calls ---------------------------------------------------------------


def admit(state: AdmissionState, pod: PodInfo, *, now: float) -> AdmissionDecision:
    """May ``pod`` be placed now? Enqueues it if it is new, runs its group's pass if anything
    changed there, and answers. Cheap when nothing changed: a few dict lookups and a bisect,
    because kube-scheduler calls filter for every retry of every pending pod."""
    state._refresh(now)
    if not pod.is_ours:
        return AdmissionDecision(
            AdmissionStatus.ADMITTED, "not a pod of this scheduler: quotas do not apply"
        )
    if pod.is_terminated:
        state.forget(pod.uid)
        return AdmissionDecision(AdmissionStatus.ADMITTED, "finished: it holds nothing")
    entry = state.ledger.pods.get(pod.uid)
    if entry is not None and entry.owner is Owner.OWN:
        return AdmissionDecision(
            AdmissionStatus.ADMITTED, f"already placed on node {entry.node}; the ledger counts it"
        )
    waiter = state._enqueue(pod)
    group = state._group_of(pod.namespace)
    if waiter is not None and group in state._dirty_groups:
        state._pass(group, now=now)
    reservation = state.reservation(pod.uid)
    if reservation is not None:
        # It learns this from its own filter call: no nudge needed.
        state._nudges.pop(pod.uid, None)
        return AdmissionDecision(AdmissionStatus.ADMITTED, admitted_reason(state, reservation))
    waiter = state.waiter(pod.uid)
    assert waiter is not None
    waiter.has_waited = True
    return AdmissionDecision(AdmissionStatus.WAITING, state.waiting_reason(waiter))


def admitted_reason(state: AdmissionState, reservation: Reservation) -> str:
    waiter = reservation.waiter
    quota = state.quota_of(waiter.namespace)
    if quota is None:
        return f"admitted: namespace {waiter.namespace} has no quota"
    usage = state.usage(waiter.namespace)
    return (
        f"admitted within the quota of namespace {waiter.namespace}: using"
        f" {usage.cpu_millis}m of {quota.nominal.cpu_millis}m cpu,"
        f" {usage.memory_bytes} of {quota.nominal.memory_bytes} bytes"
    )


def recheck(state: AdmissionState, *, now: float) -> list[PodKey]:
    """Expire stale admissions, run a pass for every group whose room grew or whose queue
    changed, and return the pods to nudge: every pod admitted since the last ``recheck`` that
    had been told to wait (also those admitted by another pod's ``admit``), in admission order.
    """
    if not state._waiting_total and not state._nudges and now < state._next_expiry:
        # Nobody waits, so no pass can admit anyone, and no admission is due to expire. Every
        # permit batch that frees room lands here: the nodes' usage (and the release of
        # admissions whose pods got bound) is brought up to date lazily, by whoever reads
        # it next; an expiry always refreshes the nodes first (``_refresh``).
        state._dirty_groups.clear()
        return []
    state._refresh(now)
    if not state._dirty_groups and not state._nudges:
        return []  # filter's common case: its pod was admitted before, nothing moved since
    for group in sorted(state._dirty_groups):
        state._pass(group, now=now)
    nudges = list(state._nudges.values())
    state._nudges.clear()
    return nudges


def quota_room(state: AdmissionState, namespace: str) -> Demand | None:
    """How much more ``namespace`` may hold now, per resource, never negative; None when it has
    no quota (unlimited). ZERO while the quota section has not been loaded: an upscale then
    could take room a quota is about to forbid. Upscales are never queued: ``permits.decide``
    grants at most this much more than the VM holds, and denies (or grants part) at once.

    Asked once per VM of a permit batch: a namespace the loaded quotas do not list is
    unlimited whatever the ledger says, so it is answered before refreshing the nodes the
    batch just changed (one pass over a node's pods per VM would make a batch quadratic)."""
    quotas = state.quotas
    if quotas is not None and namespace not in quotas.namespaces:
        return None
    state._refresh_nodes()
    if quotas is None:
        return ZERO
    rooms, cohort_room = state._rooms(state._group_of(namespace))
    room = _tighter(rooms[namespace], cohort_room)
    assert room is not None  # a namespace with a quota always has one limit or the other
    return at_least_zero(room)


def pod_state(state: AdmissionState, pod: PodInfo) -> PodState:
    entry = state.ledger.pods.get(pod.uid)
    return user_state(
        is_terminated=pod.is_terminated,
        is_held=entry is not None and entry.owner is Owner.OWN,
        is_admitted=state.reservation(pod.uid) is not None,
        is_waiting=state.waiter(pod.uid) is not None,
    )


__all__ = [
    "AdmissionDecision",
    "AdmissionState",
    "AdmissionStatus",
    "NamespaceBreakdown",
    "PodKey",
    "PodState",
    "QueueOrder",
    "Reservation",
    "Waiter",
    "admit",
    "admitted_reason",
    "pod_state",
    "quota_room",
    "recheck",
    "user_state",
]
