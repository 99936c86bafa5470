"""The recommender's virtual cluster, and phase 2: pending pods onto the existing nodes.

Pure: no I/O, no clock, no randomness. ``Simulation`` is the state of one ``recommend`` call:
the nodes' free room (the snapshot's nodes, then the new ones), which pool may still grow,
what was added, and the diagnostics gathered on the way. Everything it changes is its own; the
compiled ``Model`` it reads is shared by every call on the same prepared snapshot and is never
changed.

It does not run a ``Ledger`` with a ``FitIndex``: those are built for a long-lived cluster
(every reservation re-checks every cached size and formats rejection strings). It keeps per-node
free cpu and memory in plain arrays and applies the ledger's own fit rule, ``need <= free`` per
resource after the system reserve (``model.usable`` goes through ``NodeState`` for
that), so its placements are exactly the extender's.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence

from protocol.quantity import format_cpu
from scheduler_extender.core.podinfo import Demand
from scheduler_extender.recommender.config import RecommenderConfig
from scheduler_extender.recommender.model import Candidate, Host, Model, Pending, admission, usable
from scheduler_extender.recommender.recommendation import CandidateOutcome, ExistingPlacement, Round
from scheduler_extender.recommender.snapshot import HOSTNAME_LABEL, ZONE_LABEL

__all__ = ["Blocked", "Cluster", "Simulation", "SimulationError"]

# Why a candidate cannot get another node: the outcome and its sentence.
Blocked = tuple[CandidateOutcome, str]


class SimulationError(AssertionError):
    """The simulation's own arithmetic disagrees with the fit rule: a bug, never bad input."""


class Cluster:
    """The virtual cluster's nodes (the snapshot's, then the new ones) as parallel arrays.

    ``free_*`` may start negative (an over-committed node): then nothing fits there, as in the
    ledger. Only ``take`` changes them, and only downwards.
    """

    __slots__ = ("by_name", "free_cpu", "free_mem", "hosts", "kinds", "names")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.hosts: list[Host] = []
        # Per node, its host kind (``Model.host_kinds``); a new node is a kind of its own.
        self.kinds: list[int] = []
        self.free_cpu: list[int] = []
        self.free_mem: list[int] = []
        self.by_name: dict[str, int] = {}

    def add(self, host: Host, free: Demand, kind: int) -> int:
        i = len(self.names)
        self.names.append(host.name)
        self.hosts.append(host)
        self.kinds.append(kind)
        self.free_cpu.append(free.cpu_millis)
        self.free_mem.append(free.memory_bytes)
        self.by_name[host.name] = i
        return i

    def take(self, i: int, d: Demand) -> None:
        if d.cpu_millis > self.free_cpu[i] or d.memory_bytes > self.free_mem[i]:
            raise SimulationError(f"{d} does not fit on {self.names[i]}")
        self.free_cpu[i] -= d.cpu_millis
        self.free_mem[i] -= d.memory_bytes


class Simulation:
    """The virtual cluster of one ``recommend`` call, and what it found so far."""

    def __init__(
        self,
        *,
        model: Model,
        config: RecommenderConfig,
        candidates: list[Candidate],
        pool_label: str,
    ) -> None:
        self.model = model
        self.config = config
        self.candidates = candidates
        self.pool_label = pool_label
        self.cluster = Cluster()
        # The snapshot's nodes that take new pods, in name order (phase 2 is first fit by
        # node name).
        self.schedulable: list[int] = []
        # (class, candidate index) -> why the class may not run there, or None.
        self.admission: dict[tuple[int, int], str | None] = {}
        # class -> the schedulable nodes that admit it, in name order, and how many of the
        # cluster's nodes it has looked at; built on first use, then brought up to date with
        # the nodes added since whenever phase 2 asks for it.
        self.eligible: dict[int, tuple[list[int], int]] = {}
        self.new_node_cands: list[Candidate] = []  # per node added, in order, its candidate
        self.pool_added: list[int] = [0] * len(model.pools)  # pool index -> nodes added
        self.added: dict[str, int] = {}  # "pool/zone" -> nodes added
        self.new_nodes: dict[str, tuple[Candidate, list[str]]] = {}
        self.greedy_pods: list[Pending] = []
        self.rounds: list[Round] = []
        self.placed_on_existing: list[ExistingPlacement] = []
        # Nodes of one allocatable have one room: ``usable`` goes through a NodeState.
        rooms: dict[Demand, Demand] = {}
        for alloc in model.allocatable:
            if alloc not in rooms:
                rooms[alloc] = usable(alloc, config.reserve)
        cluster = self.cluster
        names = cluster.names
        names.extend(host.name for _, host in model.nodes)
        cluster.hosts.extend(host for _, host in model.nodes)
        cluster.kinds.extend(model.host_kinds)
        cluster.free_cpu.extend(
            rooms[a].cpu_millis - h.cpu_millis
            for a, h in zip(model.allocatable, model.held, strict=True)
        )
        cluster.free_mem.extend(
            rooms[a].memory_bytes - h.memory_bytes
            for a, h in zip(model.allocatable, model.held, strict=True)
        )
        cluster.by_name.update((name, i) for i, name in enumerate(names))
        self.schedulable.extend(
            i for i, (node, _) in enumerate(model.nodes) if not node.unschedulable
        )
        self.schedulable.sort(key=names.__getitem__)
        # One host of each kind: a class's admission is checked there for all of the kind.
        self._kind_hosts: dict[int, Host] = {}
        for i in self.schedulable:
            self._kind_hosts.setdefault(cluster.kinds[i], cluster.hosts[i])
        self._existing = len(names)
        self._next_kind = model.kind_count

    # -- feasibility ------------------------------------------------------------------------

    def admits(self, cls: int, cand: Candidate) -> str | None:
        key = (cls, cand.index)
        if key in self.admission:
            return self.admission[key]
        why = self.admission[key] = admission(self.model.classes[cls], cand.host)
        return why

    def eligible_nodes(self, cls: int) -> list[int]:
        """The schedulable nodes that admit ``cls``, in name order. Nodes of one kind (same
        labels and taints) share one answer, unless the class matches on node names."""
        cluster = self.cluster
        hosts, kinds, names = cluster.hosts, cluster.kinds, cluster.names
        found = self.eligible.get(cls)
        if found is None:
            c = self.model.classes[cls]
            if c.by_name:
                nodes = [i for i in self.schedulable if admission(c, hosts[i]) is None]
            else:
                ok = {kind: admission(c, host) is None for kind, host in self._kind_hosts.items()}
                nodes = [i for i in self.schedulable if ok[kinds[i]]]
            # Nodes added by earlier passes: each its own kind.
            added = [i for i in range(self._existing, len(names)) if admission(c, hosts[i]) is None]
            if added:
                nodes.extend(added)
                nodes.sort(key=names.__getitem__)
        else:
            nodes, seen_nodes = found
            if seen_nodes < len(names):
                # Added since: a new node admits what its candidate admits.
                cands = self.new_node_cands
                for i in range(seen_nodes, len(names)):
                    if self.admits(cls, cands[i - self._existing]) is None:
                        insort(nodes, i, key=names.__getitem__)
        self.eligible[cls] = (nodes, len(names))
        return nodes

    def blocked(self, cand: Candidate) -> Blocked | None:
        """Why the candidate's pool may not grow by one node, or None if it may."""
        pool = cand.pool
        count = pool.count + self.pool_added[pool.index]
        if count >= pool.max_count:
            return (
                CandidateOutcome.AT_MAX,
                f"pool {pool.name} has {count} of at most {pool.max_count} nodes",
            )
        cap = pool.capacity
        if pool.limit_cpu is not None and (count + 1) * cap.cpu_millis > pool.limit_cpu:
            return (
                CandidateOutcome.OVER_LIMIT,
                f"another node would take pool {pool.name} to"
                f" {format_cpu((count + 1) * cap.cpu_millis)} cpu, over its limit of"
                f" {format_cpu(pool.limit_cpu)}",
            )
        if pool.limit_memory is not None and (count + 1) * cap.memory_bytes > pool.limit_memory:
            return (
                CandidateOutcome.OVER_LIMIT,
                f"another node would take pool {pool.name} to"
                f" {(count + 1) * cap.memory_bytes} bytes of memory, over its limit of"
                f" {pool.limit_memory}",
            )
        return None

    # -- phase 2 ------------------------------------------------------------------------------

    def place_on_existing(self, pods: Sequence[Pending]) -> list[Pending]:
        """First fit by node name; returns the pods that fit nowhere.

        Room only shrinks during this phase, so a node that rejected a (constraints, size)
        rejects it for the rest of the phase: each such group keeps a cursor into its
        eligible nodes in name order, and the nodes behind it are never looked at again.
        """
        left: list[Pending] = []
        cluster = self.cluster
        names, free_cpu, free_mem = cluster.names, cluster.free_cpu, cluster.free_mem
        existing = self._existing
        new_nodes = self.new_nodes
        placed = self.placed_on_existing
        orders: dict[int, list[int]] = {}
        cursors = [0] * self.model.shapes  # per shape: how far into its class's nodes
        for p in pods:
            cls = p.cls
            order = orders.get(cls)
            if order is None:
                order = orders[cls] = self.eligible_nodes(cls)
            demand = p.demand
            pos = cursors[p.shape]
            need_cpu, need_mem = demand.cpu_millis, demand.memory_bytes
            end = len(order)
            while pos < end:
                i = order[pos]
                if need_cpu <= free_cpu[i] and need_mem <= free_mem[i]:
                    break
                pos += 1
            cursors[p.shape] = pos
            if pos == end:
                left.append(p)
                continue
            i = order[pos]
            # The fit was just checked against the same arrays ``Cluster.take`` checks.
            free_cpu[i] -= need_cpu
            free_mem[i] -= need_mem
            node = names[i]
            if i < existing:
                placed.append(ExistingPlacement(pod=p.key, node=node))
            else:
                # Room an earlier pass's new node left over: this pod needs that node too,
                # so it belongs to the scale-up (and to the cost plan of phase 6).
                new_nodes[node][1].append(p.key)
                self.greedy_pods.append(p)
        return left

    # -- phase 5 ------------------------------------------------------------------------------

    def commit(self, cand: Candidate, pods: list[Pending]) -> str:
        """Add one node of the candidate's template holding ``pods``; returns its name."""
        n = self.added.get(cand.label, 0) + 1
        self.added[cand.label] = n
        self.pool_added[cand.pool.index] += 1
        cluster = self.cluster
        name = f"{cand.pool.name}-{cand.zone}-new-{n}"
        while name in cluster.by_name:  # a real node already has that name
            name += "x"
        labels = {
            **cand.pool.labels,
            self.pool_label: cand.pool.name,
            ZONE_LABEL: cand.zone,
            HOSTNAME_LABEL: name,
        }
        # Its own kind: its hostname label sets it apart from every other node.
        i = cluster.add(Host(name, labels, cand.pool.taints), cand.usable, self._next_kind)
        self._next_kind += 1
        self.new_node_cands.append(cand)
        # The trial's arithmetic must agree with the fit rule, or this raises (all at once:
        # sizes are not negative, so the pods fit one by one exactly when their sum fits).
        cpu = mem = 0
        for p in pods:
            cpu += p.demand.cpu_millis
            mem += p.demand.memory_bytes
        cluster.take(i, Demand(cpu, mem))
        self.new_nodes[name] = (cand, [p.key for p in pods])
        self.greedy_pods.extend(pods)
        return name
