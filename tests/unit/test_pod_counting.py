"""``podinfo.pod_requests`` counts a pod as kube-scheduler v1.36 does.

A table of cases, one per rule of the module docstring (the first three rows are the issue's
table: a node is over-committed when any of them is counted lower), and a property against a
plain, literal re-statement of ``resourcehelper.PodRequests`` over the pod's JSON. The control-plane
tier checks the same figures against the real kube-scheduler's cache.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codec import decode
from protocol.kube import Pod
from protocol.quantity import parse_quantity
from scheduler_extender.core.podinfo import Demand, pod_requests

Obj = dict[str, Any]
MI, GI = 2**20, 2**30


def pod(
    containers: list[Obj],
    *,
    init: list[Obj] | None = None,
    pod_requests_: Obj | None = None,
    overhead: Obj | None = None,
    status: Obj | None = None,
) -> Obj:
    spec: Obj = {"containers": containers}
    if init:
        spec["initContainers"] = init
    if pod_requests_ is not None:
        spec["resources"] = {"requests": pod_requests_}
    if overhead is not None:
        spec["overhead"] = overhead
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec, "status": status or {}}


def c(name: str, restart: str | None = None, **requests: str) -> Obj:
    out: Obj = {"name": name, "resources": {"requests": requests}}
    if restart:
        out["restartPolicy"] = restart
    return out


def cs(name: str, allocated: Obj | None = None, actual: Obj | None = None) -> Obj:
    out: Obj = {"name": name}
    if allocated is not None:
        out["allocatedResources"] = allocated
    if actual is not None:
        out["resources"] = {"requests": actual}
    return out


INFEASIBLE = {"type": "PodResizePending", "status": "True", "reason": "Infeasible"}
DEFERRED = {"type": "PodResizePending", "status": "True", "reason": "Deferred"}

CASES = {
    # The table: 2 CPU by kube-scheduler's count, each of them.
    "pod-level-requests-alone": (pod([c("c")], pod_requests_={"cpu": "2"}), Demand(2000, 0)),
    "resize-in-progress-actuated-above-spec": (
        pod(
            [c("c", cpu="500m")],
            status={"containerStatuses": [cs("c", {"cpu": "500m"}, {"cpu": "2"})]},
        ),
        Demand(2000, 0),
    ),
    "allocated-above-spec": (
        pod([c("c", cpu="500m")], status={"containerStatuses": [cs("c", {"cpu": "2"})]}),
        Demand(2000, 0),
    ),
    # Rule 1: the larger of the three *sums*, not of each container.
    "max-of-sums-not-sum-of-maxes": (
        pod(
            [c("a", cpu="1"), c("b", cpu="1")],
            status={"containerStatuses": [cs("a", {"cpu": "2"}), cs("b", {"cpu": "500m"})]},
        ),
        Demand(2500, 0),
    ),
    "spec-above-status-while-growing": (
        pod(
            [c("c", cpu="3", memory="1Gi")],
            status={"containerStatuses": [cs("c", {"cpu": "1"}, {"cpu": "1"})]},
        ),
        Demand(3000, GI),
    ),
    "allocated-lists-only-cpu-memory-from-spec": (
        pod([c("c", cpu="1", memory="1Gi")], status={"containerStatuses": [cs("c", {"cpu": "3"})]}),
        Demand(3000, GI),
    ),
    "infeasible-counts-the-status-not-the-spec": (
        pod(
            [c("c", cpu="8")],
            status={
                "conditions": [INFEASIBLE],
                "containerStatuses": [cs("c", {"cpu": "1"}, {"cpu": "1"})],
            },
        ),
        Demand(1000, 0),
    ),
    "infeasible-container-without-status-counts-nothing": (
        pod(
            [c("a", cpu="8"), c("b", cpu="1")],
            status={"conditions": [INFEASIBLE], "containerStatuses": [cs("b", {"cpu": "1"})]},
        ),
        Demand(1000, 0),
    ),
    "deferred-still-counts-the-spec": (
        pod(
            [c("c", cpu="8")],
            status={"conditions": [DEFERRED], "containerStatuses": [cs("c", {"cpu": "1"})]},
        ),
        Demand(8000, 0),
    ),
    "init-container-statuses-count": (
        pod(
            [c("c", cpu="1")],
            init=[c("i", cpu="500m")],
            status={"initContainerStatuses": [cs("i", {"cpu": "3"})]},
        ),
        Demand(3000, 0),
    ),
    "sidecar-resized": (
        pod(
            [c("c", cpu="1")],
            init=[c("side", "Always", cpu="100m")],
            status={"initContainerStatuses": [cs("side", {"cpu": "100m"}, {"cpu": "1"})]},
        ),
        Demand(2000, 0),
    ),
    "init-peak-includes-earlier-sidecars-only": (
        pod(
            [c("c", cpu="100m")],
            init=[c("s1", "Always", cpu="1"), c("i", cpu="2"), c("s2", "Always", cpu="1")],
        ),
        # sum: 100m + 1 + 1 = 2100m; init peak: s1 + i = 3000m
        Demand(3000, 0),
    ),
    # Rule 1, pod-level status maps stand for the container sums when both are there.
    "pod-level-status-maps-stand-for-the-sums": (
        pod(
            [c("c", cpu="1")],
            status={"allocatedResources": {"cpu": "2"}, "resources": {"requests": {"cpu": "3"}}},
        ),
        Demand(3000, 0),
    ),
    # Rule 2.
    "pod-level-replaces-only-what-it-names": (
        pod([c("a", cpu="3", memory="1Gi")], pod_requests_={"cpu": "1"}),
        Demand(1000, GI),
    ),
    "pod-level-hugepages-only-leaves-cpu-to-containers": (
        pod([c("a", cpu="3")], pod_requests_={"hugepages-2Mi": "2Mi"}),
        Demand(3000, 0),
    ),
    "pod-level-status-above-spec-less-overhead": (
        pod(
            [c("a")],
            pod_requests_={"cpu": "1", "memory": "1Gi"},
            overhead={"cpu": "100m", "memory": "64Mi"},
            status={"allocatedResources": {"cpu": "2100m", "memory": "1088Mi"}},
        ),
        # 2100m - 100m = 2000m (above the spec), 1088Mi - 64Mi = 1Gi; then the overhead again.
        Demand(2100, GI + 64 * MI),
    ),
    "pod-level-status-names-memory-the-spec-does-not": (
        pod(
            [c("a", cpu="1", memory="4Gi")],
            pod_requests_={"cpu": "2"},
            status={"resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
        ),
        Demand(2000, GI),
    ),
    "pod-level-infeasible-counts-status": (
        pod(
            [c("a")],
            pod_requests_={"cpu": "8"},
            status={"conditions": [INFEASIBLE], "resources": {"requests": {"cpu": "2"}}},
        ),
        Demand(2000, 0),
    ),
    # Rule 3 and rounding.
    "overhead-added-last": (
        pod([c("a", cpu="500m")], overhead={"cpu": "100m", "memory": "10Mi"}),
        Demand(600, 10 * MI),
    ),
    "rounded-up-once-per-pod": (
        pod([c("a", memory="1500m"), c("b", memory="1500m")]),  # 1.5 bytes each: 3, not 4
        Demand(0, 3),
    ),
    "sub-millicore-summed-before-rounding": (
        pod([c("a", cpu="500u"), c("b", cpu="500u")]),
        Demand(1, 0),
    ),
}


@pytest.mark.parametrize(("spec", "expected"), list(CASES.values()), ids=list(CASES))
def test_a_pod_counts_as_kubernetes_counts_it(spec: Obj, expected: Demand) -> None:
    assert pod_requests(decode(Pod, json.dumps(spec))) == expected
    assert reference(spec) == expected


# -- a literal re-statement of resourcehelper.PodRequests, over the JSON -------------------------

RESOURCES = ("cpu", "memory")


def rlist(m: Obj | None) -> dict[str, Fraction] | None:
    if m is None:
        return None
    return {k: parse_quantity(v) for k, v in m.items() if k in RESOURCES}


def add_list(into: dict[str, Fraction], new: dict[str, Fraction] | None) -> None:
    for k, v in (new or {}).items():
        into[k] = into.get(k, Fraction(0)) + v


def max_list(into: dict[str, Fraction], new: dict[str, Fraction] | None) -> None:
    for k, v in (new or {}).items():
        if k not in into or v > into[k]:
            into[k] = v


def max_of(a: dict[str, Fraction] | None, *rest: dict[str, Fraction] | None) -> dict[str, Fraction]:
    result = dict(a or {})
    for other in rest:
        max_list(result, other)
    return result


def reference(p: Obj) -> Demand:
    spec, status = p["spec"], p.get("status") or {}
    infeasible = False
    for cond in status.get("conditions") or []:
        if cond["type"] == "PodResizePending":
            infeasible = cond.get("reason") == "Infeasible"
            break

    def find_status(name: str) -> Obj | None:
        for s in status.get("containerStatuses") or []:
            if s["name"] == name:
                return s
        for s in status.get("initContainerStatuses") or []:
            if s["name"] == name:
                return s
        return None

    def spec_of(ctr: Obj, _s: Obj | None) -> dict[str, Fraction] | None:
        return rlist((ctr.get("resources") or {}).get("requests"))

    def allocated_of(ctr: Obj, s: Obj | None) -> dict[str, Fraction] | None:
        if s is not None and s.get("allocatedResources") is not None:
            return rlist(s["allocatedResources"])
        return None if infeasible else spec_of(ctr, s)

    def actuated_of(ctr: Obj, s: Obj | None) -> dict[str, Fraction] | None:
        if s is not None and (s.get("resources") or {}).get("requests") is not None:
            return rlist(s["resources"]["requests"])
        if s is not None and s.get("allocatedResources") is not None:
            return rlist(s["allocatedResources"])
        return None if infeasible else spec_of(ctr, s)

    def aggregate(fn: Any) -> dict[str, Fraction]:
        result: dict[str, Fraction] = {}
        for ctr in spec.get("containers") or []:
            add_list(result, fn(ctr, find_status(ctr["name"])))
        restartable: dict[str, Fraction] = {}
        init_max: dict[str, Fraction] = {}
        for ctr in spec.get("initContainers") or []:
            res = fn(ctr, find_status(ctr["name"]))
            if ctr.get("restartPolicy") == "Always":
                add_list(result, res)
                add_list(restartable, res)
                res = restartable
            else:
                combined: dict[str, Fraction] = {}
                add_list(combined, res)
                add_list(combined, restartable)
                res = combined
            max_list(init_max, res)
        max_list(result, init_max)
        return result

    spec_reqs = aggregate(spec_of)
    pod_res = status.get("resources")
    if (
        status.get("allocatedResources") is not None
        and pod_res is not None
        and pod_res.get("requests") is not None
    ):
        allocated, actuated = rlist(status["allocatedResources"]), rlist(pod_res["requests"])
    else:
        allocated, actuated = aggregate(allocated_of), aggregate(actuated_of)
    reqs = max_of(actuated, allocated) if infeasible else max_of(spec_reqs, actuated, allocated)

    overhead = rlist(spec.get("overhead"))
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    if any(k in RESOURCES or k.startswith("hugepages-") for k in pod_level):
        effective = rlist(pod_level)
        if status.get("resources") is not None or status.get("allocatedResources") is not None:
            st_reqs = rlist((status.get("resources") or {}).get("requests"))
            al_reqs = rlist(status.get("allocatedResources"))
            for lst in (st_reqs, al_reqs):
                for k in list((lst or {}).keys()):
                    if overhead and k in overhead:
                        lst[k] = max(Fraction(0), lst[k] - overhead[k])  # type: ignore[index]
            effective = max_of(None if infeasible else effective, st_reqs, al_reqs)
        for k, v in (effective or {}).items():
            reqs[k] = v
    add_list(reqs, overhead)
    return Demand(
        math.ceil(reqs.get("cpu", Fraction(0)) * 1000), math.ceil(reqs.get("memory", Fraction(0)))
    )


# -- the property --------------------------------------------------------------------------------

CPU = st.sampled_from(["0", "100m", "250m", "500m", "1", "1500m", "2", "3", "500u", "0.0005"])
MEMORY = st.sampled_from(["0", "64Mi", "100Mi", "1Gi", "1500m", "1G", "2Gi", "1e3"])


def requests(extra: bool = False) -> st.SearchStrategy[Obj]:
    keys: dict[str, st.SearchStrategy[str]] = {"cpu": CPU, "memory": MEMORY}
    if extra:
        keys["hugepages-2Mi"] = st.just("2Mi")
    keys["ephemeral-storage"] = st.just("1Gi")
    return st.fixed_dictionaries({}, optional=keys)


@st.composite
def pods(draw: st.DrawFn) -> Obj:
    n_main = draw(st.integers(0, 3))
    n_init = draw(st.integers(0, 3))
    containers = [
        {"name": f"c{i}", "resources": {"requests": draw(requests())}} for i in range(n_main)
    ]
    inits = []
    for i in range(n_init):
        ctr: Obj = {"name": f"i{i}", "resources": {"requests": draw(requests())}}
        if draw(st.booleans()):
            ctr["restartPolicy"] = "Always"
        inits.append(ctr)

    def statuses(ctrs: list[Obj]) -> list[Obj]:
        out = []
        for ctr in ctrs:
            if not draw(st.booleans()):
                continue
            s: Obj = {"name": ctr["name"]}
            if draw(st.booleans()):
                s["allocatedResources"] = draw(requests())
            shape = draw(st.sampled_from(["none", "empty", "requests"]))
            if shape == "empty":
                s["resources"] = {}
            elif shape == "requests":
                s["resources"] = {"requests": draw(requests())}
            out.append(s)
        return out

    status: Obj = {}
    if cs_ := statuses(containers):
        status["containerStatuses"] = cs_
    if ics := statuses(inits):
        status["initContainerStatuses"] = ics
    conditions = draw(
        st.sampled_from(
            [[], [INFEASIBLE], [DEFERRED], [{"type": "Ready", "status": "True"}, INFEASIBLE]]
        )
    )
    if conditions:
        status["conditions"] = conditions
    if draw(st.booleans()):
        status["allocatedResources"] = draw(requests())
    if draw(st.booleans()):
        status["resources"] = draw(st.sampled_from([{}, None])) or {"requests": draw(requests())}
    spec: Obj = {"containers": containers}
    if inits:
        spec["initContainers"] = inits
    if draw(st.booleans()):
        spec["resources"] = {"requests": draw(requests(extra=True))}
    if draw(st.booleans()):
        spec["overhead"] = draw(requests())
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec, "status": status}


@settings(max_examples=400, deadline=None)
@given(pods())
def test_counting_matches_a_plain_restatement_of_kubernetes_rules(p: Obj) -> None:
    assert pod_requests(decode(Pod, json.dumps(p))) == reference(p)
