"""The simulation: the real pure cores of the extender and the agent, in virtual time.

Pure and deterministic: no I/O, no wall clock, no global state. Randomness comes only from
hashes of ``scenario.seed`` (the agents' backoff jitter, one stream per VM) and of each guest's
name (its run-queue noise), so the same scenario always gives the same ``Report``. The CLI,
the plot and the progress bar are the shell (``simulator.cli``); this module only returns
values.

What is real and what is simulated:

* **Real:** the extender's ``Ledger`` (accounting), its verbs as the server's handlers decide
  them (``simulator.scheduling``: ``core.verbs`` filter, prioritize and bind, and
  ``core.batches`` for one permit batch per node, as the agent's batcher sends them, with
  version negotiation and sequence numbers), the admission queue (``admission.queue.admit`` /
  ``recheck``), the recommender (``snapshot_from_ledger`` + ``recommend``), relief and live
  drain when the scenario has a ``relief`` section (``core.relief.plan_moves``, each move
  started with the ledger's ``reserve_move``; ``simulator.relief`` times them and draws their
  failures), and per VM the agent's
  ``VmState`` state machine with its policy, driven exactly as ``autoscaler_agent.runner`` does:
  ask ``next_actions(now)``, mark the action started, let time pass, feed the outcome back.
  The memory of VMs whose memory scales is decided by the same ``VmState``, with the agent's
  ``memory_policy``: one loop and one permit call per VM carry both resources, as the agent's.
* **Simulated:** the VMs (load, metrics, resize duration, a hypervisor that fails for a while),
  the guests' memory use (``simulator.world``: MemTotal is the VM's size, MemAvailable what
  its processes do not hold; plugging takes time, and a shrink ends where the guest stops
  giving memory back, as QEMU's virtio-mem does),
  the API server (pods, nodes, and the durable ``permitted-*`` annotations written by a
  durability writer that lags and loses unwritten permits when the extender dies),
  kube-scheduler's retry loop, the default scheduler placing foreign pods, and new nodes
  joining when the recommender asks for them.

Event-driven, not ticked. A queue ordered by time holds the next thing that happens. A VM costs
work only when its state machine asks to be woken (``wait_seconds``), an operation of it
completes, or its load trace reaches a breakpoint. A *settled* VM skips the scrapes that
cannot change its size (``simulator.settling`` says which), and is woken on its scrape grid, so
skipping changes how much work is done, never a decision. It does change when each wake-up
is queued, so the order in which one instant's events run: nothing that VMs share may depend
on that order. A node's permit batch is in the order sent, ties in VM order, and a
request made at its flush's instant goes in the next batch; each VM draws its own jitter.

A VM denied for want of room asks again every ``permit_retry_seconds``, and a node's batch that
changed nothing, asked again with the same calls while the node's ledger has not changed, is
answered as the extender answered it then, not decided again
(``simulator.scheduling.RepeatedBatches``; counted as ``permit_batches_repeated``): the same
answers from the same inputs, so it too changes how much work is done, never a decision, and
the report's other numbers are what deciding every batch gives.

This module is the event loop and what runs on it per event (each VM's agent loop, its
operations, the node's permit batches, placement): the hot path, kept in one class so that an
event costs no more calls than it must. What has another reason to change lives next to it:
``simulator.records`` (the per-VM, pod, node and extender state), ``simulator.settling`` (which
scrapes a settled VM may skip), ``simulator.extender_restarts`` (what a restarted extender
rebuilds), ``simulator.provisioning`` (the recommender and new nodes), ``simulator.invariants``
and ``simulator.measurements`` (step timings, plotted series, the ``Report``);
``simulator.split`` runs a scenario whose nodes share nothing as several of these, each over some
of its nodes (``only_nodes``), in processes of their own.

Invariants (``simulator.invariants``) are checked as the run goes, and a violation stops it
with a ``Violation`` saying what broke, when, and what happened just before. The cheap checks
run at every step; the full ones after every event time, or every
``timing.check_interval_seconds`` on fleet-sized runs.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections import deque
from collections.abc import Callable, Collection
from typing import Final

import msgspec

from autoscaler_agent.core import (
    Actions,
    CallKind,
    CoreConfig,
    PermitCall,
    PermitOutcome,
    Resource,
    VmState,
)
from autoscaler_agent.memory_policy import MemoryPolicyConfig
from autoscaler_agent.policy import PolicyConfig, PolicyState, Samples
from autoscaler_agent.wire import resource_request
from protocol.annotations import VmSpec
from protocol.permits import PodRef, ResourceRequest
from scheduler_extender.admission import queue as adm
from scheduler_extender.admission.quota import QuotaConfig
from scheduler_extender.core.ledger import LedgerError
from scheduler_extender.core.podinfo import Demand
from scheduler_extender.core.refusals import Refused
from scheduler_extender.core.relief import PlannedMove, plan_moves
from simulator import scenario as sc
from simulator.extender_restarts import (
    epoch_seen_after,
    rebuild_extender,
    restart_detail,
    vms_by_node,
)
from simulator.invariants import (
    InvariantViolation,
    check_all,
    check_decision,
    check_memory_decision,
    check_reality,
    check_vms,
    violation_of,
)
from simulator.measurements import (
    MAX_PLOTTED,
    PlotSamples,
    build_report,
    check_step,
    close_step,
    track_step,
)
from simulator.provisioning import Provisioning
from simulator.records import (
    ExtenderLife,
    ForeignRecord,
    MemoryRecord,
    NodeRecord,
    VmRecord,
)
from simulator.relief import Flight, ReliefRun
from simulator.report import (
    LogEntry,
    RecommendationRecord,
    Report,
    Violation,
)
from simulator.scheduling import Answers, RepeatedBatches, bind, choose_node, permit_batch
from simulator.settling import Settling
from simulator.world import SEED_MIX, GuestLoad, given_back_to, memory_segments, mix64, used_at

MAX_LOG: Final = 400
RECENT: Final = 25


Hook = Callable[["Simulation", float], None]


def _sent_order(entry: tuple[VmRecord, PermitCall, int, float]) -> tuple[float, int]:
    return entry[3], entry[0].rank


class Simulation:
    """Runs one scenario. ``run()`` returns the Report; a violation ends the run early."""

    def __init__(
        self,
        scenario: sc.Scenario,
        *,
        after_step: Hook | None = None,
        skip_settled: bool = True,
        repeat_answers: bool = True,
        only_nodes: Collection[str] | None = None,
    ) -> None:
        """``only_nodes``: simulate only these of the scenario's nodes and the VMs bound to
        them, as they run in the whole scenario (``simulator.split`` says when that holds)."""
        self.s = scenario
        self.only_nodes = None if only_nodes is None else frozenset(only_nodes)
        # Off only in the tests that show skipping changes no decision.
        self.skip_settled = skip_settled
        # A permit batch that changed nothing, sent again to a node whose ledger stands still,
        # is answered as ``permit_batch`` answered it (``scheduling.RepeatedBatches``). Not with
        # quotas (a namespace's room moves with other nodes) nor relief (moves); off only in
        # the tests that show it changes nothing.
        self.repeats = (
            RepeatedBatches()
            if repeat_answers and scenario.quotas is None and scenario.relief is None
            else None
        )
        self.after_step = after_step
        a = scenario.agent
        mp = scenario.memory_policy
        self.core = CoreConfig(
            scrape_interval_seconds=a.scrape_interval_seconds,
            permit_retry_seconds=a.permit_retry_seconds,
            policy=PolicyConfig(
                target_load_per_vcpu=a.target_load_per_vcpu,
                shrink_load_per_vcpu=a.shrink_load_per_vcpu,
                shrink_after_seconds=a.shrink_after_seconds,
            ),
            memory=MemoryPolicyConfig(
                low_headroom_fraction=mp.low_headroom_fraction,
                target_headroom_fraction=mp.target_headroom_fraction,
                min_headroom_bytes=sc.bytes_of(mp.min_headroom),
                lookahead_seconds=mp.lookahead_seconds,
                shrink_after_seconds=mp.shrink_after_seconds,
            ),
        )
        self.timing = scenario.timing
        self.counts = dict.fromkeys(
            (
                "events",
                "scrapes",
                "scrapes_skipped",
                "permit_batches",
                "permit_batches_repeated",
                "permit_requests",
                "resizes",
                "placements",
                "full_checks",
                "extender_restarts",
            ),
            0,
        )
        self.settling = Settling(
            self.core, end_seconds=scenario.duration_seconds, counts=self.counts
        )
        # Bound once: _step calls these for every wake-up of a VM, and the hot path must not
        # pay for one more attribute lookup than it did when they were methods here.
        self._catch_up = self.settling.catch_up
        self._settled_until = self.settling.settled_until
        self.quotas = scenario.quotas or QuotaConfig()
        self.t = 0.0
        # The event queue: what happens next is the earliest time's oldest event, as a heap of
        # (t, sequence) would give it, but one heap entry per distinct time. Events crowd onto
        # few instants (every VM scrapes on the same grid), so a heap of all of them would
        # spend most of its time comparing entries that share their time.
        self._times: list[float] = []  # a heap: the times that have events queued
        self._queued: dict[float, deque[tuple[float, Callable[[int], None], int]]] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.node_names: list[str] = []
        ranked = list(enumerate(scenario.vms))
        if self.only_nodes is not None:
            ranked = [(r, v) for r, v in ranked if v.node in self.only_nodes]
        self.vms = [
            VmRecord(
                i,
                v,
                VmSpec(
                    min_vcpus=v.min_vcpus,
                    max_vcpus=v.max_vcpus,
                    scaling_unit=v.scaling_unit,
                    min_memory_bytes=sc.bytes_of(v.memory),
                    max_memory_bytes=sc.bytes_of(v.max_memory or v.memory),
                    memory_unit_bytes=sc.bytes_of(v.memory_unit),
                    is_movable=not v.never_move,
                ),
                sc.bytes_of(v.memory),
                rank=r,
            )
            for i, (r, v) in enumerate(ranked)
        ]
        self.vm_by_name = {v.spec.name: v for v in self.vms}
        for vm in self.vms:
            vm.jitter_mix = ((scenario.seed << 32) | vm.rank) * SEED_MIX
        self.segments = [
            sc.segments(
                sc.trace_of(scenario, v.spec),
                quantum_seconds=self.timing.load_quantum_seconds,
                end_seconds=scenario.duration_seconds,
            )
            for v in self.vms
        ]
        self.foreign = [ForeignRecord(i, p) for i, p in enumerate(scenario.foreign_pods)]
        # The API server's durable record: uid -> permitted vCPUs annotation.
        self.annotations: dict[str, int] = {}
        # ... and uid -> permitted memory, for VMs whose memory scales.
        self.memory_annotations: dict[str, int] = {}
        # Of the whole scenario: it shapes the report, which a part's must share.
        self.has_memory = any(
            sc.bytes_of(v.max_memory or v.memory) > sc.bytes_of(v.memory) for v in scenario.vms
        )
        self.extender: ExtenderLife | None = None
        # The agents' last permit-request seq per VM uid (theirs: it survives the extender).
        self.seqs: dict[str, int] = {}
        self.epoch = 0
        # Permit batches by id, each with its node; and each node's open one, with the time its
        # window closes (when its flush is queued).
        self.batches: dict[int, tuple[str, list[tuple[VmRecord, PermitCall, int, float]]]] = {}
        self._open_batches: dict[str, tuple[int, float]] = {}
        self._batch_ids = 0
        self.pending: list[VmRecord] = []
        self._schedule_queued = False
        self.provisioning = Provisioning(scenario.node_pools)
        self.recommendations: list[RecommendationRecord] = []
        self.log: list[LogEntry] = []
        # The last things that happened, formatted only if a violation needs them: the hot
        # path (every grant, every resize) must not pay for f-strings nobody reads.
        self.recent: deque[tuple[float, str, str, str, tuple[object, ...]]] = deque(maxlen=RECENT)
        self.violation: Violation | None = None
        # The check intervals that had events (see _checks_between).
        self.check_cells: list[int] = []
        # The VMs this instant's events touched (their agents stepped, or deleted): checked
        # (``check_vms``) as time moves on, when ``check_all`` runs on an interval.
        self._touched: list[VmRecord] = []
        names = scenario.plot_vms or sorted(v.name for v in scenario.vms)
        plotted = names[:MAX_PLOTTED]
        if self.only_nodes is not None:
            plotted = [n for n in plotted if n in self.vm_by_name]
        self.samples = PlotSamples(
            [self.vm_by_name[n] for n in plotted], has_memory=self.has_memory
        )
        self._pending_reason: dict[str, str] = {}
        # Stable small ints for nodes (heap payloads); node_names is re-sorted as nodes join.
        self._node_by_id: list[str] = []
        # The VMs on each node when the extender last restarted (for the agents' reports).
        self._vms_by_node: dict[str, list[VmRecord]] = {}
        # Relief (``simulator.relief``): None without a ``relief`` section, and then nothing
        # of it runs.
        self.relief = (
            None
            if scenario.relief is None
            else ReliefRun(scenario.relief, scenario.moves, seed=scenario.seed)
        )

    # -- the event queue -------------------------------------------------------------------

    def at(self, t: float, handler: Callable[[int], None], arg: int = 0) -> None:
        queue = self._queued.get(t)
        if queue is None:
            queue = self._queued[t] = deque()
            heapq.heappush(self._times, t)
        queue.append((t, handler, arg))

    def note(self, kind: str, subject: str, detail: str = "", *, keep: bool = True) -> None:
        self.recent.append((self.t, kind, subject, "{}", (detail,)))
        if keep and len(self.log) < MAX_LOG:
            entry = LogEntry(at_seconds=round(self.t, 3), kind=kind, subject=subject, detail=detail)
            self.log.append(entry)

    def trace(self, kind: str, subject: str, fmt: str, *args: object) -> None:
        """A note for the violation report only, formatted lazily."""
        self.recent.append((self.t, kind, subject, fmt, args))

    # -- the run ---------------------------------------------------------------------------

    def run(self, *, progress: Callable[[float], None] | None = None) -> Report:
        s = self.s
        for n in s.nodes:
            if self.only_nodes is not None and n.name not in self.only_nodes:
                continue
            self._add_node(n.name, Demand(sc.milli(n.cpu), sc.bytes_of(n.memory)), n.pool, n.zone)
        for vm in self.vms:
            if vm.spec.node is not None and vm.spec.start_seconds == 0:
                self._bind(vm, vm.spec.node, decided=False)
            else:
                self.at(vm.spec.start_seconds, self._vm_created, vm.index)
        self._start_extender(0)
        for f in self.foreign:
            self.at(f.spec.start_seconds, self._foreign_started, f.index)
        for i, ev in enumerate(s.events):
            self.at(ev.at_seconds, self._scenario_event, i)
        self.at(0.0, self._sample)
        if s.node_pools:
            self.at(self.timing.recommend_interval_seconds, self._recommend)
        if self.relief is not None and self.relief.config.enabled:
            self.at(s.moves.interval_seconds, self._relieve)
        end = s.duration_seconds
        next_progress = 0.0
        times, queued = self._times, self._queued
        counts, after_step = self.counts, self.after_step
        try:
            while times and times[0] <= end:
                key = times[0]
                queue = queued[key]
                popleft = queue.popleft
                # One instant's events, oldest first; an event handled at this instant may
                # queue another one at it, which joins this queue.
                while queue:
                    # Its own t: equal to the key, but maybe an int where the key is a float.
                    t, handler, arg = popleft()
                    if t > self.t:
                        self._checks_between(t)
                    self.t = t
                    counts["events"] += 1
                    handler(arg)
                    if after_step is not None:
                        after_step(self, t)
                    if progress is not None and t >= next_progress:
                        progress(t)
                        next_progress = t + end / 200
                del queued[key]
                if times[0] == key:
                    heapq.heappop(times)
                else:  # something was queued in the past: never, but the heap must hold
                    times.remove(key)
                    heapq.heapify(times)
            self.t = max(self.t, end)
            self.full_check()
        except InvariantViolation as e:
            self.violation = violation_of(e, at=self.t, recent=self.recent)
        if progress is not None:
            progress(self.t)
        return build_report(
            self.s,
            end=self.t,
            vms=self.vms,
            nodes=self.nodes,
            pending=self.pending,
            violation=self.violation,
            counts=self.counts,
            recommendations=self.recommendations,
            log=self.log,
            samples=self.samples,
            has_memory=self.has_memory,
            relief=None if self.relief is None else self.relief.summary(self.vms, end=self.t),
        )

    def _checks_between(self, t: float) -> None:
        """Time is about to move on to ``t``: every event of this instant has been handled.
        With a check interval, the full check runs as time leaves one interval of the grid
        ``k * interval`` for a later one: which intervals had events, not how far apart
        events were, decides when (so a part of a split run checks where the whole does)."""
        interval = self.timing.check_interval_seconds
        if interval <= 0:
            self.full_check()
            return
        touched = self._touched
        if touched:
            self._touched = []
            check_vms(self.extender, touched)
        cell = int(t // interval)
        if not self.check_cells:
            self.check_cells.append(int(self.t // interval))
        if cell != self.check_cells[-1]:
            self.check_cells.append(cell)
            self.full_check()

    def full_check(self) -> None:
        self.counts["full_checks"] += 1
        check_all(self.extender, self.vms, self.foreign)

    # -- nodes -------------------------------------------------------------------------------

    def _add_node(self, name: str, allocatable: Demand, pool: str, zone: str) -> None:
        node = NodeRecord(name, allocatable, pool, zone, self.t)
        self.nodes[name] = node
        self.node_names = sorted(self.nodes)
        self._node_by_id.append(name)
        self.samples.node_added(name)
        if self.extender is not None:
            self.extender.ledger.upsert_node(name, allocatable=allocatable, labels=node.labels)

    def _reality(self, node_name: str, delta_millis: int) -> None:
        node = self.nodes[node_name]
        node.reality_millis += delta_millis
        over = node.reality_millis > node.usable.cpu_millis
        if over and node.overcommit_since is None:
            node.overcommit_since = self.t
            self.note("overcommitted", node_name, f"{node.reality_millis}m running")
        elif not over and node.overcommit_since is not None:
            node.overcommit_seconds += self.t - node.overcommit_since
            node.overcommit_since = None

    def _ledger_changed(self, name: str) -> None:
        if self.repeats is not None:
            self.repeats.node_changed(name)
        ext = self.extender
        node = self.nodes.get(name)
        if ext is None or node is None:
            return
        state = ext.ledger.nodes.get(name)
        if state is not None:
            # ``state.allocated.cpu_millis`` without making the Demand: every permit calls this.
            cpu = state.own_total.cpu_millis + state.foreign_total.cpu_millis
            node.peak_reserved = max(node.peak_reserved, cpu)
            if self.has_memory:
                memory = state.own_total.memory_bytes + state.foreign_total.memory_bytes
                node.peak_reserved_memory = max(node.peak_reserved_memory, memory)

    # -- the extender's lives ------------------------------------------------------------------

    def _start_extender(self, _: int) -> None:
        """A fresh extender lists nodes and pods from the API server and rebuilds its ledger."""
        self.epoch += 1
        if self.repeats is not None:
            self.repeats.clear()
        ext, pods = rebuild_extender(
            epoch=self.epoch,
            quotas=self.quotas,
            nodes=self.nodes.values(),
            vms=self.vms,
            foreign=self.foreign,
            pending=self.pending,
            annotations=self.annotations,
            memory_annotations=self.memory_annotations,
            now=self.t,
            on_change=self._ledger_changed,
        )
        self.extender = ext
        if self.epoch > 1:
            self.counts["extender_restarts"] += 1
            self.note(
                "extender_started", f"epoch {self.epoch}", restart_detail(ext, self.vms, pods)
            )
        self._queue_schedule(self.t)
        if self.vms:
            # The first epoch an agent sees counts too: the extender may have found its VMs
            # already running (all of them, when the scenario starts them bound).
            self._vms_by_node = vms_by_node(self.vms)
            period = self.timing.epoch_check_seconds
            for node_id, name in enumerate(self._node_by_id):
                self.at(self.t + epoch_seen_after(name, period), self._agents_learn_epoch, node_id)

    def _agents_learn_epoch(self, node_id: int) -> None:
        """Every VM on the node reports its size and permit to the restarted extender."""
        name = self._node_by_id[node_id]
        if self.extender is None:
            return
        interval = self.core.scrape_interval_seconds
        for vm in self._vms_by_node.get(name, ()):
            if vm.node != name or vm.is_deleted or vm.agent is None or vm.guest is None:
                continue
            if vm.is_settled:
                # This wake-up is off the VM's scrape grid: catch up to the last grid point
                # before it (not to "one interval before now", as a grid wake-up does), so
                # that skipping still changes no decision.
                k = math.floor((self.t - vm.last_scrape_at) / interval + 1e-9)
                self.settling.catch_up(vm, vm.agent, vm.guest, vm.last_scrape_at + k * interval)
                vm.is_settled = False
            vm.agent.extender_restarted(self.t)
            self._step(vm)

    def _kill_extender(self) -> None:
        self.extender = None
        self.note("extender_killed", f"epoch {self.epoch}", "ledger and unwritten permits lost")

    # -- kube-scheduler + the extender's filter/prioritize/bind ---------------------------------

    def _queue_schedule(self, t: float) -> None:
        if self.pending and not self._schedule_queued:
            self._schedule_queued = True
            self.at(t, self._schedule)

    def _schedule(self, _: int) -> None:
        self._schedule_queued = False
        ext = self.extender
        if ext is None:
            self._queue_schedule(self.t + self.timing.schedule_retry_seconds)
            return
        still: list[VmRecord] = []
        names = self.node_names
        if self.relief is not None and self.relief.closed:
            names = [n for n in names if n not in self.relief.closed]
        for vm in sorted(self.pending, key=lambda v: (-v.spec.priority, v.rank)):
            if vm.is_deleted:
                continue
            info = vm.info(node=None, permitted=None)
            choice = choose_node(ext, info, names, now=self.t, strategy=self.s.strategy)
            if choice.node is None:
                assert choice.kind is not None
                self._note_pending(vm, choice.kind, choice.reason)
                still.append(vm)
                continue
            before = ext.ledger.nodes[choice.node].free.cpu_millis
            decided = bind(ext, info, choice.node, now=self.t)
            if not decided.is_reserved:
                self.note("bind_failed", vm.spec.name, decided.error)
                still.append(vm)
                continue
            check_decision(ext.ledger, choice.node, before, f"bind of {vm.spec.name}")
            self._bind(vm, choice.node, decided=True)
        self.pending = still
        adm.recheck(ext.admission, now=self.t)
        self._queue_schedule(self.t + self.timing.schedule_retry_seconds)

    def _note_pending(self, vm: VmRecord, kind: str, reason: str) -> None:
        # kube-scheduler retries every few seconds: keep the first of a run of equal reasons.
        is_new = self._pending_reason.get(vm.uid) != reason
        self._pending_reason[vm.uid] = reason
        self.note(kind, vm.spec.name, reason, keep=is_new)

    def _bind(self, vm: VmRecord, node: str, *, decided: bool) -> None:
        """The Binding lands: the pod runs on ``node``, the VM boots, its agent starts."""
        vm.node = node
        vm.is_pending = False
        vm.placed_at = self.t
        ext = self.extender
        if ext is not None:
            ext.ledger.observe_pod(vm.info(node=node, permitted=None), at=self.t)
            entry = ext.ledger.pods[vm.uid]
            vm.vcpus = vm.granted = entry.vcpus or vm.spec.min_vcpus
        vm.peak = max(vm.peak, vm.vcpus)
        self._reality(node, vm.vcpus * 1000)
        if decided:
            check_reality(self.nodes[node], ext, f"{vm.spec.name} was bound at {vm.vcpus} vCPUs")
        vm.guest = GuestLoad(
            self.segments[vm.index],
            model=self.s.load1_model,
            vcpus=vm.vcpus,
            t=self.t,
            target_load_per_vcpu=self.s.agent.target_load_per_vcpu,
            # The guest's own noise, from its name: the scenario's seed is the agent's jitter.
            noise_seed=zlib.crc32(vm.uid.encode()),
        )
        # The report has no use for the goals' reason sentences: the same decisions, unworded.
        vm.agent = VmState(spec=vm.vm_spec, config=self.core, now=self.t, explain=False)
        self.counts["placements"] += 1
        self.note("placed", vm.spec.name, f"on {node} at {vm.vcpus} vCPUs", keep=decided)
        if vm.vm_spec.max_memory_bytes > vm.vm_spec.min_memory_bytes:
            size = vm.vm_spec.min_memory_bytes
            if ext is not None:
                size = ext.ledger.pods[vm.uid].memory_bytes or size
            uses = [
                (u.at_seconds, sc.bytes_of(u.used), u.over_seconds)
                for u in vm.spec.memory_used or ()
            ]
            vm.mem = MemoryRecord(
                memory_segments(uses, vm.memory, step_seconds=self.core.scrape_interval_seconds),
                size,
            )
        track_step(vm, self.core.policy, self.t)
        bp = vm.guest.next_breakpoint()
        if bp is not None:
            self.at(bp, self._breakpoint, vm.index)
        self._wake(vm)

    def _vm_created(self, i: int) -> None:
        vm = self.vms[i]
        if vm.spec.node is not None:
            # Pre-bound (a running fleet): reality, not a decision of this extender.
            self._bind(vm, vm.spec.node, decided=False)
            return
        vm.is_pending = True
        self.pending.append(vm)
        if self.extender is not None:
            self.extender.admission.observe_pending(vm.info(node=None, permitted=None))
        self.note("created", vm.spec.name, "pending")
        self._queue_schedule(self.t)

    # -- foreign pods (the default scheduler) ---------------------------------------------------

    def _foreign_started(self, i: int) -> None:
        f = self.foreign[i]
        node = f.spec.node
        if node is None:
            fits = [
                n
                for n in self.node_names
                if self.nodes[n].usable.cpu_millis - self.nodes[n].reality_millis
                >= f.demand.cpu_millis
            ]
            if not fits:
                self.note("foreign_pending", f.spec.name, "no node has room; not placed")
                return
            node = max(
                fits, key=lambda n: self.nodes[n].usable.cpu_millis - self.nodes[n].reality_millis
            )
        f.node = node
        self._reality(node, f.demand.cpu_millis)
        if self.extender is not None:
            self.extender.ledger.observe_pod(f.info(), at=self.t)
        self.note("foreign_started", f.spec.name, f"on {node}, {f.demand.cpu_millis}m")
        if f.spec.end_seconds is not None:
            self.at(f.spec.end_seconds, self._foreign_ended, i)

    def _foreign_ended(self, i: int) -> None:
        f = self.foreign[i]
        if f.node is None:
            return
        self._reality(f.node, -f.demand.cpu_millis)
        f.node = None  # ended (or evicted): its later end, if any, finds nothing
        if self.extender is not None:
            self.extender.ledger.forget_pod(f.uid)
        self.note("foreign_ended", f.spec.name, f"left {f.node}")
        f.node = None
        self._queue_schedule(self.t)

    # -- scenario events -----------------------------------------------------------------------

    def _scenario_event(self, i: int) -> None:
        ev = self.s.events[i]
        if isinstance(ev, sc.DeleteVm):
            self._delete_vm(self.vm_by_name[ev.vm])
        elif isinstance(ev, sc.ExtenderRestart):
            self._kill_extender()
            self.at(self.t + ev.down_seconds, self._start_extender)
        else:
            targets = (
                [self.vm_by_name[ev.vm]]
                if ev.vm is not None
                else [v for v in self.vms if v.node == ev.node]
            )
            for vm in targets:
                vm.hv_fail_until = self.t + ev.for_seconds
                vm.hv_retryable = ev.is_retryable
            self.note(
                "hypervisor_failing",
                ev.vm or ev.node or "",
                f"for {ev.for_seconds:.0f}s ({'retryable' if ev.is_retryable else 'fatal'})",
            )

    def _delete_vm(self, vm: VmRecord) -> None:
        self._touched.append(vm)
        vm.is_deleted = True
        vm.deleted_at = self.t
        vm.op_token += 1
        vm.wake_token += 1
        if vm.guest is not None:
            vm.guest.finish(self.t)
        close_step(vm, self.t, reached=False)
        self.annotations.pop(vm.uid, None)
        self.memory_annotations.pop(vm.uid, None)
        if vm.node is not None:
            self._reality(vm.node, -vm.vcpus * 1000)
        ext = self.extender
        if self.relief is not None:
            self.relief.vm_gone(vm.uid, now=self.t)
        if ext is not None:
            ext.ledger.forget_pod(vm.uid)
            ext.admission.forget(vm.uid)
            if vm.uid in ext.ledger.pods:
                raise InvariantViolation(
                    "leaked reservation", f"{vm.spec.name} was deleted but the ledger holds it"
                )
        self.note("deleted", vm.spec.name, f"gave back {vm.vcpus} vCPUs on {vm.node}")
        vm.agent = None
        self._queue_schedule(self.t)

    # -- one VM's agent loop (autoscaler_agent.runner, in virtual time) -------------------------

    def _wake(self, vm: VmRecord) -> None:
        vm.wake_token += 1
        self._step(vm)

    def _wake_event(self, token_and_index: int) -> None:
        vm = self.vms[token_and_index >> 32]
        if token_and_index & 0xFFFFFFFF == vm.wake_token & 0xFFFFFFFF and not vm.is_deleted:
            self._step(vm)

    def _step(self, vm: VmRecord) -> None:
        self._touched.append(vm)
        st = vm.agent
        guest = vm.guest
        if st is None or guest is None or vm.is_deleted:
            return
        t = self.t
        if vm.is_settled:
            self._catch_up(vm, st, guest, t - self.core.scrape_interval_seconds)
            vm.is_settled = False
        actions = st.next_actions(t)
        for _ in range(3):
            if actions.scrape:
                st.scrape_started(t)
                st.metrics_scraped(t, self._samples(vm, guest, t))
                vm.last_scrape_at = t
                self.counts["scrapes"] += 1
            started = self._start_op(vm, st, actions)
            if not actions.scrape or started:
                break
            actions = st.next_actions(t)
        # A VM whose memory scales is never settled: its guest's use moves on its own.
        if self.skip_settled and vm.op is None and vm.mem is None:
            until = self._settled_until(vm, st, guest, actions)
            if until is not None:
                vm.is_settled = True
                if until < math.inf:
                    self._wake_at(vm, until)
                return
        if actions.wait_seconds is not None:
            self._wake_at(vm, t + actions.wait_seconds)

    def _samples(self, vm: VmRecord, guest: GuestLoad, t: float) -> Samples:
        samples = guest.samples(t)
        m = vm.mem
        if m is None:
            return samples
        self._mem_account(vm, m)
        # MemTotal: the VM's size (no kernel reserve is modelled); MemAvailable: what the
        # guest's processes do not hold (the rest is free or page cache).
        return msgspec.structs.replace(
            samples,
            memory_total_bytes=float(m.size),
            memory_available_bytes=float(max(0, m.size - m.used)),
        )

    def _start_op(self, vm: VmRecord, st: VmState, actions: Actions) -> bool:
        t = self.t
        if actions.read_vcpus:
            st.vcpus_read_started(t)
            self._op(vm, "read", 0, t + self.timing.read_seconds)
            return True
        if actions.resize is not None and actions.resize.resource is Resource.MEMORY:
            target = actions.resize.target
            st.resize_started(t, Resource.MEMORY, target)
            m = vm.mem
            assert m is not None
            if target > m.granted and target > m.size:
                raise InvariantViolation(
                    "permit exceeded",
                    f"{vm.spec.name}: the agent plugs {target} bytes,"
                    f" but its memory permit is {m.granted}",
                )
            self._op(vm, "resize_memory", target, t + self.timing.memory_resize_seconds)
            return True
        if actions.resize is not None:
            target = actions.resize.target
            st.resize_started(t, Resource.VCPUS, target)
            if target > vm.granted:
                raise InvariantViolation(
                    "permit exceeded",
                    f"{vm.spec.name}: the agent resizes to {target} vCPUs,"
                    f" but its permit is {vm.granted}",
                )
            self._op(vm, "resize", target, t + self.timing.resize_seconds)
            return True
        call = actions.request_permit or actions.notify_extender
        if call is not None:
            st.permit_requested(t, call)
            vm.op = "permit"
            vm.op_token += 1
            node = vm.node
            assert node is not None
            open_batch = self._open_batches.get(node)
            if open_batch is not None and open_batch[1] > t:
                batch = self.batches[open_batch[0]][1]
            else:
                # A window closes at its flush's instant: a request made then goes in the next
                # batch, whether that flush has run yet or not. Which of one instant's events
                # runs first depends on when each was queued, and skipping settled VMs changes
                # that; no decision may depend on it.
                self._batch_ids += 1
                batch = []
                self.batches[self._batch_ids] = (node, batch)
                closes_at = t + self.timing.extender_latency_seconds
                self._open_batches[node] = (self._batch_ids, closes_at)
                self.at(closes_at, self._flush, self._batch_ids)
            batch.append((vm, call, vm.op_token, t))
            self.counts["permit_requests"] += 1
            return True
        return False

    def _op(self, vm: VmRecord, kind: str, value: int, done_at: float) -> None:
        vm.op = kind
        vm.op_value = value
        vm.op_token += 1
        self.at(done_at, self._op_done, (vm.index << 32) | (vm.op_token & 0xFFFFFFFF))

    def _op_done(self, token_and_index: int) -> None:
        index, token = divmod(token_and_index, 1 << 32)
        vm = self.vms[index]
        st = vm.agent
        if vm.is_deleted or st is None or token != vm.op_token & 0xFFFFFFFF:
            return
        t = self.t
        kind = vm.op
        vm.op = None
        failing = t < vm.hv_fail_until
        jitter = self._jitter(vm)
        if kind == "read":
            m = vm.mem
            if failing:
                st.vcpus_read_failed(t, "simulated hypervisor failure", jitter=jitter)
            elif m is None:
                st.vcpus_read(t, current_vcpus=vm.vcpus, max_vcpus=vm.spec.max_vcpus)
            else:
                st.vcpus_read(
                    t,
                    current_vcpus=vm.vcpus,
                    max_vcpus=vm.spec.max_vcpus,
                    current_memory=m.size,
                    max_memory=vm.vm_spec.max_memory_bytes,
                )
        elif kind == "resize_memory":
            target = vm.op_value
            if failing:
                vm.resize_errors += 1
                st.resize_failed(
                    t,
                    Resource.MEMORY,
                    "simulated hypervisor failure",
                    is_retryable=vm.hv_retryable,
                    jitter=jitter,
                )
            else:
                reached = self._mem_resized(vm, target)
                if reached == target:
                    st.resized(t, Resource.MEMORY, current=reached, maximum=None)
                else:
                    # QEMU's MemoryResizeIncomplete: the size the guest stopped at.
                    st.resize_failed(
                        t,
                        Resource.MEMORY,
                        "the guest holds the rest",
                        is_retryable=False,
                        jitter=jitter,
                        current=reached,
                    )
        elif kind == "resize":
            target = vm.op_value
            if failing:
                vm.resize_errors += 1
                st.resize_failed(
                    t,
                    Resource.VCPUS,
                    "simulated hypervisor failure",
                    is_retryable=vm.hv_retryable,
                    jitter=jitter,
                )
                self.trace("resize_failed", vm.spec.name, "to {} vCPUs", target)
            else:
                self._resized(vm, target)
                st.resized(t, Resource.VCPUS, current=target, maximum=vm.spec.max_vcpus)
        self._step(vm)

    def _jitter(self, vm: VmRecord) -> float:
        """The next value in [0, 1) of ``vm``'s agent's backoff jitter.

        Each VM has its own stream, a hash of (seed, VM, draw): with one stream for the run,
        which VM got which value depended on the order in which one instant's events ran, an
        accident of when each was queued that skipping settled VMs changes. (Agents on
        different nodes share no random state either.)"""
        vm.jitter_draws += 1
        return (mix64(vm.jitter_mix + vm.jitter_draws) >> 11) / 2**53

    def _resized(self, vm: VmRecord, target: int) -> None:
        previous = vm.vcpus
        if target == previous:
            return
        assert vm.guest is not None and vm.node is not None
        vm.guest.resized(self.t, target)
        vm.vcpus = target
        vm.peak = max(vm.peak, target)
        self.counts["resizes"] += 1
        if target > previous:
            vm.grows += 1
        else:
            vm.shrinks += 1
        self._reality(vm.node, (target - previous) * 1000)
        if target > previous:
            check_reality(
                self.nodes[vm.node],
                self.extender,
                f"{vm.spec.name} grew {previous} -> {target} vCPUs",
            )
        if target > vm.granted:
            raise InvariantViolation(
                "permit exceeded",
                f"{vm.spec.name} runs {target} vCPUs, its permit is {vm.granted}",
            )
        self.trace("resized", vm.spec.name, "{} -> {} vCPUs", previous, target)
        check_step(vm, self.t)

    def _flush(self, batch_id: int) -> None:
        """One batched POST /v1/permits for a node: every VM's request, decided by the extender's
        own batch rules (``scheduling.permit_batch``)."""
        node, batch = self.batches.pop(batch_id)
        if self._open_batches[node][0] == batch_id:
            del self._open_batches[node]
        live = [
            (vm, call, token, sent)
            for vm, call, token, sent in batch
            if not vm.is_deleted and vm.op_token == token and vm.agent is not None
        ]
        if not live:
            return
        # In the order sent, and requests sent at the same instant in the VMs' order: the order
        # in which one instant's events run is an accident of when each was queued (which
        # skipping settled VMs changes), and decide_batch shares out free room in batch order.
        live.sort(key=_sent_order)
        ext = self.extender
        t = self.t
        if ext is None:
            for vm, _, token, sent in live:
                fail_at = max(t, sent + self.timing.extender_timeout_seconds)
                self.at(fail_at, self._permit_timeout, (vm.index << 32) | (token & 0xFFFFFFFF))
            return
        self.counts["permit_batches"] += 1
        free = ext.ledger.nodes[node].free
        before, before_memory = free.cpu_millis, free.memory_bytes
        # As the extender decides it: negotiation, seqs, then each VM's decision (upscales
        # limited by namespace quotas; a namespace without one is unlimited). A batch that
        # changed nothing, sent again to a node whose ledger stands still, gets its answers
        # again (``RepeatedBatches``): VMs denied for want of room ask every few seconds.
        repeats = self.repeats
        decisions: Answers | None = None
        requests: list[ResourceRequest] = []
        key = None
        if repeats is not None and not ext.ledger.moves:
            key = tuple((vm.ref, call.kind, call.vcpus, call.memory) for vm, call, _, _ in live)
            decisions = repeats.answer(node, key, self.seqs)
        if decisions is not None:
            self.counts["permit_batches_repeated"] += 1
        else:
            requests = [
                resource_request(call, pod=vm.ref, node=node, spec=vm.vm_spec)
                for vm, call, _, _ in live
            ]
            if repeats is not None and key is not None:
                decisions = repeats.decide(ext, node, key, requests, self.seqs)
            else:
                decisions = permit_batch(ext, node, requests, self.seqs)
        if isinstance(decisions, Refused):
            raise InvariantViolation("permit batch refused", decisions.message)
        check_decision(ext.ledger, node, before, f"permit batch for {node}")
        if self.has_memory:
            check_memory_decision(ext.ledger, node, before_memory, f"permit batch for {node}")
        if self.relief is not None:
            self.relief.account(t)  # before the wants change
            self.relief.book.permits_decided(ext.ledger, requests, decisions, now=t)
        for (vm, call, _, _), decision in zip(live, decisions, strict=True):
            st = vm.agent
            assert st is not None
            vm.op = None
            permit = decision.permit
            if decision.refused is not None or permit.permit is None:
                vm.permit_errors += 1
                if vm.mem is not None:
                    vm.mem.permit_errors += 1
                error = decision.refused.message if decision.refused is not None else "no permit"
                st.permit_failed(t, error, jitter=self._jitter(vm))
                self.note("permit_error", vm.spec.name, error)
            else:
                vcpus = permit.permit.vcpus
                vm.granted = vcpus
                memory = permit.permit.memory_bytes if call.memory is not None else None
                outcome = st.permit_granted(t, vcpus, memory_bytes=memory, jitter=self._jitter(vm))
                if outcome is PermitOutcome.REJECTED:
                    raise InvariantViolation(
                        "permit protocol",
                        f"{vm.spec.name}: permit {vcpus} outside"
                        f" [{call.vcpus.usage}, {call.vcpus.requested}]",
                    )
                # Less than asked for (a notice is never short): per resource, so that the
                # memory table counts the memory denials and the CPU table the vCPU ones.
                is_ask = call.kind is not CallKind.NOTICE
                if is_ask and vcpus < call.vcpus.requested:
                    vm.denials += 1
                if memory is not None:
                    self._memory_granted(vm, call, memory, is_ask=is_ask)
                self.trace(
                    "permit_" + outcome.value,
                    vm.spec.name,
                    "asked {} (has {}): {}",
                    call.vcpus.requested,
                    call.vcpus.usage,
                    permit.reason,
                )
                if self.annotations.get(vm.uid) != vcpus:
                    self.at(
                        t + self.timing.durability_delay_seconds,
                        self._durable_write,
                        (vm.index << 32) | (ext.epoch << 16) | vcpus,
                    )
            self._step(vm)

    def _permit_timeout(self, token_and_index: int) -> None:
        index, token = divmod(token_and_index, 1 << 32)
        vm = self.vms[index]
        st = vm.agent
        if vm.is_deleted or st is None or token != vm.op_token & 0xFFFFFFFF:
            return
        vm.op = None
        vm.permit_errors += 1
        if vm.mem is not None:
            vm.mem.permit_errors += 1
        st.permit_failed(self.t, "extender unreachable (timeout)", jitter=self._jitter(vm))
        self.trace("permit_failed", vm.spec.name, "extender unreachable")
        self._step(vm)

    def _durable_write(self, packed: int) -> None:
        index, rest = divmod(packed, 1 << 32)
        epoch, vcpus = divmod(rest, 1 << 16)
        vm = self.vms[index]
        if vm.is_deleted or self.extender is None or self.extender.epoch != epoch:
            return  # the writer died with its extender: the agent's lastPermit covers it
        self.annotations[vm.uid] = vcpus

    # -- load --------------------------------------------------------------------------------

    def _breakpoint(self, i: int) -> None:
        vm = self.vms[i]
        guest = vm.guest
        if vm.is_deleted or guest is None:
            return
        st = vm.agent
        if not vm.is_settled or st is None or st.goal is None or st.vcpus.current is None:
            guest.advance_segment(self.t)
            track_step(vm, self.core.policy, self.t)
            self._next_breakpoint(vm, guest)
            return
        # A settled VM: its next scrape on the grid it kept (``wake_at``) is the first to see
        # the new level. What the scrape before it (``before_at``) would have left is worked
        # out now, while the guest is still at the old level.
        interval = self.core.scrape_interval_seconds
        periods = math.ceil((self.t - vm.last_scrape_at) / interval - 1e-9)
        wake_at = vm.last_scrape_at + periods * interval
        before_at = wake_at - interval
        catch_up = guest.projected_samples(before_at) if before_at > vm.last_scrape_at else None
        guest.advance_segment(self.t)
        track_step(vm, self.core.policy, self.t)
        self._next_breakpoint(vm, guest)
        # If the policy holds through the new level too, the VM stays settled and scrapes
        # nothing here (the skipped scrape before its eventual wake is taken then, from this
        # segment). Only with room for that: the next breakpoint two intervals away or more.
        nb = guest.next_breakpoint()
        until: float | None = None
        if nb is None or nb - self.t >= 2 * interval:
            before = st.goal.state
            if catch_up is not None:
                before = PolicyState(
                    cpu_seconds_total=catch_up.cpu_seconds_total,
                    cpu_idle_seconds_total=catch_up.cpu_idle_seconds_total,
                    cpu_count=catch_up.cpu_count,
                )
            until = self.settling.holds_until(
                vm, st, guest, current=st.vcpus.current, start=before_at, before=before
            )
        if until is not None and until > wake_at:
            if until < math.inf:
                self._wake_at(vm, until)
            else:
                vm.wake_token += 1  # the wake scheduled before is void: no scrape matters
            return
        if catch_up is not None:
            self.settling.skipped_scrape(vm, st, before_at, catch_up)
        self._wake_at(vm, wake_at)

    def _next_breakpoint(self, vm: VmRecord, guest: GuestLoad) -> None:
        bp = guest.next_breakpoint()
        if bp is not None:
            self.at(bp, self._breakpoint, vm.index)

    def _wake_at(self, vm: VmRecord, t: float) -> None:
        vm.wake_token += 1
        # ``at``, inlined: every step of every VM ends here.
        queue = self._queued.get(t)
        if queue is None:
            queue = self._queued[t] = deque()
            heapq.heappush(self._times, t)
        queue.append((t, self._wake_event, (vm.index << 32) | (vm.wake_token & 0xFFFFFFFF)))

    # -- memory: the simulated guest's use, and what plugging does ------------------------------

    def _mem_account(self, vm: VmRecord, m: MemoryRecord) -> None:
        """The guest's use now; the start and end of a stretch out of memory."""
        t = self.t
        m.used, m.segment = used_at(m.segments, m.segment, t)
        out = m.used > m.size
        if out and not m.is_out:
            m.ooms += 1
            m.out_since = t
            self.note("out_of_memory", vm.spec.name, f"uses {m.used} bytes of {m.size}")
        elif not out and m.is_out:
            m.oom_seconds += t - m.out_since
        m.is_out = out

    def _memory_granted(self, vm: VmRecord, call: PermitCall, memory: int, *, is_ask: bool) -> None:
        m = vm.mem
        ext = self.extender
        assert m is not None and call.memory is not None and ext is not None
        m.granted = memory
        if is_ask and memory < call.memory.requested:
            m.denials += 1
        if self.memory_annotations.get(vm.uid) != memory:
            self.at(
                self.t + self.timing.durability_delay_seconds,
                self._mem_durable_write,
                (vm.index << 16) | (ext.epoch & 0xFFFF),
            )

    def _mem_resized(self, vm: VmRecord, target: int) -> int:
        """Plugging or unplugging ended: a grow reaches its size, a shrink where the guest
        stopped giving memory back. Returns the size the VM has now."""
        m = vm.mem
        assert m is not None and vm.node is not None
        self._mem_account(vm, m)
        previous = m.size
        if target > previous:
            if target > m.granted:
                raise InvariantViolation(
                    "permit exceeded",
                    f"{vm.spec.name} plugged {target} bytes, its memory permit is {m.granted}",
                )
            m.size = target
            m.grows += 1
            self.counts["resizes"] += 1
            m.peak = max(m.peak, m.size)
            self._check_memory_reality(vm.node, f"{vm.spec.name} grew to {m.size} bytes")
        else:
            reached = given_back_to(vm.vm_spec, asked=target, used=m.used)
            if reached >= previous:
                self.note("memory_shrink_refused", vm.spec.name, f"uses {m.used} bytes")
                return previous
            m.size = reached
            m.shrinks += 1
            self.counts["resizes"] += 1
            if reached > target:
                m.partial_shrinks += 1
                self.note(
                    "memory_shrink_partial",
                    vm.spec.name,
                    f"asked {target} bytes, the guest gave back down to {reached}",
                )
        self._mem_account(vm, m)
        return m.size

    def _check_memory_reality(self, node: str, what: str) -> None:
        """What really runs on ``node`` after a grow we permitted fits in its usable memory."""
        real = sum(
            (v.mem.size if v.mem is not None else v.memory)
            for v in self.vms
            if v.node == node and not v.is_deleted
        )
        real += sum(f.demand.memory_bytes for f in self.foreign if f.node == node)
        usable = self.nodes[node].usable.memory_bytes
        if real > usable:
            raise InvariantViolation(
                "decided over-commit", f"{what} on {node}: {real} bytes run on {usable} usable"
            )

    def _mem_durable_write(self, packed: int) -> None:
        index, epoch = divmod(packed, 1 << 16)
        vm = self.vms[index]
        ext = self.extender
        if vm.mem is None or vm.is_deleted or ext is None or ext.epoch & 0xFFFF != epoch:
            return
        self.memory_annotations[vm.uid] = vm.mem.granted

    # -- recommender -------------------------------------------------------------------------

    def _recommend(self, _: int) -> None:
        self.at(self.t + self.timing.recommend_interval_seconds, self._recommend)
        ext = self.extender
        pending = [vm for vm in self.pending if not vm.is_deleted]
        if ext is None or not pending or self.provisioning.in_flight:
            return
        asked = self.provisioning.recommend(ext, pending, now=self.t)
        if asked is None:
            return
        record, joins = asked
        self.recommendations.append(record)
        self.note("recommended", "recommender", "; ".join(record.scale_up) or "nothing")
        for i in joins:
            pool = self.provisioning.joining[i][1]
            self.at(self.t + pool.provision_seconds, self._node_joined, i)

    # -- relief: live moves (``core.relief`` decides, ``simulator.relief`` times them) -------

    def _relieve(self, _: int) -> None:
        """The extender's relief pass: the real ``plan_moves`` on its ledger, each move started
        with the ledger's ``reserve_move`` (both sides held until the move ends)."""
        relief = self.relief
        assert relief is not None
        self.at(self.t + self.s.moves.interval_seconds, self._relieve)
        ext = self.extender
        if ext is None:
            return
        ledger = ext.ledger
        relief.account(self.t)  # before the wants change
        relief.book.forget_gone(ledger, now=self.t, config=relief.config)
        plan = plan_moves(ledger, relief.book, now=self.t, config=relief.config)
        for name in plan.drain:
            relief.book.draining.add(name)
            self.note("drain_started", name, "tainted; its VMs move away one at a time")
        for name in plan.emptied:
            if name not in relief.emptied:
                relief.emptied.append(name)
                self.note("node_emptied", name, "nothing runs there: the cloud may remove it")
        for move in plan.moves:
            self._start_move(ext.epoch, move)
        for eviction in plan.evict:
            # The Eviction API with no PodDisruptionBudget in the way: the pod ends at once (a
            # controller's replacement elsewhere is not modelled).
            found = next((f for f in self.foreign if f.uid == eviction.uid), None)
            if found is not None:
                self.note("evicted", found.spec.name, f"from {eviction.node}, which is drained")
                self._foreign_ended(found.index)

    def _start_move(self, epoch: int, move: PlannedMove) -> None:
        relief = self.relief
        ext = self.extender
        assert relief is not None and ext is not None
        vm = next(v for v in self.vms if v.uid == move.uid and not v.is_deleted)
        ledger = ext.ledger
        before = ledger.nodes[move.target].free
        target_name = f"{vm.spec.name}-m{relief.count + 1}"
        try:
            ledger.reserve_move(
                move.uid, target_name=target_name, target_node=move.target, at=self.t
            )
        except LedgerError as e:
            raise InvariantViolation("relief", f"planned move of {move.pod} refused: {e}") from e
        what = f"move of {vm.spec.name} to {move.target}"
        check_decision(ledger, move.target, before.cpu_millis, what)
        check_memory_decision(ledger, move.target, before.memory_bytes, what)
        relief.book.move_started(
            move, migration=_migration(vm.spec.namespace, target_name), now=self.t
        )
        fails = relief.will_fail()
        number = relief.started(
            Flight(
                vm=vm.index,
                source_uid=move.uid,
                source=move.source,
                target=move.target,
                target_name=target_name,
                epoch=epoch,
                fails=fails,
                reason=move.reason,
            )
        )
        memory = vm.mem.size if vm.mem is not None else vm.memory
        self.note("move_started", vm.spec.name, f"{move.reason.value}: {move.message}")
        self.at(self.t + relief.seconds_for(memory), self._move_done, number)

    def _move_done(self, number: int) -> None:
        relief = self.relief
        assert relief is not None
        flight = relief.flights[number]
        vm = self.vms[flight.vm]
        ext = self.extender
        migration = _migration(vm.spec.namespace, flight.target_name)
        if vm.is_deleted or vm.uid != flight.source_uid:
            del relief.flights[number]  # the source pod went: its move ended with it
            relief.book.move_ended(migration, succeeded=False, now=self.t)
            return
        if ext is None or ext.epoch != flight.epoch:
            # The extender that held the move died: its reservation is gone, the move fails.
            del relief.flights[number]
            relief.failed += 1
            relief.book.move_ended(migration, succeeded=False, now=self.t)
            self.note("move_failed", vm.spec.name, "the extender restarted during the move")
            return
        if flight.fails:
            del relief.flights[number]
            relief.failed += 1
            relief.book.move_ended(migration, succeeded=False, now=self.t)
            ext.ledger.cancel_move(flight.source_uid)
            self.note("move_failed", vm.spec.name, f"stays on {flight.source}")
            return
        if vm.op is not None:
            # The agent is mid-operation: the cut-over waits for it (a moving VM is resized by
            # nobody; its permit answer names the source node).
            self.at(self.t + 0.25, self._move_done, number)
            return
        del relief.flights[number]
        old = vm.uid
        vm.pod_name = flight.target_name
        vm.uid = f"uid-{vm.spec.namespace}-{flight.target_name}"
        vm.ref = PodRef(namespace=vm.spec.namespace, name=vm.pod_name, uid=vm.uid)
        ext.ledger.observe_pod(vm.info(node=flight.target, permitted=None), at=self.t)
        ext.ledger.forget_pod(old)
        ext.admission.forget(old)
        for book in (self.annotations, self.memory_annotations, self.seqs):
            if old in book:
                book[vm.uid] = book.pop(old)
        relief.book.move_finished(old, vm.uid)
        relief.book.move_ended(migration, succeeded=True, now=self.t)
        vm.node = flight.target
        self._reality(flight.source, -vm.vcpus * 1000)
        self._reality(flight.target, vm.vcpus * 1000)
        check_reality(self.nodes[flight.target], ext, f"{vm.spec.name} moved in")
        if vm.mem is not None:
            self._check_memory_reality(flight.target, f"{vm.spec.name} moved in")
        relief.done += 1
        self._touched.append(vm)
        self.note("moved", vm.spec.name, f"{flight.source} -> {flight.target}")
        self._step(vm)

    def _node_joined(self, i: int) -> None:
        name, pool, zone = self.provisioning.joined(i)
        self._add_node(name, Demand(sc.milli(pool.cpu), sc.bytes_of(pool.memory)), pool.name, zone)
        self.note("node_joined", name, f"pool {pool.name}, zone {zone}")
        self._queue_schedule(self.t)

    # -- samples for the plot ----------------------------------------------------------------

    def _sample(self, _: int) -> None:
        t = self.t
        waiting = sum(1 for vm in self.pending if not vm.is_deleted)
        self.samples.take(t, self.extender, pending=waiting)
        if t + self.timing.sample_interval_seconds <= self.s.duration_seconds:
            self.at(t + self.timing.sample_interval_seconds, self._sample)


def _migration(namespace: str, target_name: str) -> str:
    """A simulated move's VirtualMachineMigration key (the book's): named as its target pod."""
    return f"{namespace}/{target_name}"


def simulate(
    scenario: sc.Scenario,
    *,
    after_step: Hook | None = None,
    progress: Callable[[float], None] | None = None,
) -> Report:
    """Run ``scenario`` to its end (or its first violation) and return the report."""
    sim = Simulation(scenario, after_step=after_step)
    return sim.run(progress=progress)
