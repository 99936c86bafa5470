"""Filter, prioritize and preempt decisions over the ledger.

Pure: no I/O. A node that does not fit is *data* (a reason string), never an exception.

Speed. kube-scheduler calls filter for every pod with every candidate node, so the answer must
not cost a pass over thousands of nodes in Python. ``FitIndex`` keeps, for each pod size it has
been asked about (few: VMs come in a handful of shapes), the set of nodes that reject that size
and why. The ledger tells it which node changed after every mutation; the node is only marked,
and the next call for any size re-checks the marked nodes once for each cached size (a permit
batch changes one node fifty times). A filter call is then a set intersection done in C; when no
candidate is rejected (the common case) the request's own list is the answer.

Scoring (prioritize), 0..10, for a pod needing ``d`` with growth ``g`` (a VM's top size in
millicores less ``d``, ``verbs.growth_millis``; 0 for other pods) on a node with usable capacity
``U`` and, after placing the pod at ``d``, free room ``F``::

    headroom = 1                       if g == 0
             = min(1, F.cpu / g)       otherwise  (can the VM grow to its maximum here?)
    spread   = mean(F.cpu / U.cpu, F.mem / U.mem)  (emptier nodes first)
    pack     = 1 - spread                          (fuller nodes first, keep others empty)
    score    = round(10 * (headroom + balance) / 2), balance = spread or pack by strategy

so a node where the VM can reach its maximum always beats one where it cannot, at equal fill.
"""

from __future__ import annotations

import enum
import functools
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

from scheduler_extender.core.ledger import ForeignTag, Ledger, NodeState
from scheduler_extender.core.podinfo import Demand

MAX_SCORE: Final = 10


class Strategy(enum.StrEnum):
    SPREAD = "spread"
    PACK = "pack"


class Rejection(NamedTuple):
    reason: str  # with this node's numbers: a bind refusal, logs, the recommender's report
    # No amount of preemption could help (the pod is bigger than the node can ever give).
    is_unresolvable: bool


class Verdict(NamedTuple):
    """Why a node rejects a pod, in words that are the same for every node rejecting that pod
    for that cause: what filter answers.

    kube-scheduler counts nodes per distinct reason into the pod's FailedScheduling message
    ("0/5000 nodes are available: 480 insufficient cpu: pod needs 4000m, ..."); a reason
    carrying each node's free room would make that message one line per node. It also keeps
    the answer small and cacheable: a node whose free room moves but still rejects the pod
    leaves the answer as it was. The node's numbers are in ``rejection`` and ``/state``.
    """

    summary: str
    is_unresolvable: bool


class FilterResult(NamedTuple):
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


NOT_KNOWN: Final = "node not known to the extender yet"


def rejection(state: NodeState, demand: Demand) -> Rejection | None:
    """Why ``demand`` does not fit on ``state`` now, with the node's numbers, or None."""
    if not state.is_known:
        return Rejection(f"node {state.name} is not known to the extender yet", False)
    short = _shortfall(state, demand)
    return None if short is None else _rejection(*short)


def verdict(state: NodeState, demand: Demand) -> Verdict | None:
    """``rejection`` in the words every node shares (see ``Verdict``), or None if it fits."""
    if not state.is_known:
        return _NOT_KNOWN
    short = _shortfall(state, demand)
    if short is None:
        return None
    unit, need, _, usable, static = short
    return _verdict(unit, need, need > usable - static)


def _shortfall(state: NodeState, demand: Demand) -> tuple[str, int, int, int, int] | None:
    """The first resource ``demand`` lacks on ``state``: (unit, need, free, usable, static)."""
    free = state.free
    if demand.cpu_millis > free.cpu_millis:
        usable, static = state.usable, state.static_total
        return "cpu", demand.cpu_millis, free.cpu_millis, usable.cpu_millis, static.cpu_millis
    if demand.memory_bytes > free.memory_bytes:
        usable, static = state.usable, state.static_total
        return (
            "memory",
            demand.memory_bytes,
            free.memory_bytes,
            usable.memory_bytes,
            static.memory_bytes,
        )
    return None


_NOT_KNOWN: Final = Verdict(NOT_KNOWN, False)


@functools.lru_cache(maxsize=1024)
def _verdict(unit: str, need: int, is_unresolvable: bool) -> Verdict:
    if is_unresolvable:
        text = f"node too small: pod needs {_fmt(unit, need)} {unit}, more than it can ever give"
    else:
        text = f"insufficient {unit}: pod needs {_fmt(unit, need)}"
    return Verdict(text, is_unresolvable)


def _rejection(unit: str, need: int, free: int, usable: int, static: int) -> Rejection:
    if need > usable - static:
        return Rejection(
            f"pod needs {_fmt(unit, need)} {unit} but the node can never give more than"
            f" {_fmt(unit, usable - static)} ({_fmt(unit, usable)} usable after the system"
            f" reserve, {_fmt(unit, static)} held by static pods)",
            True,
        )
    return Rejection(
        f"insufficient {unit}: pod needs {_fmt(unit, need)},"
        f" node has {_fmt(unit, max(free, 0))} free of {_fmt(unit, usable)}",
        False,
    )


def _fmt(unit: str, value: int) -> str:
    if unit == "cpu":
        return f"{value}m"
    return f"{value // 2**20}Mi" if value % 2**20 == 0 else f"{value}B"


class FitIndex:
    """Per pod size, the nodes that reject it; kept current node by node. See module doc."""

    def __init__(self, ledger: Ledger, *, max_sizes: int = 128) -> None:
        self._ledger = ledger
        self._max_sizes = max_sizes
        self._by_size: OrderedDict[Demand, dict[str, Verdict]] = OrderedDict()
        self.known: set[str] = {n for n, s in ledger.nodes.items() if s.is_known}
        # Change stamps for ``version``: one counter, so a stamp is never reused, not even by
        # a size that was evicted and computed again.
        self._stamp = 0
        self._known_stamp = 0
        self._size_stamps: dict[Demand, int] = {}
        # Nodes changed since the last ``_flush``: the ledger calls this set's own ``add`` on
        # *every* mutation (each VM of a permit batch), the cheapest listener there is. The
        # nodes' verdicts (and ``known``) are brought up to date by ``_flush`` when a size is
        # next asked about, so a thousand permits on twenty nodes between two filter calls
        # cost twenty re-checks per size instead of a thousand.
        self._dirty: set[str] = set()
        ledger.subscribe(self._dirty.add)

    def _bump(self) -> int:
        self._stamp += 1
        return self._stamp

    def _flush(self) -> None:
        """Re-check every node changed since the last flush: is it known, and, for every
        cached size, does it reject that size (and in which words)."""
        if not self._dirty:
            return
        dirty = self._dirty.copy()
        self._dirty.clear()  # not rebound: the ledger holds this set's ``add``
        nodes = self._ledger.nodes
        known = self.known
        stamps = self._size_stamps
        by_size = self._by_size
        for name in dirty:
            state = nodes.get(name)
            if state is None or not state.is_known:
                if name in known:
                    known.discard(name)
                    self._known_stamp = self._bump()
                # Unknown nodes are rejected by their absence from ``known``.
                for size, rejected in by_size.items():
                    if rejected.pop(name, None) is not None:
                        stamps[size] = self._bump()
                continue
            if name not in known:
                known.add(name)
                self._known_stamp = self._bump()
            if not by_size:
                continue
            # Computed once per node, not once per size: ``free`` builds a new struct.
            free = state.free
            free_cpu, free_mem = free.cpu_millis, free.memory_bytes
            for size, rejected in by_size.items():
                if size.cpu_millis <= free_cpu and size.memory_bytes <= free_mem:
                    if rejected.pop(name, None) is not None:
                        stamps[size] = self._bump()
                    continue
                r = verdict(state, size)
                if rejected.get(name) != r:
                    assert r is not None
                    rejected[name] = r
                    stamps[size] = self._bump()

    def version(self, size: Demand) -> tuple[int, int]:
        """Changes whenever ``filter(size, names)`` could answer differently for any ``names``.

        Lets the shell keep an encoded answer while the ledger churns elsewhere: a permit on a
        node that fits ``size`` before and after leaves this version (and the answer) alone.
        """
        self.rejections(size)
        return self._known_stamp, self._size_stamps[size]

    def rejections(self, size: Demand) -> dict[str, Verdict]:
        self._flush()
        rejected = self._by_size.get(size)
        if rejected is not None:
            self._by_size.move_to_end(size)
            return rejected
        rejected = {}
        for name, state in self._ledger.nodes.items():
            if state.is_known:
                r = verdict(state, size)
                if r is not None:
                    rejected[name] = r
        self._by_size[size] = rejected
        self._size_stamps[size] = self._bump()
        if len(self._by_size) > self._max_sizes:
            evicted, _ = self._by_size.popitem(last=False)
            del self._size_stamps[evicted]
        return rejected

    def filter(self, size: Demand, names: list[str]) -> FilterResult:
        rejected = self.rejections(size)
        if (not rejected or rejected.keys().isdisjoint(names)) and self.known.issuperset(names):
            return FilterResult(names, {}, {})
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        known = self.known
        for name in names:
            r = rejected.get(name)
            if r is not None:
                (unresolvable if r.is_unresolvable else failed)[name] = r.summary
            elif name in known:
                passed.append(name)
            else:
                failed[name] = NOT_KNOWN
        return FilterResult(passed, failed, unresolvable)


def reject_all(names: Iterable[str], reason: str) -> FilterResult:
    """Every node fails for a reason that is the pod's, not the node's (bad annotations)."""
    return FilterResult([], {}, dict.fromkeys(names, reason))


def score(state: NodeState | None, size: Demand, growth_millis: int, strategy: Strategy) -> int:
    if state is None or not state.is_known:
        return 0
    usable = state.usable
    free = state.free
    free_cpu = max(0, free.cpu_millis - size.cpu_millis)
    free_mem = max(0, free.memory_bytes - size.memory_bytes)
    headroom = 1.0 if growth_millis <= 0 else min(1.0, free_cpu / growth_millis)
    spread = (
        (free_cpu / usable.cpu_millis if usable.cpu_millis else 0.0)
        + (free_mem / usable.memory_bytes if usable.memory_bytes else 0.0)
    ) / 2
    balance = spread if strategy is Strategy.SPREAD else 1.0 - spread
    return max(0, min(MAX_SCORE, round(MAX_SCORE * (headroom + balance) / 2)))


def score_nodes(
    ledger: Ledger, names: Sequence[str], size: Demand, *, growth_millis: int, strategy: Strategy
) -> list[tuple[str, int]]:
    nodes = ledger.nodes
    return [(n, score(nodes.get(n), size, growth_millis, strategy)) for n in names]


_ScoreKey = tuple[Demand, int, Strategy]


class ScoreIndex:
    """``score_nodes`` with each node's score kept per (size, growth, strategy) and kept
    current node by node, the way ``FitIndex`` keeps rejections.

    Speed: kube-scheduler calls prioritize for every pod with the nodes that passed filter
    (hundreds), and between two calls a bind has changed one node. Scoring them all anew cost
    more Python per pod than the rest of the extender's work for it; now only the changed
    nodes are scored again, once per kept key, and the rest are dictionary lookups. A score
    is a whole number from 0 to 10, so most changes leave it where it was: ``version(key)``
    moves only when one of the key's kept scores does, and the shell keeps an encoded answer
    while it stands still. Same answers as ``score_nodes`` (a property test holds them equal
    under any ledger changes, and an unchanged version to an unchanged answer).
    """

    def __init__(self, ledger: Ledger, *, max_keys: int = 128) -> None:
        self._ledger = ledger
        self._max_keys = max_keys
        self._by_key: OrderedDict[_ScoreKey, dict[str, int]] = OrderedDict()
        # Change stamps for ``version``: one counter, so a stamp is never reused, not even by
        # a key that was evicted and computed again.
        self._stamp = 0
        self._key_stamps: dict[_ScoreKey, int] = {}
        self._dirty: set[str] = set()
        ledger.subscribe(self._dirty.add)

    def _flush(self) -> None:
        """Score every node changed since the last flush again, for every kept key that has
        a score for it; a key whose scores moved gets a new stamp."""
        if not self._dirty:
            return
        dirty = self._dirty.copy()
        self._dirty.clear()  # not rebound: the ledger holds this set's ``add``
        nodes = self._ledger.nodes
        for key, scores in self._by_key.items():
            size, growth_millis, strategy = key
            is_changed = False
            for name in dirty:
                old = scores.get(name)
                if old is None:
                    continue
                new = score(nodes.get(name), size, growth_millis, strategy)
                if new != old:
                    scores[name] = new
                    is_changed = True
            if is_changed:
                self._stamp += 1
                self._key_stamps[key] = self._stamp

    def _kept(self, key: _ScoreKey) -> dict[str, int]:
        self._flush()
        kept = self._by_key.get(key)
        if kept is not None:
            self._by_key.move_to_end(key)
            return kept
        kept = self._by_key[key] = {}
        self._stamp += 1
        self._key_stamps[key] = self._stamp
        if len(self._by_key) > self._max_keys:
            evicted, _ = self._by_key.popitem(last=False)
            del self._key_stamps[evicted]
        return kept

    def version(self, size: Demand, *, growth_millis: int, strategy: Strategy) -> int:
        """Changes whenever ``scores(names, size, ...)`` could answer differently for any
        ``names`` it has answered for."""
        key = (size, growth_millis, strategy)
        self._kept(key)
        return self._key_stamps[key]

    def scores(
        self, names: Sequence[str], size: Demand, *, growth_millis: int, strategy: Strategy
    ) -> list[tuple[str, int]]:
        cached = self._kept((size, growth_millis, strategy))
        nodes = self._ledger.nodes
        out: list[tuple[str, int]] = []
        for name in names:
            value = cached.get(name)
            if value is None:
                value = cached[name] = score(nodes.get(name), size, growth_millis, strategy)
            out.append((name, value))
        return out


class VictimChoice(NamedTuple):
    victims: list[str] | None  # None: drop the node
    num_pdb_violations: int
    reason: str


def choose_victims(
    ledger: Ledger, node: str, size: Demand, victim_uids: Sequence[str], num_pdb_violations: int
) -> VictimChoice:
    """Filter kube-scheduler's proposed victims on ``node``.

    Static pods are never victims. The node is dropped when the remaining victims no longer free
    enough room for ``size`` by our own accounting (kube-scheduler may also have counted the
    static pod's room, which will never come back).
    """
    state = ledger.nodes.get(node)
    if state is None or not state.is_known:
        return VictimChoice(None, 0, f"node {node} is not known to the extender")
    kept: list[str] = []
    freed_cpu = freed_mem = 0
    dropped_static = 0
    for uid in victim_uids:
        entry = ledger.pods.get(uid)
        if entry is not None and entry.tag is ForeignTag.STATIC:
            dropped_static += 1
            continue
        kept.append(uid)
        if entry is not None and entry.node == node:
            freed_cpu += entry.held.cpu_millis
            freed_mem += entry.held.memory_bytes
    free = state.free
    if free.cpu_millis + freed_cpu < size.cpu_millis or (
        free.memory_bytes + freed_mem < size.memory_bytes
    ):
        return VictimChoice(
            None,
            0,
            f"preempting the allowed victims on {node} would not free enough room"
            f" ({dropped_static} static pod(s) excluded)",
        )
    pdb = (
        num_pdb_violations if len(kept) == len(victim_uids) else min(num_pdb_violations, len(kept))
    )
    return VictimChoice(kept, pdb, f"{len(kept)} victim(s), {dropped_static} static excluded")
