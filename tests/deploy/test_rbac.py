"""RBAC grants what the code calls, and (for our own roles) nothing it does not.

``CALLS`` maps every public ``KubeClient`` method to the API request it sends. A new method
fails ``test_every_client_method_is_mapped`` until someone decides what it needs here, and so
until the manifests grant it (or the component is shown not to use it).
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import pytest

from kube_io.client import KubeClient
from testkit.manifests import MANIFESTS, render

DOCS = render(MANIFESTS)  # the vm-controller's RBAC included (manifests/vm-controller/)
NAMESPACE = "vm-autoscaling"


class Access(NamedTuple):
    verb: str
    group: str  # "" is the core group
    resource: str  # "pods/binding" for a subresource


LIFECYCLE = {"connect", "for_url", "close"}
CALLS: dict[str, list[Access]] = {
    "list_pods": [Access("list", "", "pods")],
    # The pod an agent's token is bound to must be a running agent pod (issue 16).
    "get_pod": [Access("get", "", "pods")],
    "list_nodes": [Access("list", "", "nodes")],
    # watch_events(kind): the extender watches both kinds, the agent only pods.
    "watch_events": [Access("watch", "", "pods"), Access("watch", "", "nodes")],
    "bind_pod": [Access("create", "", "pods/binding")],
    "patch_pod_annotations": [Access("patch", "", "pods")],
    "resize_pod_cpu": [Access("patch", "", "pods/resize")],
    "create_event": [Access("create", "", "events")],
    "review_token": [Access("create", "authentication.k8s.io", "tokenreviews")],
    # Whether a scraper may `get /metrics` on the metrics listener.
    "review_access": [Access("create", "authorization.k8s.io", "subjectaccessreviews")],
    # GET /version, the start-up check: a non-resource URL every authenticated (and anonymous)
    # user may read through the built-in ClusterRole system:public-info-viewer; no grant needed.
    "server_version": [],
    # The leader's role label on its own pod (kube/leader.py).
    "patch_pod_labels": [Access("patch", "", "pods")],
    # Leader election: granted by name in the Role of our namespace, not cluster-wide
    # (``test_leases_are_granted_by_name_in_our_namespace_only``).
    "get_lease": [Access("get", "coordination.k8s.io", "leases")],
    "create_lease": [Access("create", "coordination.k8s.io", "leases")],
    "replace_lease": [Access("update", "coordination.k8s.io", "leases")],
    # The vm-controller's own calls (vm_controller/controller.py).
    "list_virtual_machines": [Access("list", "vm-autoscaling.io", "virtualmachines")],
    "patch_virtual_machine_status": [
        Access("patch", "vm-autoscaling.io", "virtualmachines/status")
    ],
    "create_namespaced": [Access("create", "", "pods"), Access("create", "", "services")],
    "delete_pod": [Access("delete", "", "pods")],
    # Relief's moves (scheduler_extender/relief.py): the extender asks, the vm-controller
    # moves.
    "create_virtual_machine_migration": [
        Access("create", "vm-autoscaling.io", "virtualmachinemigrations")
    ],
    # Live migrations (vm_controller/migrator.py).
    "list_virtual_machine_migrations": [
        Access("list", "vm-autoscaling.io", "virtualmachinemigrations")
    ],
    "patch_virtual_machine_migration_status": [
        Access("patch", "vm-autoscaling.io", "virtualmachinemigrations/status")
    ],
    "list_services": [Access("list", "", "services")],
    "get_service": [Access("get", "", "services")],
    "patch_service_selector": [Access("patch", "", "services")],
    # A drain (scheduler_extender/relief.py): its taint (the node read, then patched) and
    # its evictions through the Eviction API (the pod read first, for its uid).
    "taint_node": [Access("get", "", "nodes"), Access("patch", "", "nodes")],
    "evict_pod": [Access("get", "", "pods"), Access("create", "", "pods/eviction")],
}
VM_CONTROLLER_CALLS = {
    "list_virtual_machines",
    "patch_virtual_machine_status",
    "create_namespaced",
    "delete_pod",
    "patch_virtual_machine_migration_status",
    "list_services",
    "get_service",
    "patch_service_selector",
}
# Calls the extender makes too: the vm-controller's migration mark on both pods of a move, and
# the target's label taken off at cut-over; the migrations' list (relief's book).
VM_CONTROLLER_SHARED_CALLS = {
    "patch_pod_annotations",
    "patch_pod_labels",
    "list_virtual_machine_migrations",
}
LEASE_CALLS = {"get_lease", "create_lease", "replace_lease"}

EXTENDER_USES = [
    a
    for name, accesses in CALLS.items()
    if name not in LEASE_CALLS | VM_CONTROLLER_CALLS
    for a in accesses
] + [Access("watch", "vm-autoscaling.io", "virtualmachinemigrations")]  # relief's book
VM_CONTROLLER_USES = {
    *(a for name in VM_CONTROLLER_CALLS | VM_CONTROLLER_SHARED_CALLS for a in CALLS[name]),
    Access("list", "", "pods"),
    Access("watch", "", "pods"),
    Access("watch", "vm-autoscaling.io", "virtualmachines"),
    Access("watch", "vm-autoscaling.io", "virtualmachinemigrations"),
    Access("watch", "", "services"),
    Access("create", "", "events"),
}
AGENT_USES = [Access("list", "", "pods"), Access("watch", "", "pods")]

# Grants in our own roles that no client call needs, each with why it is harmless.
JUSTIFIED_EXTRAS = {
    # The same stored objects as core/v1 events, for recorders using the newer API.
    Access("create", "events.k8s.io", "events"),
}


def _rules_for(service_account: str, *, own_only: bool) -> list[dict]:
    """Rules of the roles in our manifests bound to the ServiceAccount (cluster-wide ones)."""
    roles = {d["metadata"]["name"]: d for d in DOCS if d["kind"] == "ClusterRole"}
    rules = []
    for binding in [d for d in DOCS if d["kind"] == "ClusterRoleBinding"]:
        if {
            "kind": "ServiceAccount",
            "name": service_account,
            "namespace": NAMESPACE,
        } not in binding["subjects"]:
            continue
        name = binding["roleRef"]["name"]
        if name in roles:
            rules.extend(roles[name]["rules"])
        else:
            assert not own_only or name.startswith("system:"), name
    return rules


def _allows(rules: list[dict], access: Access) -> bool:
    return any(
        access.group in r["apiGroups"]
        and access.resource in r["resources"]
        and access.verb in r["verbs"]
        and not r.get("resourceNames")
        for r in rules
    )


def _granted(rules: list[dict]) -> set[Access]:
    return {
        Access(verb, group, resource)
        for r in rules
        for verb in r["verbs"]
        for group in r["apiGroups"]
        for resource in r["resources"]
    }


def test_every_client_method_is_mapped():
    public = {
        name
        for name, member in inspect.getmembers(KubeClient)
        if not name.startswith("_") and callable(member)
    }
    assert public - LIFECYCLE == set(CALLS)


@pytest.mark.parametrize("access", EXTENDER_USES, ids=str)
def test_extender_may_make_every_call_it_makes(access):
    assert _allows(_rules_for("vm-scheduler", own_only=True), access)


def test_extender_role_grants_nothing_unused():
    granted = _granted(_rules_for("vm-scheduler", own_only=True))
    assert granted - set(EXTENDER_USES) - JUSTIFIED_EXTRAS == set()


def test_leases_are_granted_by_name_in_our_namespace_only():
    """The extender reads kube-scheduler's Lease and holds its own; no cluster-wide grant on
    Leases, and updates only by name."""
    role = next(
        d
        for d in DOCS
        if d["kind"] == "Role" and d["metadata"]["name"] == "vm-scheduler-leader-election"
    )
    assert role["metadata"]["namespace"] == NAMESPACE
    binding = next(
        d
        for d in DOCS
        if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == role["metadata"]["name"]
    )
    assert {"kind": "ServiceAccount", "name": "vm-scheduler", "namespace": NAMESPACE} in (
        binding["subjects"]
    )
    for name in sorted(LEASE_CALLS):
        for access in CALLS[name]:
            matching = [
                r
                for r in role["rules"]
                if access.group in r["apiGroups"]
                and access.resource in r["resources"]
                and access.verb in r["verbs"]
            ]
            assert matching, (name, access)
            if access.verb != "create":  # a create cannot name its object in RBAC
                assert all(
                    {"vm-scheduler", "vm-scheduler-extender"} <= set(r["resourceNames"])
                    for r in matching
                )
    granted = _granted(_rules_for("vm-scheduler", own_only=True))
    assert not any(a.resource == "leases" for a in granted)


def test_no_wildcards_anywhere():
    for doc in DOCS:
        for rule in doc.get("rules", []):
            keys = (
                ("nonResourceURLs", "verbs")
                if "nonResourceURLs" in rule
                else ("apiGroups", "resources", "verbs")
            )
            for key in keys:
                assert all("*" not in item for item in rule[key]), doc["metadata"]["name"]


def test_metrics_reader_role_grants_only_reading_metrics():
    """What a Prometheus bound to it may do: `get /metrics`, on every component that guards
    its metrics with a SubjectAccessReview (the extender's metrics listener among them)."""
    (role,) = [d for d in DOCS if d["metadata"]["name"] == "vm-autoscaling-metrics-reader"]
    assert role["kind"] == "ClusterRole"
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


@pytest.mark.parametrize("access", AGENT_USES, ids=str)
def test_agent_may_read_pods(access):
    assert _allows(_rules_for("autoscaler-agent", own_only=True), access)


def test_agent_gets_exactly_read_access_to_pods():
    """No writes, no nodes, no secrets, no namespaced extras: a compromised agent learns pod
    specs and nothing more. Its node scoping is in its code (fieldSelector), see rbac-agent.yaml."""
    rules = _rules_for("autoscaler-agent", own_only=False)
    assert _granted(rules) == {Access("get", "", "pods"), *AGENT_USES}
    agent_bindings = [
        d
        for d in DOCS
        if d["kind"] in {"RoleBinding", "ClusterRoleBinding"}
        and any(s["name"] == "autoscaler-agent" for s in d["subjects"])
    ]
    assert [b["roleRef"]["name"] for b in agent_bindings] == ["vm-autoscaling:autoscaler-agent"]


def test_second_scheduler_has_the_official_multi_scheduler_bindings():
    cluster = {
        d["roleRef"]["name"]
        for d in DOCS
        if d["kind"] == "ClusterRoleBinding"
        and any(s["name"] == "vm-scheduler" for s in d["subjects"])
    }
    assert {"system:kube-scheduler", "system:volume-scheduler"} <= cluster
    reader = [
        d
        for d in DOCS
        if d["kind"] == "RoleBinding"
        and d["roleRef"]
        == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "extension-apiserver-authentication-reader",
        }
    ]
    assert [r["metadata"]["namespace"] for r in reader] == ["kube-system"]


def test_vm_controller_gets_exactly_what_it_calls():
    """The controller's role is its calls, no more: no get, no update, no spec writes."""
    assert _granted(_rules_for("vm-controller", own_only=True)) == VM_CONTROLLER_USES
