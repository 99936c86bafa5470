"""A pod's QoS class, computed the way Kubernetes computes it.

Upstream: ``ComputePodQOS`` in kubernetes/kubernetes pkg/apis/core/helper/qos/qos.go (v1.36).
With no pod-level ``resources``, every init and app container is classed on its own from its
cpu and memory: Guaranteed when both have a limit and each request equals its limit (a missing
request defaults to the limit, as API defaulting does), BestEffort when it names neither,
Burstable otherwise. The pod is Guaranteed or BestEffort only if all its containers are, and
Burstable as soon as one container is or two disagree. Zero quantities count as absent and other
resources (ephemeral-storage, hugepages) do not count.
"""

from __future__ import annotations

from typing import Any

from protocol.quantity import parse_quantity

QOS_RESOURCES = ("cpu", "memory")


def _positive(resources: dict[str, Any]) -> dict[str, Any]:
    return {
        name: parse_quantity(str(value))
        for name, value in resources.items()
        if name in QOS_RESOURCES and parse_quantity(str(value)) > 0
    }


def _requirements_qos(resources: dict[str, Any]) -> str:
    limits = _positive(resources.get("limits") or {})
    requests = {**limits, **_positive(resources.get("requests") or {})}
    if not requests and not limits:
        return "BestEffort"
    if set(limits) == set(QOS_RESOURCES) and requests == limits:
        return "Guaranteed"
    return "Burstable"


def qos_class(spec: dict[str, Any]) -> str:
    """``status.qosClass`` of a pod with this ``spec``."""
    if spec.get("resources"):
        return _requirements_qos(spec["resources"])
    classes = {
        _requirements_qos(c.get("resources") or {})
        for c in [*spec.get("initContainers", []), *spec["containers"]]
    }
    return classes.pop() if len(classes) == 1 else "Burstable"
