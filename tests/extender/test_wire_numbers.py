"""No number anyone can send gets a 5xx: past its bound it is a 400 naming the field.

Every numeric path of the permit request and of kube-scheduler's filter, prioritize and preempt
bodies (found from the wire types, ``tests/unit/test_wire_bounds.numbers``) gets each of the
numbers below in an otherwise valid body; every bound at its limit at once is served.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec.inspect as mi

from protocol import bounds, extender, permits
from scheduler_extender.http import verbs
from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import STATIC_TOKEN, StartExtender
from tests.extender.helpers import filter_body, permit_batch, vm_pod
from tests.unit.test_wire_bounds import Path, numbers

# Past what int64 and msgpack carry, and JSON numbers that decode to infinities.
HUGE: list[object] = [-(2**64), 2**64, 2**70, "1e400", "-1e400"]


def hostile(t: mi.Type) -> list[object]:
    """Numbers just past the type's own bounds, and huge ones, all out of its range."""
    assert isinstance(t, (mi.IntType, mi.FloatType))
    lo = t.ge if t.ge is not None else t.gt
    hi = t.le if t.le is not None else t.lt
    assert lo is not None and hi is not None
    step = 1 if isinstance(t, mi.IntType) else abs(hi) or 1.0
    return [lo - step, hi + step, *(v for v in HUGE if isinstance(v, str) or not lo <= v <= hi)]


def full_permit_batch() -> dict[str, Any]:
    batch = permit_batch("node-a", uid="u-1", last_permit=1)
    batch["requests"][0]["load"] = {"load1": 1.0, "cpuBusyFraction": 0.5, "memoryUsedFraction": 0.5}
    batch["requests"][0]["seq"] = 7
    return batch


def pod_with_numbers() -> dict[str, Any]:
    pod = vm_pod("vm-2", uid="u-2")
    pod["metadata"]["generation"] = 1
    pod["spec"]["priority"] = 0
    pod["spec"]["tolerations"] = [{"key": "k", "operator": "Exists", "tolerationSeconds": 5}]
    return pod


def present(doc: Any, path: Path) -> bool:
    for key in path:
        in_list = isinstance(doc, list) and isinstance(key, int) and key < len(doc)
        if in_list or (isinstance(doc, dict) and key in doc):
            doc = doc[key]
        else:
            return False
    return True


def with_number(doc: Any, path: Path, value: Any) -> str:
    """``doc`` as JSON with ``value`` at ``path`` (numbers as JSON text, so 1e400 stays one)."""
    marker = "__NUMBER__"
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = marker
    return json.dumps(doc).replace(json.dumps(marker), str(value))


def paths(root: Any, doc: Any) -> list[tuple[Path, mi.Type]]:
    found = {p: t for p, t in numbers(mi.type_info(root)) if present(doc, p)}
    assert found
    return sorted(found.items(), key=lambda item: str(item[0]))


def dotted(path: Path) -> str:
    return "$." + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")


async def test_numbers_past_their_bounds_are_400s_naming_them(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a"))
    running = await start_extender()
    before = await running.state()
    headers = {"Authorization": f"Bearer {STATIC_TOKEN}"}
    cases: list[tuple[str, str, str]] = []  # (port, path, body)
    batch = full_permit_batch()
    for path, t in paths(permits.ResourceRequestBatch, batch):
        cases += [("permits", "/v1/permits", with_number(batch, path, v)) for v in hostile(t)]
    for verb, root in (("filter", verbs.FilterArgs), ("prioritize", extender.ExtenderArgs)):
        body = filter_body(pod_with_numbers(), ["node-a"])
        for path, t in paths(root, body):
            cases += [("verbs", f"/{verb}", with_number(body, path, v)) for v in hostile(t)]
    preempt = {
        "Pod": pod_with_numbers(),
        "NodeNameToMetaVictims": {"node-a": {"Pods": [], "NumPDBViolations": 0}},
    }
    for path, t in paths(extender.ExtenderPreemptionArgs, preempt):
        cases += [("verbs", "/preempt", with_number(preempt, path, v)) for v in hostile(t)]
    statuses: dict[int, int] = {}
    for port, url, body in cases:
        client = running.permits if port == "permits" else running.verbs
        response = await client.post(url, data=body.encode(), headers=headers)
        text = await response.text()
        statuses[response.status] = statuses.get(response.status, 0) + 1
        assert response.status < 500, (url, body, text)
        if response.status == 400:
            assert "$." in text or "malformed JSON" in text, text
    # Every one out of range: refused, and nothing changed.
    assert set(statuses) == {400}, statuses
    assert await running.state() == before


async def test_every_bound_at_its_limit_is_served(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", max_vcpus=bounds.MAX_VCPUS))
    running = await start_extender()
    headers = {"Authorization": f"Bearer {STATIC_TOKEN}"}
    batch = full_permit_batch()
    request = batch["requests"][0]
    request["requested"] = {"vcpus": bounds.MAX_VCPUS, "memoryBytes": bounds.INT64_MAX}
    request["lastPermit"] = {"vcpus": bounds.MAX_VCPUS, "memoryBytes": bounds.INT64_MAX}
    request["seq"] = bounds.INT64_MAX
    request["load"]["load1"] = bounds.MAX_RATE
    response = await running.permits.post(
        "/v1/permits", data=json.dumps(batch).encode(), headers=headers
    )
    assert response.status == 200, await response.text()
    (permit,) = (await response.json())["permits"]
    assert permit.get("error") is None or permit["error"]["status"] < 500, permit
    pod = pod_with_numbers()
    pod["metadata"]["generation"] = bounds.INT64_MAX
    pod["spec"]["priority"] = bounds.INT32_MAX
    pod["spec"]["tolerations"][0]["tolerationSeconds"] = -(2**63)
    response = await running.verbs.post(
        "/filter", data=json.dumps(filter_body(pod, ["node-a"])).encode()
    )
    assert response.status == 200, await response.text()
