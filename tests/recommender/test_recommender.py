"""The scale-up recommender: scenarios, scorers, bad snapshots and determinism."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import annotations as ann
from scheduler_extender.core.ledger import Ledger
from scheduler_extender.core.podinfo import Demand, PodInfo
from scheduler_extender.recommender import (
    API_VERSION,
    KIND,
    POOL_LABEL,
    ZONE_LABEL,
    CandidateOutcome,
    DiagnosticsLevel,
    NodePool,
    Recommendation,
    RecommenderConfig,
    Scorer,
    SnapshotError,
    UnscheduledReason,
    encode_recommendation,
    load_snapshot,
    recommend,
    snapshot_from_ledger,
)

ROOT = Path(__file__).resolve().parents[2]
# The full trace: several tests read the rounds' candidates.
CONFIG = RecommenderConfig(diagnostics=DiagnosticsLevel.FULL)


def pool(name: str, cpu: str = "4", memory: str = "16Gi", **extra: Any) -> dict[str, Any]:
    template = {"instanceType": f"{name}-type", "allocatable": {"cpu": cpu, "memory": memory}}
    template.update(extra.pop("template", {}))
    return {"name": name, "zones": ["a", "b"], "template": template, "maxCount": 10, **extra}


def pod(name: str, cpu: str = "1", memory: str = "1Gi", **extra: Any) -> dict[str, Any]:
    return {
        "namespace": "ns",
        "name": name,
        "uid": f"uid-{name}",
        "requests": {"cpu": cpu, "memory": memory},
        **extra,
    }


def node(
    name: str, pool_name: str, zone: str = "a", cpu: str = "4", **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "labels": {POOL_LABEL: pool_name, ZONE_LABEL: zone},
        "allocatable": {"cpu": cpu, "memory": "16Gi"},
        **extra,
    }


def snap(**parts: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, **parts}


def run(doc: dict[str, Any], config: RecommenderConfig = CONFIG) -> Recommendation:
    return recommend(load_snapshot(msgspec.json.encode(doc)), config=config)


def scaled(rec: Recommendation) -> dict[str, int]:
    return {f"{s.node_pool}/{s.zone}": s.increment_by for s in rec.scale_up}


def reasons(rec: Recommendation) -> dict[str, UnscheduledReason]:
    return {u.pod: u.reason for u in rec.diagnostics.unscheduled}


# -- scenarios ---------------------------------------------------------------------------------


def test_pods_that_fit_existing_nodes_need_no_scale_up():
    rec = run(
        snap(
            nodePools=[pool("p")],
            nodes=[node("n1", "p")],
            pods=[pod("running", "1", nodeName="n1"), pod("new", "2")],
        )
    )
    assert rec.scale_up == []
    assert rec.unscheduled_pods == []
    assert [(e.pod, e.node) for e in rec.diagnostics.placed_on_existing] == [("ns/new", "n1")]
    assert rec.diagnostics.rounds == []


def test_the_system_reserve_is_honoured_like_the_extender():
    # 4 cpu allocatable, 20% reserved: 3.2 usable; 2.5 + 1 does not fit.
    rec = run(
        snap(
            nodePools=[pool("p")],
            nodes=[node("n1", "p")],
            pods=[pod("running", "2500m", nodeName="n1"), pod("new", "1")],
        )
    )
    assert scaled(rec) == {"p/a": 1}


def test_vm_pods_reserve_their_initial_demand():
    vm = pod(
        "vm",
        "500m",
        schedulerName="vm-scheduler",
        labels={ann.VM_LABEL: "true"},
        annotations={ann.MIN_VCPUS: "3", ann.MAX_VCPUS: "8"},
    )
    rec = run(
        snap(
            nodePools=[pool("p", cpu="8")],
            nodes=[node("n1", "p")],
            pods=[pod("running", "1", nodeName="n1"), vm],
        )
    )
    # 3.2 usable - 1 held leaves 2.2 < 3 vCPUs: a new node.
    assert scaled(rec) == {"p/a": 1}
    assert rec.diagnostics.new_nodes == {"p-a-new-1": ["ns/vm"]}


def test_invalid_vm_annotations_leave_the_pod_unscheduled_with_the_reason():
    vm = pod("vm", schedulerName="vm-scheduler", labels={ann.VM_LABEL: "true"})
    rec = run(snap(nodePools=[pool("p")], pods=[vm]))
    assert rec.scale_up == []
    assert reasons(rec) == {"ns/vm": UnscheduledReason.INVALID_VM_SPEC}


def test_high_priority_is_placed_first_when_room_is_scarce():
    doc = snap(
        priorityClasses=[{"name": "high", "value": 100}, {"name": "low", "value": 1}],
        nodePools=[pool("p", maxCount=1)],
        pods=[
            pod("low", "3", priorityClassName="low", creationTimestamp="2024-01-01T00:00:00Z"),
            pod("high", "3", priorityClassName="high", creationTimestamp="2024-01-02T00:00:00Z"),
        ],
    )
    rec = run(doc)
    assert rec.diagnostics.new_nodes == {"p-a-new-1": ["ns/high"]}
    assert rec.unscheduled_pods == ["ns/low"]
    assert reasons(rec) == {"ns/low": UnscheduledReason.POOL_AT_MAX}
    assert rec.diagnostics.rounds[0].pass_priority == 100


def test_equal_priority_goes_oldest_first_then_by_name():
    rec = run(
        snap(
            nodePools=[pool("p", maxCount=1)],
            pods=[
                pod("b", "2", creationTimestamp="2024-01-01T00:00:00Z"),
                pod("c", "2"),  # no timestamp: after every dated pod
                pod("a", "2", creationTimestamp="2024-01-01T00:00:00Z"),
            ],
        )
    )
    assert rec.diagnostics.new_nodes == {"p-a-new-1": ["ns/a"]}
    assert rec.unscheduled_pods == ["ns/b", "ns/c"]


def test_later_passes_fill_the_room_new_nodes_left():
    rec = run(
        snap(
            priorityClasses=[{"name": "high", "value": 100}, {"name": "low", "value": 1}],
            nodePools=[pool("p")],
            pods=[
                pod("high", "2", priorityClassName="high"),
                pod("low", "1", priorityClassName="low"),
            ],
        )
    )
    assert rec.diagnostics.new_nodes == {"p-a-new-1": ["ns/high", "ns/low"]}
    assert scaled(rec) == {"p/a": 1}


def affinity(key: str, operator: str, *values: str) -> dict[str, Any]:
    expr: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expr["values"] = list(values)
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expr]}]
            }
        }
    }


@pytest.mark.parametrize(
    ("affinity_doc", "expected"),
    [
        (affinity(ZONE_LABEL, "In", "b"), {"p/b": 1}),
        (affinity(ZONE_LABEL, "NotIn", "a"), {"p/b": 1}),
        (affinity(POOL_LABEL, "In", "q"), {"q/a": 1}),
        (affinity("gpu", "Exists"), {"q/a": 1}),
        (affinity("gpu", "DoesNotExist"), {"p/a": 1}),
    ],
    ids=["zone-in", "zone-notin", "pool-in", "label-exists", "label-does-not-exist"],
)
def test_required_node_affinity(affinity_doc, expected):
    rec = run(
        snap(
            nodePools=[pool("p"), pool("q", template={"labels": {"gpu": "yes"}}, priority=-1)],
            pods=[pod("x", affinity=affinity_doc)],
        )
    )
    assert scaled(rec) == expected


def test_zone_affinity_to_a_zone_no_pool_has():
    rec = run(
        snap(nodePools=[pool("p")], pods=[pod("x", affinity=affinity(ZONE_LABEL, "In", "z"))])
    )
    assert rec.scale_up == []
    [u] = rec.diagnostics.unscheduled
    assert u.reason is UnscheduledReason.NO_MATCHING_POOL
    assert u.pools == {"p": "required node affinity matches no term"}


def test_taints_need_tolerations_and_selectors_choose_pools():
    tainted = pool(
        "gpu",
        priority=10,
        template={
            "labels": {"tier": "gpu"},
            "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
        },
    )
    toleration = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    rec = run(
        snap(
            nodePools=[pool("general"), tainted],
            pods=[
                pod("plain", "1"),
                pod("gpu-job", "1", nodeSelector={"tier": "gpu"}, tolerations=toleration),
                pod("lost", "1", nodeSelector={"tier": "tpu"}),
            ],
        )
    )
    assert rec.diagnostics.new_nodes == {
        "gpu-a-new-1": ["ns/gpu-job"],
        "general-a-new-1": ["ns/plain"],
    }
    [u] = rec.diagnostics.unscheduled
    assert (u.pod, u.reason) == ("ns/lost", UnscheduledReason.NO_MATCHING_POOL)
    assert u.pools == {
        "general": "nodeSelector tier=tpu does not match",
        "gpu": "nodeSelector tier=tpu does not match",
    }


def test_untolerated_taint_is_the_reason():
    tainted = pool("gpu", template={"taints": [{"key": "k", "value": "v", "effect": "NoExecute"}]})
    rec = run(snap(nodePools=[tainted], pods=[pod("x")]))
    assert rec.diagnostics.unscheduled[0].pools == {"gpu": "taint k=v:NoExecute is not tolerated"}


def test_prefer_no_schedule_taints_do_not_block():
    soft = pool("p", template={"taints": [{"key": "k", "effect": "PreferNoSchedule"}]})
    assert scaled(run(snap(nodePools=[soft], pods=[pod("x")]))) == {"p/a": 1}


def test_too_big_for_every_template():
    rec = run(snap(nodePools=[pool("p")], pods=[pod("huge", "16")]))
    [u] = rec.diagnostics.unscheduled
    assert u.reason is UnscheduledReason.TOO_BIG
    assert "can never give more than 3200m" in u.pools["p"]


def test_pool_max_count_counts_existing_nodes():
    rec = run(
        snap(
            nodePools=[pool("p", maxCount=2, currentCount=1)],
            pods=[pod(f"x{i}", "3") for i in range(3)],
        )
    )
    assert scaled(rec) == {"p/a": 1}
    assert rec.unscheduled_pods == ["ns/x1", "ns/x2"]
    assert set(reasons(rec).values()) == {UnscheduledReason.POOL_AT_MAX}
    last = rec.diagnostics.rounds[-1].candidates[0]
    assert last.outcome is CandidateOutcome.AT_MAX


def test_pool_vcpu_limit():
    rec = run(
        snap(
            nodePools=[pool("p", limits={"cpu": "8"}, currentCount=1)],
            pods=[pod(f"x{i}", "3") for i in range(3)],
        )
    )
    # 1 existing + 1 new = 8 cpu of capacity: a third node would pass the limit.
    assert scaled(rec) == {"p/a": 1}
    assert set(reasons(rec).values()) == {UnscheduledReason.POOL_LIMIT}
    assert "over its limit of 8" in rec.diagnostics.unscheduled[0].pools["p"]


# -- scorers -----------------------------------------------------------------------------------


def two_pools(**overrides: dict[str, Any]) -> dict[str, Any]:
    small = pool("small", cpu="2500m", memory="4Gi", price=1.0, **overrides.get("small", {}))
    large = pool("large", cpu="10", memory="16Gi", price=3.0, **overrides.get("large", {}))
    return snap(nodePools=[small, large], pods=[pod(f"x{i}", "1", "1Gi") for i in range(3)])


@pytest.mark.parametrize(
    ("scorer", "overrides", "first_winner"),
    [
        (Scorer.PRIORITY, {"small": {"priority": 5}}, "small/a"),
        (Scorer.PRIORITY, {"large": {"priority": 5}}, "large/a"),
        # small: 2 cpu + 2Gi for 1.0; large: 3 cpu + 3Gi for 3.0.
        (Scorer.LEAST_COST, {}, "small/a"),
        # small: waste 0.2 + 0.5 = 0.7; large: 0.7 + 0.8125.
        (Scorer.LEAST_WASTE, {}, "small/a"),
        (Scorer.MOST_PODS, {}, "large/a"),
    ],
    ids=["priority-small", "priority-large", "least-cost", "least-waste", "most-pods"],
)
def test_each_scorer_alone(scorer, overrides, first_winner):
    rec = run(two_pools(**overrides), RecommenderConfig(scorers=(scorer,)))
    assert rec.diagnostics.rounds[0].winner == first_winner


def test_ties_fall_back_to_pool_then_zone_name():
    rec = run(two_pools(), RecommenderConfig(scorers=(), diagnostics=DiagnosticsLevel.FULL))
    assert rec.diagnostics.rounds[0].winner == "large/a"
    lost = {
        c.zone: c.reason for c in rec.diagnostics.rounds[0].candidates if c.node_pool == "large"
    }
    assert lost["b"] == "large/a ranks higher on zone name"


def test_least_cost_needs_every_price():
    doc = two_pools()
    del doc["nodePools"][1]["price"]
    with pytest.raises(SnapshotError) as e:
        run(doc, RecommenderConfig(scorers=(Scorer.LEAST_COST,)))
    assert [x.path for x in e.value.errors] == ["$.nodePools[1].price"]
    assert e.value.status == 400
    run(doc)  # fine without the least-cost link


def test_greedy_suboptimal_is_replaced_by_the_cheaper_plan():
    # least-cost per round: small (2 cpu for 1.9) beats large (3 cpu for 3.0), twice, so greedy
    # buys 2 small nodes (3.8) where one large node (3.0) holds all three pods.
    doc = snap(
        nodePools=[
            pool("small", cpu="2500m", memory="8Gi", price=1.9),
            pool("large", cpu="5", memory="16Gi", price=3.0),
        ],
        pods=[pod(f"x{i}", "1", "1Gi") for i in range(3)],
    )
    rec = run(doc, RecommenderConfig(scorers=(Scorer.LEAST_COST,)))
    assert scaled(rec) == {"large/a": 1}
    assert rec.diagnostics.new_nodes == {"large-a-new-1": ["ns/x0", "ns/x1", "ns/x2"]}
    cost = rec.diagnostics.cost
    assert cost is not None
    assert (cost.greedy_price, cost.price, cost.is_optimal) == (3.8, 3.0, True)
    assert cost.greedy_extra_cost == pytest.approx(0.8)
    assert [(g.node_pool, g.zone, g.increment_by) for g in cost.greedy_scale_up] == [
        ("small", "a", 2)
    ]


# -- output and determinism --------------------------------------------------------------------


def test_encoding_is_deterministic_and_timing_is_opt_in():
    doc = two_pools()
    a = encode_recommendation(run(doc))
    b = encode_recommendation(run(copy.deepcopy(doc)))
    assert a == b
    assert b"runTimeMillis" not in a
    timed = msgspec.json.decode(encode_recommendation(run(doc), run_time_millis=7))
    assert list(timed)[:3] == ["scaleUp", "unscheduledPods", "runTimeMillis"]
    assert timed["runTimeMillis"] == 7


def test_example_snapshot_loads_and_recommends():
    data = (ROOT / "examples/snapshots/basic.yaml").read_bytes()
    rec = recommend(load_snapshot(data, fmt="yaml"), config=CONFIG)
    assert scaled(rec) == {"large/zone-b": 1}
    assert rec.unscheduled_pods == []


zone_names = st.sampled_from(["a", "b", "c"])
quantities = st.sampled_from(["100m", "500m", "1", "2", "3500m", "8"])


@st.composite
def snapshots(draw):
    pools = []
    for i in range(draw(st.integers(0, 3))):
        pools.append(
            pool(
                f"p{i}",
                cpu=draw(st.sampled_from(["2", "4", "8"])),
                maxCount=draw(st.integers(0, 4)),
                priority=draw(st.integers(0, 2)),
                price=draw(st.sampled_from([0.5, 1.0, 2.0])),
                zones=draw(st.lists(zone_names, min_size=1, max_size=3, unique=True)),
            )
        )
    nodes = []
    for i in range(draw(st.integers(0, 4))):
        if not pools:
            break
        p = draw(st.sampled_from(pools))
        nodes.append(
            node(f"n{i}", p["name"], zone=p["zones"][0], cpu=draw(st.sampled_from(["2", "4"])))
        )
    pods = []
    for i in range(draw(st.integers(0, 12))):
        extra: dict[str, Any] = {"priority": draw(st.integers(0, 3))}
        if nodes and draw(st.booleans()):
            extra["nodeName"] = draw(st.sampled_from(nodes))["name"]
        if draw(st.integers(0, 3)) == 0:
            extra["affinity"] = affinity(ZONE_LABEL, "In", draw(zone_names))
        if draw(st.booleans()):
            extra["creationTimestamp"] = f"2024-01-0{draw(st.integers(1, 9))}T00:00:00Z"
        pods.append(pod(f"x{i}", draw(quantities), draw(st.sampled_from(["64Mi", "1Gi"])), **extra))
    classes = [{"name": "c", "value": 1}] if draw(st.booleans()) else []
    return snap(nodePools=pools, nodes=nodes, pods=pods, priorityClasses=classes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=snapshots(), chain=st.permutations(list(Scorer)))
def test_same_snapshot_same_bytes_and_input_unchanged(doc, chain):
    snapshot = load_snapshot(msgspec.json.encode(doc))
    before = msgspec.json.encode(snapshot.snapshot)
    config = RecommenderConfig(scorers=tuple(chain))
    first = encode_recommendation(recommend(snapshot, config=config))
    second = encode_recommendation(recommend(snapshot, config=config))
    assert first == second
    assert msgspec.json.encode(snapshot.snapshot) == before
    # Whatever greedy did, every pending pod is placed somewhere or explained.
    rec = msgspec.json.decode(first)
    pending = {f"ns/{p['name']}" for p in doc["pods"] if "nodeName" not in p}
    placed = {e["pod"] for e in rec["diagnostics"].get("placedOnExisting", [])}
    on_new = {k for pods in rec["diagnostics"].get("newNodes", {}).values() for k in pods}
    assert placed | on_new | set(rec["unscheduledPods"]) == pending
    assert not (placed & on_new) and not (on_new & set(rec["unscheduledPods"]))


# -- bad snapshots -----------------------------------------------------------------------------


def good() -> dict[str, Any]:
    return snap(
        priorityClasses=[{"name": "high", "value": 10}],
        nodePools=[pool("p")],
        nodes=[node("n1", "p")],
        pods=[pod("x", nodeName="n1"), pod("y", priorityClassName="high")],
    )


def _set(path: list[Any], value: Any):
    def mutate(doc: dict[str, Any]) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


BAD = [
    ("version", _set(["apiVersion"], "v2"), "$.apiVersion"),
    ("unknown-field", _set(["nodePools", 0, "maxNodes"], 3), "$.nodePools[0]"),
    ("negative-count", _set(["nodePools", 0, "maxCount"], -1), "$.nodePools[0].maxCount"),
    ("bad-quantity", _set(["pods", 1, "requests", "cpu"], "lots"), "$.pods[1].requests.cpu"),
    ("negative-quantity", _set(["pods", 1, "requests", "memory"], "-1Gi"),
     "$.pods[1].requests.memory"),
    ("unknown-pool", _set(["nodes", 0, "labels", POOL_LABEL], "nope"),
     f'$.nodes[0].labels["{POOL_LABEL}"]'),
    ("zone-not-in-pool", _set(["nodes", 0, "labels", ZONE_LABEL], "z"),
     f'$.nodes[0].labels["{ZONE_LABEL}"]'),
    ("unknown-node", _set(["pods", 0, "nodeName"], "n9"), "$.pods[0].nodeName"),
    ("unknown-class", _set(["pods", 1, "priorityClassName"], "mid"), "$.pods[1].priorityClassName"),
    ("class-mismatch", _set(["pods", 1, "priority"], 3), "$.pods[1].priority"),
    ("duplicate-pool", lambda d: d["nodePools"].append(pool("p")), "$.nodePools[1].name"),
    ("duplicate-node", lambda d: d["nodes"].append(node("n1", "p")), "$.nodes[1].name"),
    ("duplicate-uid", _set(["pods", 1, "uid"], "uid-x"), "$.pods[1].uid"),
    ("duplicate-zone", _set(["nodePools", 0, "zones"], ["a", "a"]), "$.nodePools[0].zones[1]"),
    ("no-zones", _set(["nodePools", 0, "zones"], []), "$.nodePools[0].zones"),
    ("in-without-values", _set(["pods", 1, "affinity"], affinity("k", "In")),
     "$.pods[1].affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
     ".nodeSelectorTerms[0].matchExpressions[0].values"),
    ("unsupported-operator", _set(["pods", 1, "affinity"], affinity("k", "Gt", "1")),
     "$.pods[1].affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
     ".nodeSelectorTerms[0].matchExpressions[0].operator"),
    ("naive-timestamp", _set(["pods", 1, "creationTimestamp"], "2024-01-01T00:00:00"),
     "$.pods[1].creationTimestamp"),
    ("template-sets-zone", _set(["nodePools", 0, "template", "labels"], {ZONE_LABEL: "a"}),
     f'$.nodePools[0].template.labels["{ZONE_LABEL}"]'),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "path"), [(m, p) for _, m, p in BAD], ids=[i for i, _, _ in BAD]
)
def test_bad_snapshots_name_the_path(mutate, path):
    doc = good()
    load_snapshot(msgspec.json.encode(doc))
    mutate(doc)
    with pytest.raises(SnapshotError) as e:
        load_snapshot(msgspec.json.encode(doc))
    assert path in [x.path for x in e.value.errors], str(e.value)
    assert f"at `{path}`" in str(e.value)


def test_every_cross_field_error_is_reported_at_once():
    doc = good()
    doc["pods"][0]["nodeName"] = "n9"
    doc["pods"][1]["priorityClassName"] = "mid"
    with pytest.raises(SnapshotError) as e:
        load_snapshot(msgspec.json.encode(doc))
    assert [x.path for x in e.value.errors] == ["$.pods[0].nodeName", "$.pods[1].priorityClassName"]


def test_a_repeated_mistake_is_reported_wherever_it_is():
    # Compiling looks sizes and tolerations up among those already met; a bad one must still
    # be reported at every object that has it, not only at the first.
    bad_toleration = [{"key": "k", "operator": "Exists", "value": "v"}]
    doc = good()
    doc["nodes"].append(node("n2", "p", cpu="lots"))
    doc["nodes"].append(node("n3", "p", cpu="lots"))
    doc["pods"] += [
        pod("z1", cpu="lots", tolerations=bad_toleration),
        pod("z2", cpu="lots", nodeName="n1", tolerations=bad_toleration),
    ]
    with pytest.raises(SnapshotError) as e:
        load_snapshot(msgspec.json.encode(doc))
    assert [x.path for x in e.value.errors] == [
        "$.nodes[1].allocatable.cpu",
        "$.nodes[2].allocatable.cpu",
        "$.pods[2].requests.cpu",
        "$.pods[2].tolerations[0].value",
        "$.pods[3].requests.cpu",
        "$.pods[3].tolerations[0].value",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"{", "malformed JSON"),
        (b"[]", "Expected `object`"),
    ],
    ids=["truncated", "not-an-object"],
)
def test_malformed_json(text, message):
    with pytest.raises(SnapshotError, match=message):
        load_snapshot(text)


def test_yaml_rejects_duplicate_keys_and_reads_numbers_as_quantities():
    text = f"apiVersion: {API_VERSION}\nkind: {KIND}\nkind: {KIND}\n".encode()
    with pytest.raises(SnapshotError, match="duplicate key 'kind'"):
        load_snapshot(text, fmt="yaml")
    text = (
        f"apiVersion: {API_VERSION}\nkind: {KIND}\n"
        "nodePools: [{name: p, zones: [a], maxCount: 1,"
        " template: {instanceType: t, allocatable: {cpu: 2, memory: 4Gi}}}]\n"
        "pods: [{namespace: ns, name: x, uid: u, requests: {cpu: 0.5},"
        " creationTimestamp: 2024-01-01T00:00:00Z}]\n"
    ).encode()
    assert scaled(recommend(load_snapshot(text, fmt="yaml"), config=CONFIG)) == {"p/a": 1}


# -- live mode ---------------------------------------------------------------------------------


def pod_info(name: str, cpu_millis: int, *, node: str | None = None) -> PodInfo:
    return PodInfo(
        uid=f"uid-{name}",
        namespace="ns",
        name=name,
        node_name=node,
        scheduler_name="default-scheduler",
        requests=Demand(cpu_millis, 2**30),
        priority=0,
        is_ours=False,
        is_vm=False,
        is_static=False,
        is_terminated=False,
        created="2024-01-01T00:00:00+00:00",
    )


def test_snapshot_from_ledger_reads_but_never_changes_the_live_ledger():
    ledger = Ledger()
    ledger.upsert_node(
        "n1", allocatable=Demand(4000, 16 * 2**30), labels={POOL_LABEL: "p", ZONE_LABEL: "a"}
    )
    ledger.observe_pod(pod_info("running", 2000, node="n1"), at=1.0)
    generation = ledger.generation
    pools = [msgspec.convert(pool("p"), NodePool)]
    snapshot = snapshot_from_ledger(ledger, [pod_info("small", 1000), pod_info("big", 2000)], pools)
    rec = recommend(snapshot, config=CONFIG)
    assert [(e.pod, e.node) for e in rec.diagnostics.placed_on_existing] == [("ns/small", "n1")]
    assert scaled(rec) == {"p/a": 1}
    assert ledger.generation == generation
    assert set(ledger.nodes) == {"n1"}
    assert set(ledger.pods) == {"uid-running"}
    ledger.check_invariants()


def hostname_affinity(operator: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": operator}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def test_a_new_node_has_a_hostname_label_like_every_node():
    """A pool's template is matched as its nodes will be: with a hostname label. A pod that
    requires the label gets a new node; one that requires its absence can run on none."""
    rec = run(
        snap(
            nodePools=[pool("p", price=1.0, zones=["a"])],
            pods=[
                pod("wants-hostname", affinity=hostname_affinity("Exists")),
                pod("no-hostname", affinity=hostname_affinity("DoesNotExist")),
            ],
        )
    )
    assert rec.diagnostics.new_nodes == {"p-a-new-1": ["ns/wants-hostname"]}
    assert rec.unscheduled_pods == ["ns/no-hostname"]
    assert reasons(rec) == {"ns/no-hostname": "NoMatchingPool"}
