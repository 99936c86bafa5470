"""Phase 6 of the recommender: the cheapest plan that places what greedy placed on new nodes.

Pure: no I/O, no clock, no randomness. Greedy picks one node at a time and can miss a cheaper
plan, within one pool (one large node instead of two small ones) or across pools (issue 18:
five 3-cpu pods; pool a6 holds 2 per node at 1.8, b9 holds 3 at 2.8; greedy by least cost buys
three a6 for 5.4 where b9 + a6 costs 4.6). This phase looks for the cheapest set of new nodes,
any mix of priced pools and zones, that holds every pod greedy put on a new node, with each
pod's constraints and each pool's maximum count and resource limits; the scale-up recommends
it when it costs less than greedy's, and the answer says what greedy's plan would have cost.
When the scorer chain starts with ``priority``, pool priority outranks price: the plan uses no
pool whose priority is below every pool greedy used.

The search is a depth-first branch and bound over the pods, largest first: each pod goes into
a node already opened by the plan or into a new node of a candidate (pool x zone). Exact and
deterministic: it counts *steps* (one per node or candidate tried), never reads a clock, and
stops at ``RecommenderConfig.plan_search_steps``. It prunes with

* the incumbent: greedy's plan to begin with, so only strictly cheaper plans are kept;
* a lower bound (``_Bound``): for each resource, every pod's share of it costs at least the
  cheapest price per unit of that resource among the candidates it may use; room left on the
  nodes already open can absorb at most that room times the dearest such price of the pods
  left. The bound at the root is what the answer reports as ``lowerBound``: no plan placing
  these pods costs less. A search that finishes proves its plan optimal (``isOptimal``);
* symmetry: pods of one shape are interchangeable (the next one goes no earlier than the last
  one did), and so are open nodes of one candidate with the same room left.

The search recurses once per pod, so it runs on plans of at most ``EXACT_PODS`` pods. Beyond
that only its first descent runs (each pod into the first open node it fits, else a new node of
the candidate cheapest per pod of its shape), within the same step budget, and the lower bound
says how far from optimal the result may be.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, Protocol

from scheduler_extender.recommender.config import RecommenderConfig, Scorer
from scheduler_extender.recommender.model import Candidate, Pending, Pool
from scheduler_extender.recommender.recommendation import PlanCost, PlanNodes

__all__ = ["EXACT_PODS", "CostPlan", "PlanInput", "cost_plan"]

# The most pods the exact search recurses over (one stack frame each; Python's default
# recursion limit is 1,000). Larger plans get the first descent only.
EXACT_PODS: Final = 400
# The pruning bound is computed in floats: it is shaved by this much (relative) so that
# rounding can never prune a cheaper plan. Prices are bounded (``snapshot.MIN_PRICE``), so
# every product stays a normal float.
_SLACK: Final = 1e-9


class PlanInput(Protocol):
    """What the check reads of the finished simulation."""

    @property
    def config(self) -> RecommenderConfig: ...
    @property
    def candidates(self) -> Sequence[Candidate]: ...
    @property
    def new_nodes(self) -> Mapping[str, tuple[Candidate, list[str]]]: ...
    @property
    def greedy_pods(self) -> Sequence[Pending]: ...
    def admits(self, cls: int, cand: Candidate) -> str | None: ...


@dataclass(frozen=True, slots=True)
class CostPlan:
    """What phase 6 found. ``nodes``: the plan to recommend, one (candidate, pod names) per
    new node, or None when greedy's plan stands."""

    cost: PlanCost
    nodes: list[tuple[Candidate, list[str]]] | None


@dataclass(slots=True)
class _Shape:
    cls: int
    cpu: int
    mem: int
    pods: list[str]  # names, in scheduling order
    types: list[int]  # candidates it may use (constraints and size), best first for a new node


class _Search:
    """The branch and bound's state; see the module docstring."""

    def __init__(
        self,
        *,
        shapes: list[_Shape],
        items: list[int],
        cands: list[Candidate],
        prices: list[int],
        caps: list[int],
        budget: int,
        best: int,
    ) -> None:
        self.shapes, self.items, self.cands, self.prices = shapes, items, cands, prices
        self.caps = caps  # pool index -> new nodes it may still get
        self.pool_of = [c.pool.index for c in cands]
        self.steps = budget
        self.is_exhausted = False
        self.best = best  # incumbent cost (scaled ints); only strictly cheaper plans are kept
        self.best_bins: list[tuple[int, list[int]]] | None = None
        # The open nodes: candidate, free cpu, free memory, items (indices into ``items``).
        self.bin_type: list[int] = []
        self.free_cpu: list[int] = []
        self.free_mem: list[int] = []
        self.held: list[list[int]] = []
        self.used = [0] * len(caps)
        self.cost = 0
        self.open_cpu = 0  # free room summed over the open nodes
        self.open_mem = 0
        self.bound = _Bound(shapes, items, cands, prices)

    def _spend(self) -> bool:
        self.steps -= 1
        if self.steps < 0:
            self.is_exhausted = True
            return False
        return True

    def _open(self, t: int, i: int) -> None:
        c, s = self.cands[t], self.shapes[self.items[i]]
        self.bin_type.append(t)
        self.free_cpu.append(c.usable.cpu_millis - s.cpu)
        self.free_mem.append(c.usable.memory_bytes - s.mem)
        self.held.append([i])
        self.used[self.pool_of[t]] += 1
        self.cost += self.prices[t]
        self.open_cpu += c.usable.cpu_millis - s.cpu
        self.open_mem += c.usable.memory_bytes - s.mem

    def _close(self) -> None:
        t = self.bin_type.pop()
        self.open_cpu -= self.free_cpu.pop()
        self.open_mem -= self.free_mem.pop()
        self.held.pop()
        self.used[self.pool_of[t]] -= 1
        self.cost -= self.prices[t]

    def _put(self, b: int, i: int, sign: int) -> None:
        s = self.shapes[self.items[i]]
        self.free_cpu[b] -= sign * s.cpu
        self.free_mem[b] -= sign * s.mem
        self.open_cpu -= sign * s.cpu
        self.open_mem -= sign * s.mem
        if sign > 0:
            self.held[b].append(i)
        else:
            self.held[b].pop()

    def _fits(self, b: int, s: _Shape, allowed: set[int]) -> bool:
        return (
            self.bin_type[b] in allowed and s.cpu <= self.free_cpu[b] and s.mem <= self.free_mem[b]
        )

    def _record(self) -> None:
        self.best = self.cost
        self.best_bins = [(t, list(h)) for t, h in zip(self.bin_type, self.held, strict=True)]

    def exact(self, i: int, first_bin: int) -> None:
        """Place items ``i`` on; ``first_bin``: the earliest open node item ``i`` may take
        (after the node its identical predecessor took)."""
        if i == len(self.items):
            if self.cost < self.best:
                self._record()
            return
        if self.bound.prunes(i, self):
            return
        s = self.shapes[self.items[i]]
        allowed = set(s.types)
        same_next = i + 1 < len(self.items) and self.items[i + 1] == self.items[i]
        tried: set[tuple[int, int, int]] = set()
        for b in range(first_bin, len(self.bin_type)):
            if not self._spend():
                return
            if not self._fits(b, s, allowed):
                continue
            room = (self.bin_type[b], self.free_cpu[b], self.free_mem[b])
            if room in tried:  # an identical open node was tried already
                continue
            tried.add(room)
            self._put(b, i, 1)
            self.exact(i + 1, b if same_next else 0)
            self._put(b, i, -1)
            if self.is_exhausted:
                return
        for t in s.types:
            if not self._spend():
                return
            if self.used[self.pool_of[t]] >= self.caps[self.pool_of[t]]:
                continue
            if self.cost + self.prices[t] >= self.best:
                continue
            self._open(t, i)
            self.exact(i + 1, len(self.bin_type) - 1 if same_next else 0)
            self._close()
            if self.is_exhausted:
                return

    def descend(self) -> None:
        """The exact search's first descent alone, without recursion: first fit into the open
        nodes, else a new node of the first candidate that may still grow. Written out with
        local names (no method call per node tried): it is the search's whole cost on large
        plans. Every open node tried is a step."""
        shapes, bin_type, free_cpu, free_mem = (
            self.shapes,
            self.bin_type,
            self.free_cpu,
            self.free_mem,
        )
        allowed_of = [set(s.types) for s in shapes]
        # Per shape, the first open node it may still fit: those before it refused the shape,
        # and still do (room only shrinks, a node's candidate never changes). The scan starts
        # there; the steps still count every node from the first, as the search's do, so the
        # answer (``searchSteps``, and where the budget runs out) is the same.
        cursor = [0] * len(shapes)
        steps = self.steps
        for i, shape in enumerate(self.items):
            s = shapes[shape]
            need_cpu, need_mem, allowed = s.cpu, s.mem, allowed_of[shape]
            found = -1
            for b in range(cursor[shape], len(bin_type)):
                if need_cpu <= free_cpu[b] and need_mem <= free_mem[b] and bin_type[b] in allowed:
                    found = b
                    break
            cursor[shape] = found if found >= 0 else len(bin_type)
            steps -= found + 1 if found >= 0 else len(bin_type) + 1
            if steps < 0:
                self.steps, self.is_exhausted = steps, True
                return
            if found >= 0:
                self._put(found, i, 1)
            else:
                for t in s.types:
                    if self.used[self.pool_of[t]] < self.caps[self.pool_of[t]]:
                        self._open(t, i)
                        break
                else:
                    self.steps = steps
                    return  # no room left in any pool: greedy's plan stands
                if self.cost >= self.best:
                    self.steps = steps
                    return
        self.steps = steps
        self._record()


class _Bound:
    """The lower bound on what the items from ``i`` on add to a plan's cost (see the module
    docstring), per resource: suffix sums of each item's cheapest cost of that resource, and
    suffix maxima of those per-unit prices."""

    def __init__(
        self, shapes: list[_Shape], items: list[int], cands: list[Candidate], prices: list[int]
    ) -> None:
        # Per candidate, then per shape the cheapest among those it may use.
        cpu_unit = [p / max(c.usable.cpu_millis, 1) for p, c in zip(prices, cands, strict=True)]
        mem_unit = [p / max(c.usable.memory_bytes, 1) for p, c in zip(prices, cands, strict=True)]
        per_unit = [
            (min(map(cpu_unit.__getitem__, s.types)), min(map(mem_unit.__getitem__, s.types)))
            for s in shapes
        ]
        n = len(items)
        self.need_cpu = [0.0] * (n + 1)
        self.need_mem = [0.0] * (n + 1)
        self.dear_cpu = [0.0] * (n + 1)
        self.dear_mem = [0.0] * (n + 1)
        for i in range(n - 1, -1, -1):
            s = shapes[items[i]]
            c, m = per_unit[items[i]]
            self.need_cpu[i] = self.need_cpu[i + 1] + s.cpu * c
            self.need_mem[i] = self.need_mem[i + 1] + s.mem * m
            self.dear_cpu[i] = max(self.dear_cpu[i + 1], c)
            self.dear_mem[i] = max(self.dear_mem[i + 1], m)

    def rest(self, i: int, open_cpu: int, open_mem: int) -> float:
        return max(
            self.need_cpu[i] - open_cpu * self.dear_cpu[i],
            self.need_mem[i] - open_mem * self.dear_mem[i],
            0.0,
        )

    def prunes(self, i: int, search: _Search) -> bool:
        rest = self.rest(i, search.open_cpu, search.open_mem)
        return (search.cost + rest) * (1 - _SLACK) >= search.best


def cost_plan(sim: PlanInput, notes: list[str]) -> CostPlan | None:
    """Phase 6; None when greedy added no node, or used a pool without a price (noted)."""
    if not sim.new_nodes:
        return None
    unpriced = sorted({c.pool.name for c, _ in sim.new_nodes.values() if c.pool.price is None})
    if unpriced:
        notes.append(f"cost check skipped: pools without a price: {', '.join(unpriced)}")
        return None
    cands = [c for c in sim.candidates if c.pool.price is not None]
    chain = sim.config.scorers
    if chain and chain[0] is Scorer.PRIORITY:
        # Pool priority comes before everything, price included: the plan may use no pool
        # whose priority is below every pool greedy used.
        floor = min(c.pool.priority for c, _ in sim.new_nodes.values())
        cands = [c for c in cands if c.pool.priority >= floor]
    # Prices as ints over one denominator: costs add and compare exactly.
    scale = math.lcm(*(_price(c).denominator for c in cands))
    prices = [int(_price(c) * scale) for c in cands]
    greedy_counts: dict[int, int] = {}
    for c, _ in sim.new_nodes.values():
        greedy_counts[c.index] = greedy_counts.get(c.index, 0) + 1
    at = {c.index: t for t, c in enumerate(cands)}
    greedy = sum(prices[at[ci]] * n for ci, n in greedy_counts.items())
    caps: list[int] = []
    pools = {c.pool.index: c.pool for c in sim.candidates}
    for index in range(max(pools) + 1):
        pool = pools.get(index)
        caps.append(_new_nodes_allowed(pool) if pool is not None else 0)

    shapes: list[_Shape] = []
    by_shape: dict[int, _Shape] = {}
    for p in sim.greedy_pods:
        shape = by_shape.get(p.shape)
        if shape is None:
            d = p.demand
            shape = by_shape[p.shape] = _Shape(p.cls, d.cpu_millis, d.memory_bytes, [], [])
            shapes.append(shape)
        shape.pods.append(p.key)
    for s in shapes:
        fits = [
            t
            for t, c in enumerate(cands)
            if s.cpu <= c.usable.cpu_millis
            and s.mem <= c.usable.memory_bytes
            and sim.admits(s.cls, c) is None
        ]
        # A new node for this shape: cheapest per pod of the shape it holds, then cheapest,
        # then candidate order (pool, zone names). Price per pod exactly, as an int: each
        # price times the common multiple of the counts over its count (Fractions compared
        # in the sort were half of this phase's time).
        holds = {t: _holds(cands[t], s) for t in fits}
        common = math.lcm(*holds.values())
        fits.sort(key=lambda t: (prices[t] * (common // holds[t]), prices[t], t))
        s.types = fits
        if not fits:  # greedy placed it on a priced node, so this is a bug, never bad input
            raise AssertionError(f"pods of shape {s.cpu}m/{s.mem} fit no priced candidate")
    # Largest first (by the share of the largest room each resource takes), pods of one shape
    # next to each other.
    top_cpu = max(c.usable.cpu_millis for c in cands) or 1
    top_mem = max(c.usable.memory_bytes for c in cands) or 1
    order = sorted(
        range(len(shapes)),
        key=lambda k: (-(shapes[k].cpu * top_mem + shapes[k].mem * top_cpu), k),
    )
    items = [k for k in order for _ in shapes[k].pods]
    search = _Search(
        shapes=shapes,
        items=items,
        cands=cands,
        prices=prices,
        caps=caps,
        budget=sim.config.plan_search_steps,
        best=greedy,
    )
    root = search.bound.rest(0, 0, 0)
    if len(items) <= EXACT_PODS:
        search.exact(0, 0)
        is_optimal = not search.is_exhausted
    else:
        search.descend()
        is_optimal = False
    found = search.best_bins
    best = search.best
    if is_optimal:
        lower = Fraction(best, scale)
    else:
        # The root bound, or the cheapest single node any of the pods may use (a plan has one
        # at least), whichever is higher; never above a plan in hand.
        least = min(prices[t] for s in shapes for t in s.types)
        lower = max(Fraction(root * (1 - _SLACK)) / scale, Fraction(least, scale))
        lower = min(lower, Fraction(best, scale))
    greedy_scale_up: list[PlanNodes] = []
    nodes: list[tuple[Candidate, list[str]]] | None = None
    if found is not None:
        greedy_scale_up = [
            PlanNodes(node_pool=c.pool.name, zone=c.zone, increment_by=n)
            for c in sim.candidates
            for n in [greedy_counts.get(c.index, 0)]
            if n
        ]
        nodes = _named_pods(found, shapes, items, cands)
        notes.append(
            f"recommending a plan that costs {_show(greedy - best, scale)} less than greedy's"
            f" ({_show(best, scale)} instead of {_show(greedy, scale)}): see cost"
        )
    cost = PlanCost(
        greedy_price=float(Fraction(greedy, scale)),
        price=float(Fraction(best, scale)),
        greedy_extra_cost=float(Fraction(greedy - best, scale)),
        lower_bound=float(lower),
        is_optimal=is_optimal,
        search_steps=sim.config.plan_search_steps - max(search.steps, 0),
        greedy_scale_up=greedy_scale_up,
    )
    return CostPlan(cost=cost, nodes=nodes)


def _price(c: Candidate) -> Fraction:
    assert c.pool.price is not None  # only priced candidates are searched
    return c.pool.price


def _holds(c: Candidate, s: _Shape) -> int:
    """How many pods of shape ``s`` one empty node of ``c`` holds (at least 1: it fits)."""
    u = c.usable
    return max(
        1,
        min(
            u.cpu_millis // s.cpu if s.cpu else 1 << 62,
            u.memory_bytes // s.mem if s.mem else 1 << 62,
        ),
    )


def _new_nodes_allowed(pool: Pool) -> int:
    """How many nodes the pool may still add (``Simulation.blocked``'s rule, counted)."""
    allowed = pool.max_count - pool.count
    cap = pool.capacity
    if pool.limit_cpu is not None and cap.cpu_millis:
        allowed = min(allowed, pool.limit_cpu // cap.cpu_millis - pool.count)
    if pool.limit_memory is not None and cap.memory_bytes:
        allowed = min(allowed, pool.limit_memory // cap.memory_bytes - pool.count)
    return max(allowed, 0)


def _named_pods(
    found: list[tuple[int, list[int]]],
    shapes: list[_Shape],
    items: list[int],
    cands: list[Candidate],
) -> list[tuple[Candidate, list[str]]]:
    """The plan's nodes in candidate order, each with its pods' names: a shape's pods are
    interchangeable, so they are handed out in scheduling order, node by node."""
    taken = [0] * len(shapes)
    out: list[tuple[Candidate, list[str]]] = []
    for t, held in sorted(found, key=lambda b: b[0]):
        names: list[str] = []
        for i in sorted(held):
            s = items[i]
            names.append(shapes[s].pods[taken[s]])
            taken[s] += 1
        out.append((cands[t], names))
    return out


def _show(cost: int, scale: int) -> str:
    return f"{float(Fraction(cost, scale)):.6g}"
