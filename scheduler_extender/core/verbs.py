"""kube-scheduler's extender verbs, decided: filter, prioritize, bind, preempt.

Pure: no I/O, no clock, no HTTP. One function per verb, called by the server (the handlers
of ``http/verbs.py``; bind through ``Extender.bind``) and by the simulator
(``simulator.scheduling``) alike, so that a rule changed here changes both;
``tests/extender/test_same_answers_as_simulator.py`` feeds both the same inputs and compares
the answers. The permit batch, the fifth verb, is ``core.batches`` (``admit``, then
``decide``). The shells keep what is theirs: decoding and encoding, the answer caches,
parking, the capacity waits, the Binding's POST and its undo.

Admission is the admission queue's (a layer above this one): the callers pass its decision
for filter, and for bind a function that asks it (bind asks again right before reserving: an
admission can expire between filter and bind).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Final, NamedTuple, Protocol

from scheduler_extender.core.ledger import AllocEvent, Ledger, LedgerError
from scheduler_extender.core.placement import (
    FilterResult,
    FitIndex,
    ScoreIndex,
    Strategy,
    VictimChoice,
    choose_victims,
    reject_all,
)
from scheduler_extender.core.podinfo import PodInfo

# FilterResult: filter's answer, which the HTTP handler encodes.
__all__ = [
    "Admission",
    "BindDecision",
    "BindOutcome",
    "FilterResult",
    "Filtered",
    "bind_pod",
    "filter_pod",
    "growth_millis",
    "preempt",
    "prioritize",
]

CPU_MILLIS_PER_VCPU: Final = 1000


class Admission(Protocol):
    """What filter and bind read of the admission queue's decision."""

    @property
    def is_admitted(self) -> bool: ...

    @property
    def reason(self) -> str: ...


class Filtered(NamedTuple):
    """Filter's answer for one pod: which nodes pass, which fail and why, in words for the log."""

    result: FilterResult
    reason: str
    # Some node passed, or the pod waits for quota (more nodes would not help it): the
    # recommender's capacity-wait tracking and the parking read it.
    has_room: bool


def filter_pod(
    index: FitIndex, info: PodInfo, names: list[str], admission: Admission | None
) -> Filtered:
    """Which of ``names`` may take ``info``. ``admission``: the queue's decision for a valid pod
    (None for an invalid one, which is never queued).

    A pod that waits for its namespace's quota fails on every node (resolvable: it will fit
    once admitted) with the queue's reason; an invalid VM pod fails everywhere, unresolvably;
    otherwise the ledger's fit of its initial size decides, node by node.
    """
    if admission is not None and not admission.is_admitted:
        return Filtered(
            FilterResult([], dict.fromkeys(names, admission.reason), {}),
            admission.reason,
            has_room=True,
        )
    if info.vm_error is not None:
        result = reject_all(names, f"VM pod {info.key} is invalid: {info.vm_error}")
        reason = f"0 of {len(names)} nodes fit ({info.vm_error})"
        return Filtered(result, reason, has_room=False)
    result = index.filter(info.initial_demand(), names)
    return Filtered(
        result, f"{len(result.passed)} of {len(names)} nodes fit", has_room=bool(result.passed)
    )


def growth_millis(info: PodInfo) -> int:
    """How far a VM may grow from its initial size, in millicores (0 for other pods): what
    prioritize's headroom term weighs (``placement.score``)."""
    if info.vm is None:
        return 0
    return max(0, info.vm.top_vcpus * CPU_MILLIS_PER_VCPU - info.initial_demand().cpu_millis)


def prioritize(
    scores: ScoreIndex, info: PodInfo, names: Sequence[str], strategy: Strategy
) -> list[tuple[str, int]]:
    """Each node's score for ``info``, 0..10, in the order given (an invalid pod scores 0)."""
    if info.vm_error is not None:
        return [(name, 0) for name in names]
    return scores.scores(
        names, info.initial_demand(), growth_millis=growth_millis(info), strategy=strategy
    )


def preempt(
    ledger: Ledger, info: PodInfo, proposed: Mapping[str, tuple[Sequence[str], int]]
) -> dict[str, VictimChoice]:
    """kube-scheduler's proposed victims (node -> (victim uids, PDB violations)), filtered:
    the nodes kept, each with its victims (``placement.choose_victims``); the others dropped."""
    size = info.initial_demand()
    kept: dict[str, VictimChoice] = {}
    for node, (uids, pdb) in proposed.items():
        choice = choose_victims(ledger, node, size, uids, pdb)
        if choice.victims is not None:
            kept[node] = choice
    return kept


class BindOutcome(enum.Enum):
    RESERVED = "reserved"  # reserved now: the shell posts the Binding (and undoes on failure)
    DONE = "done"  # nothing to do: held there already (a retry, or the watch was faster)
    BUSY = "busy"  # the first attempt's Binding is still on its way
    REFUSED = "refused"


class BindDecision(NamedTuple):
    outcome: BindOutcome
    error: str  # "" or what kube-scheduler is told
    info: PodInfo | None = None  # RESERVED: the version reserved for (the Binding's precondition)
    event: AllocEvent | None = None  # RESERVED: the reservation, for the node's report
    # RESERVED with the version filter saw: the pod watch had not delivered the pod yet.
    is_before_watch: bool = False

    @property
    def is_reserved(self) -> bool:
        return self.outcome is BindOutcome.RESERVED


def bind_pod(
    ledger: Ledger,
    *,
    key: str,
    uid: str,
    node: str,
    known: PodInfo | None,
    filtered: PodInfo | None,
    is_in_flight: bool,
    admit: Callable[[PodInfo], Admission],
    at: float,
) -> BindDecision:
    """May pod ``key`` (``uid``) be bound to ``node`` now? Reserves it in the ledger if so.

    ``known``: the pod as the extender's pod watch last saw it waiting for a node (by key);
    ``filtered``: as kube-scheduler last sent it to filter. kube-scheduler binds within
    milliseconds of a pod's creation, often before the watch delivers it; that version is then
    what to reserve for (the Binding's UID precondition still guards a pod deleted meanwhile,
    and the watch confirms or corrects the hold when it catches up). ``is_in_flight``: a
    Binding for this uid is on its way. ``admit`` asks the admission queue again: the
    admission may have expired since filter (TTL), or the pod grew; placing it anyway would
    take quota nobody reserved for it. Then the ledger checks the fit again (another pod may
    have been bound since filter).
    """
    held = ledger.pods.get(uid)
    info = known
    is_before_watch = False
    if (
        held is None
        and (info is None or info.uid != uid)
        and filtered is not None
        and filtered.uid == uid
        and filtered.key == key
        and filtered.is_ours
        and filtered.node_name is None
        and not filtered.is_terminated
    ):
        info, is_before_watch = filtered, True
    if held is None and (info is None or info.uid != uid):
        return BindDecision(
            BindOutcome.REFUSED,
            f"pod {key} (uid {uid}) is not known to the extender yet: its pod watch has not"
            " seen it; kube-scheduler will retry",
        )
    if held is not None and held.node == node:
        if is_in_flight:
            return BindDecision(
                BindOutcome.BUSY, f"pod {key} is already being bound to node {node}"
            )
        return BindDecision(BindOutcome.DONE, "")
    if info is None or info.uid != uid:
        assert held is not None
        return BindDecision(BindOutcome.REFUSED, f"pod {key} is already bound to node {held.node}")
    decision = admit(info)
    if not decision.is_admitted:
        return BindDecision(BindOutcome.REFUSED, f"cannot bind {key} to {node}: {decision.reason}")
    try:
        event = ledger.reserve_for_bind(info, node, at=at)
    except LedgerError as e:
        return BindDecision(BindOutcome.REFUSED, f"cannot bind {key} to {node}: {e}")
    return BindDecision(BindOutcome.RESERVED, "", info, event, is_before_watch=is_before_watch)
