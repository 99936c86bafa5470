"""Fixtures of the real-control-plane tier.

``control_plane``: etcd + kube-apiserver, once per session. ``cluster``: the extender process
and kube-scheduler calling it, once per module, both under the manifests' ServiceAccount. Tests
stay independent through names: each makes its own namespace and nodes (``Names``), and its
pods select their own nodes by label, so another test's nodes never take its pods.

Without ``$VMA_KUBE_BIN`` the tier skips with one line saying how to provide the binaries; in CI
(``CI`` set) it fails instead, since CI must run it.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cluster import Cluster, Names, running_cluster
from testkit.controlplane import (
    DOCS,
    KUBE_BIN_HINT,
    RBAC_KINDS,
    ControlPlane,
    extender_identity,
    kube_bin_dir,
    pod_path,
)

LAG_SECONDS = 0.4


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    bin_dir = kube_bin_dir()
    if bin_dir is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the control-plane tier; {KUBE_BIN_HINT}")
        pytest.skip(KUBE_BIN_HINT)
    cp = ControlPlane(bin_dir, tmp_path_factory.mktemp("control-plane"))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def extender_kubeconfig(control_plane: ControlPlane) -> Path:
    return extender_identity(control_plane, [d for d in DOCS if d["kind"] in RBAC_KINDS])


@pytest.fixture(scope="module")
def cluster(
    control_plane: ControlPlane, extender_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with running_cluster(
        control_plane, extender_kubeconfig, tmp_path_factory.mktemp("cluster")
    ) as running:
        yield running


@pytest.fixture(scope="module")
def lagging(
    control_plane: ControlPlane, extender_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A cluster whose extender hears everything from the API server 0.4 s late (its own per
    module, as ``cluster``): kube-scheduler's informers always learn first."""
    with running_cluster(
        control_plane,
        extender_kubeconfig,
        tmp_path_factory.mktemp("lagging"),
        api_lag_seconds=LAG_SECONDS,
    ) as running:
        yield running


_counter = itertools.count()


@pytest.fixture
def names(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Names]:
    api = control_plane.admin()
    n = next(_counter)
    namespace = f"t{n}-{uuid.uuid4().hex[:6]}"
    api.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    made = Names(api, namespace, group=namespace)
    try:
        yield made
    finally:
        # Leave nothing for the next test's scheduler to see: pods first, then nodes.
        for pod in api.get(pod_path(namespace))["items"]:
            api.delete(pod_path(namespace, pod["metadata"]["name"]))
        for path in made.cleanup:
            api.delete(path)
        for node in made.nodes:
            api.delete(f"/api/v1/nodes/{node}")
        api.close()
