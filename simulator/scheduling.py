"""The simulated extender's verbs: the server's own decisions, on the simulator's extender.

Pure: no I/O, no clock (``now`` is the simulation's). Each verb is the function the HTTP
handlers call (``scheduler_extender.core.verbs`` for filter, prioritize and bind,
``core.batches`` for a permit batch: version negotiation and sequence numbers included), given
the simulated extender's ledger, indexes, admission queue and sequence book; nothing here
decides anything the server would not. What is kube-scheduler's and not the extender's stays
here: which node among the best-scored (kube-scheduler picks at random among equals; the
simulator takes the first by name, to stay deterministic), and the agent's sequence numbers.
``tests/extender/test_same_answers_as_simulator.py`` feeds these and the real server the same
inputs.

``RepeatedBatches`` keeps the answers to permit batches that changed nothing (a VM on a full
node asks again every few seconds, and is denied again), and gives them again for the same
batch while its node's ledger stands still, where ``permit_batch`` would compute them again:
what it returns is what ``permit_batch`` answered, never an answer of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import msgspec

from autoscaler_agent.core import Ask, CallKind
from protocol.permits import PodRef, ResourceRequest, ResourceRequestBatch
from protocol.versions import SUPPORTED
from scheduler_extender.admission import queue as adm
from scheduler_extender.core import batches, verbs
from scheduler_extender.core.ledger import Ledger
from scheduler_extender.core.permits import Decision
from scheduler_extender.core.placement import Strategy
from scheduler_extender.core.podinfo import PodInfo
from scheduler_extender.core.refusals import Refused
from simulator.records import ExtenderLife

# A permit batch's answers: each VM's decision, in the batch's order; or the batch refused whole.
Answers = list[Decision] | Refused


class Choice(NamedTuple):
    """kube-scheduler's cycle up to bind: the node to bind to, or why there is none."""

    node: str | None
    # None when ``node`` is set; else "waiting" (for quota) or "unschedulable" (no room).
    kind: str | None
    reason: str


def choose_node(
    ext: ExtenderLife, info: PodInfo, names: list[str], *, now: float, strategy: Strategy
) -> Choice:
    """Filter, then prioritize, then the best-scored node (ties: the first by name)."""
    admission = adm.admit(ext.admission, info, now=now) if info.vm_error is None else None
    filtered = verbs.filter_pod(ext.fit, info, names, admission)
    if admission is not None and not admission.is_admitted:
        return Choice(None, "waiting", filtered.reason)
    result = filtered.result
    if not result.passed:
        reasons = sorted({*result.failed.values(), *result.unresolvable.values()})
        return Choice(None, "unschedulable", "; ".join(reasons[:2]))
    scores = verbs.prioritize(ext.scores, info, result.passed, strategy)
    best = min(scores, key=lambda ns: (-ns[1], ns[0]))[0]
    return Choice(best, None, filtered.reason)


def bind(ext: ExtenderLife, info: PodInfo, node: str, *, now: float) -> verbs.BindDecision:
    """kube-scheduler's bind call for a pod the extender knows (the simulated watch is never
    late, and no Binding is ever still on its way)."""
    return verbs.bind_pod(
        ext.ledger,
        key=info.key,
        uid=info.uid,
        node=node,
        known=info,
        filtered=None,
        is_in_flight=False,
        admit=partial(adm.admit, ext.admission, now=now),
        at=now,
    )


def permit_batch(
    ext: ExtenderLife, node: str, requests: Sequence[ResourceRequest], seqs: dict[str, int]
) -> Answers:
    """One POST /v1/permits from ``node``'s agent, as the agent sends it (every request with
    its VM's next seq, counted in ``seqs``, the agent's side) and as the server decides it."""
    numbered = []
    for req in requests:
        uid = req.pod.uid
        seq = seqs[uid] = seqs.get(uid, 0) + 1
        numbered.append(msgspec.structs.replace(req, seq=seq))
    batch = ResourceRequestBatch(protocol=SUPPORTED, node=node, requests=numbered)
    version = batches.admit(batch, token_node=node)
    if isinstance(version, Refused):
        return version
    return batches.decide(
        ext.ledger,
        ext.sequences,
        batch,
        version,
        quota_room=partial(adm.quota_room, ext.admission),
    )


# A permit batch as its node's extender decides it: per request, the pod and the agent's call
# (its kind and each resource's sizes), which ``wire.resource_request`` turns into the request's
# current, requested and last permit. Left out: the load report and the reason (logs and the
# recommender read them, ``decide`` does not) and the seq (next section).
BatchKey = tuple[tuple[PodRef, CallKind, Ask, Ask | None], ...]


class RepeatedBatches:
    """The answers to permit batches that left the ledger as it was, while their node's stands.

    ``core.batches.decide`` is a function of the ledger, the sequence book and the batch (and of
    the namespaces' quota room: not used with quotas, nor with moves). A batch whose decisions
    changed no pod's hold, size or agent flag, nor anything the ledger counts as a change
    (``Ledger.generation``), left the ledger as it found it: every VM was denied more, or kept
    what it holds. Asked again by the same VMs with the same calls, on a node whose ledger has
    not changed since (``node_changed``, from the ledger's subscription), the same function gets
    the same inputs and answers the same. The sequence book is the one input that moved: it
    recorded the seqs, which this class skips. Its rule only refuses a seq at or below the last
    one applied, and each agent's seqs only go up, so it accepts the next ones either way.

    So ``decide`` calls ``permit_batch`` and keeps its answers when the batch changed nothing;
    ``answer`` gives them again, and numbers the agents' seqs as sending the batch would.
    """

    __slots__ = ("_by_node",)

    def __init__(self) -> None:
        self._by_node: dict[str, dict[BatchKey, list[Decision]]] = {}

    def node_changed(self, node: str) -> None:
        """Something changed on ``node``'s ledger: its kept answers may no longer hold."""
        self._by_node.pop(node, None)

    def clear(self) -> None:
        """A new extender (a new ledger and sequence book): nothing kept holds."""
        self._by_node.clear()

    def answer(self, node: str, key: BatchKey, seqs: dict[str, int]) -> list[Decision] | None:
        """The answers ``permit_batch`` gave this batch on this node's ledger as it stands, or
        None if it has not answered it since the ledger last changed."""
        kept = self._by_node.get(node)
        decisions = kept.get(key) if kept is not None else None
        if decisions is not None:
            for pod, _, _, _ in key:
                seqs[pod.uid] = seqs.get(pod.uid, 0) + 1
        return decisions

    def decide(
        self,
        ext: ExtenderLife,
        node: str,
        key: BatchKey,
        requests: Sequence[ResourceRequest],
        seqs: dict[str, int],
    ) -> Answers:
        """``permit_batch``; its answers kept if they changed nothing (see the class)."""
        ledger = ext.ledger
        generation = ledger.generation
        before = [_hold_of(ledger, req.pod.uid) for req in requests]
        decisions = permit_batch(ext, node, requests, seqs)
        if (
            not isinstance(decisions, Refused)
            and ledger.generation == generation
            and not ledger.moves
            and all(d.refused is None for d in decisions)
            and [_hold_of(ledger, req.pod.uid) for req in requests] == before
        ):
            self._by_node.setdefault(node, {})[key] = decisions
        return decisions


def _hold_of(ledger: Ledger, uid: str) -> tuple[object, ...] | None:
    """What a permit decision may change of one pod's ledger entry."""
    e = ledger.pods.get(uid)
    if e is None:
        return None
    return (e.node, e.held, e.uncertain, e.vcpus, e.memory_bytes, e.has_agent, e.is_tentative)
