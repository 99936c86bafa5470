"""``snapshot_from_ledger``: the live state the extender keeps, as the recommender reads it.

The ledger knows sizes only; what decides *where* a pod may run (its node selector, affinity
and tolerations; the nodes' taints and cordons) comes from the watches beside it. These check
that each of them reaches the simulation, and that a pod the model cannot express is left
out and said, not simulated as if it had no constraints.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec.structs import replace

from protocol import kube
from scheduler_extender.core.ledger import Ledger
from scheduler_extender.core.podinfo import Demand, PodInfo
from scheduler_extender.recommender import (
    POOL_LABEL,
    ZONE_LABEL,
    NodePool,
    PriorityClass,
    Recommendation,
    RecommenderConfig,
    recommend,
    snapshot_from_ledger,
)

GI = 2**30


def pool(name: str, *, taint: bool = False) -> NodePool:
    template: dict[str, Any] = {
        "instanceType": f"{name}-type",
        "allocatable": {"cpu": "4", "memory": "16Gi"},
        "labels": {"tier": name},
    }
    if taint:
        template["taints"] = [{"key": "dedicated", "value": name, "effect": "NoSchedule"}]
    return msgspec.convert(
        {"name": name, "zones": ["a"], "template": template, "maxCount": 5}, NodePool
    )


def pending(name: str, cpu_millis: int = 1000, *, priority: int = 0) -> PodInfo:
    return PodInfo(
        uid=f"uid-{name}",
        namespace="ns",
        name=name,
        node_name=None,
        scheduler_name="vm-scheduler",
        requests=Demand(cpu_millis, GI),
        priority=priority,
        is_ours=True,
        is_vm=False,
        is_static=False,
        is_terminated=False,
        created="2024-01-01T00:00:00+00:00",
    )


def spec(**fields: Any) -> kube.PodSpec:
    return msgspec.convert(fields, kube.PodSpec)


def ledger_with(*nodes: str) -> Ledger:
    """Empty nodes of pool "general" in zone a, each with room for every pod here."""
    ledger = Ledger()
    for name in nodes:
        ledger.upsert_node(
            name,
            allocatable=Demand(8000, 32 * GI),
            labels={POOL_LABEL: "general", ZONE_LABEL: "a", "tier": "general"},
        )
    return ledger


def run(ledger: Ledger, pods: list[PodInfo], **live: Any) -> Recommendation:
    pools = [pool("general"), pool("db", taint=True)]
    snapshot = snapshot_from_ledger(ledger, pods, pools, **live)
    return recommend(snapshot, config=RecommenderConfig(scheduler_name="vm-scheduler"))


def placed(rec: Recommendation) -> dict[str, str]:
    """Pod -> the existing node it went to, or the pool of its new node."""
    found = {p.pod: p.node for p in rec.diagnostics.placed_on_existing}
    for node, pods in rec.diagnostics.new_nodes.items():
        found.update(dict.fromkeys(pods, "new " + node.split("-a-new-")[0]))
    return found


def test_a_pending_pods_node_selector_and_tolerations_choose_its_pool():
    ledger = ledger_with("n1")
    tolerates_db = [{"key": "dedicated", "operator": "Equal", "value": "db"}]
    specs = {
        "uid-db": spec(nodeSelector={"tier": "db"}, tolerations=tolerates_db),
        "uid-any": spec(),
    }
    rec = run(ledger, [pending("db"), pending("any")], pod_specs=specs)
    # Without its spec, "db" would have gone onto n1 (room, no taint) like "any".
    assert placed(rec) == {"ns/any": "n1", "ns/db": "new db"}


def test_required_node_affinity_reaches_the_simulation():
    not_general = {"key": "tier", "operator": "NotIn", "values": ["general"]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [not_general]}]
            }
        }
    }
    tolerates = [{"key": "dedicated", "operator": "Exists"}]
    specs = {"uid-p": spec(affinity=affinity, tolerations=tolerates)}
    rec = run(ledger_with("n1"), [pending("p")], pod_specs=specs)
    assert placed(rec) == {"ns/p": "new db"}


def test_a_tainted_or_cordoned_node_takes_no_pending_pod():
    ledger = ledger_with("n1", "n2", "n3")
    taint = kube.Taint(key="maintenance", value="yes", effect="NoSchedule")
    pods = [pending("a", 5000), pending("b", 3000)]
    rec = run(ledger, pods, node_taints={"n1": [taint]}, unschedulable_nodes={"n2"})
    assert placed(rec) == {"ns/a": "n3", "ns/b": "new general"}
    # A PreferNoSchedule taint is a preference: it keeps no pod off.
    soft = replace(taint, effect="PreferNoSchedule")
    rec = run(ledger, pods, node_taints={"n1": [soft], "n3": [taint]}, unschedulable_nodes={"n2"})
    assert placed(rec) == {"ns/a": "n1", "ns/b": "new general"}


def test_a_pod_whose_constraints_the_model_cannot_express_is_left_out_and_said():
    gt = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["8"]}]}
                ]
            }
        }
    }  # fmt: skip
    left_out: list[str] = []
    rec = run(
        ledger_with(),
        [pending("gt"), pending("plain")],
        pod_specs={"uid-gt": spec(affinity=gt)},
        left_out=left_out,
    )
    assert len(left_out) == 1
    assert left_out[0].startswith("pod ns/gt left out: its constraints are not modelled")
    assert "Gt" in left_out[0]
    assert placed(rec) == {"ns/plain": "new general"}
    assert rec.unscheduled_pods == []


def test_priority_classes_come_from_the_pods_that_name_them():
    pods = [
        pending("high-1", priority=100),
        pending("high-2", priority=100),
        # Its class was recreated with another value since it was admitted: no class.
        pending("high-old", priority=50),
        pending("none"),
    ]
    specs = {p.uid: spec(priorityClassName="high") for p in pods[:3]}
    snapshot = snapshot_from_ledger(ledger_with(), pods, [pool("general")], pod_specs=specs)
    assert snapshot.priority_classes == [PriorityClass(name="high", value=100)]
    assert [(p.name, p.priority_class_name, p.priority) for p in snapshot.pods] == [
        ("high-1", "high", 100),
        ("high-2", "high", 100),
        ("high-old", None, 50),
        ("none", None, 0),
    ]
    rec = recommend(snapshot, config=RecommenderConfig(scheduler_name="vm-scheduler"))
    # One pass per priority value, highest first, as with a snapshot that lists its classes.
    assert [r.pass_priority for r in rec.diagnostics.rounds][:1] == [100]
    # Classes given by the caller are used as given.
    given = [PriorityClass(name="high", value=100)]
    snapshot = snapshot_from_ledger(
        ledger_with(), pods[:2], [pool("general")], pod_specs=specs, priority_classes=given
    )
    assert snapshot.priority_classes == given
