"""What the admission queue shows: per-namespace numbers for the metrics, and ``/v1/queue``.

Pure: no I/O. Separate from ``admission`` because it changes for other reasons (what an
operator wants to see) than the queue's rules do.
"""

from __future__ import annotations

import msgspec

from scheduler_extender.admission.queue import AdmissionState, PodState, admitted_reason
from scheduler_extender.admission.quota import NamespaceQuota, at_least_zero, minus
from scheduler_extender.core.podinfo import ZERO, Demand


class NamespaceNumbers(msgspec.Struct, frozen=True, kw_only=True):
    """Gauges for one namespace; quotas are None when it has none (export no sample)."""

    namespace: str
    quota_cpu_millis: int | None
    quota_memory_bytes: int | None
    usage_cpu_millis: int
    usage_memory_bytes: int
    borrowed_cpu_millis: int
    borrowed_memory_bytes: int
    admitted_pods: int
    waiting_pods: int


def queue_numbers(state: AdmissionState) -> list[NamespaceNumbers]:
    """Metric-friendly numbers per namespace (sorted), for the shell's gauges."""
    out: list[NamespaceNumbers] = []
    for name in state.namespaces():
        quota = state.quota_of(name)
        usage = state.usage(name)
        borrowed = _borrowed(quota, usage)
        parts = state.breakdown(name)
        out.append(
            NamespaceNumbers(
                namespace=name,
                quota_cpu_millis=None if quota is None else quota.nominal.cpu_millis,
                quota_memory_bytes=None if quota is None else quota.nominal.memory_bytes,
                usage_cpu_millis=usage.cpu_millis,
                usage_memory_bytes=usage.memory_bytes,
                borrowed_cpu_millis=borrowed.cpu_millis,
                borrowed_memory_bytes=borrowed.memory_bytes,
                admitted_pods=parts.admitted_pods,
                waiting_pods=parts.waiting_pods,
            )
        )
    return out


def _borrowed(quota: NamespaceQuota | None, usage: Demand) -> Demand:
    return ZERO if quota is None else at_least_zero(minus(usage, quota.nominal))


def _amount(d: Demand) -> dict[str, int]:
    return {"cpuMillis": d.cpu_millis, "memoryBytes": d.memory_bytes}


def queue_view(state: AdmissionState, *, now: float | None = None) -> dict[str, object]:
    """The body of ``/v1/queue``: per namespace its quota, usage, borrowing, and its admitted
    and waiting pods in queue order with reasons. With ``now``, admitted pods show how long
    their admission has left. Keys are camelCase, like ``/state`` and the rest of the JSON the
    services emit (docs/API.md)."""
    namespaces: dict[str, object] = {}
    for name in state.namespaces():
        quota = state.quota_of(name)
        usage = state.usage(name)
        parts = state.breakdown(name)
        admitted = []
        for reservation in state.reserved_in(name):
            waiter = reservation.waiter
            item: dict[str, object] = {
                "pod": f"{name}/{waiter.name}",
                "uid": waiter.uid,
                "state": PodState.ADMITTED.value,
                "priority": waiter.priority,
                "demand": _amount(waiter.demand),
                "reason": admitted_reason(state, reservation),
            }
            if now is not None:
                item["expiresInSeconds"] = max(0.0, reservation.expires_at - now)
            admitted.append(item)
        waiting = [
            {
                "pod": f"{name}/{w.name}",
                "uid": w.uid,
                "state": PodState.WAITING.value,
                "position": position,
                "priority": w.priority,
                "demand": _amount(w.demand),
                "reason": state.waiting_reason(w),
            }
            for position, w in enumerate(state.waiting_in_order(name), start=1)
        ]
        namespaces[name] = {
            "quota": None if quota is None else _amount(quota.nominal),
            "queueingStrategy": None if quota is None else quota.queueing_strategy.value,
            "cohort": None if quota is None else quota.cohort,
            "borrowingLimit": None
            if quota is None or quota.borrowing_limit is None
            else _amount(quota.borrowing_limit.demand()),
            "usage": _amount(usage),
            "running": _amount(parts.running),
            "reserved": _amount(parts.reserved),
            "borrowed": _amount(_borrowed(quota, usage)),
            "admitted": admitted,
            "waiting": waiting,
        }
    return {
        "quotasLoaded": state.quotas is not None,
        "admissionTtlSeconds": state.ttl_seconds,
        "namespaces": namespaces,
    }
