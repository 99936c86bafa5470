"""The controller's pure decisions: the pod a VirtualMachine gets, and what a pass does."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler_agent.hypervisor.factory import socket_paths_from_url
from protocol import annotations as ann
from protocol.kube import Pod, Service
from protocol.quantity import memory_bytes
from protocol.virtualmachine import VirtualMachine
from vm_controller import decide

MI = 2**20
NOW = "2026-11-29T01:00:00Z"
LATER = "2026-11-29T02:00:00Z"


def make_vm(**spec: object) -> VirtualMachine:
    body = {
        "metadata": {"name": "pg", "namespace": "db", "uid": "vm-uid", "generation": 3},
        "spec": {"vcpus": {"min": 1, "max": 4}, "memory": {"min": "1Gi", "max": "2Gi"}, **spec},
    }
    return msgspec.convert(body, VirtualMachine)


def as_pod(manifest: dict[str, object], **status: object) -> Pod:
    return msgspec.convert({**manifest, "status": status}, Pod)


def own_service(vm: VirtualMachine) -> Service:
    return msgspec.convert(decide.desired_service(vm), Service)


def foreign_service(vm: VirtualMachine) -> Service:
    """A Service of the VM's name that a user (or the StatefulSet form) made: no owner."""
    return msgspec.convert({"metadata": {"name": vm.metadata.name, "namespace": "db"}}, Service)


@st.composite
def vms(draw: st.DrawFn) -> VirtualMachine:
    lo = draw(st.integers(1, 64))
    hi = draw(st.integers(lo, 128))
    unit = draw(st.integers(1, 8))
    mem_lo = draw(st.integers(1, 64)) * 128
    mem_hi = draw(st.one_of(st.none(), st.integers(mem_lo // 128, 128).map(lambda k: k * 128)))
    memory: dict[str, object] = {"min": draw(st.sampled_from([f"{mem_lo}Mi", mem_lo * MI]))}
    if mem_hi is not None:
        memory["max"] = f"{mem_hi}Mi"
    if draw(st.booleans()):
        memory["unit"] = "256Mi"
    name = draw(st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True))
    body = {
        "metadata": {"name": name, "namespace": "ns-1", "uid": "u"},
        "spec": {
            "vcpus": {"min": lo, "max": hi, "unit": unit},
            "memory": memory,
            "hypervisor": draw(st.sampled_from(["qmp+qga", "qmp"])),
            "neverMove": draw(st.booleans()),
        },
    }
    return msgspec.convert(body, VirtualMachine)


@given(vms())
def test_the_pod_carries_what_the_extender_and_the_agent_parse(vm: VirtualMachine):
    """Round trip: the annotations written for any admitted VirtualMachine parse, with
    ``protocol.annotations``' own parser, back to the VM's bounds, and its hypervisor URL to
    this pod's own socket below the agent's socket root."""
    pod = as_pod(decide.desired_pod(vm))
    assert ann.is_vm(pod.metadata.labels)
    spec = ann.parse_vm_spec(pod.metadata.annotations, pod_memory_bytes=0)
    memory = vm.spec.memory
    min_memory = memory_bytes(str(memory.min))
    assert (spec.min_vcpus, spec.max_vcpus, spec.scaling_unit) == (
        vm.spec.vcpus.min,
        vm.spec.vcpus.max,
        vm.spec.vcpus.unit,
    )
    assert spec.min_memory_bytes == min_memory
    assert spec.max_memory_bytes == (memory_bytes(str(memory.max)) if memory.max else min_memory)
    assert spec.memory_unit_bytes == (256 * MI if memory.unit else ann.DEFAULT_MEMORY_UNIT)
    # The opt-out the extender's relief reads (``VmSpec.is_movable``) is the VM's field.
    assert spec.is_movable is not vm.spec.never_move
    assert ann.vm_container_name(pod) == decide.VM_CONTAINER
    assert spec.hypervisor is not None
    # The agent sees the host's / at its socket root (manifests/config/agent.yaml: /host).
    root = Path("/host")
    scheme, qmp, _ = socket_paths_from_url(spec.hypervisor, root=root)
    assert scheme == vm.spec.hypervisor
    meta = vm.metadata
    assert qmp == root / "run/vm-autoscaling" / meta.namespace / meta.name / "qmp.sock"
    # The container asks for exactly the minimum plus QEMU's room, as a hand-written pod does.
    (container,) = pod.spec.containers or []
    assert container.resources is not None and container.resources.limits is not None
    assert memory_bytes(container.resources.limits["memory"]) == min_memory + 512 * MI
    assert container.resources.limits["cpu"] == str(vm.spec.vcpus.min)
    owner = (pod.metadata.owner_references or [])[0]
    assert (owner.kind, owner.uid, owner.controller) == ("VirtualMachine", "u", True)


@given(
    vms(),
    st.sampled_from([None, "Pending", "Running", "Failed"]),
    st.booleans(),
    st.sampled_from(["none", "own", "foreign"]),
)
def test_a_pass_is_idempotent(vm: VirtualMachine, phase: str | None, deleting: bool, svc: str):
    """Feeding a pass's status back gives the same status, however much later: the controller
    writes a status once per change, never in a loop; and an Event about a Service it must
    leave alone is sent once, not with every pass."""
    service = {"none": None, "own": own_service(vm), "foreign": foreign_service(vm)}[svc]
    pod = None
    if phase is not None:
        manifest = decide.desired_pod(vm)
        if deleting:
            manifest["metadata"]["deletionTimestamp"] = NOW
        pod = as_pod(manifest, phase=phase)
    first = decide.reconcile(vm, pod, service=service, now=NOW)
    again = decide.reconcile(
        msgspec.structs.replace(vm, status=first.status), pod, service=service, now=LATER
    )
    assert again.status == first.status
    # Never a second pod while one (even a terminating one) holds the name.
    assert (first.create_pod is not None) == (pod is None)
    # A Service is made only where none has the name; never one over another's.
    assert (first.create_service is not None) == (svc == "none")
    assert "ServiceConflict" not in {e.reason for e in again.events}
    assert (first.recheck_seconds is not None) == (svc == "foreign")
    # A pod made from the VM already says what the VM says, and serves; the Service made
    # from it selects it: nothing to patch.
    assert first.patch_pod_annotations is None
    assert first.patch_pod_labels is None
    assert first.patch_service_selector is None


@pytest.mark.parametrize(
    ("never_move", "on_pod", "patch"),
    [
        (True, None, {ann.NEVER_MOVE: "true"}),
        (True, "false", {ann.NEVER_MOVE: "true"}),
        (True, "true", None),
        (False, "true", {ann.NEVER_MOVE: None}),
        (False, "yes", {ann.NEVER_MOVE: None}),
        (False, "false", None),
        (False, None, None),
    ],
    ids=str,
)
def test_the_pod_follows_the_vms_never_move_field(
    never_move: bool, on_pod: str | None, patch: dict[str, str | None] | None
):
    """A VM that opts out (or back in) after its pod was made: its running pod is patched to
    say so, once; the field, not a hand edit of the pod, decides."""
    vm = make_vm(neverMove=never_move)
    manifest = decide.desired_pod(make_vm())
    annotations = manifest["metadata"]["annotations"]
    if on_pod is not None:
        annotations[ann.NEVER_MOVE] = on_pod
    pod = as_pod(manifest, phase="Running")
    actions = decide.reconcile(vm, pod, service=own_service(vm), now=NOW)
    assert actions.patch_pod_annotations == patch
    # Being deleted, or not its own: left alone.
    manifest["metadata"]["deletionTimestamp"] = NOW
    going = as_pod(manifest, phase="Running")
    assert decide.reconcile(vm, going, service=None, now=NOW).patch_pod_annotations is None


def test_the_service_selects_the_serving_pod_and_an_older_one_is_set_right():
    """The VM's Service selects the pod that serves (``SERVING_LABEL``); a pod and a Service
    an older controller made (the Service selecting every pod of the VM) are patched, the pod
    first; a move's source is not given the label back; another's Service is left alone."""
    vm = make_vm()
    manifest = decide.desired_pod(vm)
    del manifest["metadata"]["labels"][decide.SERVING_LABEL]
    old = decide.desired_service(vm)
    old["spec"]["selector"] = {decide.VM_NAME_LABEL: "pg", "app": "pg"}
    service = msgspec.convert(old, Service)
    actions = decide.reconcile(vm, as_pod(manifest, phase="Running"), service=service, now=NOW)
    assert actions.patch_pod_labels == {decide.SERVING_LABEL: "true"}
    assert actions.patch_service_selector == {
        "app": None,
        decide.VM_NAME_LABEL: "pg",
        decide.SERVING_LABEL: "true",
    }
    # A move's source (cut over, its label taken off) stays out.
    manifest["metadata"]["annotations"][ann.MIGRATION] = "move-1"
    source = as_pod(manifest, phase="Running")
    assert decide.reconcile(vm, source, service=service, now=NOW).patch_pod_labels is None
    # Another's Service of the VM's name: not touched.
    foreign = foreign_service(vm)
    assert decide.reconcile(vm, source, service=foreign, now=NOW).patch_service_selector is None


def test_never_move_defaults_to_false_and_reaches_a_moves_target_pod():
    assert make_vm().spec.never_move is False
    assert ann.NEVER_MOVE not in decide.pod_annotations(make_vm())
    target = decide.desired_pod(make_vm(neverMove=True))  # ``migrations.target_pod``'s base
    assert target["metadata"]["annotations"][ann.NEVER_MOVE] == "true"


def test_a_new_vm_gets_its_service_and_pod():
    actions = decide.reconcile(make_vm(), None, service=None, now=NOW)
    assert actions.create_service is not None
    assert actions.create_service["spec"]["selector"] == {
        decide.VM_NAME_LABEL: "pg",
        decide.SERVING_LABEL: "true",
    }
    assert actions.create_pod is not None
    assert actions.create_pod["spec"]["hostname"] == "pg"
    assert actions.create_pod["spec"]["subdomain"] == "pg"
    assert actions.create_pod["metadata"]["annotations"][ann.METRICS_URL] == (
        "http://pg.pg.db.svc:9100/metrics"
    )
    assert actions.status.phase == "Pending"
    assert actions.events == ()


def test_a_running_pod_reports_node_and_sizes():
    manifest = decide.desired_pod(make_vm())
    manifest["metadata"]["annotations"] |= {
        ann.PERMITTED_VCPUS: "3",
        ann.PERMITTED_MEMORY: "1536Mi",
        ann.MEMORY_OVERHEAD: "512Mi",
    }
    manifest["spec"]["nodeName"] = "node-a"
    pod = as_pod(
        manifest,
        phase="Running",
        conditions=[{"type": "Ready", "status": "True"}],
        containerStatuses=[{"name": "vm", "resources": {"limits": {"cpu": "2", "memory": "2Gi"}}}],
    )
    status = decide.reconcile(make_vm(), pod, service=own_service(make_vm()), now=NOW).status
    assert (status.phase, status.node, status.pod, status.observed_generation) == (
        "Running",
        "node-a",
        "pg",
        3,
    )
    assert status.vcpus is not None and status.memory is not None
    assert (status.vcpus.current, status.vcpus.permitted) == (2, 3)
    assert (status.memory.current, status.memory.permitted) == ("1536Mi", "1536Mi")
    (ready,) = status.conditions or []
    assert (ready.status, ready.reason, ready.last_transition_time) == ("True", "PodReady", NOW)


@pytest.mark.parametrize(
    ("phase", "deleting", "expected"),
    [
        ("Running", True, ("Restarting", False, None)),
        ("Failed", False, ("Failed", False, "pod-uid")),
        ("Failed", True, ("Restarting", False, None)),
    ],
    ids=["terminating-waits", "ended-is-deleted", "ended-and-terminating-waits"],
)
def test_a_pod_on_its_way_out(phase: str, deleting: bool, expected: tuple[str, bool, str | None]):
    manifest = decide.desired_pod(make_vm())
    manifest["metadata"]["uid"] = "pod-uid"
    if deleting:
        manifest["metadata"]["deletionTimestamp"] = NOW
    actions = decide.reconcile(
        make_vm(), as_pod(manifest, phase=phase), service=own_service(make_vm()), now=NOW
    )
    assert (
        actions.status.phase,
        actions.create_pod is not None,
        actions.delete_pod_uid,
    ) == expected


def test_a_pod_of_the_same_name_owned_by_another_is_left_alone():
    manifest = decide.desired_pod(make_vm())
    manifest["metadata"]["ownerReferences"] = []
    actions = decide.reconcile(
        make_vm(), as_pod(manifest, phase="Running"), service=own_service(make_vm()), now=NOW
    )
    assert (actions.create_pod, actions.delete_pod_uid, actions.status.pod) == (None, None, None)
    assert [e.reason for e in actions.events] == ["PodConflict"]
    assert actions.status.conditions is not None
    assert actions.status.conditions[0].reason == "PodConflict"


def test_a_gone_pod_is_created_again_with_an_event():
    vm = make_vm()
    vm = msgspec.structs.replace(vm, status=msgspec.structs.replace(vm.status, pod="pg"))
    actions = decide.reconcile(vm, None, service=own_service(make_vm()), now=NOW)
    assert actions.create_pod is not None
    assert [e.reason for e in actions.events] == ["Recreating"]


def test_a_service_of_the_same_name_owned_by_another_is_left_alone():
    """Never adopted nor rewritten (no owner: a user's; or the previous VM's of this name, on
    its way out with it): the VM says why it is not Ready, once as an Event, and looks again
    later, since no watch of its own tells it when the name is free."""
    vm = make_vm()
    manifest = decide.desired_pod(vm)
    manifest["spec"]["nodeName"] = "node-a"
    pod = as_pod(manifest, phase="Running", conditions=[{"type": "Ready", "status": "True"}])
    previous = msgspec.convert(
        {**decide.desired_service(vm), "metadata": {"name": "pg", "namespace": "db",
         "ownerReferences": [{"uid": "old-vm-uid", "controller": True}]}},
        Service,
    )  # fmt: skip
    for taken in (foreign_service(vm), previous):
        actions = decide.reconcile(vm, pod, service=taken, now=NOW)
        assert actions.create_service is None
        assert [(e.type, e.reason) for e in actions.events] == [("Warning", "ServiceConflict")]
        assert "not owned by this VirtualMachine" in actions.events[0].message
        (ready,) = actions.status.conditions or []
        assert (ready.status, ready.reason) == ("False", "ServiceConflict")
        # The pod itself is the VM's and runs: the status still says where.
        assert (actions.status.phase, actions.status.pod) == ("Running", "pg")
        assert actions.recheck_seconds == decide.SERVICE_RECHECK_SECONDS
    # Once the name is the VM's own again, Ready from the pod, and no more rechecks.
    was = msgspec.structs.replace(vm, status=actions.status)
    freed = decide.reconcile(was, pod, service=None, now=LATER)
    assert freed.create_service is not None and freed.recheck_seconds is None
    (ready,) = freed.status.conditions or []
    assert (ready.status, ready.reason, ready.last_transition_time) == ("True", "PodReady", LATER)


def test_the_pod_and_the_service_are_valid_v1_36_objects():
    """The official schemas, strict (unknown fields fail): what the controller POSTs is what
    the API server accepts (tests/controlplane/test_virtualmachines.py posts it for real)."""
    import kubernetes_validate

    vm = make_vm(ports=[{"name": "postgres", "port": 5432}], nodeSelector={"disk": "ssd"})
    for manifest in (decide.desired_pod(vm), decide.desired_service(vm)):
        assert kubernetes_validate.validate(manifest, "1.36", strict=True) == "1.36"
