"""Relief's shell (``scheduler_extender.relief``): a grow cut short by its node becomes a
VirtualMachineMigration for the VM's VirtualMachine, with the plan's target and reason.

In process, on an ``Extender`` fed real pod and node objects and a real permit batch; the
writer records what would be POSTed (the API server's side of a create is the control-plane
tier's: ``tests/controlplane/test_virtualmachines.py`` creates migrations there).
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import msgspec
import pytest
from msgspec.structs import replace
from prometheus_client import CollectorRegistry

from kube_io.errors import Conflict, KubeError, Unavailable
from kube_io.objects import ObjectReference
from protocol.kube import Node, Pod
from protocol.permits import ResourceRequestBatch
from protocol.virtualmachine import API_VERSION, KIND, VirtualMachineMigration, migration_manifest
from scheduler_extender.config import parse_config
from scheduler_extender.core.relief import MovePhase, MoveReason, MoveRecord, PlannedMove
from scheduler_extender.kube.node_alloc import NodeAllocReporter
from scheduler_extender.metrics import Metrics
from scheduler_extender.relief import REASON_LABEL, migration_for, relief_once
from scheduler_extender.service import Extender
from testkit.kube_api import node_object
from tests.extender.helpers import permit_batch, vm_pod

DB_UID = "0b7d0f52-2a5e-4c57-9d3e-9a1e2b3c4d5e"
WEB_UID = "1c8e1a63-3b6f-4d68-8e4f-ab2f3c4d5e6f"
WALL = 1_800_000_000.0


class Writer:
    def __init__(self, error: KubeError | None = None) -> None:
        self.created: list[VirtualMachineMigration] = []
        self.error = error

    async def create_virtual_machine_migration(self, migration: VirtualMachineMigration) -> None:
        self.created.append(migration)
        if self.error is not None:
            raise self.error


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


def _extender(
    *,
    enabled: bool = True,
    db_owned: bool = True,
    migrations: tuple[VirtualMachineMigration, ...] = (),
    wall: float = WALL,
) -> Extender:
    """node-a (4 cores, 3.2 usable) holds db (1 of up to 4) and web (2, made by hand);
    node-b (8 cores) is empty. db asks for 3: node-a has 0.2 left, so the grant is cut short."""
    config = parse_config({"relief": {"enabled": enabled}})
    metrics = Metrics(CollectorRegistry())
    now = [0.0]
    extender = Extender(
        config,
        metrics=metrics,
        reporter=NodeAllocReporter(metrics, None),
        recorder=None,
        binder=None,
        wall_clock=lambda: wall,
        clock=lambda: now[0],
    )
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
    config = parse_config({"relief": {"enabled": True}})
    metrics = Metrics(CollectorRegistry())
    extender = Extender(
        config,
        metrics=metrics,
        reporter=NodeAllocReporter(metrics, None),
        recorder=None,
        binder=None,
        clock=lambda: 0.0,
    )
    writer = Writer()
    reporter = NodeAllocReporter(metrics, None)
    assert await relief_once(extender, writer, reporter, wall_clock=lambda: WALL) == []
    assert writer.created == []
