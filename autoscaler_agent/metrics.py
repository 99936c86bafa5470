"""Every metric of the agent, defined once, on a CollectorRegistry passed in.

Shell: prometheus_client only. Prefix ``vmautoscale_agent_``, base units, counters end in
``_total``. The per-VM gauges carry a ``vm`` label (namespace/name): acceptable only because
``forget_vm`` removes those series when the VM leaves the node, so cardinality stays the number
of VMs on one node.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "vmautoscale_agent_"


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = PREFIX
        self.registry = registry
        self.vms = Gauge(p + "vms", "VMs this agent manages now", registry=registry)
        self.current_vcpus = Gauge(
            p + "vm_current_vcpus",
            "vCPUs the VM has, as its hypervisor reports",
            ["vm"],
            registry=registry,
        )
        self.desired_vcpus = Gauge(
            p + "vm_desired_vcpus",
            "vCPUs the policy wants the VM to have",
            ["vm"],
            registry=registry,
        )
        self.permitted_vcpus = Gauge(
            p + "vm_permitted_vcpus", "vCPUs the last permit allows", ["vm"], registry=registry
        )
        self.permit_requests = Counter(
            p + "permit_requests_total",
            "Permit calls to the extender, by kind (request, notice)",
            ["kind"],
            registry=registry,
        )
        self.permit_outcomes = Counter(
            p + "permit_outcomes_total",
            "Answers to permit calls: granted, partial, denied, released, rejected (a permit"
            " that broke the protocol), error (no permit)",
            ["outcome"],
            registry=registry,
        )
        self.permit_denials = Counter(
            p + "permit_denials_total", "Increase requests granted nothing", registry=registry
        )
        self.permit_partial_grants = Counter(
            p + "permit_partial_grants_total",
            "Increase requests granted part of what was asked",
            registry=registry,
        )
        self.permit_protocol_errors = Counter(
            p + "permit_protocol_errors_total",
            "Permits rejected for breaking the protocol (above the request, vCPUs below usage or"
            " memory below the minimum)",
            registry=registry,
        )
        self.extender_errors = Counter(
            p + "extender_errors_total",
            "Failed permit calls, by kind (unavailable, rejected, protocol, item), the empty"
            " ones an idle node sends to learn of a new extender included",
            ["kind"],
            registry=registry,
        )
        self.extender_batches = Counter(
            p + "extender_batches_total", "POSTs of permit batches", registry=registry
        )
        self.resizes = Counter(
            p + "resizes_total",
            "Resizes by direction (grow, shrink) and result (ok, error)",
            ["direction", "result"],
            registry=registry,
        )
        self.resize_duration = Histogram(
            p + "resize_duration_seconds",
            "Time a hypervisor resize call took",
            ["direction"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.hypervisor_errors = Counter(
            p + "hypervisor_errors_total",
            "Hypervisor call failures by error class",
            ["error"],
            registry=registry,
        )
        self.scrape_errors = Counter(
            p + "scrape_errors_total",
            "Failed metric scrapes, by kind (timeout, unreachable, http_status, malformed...)",
            ["kind"],
            registry=registry,
        )
        self.scrapes = Counter(p + "scrapes_total", "Metric scrapes attempted", registry=registry)
        self.max_vcpus = Gauge(
            p + "vm_max_vcpus",
            "The most vCPUs the VM may have (its max-vcpus annotation, or less if its"
            " hypervisor was started with fewer)",
            ["vm"],
            registry=registry,
        )
        self.load1 = Gauge(
            p + "vm_load1",
            "The guest's one-minute load average (its node_exporter's node_load1), at the"
            " last scrape",
            ["vm"],
            registry=registry,
        )
        self.online_vcpus = Gauge(
            p + "vm_online_vcpus",
            "CPUs online in the guest (CPUs in its node_exporter's node_cpu_seconds_total,"
            " which lists only the CPUs the guest kernel has online), at the last scrape",
            ["vm"],
            registry=registry,
        )
        self.grow_to_online = Histogram(
            p + "grow_to_online_seconds",
            "From the agent's decision to grow a VM to the vCPUs it brought being online in"
            " the guest (as its node_exporter shows at the next scrape): permit, resize and"
            " the guest onlining the CPUs, end to end (autoscaler_agent/progress.py)",
            buckets=(0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 120, 300, 600),
            registry=registry,
        )
        self.grows_abandoned = Counter(
            p + "grows_abandoned_total",
            "Grows no longer wanted (the load fell) before the wanted vCPUs were online",
            registry=registry,
        )
        self.stuck = Gauge(
            p + "vm_stuck",
            "1 while a wanted size change has been pending longer than"
            " metrics.stuck_after_seconds (permit denied, hypervisor refusing, or plugged"
            " vCPUs not online in the guest), else 0",
            ["vm"],
            registry=registry,
        )
        mem = ["vm"]
        self.current_memory = Gauge(
            p + "vm_memory_bytes",
            "Memory the VM has now (boot memory plus what the guest has plugged), per the"
            " hypervisor",
            mem,
            registry=registry,
        )
        self.desired_memory = Gauge(
            p + "vm_desired_memory_bytes",
            "Memory the agent wants the VM to have (the memory goal within the VM's bounds)",
            mem,
            registry=registry,
        )
        self.permitted_memory = Gauge(
            p + "vm_permitted_memory_bytes",
            "Memory the extender last permitted the VM",
            mem,
            registry=registry,
        )
        self.online_memory = Gauge(
            p + "vm_online_memory_bytes",
            "Memory online in the guest (its MemTotal plus what its kernel kept back at boot),"
            " at the last scrape",
            mem,
            registry=registry,
        )
        self.memory_stuck = Gauge(
            p + "vm_memory_stuck",
            "1 while a wanted memory change has been pending longer than"
            " metrics.stuck_after_seconds (permit denied, a shrink the guest cannot complete,"
            " plugged memory not online), else 0",
            mem,
            registry=registry,
        )
        self.memory_grow_to_online = Histogram(
            p + "memory_grow_to_online_seconds",
            "From the agent's decision to grow a VM's memory (the guest's memory under"
            " pressure) to that memory being online in the guest (its MemTotal at a later"
            " scrape): permit, virtio-mem plug and onlining, end to end",
            buckets=(0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 120, 300, 600),
            registry=registry,
        )
        self.memory_resizes = Counter(
            p + "memory_resizes_total",
            "Memory resizes by direction and result (ok, error, incomplete: the guest stopped"
            " short, e.g. a shrink of memory in use)",
            ["direction", "result"],
            registry=registry,
        )
        self.memory_resize_duration = Histogram(
            p + "memory_resize_duration_seconds",
            "Time a memory resize took, until the guest had plugged or unplugged it (or stopped)",
            ["direction"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=registry,
        )
        self.memory_stalled_seconds = Counter(
            p + "memory_stalled_seconds_total",
            "Time in which all of a guest's non-idle tasks were stalled waiting for memory (PSI"
            " full), summed over the VMs, as seen between scrapes",
            registry=registry,
        )
        self.memory_pressure_grows = Counter(
            p + "memory_pressure_grows_total",
            "Memory grows decided because the guest waited for memory (PSI some above the"
            " policy's pressure_fraction), not because MemAvailable ran low",
            registry=registry,
        )
        self.memory_signals = Counter(
            p + "memory_signals_total",
            "Memory-pressure signals from guests (their workload crossed its memory.high),"
            " each bringing the next scrape forward",
            registry=registry,
        )
        self.vm_loop_restarts = Counter(
            p + "vm_loop_restarts_total",
            "VM loops restarted after an unexpected error",
            registry=registry,
        )

    def observe_vm(
        self,
        vm: str,
        *,
        current: int | None,
        desired: int | None,
        permitted: int | None,
        online: int | None = None,
        is_stuck: bool | None = None,
        max_vcpus: int | None = None,
        load1: float | None = None,
    ) -> None:
        for gauge, value in (
            (self.current_vcpus, current),
            (self.max_vcpus, max_vcpus),
            (self.load1, load1),
            (self.desired_vcpus, desired),
            (self.permitted_vcpus, permitted),
            (self.online_vcpus, online),
            (self.stuck, None if is_stuck is None else int(is_stuck)),
        ):
            if value is not None:
                gauge.labels(vm=vm).set(value)

    def observe_vm_memory(
        self,
        vm: str,
        *,
        current: int | None,
        desired: int | None,
        permitted: int | None,
        online: int | None,
        is_stuck: bool | None,
    ) -> None:
        for gauge, value in (
            (self.current_memory, current),
            (self.desired_memory, desired),
            (self.permitted_memory, permitted),
            (self.online_memory, online),
            (self.memory_stuck, None if is_stuck is None else int(is_stuck)),
        ):
            if value is not None:
                gauge.labels(vm=vm).set(value)

    def forget_vm(self, vm: str) -> None:
        """Drop the VM's series; safe to call for a VM that has none."""
        for gauge in (
            self.current_memory,
            self.desired_memory,
            self.permitted_memory,
            self.online_memory,
            self.memory_stuck,
            self.current_vcpus,
            self.desired_vcpus,
            self.permitted_vcpus,
            self.online_vcpus,
            self.max_vcpus,
            self.load1,
            self.stuck,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(vm)
