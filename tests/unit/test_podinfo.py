import json
from pathlib import Path

import pytest

from protocol import annotations as ann
from protocol.codec import decode
from protocol.kube import (
    Container,
    ContainerStatus,
    ObjectMeta,
    OwnerReference,
    Pod,
    PodList,
    PodSpec,
    PodStatus,
    ResourceRequirements,
)
from scheduler_extender.core.podinfo import Demand, PodError, pod_info, pod_requests
from tests.fakes_paths import REFERENCE


def container(name, cpu=None, mem=None, restart=None):
    req = {}
    if cpu:
        req["cpu"] = cpu
    if mem:
        req["memory"] = mem
    return Container(
        name=name, resources=ResourceRequirements(requests=req), restart_policy=restart
    )


def pod(containers=(), init=(), overhead=None, **meta):
    return Pod(
        metadata=ObjectMeta(name="p", namespace="ns", uid="u", **meta),
        spec=PodSpec(containers=list(containers), init_containers=list(init), overhead=overhead),
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            pod([container("a", "250m", "64Mi"), container("b", "1", "1Gi")]),
            Demand(1250, 2**30 + 64 * 2**20),
        ),
        # a big init container dominates the sum of the regular ones
        (pod([container("a", "100m")], init=[container("i", "2")]), Demand(2000, 0)),
        # sidecars run beside the main containers and before later init containers
        (
            pod(
                [container("a", "500m")],
                init=[container("side", "300m", restart="Always"), container("i", "1")],
            ),
            Demand(1300, 0),
        ),
        (
            pod([container("a", "500m")], overhead={"cpu": "100m", "memory": "10Mi"}),
            Demand(600, 10 * 2**20),
        ),
        (pod([Container(name="noreq")]), Demand(0, 0)),
    ],
    ids=["sum", "init-dominates", "sidecar", "overhead", "no-requests"],
)
def test_effective_requests_follow_kubernetes(spec, expected):
    assert pod_requests(spec) == expected


def test_in_place_resize_counts_the_larger_of_spec_and_allocated():
    p = pod([container("vm", "1", "1Gi")])
    p.status = PodStatus(
        container_statuses=[ContainerStatus(name="vm", allocated_resources={"cpu": "3"})]
    )
    assert pod_requests(p) == Demand(3000, 2**30)


def test_unparseable_quantity_is_a_pod_error():
    with pytest.raises(PodError, match="ns/p"):
        pod_requests(pod([container("a", "lots")]))


def test_static_pods_are_recognised_by_owner_or_mirror_annotation():
    owned = pod(owner_references=[OwnerReference(kind="Node", name="n1")])
    mirror = pod(annotations={ann.MIRROR_ANNOTATION: "abc"})
    normal = pod(owner_references=[OwnerReference(kind="ReplicaSet", name="rs")])
    assert pod_info(owned, scheduler_name="vm-scheduler").is_static
    assert pod_info(mirror, scheduler_name="vm-scheduler").is_static
    assert not pod_info(normal, scheduler_name="vm-scheduler").is_static


def vm_pod(annotations, scheduler="vm-scheduler", mem="1Gi"):
    p = pod([container("vm", "1", mem)], labels={ann.VM_LABEL: "true"}, annotations=annotations)
    p.spec.scheduler_name = scheduler
    return p


def test_vm_pod_bounds_and_initial_demand():
    info = pod_info(
        vm_pod({ann.MIN_VCPUS: "2", ann.MAX_VCPUS: "8", ann.SCALING_UNIT: "2"}),
        scheduler_name="vm-scheduler",
    )
    assert info.is_ours and info.is_vm and info.vm is not None
    assert (info.vm.min_vcpus, info.vm.max_vcpus, info.vm.scaling_unit) == (2, 8, 2)
    assert info.vm.min_memory_bytes == 2**30  # defaults to the pod's memory request
    assert info.initial_demand() == Demand(2000, 2**30)


def test_durable_permit_annotation_sets_the_initial_demand():
    info = pod_info(
        vm_pod({ann.MIN_VCPUS: "1", ann.MAX_VCPUS: "4", ann.PERMITTED_VCPUS: "3"}),
        scheduler_name="vm-scheduler",
    )
    assert info.initial_demand() == Demand(3000, 2**30)


@pytest.mark.parametrize(
    ("annotations", "key"),
    [
        ({ann.MAX_VCPUS: "4"}, ann.MIN_VCPUS),
        ({ann.MIN_VCPUS: "4"}, ann.MAX_VCPUS),
        ({ann.MIN_VCPUS: "4", ann.MAX_VCPUS: "2"}, ann.MAX_VCPUS),
        ({ann.MIN_VCPUS: "two", ann.MAX_VCPUS: "4"}, ann.MIN_VCPUS),
        ({ann.MIN_VCPUS: "1", ann.MAX_VCPUS: "4", ann.SCALING_UNIT: "0"}, ann.SCALING_UNIT),
        (
            {ann.MIN_VCPUS: "1", ann.MAX_VCPUS: "4", ann.MIN_MEMORY: "2Gi", ann.MAX_MEMORY: "1Gi"},
            ann.MAX_MEMORY,
        ),
        ({ann.MIN_VCPUS: "1", ann.MAX_VCPUS: "4", ann.MIN_MEMORY: "lots"}, ann.MIN_MEMORY),
        # Scaling memory needs its minimum written down: the pod's memory follows the permit.
        ({ann.MIN_VCPUS: "1", ann.MAX_VCPUS: "4", ann.MAX_MEMORY: "64Gi"}, ann.MIN_MEMORY),
    ],
    ids=[
        "no-min",
        "no-max",
        "max-below-min",
        "not-a-number",
        "zero-unit",
        "memory-inverted",
        "bad-memory",
        "scaling-memory-without-min",
    ],
)
def test_bad_vm_annotations_name_the_key(annotations, key):
    info = pod_info(vm_pod(annotations), scheduler_name="vm-scheduler")
    assert info.vm is None
    assert info.vm_error is not None and key in info.vm_error


def test_vm_of_another_scheduler_is_foreign_and_not_parsed():
    info = pod_info(vm_pod({}, scheduler="default-scheduler"), scheduler_name="vm-scheduler")
    assert not info.is_ours and info.vm is None and info.vm_error is None


def test_recorded_pod_list_converts():
    body = (REFERENCE / "kube/api/list-pods.json").read_bytes()
    pods = decode(PodList, body).items or []
    infos = [pod_info(p, scheduler_name="vm-scheduler") for p in pods]
    assert infos and all(i.uid for i in infos)
    assert {i.scheduler_name for i in infos} >= {"vm-scheduler"}
    recorded = json.loads(body)["items"][0]
    assert infos[0].name == recorded["metadata"]["name"]


def test_vm_spec_rounding():
    spec = ann.VmSpec(
        min_vcpus=2, max_vcpus=9, scaling_unit=3, min_memory_bytes=1, max_memory_bytes=1
    )
    assert [spec.vcpu_bounds.round_down(v) for v in range(0, 12)] == [
        2,
        2,
        2,
        2,
        2,
        5,
        5,
        5,
        8,
        8,
        8,
        8,
    ]
    assert spec.top_vcpus == 8


def test_the_recorded_samples_are_there():
    assert Path(REFERENCE / "kube").is_dir()


MI, GI = 2**20, 2**30
SCALING = {ann.MIN_MEMORY: "1Gi", ann.MAX_MEMORY: "4Gi", ann.MIN_VCPUS: "1", ann.MAX_VCPUS: "2"}


def test_a_memory_scaling_vm_keeps_its_containers_memory_above_the_guests():
    """The example VM: 1 GiB of guest in a 1536Mi container (QEMU's own memory), a 100Mi
    sidecar. The pod holds the guest's memory plus all of that; the container's part is what
    each resize keeps."""
    p = vm_pod(SCALING, mem="1536Mi")
    p.spec.containers.append(container("log", mem="100Mi"))
    info = pod_info(p, scheduler_name="vm-scheduler")
    assert (info.memory_extra_bytes, info.container_memory_overhead_bytes) == (612 * MI, 512 * MI)
    assert info.initial_demand() == Demand(1000, 1636 * MI)
    # Resized to 3 GiB of guest (container 3 GiB + 512Mi) with the overhead recorded: the same.
    p.metadata.annotations = {
        **SCALING,
        ann.PERMITTED_MEMORY: "3Gi",
        ann.MEMORY_OVERHEAD: "512Mi",
    }
    p.spec.containers[0] = container("vm", "1", "3584Mi")
    info = pod_info(p, scheduler_name="vm-scheduler")
    assert (info.memory_extra_bytes, info.container_memory_overhead_bytes) == (612 * MI, 512 * MI)
    assert info.initial_demand() == Demand(1000, 3 * GI + 612 * MI)
    # The record was written before the resize: a restart in between still reads 512Mi.
    p.spec.containers[0] = container("vm", "1", "1536Mi")
    info = pod_info(p, scheduler_name="vm-scheduler")
    assert info.container_memory_overhead_bytes == 512 * MI
    assert info.initial_demand() == Demand(1000, 3 * GI + 612 * MI)


def test_the_named_container_is_the_vm_and_fixed_memory_vms_have_no_extra():
    named = vm_pod({**SCALING, ann.VM_CONTAINER: "qemu"}, mem="64Mi")
    named.spec.containers.append(container("qemu", mem="1280Mi"))
    info = pod_info(named, scheduler_name="vm-scheduler")
    assert (info.memory_extra_bytes, info.container_memory_overhead_bytes) == (320 * MI, 256 * MI)
    fixed = pod_info(vm_pod({ann.MIN_VCPUS: "1", ann.MAX_VCPUS: "2"}, mem="1536Mi"),
                     scheduler_name="vm-scheduler")  # fmt: skip
    assert (fixed.memory_extra_bytes, fixed.container_memory_overhead_bytes) == (0, 0)
