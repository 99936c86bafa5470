"""Config loading (paths in errors), standalone discovery, pod conversion, and the CLI."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from autoscaler_agent.__main__ import EXIT_CONFIG, build_parser, main
from autoscaler_agent.config import Config, ConfigError, parse_config
from autoscaler_agent.discovery import (
    DiscoveryError,
    parse_standalone,
    targets_from_pods,
    vm_target_from_pod,
)
from protocol.kube import Container, ContainerStatus, Pod, PodSpec, PodStatus
from protocol.kube import ObjectMeta as Meta
from protocol.kube import ResourceRequirements as Resources


def test_empty_config_gives_defaults():
    c = parse_config("")
    assert c == Config()
    assert c.scrape.interval_seconds == 1.0
    assert c.policy.target_load_per_vcpu == 0.9
    assert c.core().policy.shrink_after_seconds == 30.0
    assert c.metrics.stuck_after_seconds == 60.0
    assert parse_config("metrics: {stuck_after_seconds: 5}").metrics.stuck_after_seconds == 5.0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("scrape: {interval_seconds: 0}", "$.scrape.interval_seconds", id="range"),
        pytest.param("scrape: {intervl_seconds: 1}", "intervl_seconds", id="typo"),
        pytest.param("http: {port: x}", "$.http.port", id="type"),
        pytest.param("policy: {shrink_load_per_vcpu: 0.95}", "must be below", id="cross-field"),
        pytest.param("a: [", "not valid YAML", id="yaml"),
        pytest.param(
            "metrics: {stuck_after_seconds: 0}", "$.metrics.stuck_after_seconds", id="stuck-range"
        ),
    ],
)
def test_config_errors_name_the_path(text, needle):
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="agent.yaml")
    assert needle in str(e.value) and "agent.yaml" in str(e.value)


def test_main_exits_3_on_bad_config(tmp_path, capsys):
    bad = tmp_path / "agent.yaml"
    bad.write_text("extender: {url: ftp://x}\n")
    assert main(["--config", str(bad)]) == EXIT_CONFIG
    assert "$.extender" in capsys.readouterr().err
    assert main(["--config", str(tmp_path / "missing.yaml")]) == EXIT_CONFIG


def test_main_exits_3_without_node_name(tmp_path, monkeypatch):
    ok = tmp_path / "agent.yaml"
    ok.write_text("")
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["--config", str(ok)]) == EXIT_CONFIG


def test_help_explains_every_flag():
    text = build_parser().format_help()
    for flag in ("--config", "--kubeconfig", "--standalone", "NODE_NAME"):
        assert flag in text
    out = subprocess.run(
        [sys.executable, "-m", "autoscaler_agent", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--standalone" in out.stdout


STANDALONE = """
vms:
  - name: web
    uid: u1
    min_vcpus: 1
    max_vcpus: 8
    hypervisor: qmp:///run/web.sock
    metrics_url: http://127.0.0.1:9100/metrics
  - name: db
    namespace: prod
    uid: u2
    node: other-node
    min_vcpus: 2
    max_vcpus: 4
    memory: 2Gi
    hypervisor: cloud-hypervisor:///run/db.sock
    metrics_url: http://127.0.0.1:9101/metrics
"""


def test_standalone_file_keeps_this_nodes_vms():
    targets = parse_standalone(STANDALONE, node="n1")
    assert list(targets) == ["default/web"]
    web = targets["default/web"]
    assert (web.spec.min_vcpus, web.spec.max_vcpus, web.node) == (1, 8, "n1")
    assert list(parse_standalone(STANDALONE, node="other-node")) == ["default/web", "prod/db"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("vms: [{name: a}]", "$.vms[0]", id="missing-fields"),
        pytest.param(STANDALONE.replace("max_vcpus: 8", "max_vcpus: 0"), "$.vms[0]", id="range"),
        pytest.param(
            STANDALONE.replace("uid: u1", "uid: u1\n    colour: red"), "colour", id="typo"
        ),
    ],
)
def test_standalone_errors(text, needle):
    with pytest.raises(DiscoveryError) as e:
        parse_standalone(text, node="n1")
    assert needle in str(e.value)


def pod(**annotations):
    base = {
        "vm-autoscaling.io/min-vcpus": "1",
        "vm-autoscaling.io/max-vcpus": "8",
        "vm-autoscaling.io/min-memory": "1Gi",
        "vm-autoscaling.io/hypervisor": "qmp:///run/vm.sock",
        "vm-autoscaling.io/metrics-url": "http://10.0.0.5:9100/metrics",
        "vm-autoscaling.io/permitted-vcpus": "3",
    }
    base.update(annotations)
    return Pod(
        metadata=Meta(
            name="vm",
            namespace="ns",
            uid="u",
            labels={"vm-autoscaling.io/vm": "true"},
            annotations={k: v for k, v in base.items() if v is not None},
        ),
        spec=PodSpec(node_name="n1"),
        status=PodStatus(phase="Running"),
    )


def test_vm_pod_to_target():
    t = vm_target_from_pod(pod(), node="n1")
    assert (t.key, t.permitted_vcpus, t.metrics_url) == (
        "ns/vm",
        3,
        "http://10.0.0.5:9100/metrics",
    )
    assert vm_target_from_pod(pod(), node="n2") is None  # another node's pod
    assert not t.is_moving


def test_a_pod_in_a_live_move_is_moving_and_keeps_its_loop():
    moving = vm_target_from_pod(pod(**{"vm-autoscaling.io/migration": "mv-1"}), node="n1")
    assert moving is not None and moving.is_moving
    assert moving.same_loop(vm_target_from_pod(pod(), node="n1"))  # told, not restarted


def test_unusable_vm_pods_are_skipped():
    with pytest.raises(DiscoveryError, match="max-vcpus"):
        vm_target_from_pod(pod(**{"vm-autoscaling.io/max-vcpus": "x"}), node="n1")
    no_url = pod(**{"vm-autoscaling.io/metrics-url": None})
    with pytest.raises(DiscoveryError, match="pod IP"):
        vm_target_from_pod(no_url, node="n1")
    assert targets_from_pods({"a": no_url, "b": pod()}, node="n1").keys() == {"ns/vm"}


def scaling_pod(*, applied, written="1280Mi", overhead=None, vm_container=None):
    """A VM pod whose memory scales 1..4 GiB, its containers as the kubelet reports them."""
    p = pod(
        **{
            "vm-autoscaling.io/max-memory": "4Gi",
            "vm-autoscaling.io/memory-overhead": overhead,
            "vm-autoscaling.io/vm-container": vm_container,
        }
    )
    limits = {"memory": written}
    containers = [
        Container(name="sidecar", resources=Resources(limits={"memory": "64Mi"})),
        Container(name="vm", resources=Resources(limits=limits, requests=limits)),
    ]
    statuses = [
        ContainerStatus(name="sidecar", resources=Resources(limits={"memory": "64Mi"})),
        ContainerStatus(
            name="vm", resources=None if applied is None else Resources(limits={"memory": applied})
        ),
    ]
    if vm_container is None:  # the first container is the VM's
        containers.reverse()
        statuses.reverse()
    return msgspec.structs.replace(
        p,
        spec=msgspec.structs.replace(p.spec, containers=containers),
        status=msgspec.structs.replace(p.status, container_statuses=statuses),
    )


@pytest.mark.parametrize("vm_container", [None, "vm"])
def test_memory_room_is_the_applied_limit_less_the_containers_overhead(vm_container):
    Mi = 2**20
    # Before any permit: the overhead is the container's memory as written above min-memory.
    t = vm_target_from_pod(scaling_pod(applied="1280Mi", vm_container=vm_container), node="n1")
    assert t.memory_room_bytes == 1024 * Mi
    # A grant recorded the overhead and resized the spec; the kubelet has not applied it yet.
    waiting = scaling_pod(
        applied="1280Mi", written="2304Mi", overhead="256Mi", vm_container=vm_container
    )
    assert vm_target_from_pod(waiting, node="n1").memory_room_bytes == 1024 * Mi
    applied = scaling_pod(
        applied="2304Mi", written="2304Mi", overhead="256Mi", vm_container=vm_container
    )
    t2 = vm_target_from_pod(applied, node="n1")
    assert t2.memory_room_bytes == 2048 * Mi
    assert t2.same_loop(t) and t2 != t  # the loop goes on, told of the room


def test_vcpu_room_is_the_applied_cpu_limit_in_whole_cores():
    assert vm_target_from_pod(scaling_pod(applied="2Gi"), node="n1").vcpu_room is None
    p = scaling_pod(applied="2Gi")  # the VM's container first, as the kubelet reports it
    vm_status = msgspec.structs.replace(
        p.status.container_statuses[0], resources=Resources(limits={"cpu": "2500m"})
    )
    p.status = msgspec.structs.replace(
        p.status, container_statuses=[vm_status, *p.status.container_statuses[1:]]
    )
    assert vm_target_from_pod(p, node="n1").vcpu_room == 2


def test_no_memory_room_without_an_applied_limit_or_scaling_memory():
    assert vm_target_from_pod(scaling_pod(applied=None), node="n1").memory_room_bytes is None
    assert vm_target_from_pod(pod(), node="n1").memory_room_bytes is None  # memory fixed


@pytest.mark.parametrize(
    ("qos", "container_id", "expected"),
    [
        pytest.param(
            "Guaranteed",
            "containerd://abc",
            (
                "kubepods/podu-1/abc",
                "kubepods.slice/kubepods-podu_1.slice/cri-containerd-abc.scope",
            ),
            id="guaranteed-containerd",
        ),
        pytest.param(
            "Burstable",
            "cri-o://abc",
            (
                "kubepods/burstable/podu-1/abc",
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu_1.slice/"
                "crio-abc.scope",
            ),
            id="burstable-cri-o",
        ),
    ],
)
def test_the_vm_containers_cgroup_is_looked_for_under_both_drivers(qos, container_id, expected):
    p = scaling_pod(applied="2Gi")
    p.metadata = msgspec.structs.replace(p.metadata, uid="u-1")
    vm_status = msgspec.structs.replace(p.status.container_statuses[0], container_id=container_id)
    p.status = msgspec.structs.replace(
        p.status, qos_class=qos, container_statuses=[vm_status, *p.status.container_statuses[1:]]
    )
    dirs = vm_target_from_pod(p, node="n1").cgroup_dirs
    # cgroup v2 at the root first, then v1 below the cpu controller's mount (either name).
    assert dirs == (
        *expected,
        *(f"cpu/{d}" for d in expected),
        *(f"cpu,cpuacct/{d}" for d in expected),
    )
    assert vm_target_from_pod(scaling_pod(applied="2Gi"), node="n1").cgroup_dirs == ()  # no ID yet
