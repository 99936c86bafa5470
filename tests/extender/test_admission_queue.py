"""The admission queue and namespace quotas, over real HTTP with the fake API server.

Filter rejects every node while a pod waits for its namespace's quota (and says so in an
Event); room coming back (a pod deleted, a quota raised) admits the pod and nudges it (an Event
and the ``admitted-at`` annotation); permits are clamped by the quota; ``/v1/queue``, ``/state``
and ``/metrics`` show the queue.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog
from prometheus_client.parser import text_string_to_metric_families

from scheduler_extender.kube.queue_notices import ADMITTED_AT_ANNOTATION
from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import STATIC_TOKEN, Running, StartExtender, make_config, wait_until
from tests.extender.helpers import ask_memory, bind_body, filter_body, permit_batch, vm_pod

AUTH = {"Authorization": f"Bearer {STATIC_TOKEN}"}
GI = 2**30


def quota_section(vcpus: int, **extra: Any) -> dict[str, Any]:
    return {"namespaces": {"vms": {"vcpus": vcpus, "memory_bytes": 64 * GI}}, **extra}


async def _filter(running: Running, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    response = await running.verbs.post("/filter", json=filter_body(pod, names))
    assert response.status == 200, await response.text()
    answer: dict[str, Any] = await response.json()
    return answer


def _events(kube_api: FakeKubeApi, reason: str, name: str) -> list[dict[str, Any]]:
    return [
        e for e in kube_api.events if e["reason"] == reason and e["involvedObject"]["name"] == name
    ]


def _samples(text: str) -> dict[tuple[str, tuple[str, ...]], float]:
    """Every sample with only a ``namespace`` label: (name, (namespace,)) -> value."""
    return {
        (sample.name, (sample.labels["namespace"],)): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if set(sample.labels) == {"namespace"}
    }


def _admitted_at(kube_api: FakeKubeApi, name: str) -> str | None:
    annotations = kube_api.get_pod("vms", name)["metadata"].get("annotations") or {}
    found: str | None = annotations.get(ADMITTED_AT_ANNOTATION)
    return found


async def test_a_waiting_vm_is_admitted_and_nudged_when_another_vm_is_deleted(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a", cpu="16"))
    # Fixed size: a VM found already running may hold up to its maximum until its agent
    # reports, and these tests are about the quota, not that.
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", min_vcpus=2, max_vcpus=2))
    waiting = kube_api.add_pod(vm_pod("vm-2", uid="u-2"))
    running = await start_extender(make_config(quota=quota_section(2)))
    # Another namespace (no quota) asks for the same size first: its answer gets cached.
    other = vm_pod("other", uid="u-other")
    other["metadata"]["namespace"] = "free"
    assert (await _filter(running, other, ["node-a"]))["NodeNames"] == ["node-a"]

    reason = (
        "waiting for quota in namespace vms (position 1): needs 1000m cpu, 0m left of its quota"
    )
    for _ in range(3):
        answer = await _filter(running, waiting, ["node-a"])
        assert answer["NodeNames"] == []
        assert answer["FailedNodes"] == {"node-a": reason}
        assert answer["FailedAndUnresolvableNodes"] == {}
    bound = await running.verbs.post("/bind", json=bind_body(waiting, "node-a"))
    assert (await bound.json())["Error"] == f"cannot bind vms/vm-2 to node-a: {reason}"
    await wait_until(lambda: len(_events(kube_api, "WaitingForQuota", "vm-2")) == 1)
    (event,) = _events(kube_api, "WaitingForQuota", "vm-2")
    assert event["message"] == reason
    assert _admitted_at(kube_api, "vm-2") is None

    kube_api.delete_pod("vms", "vm-1")

    await wait_until(lambda: _admitted_at(kube_api, "vm-2") is not None)
    assert _admitted_at(kube_api, "vm-2") == "2027-01-15T08:00:00.000+00:00"
    await wait_until(lambda: len(_events(kube_api, "QuotaAdmitted", "vm-2")) == 1)
    # Still one waiting Event: filter calls are not each an Event.
    assert len(_events(kube_api, "WaitingForQuota", "vm-2")) == 1
    answer = await _filter(running, waiting, ["node-a"])
    assert answer["NodeNames"] == ["node-a"] and answer["FailedNodes"] == {}
    bound = await running.verbs.post("/bind", json=bind_body(waiting, "node-a"))
    assert (await bound.json())["Error"] == ""
    await wait_until(lambda: kube_api.get_pod("vms", "vm-2")["spec"].get("nodeName") == "node-a")


async def test_a_permit_is_limited_by_the_namespace_quota(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a", cpu="16"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", max_vcpus=8))
    running = await start_extender(make_config(quota=quota_section(3)))
    # The agent reports its VM steady at 1 vCPU first, so the ledger holds what really runs.
    body = permit_batch("node-a", uid="u-1", current=1, requested=1)
    response = await running.permits.post("/v1/permits", json=body, headers=AUTH)
    assert (await response.json())["permits"][0]["status"] == "steady"
    body = permit_batch("node-a", uid="u-1", current=1, requested=6)
    response = await running.permits.post("/v1/permits", json=body, headers=AUTH)
    assert response.status == 200, await response.text()
    (permit,) = (await response.json())["permits"]
    assert permit["status"] == "partial"
    assert permit["permit"] == {"vcpus": 3, "memoryBytes": GI}
    assert permit["reason"] == "granted 3 of 6 vCPUs: namespace vms has 2000m cpu of quota left"

    body = permit_batch("node-a", uid="u-1", current=3, requested=4)
    response = await running.permits.post("/v1/permits", json=body, headers=AUTH)
    (permit,) = (await response.json())["permits"]
    assert (permit["status"], permit["permit"]["vcpus"]) == ("denied", 3)
    assert permit["reason"] == "no room to grow: namespace vms has 0m cpu of quota left"
    # What held the two answers back, as the dashboard's denials panel reads it.
    text = await (await running.verbs.get("/metrics")).text()
    for line in (
        'vmautoscale_extender_permits_short_total{limit="quota",status="partial"} 1.0',
        'vmautoscale_extender_permits_short_total{limit="quota",status="denied"} 1.0',
    ):
        assert line in text, text


async def test_a_memory_permit_is_limited_by_the_namespace_memory_quota(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    memory = {
        "vm-autoscaling.io/min-memory": "1Gi",
        "vm-autoscaling.io/max-memory": "8Gi",
        "vm-autoscaling.io/memory-unit": "512Mi",
    }
    kube_api.add_node(node_object("node-a", cpu="16", memory="64Gi"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", extra=memory))
    quota = {"namespaces": {"vms": {"vcpus": 16, "memory_bytes": 3 * GI + 200 * 2**20}}}
    running = await start_extender(make_config(quota=quota))

    async def ask(current: int, requested: int) -> dict[str, Any]:
        return await ask_memory(
            running.permits, AUTH, current=current, requested=requested, last=current
        )

    assert (await ask(GI, GI))["status"] == "steady"
    permit = await ask(GI, 6 * GI)
    # 1Gi held + 2.2Gi of quota left: 3Gi, the last whole 512Mi unit within it.
    assert (permit["status"], permit["permit"]["memoryBytes"]) == ("partial", 3 * GI)
    left = 2 * GI + 200 * 2**20
    assert permit["reason"] == (
        f"granted {3 * GI} of {6 * GI} bytes of memory:"
        f" namespace vms has {left} bytes of memory of quota left"
    )
    permit = await ask(3 * GI, 4 * GI)
    assert (permit["status"], permit["permit"]["memoryBytes"]) == ("denied", 3 * GI)
    # A shrink gives the quota back at once.
    assert (await ask(3 * GI, 2 * GI))["status"] == "released"
    permit = await ask(2 * GI, 3 * GI)
    assert (permit["status"], permit["permit"]["memoryBytes"]) == ("granted", 3 * GI)


def _replace(path: Path, text: str) -> None:
    """An edit as a ConfigMap update makes it: the new file swapped in whole. (Written in place,
    the reloader, every 10 ms here, could read it empty: no quotas, vm-2 admitted on those.)"""
    new = path.with_suffix(".new")
    new.write_text(text)
    new.replace(path)


async def test_quota_file_reload_admits_waiting_pods_and_a_bad_edit_keeps_the_old_quotas(
    kube_api: FakeKubeApi, start_extender: StartExtender, tmp_path: Path
) -> None:
    path = tmp_path / "quota.yaml"
    path.write_text("namespaces:\n  vms: {vcpus: 1, memory_bytes: 68719476736}\n")
    kube_api.add_node(node_object("node-a", cpu="16"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", max_vcpus=1))
    waiting = kube_api.add_pod(vm_pod("vm-2", uid="u-2"))
    config = make_config(quota={"file": str(path), "reload_interval_seconds": 0.01})
    running = await start_extender(config)
    answer = await _filter(running, waiting, ["node-a"])
    assert answer["FailedNodes"]["node-a"].startswith("waiting for quota in namespace vms")

    with structlog.testing.capture_logs() as logs:
        _replace(path, "namespaces:\n  vms: {vcpus: two}\n")
        await wait_until(lambda: any(e["event"] == "quota_reload_failed" for e in logs))
    (failed,) = [e for e in logs if e["event"] == "quota_reload_failed"]
    assert "$.namespaces.vms.vcpus" in failed["error"]
    queue = await (await running.verbs.get("/v1/queue")).json()
    assert queue["namespaces"]["vms"]["quota"] == {"cpuMillis": 1000, "memoryBytes": 64 * GI}

    _replace(path, "namespaces:\n  vms: {vcpus: 2, memory_bytes: 68719476736}\n")
    await wait_until(lambda: _admitted_at(kube_api, "vm-2") is not None)
    queue = await (await running.verbs.get("/v1/queue")).json()
    assert queue["namespaces"]["vms"]["quota"] == {"cpuMillis": 2000, "memoryBytes": 64 * GI}
    assert [p["pod"] for p in queue["namespaces"]["vms"]["admitted"]] == ["vms/vm-2"]


async def test_queue_state_and_metrics_show_the_namespaces(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a", cpu="16"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a", min_vcpus=2, max_vcpus=2))
    kube_api.add_pod(vm_pod("vm-2", uid="u-2"))
    kube_api.add_pod(vm_pod("vm-3", uid="u-3"))
    running = await start_extender(make_config(quota=quota_section(2, admission_ttl_seconds=30)))

    queue = await (await running.verbs.get("/v1/queue")).json()
    gi64 = {"cpuMillis": 2000, "memoryBytes": 64 * GI}
    used = {"cpuMillis": 2000, "memoryBytes": GI}
    zero = {"cpuMillis": 0, "memoryBytes": 0}
    waiting = queue["namespaces"]["vms"].pop("waiting")
    assert queue == {
        "quotasLoaded": True,
        "admissionTtlSeconds": 30.0,
        "namespaces": {
            "vms": {
                "quota": gi64,
                "queueingStrategy": "BestEffortFIFO",
                "cohort": None,
                "borrowingLimit": None,
                "usage": used,
                "running": used,
                "reserved": zero,
                "borrowed": zero,
                "admitted": [],
            }
        },
    }
    assert [(w["pod"], w["position"], w["state"]) for w in waiting] == [
        ("vms/vm-2", 1, "waiting"),
        ("vms/vm-3", 2, "waiting"),
    ]
    assert waiting[1]["reason"] == (
        "waiting for quota in namespace vms (position 2): needs 1000m cpu, 0m left of its quota"
    )

    # On the verbs listener only: the permit port is open to every pod (issue 16).
    for path in ("/state", "/metrics"):
        assert (await running.permits.get(path)).status == 404
    for client in (running.verbs,):
        state = await (await client.get("/state")).json()
        assert state["namespaces"] == {
            "vms": {
                "quota": {"cpuMillis": 2000, "memoryBytes": 64 * GI},
                "usage": {"cpuMillis": 2000, "memoryBytes": GI},
                "borrowed": {"cpuMillis": 0, "memoryBytes": 0},
                "admittedPods": 0,
                "waitingPods": 2,
            }
        }
        samples = _samples(await (await client.get("/metrics")).text())
        assert {k: v for k, v in samples.items() if k[1] == ("vms",)} == {
            ("vmautoscale_extender_quota_vcpus", ("vms",)): 2.0,
            ("vmautoscale_extender_quota_memory_bytes", ("vms",)): 64 * GI,
            ("vmautoscale_extender_quota_used_vcpus", ("vms",)): 2.0,
            ("vmautoscale_extender_quota_used_memory_bytes", ("vms",)): GI,
            ("vmautoscale_extender_queue_length", ("vms",)): 2.0,
        }


async def test_without_a_quota_section_every_pod_is_admitted_at_once(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    kube_api.add_node(node_object("node-a", cpu="16"))
    pending = kube_api.add_pod(vm_pod("vm-1", uid="u-1"))
    running = await start_extender()
    assert (await _filter(running, pending, ["node-a"]))["NodeNames"] == ["node-a"]
    queue = await (await running.verbs.get("/v1/queue")).json()
    assert queue["namespaces"]["vms"]["quota"] is None
    assert [p["pod"] for p in queue["namespaces"]["vms"]["admitted"]] == ["vms/vm-1"]
    samples = _samples(await (await running.verbs.get("/metrics")).text())
    assert {k: v for k, v in samples.items() if k[1] == ("vms",)} == {
        ("vmautoscale_extender_quota_used_vcpus", ("vms",)): 1.0,
        ("vmautoscale_extender_quota_used_memory_bytes", ("vms",)): GI,
        ("vmautoscale_extender_queue_length", ("vms",)): 0.0,
    }
