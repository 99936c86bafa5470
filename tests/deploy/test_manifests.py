"""Every manifest is a valid Kubernetes v1.36 object, and the kustomizations render.

Validation uses the maintained ``kubernetes-validate`` package (the official OpenAPI-derived
JSON schemas) in strict mode, so unknown fields (typos) fail as well as wrong types.
"""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import msgspec
import pytest

from protocol.kube import Pod
from scheduler_extender.core.podinfo import Disruption, disruption_of
from testkit.manifests import (
    KUSTOMIZATION_DIRS,
    MANIFESTS,
    PROMETHEUS_FILES,
    STATEFULSET_EXAMPLE,
    VM_CONTROLLER,
    all_manifest_files,
    find,
    kustomization,
    load_yaml_docs,
    pod_spec,
    render,
)

K8S_VERSION = "1.36"
NAMESPACE = "vm-autoscaling"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


def _docs_with_ids() -> list[tuple[str, dict]]:
    out = []
    for path in all_manifest_files():
        for doc in load_yaml_docs(path):
            if doc.get("kind") in {"Kustomization", "Component"}:
                continue
            out.append(
                (f"{path.relative_to(MANIFESTS)}:{doc['kind']}/{doc['metadata']['name']}", doc)
            )
    return out


DOCS = _docs_with_ids()


def test_schemas_for_the_target_version_are_shipped():
    # validate() silently falls back to the newest older schema set; insist on 1.36 itself.
    versions = {
        kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()
    }
    assert kubernetes_validate.utils.major_minor(K8S_VERSION) in versions


# prometheus-operator's kinds (manifests/monitoring/operator/): Kubernetes ships no schema for
# them; tests/deploy/test_monitoring.py checks their fields against what the operator reads.
OPERATOR_GROUP = "monitoring.coreos.com/"
# Our own kinds (VirtualMachine): their schema is our CRD, which the real API server applies in
# tests/controlplane/test_virtualmachines.py.
OWN_GROUP = "vm-autoscaling.io/"
CORE_DOCS = [(i, d) for i, d in DOCS if not d["apiVersion"].startswith((OPERATOR_GROUP, OWN_GROUP))]


@pytest.mark.parametrize("doc", [d for _, d in CORE_DOCS], ids=[i for i, _ in CORE_DOCS])
def test_manifest_validates_against_the_official_schema(doc):
    assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION


def test_generated_configmaps_validate():
    for doc in render(MANIFESTS):
        if doc["kind"] == "ConfigMap":
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_strict_validation_rejects_an_unknown_field():
    """The check above is worth something only if a typo fails it."""
    deployment = copy.deepcopy(find(render(MANIFESTS), "Deployment", "scheduler-extender"))
    pod_spec(deployment)["containers"][1]["readinesProbe"] = {}  # sic
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_every_manifest_file_is_used_by_a_kustomization():
    used: set[Path] = set()
    for kfile in MANIFESTS.rglob("kustomization.yaml"):
        directory = kfile.parent
        k = load_yaml_docs(kfile)[0]
        used.update((directory / r).resolve() for r in k.get("resources", []))
        for gen in k.get("configMapGenerator", []):
            used.update((directory / f.partition("=")[2]).resolve() for f in gen["files"])
    files = {p.resolve() for p in MANIFESTS.rglob("*.yaml") if p.name != "kustomization.yaml"}
    # The KVM patch lives inline in its Component. Prometheus's own files are loaded by
    # Prometheus (tests/deploy/test_monitoring.py runs promtool on them).
    prometheus = {p.resolve() for p in PROMETHEUS_FILES.rglob("*.yaml")}
    assert prometheus
    # Applied by the user in each namespace that runs VirtualMachines (its header says so).
    per_vm_namespace = {(VM_CONTROLLER / "migration-networkpolicy.yaml").resolve()}
    assert files - used == prometheus | per_vm_namespace


@pytest.mark.parametrize("directory", KUSTOMIZATION_DIRS, ids=str)
def test_kustomization_resources_exist(directory):
    for entry in kustomization(directory).get("resources", []):
        assert (directory / entry).exists(), f"{directory}: missing resource {entry}"


def test_main_kustomization_renders_the_whole_system():
    docs = render(MANIFESTS)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {
        ("Namespace", NAMESPACE),
        ("Deployment", "scheduler-extender"),
        ("Service", "scheduler-extender"),
        ("PodDisruptionBudget", "scheduler-extender"),
        ("NetworkPolicy", "scheduler-extender"),
        ("DaemonSet", "autoscaler-agent"),
        ("ServiceAccount", "vm-scheduler"),
        ("ServiceAccount", "autoscaler-agent"),
        ("ConfigMap", "vm-scheduler-config"),
        ("ConfigMap", "scheduler-extender-config"),
        ("ConfigMap", "autoscaler-agent-config"),
    } <= kinds
    # Installing the autoscaler must not start VMs.
    assert not any(d["kind"] == "StatefulSet" for d in docs)


def test_every_namespaced_object_is_in_the_namespace():
    """No `namespace:` transform (see kustomization.yaml), so each object must say it. The
    one exception must stay in kube-system, where the ConfigMap it grants access to lives."""
    for doc in render(MANIFESTS):
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"]
            continue
        name = doc["metadata"]["name"]
        expected = (
            "kube-system"
            if name.endswith("extension-apiserver-authentication-reader")
            else NAMESPACE
        )
        assert doc["metadata"].get("namespace") == expected, f"{doc['kind']}/{name}"


def test_binding_subjects_name_our_namespace():
    for doc in render(MANIFESTS):
        for subject in doc.get("subjects", []):
            assert subject == {
                "kind": "ServiceAccount",
                "name": subject["name"],
                "namespace": NAMESPACE,
            }


def test_labels_reach_every_object_but_not_the_selectors():
    docs = render(MANIFESTS)
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "vm-autoscaling"
    for doc in docs:
        if doc["kind"] in {"Deployment", "DaemonSet"}:
            assert "app.kubernetes.io/part-of" not in doc["spec"]["selector"]["matchLabels"]
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_configmap_volumes_name_generated_configmaps():
    docs = render(MANIFESTS)
    generated = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    for doc in docs:
        if doc["kind"] in {"Deployment", "DaemonSet"}:
            for vol in pod_spec(doc).get("volumes", []):
                if "configMap" in vol:
                    assert vol["configMap"]["name"] in generated


# Labels written at run time (the template holds only their first value), which a Service may
# select: the extender's role (scheduler_extender/kube/leader.py).
RUNTIME_LABELS = {"vm-autoscaling.io/extender-role"}


def test_services_select_their_pods_by_port_name():
    # The examples' VirtualMachines get theirs from the vm-controller (test_examples.py).
    docs = render(MANIFESTS) + render(STATEFULSET_EXAMPLE)
    for svc in [d for d in docs if d["kind"] == "Service"]:
        selector = {k: v for k, v in svc["spec"]["selector"].items() if k not in RUNTIME_LABELS}
        targets = [
            d
            for d in docs
            if d["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}
            and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, svc["metadata"]["name"]
        port_names = {
            p["name"] for c in pod_spec(targets[0])["containers"] for p in c.get("ports", [])
        }
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in port_names


def test_network_policy_lets_only_the_agents_and_the_vm_controller_reach_the_permit_port():
    """The policy selects the extender's pods; the permit port admits the agent DaemonSet's
    pods and the vm-controller's (its POST /v1/moves) and nothing else; the verbs port
    (loopback, unauthenticated /bind) admits nobody; every port it names is one the extender's
    pod really has."""
    docs = render(MANIFESTS)
    policy = find(docs, "NetworkPolicy", "scheduler-extender")
    extender = find(docs, "Deployment", "scheduler-extender")
    agent = find(docs, "DaemonSet", "autoscaler-agent")
    controller = find(docs, "Deployment", "vm-controller")
    spec = policy["spec"]
    selected = [
        d
        for d in docs
        if d["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}
        and d["metadata"]["namespace"] == policy["metadata"]["namespace"]
        and spec["podSelector"]["matchLabels"].items()
        <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert selected == [extender]
    assert spec["policyTypes"] == ["Ingress"]
    port_names = {p["name"] for c in pod_spec(extender)["containers"] for p in c.get("ports", [])}
    admitted: dict[str, list] = {}
    for rule in spec["ingress"]:
        for port in rule["ports"]:
            assert port["port"] in port_names
            admitted.setdefault(port["port"], []).append(rule.get("from"))
    assert "verbs" not in admitted
    (sources,) = admitted["permits"]
    everything = docs
    assert len(sources) == 2
    for source, allowed in zip(sources, (agent, controller), strict=True):
        # No namespaceSelector: the policy's own namespace, which is the callers'.
        assert set(source) == {"podSelector"}
        assert allowed["metadata"]["namespace"] == policy["metadata"]["namespace"]
        matched = [
            d
            for d in everything
            if d["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}
            and source["podSelector"]["matchLabels"].items()
            <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert matched == [allowed]


def test_the_extenders_pod_as_written_may_be_evicted_by_a_drain():
    """manifests/extender.yaml names its one emptyDir (/tmp) safe to evict: without it, no node
    running a replica could ever be emptied (ours, or cluster-autoscaler's scale-down)."""
    deployment = next(
        d for d in render(MANIFESTS) if (d["kind"], d["metadata"]["name"])
        == ("Deployment", "scheduler-extender")
    )  # fmt: skip
    template = deployment["spec"]["template"]
    pod = msgspec.convert(
        {
            "metadata": {
                **template["metadata"],
                "name": "x",
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "u",
                     "controller": True}
                ],
            },
            "spec": template["spec"],
        },
        Pod,
    )  # fmt: skip
    assert any(v.empty_dir is not None for v in pod.spec.volumes or ())
    assert disruption_of(pod) is Disruption.EVICT
