"""What the extender does through the real API server: manifests, tokens, durable permits."""

from __future__ import annotations

import pytest

from testkit.cluster import AGENT_NS, AGENT_SA, Cluster, Names, agent_pod, permit_batch
from testkit.controlplane import (
    DOCS,
    ApiError,
    Obj,
    install_crds,
    object_path,
    pod_path,
    wait_for,
)
from testkit.manifests import EXAMPLES, render


def test_every_manifest_passes_a_server_side_dry_run(cluster: Cluster):
    """kube-apiserver v1.36 validates every object of manifests/ and its examples (schema,
    defaults, admission); objects the tier created for real from the same files are there
    already, which is the answer for them."""
    # The examples are VirtualMachines: their kind is served once the CRDs exist for real (a
    # dry run of a CRD creates nothing).
    install_crds(cluster.api, DOCS)
    refused = []
    for doc in DOCS + render(EXAMPLES):
        try:
            cluster.api.create(object_path(doc), doc, dry_run=True)
        except ApiError as e:
            if e.status != 409:
                refused.append((doc["kind"], doc["metadata"]["name"], e.body))
    assert refused == []


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


def test_memory_follows_the_permit_in_place_both_ways(cluster: Cluster, names: Names):
    """A VM whose memory scales: the real pods/resize subresource takes the container's memory
    request and limit up with a grant and down with a notice (Kubernetes v1.36 allows a memory
    limit decrease in place with the default NotRequired policy), and the durable record
    follows."""
    gib = 2**30
    node = names.node("m", cpu="8", memory="16Gi")
    names.vm(
        "vm-m",
        memory="1Gi",
        annotations={
            "vm-autoscaling.io/min-memory": "1Gi",
            "vm-autoscaling.io/max-memory": "8Gi",
            "vm-autoscaling.io/memory-unit": "512Mi",
        },
    )
    assert names.wait_bound("vm-m") == node
    vm = names.api.pod(names.namespace, "vm-m")
    token = names.api.request_token(AGENT_NS, AGENT_SA, pod=agent_pod(names, node))
    auth = {"Authorization": f"Bearer {token}"}

    def ask(current: int, requested: int, last: int) -> Obj:
        body = permit_batch(node, vm, current=1, requested=1)
        (req,) = body["requests"]
        req["current"]["memoryBytes"] = current
        req["requested"]["memoryBytes"] = requested
        req["lastPermit"] = {"vcpus": 1, "memoryBytes": last}
        status, answer = cluster.extender.post("/v1/permits", body, headers=auth)
        assert status == 200, answer
        (permit,) = answer["permits"]
        return permit

    def memory_is(quantity: str) -> Obj | None:
        pod = names.api.pod(names.namespace, "vm-m")
        resources = pod["spec"]["containers"][0]["resources"]
        annotations = pod["metadata"].get("annotations", {})
        if (
            resources["requests"]["memory"] == resources["limits"]["memory"] == quantity
            and annotations.get("vm-autoscaling.io/permitted-memory") == quantity
        ):
            return pod
        return None

    ask(gib, gib, gib)  # the agent reports first: the VM was found bound
    permit = ask(gib, 3 * gib + 100 * 2**20, gib)  # rounded down to 1Gi + 4 x 512Mi
    assert (permit["status"], permit["permit"]["memoryBytes"]) == ("partial", 3 * gib)
    grown = wait_for(lambda: memory_is("3Gi"), timeout_seconds=30, what="memory grown in place")
    assert grown["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
    # The guest gave back only down to 2Gi of the 1Gi asked: that is what the notice says.
    permit = ask(3 * gib, 2 * gib, 3 * gib)
    assert (permit["status"], permit["permit"]["memoryBytes"]) == ("released", 2 * gib)
    shrunk = wait_for(lambda: memory_is("2Gi"), timeout_seconds=30, what="memory shrunk in place")
    assert shrunk["metadata"]["generation"] > grown["metadata"]["generation"]
    assert shrunk["status"]["qosClass"] == "Guaranteed"
    # What the fake API server answers too (tests/kube_io/test_fake_kube_api.py).
    with pytest.raises(ApiError) as refused:
        names.api.request(
            "PATCH",
            pod_path(names.namespace, "vm-m") + "/resize",
            {
                "spec": {
                    "containers": [{"name": "vm", "resources": {"requests": {"memory": "4Gi"}}}]
                }
            },
            content_type="application/strategic-merge-patch+json",
        )
    assert refused.value.status == 422
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["message"] == (
        'Pod "vm-m" is invalid: [spec.containers[0].resources.requests: Invalid value: "4Gi":'
        " must be less than or equal to memory limit of 2Gi, spec: Invalid value:"
        ' "Guaranteed": Pod QOS Class may not change as a result of resizing]'
    )


def test_only_the_agent_gets_permits(cluster: Cluster, names: Names):
    """Real TokenRequest tokens that are not the agent's: a tenant's pod-bound token for the
    extender's audience, and the agent's own token once its pod is gone. Each is refused and
    the VM keeps its size."""
    node = names.node("a", cpu="10")
    names.vm("vm-0", max_vcpus=4)
    assert names.wait_bound("vm-0") == node
    vm = names.api.pod(names.namespace, "vm-0")
    names.api.create(
        f"/api/v1/namespaces/{names.namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant"}},
    )
    tenant_pod = names.api.create(
        pod_path(names.namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "tenant", "namespace": names.namespace},
            "spec": {
                "nodeName": node,
                "serviceAccountName": "tenant",
                "containers": [{"name": "app", "image": "app"}],
            },
        },
    )
    names.api.set_pod_phase(names.namespace, "tenant", "Running")
    tenant = names.api.request_token(names.namespace, "tenant", pod=tenant_pod)
    gone = agent_pod(names, node)
    gone_token = names.api.request_token(AGENT_NS, AGENT_SA, pod=gone)
    names.api.delete(pod_path(AGENT_NS, gone["metadata"]["name"]))
    wait_for(
        lambda: (
            names.api.request(
                "GET", pod_path(AGENT_NS, gone["metadata"]["name"]), ok=(200, 404)
            ).get("code")
            == 404
        ),
        timeout_seconds=30,
        what="the agent pod gone",
    )
    shrink = permit_batch(node, vm, current=1, requested=1)
    shrink["requests"][0]["current"]["vcpus"] = 4  # a claim that would free three vCPUs
    grow = permit_batch(node, vm, current=1, requested=4)
    before = cluster.extender.state()
    for token, expected in ((tenant, 403), (gone_token, 401)):
        for body in (shrink, grow):
            status, answer = cluster.extender.post(
                "/v1/permits", body, headers={"Authorization": f"Bearer {token}"}
            )
            assert status == expected, answer
    assert holds_of(cluster.extender.state(), node) == holds_of(before, node)


def holds_of(state: Obj, node: str) -> list[Obj]:
    return next(n["allocations"] for n in state["nodes"] if n["name"] == node)


def test_metrics_only_for_scrapers_allowed_to_read_them(cluster: Cluster, names: Names):
    """The metrics listener as deployed (auth: kubernetes): a ServiceAccount bound to the
    manifests' vm-autoscaling-metrics-reader reads /metrics with its ordinary token; another
    ServiceAccount gets 403, a token for another audience or none at all 401. Real
    TokenReview and SubjectAccessReview against the real RBAC authorizer."""
    for account in ("scraper", "bystander"):
        names.api.create(
            f"/api/v1/namespaces/{names.namespace}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
        )
    binding = f"{names.namespace}-metrics"
    names.api.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "vm-autoscaling-metrics-reader",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "scraper", "namespace": names.namespace}
            ],
        },
    )
    names.cleanup.append(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")
    scraper = names.api.request_token(names.namespace, "scraper", audience=None)
    bystander = names.api.request_token(names.namespace, "bystander", audience=None)
    # The scraper's token, but issued for the extender's permit audience: not for the API.
    scraper_for_permits = names.api.request_token(names.namespace, "scraper")

    def scrape(token: str | None) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return cluster.extender.get("/metrics", port=cluster.extender.metrics_port, headers=headers)

    status, body = scrape(scraper)
    assert status == 200, body
    assert b"vmautoscale_extender_" in body
    status, body = scrape(bystander)
    assert status == 403, body
    assert f"system:serviceaccount:{names.namespace}:bystander".encode() in body
    assert scrape(scraper_for_permits)[0] == 401
    assert scrape(None)[0] == 401
    # Cached decisions answer again the same way.
    assert scrape(scraper)[0] == 200
    assert scrape(bystander)[0] == 403
    # Nothing but the metrics and the probes on this port.
    assert cluster.extender.get("/state", port=cluster.extender.metrics_port)[0] == 404
    assert cluster.extender.get("/readyz", port=cluster.extender.metrics_port)[0] == 200


def test_a_binding_for_a_version_the_pod_no_longer_has_is_refused(cluster: Cluster, names: Names):
    """What a new leader's fence relies on (``Extender.fence``): the API server refuses a
    Binding whose ``resourceVersion`` precondition the pod no longer meets, and takes one
    that meets it."""
    node = names.node("fence", cpu="4")
    created = cluster.api.create(
        pod_path(names.namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "waiting", "namespace": names.namespace},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "app"}]},
        },
    )
    meta = created["metadata"]
    fenced = cluster.api.merge_patch(
        pod_path(names.namespace, "waiting"),
        {"metadata": {"annotations": {"vm-autoscaling.io/leader-term": "2"}}},
    )

    def binding(version: str) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": "waiting",
                "namespace": names.namespace,
                "uid": meta["uid"],
                "resourceVersion": version,
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }

    path = pod_path(names.namespace, "waiting") + "/binding"
    with pytest.raises(ApiError) as refused:
        cluster.api.request("POST", path, binding(meta["resourceVersion"]))
    assert refused.value.status == 409
    assert "Precondition failed: ResourceVersion in precondition" in str(refused.value.body)
    assert names.node_of("waiting") is None
    cluster.api.request("POST", path, binding(fenced["metadata"]["resourceVersion"]))
    assert names.node_of("waiting") == node
