"""New nodes: the real recommender asked what to add, and the nodes it asked for, by name.

Pure: no I/O, no clock, no randomness. ``Provisioning`` holds the scenario's node pools (as
the recommender's ``NodePool``s), how many nodes are on their way, and the name and pool of
each. It asks ``snapshot_from_ledger`` + ``recommend`` exactly as the extender's recommender
endpoint would, and names the nodes to provision; when they join, and everything else the
cluster does with them, is the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_extender.recommender import (
    Capacity,
    DiagnosticsLevel,
    NodePool,
    NodeTemplate,
    RecommenderConfig,
    SnapshotError,
    recommend,
    snapshot_from_ledger,
)
from simulator import scenario as sc
from simulator.invariants import InvariantViolation
from simulator.records import SCHEDULER_NAME, ExtenderLife, VmRecord
from simulator.report import RecommendationRecord


class Provisioning:
    """The scenario's node pools, and the nodes asked for: ``joining[i]`` is (name, pool,
    zone) of the i-th; ``in_flight`` counts those that have not joined yet."""

    def __init__(self, pools: Sequence[sc.NodePoolSpec]) -> None:
        self.pools = [
            NodePool(
                name=p.name,
                zones=list(p.zones),
                template=NodeTemplate(
                    instance_type=f"{p.name}-{p.cpu}cpu",
                    allocatable=Capacity(cpu=str(p.cpu), memory=str(p.memory)),
                ),
                max_count=p.max_count,
                priority=p.priority,
            )
            for p in pools
        ]
        self.pool_specs = {p.name: p for p in pools}
        self.joining: list[tuple[str, sc.NodePoolSpec, str]] = []
        self.in_flight = 0

    def recommend(
        self, ext: ExtenderLife, pending: Sequence[VmRecord], *, now: float
    ) -> tuple[RecommendationRecord, list[int]] | None:
        """Ask the recommender about ``pending``: None if it has nothing to say, else its record
        and the indices in ``joining`` of the nodes it asked for (now in flight)."""
        infos = [vm.info(node=None, permitted=None) for vm in pending]
        try:
            snapshot = snapshot_from_ledger(ext.ledger, infos, self.pools)
            # Only the scale-up and the unscheduled pods are read: no per-round records.
            config = RecommenderConfig(
                scheduler_name=SCHEDULER_NAME, diagnostics=DiagnosticsLevel.SUMMARY
            )
            rec = recommend(snapshot, config=config)
        except SnapshotError as e:
            raise InvariantViolation("recommender snapshot", str(e)) from e
        record = RecommendationRecord(
            at_seconds=round(now, 3),
            scale_up=[f"{u.node_pool}/{u.zone} x{u.increment_by}" for u in rec.scale_up],
            unscheduled=list(rec.unscheduled_pods),
        )
        if not record.scale_up and not record.unscheduled:
            return None
        asked: list[int] = []
        for up in rec.scale_up:
            pool = self.pool_specs[up.node_pool]
            for _ in range(up.increment_by):
                self.in_flight += 1
                # Numbered over the whole run (joining's length), so names never repeat.
                self.joining.append((f"{pool.name}-{len(self.joining) + 1}", pool, up.zone))
                asked.append(len(self.joining) - 1)
        return record, asked

    def joined(self, i: int) -> tuple[str, sc.NodePoolSpec, str]:
        self.in_flight -= 1
        return self.joining[i]
