"""The per-node capacity ledger: who holds what on every node.

Pure: no I/O, no awaits, no clock (callers pass ``at``, an informational wall-clock stamp shown
in ``/state``), no randomness. Because no method awaits, every read-modify-write is atomic with
respect to the other coroutines of the extender's event loop, and no lock is needed. Keep it so.

Per node, in millicores and bytes:

``usable``     allocatable minus the system reserve (default 20% of CPU). What the node can give.
``own``        what this extender's pods hold: a VM at its permitted size (at least its pod's
               requests), any other pod of our scheduler at its requests.
``foreign``    what pods placed by anyone else hold, at their effective requests; kept in their
               own table and total, each tagged ``static`` (never preemptible) or ``default``.
``free``       ``usable - own - foreign``; negative when the node is over-committed.

Invariants (``check_invariants`` verifies them; the property tests call it after every step):

1. ``own`` and ``foreign`` always equal the sums of their per-pod entries, and every entry is in
   the uid index under the node it names.
2. Nothing *this extender decides* (a bind, a permit) ever makes ``own + foreign`` exceed
   ``usable``, or makes an over-committed node more over-committed. Only *reality* may: foreign
   pods that are already running, a VM the agent reports larger than its permit, a node that
   shrank. Those are always counted, never hidden, and the node is then reported
   ``overcommitted``.
3. A terminated (Succeeded/Failed) or deleted pod holds nothing: when every pod is gone, every
   node's ``own`` and ``foreign`` are zero. (The design this project follows leaked the space of
   deleted pods.)
4. Rebuilding from the API server's state (``replace_pods`` with the same pods and annotations)
   gives the same ledger once every VM's agent has reported (see *unverified* below); before
   that, a rebuilt ledger holds at least as much as the old one.

*Moves.* A VM moving live to another node holds room on both nodes for the whole move:
``reserve_move`` holds its size on the target node (as a tentative entry, before the target pod
exists, so no bind or grant can take that room); the target pod, once the watch sees it bound
there, takes the reservation over at the VM's permitted size (the permit travels with the VM);
the source keeps its hold until its pod is gone. A move ends when either pod is gone or with
``cancel_move``; a reservation no pod took over is then released. While a VM moves, the permit
logic grants it no growth (its target was reserved at its size).

*Unverified VMs.* A VM pod this ledger finds already bound (a rebuild after a restart, or a pod
bound by an earlier incarnation) may really run anywhere between its durable record (the
``permitted-*`` annotations, written asynchronously and possibly behind or lost) and its maximum.
It holds its record, and the rest up to its maximum is the node's ``uncertain`` amount: not
allocated (nothing is known to run there), but kept out of ``free``, so no bind or grant hands it
to anyone else. When the agent reports (its request carries ``current`` and ``lastPermit``), the
permit rules settle the VM's size and its uncertainty goes. Agents report every VM soon after
they see a new extender epoch, so a rebuilt node is conservative only briefly. (The simulator
found why: with the writes lost, a ledger rebuilt at the records over-committed a node.)
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Final

import msgspec

from protocol.annotations import VmSpec
from scheduler_extender.core.podinfo import ZERO, Demand, Disruption, PodInfo


class Owner(enum.StrEnum):
    OWN = "own"
    FOREIGN = "foreign"


class ForeignTag(enum.StrEnum):
    STATIC = "static"  # a kubelet's static/mirror pod: never a preemption victim
    DEFAULT = "default"


class Allocation(msgspec.Struct, kw_only=True):
    """One pod's hold on one node. Mutable only inside this module."""

    uid: str
    namespace: str
    name: str
    node: str
    owner: Owner
    tag: ForeignTag | None
    priority: int
    held: Demand
    # The pod's own effective requests: a VM never holds less than this.
    requests: Demand
    allocated_at: float
    vm: VmSpec | None = None
    # The VirtualMachine controlling the pod (``PodInfo.vm_name``): None, nothing can move it.
    vm_name: str | None = None
    # A VM's permitted size; ``held`` is at least ``vcpus * 1000`` millicores.
    vcpus: int | None = None
    memory_bytes: int | None = None
    # A memory-scaling VM's pod memory beyond the guest's (``PodInfo.memory_extra_bytes``):
    # it holds ``memory_bytes + memory_extra`` at least.
    memory_extra: int = 0
    # Reserved by our bind but not yet seen bound by the watch. Only such an entry is released
    # when the bind fails: once the API server shows the pod on the node, reality decides.
    is_tentative: bool = False
    # The agent has spoken for this VM since this ledger was built (so lastPermit no longer
    # matters: the ledger's own view is fresher).
    has_agent: bool = False
    # Found bound without this ledger having placed it or heard from its agent: what it may run
    # beyond ``held``, up to its maximum (module docstring, "Unverified VMs"). ZERO otherwise.
    uncertain: Demand = ZERO
    # A foreign pod's fate in a drain (``PodInfo.disruption``); EVICT for ours (never used).
    disruption: Disruption = Disruption.EVICT

    @property
    def is_unverified(self) -> bool:
        return self.uncertain != ZERO

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class NodeState(msgspec.Struct, kw_only=True):
    name: str
    is_known: bool = False
    allocatable: Demand = ZERO
    reserve: Demand = ZERO
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    own: dict[str, Allocation] = msgspec.field(default_factory=dict)
    foreign: dict[str, Allocation] = msgspec.field(default_factory=dict)
    own_total: Demand = ZERO
    foreign_total: Demand = ZERO
    # Foreign pods that can never be preempted (static pods): bounds what preemption can free.
    static_total: Demand = ZERO
    # What unverified VMs may run beyond what they hold: kept out of ``free``, not allocated.
    uncertain_total: Demand = ZERO

    @property
    def usable(self) -> Demand:
        return Demand(
            max(0, self.allocatable.cpu_millis - self.reserve.cpu_millis),
            max(0, self.allocatable.memory_bytes - self.reserve.memory_bytes),
        )

    @property
    def allocated(self) -> Demand:
        return self.own_total + self.foreign_total

    @property
    def free(self) -> Demand:
        """Room left for new decisions; negative components mean over-committed (or, briefly
        after a rebuild, that unverified VMs may be using more than the node has left)."""
        # ``usable - allocated - uncertain`` without the intermediate structs: every permit and
        # every FitIndex re-check reads this.
        a, r = self.allocatable, self.reserve
        own, foreign, x = self.own_total, self.foreign_total, self.uncertain_total
        return Demand(
            max(0, a.cpu_millis - r.cpu_millis)
            - own.cpu_millis
            - foreign.cpu_millis
            - x.cpu_millis,
            max(0, a.memory_bytes - r.memory_bytes)
            - own.memory_bytes
            - foreign.memory_bytes
            - x.memory_bytes,
        )

    @property
    def is_overcommitted(self) -> bool:
        """More is allocated than the node can give (reality put it there)."""
        u, a = self.usable, self.allocated
        return a.cpu_millis > u.cpu_millis or a.memory_bytes > u.memory_bytes

    def fits(self, extra: Demand, *, releasing: Demand = ZERO) -> bool:
        """Whether ``extra`` fits after ``releasing`` is given back (an entry being resized)."""
        if not self.is_known:
            return False
        f = self.free
        return (
            extra.cpu_millis - releasing.cpu_millis <= f.cpu_millis
            and extra.memory_bytes - releasing.memory_bytes <= f.memory_bytes
        )


class AllocAction(enum.StrEnum):
    ADD = "add"
    REMOVE = "remove"
    RESIZE = "resize"


class AllocEvent(msgspec.Struct, frozen=True, kw_only=True):
    """What changed, for NODE_ALLOC log lines, Kubernetes Events and metrics."""

    action: AllocAction
    node: str
    pod: str
    uid: str
    is_foreign: bool
    held: Demand
    previous: Demand = ZERO


class LedgerError(Exception):
    """Base of the ledger's refusals; the shell maps each to an HTTP status."""


class UnknownNode(LedgerError):
    pass


class UnknownPod(LedgerError):
    pass


class NoRoom(LedgerError):
    pass


class Conflict(LedgerError):
    """The pod is already held elsewhere, or the request names another pod with that uid."""


class Move(msgspec.Struct, kw_only=True):
    """A VM moving from its pod's node to ``target_node``, as the target pod ``target_key``.
    ``target_uid``: the hold on the target node, a reservation's own uid until the target pod
    takes it over, then that pod's uid."""

    source_uid: str
    target_key: str
    target_node: str
    target_uid: str

    @property
    def is_target_observed(self) -> bool:
        return self.target_uid != _reservation_uid(self.source_uid)


def _reservation_uid(source_uid: str) -> str:
    # Never a pod's uid: Kubernetes uids are RFC 4122 UUIDs, without a colon.
    return f"move:{source_uid}"


class SystemReserve(msgspec.Struct, frozen=True, kw_only=True):
    """Fractions of a node's allocatable kept back for the host (the design follows: 20% CPU)."""

    cpu_fraction: float = 0.2
    memory_fraction: float = 0.0

    def of(self, allocatable: Demand) -> Demand:
        # Round the reserve up so that usable capacity is never overstated.
        return Demand(
            -int(-allocatable.cpu_millis * self.cpu_fraction // 1),
            -int(-allocatable.memory_bytes * self.memory_fraction // 1),
        )


NodeListener = Callable[[str], None]
_NO_EVENTS: Final[list[AllocEvent]] = []


class Ledger:
    """All nodes and all pods that hold capacity on them. See the module docstring."""

    def __init__(self, *, reserve: SystemReserve | None = None) -> None:
        self.reserve = reserve or SystemReserve()
        self.nodes: dict[str, NodeState] = {}
        self.pods: dict[str, Allocation] = {}
        # Bumped on every change; lets readers cache derived views while it stands still.
        self.generation = 0
        self._listeners: list[NodeListener] = []
        # Moves under way, by the source pod's uid, and the same by the target pod's key.
        self.moves: dict[str, Move] = {}
        self._move_targets: dict[str, str] = {}

    # -- change notification -------------------------------------------------------------

    def subscribe(self, listener: NodeListener) -> None:
        """Call ``listener(node_name)`` after every change to that node (capacity or holds)."""
        self._listeners.append(listener)

    def _changed(self, node: str) -> None:
        self.generation += 1
        for listener in self._listeners:
            listener(node)

    # -- nodes -----------------------------------------------------------------------------

    def _node(self, name: str) -> NodeState:
        state = self.nodes.get(name)
        if state is None:
            state = self.nodes[name] = NodeState(name=name)
        return state

    def upsert_node(
        self, name: str, *, allocatable: Demand, labels: dict[str, str] | None = None
    ) -> None:
        state = self._node(name)
        reserve = self.reserve.of(allocatable)
        new_labels = labels or {}
        if (
            state.is_known
            and state.allocatable == allocatable
            and state.reserve == reserve
            and state.labels == new_labels
        ):
            return
        state.is_known = True
        state.allocatable = allocatable
        state.reserve = reserve
        state.labels = new_labels
        self._changed(name)

    def remove_node(self, name: str) -> None:
        """The Node object is gone. Pods still bound there keep being counted (reality) until
        they are deleted; the name stays as an unknown node while they exist."""
        state = self.nodes.get(name)
        if state is None:
            return
        if state.own or state.foreign:
            state.is_known = False
            state.allocatable = state.reserve = ZERO
            state.labels = {}
        else:
            del self.nodes[name]
        self._changed(name)

    def replace_nodes(self, nodes: Iterable[tuple[str, Demand, dict[str, str]]]) -> None:
        """A fresh list: add or update every node given, remove every node not given."""
        seen = set()
        for name, allocatable, labels in nodes:
            seen.add(name)
            self.upsert_node(name, allocatable=allocatable, labels=labels)
        for name in [n for n, s in self.nodes.items() if s.is_known and n not in seen]:
            self.remove_node(name)

    # -- holds -------------------------------------------------------------------------------

    def _add(self, entry: Allocation) -> AllocEvent:
        state = self._node(entry.node)
        table = state.own if entry.owner is Owner.OWN else state.foreign
        table[entry.uid] = entry
        state.uncertain_total = state.uncertain_total + entry.uncertain
        if entry.owner is Owner.OWN:
            state.own_total = state.own_total + entry.held
        else:
            state.foreign_total = state.foreign_total + entry.held
            if entry.tag is ForeignTag.STATIC:
                state.static_total = state.static_total + entry.held
        self.pods[entry.uid] = entry
        self._changed(entry.node)
        return AllocEvent(
            action=AllocAction.ADD,
            node=entry.node,
            pod=entry.key,
            uid=entry.uid,
            is_foreign=entry.owner is Owner.FOREIGN,
            held=entry.held,
        )

    def _remove(self, entry: Allocation) -> AllocEvent:
        state = self.nodes[entry.node]
        state.uncertain_total = _minus(state.uncertain_total, entry.uncertain)
        if entry.owner is Owner.OWN:
            del state.own[entry.uid]
            state.own_total = _minus(state.own_total, entry.held)
        else:
            del state.foreign[entry.uid]
            state.foreign_total = _minus(state.foreign_total, entry.held)
            if entry.tag is ForeignTag.STATIC:
                state.static_total = _minus(state.static_total, entry.held)
        del self.pods[entry.uid]
        if not state.is_known and not state.own and not state.foreign:
            del self.nodes[entry.node]
        self._changed(entry.node)
        if self.moves:
            self._end_moves_of(entry.uid)
        return AllocEvent(
            action=AllocAction.REMOVE,
            node=entry.node,
            pod=entry.key,
            uid=entry.uid,
            is_foreign=entry.owner is Owner.FOREIGN,
            held=ZERO,
            previous=entry.held,
        )

    def _set_held(self, entry: Allocation, held: Demand) -> AllocEvent | None:
        previous = entry.held
        return _resized(entry, previous) if self._hold(entry, held) else None

    def _hold(self, entry: Allocation, held: Demand) -> bool:
        """Make ``entry`` hold ``held``, keeping its node's totals; whether anything changed."""
        old = entry.held
        if held == old:
            return False
        state = self.nodes[entry.node]
        delta = Demand(held.cpu_millis - old.cpu_millis, held.memory_bytes - old.memory_bytes)
        if entry.owner is Owner.OWN:
            state.own_total = _plus_signed(state.own_total, delta)
        else:
            state.foreign_total = _plus_signed(state.foreign_total, delta)
            if entry.tag is ForeignTag.STATIC:
                state.static_total = _plus_signed(state.static_total, delta)
        entry.held = held
        self._changed(entry.node)
        return True

    def release(self, uid: str) -> list[AllocEvent]:
        entry = self.pods.get(uid)
        return [self._remove(entry)] if entry is not None else []

    # -- what the API server says ------------------------------------------------------------

    def observe_pod(self, pod: PodInfo, *, at: float) -> list[AllocEvent]:
        """An ADDED/MODIFIED pod from the watch (or a list). Idempotent."""
        entry = self.pods.get(pod.uid)
        if pod.is_terminated:
            return self.release(pod.uid)
        if pod.node_name is None:
            # Not bound (yet). A tentative hold from our own bind stays until the bind answers.
            if entry is not None and not entry.is_tentative:
                return self.release(pod.uid)
            return _NO_EVENTS
        events: list[AllocEvent] = []
        if entry is not None and (entry.node != pod.node_name or _owner(pod) is not entry.owner):
            events.extend(self.release(pod.uid))
            entry = None
        if entry is None:
            if self._move_targets and pod.key in self._move_targets:
                taken = self._take_over_reservation(pod, pod.node_name, at=at)
                if taken is not None:
                    return [*events, *taken]
            events.append(self._add(self._new_entry(pod, pod.node_name, at=at, is_fresh=False)))
            return events
        entry.is_tentative = False
        entry.priority = pod.priority
        entry.requests = pod.requests
        entry.disruption = pod.disruption
        if entry.vm is None and pod.vm is not None:
            entry.vm = pod.vm
        elif (
            entry.vm is not None
            and pod.vm is not None
            and entry.vm.is_movable is not pod.vm.is_movable
        ):
            # never-move follows the pod (the vm-controller patches it from the VM's
            # ``spec.neverMove``); the bounds stay as the VM was placed with.
            entry.vm = msgspec.structs.replace(entry.vm, is_movable=pod.vm.is_movable)
        if entry.vm is not None:
            entry.memory_extra = pod.memory_extra_bytes
        held = _held_for(entry)
        change = self._set_held(entry, held)
        if change is not None:
            events.append(change)
            if entry.uncertain != ZERO:  # its requests moved: so does what it may run beyond
                state = self.nodes[entry.node]
                state.uncertain_total = _minus(state.uncertain_total, entry.uncertain)
                entry.uncertain = _uncertain_for(entry)
                state.uncertain_total = state.uncertain_total + entry.uncertain
        return events

    def forget_pod(self, uid: str) -> list[AllocEvent]:
        """A DELETED pod: it holds nothing any more."""
        return self.release(uid)

    def replace_pods(self, pods: Iterable[PodInfo], *, at: float) -> list[AllocEvent]:
        """A fresh list after a (re)list: reconcile whatever the watch missed.

        Pods absent from the list are gone, except our tentative binds still in flight.
        """
        events: list[AllocEvent] = []
        seen: set[str] = set()
        for pod in pods:
            seen.add(pod.uid)
            events.extend(self.observe_pod(pod, at=at))
        for uid in [u for u, e in self.pods.items() if u not in seen and not e.is_tentative]:
            events.extend(self.release(uid))
        return events

    def _new_entry(self, pod: PodInfo, node: str, *, at: float, is_fresh: bool) -> Allocation:
        """A new hold. ``is_fresh``: we are placing the pod now, so its VM has not started and
        runs at its recorded (else minimum) size; otherwise it is unverified."""
        owner = _owner(pod)
        entry = Allocation(
            uid=pod.uid,
            namespace=pod.namespace,
            name=pod.name,
            node=node,
            owner=owner,
            tag=None
            if owner is Owner.OWN
            else (ForeignTag.STATIC if pod.is_static else ForeignTag.DEFAULT),
            priority=pod.priority,
            held=ZERO,
            requests=pod.requests,
            allocated_at=at,
            vm=pod.vm if owner is Owner.OWN else None,
            vm_name=pod.vm_name if owner is Owner.OWN else None,
            disruption=pod.disruption,
        )
        if entry.vm is not None:
            entry.memory_extra = pod.memory_extra_bytes
            entry.vcpus = (
                pod.permitted_vcpus if pod.permitted_vcpus is not None else entry.vm.min_vcpus
            )
            entry.memory_bytes = (
                pod.permitted_memory_bytes
                if pod.permitted_memory_bytes is not None
                else entry.vm.min_memory_bytes
            )
        entry.held = _held_for(entry)
        if entry.vm is not None and not is_fresh:
            entry.uncertain = _uncertain_for(entry)
        return entry

    # -- what this extender decides ------------------------------------------------------------

    def reserve_for_bind(self, pod: PodInfo, node: str, *, at: float) -> AllocEvent | None:
        """Reserve ``pod`` on ``node`` before the Binding is posted (the commit point).

        Re-checks the fit: another pod may have been bound since this one was filtered.
        Returns None when the pod is already held on that node (a retried bind, or the watch
        was faster than the bind answer).
        """
        entry = self.pods.get(pod.uid)
        if entry is not None:
            if entry.node == node:
                return None
            if not entry.is_tentative:
                raise Conflict(f"pod {pod.key} is already bound to node {entry.node}")
            self.release(pod.uid)
        state = self.nodes.get(node)
        if state is None or not state.is_known:
            raise UnknownNode(f"node {node} is not known to the extender")
        new = self._new_entry(pod, node, at=at, is_fresh=True)
        new.owner = Owner.OWN
        new.tag = None
        new.is_tentative = True
        if not state.fits(new.held):
            raise NoRoom(_no_room_reason(state, new.held))
        return self._add(new)

    def cancel_bind(self, uid: str) -> list[AllocEvent]:
        """The Binding failed: drop the tentative hold (not one the watch has confirmed)."""
        entry = self.pods.get(uid)
        if entry is None or not entry.is_tentative:
            return _NO_EVENTS
        return [self._remove(entry)]

    def set_vm_size(self, uid: str, *, vcpus: int, memory_bytes: int) -> AllocEvent | None:
        """Record a VM's new permitted size (the permit logic has checked that it fits)."""
        entry = self.pods[uid]
        previous = entry.held
        changed = self.resize_vm(uid, vcpus=vcpus, memory_bytes=memory_bytes)
        return _resized(entry, previous) if changed else None

    def resize_vm(self, uid: str, *, vcpus: int, memory_bytes: int) -> bool:
        """``set_vm_size`` without the event (the permit path builds none, at tens of thousands
        of VMs a second): whether what the VM holds changed."""
        entry = self.pods[uid]
        entry.vcpus = vcpus
        entry.memory_bytes = memory_bytes
        entry.has_agent = True
        requests = entry.requests
        # ``_held_for``, inlined: the larger of the pod's requests and the permitted size.
        if entry.vm is None:
            held = requests
        else:
            cpu = max(requests.cpu_millis, vcpus * 1000)
            held = Demand(cpu, max(requests.memory_bytes, memory_bytes + entry.memory_extra))
        if entry.uncertain != ZERO:
            state = self.nodes[entry.node]
            state.uncertain_total = _minus(state.uncertain_total, entry.uncertain)
            entry.uncertain = ZERO
            if not self._hold(entry, held):
                self._changed(entry.node)  # the size stayed, but the node's free room changed
                return False
            return True
        return self._hold(entry, held)

    # -- moves -----------------------------------------------------------------------------

    def reserve_move(
        self, source_uid: str, *, target_name: str, target_node: str, at: float
    ) -> AllocEvent:
        """Hold a moving VM's room on ``target_node`` before its target pod (``target_name``, in
        the source's namespace) exists: what the source holds, plus what it may run beyond that
        if unverified. Refuses (typed, nothing changed) an unknown pod, a pod that is not a VM
        of ours, a VM already moving, the node it is on, an unknown node, a node without room.
        """
        entry = self.pods.get(source_uid)
        if entry is None:
            raise UnknownPod(f"pod uid {source_uid} holds nothing here")
        if entry.owner is not Owner.OWN or entry.vm is None or entry.is_tentative:
            raise Conflict(f"pod {entry.key} is not a bound VM of this scheduler")
        if source_uid in self.moves or any(m.target_uid == source_uid for m in self.moves.values()):
            raise Conflict(f"VM {entry.key} is already moving")
        if target_node == entry.node:
            raise Conflict(f"VM {entry.key} already runs on node {target_node}")
        target_key = f"{entry.namespace}/{target_name}"
        if target_key in self._move_targets or any(e.key == target_key for e in self.pods.values()):
            raise Conflict(f"pod {target_key} already exists or is another move's target")
        state = self.nodes.get(target_node)
        if state is None or not state.is_known:
            raise UnknownNode(f"node {target_node} is not known to the extender")
        reservation = Allocation(
            uid=_reservation_uid(source_uid),
            namespace=entry.namespace,
            name=target_name,
            node=target_node,
            owner=Owner.OWN,
            tag=None,
            priority=entry.priority,
            held=ZERO,
            requests=entry.requests,
            allocated_at=at,
            vm=entry.vm,
            vm_name=entry.vm_name,
            vcpus=entry.vcpus,
            memory_bytes=entry.memory_bytes,
            memory_extra=entry.memory_extra,
            # Kept by replace_pods (no pod is listed for it) and by forget_agents.
            is_tentative=True,
            has_agent=entry.has_agent,
            uncertain=entry.uncertain,
        )
        reservation.held = _held_for(reservation)
        if not state.fits(reservation.held + reservation.uncertain):
            raise NoRoom(_no_room_reason(state, reservation.held + reservation.uncertain))
        move = Move(
            source_uid=source_uid,
            target_key=target_key,
            target_node=target_node,
            target_uid=reservation.uid,
        )
        self.moves[source_uid] = move
        self._move_targets[target_key] = source_uid
        return self._add(reservation)

    def cancel_move(self, source_uid: str) -> list[AllocEvent]:
        """The move failed or was withdrawn: release the reservation if no target pod took it
        over (a target pod that exists keeps its hold until it is gone: reality)."""
        move = self.moves.pop(source_uid, None)
        if move is None:
            return _NO_EVENTS
        del self._move_targets[move.target_key]
        if move.is_target_observed:
            return _NO_EVENTS
        return self.release(move.target_uid)

    def _take_over_reservation(
        self, pod: PodInfo, node: str, *, at: float
    ) -> list[AllocEvent] | None:
        """The target pod is seen bound: it holds the reservation's size from now on (unless it
        landed elsewhere, which ``observe_pod`` then counts as any other pod)."""
        move = self.moves[self._move_targets[pod.key]]
        reservation = self.pods.get(move.target_uid)
        if move.is_target_observed or reservation is None or reservation.node != node:
            return None
        entry = self._new_entry(pod, node, at=at, is_fresh=True)
        if entry.vm is not None:
            # The source's permit, carried over: its size now (it may have shrunk since the
            # reservation, never grown: ``permits.decide`` grants a moving VM no growth).
            sized = self.pods.get(move.source_uid, reservation)
            entry.vcpus, entry.memory_bytes = sized.vcpus, sized.memory_bytes
            entry.has_agent = sized.has_agent
            entry.uncertain = sized.uncertain
            entry.held = _held_for(entry)
        move.target_uid = pod.uid  # first: removing the reservation must not end the move
        return [self._remove(reservation), self._add(entry)]

    def _end_moves_of(self, uid: str) -> None:
        """``uid`` is gone: a move it was the source or the target of is over."""
        move = self.moves.get(uid)
        if move is not None:  # the source is gone: the VM runs on the target (or nowhere)
            self.cancel_move(uid)
            return
        for source_uid, move in list(self.moves.items()):
            if move.target_uid == uid:  # the target is gone: the source runs on
                del self.moves[source_uid]
                del self._move_targets[move.target_key]

    def forget_agents(self) -> None:
        """Back to what a rebuild knows: no VM's agent has spoken to this incarnation.

        A standby that takes the extender's Lease calls this before its first decision (it is
        a no-op for one that never led: it never heard an agent). Another leader may have
        granted any VM more since this ledger last heard from its agent, so each bound VM is
        *unverified* again, exactly as ``replace_pods`` leaves a VM it finds bound after a
        restart: its room up to its maximum is kept out of ``free`` until its agent reports.
        A tentative hold (our own bind in flight) keeps its size: that VM has not started.
        """
        for entry in self.pods.values():
            if entry.vm is None or entry.is_tentative or entry.owner is not Owner.OWN:
                continue
            entry.has_agent = False
            uncertain = _uncertain_for(entry)
            if uncertain != entry.uncertain:
                state = self.nodes[entry.node]
                state.uncertain_total = _minus(state.uncertain_total, entry.uncertain)
                entry.uncertain = uncertain
                state.uncertain_total = state.uncertain_total + uncertain
                self._changed(entry.node)

    # -- checks ------------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (1 and 3 of the docstring)."""
        indexed = 0
        for name, state in self.nodes.items():
            if state.name != name:
                raise AssertionError(f"node {name} stored under another name {state.name}")
            for table, owner in ((state.own, Owner.OWN), (state.foreign, Owner.FOREIGN)):
                for uid, entry in table.items():
                    if self.pods.get(uid) is not entry or entry.node != name:
                        raise AssertionError(f"pod {uid} on {name} is not indexed there")
                    if entry.owner is not owner:
                        raise AssertionError(f"pod {uid} is in the wrong table on {name}")
                    if entry.held != _held_for(entry):
                        raise AssertionError(f"pod {uid} holds {entry.held}, not its size")
                    indexed += 1
            own = _sum(e.held for e in state.own.values())
            foreign = _sum(e.held for e in state.foreign.values())
            static = _sum(e.held for e in state.foreign.values() if e.tag is ForeignTag.STATIC)
            if own != state.own_total or foreign != state.foreign_total:
                raise AssertionError(
                    f"node {name}: totals {state.own_total}/{state.foreign_total} "
                    f"!= sums {own}/{foreign}"
                )
            if static != state.static_total:
                raise AssertionError(f"node {name}: static total {state.static_total} != {static}")
            uncertain = _sum(e.uncertain for e in state.own.values())
            if uncertain != state.uncertain_total:
                raise AssertionError(
                    f"node {name}: uncertain total {state.uncertain_total} != {uncertain}"
                )
            if not state.is_known and not state.own and not state.foreign:
                raise AssertionError(f"unknown node {name} with no pods was kept")
        if indexed != len(self.pods):
            raise AssertionError(f"{len(self.pods)} pods indexed but {indexed} held on nodes")

    def totals(self) -> Demand:
        return _sum(s.allocated for s in self.nodes.values())


def _owner(pod: PodInfo) -> Owner:
    return Owner.OWN if pod.is_ours else Owner.FOREIGN


def _resized(entry: Allocation, previous: Demand) -> AllocEvent:
    return AllocEvent(
        action=AllocAction.RESIZE,
        node=entry.node,
        pod=entry.key,
        uid=entry.uid,
        is_foreign=entry.owner is Owner.FOREIGN,
        held=entry.held,
        previous=previous,
    )


def held_at(entry: Allocation, *, vcpus: int, memory_bytes: int) -> Demand:
    """What ``entry`` (a VM) would hold at that size: the larger of its pod's requests and the
    size, its memory plus what its pod holds beyond the guest's."""
    return entry.requests.max(Demand(vcpus * 1000, memory_bytes + entry.memory_extra))


def _held_for(entry: Allocation) -> Demand:
    vm = entry.vm
    if vm is None or entry.vcpus is None or entry.memory_bytes is None:
        return entry.requests
    return held_at(entry, vcpus=entry.vcpus, memory_bytes=entry.memory_bytes)


def _uncertain_for(entry: Allocation) -> Demand:
    """What an unverified VM may run beyond what it holds: up to its maximum."""
    vm = entry.vm
    assert vm is not None
    top = entry.requests.max(Demand(vm.top_vcpus * 1000, vm.top_memory_bytes + entry.memory_extra))
    return Demand(
        max(0, top.cpu_millis - entry.held.cpu_millis),
        max(0, top.memory_bytes - entry.held.memory_bytes),
    )


def _sum(items: Iterable[Demand]) -> Demand:
    cpu = mem = 0
    for d in items:
        cpu += d.cpu_millis
        mem += d.memory_bytes
    return Demand(cpu, mem)


def _minus(a: Demand, b: Demand) -> Demand:
    return Demand(a.cpu_millis - b.cpu_millis, a.memory_bytes - b.memory_bytes)


def _plus_signed(a: Demand, delta: Demand) -> Demand:
    return Demand(a.cpu_millis + delta.cpu_millis, a.memory_bytes + delta.memory_bytes)


def _no_room_reason(state: NodeState, need: Demand) -> str:
    free = state.free
    if need.cpu_millis > free.cpu_millis:
        return (
            f"insufficient cpu: needs {need.cpu_millis}m, {max(0, free.cpu_millis)}m free "
            f"of {state.usable.cpu_millis}m usable"
        )
    return (
        f"insufficient memory: needs {need.memory_bytes} bytes, "
        f"{max(0, free.memory_bytes)} free of {state.usable.memory_bytes} usable"
    )
