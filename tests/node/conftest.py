"""Fixtures of the real-node tier: one cluster per test session, the project's images on it.

Public, for every module of the tier (each is session-scoped: the tier shares one cluster):

- ``node``: the cluster (``tests/node/harness.py``: ``Node``): the control plane, node 1
  (containerd, a kubelet, kube-proxy, the cluster DNS) and ``Node.workers``, the other nodes
  (``Worker``: their own containerd and kubelet), ``NODES`` in all (``$VMA_NODES`` overrides),
  every node Ready, with the images ``tests/node/images.py`` builds from the project's
  Dockerfiles in each node's containerd. ``node.admin_kubeconfig`` is the cluster-admin
  kubeconfig (``node.kubectl(...)``, ``node.kubectl_env()`` for scripts), ``node.members`` every
  node by name, ``node.timings`` what each step took.
- ``deployed``: ``kubectl apply -k manifests/`` as written, on ``node``: both extender replicas
  and the agent on every node Ready (the vm-controller starting beside them).
- ``tuned``: ``manifests/`` re-applied through the tier's overlay (``tests/node/overlay.py``),
  with ``watching`` started first.
- ``watching``: a real Prometheus scraping the system through manifests/monitoring
  (``tests/node/monitoring.py``) from then to the session's end; ``test_monitoring`` reads its
  record last.
- ``vm``: ``kubectl apply -k manifests/examples``: the pod the vm-controller makes of the
  example VirtualMachine, once its container runs.

Where a node cannot run (no ``$VMA_KUBE_BIN`` with the node's binaries, not root, no containerd)
the tier skips with one line saying why; in CI (``CI`` set) it fails instead, as the
control-plane tier does.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
import yaml

from testkit.controlplane import kube_bin_dir, wait_for
from tests.node import images, monitoring
from tests.node.explain import snapshot
from tests.node.harness import VM, Node, Obj, Worker, cannot_run, ctr_args
from tests.node.overlay import tier_overlay

ROOT = Path(__file__).resolve().parents[2]
# Node 1 and one worker: both extender replicas get a node each (required anti-affinity), the
# agent runs twice, and a node can fail with the other left. Each node costs ~150 MB and ~2 %
# of a core idle (kubelet + containerd).
NODES = 2


# Modules that run after all the others, in this order: ``test_drain`` moves the VM off its
# node and evicts a replica of the scheduler pair there, which the other drills count on being
# where they left them; ``test_monitoring`` reads what every other module (the drain too) left
# in Prometheus's record (the alerts their drills raised, what every dashboard panel drew).
LAST_MODULES = ("tests/node/test_drain.py", "tests/node/test_monitoring.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of ``LAST_MODULES`` run last, in its order; the others as collected."""
    last = [[i for i in items if i.nodeid.startswith(module)] for module in LAST_MODULES]
    moved = {id(i) for group in last for i in group}
    items[:] = [i for i in items if id(i) not in moved] + [i for group in last for i in group]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test of the tier reports what the cluster looked like then
    (``tests/node/explain.py``): CI shows only pytest's output, and the cluster is gone after."""
    report: pytest.TestReport = yield
    fixtures = getattr(item, "funcargs", {})
    cluster = next((v for v in fixtures.values() if isinstance(v, Node)), None)
    if report.failed and call.when == "call" and isinstance(cluster, Node):
        save = cluster.logs / f"at-failure-{item.name}"
        report.sections.append(("the cluster when it failed", snapshot(cluster, save)))
    return report


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    bin_dir = kube_bin_dir()
    why = cannot_run(bin_dir)
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real-node tier; {why}")
        pytest.skip(f"real node: {why}")
    assert bin_dir is not None
    work = tmp_path_factory.mktemp("node")
    started = time.monotonic()
    n = Node(bin_dir, work, node_count=int(os.environ.get("VMA_NODES", NODES)))
    try:
        n.start_containerd()
        t = time.monotonic()
        wanted = images.support_images(bin_dir, work) + images.project_images()
        built = images.ensure_images(wanted, work / "images.log", ctr_args())
        n.timings["images"] = time.monotonic() - t
        print(f"\nnode images: {built}")
        n.start_control_plane()
        n.start_node()
        n.timings[f"node {n.name} start to Ready"] = time.monotonic() - started

        def import_images(worker: Worker) -> None:
            done = images.ensure_images(wanted, work / "images.log", worker.ctr(), worker.name)
            print(f"{worker.name} images: {done}")

        n.start_workers(import_images)
        print(f"node timings: { {k: round(v, 1) for k, v in n.timings.items()} }")
        yield n
    finally:
        n.stop()


def _placed(node: Node, selector: str) -> dict[str, str]:
    """Ready pods of ``manifests/``'s workload ``selector``: pod name -> node name."""
    pods = node.kubectl("-n", "vm-autoscaling", "get", "pods", "-l", selector, "-o", "json")
    out = {}
    for pod in json.loads(pods.stdout)["items"]:
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in pod.get("status", {}).get("conditions", []))  # fmt: skip
        if ready and not pod["metadata"].get("deletionTimestamp"):
            out[pod["metadata"]["name"]] = pod["spec"]["nodeName"]
    return out


EXTENDER = "app.kubernetes.io/name=scheduler-extender"
AGENT = "app.kubernetes.io/name=autoscaler-agent"


@pytest.fixture(scope="session")
def deployed(node: Node) -> Node:
    """``kubectl apply -k manifests/``: both extender replicas Ready, on two nodes (required
    anti-affinity), and the agent Ready on every node."""
    started = time.monotonic()
    node.kubectl("apply", "-k", str(ROOT / "manifests"))
    replicas = min(2, len(node.members))
    wait_for(
        lambda: len(set(_placed(node, EXTENDER).values())) == replicas,
        timeout_seconds=180, what=f"{replicas} scheduler-extender replicas Ready", interval=1,
    )  # fmt: skip
    wait_for(
        lambda: set(_placed(node, AGENT).values()) == set(node.members),
        timeout_seconds=180, what="the agent Ready on every node", interval=1,
    )  # fmt: skip
    node.timings["apply -k manifests/ to Ready"] = time.monotonic() - started
    return node


@pytest.fixture(scope="session")
def watching(
    deployed: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[monitoring.Prometheus | None]:
    """Debian's Prometheus scraping the system through manifests/monitoring, for the rest of
    the session (None where it is not installed; CI must have it: scripts/setup)."""
    if monitoring.binary() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run Prometheus in the real-node tier: scripts/setup installs it")
        yield None
        return
    started = time.monotonic()
    prom = monitoring.start(deployed, tmp_path_factory.mktemp("prometheus"))
    took = deployed.timings["monitoring applied to Prometheus ready"] = time.monotonic() - started
    print(f"monitoring applied -> Prometheus ready: {took:.1f}s")
    try:
        yield prom
    finally:
        prom.stop()


@pytest.fixture(scope="session")
def tuned(
    deployed: Node, watching: monitoring.Prometheus | None, tmp_path_factory: pytest.TempPathFactory
) -> Node:
    """``manifests/`` re-applied through the tier's overlay (``tests/node/overlay.py``: room for
    a VM to grow on a 2-CPU node, shorter shrink windows), both workloads rolled out again.
    Prometheus (``watching``) scrapes from before, so its record holds every drill after."""
    started = time.monotonic()
    deployed.kubectl("apply", "-k", str(tier_overlay(tmp_path_factory.mktemp("overlay"))))
    deployed.rollout("deployment/scheduler-extender")
    deployed.rollout("daemonset/autoscaler-agent")
    deployed.rollout("deployment/vm-controller")
    deployed.timings["apply the tier's overlay to Ready"] = time.monotonic() - started
    return deployed


@pytest.fixture(scope="session")
def vm(deployed: Node) -> Obj:
    """``kubectl apply -k manifests/examples``: the VM pod once its container runs."""
    return example_vm(deployed)


def opt_in(deployed: Node) -> None:
    """The example VM may be moved by relief from now on (``spec.neverMove`` false: the
    vm-controller patches its running pod, and the extender follows the pod)."""
    deployed.kubectl("patch", "virtualmachine", VM, "--type", "merge",
                     "-p", '{"spec": {"neverMove": false}}')  # fmt: skip


# The example VM's vCPU maximum where relief is to move it (test_migration): node 1's two CPUs,
# the most any node here holds. At the example's 4, a VM under load asks for more than any node
# has, and no move can give it its requested size.
RELIEVABLE_MAX_VCPUS = 2


def apply_example_vm(deployed: Node, *, max_vcpus: int | None = None) -> None:
    """``kubectl apply -k manifests/examples``; with ``max_vcpus``, the same objects with the
    VirtualMachine's ``spec.vcpus.max`` set to it and ``spec.neverMove`` true: the VM relief is
    to move (test_migration), opted out until its drill opts it in (``opt_in``), so that no
    grow cut short before (its guest's boot) moves it first."""
    examples = str(ROOT / "manifests" / "examples")
    if max_vcpus is None:
        deployed.kubectl("apply", "-k", examples)
        return
    docs = list(yaml.safe_load_all(deployed.kubectl("kustomize", examples).stdout))
    for doc in docs:
        if doc["kind"] == "VirtualMachine":
            doc["spec"]["vcpus"]["max"] = max_vcpus
            doc["spec"]["neverMove"] = True
    deployed.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(docs))


def example_vm(deployed: Node, *, max_vcpus: int | None = None) -> Obj:
    """``kubectl apply -k manifests/examples`` (again: a module after test_failures, which
    deletes it, needs it back; ``max_vcpus``: ``apply_example_vm``), and the VM's pod, which the
    vm-controller makes, once its container runs."""
    started = time.monotonic()
    apply_example_vm(deployed, max_vcpus=max_vcpus)

    def running() -> Obj | None:
        pod = deployed.pod_or_none("default", VM)
        if pod is None:  # the vm-controller has not made it yet
            return None
        statuses = pod.get("status", {}).get("containerStatuses") or []
        return pod if statuses and statuses[0].get("state", {}).get("running") else None

    pod: Obj = wait_for(running, timeout_seconds=240, what=f"{VM} running", interval=0.5)
    deployed.timings["apply examples to VM container running"] = time.monotonic() - started
    return pod
