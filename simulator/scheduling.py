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
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import msgspec

from protocol.permits import ResourceRequest, ResourceRequestBatch
from protocol.versions import SUPPORTED
from scheduler_extender.admission import queue as adm
from scheduler_extender.core import batches, verbs
from scheduler_extender.core.permits import Decision
from scheduler_extender.core.placement import Strategy
from scheduler_extender.core.podinfo import PodInfo
from scheduler_extender.core.refusals import Refused
from simulator.records import ExtenderLife


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
) -> list[Decision] | Refused:
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
