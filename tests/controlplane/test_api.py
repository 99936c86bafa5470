"""What the extender does through the real API server: manifests, tokens, durable permits."""

from __future__ import annotations

from tests.controlplane.conftest import DOCS, Cluster, Names
from tests.controlplane.harness import ApiError, Obj, object_path, pod_path, wait_for
from tests.deploy.render import EXAMPLES, render

AGENT_NS = "vm-autoscaling"
AGENT_SA = "autoscaler-agent"


def test_every_manifest_passes_a_server_side_dry_run(cluster: Cluster):
    """kube-apiserver v1.36 validates every object of manifests/ and its examples (schema,
    defaults, admission); objects the tier created for real from the same files are there
    already, which is the answer for them."""
    refused = []
    for doc in DOCS + render(EXAMPLES):
        try:
            cluster.api.create(object_path(doc), doc, dry_run=True)
        except ApiError as e:
            if e.status != 409:
                refused.append((doc["kind"], doc["metadata"]["name"], e.body))
    assert refused == []


def agent_pod(names: Names, node: str) -> Obj:
    """The agent DaemonSet's pod on ``node``, as the kubelet would report it: Running."""
    name = f"agent-{node}"
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": AGENT_NS,
            "labels": {"app.kubernetes.io/name": "autoscaler-agent"},
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": AGENT_SA,
            "containers": [{"name": "agent", "image": "agent"}],
        },
    }
    pod = names.api.create(pod_path(AGENT_NS), body)
    names.api.set_pod_phase(AGENT_NS, name, "Running")
    names.cleanup.append(pod_path(AGENT_NS, name))
    return pod


def permit_batch(node: str, vm: Obj, *, current: int, requested: int) -> Obj:
    meta = vm["metadata"]
    gib = 2**30
    return {
        "protocol": {"min": 1, "max": 1},
        "node": node,
        "requests": [
            {
                "pod": {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]},
                "node": node,
                "current": {"vcpus": current, "memoryBytes": gib},
                "requested": {"vcpus": requested, "memoryBytes": gib},
            }
        ],
    }


def test_permits_through_real_tokens_and_durable_in_place(cluster: Cluster, names: Names):
    node_a = names.node("a", cpu="10")
    node_b = names.node("b", cpu="10", spare="yes")
    names.vm("vm-0", max_vcpus=4)
    vm_node = names.wait_bound("vm-0")
    other = node_b if vm_node == node_a else node_a
    vm = names.api.pod(names.namespace, "vm-0")
    agent_here = names.api.request_token(AGENT_NS, AGENT_SA, pod=agent_pod(names, vm_node))
    agent_there = names.api.request_token(AGENT_NS, AGENT_SA, pod=agent_pod(names, other))
    wrong_audience = names.api.request_token(
        AGENT_NS, AGENT_SA, pod=agent_pod(names, f"{vm_node}-x"), audience="someone-else"
    )
    grow = permit_batch(vm_node, vm, current=1, requested=3)

    # The agent of another node may not speak for this node's VMs; a token for another
    # audience is no token at all.
    status, body = cluster.extender.post(
        "/v1/permits", grow, headers={"Authorization": f"Bearer {agent_there}"}
    )
    assert status == 403, body
    status, body = cluster.extender.post(
        "/v1/permits", grow, headers={"Authorization": f"Bearer {wrong_audience}"}
    )
    assert status == 401, body

    status, body = cluster.extender.post(
        "/v1/permits", grow, headers={"Authorization": f"Bearer {agent_here}"}
    )
    assert status == 200, body
    (permit,) = body["permits"]
    assert (permit["status"], permit["permit"]["vcpus"]) == ("granted", 3)

    # Durable: the permit is written on the pod, and the pod is resized in place through the
    # real pods/resize subresource, so kube-scheduler and a restarted extender both see it.
    def recorded() -> Obj | None:
        pod = names.api.pod(names.namespace, "vm-0")
        annotations = pod["metadata"].get("annotations", {})
        requests = pod["spec"]["containers"][0]["resources"]["requests"]
        if annotations.get("vm-autoscaling.io/permitted-vcpus") == "3" and requests["cpu"] == "3":
            return pod
        return None

    pod = wait_for(recorded, timeout_seconds=30, what="permit annotation and in-place resize")
    assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "3"
    assert pod["metadata"]["generation"] > vm["metadata"].get("generation", 1)
