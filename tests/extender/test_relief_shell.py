"""Relief's shell (``scheduler_extender.relief``): a grow cut short by its node becomes a
VirtualMachineMigration for the VM's VirtualMachine, with the plan's target and reason.

In process, on an ``Extender`` fed real pod and node objects and a real permit batch; the
writer records what would be POSTed (the API server's side of a create is the control-plane
tier's: ``tests/controlplane/test_virtualmachines.py`` creates migrations there).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from msgspec.structs import replace
from prometheus_client import CollectorRegistry

from kube_io.errors import Conflict, KubeError, NotFound, TooManyRequests, Unavailable
from kube_io.objects import ObjectReference
from protocol.annotations import DRAIN_TAINT
from protocol.kube import Node, Pod, Taint
from protocol.permits import ResourceRequestBatch
from protocol.virtualmachine import API_VERSION, KIND, VirtualMachineMigration, migration_manifest
from scheduler_extender.config import parse_config
from scheduler_extender.core.relief import (
    TAINT_SEEN_WITHIN_SECONDS,
    MovePhase,
    MoveReason,
    MoveRecord,
    PlannedMove,
)
from scheduler_extender.kube.node_alloc import NodeAllocReporter
from scheduler_extender.metrics import Metrics
from scheduler_extender.relief import DRAIN, REASON_LABEL, migration_for, relief_once
from scheduler_extender.service import Extender
from testkit.kube_api import node_object, pod_object
from tests.extender.helpers import permit_batch, vm_pod

DB_UID = "0b7d0f52-2a5e-4c57-9d3e-9a1e2b3c4d5e"
WEB_UID = "1c8e1a63-3b6f-4d68-8e4f-ab2f3c4d5e6f"
WALL = 1_800_000_000.0


class Writer:
    """What relief writes: migrations, taints (answered with the node as the API server would
    return it) and evictions (answered by ``evict_errors``, one per call, then success)."""

    def __init__(self, error: KubeError | None = None) -> None:
        self.created: list[VirtualMachineMigration] = []
        self.error = error
        self.nodes: dict[str, Node] = {}
        self.tainted: list[tuple[str, Taint]] = []
        self.evicted: list[tuple[str, str, str]] = []
        self.evict_errors: list[KubeError] = []

    async def create_virtual_machine_migration(self, migration: VirtualMachineMigration) -> None:
        self.created.append(migration)
        if self.error is not None:
            raise self.error

    async def taint_node(self, name: str, taint: Taint) -> Node:
        self.tainted.append((name, taint))
        node = self.nodes[name]
        return replace(node, spec=replace(node.spec, taints=[*(node.spec.taints or []), taint]))

    async def evict_pod(self, namespace: str, name: str, *, uid: str) -> None:
        self.evicted.append((namespace, name, uid))
        if self.evict_errors:
            raise self.evict_errors.pop(0)


class Poster:
    """The Events the reporter sends (``NodeAllocReporter``'s poster port)."""

    def __init__(self) -> None:
        self.events: list[tuple[ObjectReference, str, str]] = []
        self.posted = asyncio.Event()

    async def create_event(
        self, involved: ObjectReference, *, reason: str, message: str, **_: Any
    ) -> None:
        self.events.append((involved, reason, message))
        self.posted.set()


def _owned(pod: dict[str, Any], vm: str) -> dict[str, Any]:
    """``pod`` controlled by the VirtualMachine ``vm`` (as the vm-controller makes it)."""
    ref = {"apiVersion": API_VERSION, "kind": KIND, "name": vm, "uid": "vm-uid", "controller": True}
    pod["metadata"]["ownerReferences"] = [ref]
    return pod


def _bare_extender(
    relief: dict[str, Any], *, wall_clock: Callable[[], float] = lambda: WALL
) -> Extender:
    """An extender with the config's ``relief`` section and nothing listed yet."""
    metrics = Metrics(CollectorRegistry())
    return Extender(
        parse_config({"relief": relief}),
        metrics=metrics,
        reporter=NodeAllocReporter(metrics, None),
        recorder=None,
        binder=None,
        wall_clock=wall_clock,
        clock=lambda: 0.0,
    )


def _extender(
    *,
    enabled: bool = True,
    db_owned: bool = True,
    migrations: tuple[VirtualMachineMigration, ...] = (),
    wall: float = WALL,
) -> Extender:
    """node-a (4 cores, 3.2 usable) holds db (1 of up to 4) and web (2, made by hand);
    node-b (8 cores) is empty. db asks for 3: node-a has 0.2 left, so the grant is cut short."""
    extender = _bare_extender({"enabled": enabled}, wall_clock=lambda: wall)
    nodes = [node_object("node-a", cpu="4"), node_object("node-b", cpu="8")]
    extender.nodes_listed([msgspec.convert(n, Node) for n in nodes])
    db = vm_pod("db-pod", uid=DB_UID, node="node-a", min_vcpus=1, max_vcpus=4)
    if db_owned:
        db = _owned(db, "db")
    web = vm_pod("web-pod", uid=WEB_UID, node="node-a", min_vcpus=2, max_vcpus=2)
    extender.pods_listed([msgspec.convert(p, Pod) for p in (db, web)])
    extender.migrations_listed(migrations)
    batch = permit_batch("node-a", uid=DB_UID, name="db-pod", current=1, requested=3)
    decided = extender.permits(msgspec.convert(batch, ResourceRequestBatch), token_node="node-a")
    assert not isinstance(decided, Exception)
    return extender


def _decisions(extender: Extender) -> dict[tuple[str, str], float]:
    family = extender.metrics.relief_decisions.collect()[0]
    return {
        (s.labels["reason"], s.labels["outcome"]): s.value
        for s in family.samples
        if s.name.endswith("_total")
    }


async def test_a_vm_cut_short_becomes_a_migration_of_its_virtualmachine() -> None:
    extender = _extender()
    writer = Writer()
    poster = Poster()
    reporter = NodeAllocReporter(extender.metrics, poster)
    outcomes = await relief_once(extender, writer, reporter, wall_clock=lambda: WALL)
    assert [(m.pod, m.reason, o) for m, o in outcomes] == [
        ("vms/db-pod", MoveReason.GROWER, "created")
    ]
    sending = asyncio.get_running_loop().create_task(reporter.run())
    await poster.posted.wait()
    sending.cancel()
    [(involved, reason, message)] = poster.events
    assert (involved.kind, involved.name, involved.uid) == ("Pod", "db-pod", DB_UID)
    assert reason == "GrowerToRoom"
    assert f"VirtualMachineMigration db-relief-{int(WALL)}" in message and "node-b" in message
    [migration] = writer.created
    assert migration.metadata.namespace == "vms"
    assert migration.metadata.name == f"db-relief-{int(WALL)}"
    assert migration.metadata.labels == {REASON_LABEL: "GrowerToRoom"}
    assert (migration.spec.vm_name, migration.spec.target_node) == ("db", "node-b")
    # As the client POSTs it: the API server refuses an object without apiVersion and kind.
    sent = migration_manifest(migration)
    assert (sent["apiVersion"], sent["kind"]) == (API_VERSION, "VirtualMachineMigration")
    assert _decisions(extender) == {("GrowerToRoom", "created"): 1.0}
    # The VM is cooling down: the next pass chooses nothing again.
    assert await relief_once(extender, writer, reporter, wall_clock=lambda: WALL) == []
    assert len(writer.created) == 1


async def test_a_vm_pod_no_virtualmachine_controls_yields_no_migration() -> None:
    extender = _extender(db_owned=False)
    writer = Writer()
    outcomes = await relief_once(
        extender, writer, NodeAllocReporter(extender.metrics, None), wall_clock=lambda: WALL
    )
    assert outcomes == [] and writer.created == []
    unrelieved = extender.metrics.registry.get_sample_value(
        "vmautoscale_extender_relief_unrelieved_vms"
    )
    assert unrelieved == 1


def test_relief_off_keeps_no_book() -> None:
    extender = _extender(enabled=False)
    assert extender.relief_book.is_empty


@pytest.mark.parametrize(
    ("error", "outcome"),
    [(Conflict("exists", status=409), "exists"), (Unavailable("down"), "failed")],
    ids=["conflict", "unavailable"],
)
async def test_a_create_that_fails_is_counted_and_not_retried_at_once(
    error: KubeError, outcome: str
) -> None:
    extender = _extender()
    writer = Writer(error)
    reporter = NodeAllocReporter(extender.metrics, None)
    outcomes = await relief_once(extender, writer, reporter, wall_clock=lambda: WALL)
    assert [o for _, o in outcomes] == [outcome]
    assert _decisions(extender) == {("GrowerToRoom", outcome): 1.0}
    assert await relief_once(extender, writer, reporter, wall_clock=lambda: WALL) == []


def test_a_long_vm_name_still_makes_a_valid_name() -> None:
    move = PlannedMove(
        uid=DB_UID,
        pod="vms/p",
        source="a",
        target="b",
        reason=MoveReason.WATERMARK,
        message="m",
    )
    migration = migration_for(move, vm_name="v" * 253, at=WALL)
    assert len(migration.metadata.name) == 253
    assert migration.metadata.name.endswith(f"-relief-{int(WALL)}")


def _stamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _as_listed(
    migration: VirtualMachineMigration, *, status: dict[str, Any] | None = None
) -> VirtualMachineMigration:
    """``migration`` as the API server lists it: created at WALL, with ``status``."""
    body = migration_manifest(migration)
    body["metadata"] = {**body["metadata"], "creationTimestamp": _stamp(WALL), "uid": "m-uid"}
    body["status"] = status or {}
    return msgspec.convert(body, VirtualMachineMigration)


async def test_a_restarted_extender_keeps_the_cool_down_from_the_migrations() -> None:
    """What the first extender created is all a second one (restarted, or the standby that
    takes over) needs: it lists the migration and does not move db again within its
    cool-down; a migration that failed keeps db away for its backoff, past the cool-down."""
    first = _extender()
    writer = Writer()
    reporter = NodeAllocReporter(first.metrics, None)
    await relief_once(first, writer, reporter, wall_clock=lambda: WALL)
    [created] = writer.created
    cooldown = first.config.relief.cooldown_seconds
    backoff = first.config.relief.failure_backoff_seconds
    later = WALL + cooldown / 2
    running = _as_listed(created, status={"phase": "Running"})
    second = _extender(migrations=(running,), wall=later)
    key = f"vms/{created.metadata.name}"
    # The same move, as the first recorded it and the second listed it (now under way).
    made = MoveRecord(vm="vms/db", target_node="node-b", phase=MovePhase.PENDING, created=WALL)
    assert first.relief_book.migrations == {key: made}
    assert second.relief_book.migrations == {key: replace(made, phase=MovePhase.RUNNING)}
    assert await relief_once(second, writer, reporter, wall_clock=lambda: later) == []
    # Failed 60 s after it was made: past the cool-down, db still waits out its backoff...
    ended = _as_listed(created, status={"phase": "Failed", "completionTime": _stamp(WALL + 60)})
    after_cooldown = WALL + cooldown + 1
    third = _extender(migrations=(ended,), wall=after_cooldown)
    assert await relief_once(third, writer, reporter, wall_clock=lambda: after_cooldown) == []
    assert "backoff" in " ".join(third.relief_pass().unrelieved)
    # ... and moves again once it is over.
    after_backoff = WALL + 60 + backoff + 1
    fourth = _extender(migrations=(ended,), wall=after_backoff)
    moved = await relief_once(fourth, writer, reporter, wall_clock=lambda: after_backoff)
    assert [(m.pod, o) for m, o in moved] == [("vms/db-pod", "created")]


async def test_no_pass_before_the_migrations_are_listed() -> None:
    extender = _extender()
    extender.has_migrations = False
    writer = Writer()
    reporter = NodeAllocReporter(extender.metrics, None)
    assert await relief_once(extender, writer, reporter, wall_clock=lambda: WALL) == []
    extender.migrations_listed([])
    assert len(await relief_once(extender, writer, reporter, wall_clock=lambda: WALL)) == 1


async def test_no_pass_before_the_lists_are_in() -> None:
    extender = _bare_extender({"enabled": True})
    writer = Writer()
    reporter = NodeAllocReporter(extender.metrics, None)
    assert await relief_once(extender, writer, reporter, wall_clock=lambda: WALL) == []
    assert writer.created == []


def _draining_extender(wall: list[float]) -> tuple[Extender, Writer]:
    """Drain on: node-a (8 cores) runs db (1 vCPU, a VirtualMachine's) beside a pod of a
    ReplicaSet, a DaemonSet's pod and a mirror pod; node-b (8 cores) runs a VM of 4, listed a
    hysteresis before ``wall`` now: node-a, below the drain's share, is the one to drain."""
    extender = _bare_extender(
        {"enabled": True, "drain": {"enabled": True}}, wall_clock=lambda: wall[0]
    )
    nodes = [msgspec.convert(node_object(n, cpu="8"), Node) for n in ("node-a", "node-b")]
    extender.nodes_listed(nodes)
    db = _owned(vm_pod("db-pod", uid=DB_UID, node="node-a", min_vcpus=1, max_vcpus=1), "db")
    big = _owned(vm_pod("big-pod", uid=WEB_UID, node="node-b", min_vcpus=4, max_vcpus=4), "big")
    others = []
    for name, owner, notes in (
        ("web", "ReplicaSet", None),
        ("agent", "DaemonSet", None),
        ("static", None, {"kubernetes.io/config.mirror": "hash"}),
    ):
        pod = pod_object(name, namespace="apps", uid=f"{name}-uid", node_name="node-a",
                         cpu="100m", memory="64Mi", scheduler_name="default-scheduler",
                         annotations=notes, phase="Running")  # fmt: skip
        if owner is not None:
            pod["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner,
                    "name": name,
                    "uid": "o",
                    "controller": True,
                }
            ]
        others.append(pod)
    extender.pods_listed([msgspec.convert(p, Pod) for p in (db, big, *others)])
    extender.migrations_listed([])
    # The list is where this ledger received its VMs: a drain waits a hysteresis from it, as
    # after any (re)start.
    assert extender.relief_pass().drain == []
    wall[0] += extender.config.relief.drain.hysteresis_seconds
    writer = Writer()
    writer.nodes = {n.metadata.name: n for n in nodes}
    return extender, writer


def _db_gone(extender: Extender) -> None:
    """db's pod is deleted from node-a (its move done)."""
    db = vm_pod("db-pod", uid=DB_UID, node="node-a", min_vcpus=1, max_vcpus=1)
    extender.pod_changed("DELETED", msgspec.convert(db, Pod))


def _evictions(extender: Extender) -> dict[str, float]:
    found = {
        outcome: extender.metrics.registry.get_sample_value(
            "vmautoscale_extender_relief_evictions_total", {"outcome": outcome}
        )
        for outcome in ("evicted", "gone", "refused", "failed")
    }
    return {k: v for k, v in found.items() if v is not None}


async def test_a_drain_taints_first_moves_the_vms_then_evicts_the_rest() -> None:
    wall = [WALL]
    extender, writer = _draining_extender(wall)
    reporter = NodeAllocReporter(extender.metrics, None)
    outcomes = await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    # Taint first, and its answer counts at once: the drain is in the book for the next pass.
    assert [(n, t.key, t.effect) for n, t in writer.tainted] == [
        ("node-a", DRAIN_TAINT, "NoSchedule")
    ]
    assert outcomes == [] and writer.evicted == []
    assert extender.relief_pass().drain == []
    assert extender.relief_book.draining == {"node-a"}
    # The VM moves (a migration to node-b); nothing is evicted while it is on node-a.
    outcomes = await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    assert [(m.pod, m.target, m.reason, o) for m, o in outcomes] == [
        ("vms/db-pod", "node-b", MoveReason.DRAIN, "created")
    ]
    assert writer.evicted == []
    # The VM's pod is gone from node-a: the ReplicaSet's pod is evicted, the others stay.
    _db_gone(extender)
    writer.evict_errors = [TooManyRequests("the budget", status=429, retry_after_seconds=0)]
    await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    assert writer.evicted == [("apps", "web", "web-uid")]
    assert _evictions(extender) == {"refused": 1.0}
    # Refused by its PodDisruptionBudget: not tried again before kubectl's 5 s ...
    wall[0] += 4.0
    await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    assert len(writer.evicted) == 1
    wall[0] += 1.0
    await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    assert len(writer.evicted) == 2 and _evictions(extender) == {"refused": 1.0, "evicted": 1.0}
    # ... and once accepted, not again while it terminates.
    await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    assert len(writer.evicted) == 2
    assert extender.relief_pass().emptied == []
    extender.pod_changed("DELETED", msgspec.convert(pod_object("web", namespace="apps",
                                                              uid="web-uid"), Pod))  # fmt: skip
    assert extender.relief_pass().emptied == ["node-a"]
    await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    gauge = "vmautoscale_extender_relief_nodes_emptied"
    assert extender.metrics.registry.get_sample_value(gauge) == 1


async def test_an_eviction_of_a_pod_already_gone_is_done() -> None:
    wall = [WALL]
    extender, writer = _draining_extender(wall)
    reporter = NodeAllocReporter(extender.metrics, None)
    await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    _db_gone(extender)
    writer.evict_errors = [NotFound("gone", status=404)]
    await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0] + 10)
    assert writer.evicted == [("apps", "web", "web-uid")]
    assert _evictions(extender) == {"gone": 1.0}


def _tainted(node: Node) -> Node:
    return replace(node, spec=replace(node.spec, taints=[DRAIN]))


async def test_a_drain_ends_when_its_taint_is_removed_and_a_restart_finds_it() -> None:
    wall = [WALL]
    extender, writer = _draining_extender(wall)
    reporter = NodeAllocReporter(extender.metrics, None)
    await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    node = writer.nodes["node-a"]
    extender.node_changed("MODIFIED", _tainted(node))  # the node watch shows the taint
    # A restarted extender lists the node with its taint: the drain goes on, none starts anew.
    again, _ = _draining_extender(wall)
    again.node_changed("MODIFIED", _tainted(node))
    assert again.relief_pass().drain == [] and again.relief_book.draining == {"node-a"}
    # The operator removes the taint: the drain is over (a later pass may start one again).
    extender.node_changed("MODIFIED", node)
    assert extender.relief_pass() is not None and extender.relief_book.draining == set()


async def test_a_node_event_from_before_the_taint_does_not_end_the_drain() -> None:
    """The taint's answer comes back before the node watch shows it, and the watch may first
    deliver a change made before the taint (a kubelet's status update): that node carries no
    taint. The drain goes on, and no pass starts it again (past ``drain.max_nodes``); once the
    watch has shown the taint, it alone says whether the node still drains."""
    wall = [WALL]
    extender, writer = _draining_extender(wall)
    reporter = NodeAllocReporter(extender.metrics, None)
    await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    node = writer.nodes["node-a"]
    extender.node_changed("MODIFIED", node)  # from before the taint
    wall[0] += 1.0
    assert extender.relief_pass().drain == []
    assert extender.relief_book.draining == {"node-a"}
    await relief_once(extender, writer, reporter, wall_clock=lambda: wall[0])
    assert [n for n, _ in writer.tainted] == ["node-a"]
    # A taint the watch never shows (a re-list may skip one put on and taken off between two
    # lists) stops counting after a while.
    wall[0] += TAINT_SEEN_WITHIN_SECONDS
    assert extender.relief_pass() is not None and extender.relief_book.draining == set()
