"""The migration controller's pure rules: which moves are refused and why, the target pod, the
VM's one pod during and after a move, and what a restarted controller does with a move."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import annotations as ann
from protocol.kube import Pod
from protocol.virtualmachine import RELIEF_LABEL, VirtualMachine, VirtualMachineMigration
from tests.vm_controller.test_decide import NOW, as_pod, make_vm, vms
from vm_controller import decide, migrations
from vm_controller.migrations import Plan, Refusal, Refused

VMM_UID = "6f1c2d3e-4b5a-4789-9abc-def012345678"


def make_vmm(
    target: str | None = "node-b", *, vm: str = "pg", name: str = "move-1", uid: str = VMM_UID,
    phase: str | None = None,
) -> VirtualMachineMigration:  # fmt: skip
    spec: dict[str, Any] = {"vmName": vm}
    if target is not None:
        spec["targetNode"] = target
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "db", "uid": uid},
        "spec": spec,
    }
    if phase is not None:
        body["status"] = {"phase": phase}
    return msgspec.convert(body, VirtualMachineMigration)


def running_pod(vm: VirtualMachine, *, node: str = "node-a", **meta: Any) -> Pod:
    manifest = decide.desired_pod(vm)
    manifest["metadata"].update({"uid": "src-uid", **meta})
    manifest["spec"]["nodeName"] = node
    return as_pod(manifest, phase="Running", podIP="10.0.0.5")


def test_a_move_of_a_running_vm_is_planned() -> None:
    vm = make_vm()
    source = running_pod(vm)
    plan = migrations.admit(make_vmm(), vm, source, [])
    assert plan == Plan(
        source_pod="pg",
        source_uid="src-uid",
        source_node="node-a",
        target_pod="pg-m6f1c2d3e",
        target_node="node-b",
    )


def _refusal(
    vmm: VirtualMachineMigration,
    vm: VirtualMachine | None,
    source: Pod | None,
    others: list[VirtualMachineMigration] | None = None,
) -> str:
    decided = migrations.admit(vmm, vm, source, others or [])
    assert isinstance(decided, Refused), decided
    assert decided.message
    return decided.reason


def test_refusals_name_their_reason() -> None:
    vm = make_vm()
    source = running_pod(vm)
    assert _refusal(make_vmm(), None, None) == Refusal.VM_NOT_FOUND
    deleting = msgspec.convert(
        {**msgspec.to_builtins(vm), "metadata": {"name": "pg", "namespace": "db", "uid": "vm-uid",
                                                 "deletionTimestamp": NOW}},
        VirtualMachine,
    )  # fmt: skip
    assert _refusal(make_vmm(), deleting, source) == Refusal.VM_NOT_FOUND
    assert _refusal(make_vmm(), vm, None) == Refusal.VM_NOT_RUNNING
    pending = as_pod(msgspec.to_builtins(source) | {"status": {}}, phase="Pending")
    assert _refusal(make_vmm(), vm, pending) == Refusal.VM_NOT_RUNNING
    foreign = running_pod(vm, ownerReferences=[])
    assert _refusal(make_vmm(), vm, foreign) == Refusal.VM_NOT_RUNNING
    assert _refusal(make_vmm("node-a"), vm, source) == Refusal.SAME_NODE
    # No target named: admitted, the node left to the extender's reservation.
    chosen = migrations.admit(make_vmm(None), vm, source, [])
    assert isinstance(chosen, Plan) and chosen.target_node is None
    assert migrations.placed(chosen, "node-c").target_node == "node-c"
    assert migrations.placed(chosen, None).target_node is None  # refused by the shell
    named = migrations.admit(make_vmm(), vm, source, [])
    assert isinstance(named, Plan)
    assert migrations.placed(named, "node-b") == named == migrations.placed(named, None)
    with_disk = make_vm(runnerArgs=["--disk=/var/lib/vm/pg.img"])
    assert _refusal(make_vmm(), with_disk, running_pod(with_disk)) == Refusal.LOCAL_DISK
    other = make_vmm(name="move-0", uid="00000000-0000-4000-8000-000000000000", phase="Running")
    assert _refusal(make_vmm(), vm, source, [other]) == Refusal.ALREADY_MOVING
    marked = running_pod(vm, annotations={**(source.metadata.annotations or {}),
                                          ann.MIGRATION: "move-0"})  # fmt: skip
    assert _refusal(make_vmm(), vm, marked) == Refusal.ALREADY_MOVING
    # A finished migration of the same VM, or one of another VM, does not stand in the way.
    done = make_vmm(name="move-0", uid="00000000-0000-4000-8000-000000000000", phase="Succeeded")
    elsewhere = make_vmm(vm="other", name="m", uid="10000000-0000-4000-8000-000000000000",
                         phase="Running")  # fmt: skip
    assert isinstance(migrations.admit(make_vmm(), vm, source, [done, elsewhere]), Plan)


@pytest.mark.parametrize(
    ("never_move", "by_relief", "refused"),
    [
        ("true", True, True),
        ("bogus", True, True),  # unreadable: counted as opted out
        ("false", True, False),
        (None, True, False),
        ("true", False, False),  # a human asked for this move: carried out
    ],
)
def test_never_move_refuses_reliefs_migrations_only(
    never_move: str | None, by_relief: bool, refused: bool
) -> None:
    vm = make_vm()
    plain = running_pod(vm)
    annotations = dict(plain.metadata.annotations or {})
    if never_move is not None:
        annotations[ann.NEVER_MOVE] = never_move
    source = running_pod(vm, annotations=annotations)
    vmm = make_vmm()
    if by_relief:
        labels = {RELIEF_LABEL: "GrowerToRoom"}
        vmm = msgspec.structs.replace(
            vmm, metadata=msgspec.structs.replace(vmm.metadata, labels=labels)
        )
    decided = migrations.admit(vmm, vm, source, [])
    if refused:
        assert isinstance(decided, Refused) and decided.reason == Refusal.NEVER_MOVE
        assert "never-move" in decided.message
    else:
        assert isinstance(decided, Plan)


def test_a_vm_that_opted_out_before_its_pod_was_patched_is_not_moved_by_relief() -> None:
    """``spec.neverMove`` set, the controller's patch of the running pod not yet made: the
    VirtualMachine's own word counts."""
    vm = make_vm(neverMove=True)
    plain = running_pod(make_vm())
    assert ann.NEVER_MOVE not in (plain.metadata.annotations or {})
    source = running_pod(vm, annotations=dict(plain.metadata.annotations or {}))
    vmm = make_vmm()
    by_relief = msgspec.structs.replace(
        vmm, metadata=msgspec.structs.replace(vmm.metadata, labels={RELIEF_LABEL: "Watermark"})
    )
    decided = migrations.admit(by_relief, vm, source, [])
    assert isinstance(decided, Refused) and decided.reason == Refusal.NEVER_MOVE
    assert isinstance(migrations.admit(vmm, vm, source, []), Plan)  # a human's move


@given(
    vm=vms(),
    uid=st.uuids().map(str),
    source_node=st.sampled_from(["node-a", "node-b"]),
    target=st.one_of(st.none(), st.sampled_from(["node-a", "node-b", "node-c"])),
)
def test_a_plan_never_targets_the_source_node_nor_reuses_the_pod_name(
    vm: VirtualMachine, uid: str, source_node: str, target: str | None
) -> None:
    vmm = make_vmm(target, vm=vm.metadata.name, uid=uid)
    source = running_pod(vm, node=source_node)
    decided = migrations.admit(vmm, vm, source, [])
    if isinstance(decided, Plan):
        assert decided.target_node == target != source_node
        assert decided.target_pod != decided.source_pod
        # Derived from the migration alone: a restarted controller finds the same pod.
        assert decided.target_pod == migrations.target_pod_name(vmm)
        assert len(decided.target_pod) <= 253
    else:
        assert target in (None, source_node)


@given(vm=vms())
def test_the_target_pod_is_the_vms_pod_in_incoming_mode_at_the_sources_size(
    vm: VirtualMachine,
) -> None:
    source_manifest = decide.desired_pod(vm)
    # The source was resized in place and holds a permit; both travel.
    vm_container = source_manifest["spec"]["containers"][0]
    vm_container["resources"] = {"limits": {"cpu": "7", "memory": "9Gi"},
                                 "requests": {"cpu": "7", "memory": "9Gi"}}  # fmt: skip
    source_manifest["metadata"]["annotations"][ann.PERMITTED_VCPUS] = "7"
    source_manifest["spec"]["nodeName"] = "node-a"
    source = as_pod(source_manifest, phase="Running")
    plan = Plan(source_pod=vm.metadata.name, source_uid="s", source_node="node-a",
                target_pod=vm.metadata.name + "-mabc", target_node="node-b")  # fmt: skip
    target = migrations.target_pod(vm, source, plan, "move-1")
    assert target["metadata"]["name"] == plan.target_pod
    assert target["spec"]["nodeName"] == "node-b"
    assert target["metadata"]["labels"][migrations.TARGET_LABEL] == "move-1"
    # Not in the VM's Service before cut-over: its name resolves to the source alone.
    assert decide.SERVING_LABEL not in target["metadata"]["labels"]
    assert source_manifest["metadata"]["labels"][decide.SERVING_LABEL] == "true"
    assert target["metadata"]["annotations"][ann.MIGRATION] == "move-1"
    assert target["metadata"]["annotations"][ann.PERMITTED_VCPUS] == "7"
    assert target["metadata"]["annotations"][ann.HYPERVISOR].endswith(
        f"/{vm.metadata.namespace}/{plan.target_pod}/qmp.sock"
    )
    (container,) = target["spec"]["containers"]
    # The same device set, machine type, memory region and block size: the same flags.
    assert container["args"] == [
        *vm_container["args"],
        f"--incoming-port={migrations.INCOMING_PORT}",
    ]
    assert f"--migration-port={migrations.QMP_PORT}" in container["args"]
    assert container["resources"]["limits"] == {"cpu": "7", "memory": "9Gi"}
    # Owned by the VM (the garbage collector removes it with the VM), one controller.
    assert target["metadata"]["ownerReferences"] == source_manifest["metadata"]["ownerReferences"]


pod_names = st.sampled_from(["pg", "pg-m1", "pg-m2", "pg-x"])


@given(
    pods=st.dictionaries(pod_names, st.booleans()),
    status_pod=st.one_of(st.none(), pod_names),
)
def test_the_vm_has_one_pod_and_never_a_moves_target(
    pods: dict[str, bool], status_pod: str | None
) -> None:
    """``pods``: name -> whether it is a move's target (labelled)."""
    vm = make_vm()
    if status_pod is not None:
        vm = msgspec.structs.replace(vm, status=msgspec.structs.replace(vm.status, pod=status_pod))
    objects = {
        name: as_pod({"metadata": {"name": name, "namespace": "db",
                                   "labels": {migrations.TARGET_LABEL: "m"} if target else {}}})
        for name, target in pods.items()
    }  # fmt: skip
    chosen = decide.current_pod(vm, objects)
    settled = sorted(n for n, target in pods.items() if not target)
    if not settled:
        assert chosen is None
        return
    assert chosen is not None and chosen.metadata.name in settled
    if status_pod in settled:
        assert chosen.metadata.name == status_pod
    elif "pg" in settled:
        assert chosen.metadata.name == "pg"


def _pod(name: str, *, phase: str = "Running", labels: dict[str, str] | None = None,
         deleting: bool = False) -> Pod:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": "db", "labels": labels or {}}
    if deleting:
        meta["deletionTimestamp"] = NOW
    return as_pod({"metadata": meta}, phase=phase)


TARGET = {migrations.TARGET_LABEL: "move-1"}


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        # Mid-transfer: half a transfer cannot be resumed; the source runs on.
        (_pod("pg"), _pod("pg-m1", labels=TARGET), "abort"),
        # The target never started, or is gone.
        (_pod("pg"), None, "abort"),
        (_pod("pg"), _pod("pg-m1", phase="Pending", labels=TARGET), "abort"),
        (_pod("pg"), _pod("pg-m1", labels=TARGET, deleting=True), "abort"),
        # Cut-over had begun (the target's label is off first): finish it.
        (_pod("pg"), _pod("pg-m1"), "finish"),
        # The source is gone or going and the target runs: the move had cut over.
        (None, _pod("pg-m1", labels=TARGET), "finish"),
        (_pod("pg", deleting=True), _pod("pg-m1", labels=TARGET), "finish"),
        # Neither runs: nothing to finish; the VirtualMachine controller starts the VM again.
        (None, None, "abort"),
    ],
)
def test_a_restarted_controller_finishes_only_moves_that_had_cut_over(
    source: Pod | None, target: Pod | None, expected: str
) -> None:
    assert migrations.recover(source, target) == expected


def test_statuses() -> None:
    plan = Plan(source_pod="pg", source_uid="s", source_node="node-a", target_pod="pg-m1",
                target_node="node-b")  # fmt: skip
    started = migrations.started(plan, now=NOW)
    assert started.phase == "Running" and started.start_time == NOW
    assert (started.source_pod, started.target_pod) == ("pg", "pg-m1")
    done = migrations.finished(started, succeeded=True, reason="Completed", message="ok",
                               now=NOW, downtime_ms=42, total_ms=900)  # fmt: skip
    assert done.phase == "Succeeded" and done.downtime_milliseconds == 42
    assert done.start_time == NOW and done.completion_time == NOW
    (condition,) = done.conditions or []
    assert (condition.type, condition.status, condition.reason) == (
        "Succeeded",
        "True",
        "Completed",
    )
    refused = migrations.refused(make_vmm(), Refused(reason="NoRoom", message="full"), now=NOW)
    assert refused.phase == "Failed" and refused.start_time is None
    (condition,) = refused.conditions or []
    assert (condition.status, condition.reason, condition.message) == ("False", "NoRoom", "full")


def test_a_move_that_cannot_start_names_which_side_kept_it() -> None:
    vm = make_vm()
    source = running_pod(vm)
    target = as_pod(decide.desired_pod(vm), phase="Running", podIP="10.0.0.9")
    no_ip = as_pod(decide.desired_pod(vm), phase="Running")
    gone = msgspec.structs.replace(source.metadata, deletion_timestamp=NOW)
    deleted = msgspec.structs.replace(source, metadata=gone)
    cannot = migrations.cannot_start
    # Before the target is waited for: only the source decides.
    assert cannot(source, None, waited=False) is None
    assert cannot(None, None, waited=False) == migrations.NotStarted.SOURCE_GONE
    assert cannot(deleted, None, waited=False) == migrations.NotStarted.SOURCE_GONE
    assert cannot(no_ip, None, waited=False) == migrations.NotStarted.SOURCE_WITHOUT_IP
    # After: the target too; a source without an IP is named as such, never as the target.
    assert cannot(source, target, waited=True) is None
    assert cannot(source, None, waited=True) == migrations.NotStarted.TARGET_NEVER_READY
    assert cannot(source, no_ip, waited=True) == migrations.NotStarted.TARGET_NEVER_READY
    assert cannot(no_ip, None, waited=True) == migrations.NotStarted.SOURCE_WITHOUT_IP
