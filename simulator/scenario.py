"""What a simulation runs: the scenario file's strict types, and loading it with ``$.path`` errors.

Pure except ``load_scenario_file`` (reads the YAML and any CSV load traces it names; the one
place this package touches files before the run). Everything here is a frozen msgspec Struct
with ``forbid_unknown_fields``: a typo is an error naming its path, never a silent default.

Units are in the names (``_seconds``, ``_vcpus``); CPU and memory amounts of nodes and pods are
Kubernetes quantities (``16``, ``500m``, ``64Gi``). A scenario::

    name: burst
    duration_seconds: 900
    seed: 1
    nodes: [{name: n1, cpu: 10, memory: 64Gi, pool: general, zone: a}]
    traces:
      burst: [{at_seconds: 0, level_vcpus: 0.5}, {at_seconds: 120, level_vcpus: 5.5}]
    vms: [{name: db, min_vcpus: 1, max_vcpus: 8, trace: burst}]
    events: [{at_seconds: 600, kind: extender-restart, down_seconds: 10}]

A trace is a list of pieces; each lasts until the next one's ``at_seconds``. A piece is a level
(``level_vcpus``), a ramp (``ramp: {to_vcpus, over_seconds}``, from the level before it), a
sine (``sine: {mean_vcpus, amplitude_vcpus, period_seconds}``) or noise (``noise: {mean_vcpus,
amplitude_vcpus, step_seconds, seed}``: a new uniform draw every step, 1 s by default). Ramps
and sines are quantised into steps of ``timing.load_quantum_seconds``, noise into its own
steps, so that every change of load is an explicit breakpoint (the engine does no work for a
VM between breakpoints while it is settled).
``csv: FILE`` (relative to the scenario) reads ``seconds,vcpus`` rows as steps.

A VM with ``max_memory`` scales its memory too, decided by the agent's own core and memory
policy (``autoscaler_agent.memory_policy``): from ``memory`` in ``memory_unit`` steps,
following ``memory_used`` (what its guest's processes hold over time, ``simulator.world``),
with the scenario's ``memory_policy`` knobs.

``relief`` (the extender's ``core.relief`` settings; none: no relief, and the run is what it
always was) moves VMs live between nodes, decided every ``moves.interval_seconds`` by the real
``plan_moves``; a move takes ``moves.fixed_seconds`` plus ``moves.seconds_per_gib`` per GiB of
the VM's memory, and fails (its reservation cancelled, the VM stays) at ``moves.failure_rate``,
drawn from the seed. A VM with ``never_move: true`` opts out.
"""

from __future__ import annotations

import csv
import enum
import io
import math
import random
from pathlib import Path
from typing import Annotated, Final

import msgspec
import yaml

from protocol.bounds import (
    MAX_VCPUS,
    Count,
    Int32,
    Int64,
    NumericQuantity,
    PositiveSeconds,
    Seconds,
)
from protocol.quantity import QuantityError, cpu_millis, memory_bytes
from protocol.strict_yaml import describe_yaml_error, load_strict
from scheduler_extender.admission.quota import QuotaConfig
from scheduler_extender.core.placement import Strategy
from scheduler_extender.core.relief import ReliefConfig

Vcpus = Annotated[float, msgspec.Meta(ge=0, le=MAX_VCPUS)]
WholeVcpus = Annotated[int, msgspec.Meta(ge=1, le=MAX_VCPUS)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
Quantity = str | NumericQuantity
LoadPerVcpu = Annotated[float, msgspec.Meta(gt=0, le=MAX_VCPUS)]

DEFAULT_MEMORY: Final = "4Gi"


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Load1Model(enum.StrEnum):
    # The kernel's 1-minute exponential average of the run queue: the policy sees real lag.
    KERNEL = "kernel"
    # load1 equals demand at once: isolates the policy from the lag (tests of "one step").
    INSTANT = "instant"


class Ramp(_Strict, frozen=True, kw_only=True):
    to_vcpus: Vcpus
    over_seconds: PositiveSeconds


class Sine(_Strict, frozen=True, kw_only=True):
    mean_vcpus: Vcpus
    amplitude_vcpus: Vcpus
    period_seconds: PositiveSeconds

    def __post_init__(self) -> None:
        if self.amplitude_vcpus > self.mean_vcpus:
            raise ValueError("amplitude_vcpus above mean_vcpus would make the load negative")


class Noise(_Strict, frozen=True, kw_only=True):
    """A steady load that wobbles: each ``step_seconds`` the level is drawn uniformly from
    ``mean_vcpus`` ± ``amplitude_vcpus``, independently. A real steady load (pgbench at a fixed
    client count) is this at one-second scale: its busy time, run queue and load1 all move
    with it, as they do in the guest model. Repeatable: the draws come from ``seed`` and the
    piece's start, not from the scenario's seed."""

    mean_vcpus: Vcpus
    amplitude_vcpus: Vcpus
    step_seconds: PositiveSeconds = 1.0
    seed: Int64 = 0

    def __post_init__(self) -> None:
        if self.amplitude_vcpus > self.mean_vcpus:
            raise ValueError("amplitude_vcpus above mean_vcpus would make the load negative")


class Piece(_Strict, frozen=True, kw_only=True):
    at_seconds: Seconds
    level_vcpus: Vcpus | None = None
    ramp: Ramp | None = None
    sine: Sine | None = None
    noise: Noise | None = None

    def __post_init__(self) -> None:
        given = sum(x is not None for x in (self.level_vcpus, self.ramp, self.sine, self.noise))
        if given != 1:
            raise ValueError("a piece needs exactly one of level_vcpus, ramp, sine, noise")


class CsvTrace(_Strict, frozen=True, kw_only=True):
    csv: Name


Trace = list[Piece] | CsvTrace


class Node(_Strict, frozen=True, kw_only=True):
    name: Name
    cpu: Quantity
    memory: Quantity = "64Gi"
    pool: Name = "default"
    zone: Name = "zone-a"


class NodePoolSpec(_Strict, frozen=True, kw_only=True):
    """A pool the recommender may grow; recommended nodes join after ``provision_seconds``."""

    name: Name
    zones: Annotated[list[Name], msgspec.Meta(min_length=1)]
    cpu: Quantity
    memory: Quantity = "64Gi"
    max_count: Count = 10
    provision_seconds: Seconds = 60.0
    priority: Int32 = 0


class MemoryUse(_Strict, frozen=True, kw_only=True):
    """From ``at_seconds`` on (until the next one), the guest's processes hold ``used``;
    reached in a straight line from the level before over ``over_seconds`` (0: at once)."""

    at_seconds: Seconds
    used: Quantity
    over_seconds: Seconds = 0.0


class Vm(_Strict, frozen=True, kw_only=True):
    name: Name
    namespace: Name = "default"
    min_vcpus: WholeVcpus
    max_vcpus: WholeVcpus
    scaling_unit: WholeVcpus = 1
    # The VM's memory: its least (``min-memory``), placed and booted with it.
    memory: Quantity = DEFAULT_MEMORY
    # Memory scaling (the agent's memory policy): the most it may grow to (none: it does not
    # scale), in steps of ``memory_unit``, following what its guest uses (``memory_used``,
    # none: a quarter of ``memory`` throughout).
    max_memory: Quantity | None = None
    memory_unit: Quantity = "128Mi"
    memory_used: list[MemoryUse] | None = None
    start_seconds: Seconds = 0.0
    priority: Int32 = 0
    # Already bound to this node at start (a running fleet); otherwise placed by the extender.
    node: Name | None = None
    # A name from ``traces``, or the pieces themselves; none: idle at 0.1 vCPUs.
    trace: Name | list[Piece] | None = None
    # Opted out of live moves (``vm-autoscaling.io/never-move: "true"``).
    never_move: bool = False

    def __post_init__(self) -> None:
        if self.max_vcpus < self.min_vcpus:
            raise ValueError("max_vcpus is below min_vcpus")


class ForeignPod(_Strict, frozen=True, kw_only=True):
    """A pod of another scheduler: reality the ledger must count, never a decision of ours."""

    name: Name
    namespace: Name = "default"
    cpu: Quantity
    memory: Quantity = "1Gi"
    # The node the default scheduler put it on; none: the emptiest node where it fits.
    node: Name | None = None
    start_seconds: Seconds = 0.0
    end_seconds: Seconds | None = None


class DeleteVm(_Strict, frozen=True, kw_only=True, tag="delete-vm", tag_field="kind"):
    at_seconds: Seconds
    vm: Name


class ExtenderRestart(_Strict, frozen=True, kw_only=True, tag="extender-restart", tag_field="kind"):
    """The extender dies at ``at_seconds`` (its ledger and unwritten permits are lost) and a new
    one starts ``down_seconds`` later from the API server's view."""

    at_seconds: Seconds
    down_seconds: Seconds = 5.0


class HypervisorFail(_Strict, frozen=True, kw_only=True, tag="hypervisor-fail", tag_field="kind"):
    """Resizes and reads of one VM, or of every VM on one node, fail for ``for_seconds``."""

    at_seconds: Seconds
    for_seconds: PositiveSeconds
    vm: Name | None = None
    node: Name | None = None
    is_retryable: bool = True

    def __post_init__(self) -> None:
        if (self.vm is None) == (self.node is None):
            raise ValueError("name exactly one of vm, node")


Event = DeleteVm | ExtenderRestart | HypervisorFail


class Agent(_Strict, frozen=True, kw_only=True):
    """The agent's knobs (``autoscaler_agent.core.CoreConfig``); defaults are the agent's."""

    scrape_interval_seconds: PositiveSeconds = 1.0
    target_load_per_vcpu: LoadPerVcpu = 0.9
    shrink_load_per_vcpu: LoadPerVcpu = 0.6
    shrink_after_seconds: Seconds = 30.0
    permit_retry_seconds: Seconds = 5.0


class MemoryPolicy(_Strict, frozen=True, kw_only=True):
    """The agent's memory policy knobs (``autoscaler_agent.memory_policy.MemoryPolicyConfig``,
    which explains each); the defaults are the agent's."""

    # Shares of what the guest uses, which headroom may exceed (as in the agent's config).
    low_headroom_fraction: Annotated[float, msgspec.Meta(ge=0, le=100)] = 0.2
    target_headroom_fraction: Annotated[float, msgspec.Meta(ge=0, le=100)] = 0.5
    min_headroom: Quantity = "128Mi"
    lookahead_seconds: Seconds = 3.0
    shrink_after_seconds: Seconds = 30.0

    def __post_init__(self) -> None:
        if self.target_headroom_fraction <= self.low_headroom_fraction:
            raise ValueError(
                "target_headroom_fraction must be above low_headroom_fraction (or sizes flap)"
            )


class Timing(_Strict, frozen=True, kw_only=True):
    """How long the simulated world takes. Units are in the names."""

    resize_seconds: Seconds = 2.0
    # Plugging or unplugging memory (virtio-mem) to the size asked.
    memory_resize_seconds: Seconds = 3.0
    read_seconds: Seconds = 0.05
    # From a VM's request to the answer of its node's batch (the agent's batch window + RTT).
    extender_latency_seconds: Seconds = 0.05
    # How long a request to a dead extender hangs before the agent sees the failure.
    extender_timeout_seconds: Seconds = 2.0
    # How often an agent with nothing to ask sends an empty batch to learn the extender's
    # epoch (the real agent's extender.epoch_check_seconds): after a restart, a node's VMs
    # report within this long.
    epoch_check_seconds: PositiveSeconds = 5.0
    # From a permit to its pod annotation landing on the API server; lost if the extender dies.
    durability_delay_seconds: Seconds = 1.0
    # kube-scheduler's retry of a pending pod.
    schedule_retry_seconds: PositiveSeconds = 10.0
    recommend_interval_seconds: PositiveSeconds = 30.0
    load_quantum_seconds: PositiveSeconds = 15.0
    # Plot and report series resolution.
    sample_interval_seconds: PositiveSeconds = 10.0
    # Full invariant checks (ledger.check_invariants, leaks, permits): 0 = after every event
    # time; otherwise every so many seconds (fleet runs), cheap checks still run at every step.
    check_interval_seconds: Seconds = 0.0


class Moves(_Strict, frozen=True, kw_only=True):
    """How live moves behave in the simulated world, and how often relief is decided."""

    # How often the extender plans relief (``core.relief.plan_moves``).
    interval_seconds: PositiveSeconds = 10.0
    # A move's time: the fixed part (pods, QEMU start, cut-over) plus memory copied (Neon's
    # published figure: an 8 GiB guest in 128 s, 16 s per GiB).
    fixed_seconds: Seconds = 5.0
    seconds_per_gib: Seconds = 16.0
    # Share of moves that fail at their end (the VM stays on its node, its target released).
    failure_rate: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0


class Scenario(_Strict, frozen=True, kw_only=True):
    name: Name
    duration_seconds: PositiveSeconds
    # What the scenario shows and what to expect, printed under the summary's title.
    description: str = ""
    seed: Int64 = 0
    load1_model: Load1Model = Load1Model.KERNEL
    strategy: Strategy = Strategy.SPREAD
    agent: Agent = msgspec.field(default_factory=Agent)
    memory_policy: MemoryPolicy = msgspec.field(default_factory=MemoryPolicy)
    timing: Timing = msgspec.field(default_factory=Timing)
    nodes: list[Node] = msgspec.field(default_factory=list)
    node_pools: list[NodePoolSpec] = msgspec.field(default_factory=list)
    traces: dict[Name, Trace] = msgspec.field(default_factory=dict)
    vms: list[Vm] = msgspec.field(default_factory=list)
    foreign_pods: list[ForeignPod] = msgspec.field(default_factory=list)
    events: list[Event] = msgspec.field(default_factory=list)
    # Per-namespace quotas for the admission queue; none: unlimited.
    quotas: QuotaConfig | None = None
    # VMs drawn in the plot (at most 8 are kept); none: the first ones by name.
    plot_vms: list[Name] | None = None
    # Relief and live drain (``scheduler_extender.core.relief``); none: VMs never move.
    relief: ReliefConfig | None = None
    moves: Moves = msgspec.field(default_factory=Moves)


class ScenarioError(ValueError):
    """A scenario that cannot run; every message names its ``$.path``."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


Segments = tuple[tuple[float, float], ...]  # (from_seconds, demand_vcpus), sorted, from 0


def parse_scenario(text: str | bytes, *, base_dir: Path | None = None) -> Scenario:
    """YAML text -> a checked Scenario with its CSV traces read; ScenarioError with paths."""
    try:
        data = load_strict(text)
    except yaml.YAMLError as e:
        raise ScenarioError([f"not valid YAML - at `$`: {describe_yaml_error(e)}"]) from e
    _check_traces_first(data)
    try:
        scenario = msgspec.convert(data, Scenario)
    except msgspec.ValidationError as e:
        raise ScenarioError([str(e)]) from e
    errors = check_scenario(scenario)
    if errors:
        raise ScenarioError(errors)
    if base_dir is not None:
        scenario = _read_csv_traces(scenario, base_dir)
    return scenario


def _check_traces_first(data: object) -> None:
    """msgspec names a dict entry ``$.traces[...]``; convert each trace alone to say which."""
    traces = data.get("traces") if isinstance(data, dict) else None
    if not isinstance(traces, dict):
        return
    for name, trace in traces.items():
        try:
            msgspec.convert(trace, Trace)
        except msgspec.ValidationError as e:
            message = str(e).replace("at `$", f"at `$.traces.{name}", 1)
            raise ScenarioError([message]) from e


def load_scenario_file(path: Path) -> Scenario:
    try:
        text = path.read_bytes()
    except OSError as e:
        raise ScenarioError([f"cannot read {path}: {e.strerror} - at `$`"]) from e
    return parse_scenario(text, base_dir=path.parent)


def check_scenario(s: Scenario) -> list[str]:
    """Cross-field rules msgspec cannot express, every error with its path."""
    errors: list[str] = []

    def unique(items: list[str], what: str) -> None:
        seen: set[str] = set()
        for i, name in enumerate(items):
            if name in seen:
                errors.append(f"duplicate {what} name {name!r} - at `$.{what}s[{i}].name`")
            seen.add(name)

    unique([n.name for n in s.nodes], "node")
    unique([v.name for v in s.vms], "vm")
    unique([p.name for p in s.node_pools], "node_pool")
    node_names = {n.name for n in s.nodes}
    vm_names = {v.name for v in s.vms}
    for i, n in enumerate(s.nodes):
        _quantity(n.cpu, "cpu", f"$.nodes[{i}].cpu", errors)
        _quantity(n.memory, "memory", f"$.nodes[{i}].memory", errors)
    for i, p in enumerate(s.node_pools):
        _quantity(p.cpu, "cpu", f"$.node_pools[{i}].cpu", errors)
        _quantity(p.memory, "memory", f"$.node_pools[{i}].memory", errors)
    _quantity(s.memory_policy.min_headroom, "memory", "$.memory_policy.min_headroom", errors)
    for i, vm in enumerate(s.vms):
        _quantity(vm.memory, "memory", f"$.vms[{i}].memory", errors)
        _quantity(vm.memory_unit, "memory", f"$.vms[{i}].memory_unit", errors)
        if vm.max_memory is not None:
            _quantity(vm.max_memory, "memory", f"$.vms[{i}].max_memory", errors)
            if not errors and bytes_of(vm.max_memory) < bytes_of(vm.memory):
                errors.append(f"max_memory is below memory - at `$.vms[{i}].max_memory`")
        last = -1.0
        for j, use in enumerate(vm.memory_used or ()):
            _quantity(use.used, "memory", f"$.vms[{i}].memory_used[{j}].used", errors)
            if use.at_seconds <= last:
                errors.append(f"at_seconds must increase - at `$.vms[{i}].memory_used[{j}]`")
            last = use.at_seconds
        if vm.node is not None and vm.node not in node_names:
            errors.append(f"unknown node {vm.node!r} - at `$.vms[{i}].node`")
        if isinstance(vm.trace, str) and vm.trace not in s.traces:
            errors.append(f"unknown trace {vm.trace!r} - at `$.vms[{i}].trace`")
        if isinstance(vm.trace, list):
            _check_pieces(vm.trace, f"$.vms[{i}].trace", errors)
    for name, trace in s.traces.items():
        if isinstance(trace, list):
            _check_pieces(trace, f"$.traces.{name}", errors)
    for i, fp in enumerate(s.foreign_pods):
        _quantity(fp.cpu, "cpu", f"$.foreign_pods[{i}].cpu", errors)
        _quantity(fp.memory, "memory", f"$.foreign_pods[{i}].memory", errors)
        if fp.node is not None and fp.node not in node_names:
            errors.append(f"unknown node {fp.node!r} - at `$.foreign_pods[{i}].node`")
        if fp.end_seconds is not None and fp.end_seconds <= fp.start_seconds:
            errors.append(f"ends before it starts - at `$.foreign_pods[{i}].end_seconds`")
    for i, ev in enumerate(s.events):
        target = getattr(ev, "vm", None)
        if target is not None and target not in vm_names:
            errors.append(f"unknown vm {target!r} - at `$.events[{i}].vm`")
        node = getattr(ev, "node", None)
        if node is not None and node not in node_names:
            errors.append(f"unknown node {node!r} - at `$.events[{i}].node`")
    for i, name in enumerate(s.plot_vms or ()):
        if name not in vm_names:
            errors.append(f"unknown vm {name!r} - at `$.plot_vms[{i}]`")
    return errors


def _quantity(value: Quantity, kind: str, path: str, errors: list[str]) -> None:
    try:
        amount = cpu_millis(str(value)) if kind == "cpu" else memory_bytes(str(value))
    except QuantityError as e:
        errors.append(f"{e} - at `{path}`")
        return
    if amount <= 0:
        errors.append(f"must be positive - at `{path}`")


def _check_pieces(pieces: list[Piece], path: str, errors: list[str]) -> None:
    last = -1.0
    for j, piece in enumerate(pieces):
        if piece.at_seconds <= last:
            errors.append(f"at_seconds must increase - at `{path}[{j}].at_seconds`")
        last = piece.at_seconds
    if pieces and pieces[0].ramp is not None:
        errors.append(f"a trace cannot start with a ramp (from what?) - at `{path}[0]`")


def _read_csv_traces(s: Scenario, base_dir: Path) -> Scenario:
    traces: dict[str, Trace] = {}
    for name, trace in s.traces.items():
        if isinstance(trace, CsvTrace):
            path = base_dir / trace.csv
            try:
                text = path.read_text()
            except OSError as e:
                raise ScenarioError(
                    [f"cannot read {path}: {e.strerror} - at `$.traces.{name}.csv`"]
                ) from e
            traces[name] = parse_csv_trace(text, path=f"$.traces.{name}.csv")
        else:
            traces[name] = trace
    return msgspec.structs.replace(s, traces=traces)


def parse_csv_trace(text: str, *, path: str) -> list[Piece]:
    """``seconds,vcpus`` rows (a header row is allowed) -> level pieces."""
    pieces: list[Piece] = []
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or (lineno == 1 and not _is_number(row[0])):
            continue
        if len(row) != 2 or not (_is_number(row[0]) and _is_number(row[1])):
            raise ScenarioError([f"line {lineno}: expected `seconds,vcpus` - at `{path}`"])
        at, level = float(row[0]), float(row[1])
        if level < 0 or (pieces and at <= pieces[-1].at_seconds):
            raise ScenarioError(
                [f"line {lineno}: seconds must increase, vcpus be >= 0 - at `{path}`"]
            )
        pieces.append(Piece(at_seconds=at, level_vcpus=level))
    return pieces


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


IDLE_VCPUS: Final = 0.1


def segments(pieces: list[Piece] | None, *, quantum_seconds: float, end_seconds: float) -> Segments:
    """A trace as piecewise-constant demand: ``((from_seconds, vcpus), ...)`` starting at 0.

    Ramps and sines are sampled at the middle of each quantum, so their average is kept; equal
    neighbours are merged, so a flat stretch is one segment however long it lasts.
    """
    if not pieces:
        return ((0.0, IDLE_VCPUS),)
    out: list[tuple[float, float]] = []

    def add(at: float, level: float) -> None:
        level = round(level, 6)
        if out and out[-1][1] == level:
            return
        if out and out[-1][0] == at:
            out[-1] = (at, level)
        else:
            out.append((at, level))

    level = IDLE_VCPUS if pieces[0].at_seconds > 0 else 0.0
    add(0.0, level)
    for i, p in enumerate(pieces):
        until = pieces[i + 1].at_seconds if i + 1 < len(pieces) else end_seconds
        until = min(until, end_seconds)
        if p.level_vcpus is not None:
            level = p.level_vcpus
            add(p.at_seconds, level)
        elif p.ramp is not None:
            start, r = level, p.ramp
            t = p.at_seconds
            while t < min(until, p.at_seconds + r.over_seconds):
                mid = min(t + quantum_seconds / 2, p.at_seconds + r.over_seconds)
                add(t, start + (r.to_vcpus - start) * (mid - p.at_seconds) / r.over_seconds)
                t += quantum_seconds
            level = r.to_vcpus
            if t < until:
                add(t, level)
        elif p.sine is not None:
            sn = p.sine
            t = p.at_seconds
            while t < until:
                mid = t + quantum_seconds / 2 - p.at_seconds
                level = sn.mean_vcpus + sn.amplitude_vcpus * math.sin(
                    2 * math.pi * mid / sn.period_seconds
                )
                add(t, max(0.0, level))
                t += quantum_seconds
        elif p.noise is not None:
            nz = p.noise
            draws = random.Random(f"{nz.seed}:{p.at_seconds}")  # repeatable, see Noise
            t = p.at_seconds
            while t < until:
                level = nz.mean_vcpus + nz.amplitude_vcpus * (2 * draws.random() - 1)
                add(t, max(0.0, level))
                t += nz.step_seconds
    return tuple(out)


def trace_of(s: Scenario, vm: Vm) -> list[Piece] | None:
    if vm.trace is None:
        return None
    if isinstance(vm.trace, str):
        trace = s.traces[vm.trace]
        assert not isinstance(trace, CsvTrace), "CSV traces are read when the file is loaded"
        return trace
    return vm.trace


def milli(value: Quantity) -> int:
    return cpu_millis(str(value))


def bytes_of(value: Quantity) -> int:
    return memory_bytes(str(value))
