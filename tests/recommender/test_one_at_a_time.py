"""The grouped greedy rounds against the plain algorithm they stand for, one pod at a time.

``rounds`` and ``Simulation.place_on_existing`` never place pods one by one: pods of one shape
are a group, candidates of one room and feasible groups share a trial, trials are kept until
the winner takes from a group they took from, and at ``summary`` a trial whose pool cannot win
is not filled. ``one_at_a_time`` below is phases 2-5 as the docs state them, with none of that:
every round, every candidate not blocked gets a new node filled first fit with every pod left,
in scheduling order, one pod at a time; the least key wins (the first candidate, in pool then
zone order, among equal keys). Both levels of diagnostics must agree with it on who won each
round, with which pods, what went onto existing nodes, and what was left.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_extender.recommender import (
    DiagnosticsLevel,
    RecommenderConfig,
    Scorer,
    load_snapshot,
    recommend,
)
from scheduler_extender.recommender.model import (
    Pending,
    PreparedSnapshot,
    admission,
    candidates,
)
from scheduler_extender.recommender.recommendation import CandidateOutcome, Recommendation
from scheduler_extender.recommender.scoring import Ranking
from scheduler_extender.recommender.sim import Simulation

from .test_recommender import snapshots

# (winner "pool/zone", new node, its pods); a pass's last round may have no winner.
_Round = tuple[str | None, str | None, list[str]]


def one_at_a_time(
    prepared: PreparedSnapshot, config: RecommenderConfig
) -> tuple[list[_Round], list[tuple[str, str]], list[str]]:
    """Rounds, placements on the snapshot's nodes, and the pods left (in scheduling order)."""
    model = prepared.model
    pool_label = prepared.snapshot.pool_label
    cands = candidates(model, pool_label=pool_label, reserve=config.reserve)
    sim = Simulation(model=model, config=config, candidates=cands, pool_label=pool_label)
    ranking = Ranking(config, model.pools)
    cluster = sim.cluster
    existing = len(model.nodes)
    valid = [p for p in model.pending if p.vm_error is None]
    passes: list[list[Pending]] = []
    if model.has_priority_classes or len({p.priority for p in valid}) > 1:
        for p in valid:
            if not passes or passes[-1][0].priority != p.priority:
                passes.append([])
            passes[-1].append(p)
    elif valid:
        passes.append(valid)
    rounds: list[_Round] = []
    on_existing: list[tuple[str, str]] = []
    left_over: list[Pending] = []
    for pods in passes:
        # Phase 2: first fit by node name over the schedulable nodes and those added so far.
        left: list[Pending] = []
        nodes = sorted(
            [i for i, (n, _) in enumerate(model.nodes) if not n.unschedulable]
            + list(range(existing, len(cluster.names))),
            key=cluster.names.__getitem__,
        )
        for p in pods:
            for i in nodes:
                if (
                    admission(model.classes[p.cls], cluster.hosts[i]) is None
                    and p.demand.cpu_millis <= cluster.free_cpu[i]
                    and p.demand.memory_bytes <= cluster.free_mem[i]
                ):
                    cluster.take(i, p.demand)
                    if i < existing:
                        on_existing.append((p.key, cluster.names[i]))
                    break
            else:
                left.append(p)
        # Phases 3-5, one pod at a time.
        while left:
            best: tuple[Any, int, list[Pending]] | None = None
            for cand in cands:
                if sim.blocked(cand) is not None:
                    continue
                free_cpu, free_mem = cand.usable.cpu_millis, cand.usable.memory_bytes
                trial: list[Pending] = []
                for p in left:
                    if (
                        sim.admits(p.cls, cand) is None
                        and p.demand.cpu_millis <= free_cpu
                        and p.demand.memory_bytes <= free_mem
                    ):
                        trial.append(p)
                        free_cpu -= p.demand.cpu_millis
                        free_mem -= p.demand.memory_bytes
                if not trial:
                    continue
                key, _ = ranking.values(
                    cand.pool,
                    cand.usable.cpu_millis - free_cpu,
                    cand.usable.memory_bytes - free_mem,
                    len(trial),
                )
                if best is None or key < best[0]:
                    best = (key, cand.index, trial)
            if best is None:
                if cands:
                    rounds.append((None, None, []))
                break
            _, index, trial = best
            name = sim.commit(cands[index], trial)
            rounds.append((cands[index].label, name, [p.key for p in trial]))
            taken = {p.order for p in trial}
            left = [p for p in left if p.order not in taken]
        left_over.extend(left)
    invalid = [p for p in model.pending if p.vm_error is not None]
    return (
        rounds,
        on_existing,
        [p.key for p in sorted([*invalid, *left_over], key=lambda p: p.order)],
    )


def _answer(rec: Recommendation, *, full: bool) -> tuple[list[_Round], list[tuple[str, str]]]:
    rounds: list[_Round] = []
    for r in rec.diagnostics.rounds:
        pods: list[str] = []
        if full:
            won = [c for c in r.candidates if c.outcome is CandidateOutcome.WON]
            assert len(won) == (r.winner is not None)
            pods = won[0].pods if won else []
        rounds.append((r.winner, r.new_node, pods))
    return rounds, [(e.pod, e.node) for e in rec.diagnostics.placed_on_existing]


@st.composite
def shared_shapes(draw: st.DrawFn) -> dict[str, Any]:
    """``snapshots()`` with more pending pods, fewer distinct sizes: groups with many members
    interleaved with each other, which is where the grouped rounds take their shortcuts."""
    doc: dict[str, Any] = draw(snapshots())
    pods = doc["pods"]
    template = [p for p in pods if "nodeName" not in p]
    for i in range(draw(st.integers(0, 20)) if template else 0):
        copy = dict(draw(st.sampled_from(template)))
        copy["name"] = copy["uid"] = f"copy{i}"
        pods.append(copy)
    return doc


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=st.one_of(snapshots(), shared_shapes()), chain=st.permutations(list(Scorer)))
def test_grouped_rounds_agree_with_one_pod_at_a_time(
    doc: dict[str, Any], chain: list[Scorer]
) -> None:
    prepared = load_snapshot(msgspec.json.encode(doc))
    answers = {
        level: recommend(
            prepared, config=RecommenderConfig(scorers=tuple(chain), diagnostics=level)
        )
        for level in DiagnosticsLevel
    }
    rounds, on_existing, left = one_at_a_time(prepared, RecommenderConfig(scorers=tuple(chain)))
    full_rounds, full_existing = _answer(answers[DiagnosticsLevel.FULL], full=True)
    assert full_rounds == rounds
    assert full_existing == on_existing
    summary_rounds, summary_existing = _answer(answers[DiagnosticsLevel.SUMMARY], full=False)
    assert summary_rounds == [(w, n, []) for w, n, _ in rounds]
    assert summary_existing == on_existing
    for rec in answers.values():
        assert rec.unscheduled_pods == left
