"""``podinfo.pod_requests`` counts a pod as kube-scheduler v1.36 does.

A table of cases, one per rule of the module docstring (the first three rows are the issue's
table: a node is over-committed when any of them is counted lower), and a property against a
plain, literal re-statement of those rules over the pod's JSON. The control-plane
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


INFEASIBLE = {"type": "PodResizePending", "status": "True", "reason": "Infeasible"}
DEFERRED = {"type": "PodResizePending", "status": "True", "reason": "Deferred"}


def cs(
    name: str, allocated: Obj | None = None, actual: Obj | None = None, *, res: bool = True
) -> Obj:
    """A container's status; ``res=False`` leaves ``resources`` out even without requests."""
    out: Obj = {"name": name}
    if allocated is not None:
        out["allocatedResources"] = allocated
    if actual is not None:
        out["resources"] = {"requests": actual}
    elif res:
        out["resources"] = {}
    return out


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
    # kube-scheduler counts 500m here (no ``resources`` reported); the kubelet's floor is 2.
    "allocated-above-spec-before-resources-reported": (
        pod([c("c", cpu="500m")], status={"containerStatuses": [cs("c", {"cpu": "2"}, res=False)]}),
        Demand(2000, 0),
    ),
    # Rule 1.
    "allocated-above-spec-with-empty-resources": (
        pod([c("c", cpu="500m")], status={"containerStatuses": [cs("c", {"cpu": "2"})]}),
        Demand(2000, 0),
    ),
    "each-container-its-own-largest": (
        pod(
            [c("a", cpu="1"), c("b", cpu="1")],
            status={"containerStatuses": [cs("a", {"cpu": "2"}), cs("b", {"cpu": "500m"})]},
        ),
        Demand(3000, 0),
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
                "containerStatuses": [cs("c", {"cpu": "2"}, {"cpu": "1"})],
            },
        ),
        Demand(2000, 0),
    ),
    "infeasible-container-without-status-counts-its-spec": (
        pod(
            [c("a", cpu="3"), c("b", cpu="1")],
            status={"conditions": [INFEASIBLE], "containerStatuses": [cs("b", None, {"cpu": "1"})]},
        ),
        Demand(4000, 0),
    ),
    "deferred-still-counts-the-spec": (
        pod(
            [c("c", cpu="8")],
            status={"conditions": [DEFERRED], "containerStatuses": [cs("c", {"cpu": "1"})]},
        ),
        Demand(8000, 0),
    ),
    "ordinary-init-container-counts-its-spec": (
        pod(
            [c("c", cpu="1")],
            init=[c("i", cpu="3")],
            status={"initContainerStatuses": [cs("i", None, {"cpu": "4"})]},
        ),
        Demand(3000, 0),
    ),
    "sidecar-resized": (
        pod(
            [c("c", cpu="1")],
            init=[c("side", "Always", cpu="100m")],
            status={"initContainerStatuses": [cs("side", None, {"cpu": "1"})]},
        ),
        Demand(2000, 0),
    ),
    # Rule 2.
    "init-peak-includes-earlier-sidecars-only": (
        pod(
            [c("c", cpu="100m")],
            init=[c("s1", "Always", cpu="1"), c("i", cpu="2"), c("s2", "Always", cpu="1")],
        ),
        # sum: 100m + 1 + 1 = 2100m; init peak: s1 + i = 3000m
        Demand(3000, 0),
    ),
    "pod-level-status-without-pod-level-requests-is-ignored": (
        pod(
            [c("c", cpu="1")],
            status={"allocatedResources": {"cpu": "2"}, "resources": {"requests": {"cpu": "3"}}},
        ),
        Demand(1000, 0),
    ),
    # Rule 3.
    "pod-level-replaces-only-what-it-names": (
        pod([c("a", cpu="3", memory="1Gi")], pod_requests_={"cpu": "1"}),
        Demand(1000, GI),
    ),
    "pod-level-hugepages-only-leaves-cpu-to-containers": (
        pod([c("a", cpu="3")], pod_requests_={"hugepages-2Mi": "2Mi"}),
        Demand(3000, 0),
    ),
    "pod-level-status-above-spec": (
        pod(
            [c("a")],
            pod_requests_={"cpu": "1"},
            status={
                "allocatedResources": {"cpu": "2"},
                "resources": {"requests": {"cpu": "2500m"}},
            },
        ),
        Demand(2500, 0),
    ),
    "pod-level-status-overhead-not-taken-off": (
        pod(
            [c("a")],
            pod_requests_={"cpu": "1"},
            overhead={"cpu": "100m"},
            status={"resources": {"requests": {"cpu": "2100m"}}},
        ),
        Demand(2200, 0),
    ),
    "pod-level-status-memory-the-spec-does-not-name-is-ignored": (
        pod(
            [c("a", cpu="500m", memory="2Gi")],
            pod_requests_={"cpu": "1"},
            status={"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
        ),
        Demand(1000, 2 * GI),
    ),
    "pod-level-allocated-before-resources-reported": (
        pod([c("a")], pod_requests_={"cpu": "1"}, status={"allocatedResources": {"cpu": "2"}}),
        Demand(2000, 0),
    ),
    "pod-level-infeasible-counts-status": (
        pod(
            [c("a")],
            pod_requests_={"cpu": "8"},
            status={"conditions": [INFEASIBLE], "resources": {"requests": {"cpu": "2"}}},
        ),
        Demand(2000, 0),
    ),
    "pod-level-infeasible-status-without-it-is-zero": (
        pod(
            [c("a", cpu="500m")],
            pod_requests_={"cpu": "3"},
            status={"conditions": [INFEASIBLE], "resources": {"requests": {"memory": "1Gi"}}},
        ),
        Demand(0, 0),
    ),
    # Rule 4 and rounding.
    "overhead-added-last": (
        pod([c("a", cpu="500m")], overhead={"cpu": "100m", "memory": "10Mi"}),
        Demand(600, 10 * MI),
    ),
    "rounded-up-once-per-pod": (
        pod([c("a", memory="1500m"), c("b", memory="1500m")]),  # 1.5 bytes each: 3, not 4
        Demand(0, 3),
    ),
    "each-quantity-rounded-to-a-thousandth-first": (
        pod([c("a", cpu="500u"), c("b", cpu="500u")]),  # 1m each, as the API keeps them
        Demand(2, 0),
    ),
}


@pytest.mark.parametrize(("spec", "expected"), list(CASES.values()), ids=list(CASES))
def test_a_pod_counts_as_kubernetes_counts_it(spec: Obj, expected: Demand) -> None:
    assert pod_requests(decode(Pod, json.dumps(spec))) == expected
    assert reference(spec) == expected


# -- a literal re-statement of resourcehelper.PodRequests, over the JSON -------------------------

RESOURCES = ("cpu", "memory")
Q = dict[str, Fraction]


def rlist(m: Obj | None) -> Q:
    """A resource list, each quantity rounded up to a thousandth as the API keeps it."""
    return {
        k: Fraction(math.ceil(parse_quantity(v) * 1000), 1000)
        for k, v in (m or {}).items()
        if k in RESOURCES
    }


def add_list(into: Q, new: Q) -> None:
    for k, v in new.items():
        into[k] = into.get(k, Fraction(0)) + v


def max_list(into: Q, new: Q) -> None:
    for k, v in new.items():
        if k not in into or v > into[k]:
            into[k] = v


def max_of(*lists: Q) -> Q:
    result: Q = {}
    for other in lists:
        max_list(result, other)
    return result


def reference(p: Obj) -> Demand:
    spec, status = p["spec"], p.get("status") or {}
    infeasible = False
    for cond in status.get("conditions") or []:
        if cond["type"] == "PodResizePending":
            infeasible = cond.get("reason") == "Infeasible"
            break
    statuses = {}
    for s in (status.get("initContainerStatuses") or [])[::-1] + (
        status.get("containerStatuses") or []
    )[::-1]:
        statuses[s["name"]] = s  # the first of containerStatuses wins, as findContainerStatus

    def effective(ctr: Obj) -> Q:
        own = rlist((ctr.get("resources") or {}).get("requests"))
        s = statuses.get(ctr["name"])
        if s is None:
            return own
        allocated = rlist(s.get("allocatedResources"))
        if s.get("resources") is None:
            return max_of(own, allocated)
        actual = rlist(s["resources"].get("requests"))
        return max_of(actual, allocated) if infeasible else max_of(own, actual, allocated)

    reqs: Q = {}
    for ctr in spec.get("containers") or []:
        add_list(reqs, effective(ctr))
    restartable: Q = {}
    init_max: Q = {}
    for ctr in spec.get("initContainers") or []:
        if ctr.get("restartPolicy") == "Always":
            res = effective(ctr)
            add_list(reqs, res)
            add_list(restartable, res)
            max_list(init_max, restartable)
        else:
            combined = rlist((ctr.get("resources") or {}).get("requests"))
            add_list(combined, restartable)
            max_list(init_max, combined)
    max_list(reqs, init_max)

    pod_level = (spec.get("resources") or {}).get("requests") or {}
    if any(k in RESOURCES or k.startswith("hugepages-") for k in pod_level):
        named = rlist(pod_level)
        allocated = rlist(status.get("allocatedResources"))
        if status.get("resources") is None:
            for k, v in named.items():
                reqs[k] = max(v, allocated.get(k, Fraction(0)))
        else:
            actual = rlist(status["resources"].get("requests"))
            for k, v in named.items():
                candidates = [actual.get(k, Fraction(0)), allocated.get(k, Fraction(0))]
                if not infeasible:
                    candidates.append(v)
                reqs[k] = max(candidates)
    add_list(reqs, rlist(spec.get("overhead")))
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
    shape = draw(st.sampled_from(["none", "empty", "requests"]))
    if shape == "empty":
        status["resources"] = {}
    elif shape == "requests":
        status["resources"] = {"requests": draw(requests())}
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
