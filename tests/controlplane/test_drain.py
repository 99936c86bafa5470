"""A drain's I/O against the real API server (``scheduler_extender.relief``): the taint and the
Eviction API, as the extender's ServiceAccount (the manifests' RBAC) sends them.

The API server decides an eviction (kubernetes/kubernetes
``pkg/registry/core/pod/storage/eviction.go``, ``EvictionREST.Create``): a running, ready pod
covered by a PodDisruptionBudget is deleted only if the budget's ``status.disruptionsAllowed``
is above 0 (it takes one), else the answer is 429. That status is the disruption controller's
(kube-controller-manager, which this tier does not run): the test writes it as the controller
would, from the pods it counts, and the API server's own checks do the rest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kube_io.client import KubeClient
from kube_io.errors import NotFound, TooManyRequests
from protocol.annotations import DRAIN_TAINT
from scheduler_extender.relief import DRAIN
from testkit.cluster import Names
from testkit.controlplane import pod_path


def _pod_with_budget(names: Names, app: str, *, node: str, allowed: int) -> str:
    """A running, ready pod of ``app`` on ``node``, and a PodDisruptionBudget over it whose
    status (the disruption controller's) allows ``allowed`` disruptions; the pod's uid."""
    api, ns = names.api, names.namespace
    pod = api.create(
        pod_path(ns),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": app, "namespace": ns, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "app"}]},
        },
    )
    api.set_pod_phase(ns, app, "Running")  # the kubelet's part: Running and Ready
    budgets = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
    spec = {"selector": {"matchLabels": {"app": app}}, "maxUnavailable": allowed}
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
              "metadata": {"name": app, "namespace": ns}, "spec": spec}  # fmt: skip
    made = api.create(budgets, budget)
    status = {
        "observedGeneration": made["metadata"]["generation"],
        "disruptionsAllowed": allowed,
        "currentHealthy": 1,
        "desiredHealthy": 1 - allowed,
        "expectedPods": 1,
    }
    api.request("PATCH", f"{budgets}/{app}/status", {"status": status},
                content_type="application/merge-patch+json")  # fmt: skip
    uid: str = pod["metadata"]["uid"]
    return uid


async def test_a_drain_taints_its_node_and_evicts_only_what_budgets_allow(
    names: Names, extender_kubeconfig: Path
) -> None:
    api, ns = names.api, names.namespace
    node = names.node("drained", cpu="4")
    # A taint someone else put there, with its time: the drain's taint leaves it as it was.
    other = {"key": "example.com/maintenance", "effect": "NoExecute",
             "timeAdded": "2026-11-29T00:00:00Z"}  # fmt: skip
    api.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"taints": [other]}})
    held = _pod_with_budget(names, "held", node=node, allowed=0)
    free = _pod_with_budget(names, "free", node=node, allowed=1)
    client = await KubeClient.connect(str(extender_kubeconfig))
    async with client:
        tainted = await client.taint_node(node, DRAIN)
        again = await client.taint_node(node, DRAIN)  # already there: nothing written
        with pytest.raises(TooManyRequests) as refused:
            await client.evict_pod(ns, "held", uid=held)
        await client.evict_pod(ns, "free", uid=free)
    taints = api.get(f"/api/v1/nodes/{node}")["spec"]["taints"]
    assert taints == [other, {"key": DRAIN_TAINT, "value": "relief", "effect": "NoSchedule"}]
    assert tainted.spec.taints == again.spec.taints and len(taints) == 2
    assert again.metadata.resource_version == tainted.metadata.resource_version
    assert "disruption budget" in refused.value.message
    # Its budget allowed none: the pod stays, untouched. The other is being deleted.
    assert "deletionTimestamp" not in api.pod(ns, "held")["metadata"]
    assert "deletionTimestamp" in api.pod(ns, "free")["metadata"]
    budget = api.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/free")["status"]
    assert budget["disruptionsAllowed"] == 0 and "free" in budget["disruptedPods"]


async def test_an_eviction_of_a_pod_replaced_under_its_name_spends_no_disruption(
    names: Names, extender_kubeconfig: Path
) -> None:
    """The API server checks an eviction's uid precondition only when it deletes, after it
    has taken a disruption from the budget (``EvictionREST.Create``: ``checkAndDecrement``,
    then ``store.Delete``): an eviction meant for a pod that another pod has since replaced
    under its name is refused, 409, with the new pod's budget spent and the new pod listed as
    being disrupted until the disruption controller gives up on it. The extender reads the
    pod first, so the eviction of a pod that is gone says so and spends nothing."""
    api, ns = names.api, names.namespace
    node = names.node("drained-again", cpu="4")
    old = _pod_with_budget(names, "swapped", node=node, allowed=1)
    api.delete(pod_path(ns, "swapped"))
    replacement = api.create(
        pod_path(ns),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "swapped", "namespace": ns, "labels": {"app": "swapped"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "app"}]},
        },
    )
    api.set_pod_phase(ns, "swapped", "Running")
    assert replacement["metadata"]["uid"] != old
    client = await KubeClient.connect(str(extender_kubeconfig))
    async with client:
        with pytest.raises(NotFound) as gone:
            await client.evict_pod(ns, "swapped", uid=old)
    assert old in gone.value.message and replacement["metadata"]["uid"] in gone.value.message
    assert "deletionTimestamp" not in api.pod(ns, "swapped")["metadata"]
    budget = api.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/swapped")["status"]
    assert budget["disruptionsAllowed"] == 1 and not budget.get("disruptedPods"), budget
