"""Replay every request kube-scheduler sent in the recorded samples, and check our answers.

The samples' pods use ``default-scheduler`` and are plain pods (not VMs), so the extender is
configured with that scheduler name: every sampled pod is "ours" and bindable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import StartExtender, make_config, wait_until
from tests.fakes_paths import REFERENCE

SAMPLES = REFERENCE / "kube" / "extender"


def _samples(mode: str) -> list[tuple[str, dict[str, Any]]]:
    files = sorted((SAMPLES / mode).glob("*.json"))
    assert files, f"no samples under {SAMPLES / mode}"
    return [(path.name, json.loads(path.read_text())) for path in files]


def _request_names(request: dict[str, Any]) -> list[str]:
    if request["NodeNames"] is not None:
        return list(request["NodeNames"])
    return [n["metadata"]["name"] for n in request["Nodes"]["items"]]


@pytest.mark.parametrize("mode", ["cache", "nocache"])
async def test_every_recorded_request_is_answered(
    mode: str, kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    samples = _samples(mode)
    # The recorded cluster's nodes (see the Node objects in nocache/001-filter-nodes.json).
    kube_api.add_node(node_object("node-a", cpu="4", memory="8Gi"))
    kube_api.add_node(node_object("node-b", cpu="8", memory="16Gi"))
    # The pods kube-scheduler asked about, unbound, so that bind finds them in the watch.
    pods: dict[str, dict[str, Any]] = {}
    for _, sample in samples:
        pod = sample["request"].get("Pod")
        if pod is not None:
            pods.setdefault(pod["metadata"]["uid"], pod)
    for pod in pods.values():
        kube_api.add_pod(json.loads(json.dumps(pod)))
    running = await start_extender(
        make_config(
            scheduler_name="default-scheduler",
            # The recorded cluster kept nothing back; its filler pods fill whole nodes.
            system_reserve={"cpu_fraction": 0.0},
        )
    )

    seen_paths: set[str] = set()
    for file_name, sample in samples:
        path, request = sample["path"], sample["request"]
        seen_paths.add(path)
        response = await running.verbs.post(path, data=json.dumps(request))
        assert response.status == 200, (file_name, await response.text())
        answer = await response.json()
        if path == "/filter":
            names = _request_names(request)
            if request["NodeNames"] is not None:
                assert answer["Nodes"] is None, file_name
                passed = answer["NodeNames"]
            else:
                assert answer["NodeNames"] is None, file_name
                passed = [n["metadata"]["name"] for n in answer["Nodes"]["items"]]
                # The request's own Node objects come back, byte for byte in content.
                by_name = {n["metadata"]["name"]: n for n in request["Nodes"]["items"]}
                for item in answer["Nodes"]["items"]:
                    assert item == by_name[item["metadata"]["name"]]
            failed = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
            assert sorted([*passed, *failed]) == sorted(names), file_name
            assert answer["Error"] == ""
        elif path == "/prioritize":
            assert [h["Host"] for h in answer] == _request_names(request), file_name
            assert all(0 <= h["Score"] <= 10 for h in answer), file_name
        elif path == "/bind":
            assert answer == {"Error": ""}, file_name
            bound = kube_api.get_pod(request["PodNamespace"], request["PodName"])
            assert bound["spec"]["nodeName"] == request["Node"]
        elif path == "/preempt":
            assert set(answer) == {"NodeNameToMetaVictims"}
            proposed = request["NodeNameToMetaVictims"] or request["NodeNameToVictims"]
            assert set(answer["NodeNameToMetaVictims"]) <= set(proposed)
            for node, victims in answer["NodeNameToMetaVictims"].items():
                if request["NodeNameToMetaVictims"] is not None:
                    uids = {p["UID"] for p in proposed[node]["Pods"]}
                else:
                    uids = {p["metadata"]["uid"] for p in proposed[node]["Pods"]}
                assert {p["UID"] for p in victims["Pods"]} <= uids
            # kube-scheduler then deletes the victims; the next samples assume they are gone.
            victims = {
                p["UID"] for v in answer["NodeNameToMetaVictims"].values() for p in v["Pods"]
            }
            for pod in list(kube_api.objects["pods"].values()):
                if pod["metadata"]["uid"] in victims:
                    kube_api.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])

            def victims_gone(gone: set[str] = victims) -> bool:
                return not gone & running.extender.ledger.pods.keys()

            await wait_until(victims_gone)
        else:  # pragma: no cover - a new verb in the samples must get a branch here
            pytest.fail(f"unexpected sample path {path}")
    assert seen_paths == {"/filter", "/prioritize", "/bind", "/preempt"}


def test_samples_dir_is_found() -> None:
    assert Path(SAMPLES).is_dir()
