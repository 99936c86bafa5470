"""``/state``: the whole ledger as plain JSON-ready values, for humans and for tests.

Pure: no I/O. Keys are camelCase like the rest of the JSON this project shows. Nodes and pods
are sorted so that two ledgers built from the same cluster dump to the same bytes (the restart
test compares them).
"""

from __future__ import annotations

import datetime
from typing import Any

from scheduler_extender.admission.view import NamespaceNumbers
from scheduler_extender.core.ledger import Allocation, Ledger, Move, NodeState
from scheduler_extender.core.podinfo import Demand
from scheduler_extender.core.relief import ReliefBook


def _resources(d: Demand) -> dict[str, int]:
    return {"cpuMillis": d.cpu_millis, "memoryBytes": d.memory_bytes}


def _iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(timespec="milliseconds")


def _entry(e: Allocation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "pod": e.key,
        "uid": e.uid,
        "resources": _resources(e.held),
        "requests": _resources(e.requests),
        "priority": e.priority,
        "tags": {"foreign": e.tag.value} if e.tag is not None else {},
        "allocatedAt": _iso(e.allocated_at),
    }
    if e.vm is not None:
        out["vm"] = {
            "vcpus": e.vcpus,
            "memoryBytes": e.memory_bytes,
            "minVcpus": e.vm.min_vcpus,
            "maxVcpus": e.vm.max_vcpus,
            "minMemoryBytes": e.vm.min_memory_bytes,
            "maxMemoryBytes": e.vm.max_memory_bytes,
            "memoryUnitBytes": e.vm.memory_unit_bytes,
        }
    if e.is_tentative:
        out["tentative"] = True
    if e.is_unverified:
        # Found bound; its agent has not reported yet, so it may run up to its maximum.
        out["unverified"] = {"uncertain": _resources(e.uncertain)}
    return out


def dump_node(state: NodeState) -> dict[str, Any]:
    return {
        "name": state.name,
        "known": state.is_known,
        "capacity": _resources(state.allocatable),
        "systemReserve": _resources(state.reserve),
        "allocated": _resources(state.own_total),
        "occupied": _resources(state.foreign_total),
        "uncertain": _resources(state.uncertain_total),
        "free": _resources(state.free),
        "overcommitted": state.is_overcommitted,
        "allocations": [_entry(e) for e in sorted(state.own.values(), key=lambda e: e.key)],
        "foreignAllocations": [
            _entry(e) for e in sorted(state.foreign.values(), key=lambda e: e.key)
        ],
    }


def dump_state(ledger: Ledger, book: ReliefBook | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "nodes": [dump_node(ledger.nodes[name]) for name in sorted(ledger.nodes)]
    }
    if ledger.moves:  # only while a VM moves: a still cluster dumps as it always did
        out["moves"] = [dump_move(ledger, m) for _, m in sorted(ledger.moves.items())]
    if book is not None and book.migrations:
        # Relief's book of moves (``core.relief``): the unfinished ones are in its budget,
        # the ended ones hold their VM's cool-down and backoff.
        out["migrations"] = [
            {
                "migration": key,
                "vm": r.vm,
                "toNode": r.target_node,
                "phase": r.phase.value,
                "createdAt": _iso(r.created),
                "endedAt": _iso(r.ended) if r.ended is not None else None,
            }
            for key, r in sorted(book.migrations.items())
        ]
    return out


def dump_move(ledger: Ledger, move: Move) -> dict[str, Any]:
    """A live move in flight: the VM's pod, from its node to the target, and the target's
    hold (the reservation until the target pod is seen bound, then that pod's)."""
    source = ledger.pods.get(move.source_uid)
    target = ledger.pods.get(move.target_uid)
    return {
        "pod": source.key if source is not None else None,
        "uid": move.source_uid,
        "fromNode": source.node if source is not None else None,
        "toNode": move.target_node,
        "targetPod": move.target_key,
        "targetObserved": move.is_target_observed,
        "held": _resources(target.held) if target is not None else None,
    }


def dump_namespaces(numbers: list[NamespaceNumbers]) -> dict[str, Any]:
    """Per namespace: its quota (None: unlimited), usage, borrowing and queue sizes.
    ``/v1/queue`` has the pods themselves."""
    out: dict[str, Any] = {}
    for n in numbers:
        quota = (
            None
            if n.quota_cpu_millis is None or n.quota_memory_bytes is None
            else _resources(Demand(n.quota_cpu_millis, n.quota_memory_bytes))
        )
        out[n.namespace] = {
            "quota": quota,
            "usage": _resources(Demand(n.usage_cpu_millis, n.usage_memory_bytes)),
            "borrowed": _resources(Demand(n.borrowed_cpu_millis, n.borrowed_memory_bytes)),
            "admittedPods": n.admitted_pods,
            "waitingPods": n.waiting_pods,
        }
    return out
