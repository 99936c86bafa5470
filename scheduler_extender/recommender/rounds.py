"""Phases 3-5 of the recommender: the greedy rounds of one pass.

Pure: no I/O, no clock, no randomness. Each round tries one new node of every candidate (node
pool x zone) against the still-unscheduled pods, in scheduling order, first fit; ranks the
candidates that place something (``scoring``); commits the winner's node and pods to
the virtual cluster (``Simulation.commit``); and records the round, every candidate with its
outcome, score and pods. Rounds repeat until every pod is placed or no candidate places any.

Done naively, every round tries every candidate against every pending pod: rounds x candidates
x pods. What makes it cheap:

* Pods of one shape (the same constraints and size) form a *group*: identical for every fit and
  feasibility question. A trial takes a group's members in order while they fit, and the
  winner takes a trial's pods, so what has been taken of a group is always a prefix of it:
  a ``head`` per group is the whole state of the pass.
* Candidates with the same usable size and feasible groups (a pool's zones, when no pod cares
  about zones) share one *signature*, and so one trial: their simulations are identical.
* A trial is first fit over the groups' members in scheduling order, on a node whose room
  only shrinks; so the next pod placed is always the earliest one among the groups that still
  fit. The live groups are kept ordered by their head, so a trial scans them once (groups it
  has started are merged back in through a small heap), stops as soon as the room is below the
  smallest feasible size, and costs O(groups + pods placed x log pods placed).
* Signatures with the same room (a pool's zones) form a *family*, filled together: their
  trials agree until a fitting group is feasible for only some of them, where the fill
  branches. Sibling zones mostly end up sharing one trial.
* A trial stays valid until the winner takes a pod from a group the trial took from (it would
  be that group's head, which the trial placed). Removing pods a trial skipped cannot change a
  first fit that skipped them. Each group knows the trials that took from it, and only the
  candidates of dropped trials are ranked and recorded again.
* A block (pool at its maximum or limit) changes only when its pool wins, and never lifts.
  What a round records of a candidate (``CandidateTrial``) is rebuilt only when its trial,
  block or reason changed; a loser's reason changes only with the winner or the best key.
* Keys are exact integers (``scoring.Ranking``) memoised per (pool, requested,
  pods), so ranking a round compares ints, not Fractions.

What is left is inherent to the answer: every round records every candidate with its pods,
and the winner's pods are usually the first ones every other trial took, so about half the
trials change each round. Resuming a trial from its first taken pod was measured: that pod
is the trial's first in 3 cases out of 4, so it would save little.

Placing a group's members in bulk (as many as fit, in one division) is exact only for members
that are consecutive in scheduling order, where nothing of another group can come between
them; grouping further (a group's members placed together ahead of the pods between them)
would change first fit's answer. In the benchmark's order same-shape pods come in runs of 1.06
(``bench_recommender.py --controllers`` hands the creation times out template by template:
runs of 8), and a trial's cost is mostly its scan of the live groups and the round's
bookkeeping, not its pods: 644 trials placing 2,509 pods in 139 rounds (priority chain at
summary). ``tests/recommender/test_one_at_a_time.py`` checks all of the above against the
plain algorithm, one pod at a time.

At ``DiagnosticsLevel.SUMMARY`` nothing of that record is built: no ``CandidateTrial``, no
losers' reasons, no trial's list of pod names; a round is one ``Round`` line. Nor is a trial
filled when the priority of its candidates' pools is below that of a candidate already placing
pods: it could not win (``run_rounds`` fills it again when it can). The ranking, the winners
and so everything else in the answer are the same, as the same code decides them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from heapq import heappop, heappush
from itertools import pairwise
from typing import Final, cast

from msgspec.structs import replace

from scheduler_extender.core.podinfo import Demand
from scheduler_extender.recommender.config import DiagnosticsLevel
from scheduler_extender.recommender.model import Candidate, Pending
from scheduler_extender.recommender.recommendation import (
    CandidateOutcome,
    CandidateTrial,
    Round,
    Score,
)
from scheduler_extender.recommender.scoring import Ranking
from scheduler_extender.recommender.sim import Simulation

__all__ = ["run_rounds"]

_NOTHING_FITS = "no unscheduled pod fits"
_WON: Final = CandidateOutcome.WON
_LOST: Final = CandidateOutcome.LOST
_BEST = "best of the chain"
_NEVER = 1 << 62  # after every pod position
# A key after every chain key: the candidate is blocked or places nothing.
_OUT: Final[tuple[float]] = (math.inf,)
# A record not written yet (only ever seen before a candidate's first ranking).
_PENDING: Final = CandidateTrial(
    node_pool="", zone="", instance_type="", outcome=CandidateOutcome.LOST, reason=""
)
# A trial's pod names when the rounds are not recorded (never read then).
_UNNAMED: Final[list[str]] = []


class _Trial:
    """One new node's simulated contents, shared by the signatures it was filled for."""

    __slots__ = ("cpu", "groups", "keys", "mem", "placed", "sigs")

    def __init__(
        self,
        placed: list[int],
        keys: list[str],
        groups: list[int],
        sigs: list[int],
        *,
        cpu: int,
        mem: int,
    ) -> None:
        self.placed = placed  # pass-local pod indices, in placement order
        self.keys = keys  # the placed pods' names, for the rounds' records (or _UNNAMED)
        self.groups = groups  # the groups it took from
        self.sigs = sigs  # the signatures it is the trial of, while valid (never changed)
        self.cpu = cpu  # what the placed pods request
        self.mem = mem


class _Pass:
    """The pods of one pass, grouped, and every signature's current trial."""

    def __init__(self, sim: Simulation, pods: list[Pending], *, is_recorded: bool) -> None:
        # The pods' names, when the trials must name the pods they place.
        self.keys = [p.key for p in pods] if is_recorded else None
        by_shape: dict[int, int] = {}
        self.members: list[list[int]] = []  # group -> its pods, in scheduling order
        self.group_of: list[int] = []  # pod -> group
        cls: list[int] = []
        cpu: list[int] = []
        mem: list[int] = []
        for i, p in enumerate(pods):
            n = by_shape.get(p.shape)
            if n is None:
                n = by_shape[p.shape] = len(self.members)
                self.members.append([])
                cls.append(p.cls)
                cpu.append(p.demand.cpu_millis)
                mem.append(p.demand.memory_bytes)
            self.members[n].append(i)
            self.group_of.append(n)
        # Per pod: its size, and the next member of its group (``_NEVER`` after the last), so
        # that a trial's heap of started groups holds bare pod indices.
        self.pod_cpu = [cpu[g] for g in self.group_of]
        self.pod_mem = [mem[g] for g in self.group_of]
        self.next_pod = [_NEVER] * len(pods)
        for group in self.members:
            for a, b in pairwise(group):
                self.next_pod[a] = b
        self.cpu, self.mem = cpu, mem
        groups = len(self.members)
        self.head = [0] * groups
        # Groups with members left, ordered by their head pod (pods are in scheduling order),
        # and those head pods.
        self.live = sorted(range(groups), key=lambda g: self.members[g][0])
        self.live_pods = [self.members[g][0] for g in self.live]
        # Per group: the trials that took from it, while they may be valid.
        self.watchers: list[list[_Trial]] = [[] for _ in range(groups)]

        sigs: dict[tuple[Demand, int], int] = {}
        # Signatures with the same room form a *family* (a pool's zones, typically): their
        # trials agree until one meets a group that fits and only some of them may take, so
        # a family is filled together and splits only there (``refill``). Bit i of a family's
        # masks is its i-th signature.
        families: dict[Demand, int] = {}
        self.family_sigs: list[list[int]] = []
        self.family_masks: list[list[int]] = []  # family -> group -> who may take it
        self.family_of: list[tuple[int, int]] = []  # signature -> (family, its bit)
        # Per signature: the smallest cpu and memory among its feasible groups (a room below
        # either takes nothing more).
        self.least: list[tuple[int, int]] = []
        self.sig_of: list[int] = []  # candidate index -> signature
        # Bit masks over the groups: of each class, and of those that fit each room.
        of_class: dict[int, int] = {}
        for n, c in enumerate(cls):
            of_class[c] = of_class.get(c, 0) | 1 << n
        fitting: dict[Demand, int] = {}
        for cand in sim.candidates:
            u = cand.usable
            fits = fitting.get(u)
            if fits is None:
                fits = fitting[u] = sum(
                    1 << n
                    for n in range(groups)
                    if cpu[n] <= u.cpu_millis and mem[n] <= u.memory_bytes
                )
            admitted = 0
            for c, of in of_class.items():
                if sim.admits(c, cand) is None:
                    admitted |= of
            feasible_mask = fits & admitted
            sig = sigs.get((u, feasible_mask))
            if sig is not None:
                self.sig_of.append(sig)
                continue
            feasible = [n for n in range(groups) if feasible_mask >> n & 1]
            sig = sigs[(u, feasible_mask)] = len(self.least)
            self.least.append(
                (
                    min((cpu[n] for n in feasible), default=_NEVER),
                    min((mem[n] for n in feasible), default=_NEVER),
                )
            )
            family = families.get(u)
            if family is None:
                family = families[u] = len(self.family_sigs)
                self.family_sigs.append([])
                self.family_masks.append([0] * groups)
            bit = 1 << len(self.family_sigs[family])
            self.family_sigs[family].append(sig)
            masks = self.family_masks[family]
            for n in feasible:
                masks[n] |= bit
            self.family_of.append((family, bit))
            self.sig_of.append(sig)
        self.rooms = list(families)
        self.family_branches: list[dict[int, tuple[int, int, list[int]]]] = [{} for _ in families]
        self.trials: list[_Trial | None] = [None] * len(self.least)

    def _branch(self, family: int, mask: int) -> tuple[int, int, list[int]]:
        """The smallest cpu and memory any signature in ``mask`` may take, and those
        signatures."""
        memo = self.family_branches[family]
        found = memo.get(mask)
        if found is None:
            least_cpu = least_mem = _NEVER
            sigs: list[int] = []
            for bit, s in enumerate(self.family_sigs[family]):
                if mask >> bit & 1:
                    c, m = self.least[s]
                    least_cpu, least_mem = min(least_cpu, c), min(least_mem, m)
                    sigs.append(s)
            found = memo[mask] = (least_cpu, least_mem, sigs)
        return found

    def refill(self, sigs: list[int]) -> None:
        """Fill the trials of ``sigs`` (all dropped): first fit of the pass's remaining pods
        onto one new node, each family's signatures at once (see ``_Pass``); each trial knows
        the signatures it is for, and the groups it took from know it."""
        masks: dict[int, int] = {}
        family_of = self.family_of
        for sig in sigs:
            family, bit = family_of[sig]
            masks[family] = masks.get(family, 0) | bit
        trials, watchers = self.trials, self.watchers
        cpu, mem, live, live_pods = self.cpu, self.mem, self.live, self.live_pods
        pod_cpu, pod_mem, next_pod = self.pod_cpu, self.pod_mem, self.next_pod
        end = len(live)
        keys = self.keys
        rooms, family_masks, family_branches = self.rooms, self.family_masks, self.family_branches
        # Branches still to run: (family, mask, free cpu, free memory, placed, groups, started,
        # scan); one per family to begin with.
        todo: list[tuple[int, int, int, int, list[int], list[int], list[int], int]] = []
        for family, mask in masks.items():
            room = rooms[family]
            todo.append((family, mask, room.cpu_millis, room.memory_bytes, [], [], [], 0))
        while todo:
            family, mask, free_cpu, free_mem, placed, groups, started, scan = todo.pop()
            may_take, branches = family_masks[family], family_branches[family]
            found = branches.get(mask) or self._branch(family, mask)
            least_cpu, least_mem = found[0], found[1]
            # ``started``: a heap of the next pod of each group taken from.
            # ``ahead``: the earliest group not yet started that fits. The live groups are in
            # head order, and ``live[:scan]`` have been passed: those never fit again, as room
            # only shrinks.
            while free_cpu >= least_cpu and free_mem >= least_mem:
                ahead = -1
                while scan < end:
                    g = live[scan]
                    scan += 1
                    takers = may_take[g] & mask
                    if takers and cpu[g] <= free_cpu and mem[g] <= free_mem:
                        if takers != mask:
                            # The others pass this group by: a branch of their own.
                            todo.append(
                                (
                                    family,
                                    mask & ~takers,
                                    free_cpu,
                                    free_mem,
                                    placed.copy(),
                                    groups.copy(),
                                    started.copy(),
                                    scan,
                                )
                            )
                            mask = takers
                            found = branches.get(mask) or self._branch(family, mask)
                            least_cpu, least_mem = found[0], found[1]
                        ahead = g
                        break
                # The started groups' pods before ``ahead``'s head (all of them, if none).
                ahead_pod = live_pods[scan - 1] if ahead >= 0 else _NEVER
                while started and started[0] < ahead_pod:
                    pod = heappop(started)
                    c, m = pod_cpu[pod], pod_mem[pod]
                    if c > free_cpu or m > free_mem:
                        continue  # and never again: room only shrinks
                    placed.append(pod)
                    free_cpu -= c
                    free_mem -= m
                    if free_cpu < least_cpu or free_mem < least_mem:
                        break
                    pod = next_pod[pod]
                    if pod != _NEVER:
                        heappush(started, pod)
                if ahead < 0 or free_cpu < least_cpu or free_mem < least_mem:
                    break
                c, m = cpu[ahead], mem[ahead]
                if c > free_cpu or m > free_mem:
                    continue  # it no longer fits: look further
                placed.append(ahead_pod)
                groups.append(ahead)
                free_cpu -= c
                free_mem -= m
                pod = next_pod[ahead_pod]
                if pod != _NEVER:
                    heappush(started, pod)
            room = rooms[family]
            t = _Trial(
                placed,
                list(map(keys.__getitem__, placed)) if keys is not None else _UNNAMED,
                groups,
                branches[mask][2],
                cpu=room.cpu_millis - free_cpu,
                mem=room.memory_bytes - free_mem,
            )
            for sig in t.sigs:
                trials[sig] = t
            for g in groups:
                watchers[g].append(t)

    def taken(self, won: _Trial) -> list[int]:
        """The winner's pods are placed: advance their groups and drop the trials that took
        from them; returns the signatures whose trial was dropped."""
        members, head, live, trials, group_of = (
            self.members,
            self.head,
            self.live,
            self.trials,
            self.group_of,
        )
        live_pods = self.live_pods
        dropped: list[int] = []
        for g in won.groups:
            for t in self.watchers[g]:
                for sig in t.sigs:
                    if trials[sig] is t:
                        trials[sig] = None
                        dropped.append(sig)
            self.watchers[g] = []
            at = live.index(g)
            del live[at], live_pods[at]
        for pod in won.placed:
            head[group_of[pod]] += 1
        for g in won.groups:
            if head[g] < len(members[g]):
                pod = members[g][head[g]]
                at = bisect_left(live_pods, pod)
                live.insert(at, g)
                live_pods.insert(at, pod)
        return dropped


def run_rounds(
    sim: Simulation, ranking: Ranking, pods: list[Pending], pass_priority: int | None
) -> list[Pending]:
    """Phases 3-5 for one pass; returns the pods no candidate could place."""
    # At SUMMARY no candidate's record is built: every use of ``records`` and ``nothing`` below
    # is behind ``is_recorded``, and they stay empty.
    is_recorded = sim.config.diagnostics is DiagnosticsLevel.FULL
    state = _Pass(sim, pods, is_recorded=is_recorded)
    trials = state.trials
    cands = sim.candidates
    count = len(cands)
    sig_of = state.sig_of
    pools = [c.pool for c in cands]
    by_pool: dict[int, list[int]] = {}  # pool index -> its candidates
    for cand in cands:
        by_pool.setdefault(cand.pool.index, []).append(cand.index)
    # Per candidate, as of the last round: its trial (None: blocked, or places nothing), the
    # chain's key (``_OUT`` ranks after every key), the score shown, and what it recorded.
    trial_of: list[_Trial | None] = [None] * count
    keys: list[tuple[float, ...]] = [_OUT] * count
    shown: list[Score | None] = [None] * count
    records: list[CandidateTrial] = [_PENDING] * count if is_recorded else []
    nothing = (
        [_record(c, CandidateOutcome.PLACES_NOTHING, _NOTHING_FITS) for c in cands]
        if is_recorded
        else []
    )
    # Signature -> its candidates that are not blocked. A block never lifts: the pool's node
    # count only grows, and a blocked pool never wins.
    open_cands: list[list[int]] = [[] for _ in state.least]
    for cand in cands:
        block = sim.blocked(cand)
        if block is None:
            open_cands[sig_of[cand.index]].append(cand.index)
        elif is_recorded:
            records[cand.index] = _record(cand, *block)
    texts: dict[int, list[str]] = {}  # winner -> the losers' reason, per link
    links = ranking.links
    values = ranking.values
    memo = ranking.memo
    pool_of = [p.index for p in pools]
    chain = ranking.pool_link
    winner, best = -1, cast(tuple[float, ...], _OUT)
    # Signatures whose trial was dropped (or never filled) and that still have candidates.
    stale = {sig for sig, open_ in enumerate(open_cands) if open_}
    # At SUMMARY only the winner matters, so a stale trial need not be filled when none of
    # its candidates can rank first. A candidate's *bound* (``Ranking.bound``: its template's
    # key when filled to the room with every pod of the pass) ranks no later than any key it
    # can get, and a pool's priority is exactly known: the signatures are put in tiers of one
    # priority, best first, and a tier whose bound ranks after the best key so far is left
    # stale. Per signature, the lowest bound of its open candidates (a block only raises it,
    # so the first one stays a bound). Only the priority bound is worth it: the others' (the
    # node full) ruled out 34 of 2,282 fills of the benchmark's least-cost chain, for more
    # bookkeeping than it saved. At FULL every trial is recorded, so every stale one is filled.
    sig_bound: dict[int, tuple[float, ...]] = {}
    tiers: list[tuple[tuple[float, ...], list[int]]] = []
    is_lazy = not is_recorded and ranking.exact_links > 0
    if is_lazy:
        for sig in sorted(stale):
            sig_bound[sig] = min(
                ranking.bound(pools[ci], cands[ci].usable, len(pods)) for ci in open_cands[sig]
            )
        exact = ranking.exact_links
        for sig in sorted(stale, key=sig_bound.__getitem__):
            bound = sig_bound[sig]
            if not tiers or tiers[-1][0][:exact] != bound[:exact]:
                tiers.append((bound, []))
            tiers[-1][1].append(sig)
    changed: list[int] = []
    left = len(pods)

    def settle(sigs: list[int]) -> None:
        """Phase 3 for ``sigs``: fill their trials, and key their candidates."""
        state.refill(sigs)
        for sig in sigs:
            t = trials[sig]
            assert t is not None
            if t.placed:
                n = len(t.placed)
                for ci in open_cands[sig]:
                    changed.append(ci)
                    trial_of[ci] = t
                    found = memo.get((pool_of[ci], t.cpu, t.mem, n))
                    if found is None:
                        found = values(pools[ci], t.cpu, t.mem, n)
                    keys[ci], shown[ci] = found
            else:
                for ci in open_cands[sig]:
                    changed.append(ci)
                    trial_of[ci], keys[ci], shown[ci] = None, _OUT, None
                    if is_recorded:
                        records[ci] = nothing[ci]

    while left:
        # Phase 3: the trials that were dropped; the others stand.
        best_before = best
        if not is_lazy:
            settle(sorted(stale))
            stale.clear()
            best = min(keys, default=_OUT)
        elif stale:
            # The best tier with a stale signature that may win first: when it places pods,
            # its best key rules out the tiers below. Then, in one batch, every stale
            # signature whose bound does not rank after the best key so far: the best only
            # improves, so those left out cannot win this round.
            best = min(keys, default=_OUT)
            for lowest, tier in tiers:
                if lowest > best:
                    break
                batch = [sig for sig in tier if sig in stale and sig_bound[sig] <= best]
                if batch:
                    settle(batch)
                    stale.difference_update(batch)
                    best = min(keys, default=_OUT)
                    break
            batch = [sig for sig in stale if sig_bound[sig] <= best]
            if batch:
                settle(batch)
                stale.difference_update(batch)
                best = min(keys, default=_OUT)
        else:
            best = min(keys, default=_OUT)
        # Phase 4: rank (``best`` is the least key, just taken). Candidates come in (pool
        # name, zone name) order, and both ``min`` and ``index`` find the first of equal
        # keys: the names' tie-break.
        last_winner, last_best = winner, best_before
        if best is _OUT:
            if count:
                sim.rounds.append(_round(sim, pass_priority, records, None, None))
            break
        winner = keys.index(best)
        win_cand = cands[winner]
        win_pool = win_cand.pool
        if is_recorded:
            reasons = texts.get(winner)
            if reasons is None:
                reasons = texts[winner] = [f"{win_cand.label} ranks higher on {x}" for x in links]
            # A loser's reason depends on the winner and the best key: when both stand, only the
            # changed candidates need theirs.
            first = best[0] if chain else None
            for ci in changed if winner == last_winner and best is last_best else range(count):
                t = trial_of[ci]
                if t is None:
                    continue
                if ci == winner:
                    records[ci] = replace(
                        nothing[ci], outcome=_WON, reason=_BEST, score=shown[ci], pods=t.keys
                    )
                    continue
                mine = keys[ci]
                # The first link it differs from the best on: mostly the first.
                if chain and mine[0] != first:
                    link = 0
                else:
                    for link in range(1, chain):
                        if mine[link] != best[link]:
                            break
                    else:
                        link = chain if pools[ci] is not win_pool else chain + 1
                reason = reasons[link]
                record = records[ci]
                if record.pods is not t.keys or record.reason is not reason:
                    records[ci] = replace(
                        nothing[ci], outcome=_LOST, reason=reason, score=shown[ci], pods=t.keys
                    )
        # Phase 5: commit the winner.
        won = trial_of[winner]
        assert won is not None
        name = sim.commit(win_cand, [pods[i] for i in won.placed])
        dropped = state.taken(won)
        left -= len(won.placed)
        sim.rounds.append(_round(sim, pass_priority, records.copy(), win_cand, name))
        changed = []
        block = sim.blocked(win_cand)  # the same for every zone of the pool
        if block is not None:
            for ci in by_pool[win_pool.index]:
                sig = sig_of[ci]
                open_cands[sig].remove(ci)
                if not open_cands[sig]:
                    stale.discard(sig)  # nobody left to rank with it
                trial_of[ci], keys[ci], shown[ci] = None, _OUT, None
                if is_recorded:
                    records[ci] = _record(cands[ci], *block)
                changed.append(ci)
        for sig in dropped:
            if open_cands[sig]:
                stale.add(sig)
                if is_lazy:
                    # Unranked until filled again (otherwise it is, before the next ranking).
                    for ci in open_cands[sig]:
                        trial_of[ci], keys[ci] = None, _OUT
    head, members = state.head, state.members
    return [pods[i] for i in sorted(i for g, m in enumerate(members) for i in m[head[g] :])]


def _record(cand: Candidate, outcome: CandidateOutcome, reason: str) -> CandidateTrial:
    """What a round records of a candidate without a trial (blocked, or places nothing);
    the others' records are this with the outcome, reason, score and pods replaced."""
    return CandidateTrial(
        node_pool=cand.pool.name,
        zone=cand.zone,
        instance_type=cand.pool.instance_type,
        outcome=outcome,
        reason=reason,
    )


def _round(
    sim: Simulation,
    pass_priority: int | None,
    records: list[CandidateTrial],
    winner: Candidate | None,
    new_node: str | None,
) -> Round:
    return Round(
        round=len(sim.rounds) + 1,
        pass_priority=pass_priority,
        winner=winner.label if winner is not None else None,
        new_node=new_node,
        candidates=records,
    )
