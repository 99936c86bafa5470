"""Phase 6 of the recommender: is there a cheaper plan than greedy's?

Pure: no I/O, no clock. Greedy picks one node at a time and can miss a cheaper plan (one large
node instead of two small ones). For each pool, pack everything greedy placed on new nodes onto
the fewest nodes of that pool alone (two-dimensional bin packing: first-fit decreasing, then a
bounded exact search) and report it when it costs less. Most pools stop at the volume bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Protocol

from scheduler_extender.core.podinfo import Demand
from scheduler_extender.recommender.config import RecommenderConfig
from scheduler_extender.recommender.model import Candidate, Pending
from scheduler_extender.recommender.recommendation import CheaperPlan
from scheduler_extender.recommender.scoring import price_of

__all__ = ["PlanInput", "cheaper_plans"]


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


def cheaper_plans(sim: PlanInput, notes: list[str]) -> tuple[float | None, list[CheaperPlan]]:
    """Greedy's total price and the single-pool plans that cost less, cheapest first."""
    if not sim.new_nodes:
        return None, []
    unpriced = sorted({c.pool.name for c, _ in sim.new_nodes.values() if c.pool.price is None})
    if unpriced:
        notes.append(f"cheaper-plan check skipped: pools without a price: {', '.join(unpriced)}")
        return None, []
    # Per pool, then priced: one Fraction product per pool, not one sum per new node.
    added: dict[int, tuple[Candidate, int]] = {}
    for c, _ in sim.new_nodes.values():
        so_far = added.get(c.pool.index)
        added[c.pool.index] = (c, 1 if so_far is None else so_far[1] + 1)
    greedy = sum((price_of(c.pool) * n for c, n in added.values()), Fraction(0))
    plans: list[CheaperPlan] = []
    by_pool: dict[str, list[Candidate]] = {}
    for c in sim.candidates:
        by_pool.setdefault(c.pool.name, []).append(c)
    # The pods by shape (interchangeable for fit and feasibility), with how many of each.
    shapes: dict[int, tuple[int, Demand, int]] = {}
    for p in sim.greedy_pods:
        found = shapes.get(p.shape)
        shapes[p.shape] = (p.cls, p.demand, 1 if found is None else found[2] + 1)
    for pool_name, cands in by_pool.items():
        pool = cands[0].pool
        if pool.price is None:
            continue
        packed = _pack_on_pool(sim, cands, list(shapes.values()), price=pool.price, greedy=greedy)
        if packed is None:
            continue
        zones, count, proven = packed
        total = count * pool.price
        # The pool's own bounds apply to the alternative too.
        after = pool.count + count
        if after > pool.max_count:
            continue
        if pool.limit_cpu is not None and after * pool.capacity.cpu_millis > pool.limit_cpu:
            continue
        if pool.limit_memory is not None and after * pool.capacity.memory_bytes > pool.limit_memory:
            continue
        if total < greedy:
            plans.append(
                CheaperPlan(
                    node_pool=pool_name,
                    instance_type=pool.instance_type,
                    node_count=count,
                    zones=zones,
                    total_price=float(total),
                    greedy_price=float(greedy),
                    is_fewest_proven=proven,
                )
            )
    plans.sort(key=lambda p: (p.total_price, p.node_pool))
    return float(greedy), plans


def _pack_on_pool(
    sim: PlanInput,
    cands: list[Candidate],
    shapes: Sequence[tuple[int, Demand, int]],
    *,
    price: Fraction,
    greedy: Fraction,
) -> tuple[dict[str, int], int, bool] | None:
    """The fewest nodes of one pool holding the pods of ``shapes`` (class, size, how many);
    None if some pod cannot go there, or if even the volume bound costs no less than
    ``greedy`` (then no packing can be cheaper, and searching would only burn the budget:
    most pools end here).

    Zones: all in the first zone that admits every pod, else each pod in its first zone.
    """
    usable = cands[0].usable
    feasible: list[list[str]] = []
    for cls, d, _n in shapes:
        if d.cpu_millis > usable.cpu_millis or d.memory_bytes > usable.memory_bytes:
            return None
        zones = [c.zone for c in cands if sim.admits(cls, c) is None]
        if not zones:
            return None
        feasible.append(zones)
    common = [c.zone for c in cands if all(c.zone in z for z in feasible)]
    by_zone: dict[str, list[tuple[Demand, int]]] = {}
    for (_cls, d, n), zones in zip(shapes, feasible, strict=True):
        zone = common[0] if common else zones[0]
        by_zone.setdefault(zone, []).append((d, n))
    bound = sum(_volume_bound(items, usable) for items in by_zone.values())
    if bound * price >= greedy:
        return None
    counts: dict[str, int] = {}
    proven = True
    budget = [sim.config.plan_search_steps]
    for zone in sorted(by_zone):
        # Pods of one size are interchangeable: the packing sees each of them.
        items = [d for d, n in by_zone[zone] for _ in range(n)]
        n, ok = _fewest_bins(items, usable, budget)
        counts[zone] = n
        proven = proven and ok
    return counts, sum(counts.values()), proven


def _fewest_bins(items: list[Demand], cap: Demand, budget: list[int]) -> tuple[int, bool]:
    """Two-dimensional bin packing: first-fit decreasing, then a depth-first search for fewer
    bins down to the volume bound, within ``budget`` steps (shared, decremented)."""
    order = sorted(items, key=lambda d: (d.cpu_millis, d.memory_bytes), reverse=True)
    bins: list[list[int]] = []
    for d in order:
        for b in bins:
            if d.cpu_millis <= b[0] and d.memory_bytes <= b[1]:
                b[0] -= d.cpu_millis
                b[1] -= d.memory_bytes
                break
        else:
            bins.append([cap.cpu_millis - d.cpu_millis, cap.memory_bytes - d.memory_bytes])
    best = len(bins)
    lower = _volume_bound([(d, 1) for d in order], cap)
    proven = True
    for k in range(lower, best):
        found, exhausted = _fits_in(order, cap, k, budget)
        if exhausted:
            proven = False
            break
        if found:
            return k, True
    return best, proven


def _volume_bound(items: Sequence[tuple[Demand, int]], cap: Demand) -> int:
    """No packing uses fewer bins than the total size over one bin's size, per resource.
    ``items``: sizes with how many of each."""
    total_cpu = sum(d.cpu_millis * n for d, n in items)
    total_mem = sum(d.memory_bytes * n for d, n in items)
    return max(
        -(-total_cpu // cap.cpu_millis) if cap.cpu_millis else 0,
        -(-total_mem // cap.memory_bytes) if cap.memory_bytes else 0,
        1 if items else 0,
    )


def _fits_in(order: list[Demand], cap: Demand, k: int, budget: list[int]) -> tuple[bool, bool]:
    free = [[cap.cpu_millis, cap.memory_bytes] for _ in range(k)]

    def place(i: int) -> bool | None:
        if i == len(order):
            return True
        d = order[i]
        tried_empty = False
        for b in free:
            if d.cpu_millis > b[0] or d.memory_bytes > b[1]:
                continue
            is_empty = b[0] == cap.cpu_millis and b[1] == cap.memory_bytes
            if is_empty:
                if tried_empty:  # empty bins are interchangeable
                    continue
                tried_empty = True
            budget[0] -= 1
            if budget[0] < 0:
                return None
            b[0] -= d.cpu_millis
            b[1] -= d.memory_bytes
            result = place(i + 1)
            b[0] += d.cpu_millis
            b[1] += d.memory_bytes
            if result is None or result:
                return result
        return False

    result = place(0)
    return bool(result), result is None
