"""What a run produced: the JSON report's types, and the summary table printed in a terminal.

Pure: no I/O, no clock. Nothing here measures wall time, so the same scenario gives the same
report byte for byte (``encode_report``); the shell prints timings beside it, never inside it.
"""

from __future__ import annotations

import statistics
import textwrap
from typing import Final

import msgspec


class _Out(msgspec.Struct, frozen=True, kw_only=True):
    pass


class StepResult(_Out, frozen=True):
    """One change of a VM's load that changes the size the policy aims at."""

    at_seconds: float
    demand_vcpus: float
    from_vcpus: int
    target_vcpus: int
    # Seconds until the VM had the target size; None: not reached before the next step or end.
    reached_after_seconds: float | None


class VmMemory(_Out, frozen=True):
    """A VM whose memory scales (decided by the agent's core, ``simulator.engine``), in bytes."""

    min_bytes: int
    max_bytes: int
    final_bytes: int
    peak_bytes: int
    grows: int
    shrinks: int
    partial_shrinks: int  # shrinks that ended above the size asked: the guest held the rest
    denials: int  # memory permits that granted less than asked
    permit_errors: int
    ooms: int  # times its guest used more than it had (it waited too long to grow)
    out_of_memory_seconds: float


class VmSummary(_Out, frozen=True, omit_defaults=True):
    name: str
    node: str | None
    min_vcpus: int
    max_vcpus: int
    final_vcpus: int
    peak_vcpus: int
    grows: int
    shrinks: int
    denials: int  # permit answers that granted less than asked (denied or partial)
    permit_errors: int  # failed calls (extender down, item errors)
    resize_errors: int
    over_target_seconds: float  # demand above target_load_per_vcpu * vcpus
    placed_at_seconds: float | None
    deleted_at_seconds: float | None
    steps: list[StepResult]
    # Only for a VM whose memory scales (so reports without one read as they always did).
    memory: VmMemory | None = None


class NodeSummary(_Out, frozen=True, omit_defaults=True):
    name: str
    pool: str
    zone: str
    usable_millis: int
    peak_reserved_millis: int
    overcommit_seconds: float
    joined_at_seconds: float
    # Only in runs with a VM whose memory scales.
    usable_memory_bytes: int | None = None
    peak_reserved_memory_bytes: int | None = None


class LogEntry(_Out, frozen=True):
    at_seconds: float
    kind: str
    subject: str
    detail: str


class Violation(_Out, frozen=True):
    at_seconds: float
    invariant: str
    message: str
    # The last things that happened before it, oldest first.
    recent: list[LogEntry]


class RecommendationRecord(_Out, frozen=True):
    at_seconds: float
    scale_up: list[str]  # "pool/zone xN"
    unscheduled: list[str]


class VmSeries(_Out, frozen=True, omit_defaults=True):
    name: str
    demand_vcpus: list[float]
    load1: list[float]
    vcpus: list[int]  # 0 while the VM does not run (not yet placed, or deleted)
    permit_vcpus: list[int]
    # Permit answers so far that granted less than asked (the summary's ``denials``, over time).
    denials: list[int]
    # Only for a VM whose memory scales: what its guest uses, has, and may have (bytes).
    memory_used_bytes: list[int] | None = None
    memory_bytes: list[int] | None = None
    permit_memory_bytes: list[int] | None = None


class NodeSeries(_Out, frozen=True, omit_defaults=True):
    name: str
    usable_millis: int
    reserved_millis: list[int]
    # Only in runs with a VM whose memory scales.
    usable_memory_bytes: int | None = None
    reserved_memory_bytes: list[int] | None = None


class Series(_Out, frozen=True):
    times_seconds: list[float]
    vms: list[VmSeries]
    nodes: list[NodeSeries]
    # VMs waiting for a node at each sample time (created, not yet placed, not deleted).
    pending_vms: list[int]


class Counters(_Out, frozen=True):
    events: int
    scrapes: int
    scrapes_skipped: int  # scrapes a settled VM did not need (see engine docstring)
    permit_batches: int
    # Of those, batches that changed nothing sent again to a node whose ledger stood still:
    # answered as the extender answered them before, not decided again (engine docstring).
    permit_batches_repeated: int
    permit_requests: int
    resizes: int
    placements: int
    full_checks: int
    extender_restarts: int


class ReliefSummary(_Out, frozen=True):
    """Relief's work in a run with a ``relief`` section (``simulator.relief``)."""

    is_enabled: bool
    moves_started: int
    moves_done: int
    moves_failed: int  # the simulated failures, and moves an extender restart cut off
    # Moves by reason (``core.relief.MoveReason``), in name order.
    moves_by_reason: dict[str, int]
    nodes_emptied: list[str]
    # Seconds during which a VM's grow stood cut short by its node (summed over VMs), and the
    # VMs' running seconds: their ratio is the share relief is there to bring down.
    cut_short_vm_seconds: float
    vm_seconds: float

    @property
    def cut_short_share(self) -> float:
        return self.cut_short_vm_seconds / self.vm_seconds if self.vm_seconds else 0.0


class Report(_Out, frozen=True, omit_defaults=True):
    scenario: str
    description: str  # the scenario's own: what it shows, what to expect
    seed: int
    duration_seconds: float
    ended_at_seconds: float
    is_ok: bool
    violation: Violation | None
    counters: Counters
    vms: list[VmSummary]
    nodes: list[NodeSummary]
    pending_at_end: list[str]
    recommendations: list[RecommendationRecord]
    log: list[LogEntry]
    series: Series
    # Only in runs with a ``relief`` section (so other reports read as they always did).
    relief: ReliefSummary | None = None


_ENCODER: Final = msgspec.json.Encoder(order="deterministic")


def encode_report(report: Report) -> bytes:
    return _ENCODER.encode(report)


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}s"


VM_KEY: Final = """\
key: vcpus MIN..MAX=END  the VM's bounds and its size at the end (0 once deleted)
     peak                the largest size it reached
     grow, shrk          resizes up and down
     deny                permit answers that granted less than the agent asked: the extender
                         refusing to over-commit a node (or a namespace quota). Expected when
                         VMs want more than there is; a broken invariant is the failure
     errs                failed permit calls and failed resizes
     over-target         time its load was above the agent's target load per vCPU times its
                         size: the time it wanted to be bigger than it was
     steps reached       load changes that changed the size the agent aims at, reached/all,
                         with the median and longest time to reach it; "deleted": deleted in
                         the run"""

MEMORY_KEY: Final = """\
key: memory MIN..MAX=END GiB: the VM's memory bounds and its size at the end (0 once deleted)
     peak                the most memory it had
     grow, shrk, part    memory resizes up and down; part: shrinks that ended above the size
                         asked, because the guest still held the rest (the permit followed
                         what it really gave back)
     deny                memory permits that granted less than asked (the node had no more)
     oom                 times the guest used more memory than it had, and for how long: what
                         growing before it runs out must keep at 0"""

NODE_MEMORY_KEY: Final = """\
key: usable, peak reserved: the node's memory and the most of it the extender's ledger held"""

NODE_KEY: Final = """\
key: usable              cores VMs may hold: allocatable minus the system reserve
     peak reserved       the most the extender's ledger held at once, cores and % of usable
     overcommit          time reserved was above usable (an invariant: must stay 0s)"""


def _gib(value: int) -> str:
    return f"{value / 2**30:.1f}"


def _memory_tables(report: Report, vms: list[VmSummary], *, max_nodes: int) -> list[str]:
    """The memory of the VMs whose memory scales, and the nodes' memory."""
    header = (
        f"{'vm':<14} {'memory GiB':>16} {'peak':>5} {'grow':>4} {'shrk':>4} {'part':>4}"
        f" {'deny':>4} {'errs':>4} {'oom':>10}"
    )
    lines = [header, "-" * len(header)]
    for vm in vms:
        m = vm.memory
        assert m is not None
        bounds = f"{_gib(m.min_bytes)}..{_gib(m.max_bytes)}={_gib(m.final_bytes)}"
        oom = f"{m.ooms} {_secs(m.out_of_memory_seconds)}"
        lines.append(
            f"{vm.name:<14} {bounds:>16} {_gib(m.peak_bytes):>5} {m.grows:>4} {m.shrinks:>4}"
            f" {m.partial_shrinks:>4} {m.denials:>4} {m.permit_errors:>4} {oom:>10}"
        )
    lines.append(MEMORY_KEY)
    lines.append("")
    header = f"{'node':<10} {'usable GiB':>10} {'peak reserved':>14}"
    lines.extend([header, "-" * len(header)])
    for node in report.nodes[:max_nodes]:
        usable, peak = node.usable_memory_bytes or 0, node.peak_reserved_memory_bytes or 0
        pct = 100 * peak / usable if usable else 0
        lines.append(f"{node.name:<10} {_gib(usable):>10} {_gib(peak):>8} {pct:>4.0f}%")
    lines.append(NODE_MEMORY_KEY)
    return lines


def relief_line(r: ReliefSummary) -> str:
    reasons = ", ".join(f"{k} {v}" for k, v in r.moves_by_reason.items()) or "none"
    emptied = ", ".join(r.nodes_emptied) or "none"
    return (
        f"relief {'on' if r.is_enabled else 'off'}: {r.moves_started} moves started"
        f" ({reasons}), {r.moves_done} done, {r.moves_failed} failed; nodes emptied: {emptied};"
        f" cut-short VM-seconds {r.cut_short_vm_seconds:.0f} of {r.vm_seconds:.0f}"
        f" ({r.cut_short_share:.1%})"
    )


def format_table(report: Report, *, max_vms: int = 40, max_nodes: int = 20) -> str:
    """The terminal summary: one row per VM and per node (the first ones, if there are many),
    each table followed by a key to its columns, so the output reads without the source."""
    lines: list[str] = []
    lines.append(
        f"scenario {report.scenario}: {report.ended_at_seconds:.0f}s of"
        f" {report.duration_seconds:.0f}s simulated, seed {report.seed},"
        f" {'OK (every invariant held)' if report.is_ok else 'INVARIANT VIOLATED'}"
    )
    if report.description:
        lines.extend(textwrap.wrap(report.description, width=96))
    lines.append("")
    header = (
        f"{'vm':<14} {'node':<8} {'vcpus':>9} {'peak':>4} {'grow':>4} {'shrk':>4}"
        f" {'deny':>4} {'errs':>4} {'over-target':>11}  {'steps reached (time to target)'}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for vm in report.vms[:max_vms]:
        reached = [s.reached_after_seconds for s in vm.steps]
        ok = [r for r in reached if r is not None]
        steps = (
            f"{len(ok)}/{len(reached)}"
            + (f" (median {statistics.median(ok):.0f}s, max {max(ok):.0f}s)" if ok else "")
            if reached
            else "none"
        )
        gone = " deleted" if vm.deleted_at_seconds is not None else ""
        lines.append(
            f"{vm.name:<14} {vm.node or '-':<8}"
            f" {vm.min_vcpus:>2}..{vm.max_vcpus:<2}={vm.final_vcpus:<2}"
            f" {vm.peak_vcpus:>4} {vm.grows:>4} {vm.shrinks:>4} {vm.denials:>4}"
            f" {vm.permit_errors + vm.resize_errors:>4} {_secs(vm.over_target_seconds):>11}"
            f"  {steps}{gone}"
        )
    if len(report.vms) > max_vms:
        lines.append(f"... and {len(report.vms) - max_vms} more VMs (see the JSON report)")
    lines.append(VM_KEY)
    lines.append("")
    memory = [vm for vm in report.vms if vm.memory is not None]
    if memory:
        lines.extend(_memory_tables(report, memory[:max_vms], max_nodes=max_nodes))
        lines.append("")
    header = (
        f"{'node':<10} {'pool/zone':<16} {'usable':>7} {'peak reserved':>14} {'overcommit':>10}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for node in report.nodes[:max_nodes]:
        pct = 100 * node.peak_reserved_millis / node.usable_millis if node.usable_millis else 0
        joined = f"  joined at {node.joined_at_seconds:.0f}s" if node.joined_at_seconds else ""
        lines.append(
            f"{node.name:<10} {node.pool + '/' + node.zone:<16} {node.usable_millis / 1000:>6.1f}c"
            f" {node.peak_reserved_millis / 1000:>7.1f}c {pct:>4.0f}%"
            f" {_secs(node.overcommit_seconds):>10}{joined}"
        )
    if len(report.nodes) > max_nodes:
        lines.append(f"... and {len(report.nodes) - max_nodes} more nodes")
    lines.append(NODE_KEY)
    if report.recommendations:
        lines.append("")
        for rec in report.recommendations:
            lines.append(
                f"recommender at {rec.at_seconds:.0f}s: add {', '.join(rec.scale_up) or 'nothing'}"
                + (f"; cannot place {', '.join(rec.unscheduled)}" if rec.unscheduled else "")
            )
    if report.pending_at_end:
        lines.append(f"pending at the end: {', '.join(report.pending_at_end)}")
    if report.relief is not None:
        lines.append("")
        lines.append(relief_line(report.relief))
    c = report.counters
    lines.append("")
    lines.append(
        f"{c.events} events, {c.scrapes} scrapes, {c.permit_requests} permit requests in"
        f" {c.permit_batches} batches, {c.resizes} resizes, {c.full_checks} full invariant"
        f" checks, {c.extender_restarts} extender restarts."
    )
    lines.append(
        f"{c.scrapes_skipped} more scrapes were skipped while settled: a VM whose load cannot"
        " change its size needs no scrape until it can; skipping saves work, never changes a"
        " decision."
    )
    lines.append(
        f"{c.permit_batches_repeated} of those batches were answered again, not decided again:"
        " each had changed nothing when decided, and came back to a node whose ledger stood still."
    )
    if report.violation is not None:
        v = report.violation
        lines.append("")
        lines.append(f"INVARIANT VIOLATED at {v.at_seconds:.1f}s: {v.invariant}: {v.message}")
        lines.append("what happened just before:")
        for e in v.recent:
            lines.append(f"  {e.at_seconds:8.2f}s {e.kind:<18} {e.subject:<16} {e.detail}")
    return "\n".join(lines)
