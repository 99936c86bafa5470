"""Relief's shell (``scheduler_extender.relief``): a grow cut short by its node becomes a
VirtualMachineMigration for the VM's VirtualMachine, with the plan's target and reason.

In process, on an ``Extender`` fed real pod and node objects and a real permit batch; the
writer records what would be POSTed (the API server's side of a create is the control-plane
tier's: ``tests/controlplane/test_virtualmachines.py`` creates migrations there).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from kube_io.errors import Conflict, KubeError, Unavailable
from kube_io.objects import ObjectReference
from protocol.kube import Node, Pod
from protocol.permits import ResourceRequestBatch
from protocol.virtualmachine import API_VERSION, KIND, VirtualMachineMigration, migration_manifest
from scheduler_extender.config import parse_config
from scheduler_extender.core.relief import MoveReason, PlannedMove
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


def _extender(*, enabled: bool = True, db_owned: bool = True) -> Extender:
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
        wall_clock=lambda: WALL,
        clock=lambda: now[0],
    )
    nodes = [node_object("node-a", cpu="4"), node_object("node-b", cpu="8")]
    extender.nodes_listed([msgspec.convert(n, Node) for n in nodes])
    db = vm_pod("db-pod", uid=DB_UID, node="node-a", min_vcpus=1, max_vcpus=4)
    if db_owned:
        db = _owned(db, "db")
    web = vm_pod("web-pod", uid=WEB_UID, node="node-a", min_vcpus=2, max_vcpus=2)
    extender.pods_listed([msgspec.convert(p, Pod) for p in (db, web)])
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
