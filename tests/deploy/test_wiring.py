"""The pieces agree with each other and with the code: scheduler config vs the extender's
routes, the configs vs the components' own loaders, ports, probes, token audience, sockets."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import CollectorRegistry

from scheduler_extender.config import MetricsAuth
from scheduler_extender.http.app import Deps, make_app, make_metrics_app, make_permits_app
from testkit.manifests import MANIFESTS, container, find, mount, pod_spec, volume
from tests.deploy.system import AGENT_CFG, AGENT_DS, DOCS, EXTENDER_CFG, EXTENDER_POD, SCHED
from tests.fakes_paths import REFERENCE

RECORDED = REFERENCE / "kube" / "scheduler-config" / "sched-extender-cache.yaml"


async def _never_connects():
    raise AssertionError("building the app must not connect to an API server")


def _routes(app) -> set[tuple[str, str]]:
    return {(r.method, r.resource.canonical) for r in app.router.routes()}


VERBS_APP = make_app(EXTENDER_CFG, Deps(registry=CollectorRegistry(), connect_kube=_never_connects))
PERMITS_APP = make_permits_app(EXTENDER_CFG, VERBS_APP)
METRICS_APP = make_metrics_app(EXTENDER_CFG, VERBS_APP)


# --- the KubeSchedulerConfiguration -------------------------------------------------------------


def test_scheduler_config_is_a_v1_configuration_with_our_profile():
    assert SCHED["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert SCHED["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in SCHED["profiles"]] == [EXTENDER_CFG.scheduler_name]


def test_extender_entry_uses_only_keys_a_real_v136_scheduler_accepted():
    recorded = yaml.safe_load(RECORDED.read_text(encoding="utf-8"))["extenders"][0]
    (ours,) = SCHED["extenders"]
    assert set(ours) <= set(recorded), set(ours) - set(recorded)


def test_extender_entry_semantics():
    (ext,) = SCHED["extenders"]
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    assert ext["enableHTTPS"] is False
    assert isinstance(ext["weight"], int) and ext["weight"] >= 1
    seconds = int(ext["httpTimeout"].removesuffix("s"))
    assert 1 <= seconds <= 10


def test_extender_verbs_are_exactly_the_routes_the_extender_serves():
    (ext,) = SCHED["extenders"]
    verbs = {ext[k] for k in ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb")}
    # kube-scheduler POSTs to urlPrefix + "/" + verb; /v1/... are the extender's own API.
    served = {
        path
        for method, path in _routes(VERBS_APP)
        if method == "POST" and not path.startswith("/v1/")
    }
    assert {f"/{v}" for v in verbs} == served


def test_url_prefix_is_the_extenders_loopback_verbs_listener():
    (ext,) = SCHED["extenders"]
    url = urlsplit(ext["urlPrefix"])
    assert (url.scheme, url.hostname, url.port) == (
        "http",
        "127.0.0.1",
        EXTENDER_CFG.listen.verbs.port,
    )
    assert url.path in {"", "/"}
    # Only the kube-scheduler in the same pod may call /bind.
    assert EXTENDER_CFG.listen.verbs.host == "127.0.0.1"


def test_leader_election_uses_the_leases_the_role_allows():
    """kube-scheduler's Lease and the extender's own, both in the Role (same ServiceAccount):
    the extender follows the first and holds the second."""
    le = SCHED["leaderElection"]
    assert le["leaderElect"] is True
    ours = EXTENDER_CFG.leader_election
    assert ours is not None
    assert ours.scheduler_lease_name == le["resourceName"]
    assert ours.lease_namespace == le["resourceNamespace"]
    role = find(DOCS, "Role", "vm-scheduler-leader-election")
    assert role["metadata"]["namespace"] == le["resourceNamespace"]
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [le["resourceName"], ours.lease_name],
            "verbs": ["get", "update"],
        }
    ]
    # The Lease's first holder creates it (a create cannot name the object in RBAC).
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]} in (
        role["rules"]
    )


def test_the_extenders_lease_is_timed_like_kube_schedulers():
    """A dead leader's pod is replaced within kube-scheduler's own bounds: the extender's Lease
    lasts as long as kube-scheduler's, and both retry as often."""
    le = SCHED["leaderElection"]
    ours = EXTENDER_CFG.leader_election
    assert ours is not None
    assert f"{ours.lease_duration_seconds}s" == le["leaseDuration"]
    assert f"{ours.retry_seconds:g}s" == le["retryPeriod"]


# --- the extender pod ---------------------------------------------------------------------------


def test_two_replicas_on_two_nodes_replaced_one_at_a_time():
    """A leader and a warm standby, never on the same node, never a third during a rollout
    (it would have no node of its own)."""
    assert EXTENDER_POD["spec"]["replicas"] == 2
    assert EXTENDER_POD["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    (term,) = pod_spec(EXTENDER_POD)["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == EXTENDER_POD["spec"]["selector"]["matchLabels"]


def test_the_budget_keeps_one_replica_and_counts_a_warm_standby():
    """minAvailable 1 over pods that are Ready once synced (leader or not): the leader's node
    may drain whenever the standby is warm; a pod that is not Ready never pins a node."""
    pdb = find(DOCS, "PodDisruptionBudget", "scheduler-extender")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["selector"] == EXTENDER_POD["spec"]["selector"]
    probe = container(EXTENDER_POD, "extender")["readinessProbe"]["httpGet"]
    assert probe["path"] == "/readyz?exclude=leader"


def test_the_permit_service_selects_the_leader_by_the_label_it_sets():
    ours = EXTENDER_CFG.leader_election
    assert ours is not None and ours.leader_label is not None
    svc = find(DOCS, "Service", "scheduler-extender")
    assert svc["spec"]["selector"] == {
        **EXTENDER_POD["spec"]["selector"]["matchLabels"],
        ours.leader_label: "leader",
    }
    env = {e["name"]: e for e in container(EXTENDER_POD, "extender")["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_kube_scheduler_image_matches_the_cluster_minor():
    image = container(EXTENDER_POD, "kube-scheduler")["image"]
    assert image.startswith("registry.k8s.io/kube-scheduler:v1.36.")
    kind_cfg = yaml.safe_load((MANIFESTS.parent / "kind" / "kind-config.yaml").read_text())
    assert {n["image"].split(":")[1] for n in kind_cfg["nodes"]} == {image.split(":")[1]}


def test_extender_ports_and_probes_match_its_listeners():
    c = container(EXTENDER_POD, "extender")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert EXTENDER_CFG.listen.metrics is not None
    assert EXTENDER_CFG.listen.metrics.auth is MetricsAuth.KUBERNETES
    assert ports == {
        "verbs": EXTENDER_CFG.listen.verbs.port,
        "permits": EXTENDER_CFG.listen.permits.port,
        "metrics": EXTENDER_CFG.listen.metrics.port,
    }
    permit_routes = {path for method, path in _routes(PERMITS_APP) if method == "GET"}
    for probe, path in [
        ("readinessProbe", "/readyz?exclude=leader"),
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
    ]:
        assert c[probe]["httpGet"] == {"path": path, "port": "permits"}
        assert path.partition("?")[0] in permit_routes
    # kube-scheduler's liveness is the pair's: the extender's /healthz, which fails when the
    # extender is stalled (its kube-scheduler leads, it cannot hold its Lease), so the pair
    # steps down. A probe names another container's port by number only.
    probe = container(EXTENDER_POD, "kube-scheduler")["livenessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": EXTENDER_CFG.listen.permits.port}
    # The Services expose the permit port (the leader's) and the metrics port (both
    # replicas'), never the verbs.
    svc = find(DOCS, "Service", "scheduler-extender")
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        (EXTENDER_CFG.listen.permits.port, "permits"),
    ]
    metrics_svc = find(DOCS, "Service", "scheduler-extender-metrics")
    assert [(p["port"], p["targetPort"]) for p in metrics_svc["spec"]["ports"]] == [
        (EXTENDER_CFG.listen.metrics.port, "metrics"),
    ]
    # The metrics port serves /metrics and the probes, and nothing that names pods.
    assert {path for _, path in _routes(METRICS_APP)} == {"/metrics", "/healthz", "/readyz"}


def test_extender_shuts_down_within_the_grace_period():
    grace = pod_spec(EXTENDER_POD)["terminationGracePeriodSeconds"]
    assert EXTENDER_CFG.shutdown_timeout_seconds < grace


def test_extender_pod_is_non_root_with_read_only_root():
    spec = pod_spec(EXTENDER_POD)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "memory" in c["resources"]["limits"] and "cpu" in c["resources"]["requests"]
    assert spec["serviceAccountName"] == "vm-scheduler"


# --- the agent DaemonSet ------------------------------------------------------------------------


def test_agent_knows_its_node_from_the_downward_api():
    env = {e["name"]: e for e in container(AGENT_DS, "agent")["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_agent_token_is_projected_for_the_extenders_audience():
    (source,) = volume(AGENT_DS, "extender-token")["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert token["audience"] == EXTENDER_CFG.auth.audience == "vm-autoscaling-extender"
    # The API server's minimum is 10 minutes; longer than a day defeats rotation.
    assert 600 <= token["expirationSeconds"] <= 86400
    m = mount(container(AGENT_DS, "agent"), "extender-token")
    assert AGENT_CFG.extender.token_file == f"{m['mountPath']}/{token['path']}"


def test_only_the_agents_service_account_gets_permits():
    namespace, name = EXTENDER_CFG.auth.agent_service_account.split("/")
    assert AGENT_DS["metadata"]["namespace"] == namespace
    assert pod_spec(AGENT_DS)["serviceAccountName"] == name


def test_agent_reaches_the_extender_through_its_service():
    url = urlsplit(AGENT_CFG.extender.url)
    svc = find(DOCS, "Service", "scheduler-extender")
    assert url.hostname == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    assert url.port == svc["spec"]["ports"][0]["port"]


def test_agent_sees_the_host_socket_directory_below_its_socket_root():
    host_dir = volume(AGENT_DS, "vm-sockets")["hostPath"]["path"]
    m = mount(container(AGENT_DS, "agent"), "vm-sockets")
    assert m["mountPath"] == AGENT_CFG.hypervisor.socket_root.rstrip("/") + host_dir


def test_agent_probes_and_port_match_its_config():
    c = container(AGENT_DS, "agent")
    assert c["ports"] == [{"name": "http", "containerPort": AGENT_CFG.http.port, "protocol": "TCP"}]
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}


def test_agent_runs_everywhere_without_capabilities():
    spec = pod_spec(AGENT_DS)
    assert {"operator": "Exists"} in spec["tolerations"]
    sc = container(AGENT_DS, "agent")["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert spec["serviceAccountName"] == "autoscaler-agent"


@pytest.mark.parametrize("name", ["scheduler-extender", "autoscaler-agent"])
def test_images_are_the_ones_kind_up_loads(name):
    workload = EXTENDER_POD if name == "scheduler-extender" else AGENT_DS
    images = {c["image"] for c in pod_spec(workload)["containers"]}
    up = (MANIFESTS.parent / "kind" / "up.sh").read_text()
    assert f'"vm-autoscaling/{name}:dev"' in up
    assert f"vm-autoscaling/{name}:dev" in images


def test_state_and_metrics_are_only_on_the_loopback_verbs_listener():
    """/state names every VM pod and its size; the permit port is open to every pod in the
    cluster (issue 16), so both stay on the verbs listener, which the manifests keep on
    loopback: scripts/watch-vcpus and run-bench.sh port-forward 10298 for them."""
    assert ("GET", "/state") in _routes(VERBS_APP)
    assert ("GET", "/metrics") in _routes(VERBS_APP)
    assert _routes(PERMITS_APP) == {
        ("GET", "/healthz"),
        ("HEAD", "/healthz"),
        ("GET", "/readyz"),
        ("HEAD", "/readyz"),
        ("POST", "/v1/permits"),
        # The vm-controller's move reservations: authenticated as the permits are, and they
        # disclose nothing about other VMs (tests/extender/test_moves.py).
        ("POST", "/v1/moves"),
    }
