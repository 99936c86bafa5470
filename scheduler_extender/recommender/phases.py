"""The recommender's phases in order: which nodes to add so that pending pods can run.

Pure: no I/O, no clock, no randomness, no globals. The same snapshot and config give the same
``Recommendation``, and ``encode_recommendation`` turns it into the same bytes. Timing is the
caller's business (``run_time_millis`` is passed in, not measured here), because a clock inside
would make two runs differ.

It follows the "ScaleSim" design, in memory instead of against a real scheduler (that design
waits 10 s of wall time per zone simulation; this answers in milliseconds), in numbered phases
like kueue's scheduling cycle:

0. **Plan for growth** (``growth_headroom`` above 0): pending VMs at their grown size, and
   running VMs that their node cannot give room to grow added as pods to place (``growth``).
1. **Snapshot.** Validate the ``ClusterSnapshot`` (every error with its ``$.path``) and compile
   it (``model``; done once by ``load_snapshot``, whose ``PreparedSnapshot`` any number
   of calls reuse). The simulation works on its own copy of the nodes' free room; the live
   ledger is never touched (``snapshot_from_ledger`` only reads it).
2. **Existing nodes.** Pending pods, highest priority first, then oldest, then name, go onto
   existing nodes when they fit (first fit by node name, with the extender's fit rule).
   Such a pod needs no new node.
3. **Simulate.** For every eligible candidate (node pool x zone, one new node of the pool's
   template), place the still-unscheduled pods on it in the same order, first fit.
4. **Rank.** Score the candidates with the configured chain of scorers; ties fall through to
   the next link and finally to (pool, zone) names. Never random.
5. **Commit.** Add the winner's node and pods to the virtual cluster; go back to 3 until nothing
   is left or no candidate places anything. 2-5 run once per priority value, highest first
   (from the pod's class or its own ``priority``), so high-priority pods choose the node
   shapes and are never left out for lower ones.
6. **Cost.** Greedy picks one node at a time and can miss a cheaper plan (one large node
   instead of two small ones, or a mix of pools). ``plan`` searches for the cheapest set of
   new nodes, any priced pools and zones, holding every pod greedy put on a new node (branch
   and bound within a step budget, with a lower bound), and reports greedy's extra cost.
7. **Recommend.** The cheaper plan when phase 6 found one, else greedy's: group the new nodes
   by pool and zone; explain every pod left unscheduled.

The answer (``recommendation`` draws it) carries diagnostics: each round, what went onto
existing nodes, each new node's pods, why each pod is left, and the cost report. By default
(``DiagnosticsLevel.SUMMARY``) a round is one line and the candidates' records are never
built in phases 3-5 (most of the answer, and of its time, on a large snapshot);
``DiagnosticsLevel.FULL`` adds every candidate of every round with its score and the pods it
would place. Everything else is the same bytes at both levels.

Decisions are an enum plus a reason a human can read (``CandidateOutcome``, ``UnscheduledReason``).

Modules of the package, one phase or concern each (all pure):

* ``snapshot``: the wire types and decoding;
* ``model``: phase 1, the cross-field checks and the compiled model;
* ``sim``: the virtual cluster, phase 2 and committing a new node;
* ``rounds``: phases 3-5, the greedy rounds (and what makes them cheap);
* ``scoring``: phase 4's scorer chain;  ``plan``: phase 6, the cost plan;
* ``explain``: phase 7's reasons for the pods left unscheduled;
* ``phases`` (this module): the phases in order, and the answer;
* ``recommendation``: the answer and its encoding;  ``live``: a snapshot of the ledger;
* ``capacity_waits``: who has waited for room too long (the trigger of auto-publish).

The package re-exports the public names callers need, so ``from
scheduler_extender.recommender import ...`` is the one import they use.
"""

from __future__ import annotations

from scheduler_extender.recommender.config import RecommenderConfig, Scorer
from scheduler_extender.recommender.explain import explain
from scheduler_extender.recommender.growth import Mover, plan_growth
from scheduler_extender.recommender.model import (
    Candidate,
    Pending,
    PreparedSnapshot,
    candidates,
    prepare_snapshot,
)
from scheduler_extender.recommender.plan import cost_plan
from scheduler_extender.recommender.recommendation import (
    Diagnostics,
    GrowthMove,
    Recommendation,
    ScaleUp,
)
from scheduler_extender.recommender.rounds import run_rounds
from scheduler_extender.recommender.scoring import Ranking
from scheduler_extender.recommender.sim import Simulation
from scheduler_extender.recommender.snapshot import (
    ClusterSnapshot,
    FieldError,
    SnapshotError,
)

__all__ = ["recommend"]


def recommend(
    snapshot: ClusterSnapshot | PreparedSnapshot, *, config: RecommenderConfig
) -> Recommendation:
    """Which nodes to add for the snapshot's pending pods. Pure; see the module docstring.

    A ``PreparedSnapshot`` (from ``load_snapshot``) is not checked or compiled again when it
    was prepared for ``config.scheduler_name``. Raises ``SnapshotError`` (400) for an
    inconsistent snapshot, or when the ``least-cost`` scorer is configured and a pool has no
    price.
    """
    # Phase 1: snapshot.
    if isinstance(snapshot, PreparedSnapshot):
        prepared = snapshot
        if prepared.scheduler_name != config.scheduler_name:
            prepared = prepare_snapshot(prepared.snapshot, scheduler_name=config.scheduler_name)
    else:
        prepared = prepare_snapshot(snapshot, scheduler_name=config.scheduler_name)
    model = prepared.model
    movers: list[Mover] = []
    if config.growth_headroom > 0:
        model, movers = plan_growth(prepared, config)
    if Scorer.LEAST_COST in config.scorers:
        missing = [
            FieldError(
                path=f"$.nodePools[{p.index}].price", message="the least-cost scorer needs it"
            )
            for p in model.pools
            if p.price is None
        ]
        if missing:
            raise SnapshotError(missing)
    pool_label = prepared.snapshot.pool_label
    cands = candidates(model, pool_label=pool_label, reserve=config.reserve)
    sim = Simulation(model=model, config=config, candidates=cands, pool_label=pool_label)
    ranking = Ranking(config, model.pools)

    # Passes: one per priority value, highest first, whether the priority comes from a class
    # or from the pod's own ``priority``. Only when there are no classes and every pod has one
    # priority is there a single pass without a priority (``Round.pass_priority`` None).
    unscheduled: list[Pending] = []
    invalid: list[Pending] = [p for p in model.pending if p.vm_error is not None]
    valid = [p for p in model.pending if p.vm_error is None]
    passes: list[tuple[int | None, list[Pending]]] = []
    if model.has_priority_classes or len({p.priority for p in valid}) > 1:
        for p in valid:
            if not passes or passes[-1][0] != p.priority:
                passes.append((p.priority, []))
            passes[-1][1].append(p)
    elif valid:
        passes.append((None, valid))
    for pass_priority, pods in passes:
        # Phase 2: existing nodes (including those added by earlier passes).
        left = sim.place_on_existing(pods)
        # Phases 3-5.
        unscheduled.extend(run_rounds(sim, ranking, left, pass_priority))

    # Phase 6: the cheapest plan placing what greedy placed.
    notes: list[str] = []
    plan = cost_plan(sim, notes)

    # Phase 7: recommend.
    if plan is not None and plan.nodes is not None:
        new_nodes = _plan_names(plan.nodes, taken={host.name for _, host in model.nodes})
    else:
        new_nodes = {name: (cand, pods) for name, (cand, pods) in sim.new_nodes.items()}
    groups: dict[str, list[str]] = {}
    for name, (cand, _pods) in new_nodes.items():
        groups.setdefault(cand.label, []).append(name)
    by_label = {c.label: c for c in cands}
    scale_up = [
        ScaleUp(
            node_pool=by_label[label].pool.name,
            zone=by_label[label].zone,
            instance_type=by_label[label].pool.instance_type,
            increment_by=len(names),
            node_names=names,
        )
        for label, names in sorted(groups.items())
    ]
    # Movers are running VMs: where the plan puts them is ``growth``, never "unscheduled".
    moving = {m.uid for m in movers}
    left_over = sorted(
        (p for p in [*invalid, *unscheduled] if p.uid not in moving), key=lambda p: p.order
    )
    growth = _growth_moves(movers, sim, new_nodes)
    explained = [explain(sim, p) for p in left_over]
    return Recommendation(
        scale_up=scale_up,
        unscheduled_pods=[p.key for p in left_over],
        diagnostics=Diagnostics(
            rounds=sim.rounds,
            placed_on_existing=sim.placed_on_existing,
            new_nodes={name: pods for name, (_c, pods) in new_nodes.items()},
            unscheduled=explained,
            cost=plan.cost if plan is not None else None,
            growth=growth,
            notes=notes,
        ),
    )


def _plan_names(
    nodes: list[tuple[Candidate, list[str]]], *, taken: set[str]
) -> dict[str, tuple[Candidate, list[str]]]:
    """Names for the cost plan's nodes, as ``Simulation.commit`` names greedy's: numbered per
    pool and zone, an ``x`` added while a real node has the name."""
    named: dict[str, tuple[Candidate, list[str]]] = {}
    counts: dict[str, int] = {}
    for cand, pods in nodes:
        n = counts[cand.label] = counts.get(cand.label, 0) + 1
        name = f"{cand.pool.name}-{cand.zone}-new-{n}"
        while name in taken:
            name += "x"
        named[name] = (cand, pods)
    return named


def _growth_moves(
    movers: list[Mover], sim: Simulation, new_nodes: dict[str, tuple[Candidate, list[str]]]
) -> list[GrowthMove]:
    """Where the plan put each mover: an existing node with room, a new node, or nowhere."""
    if not movers:
        return []
    placed = {e.pod: e.node for e in sim.placed_on_existing}
    for name, (_cand, pods) in new_nodes.items():
        for key in pods:
            placed[key] = name
    return [
        GrowthMove(
            pod=m.key,
            node=m.node,
            cpu_millis=m.grown.cpu_millis,
            memory_bytes=m.grown.memory_bytes,
            to_node=placed.get(m.key),
        )
        for m in movers
    ]
