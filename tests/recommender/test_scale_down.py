"""Scale-down on hand-computed cases: which nodes could go, where their pods would move, and
why every other node stays. Pool "p": 4 cpu nodes, 20% reserved, so 3.2 cpu usable each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import annotations as ann
from protocol.quantity import cpu_millis
from scheduler_extender.__main__ import main
from scheduler_extender.recommender import RecommenderConfig, SnapshotError, load_snapshot
from scheduler_extender.recommender.scale_down import (
    KeepReason,
    ScaleDown,
    ScaleDownConfig,
    encode_scale_down,
    recommend_scale_down,
)
from tests.extender.conftest import StartExtender
from tests.recommender.test_recommender import node, pod, pool, snap, snapshots


def on(name: str, node_name: str, cpu: str, **extra: Any) -> dict[str, Any]:
    return pod(name, cpu, nodeName=node_name, **extra)


def scale_down(doc: dict[str, Any], **config: Any) -> ScaleDown:
    answer = recommend_scale_down(
        load_snapshot(msgspec.json.encode(doc)),
        config=RecommenderConfig(),
        scale_down=ScaleDownConfig(**config),
    )
    # Deterministic bytes, like the scale-up's answer.
    assert encode_scale_down(answer) == encode_scale_down(
        recommend_scale_down(
            load_snapshot(msgspec.json.encode(doc)),
            config=RecommenderConfig(),
            scale_down=ScaleDownConfig(**config),
        )
    )
    return answer


def removed(answer: ScaleDown) -> dict[str, dict[str, str]]:
    return {r.node: {m.pod: m.to_node for m in r.moves} for r in answer.remove}


def kept(answer: ScaleDown) -> dict[str, KeepReason]:
    return {k.node: k.reason for k in answer.kept}


def three_nodes(*pods: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return snap(
        nodePools=[pool("p", price=0.5)],
        nodes=[node(f"n{i}", "p") for i in (1, 2, 3)],
        pods=list(pods),
        **extra,
    )


def test_the_least_used_node_goes_and_its_pod_moves_first_fit_by_name():
    # n1 and n2 hold 1 cpu each (31%), n3 2.5 (78%). n1 first (name breaks the tie): its pod
    # fits n2 (2.2 free). n2 then takes n1's pod, so it stays this pass. n3's 2.5 cpu pod fits
    # neither n2 (1.2 free now) nor anything else.
    answer = scale_down(three_nodes(on("a", "n1", "1"), on("b", "n2", "1"), on("c", "n3", "2500m")))
    assert removed(answer) == {"n1": {"ns/a": "n2"}}
    assert answer.remove[0].node_pool == "p" and answer.remove[0].price == 0.5
    assert kept(answer) == {
        "n2": KeepReason.RECEIVES_PODS,
        "n3": KeepReason.POD_DOES_NOT_FIT,
    }
    [n3] = [k for k in answer.kept if k.node == "n3"]
    assert n3.message.startswith("pod ns/c (priority 0) fits on no other node with 2500m cpu")


@pytest.mark.parametrize(("at_once", "gone"), [(1, ["n1"]), (2, ["n1", "n3"]), (0, [])])
def test_the_disruption_budget_caps_nodes_removed_at_once(at_once, gone):
    # Four nodes with 0.5 cpu each: all but n2 (which takes their pods) could go.
    doc = snap(
        nodePools=[pool("p")],
        nodes=[node(f"n{i}", "p") for i in (1, 2, 3, 4)],
        pods=[on(x, f"n{i}", "500m") for i, x in zip((1, 2, 3, 4), "abcd", strict=True)],
    )
    answer = scale_down(doc, max_nodes_at_once=at_once)
    assert [r.node for r in answer.remove] == gone
    # With nothing removed n2 takes no pods, so it waits for the budget too.
    could = ("n1", "n3", "n4") if gone else ("n1", "n2", "n3", "n4")
    budget = {n for n in could if n not in gone}
    assert {n for n, r in kept(answer).items() if r is KeepReason.DISRUPTION_BUDGET} == budget


def vm(name: str, node_name: str) -> dict[str, Any]:
    # Permitted 1 vCPU now, top size 5: 4 vCPUs of room to grow.
    return on(
        name,
        node_name,
        "1",
        schedulerName="vm-scheduler",
        labels={ann.VM_LABEL: "true"},
        annotations={ann.MIN_VCPUS: "1", ann.MAX_VCPUS: "5", ann.PERMITTED_VCPUS: "1"},
    )


@pytest.mark.parametrize(
    ("headroom", "gone"),
    [
        (0.0, {"n1": {"ns/vm": "n2"}}),  # the VM moves at 1 vCPU: n2 has 2.2 free
        (0.25, {"n1": {"ns/vm": "n2"}}),  # 1 + 0.25 x 4 = 2 vCPUs: still fits 2.2
        (0.5, {}),  # 1 + 0.5 x 4 = 3 > 2.2; n2's pod needs 1, n1 keeps 3.2 - 3 = 0.2
    ],
)
def test_vms_move_with_room_to_grow_by_the_headroom(headroom, gone):
    doc = snap(nodePools=[pool("p")], nodes=[node("n1", "p"), node("n2", "p")],
               pods=[vm("vm", "n1"), on("b", "n2", "1")])  # fmt: skip
    answer = scale_down(doc, growth_headroom=headroom)
    assert removed(answer) == gone
    if not gone:
        assert kept(answer) == {
            "n1": KeepReason.POD_DOES_NOT_FIT,
            "n2": KeepReason.POD_DOES_NOT_FIT,
        }


def test_a_static_pod_keeps_its_node():
    static = on("mirror", "n1", "100m", annotations={ann.MIRROR_ANNOTATION: "x"})
    answer = scale_down(three_nodes(static, on("b", "n2", "1"), on("c", "n3", "3")))
    assert kept(answer)["n1"] is KeepReason.STATIC_POD
    # n2's pod moves to n1 (first by name, 3.1 free) and n2 goes.
    assert removed(answer) == {"n2": {"ns/b": "n1"}}


@pytest.mark.parametrize(
    ("budget", "gone", "reasons"),
    [
        ({"minAvailable": 2}, {}, {"n1": KeepReason.PDB, "n2": KeepReason.PDB}),
        ({"maxUnavailable": 1}, {"n1": {"ns/db-0": "n2"}}, {"n2": KeepReason.RECEIVES_PODS}),
    ],
    ids=["none-allowed", "one-allowed"],
)
def test_pod_disruption_budgets_cap_evictions(budget, gone, reasons):
    db = {"labels": {"app": "db"}}
    pdb = {"namespace": "ns", "name": "db", "selector": {"matchLabels": {"app": "db"}}, **budget}
    doc = three_nodes(
        on("db-0", "n1", "1", **db), on("db-1", "n2", "1", **db), on("x", "n3", "3"),
        podDisruptionBudgets=[pdb],
    )  # fmt: skip
    answer = scale_down(doc, max_nodes_at_once=2)
    assert removed(answer) == gone
    assert {n: r for n, r in kept(answer).items() if n != "n3"} == reasons
    assert kept(answer)["n3"] is KeepReason.POD_DOES_NOT_FIT


def test_a_budget_needs_exactly_one_of_its_bounds():
    pdb = {"namespace": "ns", "name": "db", "selector": {}}
    with pytest.raises(SnapshotError) as e:
        scale_down(three_nodes(podDisruptionBudgets=[pdb]))
    assert [x.path for x in e.value.errors] == ["$.podDisruptionBudgets[0]"]


def test_higher_priority_pods_are_placed_first():
    # n2 (0.5 cpu used, 2.7 free) is judged first and its pod fits nowhere (n1 has 0.2 free).
    # n1: "high" (2 cpu) goes to n2 first, then "low" (1 cpu) no longer fits: the reason
    # names the lower-priority pod.
    doc = snap(
        nodePools=[pool("p")],
        nodes=[node("n1", "p"), node("n2", "p")],
        pods=[on("low", "n1", "1", priority=0), on("high", "n1", "2", priority=100),
              on("b", "n2", "500m")],
    )  # fmt: skip
    answer = scale_down(doc)
    assert removed(answer) == {}
    [n1] = [k for k in answer.kept if k.node == "n1"]
    assert n1.message.startswith("pod ns/low (priority 0) fits on no other node")


def test_cordoned_and_poolless_nodes():
    # n0 is in no pool: never removed, but a node like any other for the pods that move. n2 is
    # cordoned and empty: it goes first (utilisation 0) and takes no pods. Then n1 (1 cpu):
    # its pod goes to n0, first by name of the nodes left that take pods.
    doc = snap(
        nodePools=[pool("p")],
        nodes=[
            {"name": "n0", "allocatable": {"cpu": "4", "memory": "16Gi"}},
            node("n1", "p"),
            node("n2", "p", unschedulable=True),
            node("n3", "p"),
        ],
        pods=[on("a", "n1", "1"), on("c", "n3", "2")],
    )
    answer = scale_down(doc, max_nodes_at_once=2)
    assert removed(answer) == {"n2": {}, "n1": {"ns/a": "n0"}}
    assert kept(answer) == {"n0": KeepReason.NOT_IN_POOL, "n3": KeepReason.DISRUPTION_BUDGET}


def first_case() -> dict[str, Any]:
    return three_nodes(on("a", "n1", "1"), on("b", "n2", "1"), on("c", "n3", "2500m"))


def test_the_cli_prints_the_scale_down_with_the_configs_settings(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    path = tmp_path / "snapshot.json"
    path.write_bytes(msgspec.json.encode(first_case()))
    config = tmp_path / "config.yaml"
    config.write_text("recommender:\n  scale_down: {max_nodes_at_once: 0}\n")
    assert main(["recommend", str(path), "--scale-down"]) == 0
    assert capsysbinary.readouterr().out == encode_scale_down(scale_down(first_case())) + b"\n"
    assert main(["recommend", str(path), "--scale-down", "--config", str(config)]) == 0
    answer = msgspec.json.decode(capsysbinary.readouterr().out)
    assert answer["remove"] == []
    assert {k["reason"] for k in answer["kept"]} == {"DisruptionBudget", "PodFitsNowhereElse"}


async def test_the_endpoint_answers_in_the_worker_and_refuses_bad_snapshots(
    start_extender: StartExtender,
) -> None:
    running = await start_extender()
    response = await running.verbs.post("/v1/scale-down", json=first_case())
    assert response.status == 200
    assert await response.read() == encode_scale_down(scale_down(first_case()))
    bad = {**first_case(), "podDisruptionBudgets": [{"namespace": "n", "name": "x",
                                                     "selector": {}}]}  # fmt: skip
    response = await running.verbs.post("/v1/scale-down", json=bad)
    assert response.status == 400
    assert [e["path"] for e in (await response.json())["errors"]] == ["$.podDisruptionBudgets[0]"]
    # No live mode: the ledger lacks the placed pods' VM bounds, constraints and labels.
    response = await running.verbs.post("/v1/scale-down")
    assert response.status == 400
    assert (await response.json())["reason"] == "SnapshotRequired"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=snapshots(), at_once=st.integers(0, 3))
def test_every_node_gets_one_verdict_and_moves_fit_their_destinations(doc, at_once):
    answer = scale_down(doc, max_nodes_at_once=at_once)
    names = [n["name"] for n in doc["nodes"]]
    verdicts = [r.node for r in answer.remove] + [k.node for k in answer.kept]
    assert sorted(verdicts) == sorted(names)
    assert len(answer.remove) <= at_once
    gone = {r.node for r in answer.remove}
    # Each destination holds its own pods plus the moved ones within its usable cpu (80%).
    load = {n: 0 for n in names}
    for p in doc["pods"]:
        if p.get("nodeName"):
            load[p["nodeName"]] += cpu_millis(p["requests"]["cpu"])
    sizes = {f"ns/{p['name']}": cpu_millis(p["requests"]["cpu"]) for p in doc["pods"]}
    for r in answer.remove:
        for m in r.moves:
            assert m.to_node not in gone
            load[m.to_node] += sizes[m.pod]
            load[r.node] -= sizes[m.pod]
    usable = {n["name"]: cpu_millis(n["allocatable"]["cpu"]) * 4 // 5 for n in doc["nodes"]}
    receiving = {m.to_node for r in answer.remove for m in r.moves}
    for n in receiving:
        assert load[n] <= usable[n]
