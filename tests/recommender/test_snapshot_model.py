"""Compiling a snapshot: the model's pending order and shapes, and the checks on placed pods
(which compiling takes a shorter way through)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
import pytest

from scheduler_extender.recommender import SnapshotError, load_snapshot
from scheduler_extender.recommender.model import compile_snapshot
from scheduler_extender.recommender.snapshot import decode_snapshot

from .test_recommender import affinity, good, node, pod, pool, snap


def test_pending_order_is_priority_then_oldest_then_name_and_shapes_count_from_zero():
    stamps = [None, "2024-01-01T00:00:00Z", "2024-01-01T01:00:00+01:00", "2024-01-02T00:00:00Z"]
    pods: list[dict[str, Any]] = []
    for i in range(24):
        extra: dict[str, Any] = {"priority": i % 3}
        if stamps[i % 4] is not None:
            extra["creationTimestamp"] = stamps[i % 4]
        if i % 5 == 0:
            extra["nodeSelector"] = {"k": "v"}
        # Names out of order, so that a tie on time falls to the name.
        pods.append(pod(f"p{(i * 7) % 24:02d}", "1" if i % 2 else "2", **extra))
    placed = pod("placed", nodeName="n1", priority=9)
    doc = snap(nodePools=[pool("p")], nodes=[node("n1", "p")], pods=[*pods, placed])
    model = compile_snapshot(decode_snapshot(msgspec.json.encode(doc)), scheduler_name="s")

    def reference(p: dict[str, Any]) -> tuple[int, bool, datetime, str]:
        created = p.get("creationTimestamp")
        when = datetime.fromisoformat(created or "1970-01-01T00:00:00+00:00")
        return (-p["priority"], created is None, when, f"ns/{p['name']}")

    expected = [f"ns/{p['name']}" for p in sorted(pods, key=reference)]
    assert [p.key for p in model.pending] == expected
    assert [p.order for p in model.pending] == list(range(len(pods)))
    assert [p.priority for p in model.pending] == [
        -reference(p)[0] for p in sorted(pods, key=reference)
    ]
    shapes: dict[tuple[int, Any], int] = {}
    for p in model.pending:
        assert p.shape == shapes.setdefault((p.cls, p.demand), len(shapes))
    assert model.shapes == len(shapes) == 4


def test_a_placed_pods_mistakes_are_all_reported_at_its_paths():
    # A placed pod's constraints are checked but not compiled, and its requests only summed.
    doc = good()
    doc["pods"].append(
        pod(
            "x",  # a second ns/x
            "1",
            "lots",
            nodeName="n9",
            priorityClassName="mid",
            affinity=affinity("k", "In"),
            tolerations=[{"key": "k", "operator": "Exists", "value": "v"}],
        )
    )
    doc["pods"].append(pod("z", "3", "1Gi", nodeName="n1", tolerations=[{"value": "v"}]))
    with pytest.raises(SnapshotError) as e:
        load_snapshot(msgspec.json.encode(doc))
    terms = (
        "$.pods[2].affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0]"
    )
    assert [(x.path, x.message) for x in e.value.errors] == [
        ("$.pods[2].uid", "duplicate pod uid 'uid-x'"),
        ("$.pods[2].name", "duplicate pod 'ns/x'"),
        ("$.pods[2].requests.memory", "invalid quantity 'lots'"),
        ("$.pods[2].priorityClassName", "unknown priority class 'mid'"),
        (f"{terms}.matchExpressions[0].values", "operator In needs at least one value"),
        ("$.pods[2].tolerations[0].value", "must be empty when operator is Exists"),
        ("$.pods[2].nodeName", "unknown node 'n9'"),
        ("$.pods[3].tolerations[0].key", "an empty key needs operator Exists"),
    ]


def test_a_repeated_namespace_and_name_is_reported_whatever_the_uids_say():
    # Compiling builds keys for every pod only when the names alone cannot rule a repeat
    # out: each of these goes that way, and must say what building them all said.
    def errors(*pods: dict[str, Any]) -> list[tuple[str, str]]:
        doc = snap(nodePools=[pool("p")], nodes=[node("n1", "p")], pods=list(pods))
        try:
            load_snapshot(msgspec.json.encode(doc))
        except SnapshotError as e:
            return [(x.path, x.message) for x in e.errors]
        return []

    placed = pod("x", nodeName="n1")
    assert errors(placed, pod("x", uid="other")) == [("$.pods[1].name", "duplicate pod 'ns/x'")]
    # One name in two namespaces: two pods.
    assert errors(placed, pod("x", uid="other", namespace="ns2")) == []
    # "a/b" + "c" and "a" + "b/c": one key, as Kubernetes names never hold a "/" anyway.
    assert errors(pod("c", namespace="a/b", nodeName="n1"), pod("b/c", namespace="a")) == [
        ("$.pods[1].name", "duplicate pod 'a/b/c'")
    ]
    assert errors(placed, pod("y"), pod("z", namespace="ns2")) == []


def test_placed_pods_hold_their_requests_on_their_node():
    doc = good()
    doc["nodes"].append(node("n2", "p"))
    doc["pods"] += [
        pod("a", "250m", "1Gi", nodeName="n2"),
        pod("b", "1500m", "512Mi", nodeName="n2"),
        pod("c", "1", nodeName="n1", tolerations=[{"key": "k", "operator": "Exists"}]),
    ]
    model = load_snapshot(msgspec.json.encode(doc)).model
    assert [(d.cpu_millis, d.memory_bytes) for d in model.held] == [
        (2000, 2 * 2**30),
        (1750, 1536 * 2**20),
    ]
