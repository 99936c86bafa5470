"""The example VMs are VMs the extender, the agent and the runner all accept, and the
hypervisor annotation points at the socket the runner really creates.

The examples are VirtualMachine objects: what is checked is the pod and the Service the
vm-controller makes of each (``vm_controller.decide``, the function the controller runs), as
the API server would default them (the CRD's defaults are the structs' own). The StatefulSet
form (``manifests/examples/statefulset/``, for clusters without the controller) is held to the
same checks, through the pod its template makes.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath
from typing import Any

import msgspec
import pytest

from autoscaler_agent.discovery import vm_target_from_pod
from autoscaler_agent.hypervisor.factory import socket_paths_from_url
from protocol.annotations import VM_LABEL, is_vm, parse_vm_spec
from protocol.codec import decode
from protocol.kube import Pod
from protocol.quantity import memory_bytes
from protocol.virtualmachine import VirtualMachine
from testkit.manifests import (
    EXAMPLES,
    MANIFESTS,
    ROOT,
    STATEFULSET_EXAMPLE,
    arg_value,
    container,
    mount,
    render,
    volume,
)
from tests.deploy.qos import qos_class
from tests.deploy.system import AGENT_CFG, AGENT_DS, EXTENDER_CFG
from vm_controller import decide
from vm_runner.cli import make_parser
from vm_runner.cmdline import qga_socket_beside

Doc = dict[str, Any]
VIRTUAL_MACHINES = [d for directory in (EXAMPLES, EXAMPLES / "double") for d in render(directory)]


def _controller_made(doc: Doc) -> tuple[Doc, Doc]:
    """The pod and the Service the vm-controller makes of the VirtualMachine ``doc``."""
    meta = {**doc["metadata"], "uid": "0b9c1f6e-0000-4000-8000-000000000002"}
    vm = msgspec.convert({**doc, "metadata": meta}, VirtualMachine)
    return decide.desired_pod(vm), decide.desired_service(vm)


def _templated(sts: Doc, docs: list[Doc]) -> tuple[Doc, Doc]:
    """The pod the StatefulSet makes (ordinal 0), and its governing Service."""
    template = sts["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "name": f"{sts['metadata']['name']}-0",
            "namespace": sts["metadata"]["namespace"],
        },
        "spec": {
            **template["spec"],
            "hostname": f"{sts['metadata']['name']}-0",
            "subdomain": sts["spec"]["serviceName"],
        },
    }
    (service,) = [
        d
        for d in docs
        if d["kind"] == "Service" and d["metadata"]["name"] == sts["spec"]["serviceName"]
    ]
    assert sts["spec"]["replicas"] == 1
    return pod, service


_FALLBACK = render(STATEFULSET_EXAMPLE)
PODS: dict[str, tuple[Doc, Doc]] = {
    **{d["metadata"]["name"]: _controller_made(d) for d in VIRTUAL_MACHINES},
    **{
        f"statefulset/{d['metadata']['name']}": _templated(d, _FALLBACK)
        for d in _FALLBACK
        if d["kind"] == "StatefulSet"
    },
}
IDS = list(PODS)
EXAMPLE_PODS = [PODS[i][0] for i in IDS]


def _container(pod: Doc, name: str) -> Doc:
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == name]
    found: Doc = c
    return found


def _volume(pod: Doc, name: str) -> Doc:
    (v,) = [v for v in pod["spec"]["volumes"] if v["name"] == name]
    found: Doc = v
    return found


def _env(c: Doc, pod: Doc) -> dict[str, str]:
    """The container's environment as the kubelet would fill it from the downward API."""
    meta = pod["metadata"]
    fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"]}
    out = {}
    for e in c.get("env", []):
        path = e["valueFrom"]["fieldRef"]["fieldPath"]
        ann = re.fullmatch(r"metadata\.annotations\['(.+)'\]", path)
        out[e["name"]] = meta["annotations"][ann[1]] if ann else fields[path]
    return out


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], value)


def test_the_examples_are_three_virtual_machines_and_one_fallback():
    assert [d["kind"] for d in VIRTUAL_MACHINES] == ["VirtualMachine"] * 3
    assert IDS == ["pg-vm", "pg-vm-a", "pg-vm-b", "statefulset/pg-vm"]


@pytest.mark.parametrize("vm", ["pg-vm", "statefulset/pg-vm"])
def test_the_single_example_vm_scales_memory(vm):
    """docs/DEPLOY.md promises an example whose memory grows and shrinks live (the node tier
    runs it): ``max-memory`` above ``min-memory``."""
    spec = parse_vm_spec(PODS[vm][0]["metadata"]["annotations"], pod_memory_bytes=0)
    assert spec.max_memory_bytes > spec.min_memory_bytes


@pytest.mark.parametrize("pod", EXAMPLE_PODS, ids=IDS)
def test_example_is_a_vm_for_our_scheduler(pod):
    assert is_vm(pod["metadata"]["labels"]) and pod["metadata"]["labels"][VM_LABEL] == "true"
    assert pod["spec"]["schedulerName"] == EXTENDER_CFG.scheduler_name


@pytest.mark.parametrize("pod", EXAMPLE_PODS, ids=IDS)
def test_annotations_parse_and_match_the_pod_resources(pod):
    vm = _container(pod, "vm")
    limits, requests = vm["resources"]["limits"], vm["resources"]["requests"]
    spec = parse_vm_spec(
        pod["metadata"]["annotations"], pod_memory_bytes=memory_bytes(requests["memory"])
    )
    assert 1 <= spec.min_vcpus < spec.max_vcpus
    # Placed at its minimum, Guaranteed QoS (resize keeps requests == limits).
    assert requests == limits
    assert int(requests["cpu"]) == spec.min_vcpus
    # The container is written at the guest's minimum plus room for QEMU itself, which a VM
    # whose memory scales keeps above every permitted size (the extender's memory-overhead).
    assert memory_bytes(limits["memory"]) - spec.min_memory_bytes >= 256 * 2**20
    assert vm["resizePolicy"] == [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]


@pytest.mark.parametrize("pod", EXAMPLE_PODS, ids=IDS)
def test_vm_pod_is_guaranteed_with_its_init_container(pod):
    """Kubernetes classes init containers too: one without resources makes the VM Burstable
    (lower CPU weight, first to be OOM-killed) whatever the VM container says."""
    assert qos_class(pod["spec"]) == "Guaranteed"


def test_qos_class_follows_kubernetes():
    g = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    limits_only = {"limits": {"cpu": "500m", "memory": "64Mi"}}
    assert qos_class({"containers": [{"resources": g}]}) == "Guaranteed"
    assert qos_class({"containers": [{"resources": limits_only}]}) == "Guaranteed"
    assert qos_class({"containers": [{}]}) == "BestEffort"
    assert qos_class({"containers": [{"resources": {"limits": {"cpu": "1"}}}]}) == "Burstable"
    assert qos_class({"containers": [{"resources": g}], "initContainers": [{}]}) == "Burstable"
    unequal = {"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    assert qos_class({"containers": [{"resources": unequal}]}) == "Burstable"
    # 1000m is 1: quantities compare by value, not spelling.
    same = {
        "requests": {"cpu": "1000m", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "1024Mi"},
    }
    assert qos_class({"containers": [{"resources": same}]}) == "Guaranteed"


def _runner_entrypoint() -> list[str]:
    """The vm-runner image's ENTRYPOINT after ``python3 -m vm_runner`` (fixed flags)."""
    text = (ROOT / "vm_runner" / "Dockerfile").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("ENTRYPOINT ")]
    argv = json.loads(line.removeprefix("ENTRYPOINT "))
    assert argv[:3] == ["python3", "-m", "vm_runner"]
    return argv[3:]


@pytest.mark.parametrize("pod", EXAMPLE_PODS, ids=IDS)
def test_runner_flags_are_accepted_and_agree_with_the_annotations(pod):
    vm = _container(pod, "vm")
    env = _env(vm, pod)
    pod_args = [_expand(a, env) for a in vm["args"]]
    entrypoint = _runner_entrypoint()
    # The pod must not override what the image fixes (argparse: the last one would win).
    fixed = {a.split("=")[0] for a in entrypoint if a.startswith("--")}
    assert not fixed & {a.split("=")[0] for a in pod_args if a.startswith("--")}
    args = make_parser().parse_args(entrypoint + pod_args)
    spec = parse_vm_spec(pod["metadata"]["annotations"], pod_memory_bytes=0)
    assert (args.min_vcpus, args.max_vcpus) == (spec.min_vcpus, spec.max_vcpus)
    assert memory_bytes(args.memory) == spec.min_memory_bytes
    # Forwards on the pod IP: node_exporter for the agent, PostgreSQL for pgbench; and a
    # controller-made pod's live-migration ports (QMP for the driver, the incoming state).
    assert args.listen_address == "0.0.0.0"
    moves = {decide.MIGRATION_QMP_PORT, decide.MIGRATION_INCOMING_PORT}
    movable = args.migration_port is not None
    assert {p["containerPort"] for p in vm["ports"]} == {9100, 5432} | (moves if movable else set())
    assert not movable or args.migration_port == decide.MIGRATION_QMP_PORT
    # The runner's grace (powerdown, then quit) fits in the pod's.
    grace = args.grace_seconds + args.quit_timeout_seconds
    assert grace < pod["spec"]["terminationGracePeriodSeconds"]


def _runner_uid() -> int:
    text = (ROOT / "vm_runner" / "Dockerfile").read_text()
    match = re.search(r"useradd [^\n]*--uid (\d+)", text)
    assert match, "vm_runner/Dockerfile no longer fixes the runner's UID"
    return int(match[1])


@pytest.mark.parametrize("pod", EXAMPLE_PODS, ids=IDS)
def test_socket_directory_belongs_to_the_runner_and_the_agent_shares_its_uid(pod):
    """The kubelet makes the subPath directory as root; the init container hands it to the
    runner's UID; the agent runs as that UID so it may connect() to the socket."""
    uid = _runner_uid()
    (init,) = pod["spec"]["initContainers"]
    vm = _container(pod, "vm")
    assert init["command"] == ["chown", f"{uid}:{uid}", mount(vm, "vm-sockets")["mountPath"]]
    assert mount(init, "vm-sockets")["subPathExpr"] == mount(vm, "vm-sockets")["subPathExpr"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert container(AGENT_DS, "agent")["securityContext"]["runAsUser"] == uid


@pytest.mark.parametrize("pod", EXAMPLE_PODS, ids=IDS)
def test_hypervisor_annotation_names_the_socket_the_runner_creates(pod, tmp_path):
    vm = _container(pod, "vm")
    env = _env(vm, pod)
    qmp_in_container = PurePosixPath(arg_value(vm["args"], "--qmp-socket"))
    m = mount(vm, "vm-sockets")
    host_dir = PurePosixPath(_volume(pod, "vm-sockets")["hostPath"]["path"])
    host_socket = (
        host_dir / _expand(m["subPathExpr"], env) / qmp_in_container.relative_to(m["mountPath"])
    )

    url = pod["metadata"]["annotations"]["vm-autoscaling.io/hypervisor"]
    # The runner's default vCPU mode (online, through qemu-guest-agent): the shipped examples
    # must use the mode that survives repeated grow/shrink cycles.
    assert "--vcpu-mode=hotplug" not in vm["args"]
    assert url == f"qmp+qga://{host_socket}"
    # ...and the agent, with its real socket root and mount, resolves it to paths it sees: the
    # QMP socket, and the QGA socket where the runner creates it (same name rule, same dir).
    scheme, resolved, qga = socket_paths_from_url(url, root=tmp_path)
    assert scheme == "qmp+qga"
    assert resolved == tmp_path / str(host_socket).lstrip("/")
    qga_in_container = PurePosixPath(qga_socket_beside(str(qmp_in_container)))
    assert qga == tmp_path / str(
        host_dir / _expand(m["subPathExpr"], env) / qga_in_container.relative_to(m["mountPath"])
    ).lstrip("/")
    agent_mount = mount(container(AGENT_DS, "agent"), "vm-sockets")["mountPath"]
    agent_view = PurePosixPath(AGENT_CFG.hypervisor.socket_root) / str(host_socket).lstrip("/")
    assert agent_view.is_relative_to(agent_mount)
    assert volume(AGENT_DS, "vm-sockets")["hostPath"]["path"] == str(host_dir)


def test_each_vm_pod_sees_only_its_own_socket_directory():
    for pod in EXAMPLE_PODS:
        subpath = mount(_container(pod, "vm"), "vm-sockets")["subPathExpr"]
        assert subpath == "$(POD_NAMESPACE)/$(POD_NAME)"


def test_examples_are_not_part_of_the_main_kustomization():
    assert not any(d["kind"] in {"StatefulSet", "VirtualMachine"} for d in render(MANIFESTS))


@pytest.mark.parametrize("made", list(PODS.values()), ids=IDS)
def test_the_agent_discovers_the_running_example_pod(made):
    """The pod as the API server would show it once running, through the agent's own
    discovery: the VM it manages, and where it scrapes and resizes it."""
    pod, service = made
    meta = pod["metadata"]
    running = {
        **pod,
        "metadata": {**meta, "uid": "0b9c1f6e-0000-4000-8000-000000000001"},
        "spec": {**pod["spec"], "nodeName": "worker"},
        "status": {"phase": "Running"},
    }
    target = vm_target_from_pod(decode(Pod, json.dumps(running).encode()), node="worker")
    assert target is not None
    assert target.hypervisor_url == meta["annotations"]["vm-autoscaling.io/hypervisor"]
    # Scraped through the headless Service's per-pod record (hostname.subdomain), on the port
    # the runner forwards; the Service selects the pod, whatever its readiness.
    svc, ns = service["metadata"]["name"], meta["namespace"]
    assert pod["spec"]["subdomain"] == svc
    assert target.metrics_url == f"http://{pod['spec']['hostname']}.{svc}.{ns}.svc:9100/metrics"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= meta["labels"].items()
    assert {p["name"] for p in service["spec"]["ports"]} == {"node-exporter", "postgres"}
