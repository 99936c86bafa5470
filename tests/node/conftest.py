"""Fixtures of the real-node tier: one node per test run, the project's images on it.

``node``: the control plane, containerd, a kubelet, kube-proxy and the cluster DNS
(``tests/node/harness.py``), with the images ``tests/node/images.py`` builds from the project's
Dockerfiles imported into containerd. Where a node cannot run (no ``$VMA_KUBE_BIN`` with the
node's binaries, not root, no containerd) the tier skips with one line saying why; in CI
(``CI`` set) it fails instead, as the control-plane tier does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.controlplane import kube_bin_dir, wait_for
from tests.node import images
from tests.node.harness import VM, Node, Obj, cannot_run, ctr_args
from tests.node.overlay import tier_overlay

ROOT = Path(__file__).resolve().parents[2]


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
    n = Node(bin_dir, work)
    try:
        n.start_containerd()
        t = time.monotonic()
        built = images.ensure_images(
            images.support_images(bin_dir, work) + images.project_images(),
            work / "images.log",
            ctr_args(),
        )
        n.timings["images"] = time.monotonic() - t
        print(f"\nnode images: {built}")
        n.start_control_plane()
        n.start_node()
        n.timings["node start to Ready"] = time.monotonic() - started
        print(f"node timings: { {k: round(v, 1) for k, v in n.timings.items()} }")
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="session")
def deployed(node: Node) -> Node:
    """``kubectl apply -k manifests/``, both workloads rolled out."""
    started = time.monotonic()
    node.kubectl("apply", "-k", str(ROOT / "manifests"))
    # Two replicas that must never share a node: on this one node, one serves and the other
    # waits for a second node (its anti-affinity), as on any one-node cluster.
    wait_for(
        lambda: node.kubectl("-n", "vm-autoscaling", "get", "deployment/scheduler-extender", "-o",
                             "jsonpath={.status.availableReplicas}").stdout == "1",
        timeout_seconds=180, what="one scheduler-extender replica available", interval=1,
    )  # fmt: skip
    node.rollout("daemonset/autoscaler-agent")
    node.timings["apply -k manifests/ to Ready"] = time.monotonic() - started
    return node


@pytest.fixture(scope="session")
def tuned(deployed: Node, tmp_path_factory: pytest.TempPathFactory) -> Node:
    """``manifests/`` re-applied through the tier's overlay (``tests/node/overlay.py``: room for
    a VM to grow on a 2-CPU node, shorter shrink windows), both workloads rolled out again."""
    started = time.monotonic()
    deployed.kubectl("apply", "-k", str(tier_overlay(tmp_path_factory.mktemp("overlay"))))
    deployed.rollout("deployment/scheduler-extender")
    deployed.rollout("daemonset/autoscaler-agent")
    deployed.timings["apply the tier's overlay to Ready"] = time.monotonic() - started
    return deployed


@pytest.fixture(scope="session")
def vm(deployed: Node) -> Obj:
    """``kubectl apply -k manifests/examples``: the VM pod once its container runs."""
    return example_vm(deployed)


def example_vm(deployed: Node) -> Obj:
    """``kubectl apply -k manifests/examples`` (again: a module after test_failures, which
    deletes it, needs it back), and the VM pod once its container runs."""
    started = time.monotonic()
    deployed.kubectl("apply", "-k", str(ROOT / "manifests" / "examples"))

    def running() -> Obj | None:
        pod = deployed.pod_or_none("default", VM)
        if pod is None:  # the StatefulSet controller has not made it yet
            return None
        statuses = pod.get("status", {}).get("containerStatuses") or []
        return pod if statuses and statuses[0].get("state", {}).get("running") else None

    pod: Obj = wait_for(running, timeout_seconds=240, what=f"{VM} running", interval=0.5)
    deployed.timings["apply examples to VM container running"] = time.monotonic() - started
    return pod
