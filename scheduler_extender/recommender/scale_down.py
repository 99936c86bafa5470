"""Scale-down: which existing nodes could be removed with every pod still placed.

Pure: no I/O, no clock, no randomness; the same snapshot and config give the same answer. It
reads the same ``ClusterSnapshot`` and compiled model as the scale-up, and the extender's fit
rule (usable room after the system reserve, ``need <= free`` per resource).

What cluster-autoscaler's and Karpenter's users expect, for VMs that grow:

* A pod on a node to remove must fit on another node, with its constraints (node selector,
  required node affinity, taints), highest priority first. A VM counts at its current size
  (what the extender holds for it) *plus* ``growth_headroom`` of its room to grow to its top
  size: at 0 the move only has to fit today, at 1 every VM keeps room to reach its maximum. The
  pods already on a destination count the same way, so a move never eats their headroom.
* Static (mirror) pods belong to their node: a node running one is kept.
* A PodDisruptionBudget caps the evictions of its pods over the whole answer.
* At most ``max_nodes_at_once`` nodes are removed (a disruption budget); the rest that could go
  say so, and go in a later pass.
* A node that receives moved pods is kept in this pass (removing it too would move them twice).
* Nodes outside every node pool are not the autoscaler's to remove.

Candidates are tried least utilised first (the larger of their cpu and memory shares, now),
then by name; each either is removed (its pods' destinations listed) or kept with a reason.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final

import msgspec

from protocol.bounds import Count
from scheduler_extender.recommender.config import RecommenderConfig
from scheduler_extender.recommender.growth import PlacedPod, placed_pods
from scheduler_extender.recommender.model import (
    Host,
    PreparedSnapshot,
    admission,
    prepare_snapshot,
    usable,
)
from scheduler_extender.recommender.snapshot import (
    ZONE_LABEL,
    ClusterSnapshot,
)

__all__ = [
    "KeepReason",
    "KeptNode",
    "Move",
    "RemovableNode",
    "ScaleDown",
    "ScaleDownConfig",
    "encode_scale_down",
    "recommend_scale_down",
]


class ScaleDownConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The scale-down check's settings (the config's ``recommender.scale_down``)."""

    # Share of each VM's room to grow (from its current size to its top size) that must still
    # fit where it would move; 0: today's size only, 1: its maximum.
    growth_headroom: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.5
    # At most this many nodes removed at once (a disruption budget).
    max_nodes_at_once: Count = 1


class KeepReason(enum.StrEnum):
    NOT_IN_POOL = "NotInNodePool"
    STATIC_POD = "RunsStaticPod"
    POD_DOES_NOT_FIT = "PodFitsNowhereElse"
    PDB = "PodDisruptionBudget"
    DISRUPTION_BUDGET = "DisruptionBudget"
    RECEIVES_PODS = "ReceivesMovedPods"


class _Out(msgspec.Struct, rename="camel", kw_only=True, frozen=True, omit_defaults=True):
    pass


class Move(_Out, frozen=True, kw_only=True):
    pod: str
    to_node: str


class RemovableNode(_Out, frozen=True, kw_only=True):
    node: str
    node_pool: str
    zone: str | None = None
    # Per hour, in the pools' currency, when the pool has a price.
    price: float | None = None
    moves: list[Move] = []


class KeptNode(_Out, frozen=True, kw_only=True):
    node: str
    reason: KeepReason
    message: str


class ScaleDown(_Out, frozen=True, kw_only=True):
    # In the order chosen (least utilised first), at most ``max_nodes_at_once``.
    remove: list[RemovableNode]
    # Every other node, by name, with why it stays.
    kept: list[KeptNode]


_ENCODER: Final = msgspec.json.Encoder()


def encode_scale_down(answer: ScaleDown) -> bytes:
    return _ENCODER.encode(answer)


def recommend_scale_down(
    snapshot: ClusterSnapshot | PreparedSnapshot,
    *,
    config: RecommenderConfig,
    scale_down: ScaleDownConfig,
) -> ScaleDown:
    """Which nodes could go; see the module docstring. Raises ``SnapshotError`` (400) for an
    inconsistent snapshot, as ``recommend`` does."""
    prepared = (
        snapshot
        if isinstance(snapshot, PreparedSnapshot)
        else prepare_snapshot(snapshot, scheduler_name=config.scheduler_name)
    )
    snap, model = prepared.snapshot, prepared.model
    names = [n.name for n, _ in model.nodes]
    hosts: list[Host] = [host for _, host in model.nodes]
    pods_on = placed_pods(
        prepared, scheduler_name=config.scheduler_name, headroom=scale_down.growth_headroom
    )

    # Room per node, with every pod at its grown size.
    room = [usable(a, config.reserve) for a in model.allocatable]
    free_cpu = [
        r.cpu_millis - sum(p.grown.cpu_millis for p in ps)
        for r, ps in zip(room, pods_on, strict=True)
    ]
    free_mem = [
        r.memory_bytes - sum(p.grown.memory_bytes for p in ps)
        for r, ps in zip(room, pods_on, strict=True)
    ]
    # PodDisruptionBudgets: evictions each still allows, and which pods it covers.
    allowed: list[int] = []
    for pdb in snap.pod_disruption_budgets:
        covered = sum(
            1
            for ps in pods_on
            for p in ps
            if p.namespace == pdb.namespace and _matches(pdb.selector.match_labels, p.labels)
        )
        if pdb.max_unavailable is not None:
            allowed.append(pdb.max_unavailable)
        else:
            allowed.append(max(covered - (pdb.min_available or 0), 0))

    def budgets_of(p: PlacedPod) -> list[int]:
        return [
            j
            for j, pdb in enumerate(snap.pod_disruption_budgets)
            if p.namespace == pdb.namespace and _matches(pdb.selector.match_labels, p.labels)
        ]

    pools = {p.name: p for p in model.pools}
    pool_label = snap.pool_label

    def utilisation(i: int) -> tuple[float, str]:
        used_cpu = sum(p.now.cpu_millis for p in pods_on[i])
        used_mem = sum(p.now.memory_bytes for p in pods_on[i])
        r = room[i]
        share = max(
            used_cpu / r.cpu_millis if r.cpu_millis > 0 else 0.0,
            used_mem / r.memory_bytes if r.memory_bytes > 0 else 0.0,
        )
        return share, names[i]

    removed: set[int] = set()
    receiving: dict[int, str] = {}  # node -> the first node whose pods it takes
    remove: list[RemovableNode] = []
    kept: dict[str, KeptNode] = {}

    def keep(i: int, reason: KeepReason, message: str) -> None:
        kept[names[i]] = KeptNode(node=names[i], reason=reason, message=message)

    destinations = sorted(
        (i for i, (n, _) in enumerate(model.nodes) if not n.unschedulable), key=names.__getitem__
    )
    for i in sorted(range(len(names)), key=utilisation):
        node, _host = model.nodes[i]
        pool_name = node.labels.get(pool_label)
        if pool_name is None or pool_name not in pools:
            keep(i, KeepReason.NOT_IN_POOL, f"node has no {pool_label} label of a known pool")
            continue
        if i in receiving:
            keep(
                i,
                KeepReason.RECEIVES_PODS,
                f"it would take pods from {receiving[i]}, which is removed first",
            )
            continue
        static = [p.key for p in pods_on[i] if p.is_static]
        if static:
            keep(i, KeepReason.STATIC_POD, f"runs static pod {static[0]}: it goes with the node")
            continue
        # The pods, highest priority first, then largest, then name.
        order = sorted(pods_on[i], key=lambda p: (-p.priority, -p.grown.cpu_millis, p.key))
        spent: dict[int, int] = {}
        blocked_by: str | None = None
        for p in order:
            for j in budgets_of(p):
                spent[j] = spent.get(j, 0) + 1
                if spent[j] > allowed[j]:
                    pdb = snap.pod_disruption_budgets[j]
                    blocked_by = (
                        f"evicting {p.key} would exceed PodDisruptionBudget"
                        f" {pdb.namespace}/{pdb.name} ({allowed[j]} more disruption(s) allowed)"
                    )
                    break
            if blocked_by is not None:
                break
        if blocked_by is not None:
            keep(i, KeepReason.PDB, blocked_by)
            continue
        # Place the pods on the other nodes, first fit by name, on scratch copies of the room.
        taken_cpu: dict[int, int] = {}
        taken_mem: dict[int, int] = {}
        moves: list[Move] = []
        homeless: PlacedPod | None = None
        for p in order:
            for d in destinations:
                if d == i or d in removed:
                    continue
                fc = free_cpu[d] - taken_cpu.get(d, 0)
                fm = free_mem[d] - taken_mem.get(d, 0)
                if p.grown.cpu_millis > fc or p.grown.memory_bytes > fm:
                    continue
                if admission(p.cls, hosts[d]) is not None:
                    continue
                taken_cpu[d] = taken_cpu.get(d, 0) + p.grown.cpu_millis
                taken_mem[d] = taken_mem.get(d, 0) + p.grown.memory_bytes
                moves.append(Move(pod=p.key, to_node=names[d]))
                break
            else:
                homeless = p
                break
        if homeless is not None:
            keep(
                i,
                KeepReason.POD_DOES_NOT_FIT,
                f"pod {homeless.key} (priority {homeless.priority}) fits on no other node"
                f" with {homeless.grown.cpu_millis}m cpu and {homeless.grown.memory_bytes}"
                " bytes of memory (its size now plus its growth headroom)",
            )
            continue
        if len(remove) >= scale_down.max_nodes_at_once:
            keep(
                i,
                KeepReason.DISRUPTION_BUDGET,
                f"it could go, but {len(remove)} node(s) already are (max_nodes_at_once"
                f" {scale_down.max_nodes_at_once}): a later pass",
            )
            continue
        # Commit.
        removed.add(i)
        for j, n in spent.items():
            allowed[j] -= n
        for d, c in taken_cpu.items():
            free_cpu[d] -= c
            free_mem[d] -= taken_mem[d]
            # Judged later, it stays (removed nodes take nothing, so none was judged yet
            # and removed).
            receiving.setdefault(d, names[i])
        pool = pools[pool_name]
        remove.append(
            RemovableNode(
                node=names[i],
                node_pool=pool_name,
                zone=node.labels.get(ZONE_LABEL),
                price=float(pool.price) if pool.price is not None else None,
                moves=moves,
            )
        )
    return ScaleDown(remove=remove, kept=[kept[n] for n in sorted(kept)])


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
