"""The vm-controller's Prometheus metrics, defined once on a registry passed in."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "vmautoscale_vmcontroller_"


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.reconciles = Counter(
            PREFIX + "reconciles_total",
            "Passes over one VirtualMachine, by result (ok, error).",
            ["result"],
            registry=registry,
        )
        self.reconcile_seconds = Histogram(
            PREFIX + "reconcile_duration_seconds",
            "Time one pass over a VirtualMachine took, its API requests included.",
            registry=registry,
        )
        self.pods_created = Counter(
            PREFIX + "pods_created_total",
            "Runner pods created (a VM's first pod, or one replacing a pod that went away).",
            registry=registry,
        )
        self.virtual_machines = Gauge(
            PREFIX + "virtual_machines",
            "VirtualMachines the controller knows of, as of its last list.",
            registry=registry,
        )
