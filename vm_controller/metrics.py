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
        self.migrations_started = Counter(
            PREFIX + "migrations_started_total",
            "Live migrations started (the target's room reserved, its pod created).",
            registry=registry,
        )
        self.migrations_succeeded = Counter(
            PREFIX + "migrations_succeeded_total",
            "Live migrations that cut over to the target.",
            registry=registry,
        )
        self.migrations_failed = Counter(
            PREFIX + "migrations_failed_total",
            "Live migrations refused or failed, by reason (the status condition's).",
            ["reason"],
            registry=registry,
        )
        self.migration_seconds = Histogram(
            PREFIX + "migration_duration_seconds",
            "Time a successful live migration took, from the target pod's creation to cut-over.",
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
            registry=registry,
        )
        self.migration_downtime_seconds = Histogram(
            PREFIX + "migration_downtime_seconds",
            "The guest's pause at cut-over, as QEMU reports it (query-migrate downtime).",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5),
            registry=registry,
        )
