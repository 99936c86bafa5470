"""VirtualMachine objects through the real kube-apiserver: the CRDs of manifests/vm-controller/
install, their validation refuses bad objects with the field named, and the real
``vm-controller`` process, under the ServiceAccount and RBAC of those manifests, makes the pod,
the Service and the status, and makes the pod again when it goes.

One module-scoped controller for every test here, on the session's control plane, beside the
module's extender and kube-scheduler (``cluster``): a migration's reservation is the real
extender's, asked with the controller's own ServiceAccount token (TokenReview). Most tests keep
their VMs off the cluster's nodes and bind the pod and report its phase as kube-scheduler and
the kubelet would; there is no kubelet, so no pod ever really runs.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import annotations as ann
from protocol.virtualmachine import migration_manifest
from scheduler_extender.core.relief import MoveReason, PlannedMove
from scheduler_extender.relief import REASON_LABEL, migration_for
from testkit.cluster import Cluster, Names, new_extender
from testkit.controlplane import (
    DOCS,
    ApiError,
    ControlPlane,
    Obj,
    install_crds,
    object_path,
    pod_path,
    wait_for,
)
from testkit.manifests import EXAMPLES, VM_CONTROLLER, render
from testkit.ports import free_port

GROUP_PATH = "/apis/vm-autoscaling.io/v1alpha1"
CRDS = [d for d in render(VM_CONTROLLER) if d["kind"] == "CustomResourceDefinition"]
# The namespace the ServiceAccount lives in comes from manifests/.
RBAC = [d for d in DOCS if d["kind"] == "Namespace"] + [
    d
    for d in render(VM_CONTROLLER)
    if d["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
]
KUBECTL = Path(sys.executable).with_name("kubectl")


def vm_path(namespace: str, name: str = "") -> str:
    base = f"{GROUP_PATH}/namespaces/{namespace}/virtualmachines"
    return f"{base}/{name}" if name else base


def vm_body(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "vm-autoscaling.io/v1alpha1",
        "kind": "VirtualMachine",
        "metadata": {"name": name},
        "spec": {
            "vcpus": {"min": 1, "max": 4},
            "memory": {"min": "1Gi", "max": "2Gi"},
            # The session's other modules run kube-scheduler and the extender: a runner pod of
            # this module must never land on (and count against) one of their nodes.
            "nodeSelector": {"vma-test-group": "no-such-group"},
            **spec,
        },
    }


@pytest.fixture
def vms_removed(names: Names) -> Iterator[Names]:
    """``names``, and the VMs of its namespace deleted before ``names`` deletes the pods, so
    the controller does not make them again (there is no garbage collector in this tier)."""
    yield names
    for vm in names.api.get(vm_path(names.namespace))["items"]:
        names.api.delete(vm_path(names.namespace, vm["metadata"]["name"]))


# A move's target pod never runs here (no kubelet): it fails this soon.
TARGET_POD_TIMEOUT_SECONDS = 2


@pytest.fixture(scope="module")
def controller(
    control_plane: ControlPlane, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The CRDs installed, and ``vm-controller`` running as the manifests' ServiceAccount,
    reserving moves at ``cluster``'s extender; yields the admin kubeconfig (for kubectl)."""
    api = control_plane.admin()
    try:
        token = _install(api)
        # What the Deployment projects: a token of its ServiceAccount for the extender.
        extender_token = api.request_token("vm-autoscaling", "vm-controller")
    finally:
        api.close()
    work = tmp_path_factory.mktemp("vm-controller")
    kubeconfig = control_plane.write_kubeconfig(work / "controller.kubeconfig", token=token)
    token_file = work / "extender-token"
    token_file.write_text(extender_token)
    log = (work / "stderr").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vm_controller",
            "--kubeconfig",
            str(kubeconfig),
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(free_port()),
            "--log-level",
            "debug",
            "--extender-url",
            f"http://127.0.0.1:{cluster.extender.permits_port}",
            "--extender-token-file",
            str(token_file),
            "--migration-target-pod-timeout-seconds",
            str(TARGET_POD_TIMEOUT_SECONDS),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "NO_PROXY": "127.0.0.1"},
    )
    try:
        yield control_plane.work / "admin.kubeconfig"
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()
        tail = (work / "stderr").read_text(errors="replace").splitlines()[-20:]
        print("\n".join(tail))  # shown by pytest when a test of the module failed
    assert process.returncode == 0, tail


def _install(api: Any) -> str:
    for doc in RBAC:
        try:
            api.create(object_path(doc), doc)
        except ApiError as e:
            if e.status != 409:
                raise
    install_crds(api, CRDS)
    token: str = api.request_token("vm-autoscaling", "vm-controller", audience=None)
    return token


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"vcpus": {"min": 4, "max": 2}}, "spec.vcpus.min", "vcpus.min must not be above"),
        ({"memory": {"min": "2Gi", "max": "1Gi"}}, "spec.memory.min", "memory.min must not"),
        ({"memory": {"min": "1 GB"}}, "spec.memory.min", "should match"),
        ({"hypervisor": "xen"}, "spec.hypervisor", "Unsupported value"),
        ({"vcpus": {"min": 0, "max": 2}}, "spec.vcpus.min", "greater than or equal to 1"),
        ({"ports": [{"name": "metrics", "port": 9100}]}, "spec.ports", "always exposed"),
        ({"neverMove": "yes"}, "spec.neverMove", "must be of type boolean"),
    ],
    ids=[
        "vcpus-min-above-max",
        "memory-min-above-max",
        "malformed-quantity",
        "unknown-hypervisor",
        "zero-vcpus",
        "port-taken",
        "never-move-not-a-boolean",
    ],
)
def test_bad_virtual_machines_are_refused_naming_the_field(
    controller: Path, names: Names, spec: Obj, field: str, words: str
):
    with pytest.raises(ApiError) as refused:
        names.api.create(vm_path(names.namespace), vm_body("bad", **spec))
    assert refused.value.status == 422
    body = refused.value.body
    assert isinstance(body, dict)
    causes = body["details"]["causes"]
    assert any(c.get("field") == field and words in c["message"] for c in causes), causes
    assert names.api.get(vm_path(names.namespace))["items"] == []


def test_migrations_need_a_vm_and_keep_their_spec(controller: Path, names: Names):
    path = f"{GROUP_PATH}/namespaces/{names.namespace}/virtualmachinemigrations"
    body: Obj = {
        "apiVersion": "vm-autoscaling.io/v1alpha1",
        "kind": "VirtualMachineMigration",
        "metadata": {"name": "move"},
        "spec": {},
    }
    with pytest.raises(ApiError) as refused:
        names.api.create(path, body)
    assert refused.value.status == 422 and "spec.vmName" in str(refused.value.body)
    names.api.create(path, {**body, "spec": {"vmName": "pg"}})
    with pytest.raises(ApiError) as changed:
        names.api.merge_patch(f"{path}/move", {"spec": {"targetNode": "elsewhere"}})
    assert changed.value.status == 422 and "immutable" in str(changed.value.body)


def test_the_examples_and_plain_byte_counts_are_admitted(controller: Path, names: Names):
    examples = [d for d in (EXAMPLES, EXAMPLES / "double") for d in render(d)]
    assert [d["kind"] for d in examples] == ["VirtualMachine"] * 3
    for example in examples:
        example["metadata"]["namespace"] = names.namespace
        names.api.create(vm_path(names.namespace), example, dry_run=True)
    # A quantity may be a plain number of bytes, compared as a quantity with the other bound.
    plain = vm_body("plain", memory={"min": 2**30, "max": "2Gi", "unit": 2**27})
    names.api.create(vm_path(names.namespace), plain, dry_run=True)
    with pytest.raises(ApiError) as refused:
        too_big = vm_body("plain", memory={"min": 3 * 2**30, "max": "2Gi"})
        names.api.create(vm_path(names.namespace), too_big, dry_run=True)
    assert refused.value.status == 422


def test_the_controller_makes_pod_service_and_status_and_remakes_the_pod(
    controller: Path, vms_removed: Names
):
    api, ns = vms_removed.api, vms_removed.namespace
    api.create(vm_path(ns), vm_body("pg", ports=[{"name": "postgres", "port": 5432}]))
    vm = api.get(vm_path(ns, "pg"))

    pod = wait_for(lambda: _get(api, pod_path(ns, "pg")), timeout_seconds=20, what="the pod")
    # What the extender and the agent read, as they read it.
    spec = ann.parse_vm_spec(pod["metadata"]["annotations"], pod_memory_bytes=0)
    assert (spec.min_vcpus, spec.max_vcpus, spec.max_memory_bytes) == (1, 4, 2 * 2**30)
    assert spec.hypervisor == f"qmp+qga:///run/vm-autoscaling/{ns}/pg/qmp.sock"
    assert spec.metrics_url == f"http://pg.pg.{ns}.svc:9100/metrics"
    assert ann.is_vm(pod["metadata"]["labels"])
    (owner,) = pod["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "VirtualMachine",
        vm["metadata"]["uid"],
        True,
    )
    service = wait_for(
        lambda: _get(api, f"/api/v1/namespaces/{ns}/services/pg"),
        timeout_seconds=20,
        what="the service",
    )
    assert service["spec"]["clusterIP"] == "None"
    assert {p["name"] for p in service["spec"]["ports"]} == {"node-exporter", "postgres"}

    # kube-scheduler's part, then the kubelet's; and the extender's durable permit.
    api.create(
        pod_path(ns, "pg") + "/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "pg"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
        },
    )
    api.merge_patch(pod_path(ns, "pg"), {"metadata": {"annotations": {ann.PERMITTED_VCPUS: "2"}}})
    api.set_pod_phase(ns, "pg", "Running")

    def running() -> Obj | None:
        status: Obj = api.get(vm_path(ns, "pg")).get("status", {})
        return status if status.get("phase") == "Running" else None

    status = wait_for(running, timeout_seconds=20, what="the VM's status Running")
    assert (status["node"], status["pod"]) == ("node-a", "pg")
    assert status["vcpus"] == {"current": 1, "permitted": 2}
    assert status["memory"] == {"current": "1Gi", "permitted": "1Gi"}
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Ready", "True")]

    table = subprocess.run(
        [
            str(KUBECTL),
            "--kubeconfig",
            str(controller),
            "get",
            "vm",
            "-n",
            ns,
            "--no-headers",
            "-o",
            "custom-columns=X:.metadata.name",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert table.split() == ["pg"]
    shown = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(controller), "get", "vm", "-n", ns],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    header, row = shown[0].split(), shown[1].split()
    assert header[:8] == [
        "NAME",
        "PHASE",
        "NODE",
        "POD",
        "VCPUS",
        "PERMITTED-VCPUS",
        "MEMORY",
        "PERMITTED-MEMORY",
    ]
    assert row[:8] == ["pg", "Running", "node-a", "pg", "1", "2", "1Gi", "1Gi"]

    # The pod goes, slowly (a finalizer holds it, as a kubelet does during the guest's
    # shutdown): the VM says Restarting and no second pod appears while the first terminates.
    first_uid = pod["metadata"]["uid"]
    api.merge_patch(pod_path(ns, "pg"), {"metadata": {"finalizers": ["test.vm/hold"]}})
    api.delete(pod_path(ns, "pg"), grace_seconds=None)
    wait_for(
        lambda: api.get(vm_path(ns, "pg"))["status"].get("phase") == "Restarting",
        timeout_seconds=20,
        what="the VM's status Restarting",
    )
    held = api.get(pod_path(ns, "pg"))
    assert held["metadata"]["uid"] == first_uid and held["metadata"]["deletionTimestamp"]
    # Once it is gone, a new one (a new UID) takes its place, and the VM says so.
    api.merge_patch(pod_path(ns, "pg"), {"metadata": {"finalizers": None}})
    api.delete(pod_path(ns, "pg"))
    remade = wait_for(
        lambda: (p := _get(api, pod_path(ns, "pg"))) and p["metadata"]["uid"] != first_uid and p,
        timeout_seconds=20,
        what="the pod made again",
    )
    assert remade["spec"].get("nodeName") is None
    reasons = wait_for(
        lambda: (
            {"PodCreated", "ServiceCreated", "Recreating"}
            <= {e["reason"] for e in api.events_for(ns, "pg")}
            and {e["reason"] for e in api.events_for(ns, "pg")}
        ),
        timeout_seconds=20,
        what="the VM's Events",
    )
    assert "ReconcileFailed" not in reasons


def test_a_vms_never_move_field_reaches_its_pod_and_follows_it(
    controller: Path, vms_removed: Names
):
    """``spec.neverMove`` (default false) is what the extender's relief and the migration
    controller read on the pod: the controller writes it on the pod it makes, and patches the
    running pod when the field changes."""
    api, ns = vms_removed.api, vms_removed.namespace
    api.create(vm_path(ns), vm_body("stay", neverMove=True))
    assert api.get(vm_path(ns, "stay"))["spec"]["neverMove"] is True

    def movable() -> bool | None:
        pod = _get(api, pod_path(ns, "stay"))
        if pod is None:
            return None
        return ann.parse_vm_spec(pod["metadata"]["annotations"], pod_memory_bytes=0).is_movable

    wait_for(lambda: movable() is False, timeout_seconds=20, what="the pod's never-move")
    api.merge_patch(vm_path(ns, "stay"), {"spec": {"neverMove": False}})
    wait_for(lambda: movable() is True, timeout_seconds=20, what="the never-move removed")
    # Left out, the API server defaults it.
    api.create(vm_path(ns), vm_body("free"))
    assert api.get(vm_path(ns, "free"))["spec"]["neverMove"] is False


def _instant(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp)


def test_reliefs_book_is_rebuilt_from_the_migrations(
    controller: Path,
    control_plane: ControlPlane,
    extender_kubeconfig: Path,
    names: Names,
    tmp_path: Path,
):
    """What a restarted (or newly leading) extender's relief knows of moves comes from the
    VirtualMachineMigrations, under the manifests' RBAC: listed as it starts (a refused one,
    with its times as the API server and the vm-controller wrote them: its VM's backoff), and
    followed by the watch (deleted: forgotten)."""
    api, ns = names.api, names.namespace
    api.create(
        vmm_path(ns),
        {
            "apiVersion": "vm-autoscaling.io/v1alpha1",
            "kind": "VirtualMachineMigration",
            "metadata": {"name": "refused"},
            "spec": {"vmName": "nowhere", "targetNode": "elsewhere"},
        },
    )

    def refused() -> Obj | None:
        found: Obj = api.get(vmm_path(ns, "refused"))
        return found if found.get("status", {}).get("phase") == "Failed" else None

    made = wait_for(refused, timeout_seconds=20, what="the migration refused (VMNotFound)")
    extender = new_extender(control_plane, extender_kubeconfig, tmp_path, relief={"enabled": True})
    extender.start()
    try:

        def in_book() -> Obj | None:
            book = extender.state().get("migrations", [])
            return next((m for m in book if m["migration"] == f"{ns}/refused"), None)

        record = wait_for(in_book, timeout_seconds=20, what="the migration in relief's book")
        assert (record["vm"], record["toNode"], record["phase"]) == (
            f"{ns}/nowhere",
            "elsewhere",
            "Failed",
        )
        assert _instant(record["createdAt"]) == _instant(made["metadata"]["creationTimestamp"])
        assert _instant(record["endedAt"]) == _instant(made["status"]["completionTime"])
        api.delete(vmm_path(ns, "refused"))
        wait_for(lambda: in_book() is None, timeout_seconds=20, what="the deletion watched")
    finally:
        extender.stop()


def _get(api: Any, path: str) -> Obj | None:
    try:
        got: Obj = api.get(path)
    except ApiError as e:
        if e.status == 404:
            return None
        raise
    return got


def vmm_path(namespace: str, name: str = "") -> str:
    base = f"{GROUP_PATH}/namespaces/{namespace}/virtualmachinemigrations"
    return f"{base}/{name}" if name else base


def test_migrations_that_cannot_be_made_are_refused_with_nothing_done(
    controller: Path, vms_removed: Names
):
    """Each refusal the controller decides alone (vm_controller/migrations.py ``admit``): the
    migration Failed with the reason in its condition, an Event, and no target pod, no mark on
    the VM's pod. (The extender's refusals, NoRoom among them: tests/extender/test_moves.py.)"""
    api, ns = vms_removed.api, vms_removed.namespace

    def move(name: str, **spec: Any) -> None:
        body: Obj = {
            "apiVersion": "vm-autoscaling.io/v1alpha1",
            "kind": "VirtualMachineMigration",
            "metadata": {"name": name},
            "spec": {"vmName": "pg", **spec},
        }
        api.create(vmm_path(ns), body)

    def refused(name: str) -> Obj:
        def failed() -> Obj | None:
            status: Obj = api.get(vmm_path(ns, name)).get("status", {})
            return status if status.get("phase") == "Failed" else None

        status = wait_for(failed, timeout_seconds=20, what=f"migration {name} refused")
        (condition,) = status["conditions"]
        assert condition["type"] == "Succeeded" and condition["status"] == "False"
        assert condition["message"]
        return condition

    move("no-vm", targetNode="node-b")
    assert refused("no-vm")["reason"] == "VMNotFound"
    # What relief sends (scheduler_extender/relief.py) is an object the API server takes whole
    # (apiVersion and kind included), and the controller decides on it like any other.
    planned = PlannedMove(
        uid="0", pod=f"{ns}/gone", source="node-a", target="node-b",
        reason=MoveReason.NEIGHBOUR, message="a neighbour cut short",
    )  # fmt: skip
    made = api.create(
        vmm_path(ns), migration_manifest(migration_for(planned, vm_name="gone", at=1))
    )
    assert made["metadata"]["labels"] == {REASON_LABEL: "NeighbourAway"}
    assert refused(made["metadata"]["name"])["reason"] == "VMNotFound"

    api.create(vm_path(ns), vm_body("pg"))
    wait_for(lambda: _get(api, pod_path(ns, "pg")), timeout_seconds=20, what="the pod")
    move("not-running", targetNode="node-b")
    assert refused("not-running")["reason"] == "VMNotRunning"

    api.create(
        pod_path(ns, "pg") + "/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "pg"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
        },
    )
    api.set_pod_phase(ns, "pg", "Running")
    wait_for(
        lambda: api.get(vm_path(ns, "pg")).get("status", {}).get("phase") == "Running",
        timeout_seconds=20,
        what="the VM Running",
    )
    move("same-node", targetNode="node-a")
    assert refused("same-node")["reason"] == "SameNode"

    # Nothing half-done: the VM has its one pod, unmarked, and its status points at it.
    pods = api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    assert [p["metadata"]["name"] for p in pods] == ["pg"]
    assert ann.MIGRATION not in pods[0]["metadata"].get("annotations", {})
    assert api.get(vm_path(ns, "pg"))["status"]["pod"] == "pg"
    wait_for(
        lambda: "SameNode" in {e["reason"] for e in api.events_for(ns, "same-node")},
        timeout_seconds=20,
        what="the migrations' Events",
    )
    wait_for(
        lambda: "MigrationSameNode" in {e["reason"] for e in api.events_for(ns, "pg")},
        timeout_seconds=20,
        what="the VM's Event about the refused migration",
    )


def test_a_move_whose_target_never_runs_leaves_the_source_as_it_was(
    controller: Path, vms_removed: Names
):
    """The controller's whole shell but QEMU: the real extender reserves the target's room
    (the controller's token, reviewed), the target pod is made on the target node with the
    marks on both pods. The source has no IP yet, so the move fails at once, naming that
    (``SourceWithoutIP``): the target pod deleted, the source unmarked, and the reservation
    cancelled (a second move of the same VM is reserved again, which the extender refuses
    while the first still holds it). With its IP, the second fails by the target's deadline,
    as the target never runs (no kubelet here): ``TargetNeverReady``."""
    api, ns = vms_removed.api, vms_removed.namespace
    nodes = [vms_removed.node("a", cpu="8"), vms_removed.node("b", cpu="8")]
    api.create(vm_path(ns), vm_body("pg", nodeSelector={"vma-test-group": vms_removed.group}))
    source = wait_for(
        lambda: (p := _get(api, pod_path(ns, "pg"))) and p["spec"].get("nodeName") and p,
        timeout_seconds=30,
        what="the VM's pod placed by kube-scheduler and the extender",
    )
    api.set_pod_phase(ns, "pg", "Running")
    wait_for(
        lambda: api.get(vm_path(ns, "pg")).get("status", {}).get("phase") == "Running",
        timeout_seconds=20,
        what="the VM Running",
    )
    (target_node,) = set(nodes) - {source["spec"]["nodeName"]}

    def move(name: str) -> Obj:
        body: Obj = {
            "apiVersion": "vm-autoscaling.io/v1alpha1",
            "kind": "VirtualMachineMigration",
            "metadata": {"name": name},
            "spec": {"vmName": "pg", "targetNode": target_node},
        }
        return api.create(vmm_path(ns), body)

    def phase_of(name: str, phase: str) -> Obj | None:
        status: Obj = api.get(vmm_path(ns, name)).get("status", {})
        return status if status.get("phase") == phase else None

    first = move("first")
    # Its Running phase lasts TARGET_POD_TIMEOUT_SECONDS: on a loaded machine a poll may miss
    # it, so what the move made is read from what stays (the status, the terminating pod).
    failed = wait_for(lambda: phase_of("first", "Failed"), timeout_seconds=30, what="Failed")
    (condition,) = failed["conditions"]
    assert condition["reason"] == "SourceWithoutIP"
    target_name = failed["targetPod"]
    assert target_name == "pg-m" + first["metadata"]["uid"].replace("-", "")[:8]
    assert (failed["sourcePod"], failed["targetNode"]) == ("pg", target_node)
    assert failed["startTime"] and failed["completionTime"]
    # Made on the target node, marked as the move's target; deleted (no kubelet here to end
    # its termination, so it is still there).
    target = api.get(pod_path(ns, target_name))
    assert target["spec"]["nodeName"] == target_node
    assert target["metadata"]["annotations"][ann.MIGRATION] == "first"
    assert target["metadata"].get("deletionTimestamp")
    unmarked = api.get(pod_path(ns, "pg"))
    assert ann.MIGRATION not in unmarked["metadata"]["annotations"]
    assert ann.MIGRATION_TO not in unmarked["metadata"]["annotations"]
    assert unmarked["metadata"]["uid"] == source["metadata"]["uid"]
    assert api.get(vm_path(ns, "pg"))["status"]["pod"] == "pg"

    # The first reservation is gone: the extender reserves the next move of the same VM (while
    # the first held it, it would refuse: Conflict, already moving).
    api.set_pod_phase(ns, "pg", "Running", pod_ip="10.88.0.5")
    move("second")
    second = wait_for(lambda: phase_of("second", "Failed"), timeout_seconds=30, what="Failed")
    assert second["conditions"][0]["reason"] == "TargetNeverReady"
    reasons = {e["reason"] for e in api.events_for(ns, "first")}
    assert {"Started", "SourceWithoutIP"} <= reasons


def test_a_service_deleted_by_hand_comes_back_and_anothers_is_left_alone(
    controller: Path, vms_removed: Names
):
    """The VM's Services are watched: one deleted by hand is made again with nothing else
    changing (no pod event to wake the controller). A Service of a VM's name that the VM
    does not own is never adopted nor rewritten: the VM says so, once, as an Event and in
    its Ready condition."""
    api, ns = vms_removed.api, vms_removed.namespace
    services = f"/api/v1/namespaces/{ns}/services"
    theirs: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "taken", "labels": {"app": "theirs"}},
        "spec": {"clusterIP": "None", "selector": {"app": "theirs"}, "ports": [{"port": 80}]},
    }
    api.create(services, theirs)
    before = api.get(f"{services}/taken")
    api.create(vm_path(ns), vm_body("taken"))
    api.create(vm_path(ns), vm_body("mine"))

    def ready_reason(name: str) -> str | None:
        conditions = api.get(vm_path(ns, name)).get("status", {}).get("conditions") or []
        return next((c["reason"] for c in conditions if c["type"] == "Ready"), None)

    wait_for(lambda: ready_reason("taken") == "ServiceConflict", timeout_seconds=20,
             what="the VM refusing the Service it does not own")  # fmt: skip
    after = api.get(f"{services}/taken")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert "ownerReferences" not in after["metadata"] and after["spec"] == before["spec"]
    warned = [e for e in api.events_for(ns, "taken") if e["reason"] == "ServiceConflict"]
    assert [e["type"] for e in warned] == ["Warning"], warned

    first = wait_for(lambda: _get(api, f"{services}/mine"), timeout_seconds=20,
                     what="the VM's own Service")  # fmt: skip
    api.delete(f"{services}/mine")
    first_uid = first["metadata"]["uid"]

    def remade() -> Obj | None:
        service = _get(api, f"{services}/mine")
        return service if service and service["metadata"]["uid"] != first_uid else None

    again = wait_for(remade, timeout_seconds=20, what="the Service made again")
    assert again["metadata"]["ownerReferences"] == first["metadata"]["ownerReferences"]
