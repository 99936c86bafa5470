"""What a run measured, for the report: step timings, the plotted series, the final summaries.

Pure: no I/O, no clock. These functions only record what the engine did (a VM's load step and
how long the agent took to follow it, a few VMs' and nodes' sizes at every sample time) and
assemble the ``Report`` at the end; nothing here feeds back into a decision, so what the report
shows can change without changing a run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from autoscaler_agent.policy import PolicyConfig, PolicyState, Samples, goal_vcpus
from simulator import scenario as sc
from simulator.records import ExtenderLife, NodeRecord, VmRecord
from simulator.report import (
    Counters,
    LogEntry,
    NodeSeries,
    NodeSummary,
    RecommendationRecord,
    ReliefSummary,
    Report,
    Series,
    StepResult,
    Violation,
    VmMemory,
    VmSeries,
    VmSummary,
)

# The plot stays readable with this many VMs and nodes; the report carries no more series.
MAX_PLOTTED: Final = 8


# -- steps: how long the agent took to follow a change of load ----------------------------------


def track_step(vm: VmRecord, policy: PolicyConfig, now: float) -> None:
    """A new load level: if it changes the size the policy aims at, time how long it takes."""
    guest = vm.guest
    assert guest is not None
    aim = goal_vcpus(
        Samples(load1=guest.demand),
        vm.vm_spec,
        PolicyState(),
        current_vcpus=vm.vcpus,
        top_vcpus=vm.vm_spec.top_vcpus,
        config=policy,
        now=now,
        explain=False,
    )
    grow, shrink = aim.grow_vcpus, aim.shrink_vcpus
    target: int | None = None
    if grow is not None and grow > vm.vcpus:
        target = grow
    elif shrink is not None and shrink < vm.vcpus:
        target = shrink
    if vm.open_step is not None:
        if target is not None and target == vm.open_step[3]:
            return
        close_step(vm, now, reached=False)
    if target is not None:
        vm.open_step = (now, guest.demand, vm.vcpus, target, target > vm.vcpus)


def check_step(vm: VmRecord, now: float) -> None:
    step = vm.open_step
    if step is None:
        return
    target, is_up = step[3], step[4]
    if (is_up and vm.vcpus >= target) or (not is_up and vm.vcpus <= target):
        close_step(vm, now, reached=True)


def close_step(vm: VmRecord, now: float, *, reached: bool) -> None:
    step = vm.open_step
    if step is None:
        return
    at, demand, frm, target, _ = step
    vm.steps.append(
        StepResult(
            at_seconds=round(at, 3),
            demand_vcpus=demand,
            from_vcpus=frm,
            target_vcpus=target,
            reached_after_seconds=round(now - at, 3) if reached else None,
        )
    )
    vm.open_step = None


# -- samples for the plot -------------------------------------------------------------------------


class PlotSamples:
    """The plotted VMs' demand, load1, size and permit, and the first nodes' reservations, at
    every sample time. A node that joins late is -1 (absent) before it joined."""

    def __init__(self, plotted: Sequence[VmRecord], *, has_memory: bool = False) -> None:
        self.plotted = list(plotted)
        self.times: list[float] = []
        self.vms: dict[str, tuple[list[float], list[float], list[int], list[int], list[int]]] = {
            v.spec.name: ([], [], [], [], []) for v in self.plotted
        }
        self.nodes: dict[str, list[int]] = {}
        self.pending: list[int] = []
        # Runs with a VM whose memory scales: its memory (used, plugged, permitted) and the
        # nodes' memory reservations.
        self.has_memory = has_memory
        self.vm_memory: dict[str, tuple[list[int], list[int], list[int]]] = {
            v.spec.name: ([], [], [])
            for v in self.plotted
            if v.vm_spec.max_memory_bytes > v.vm_spec.min_memory_bytes
        }
        self.node_memory: dict[str, list[int]] = {}

    def node_added(self, name: str) -> None:
        if len(self.nodes) < MAX_PLOTTED:
            self.nodes[name] = [-1] * len(self.times)
            if self.has_memory:
                self.node_memory[name] = [-1] * len(self.times)

    def take(self, t: float, ext: ExtenderLife | None, *, pending: int) -> None:
        self.times.append(round(t, 3))
        self.pending.append(pending)
        for vm in self.plotted:
            demand, load1, vcpus, permit, denials = self.vms[vm.spec.name]
            denials.append(vm.denials)
            live = vm.guest is not None and not vm.is_deleted
            demand.append(vm.guest.demand if live and vm.guest is not None else 0.0)
            load1.append(round(vm.guest.load1(t), 3) if live and vm.guest is not None else 0.0)
            vcpus.append(vm.vcpus if live else 0)
            permit.append(vm.granted if live else 0)
        for name, series in self.nodes.items():
            state = ext.ledger.nodes.get(name) if ext is not None else None
            series.append(state.allocated.cpu_millis if state is not None else -1)
        if self.has_memory:
            self._take_memory(ext)

    def _take_memory(self, ext: ExtenderLife | None) -> None:
        for vm in self.plotted:
            found = self.vm_memory.get(vm.spec.name)
            if found is None:
                continue
            used, size, permit = found
            m = vm.mem
            live = m is not None and not vm.is_deleted
            used.append(m.used if live and m is not None else 0)
            size.append(m.size if live and m is not None else 0)
            permit.append(m.granted if live and m is not None else 0)
        for name, series in self.node_memory.items():
            state = ext.ledger.nodes.get(name) if ext is not None else None
            series.append(state.allocated.memory_bytes if state is not None else -1)

    def series(self, nodes: Mapping[str, NodeRecord]) -> Series:
        return Series(
            times_seconds=self.times,
            vms=[
                VmSeries(
                    name=name,
                    demand_vcpus=d,
                    load1=l1,
                    vcpus=v,
                    permit_vcpus=p,
                    denials=n,
                    **_vm_memory_series(self.vm_memory.get(name)),
                )
                for name, (d, l1, v, p, n) in self.vms.items()
            ],
            pending_vms=self.pending,
            nodes=[
                NodeSeries(
                    name=name,
                    usable_millis=nodes[name].usable.cpu_millis,
                    reserved_millis=r,
                    usable_memory_bytes=nodes[name].usable.memory_bytes
                    if self.has_memory
                    else None,
                    reserved_memory_bytes=self.node_memory.get(name),
                )
                for name, r in self.nodes.items()
            ],
        )


def _vm_memory_series(
    found: tuple[list[int], list[int], list[int]] | None,
) -> dict[str, list[int] | None]:
    if found is None:
        return {}
    used, size, permit = found
    return {"memory_used_bytes": used, "memory_bytes": size, "permit_memory_bytes": permit}


def _vm_memory(vm: VmRecord, end: float) -> VmMemory | None:
    m = vm.mem
    if m is None:
        return None
    if m.is_out:
        m.oom_seconds += end - m.out_since
        m.is_out = False
    return VmMemory(
        min_bytes=vm.vm_spec.min_memory_bytes,
        max_bytes=vm.vm_spec.max_memory_bytes,
        final_bytes=m.size if not vm.is_deleted else 0,
        peak_bytes=m.peak,
        grows=m.grows,
        shrinks=m.shrinks,
        partial_shrinks=m.partial_shrinks,
        denials=m.denials,
        permit_errors=m.permit_errors,
        ooms=m.ooms,
        out_of_memory_seconds=round(m.oom_seconds, 3),
    )


# -- the report ------------------------------------------------------------------------------------


def build_report(
    scenario: sc.Scenario,
    *,
    end: float,
    vms: Sequence[VmRecord],
    nodes: Mapping[str, NodeRecord],
    pending: Sequence[VmRecord],
    violation: Violation | None,
    counts: Mapping[str, int],
    recommendations: list[RecommendationRecord],
    log: list[LogEntry],
    samples: PlotSamples,
    has_memory: bool = False,
    relief: ReliefSummary | None = None,
) -> Report:
    """The run's report at ``end``. Closes what is still open at the end (a node's over-commit,
    a guest's over-target time), so it is called once, when the run is over."""
    for node in nodes.values():
        if node.overcommit_since is not None:
            node.overcommit_seconds += end - node.overcommit_since
            node.overcommit_since = None
    summaries: list[VmSummary] = []
    for vm in vms:
        if vm.guest is not None and not vm.is_deleted:
            vm.guest.finish(end)
        summaries.append(
            VmSummary(
                name=vm.spec.name,
                node=vm.node,
                min_vcpus=vm.spec.min_vcpus,
                max_vcpus=vm.spec.max_vcpus,
                final_vcpus=vm.vcpus if vm.node is not None and not vm.is_deleted else 0,
                peak_vcpus=vm.peak,
                grows=vm.grows,
                shrinks=vm.shrinks,
                denials=vm.denials,
                permit_errors=vm.permit_errors,
                resize_errors=vm.resize_errors,
                over_target_seconds=round(vm.guest.over_target_seconds, 3)
                if vm.guest is not None
                else 0.0,
                placed_at_seconds=vm.placed_at,
                deleted_at_seconds=vm.deleted_at,
                steps=vm.steps
                + (
                    [
                        StepResult(
                            at_seconds=round(vm.open_step[0], 3),
                            demand_vcpus=vm.open_step[1],
                            from_vcpus=vm.open_step[2],
                            target_vcpus=vm.open_step[3],
                            reached_after_seconds=None,
                        )
                    ]
                    if vm.open_step is not None
                    else []
                ),
                memory=_vm_memory(vm, end),
            )
        )
    node_summaries = [
        NodeSummary(
            name=n.name,
            pool=n.pool,
            zone=n.zone,
            usable_millis=n.usable.cpu_millis,
            peak_reserved_millis=n.peak_reserved,
            overcommit_seconds=round(n.overcommit_seconds, 3),
            joined_at_seconds=round(n.joined_at, 3),
            usable_memory_bytes=n.usable.memory_bytes if has_memory else None,
            peak_reserved_memory_bytes=n.peak_reserved_memory if has_memory else None,
        )
        for n in sorted(nodes.values(), key=lambda n: n.name)
    ]
    return Report(
        scenario=scenario.name,
        description=scenario.description,
        seed=scenario.seed,
        duration_seconds=scenario.duration_seconds,
        ended_at_seconds=round(end, 3),
        is_ok=violation is None,
        violation=violation,
        counters=Counters(**counts),
        vms=summaries,
        nodes=node_summaries,
        pending_at_end=sorted(vm.spec.name for vm in pending if not vm.is_deleted),
        recommendations=recommendations,
        log=log,
        series=samples.series(nodes),
        relief=relief,
    )
