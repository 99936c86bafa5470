"""What a real Prometheus, scraping the tier's system through manifests/monitoring, recorded of
the tier: run last, it reads the record the other modules' drills left (``tests/node/
monitoring.py`` says how Prometheus runs: from the tier's overlay on, the shipped scrape jobs
and rules, with ``for`` and the windows shortened).

- The scraper's token (the component's ServiceAccount) lists pods and reads nothing else.
- Every extender and agent pod is a target up, and the guests' node_exporter were while the
  example VMs ran.
- The drills that leave the system without a leading extender (its leader's pod deleted, its
  node stopped, it cut off from the API server) raise VmAutoscalingNoExtenderLeading, and
  VmAutoscalingAgentCannotReachExtender (every agent's calls fail meanwhile, the empty checks
  of a node whose VMs ask nothing included); both clear once a leader answers again. Every
  alert that fired is printed with its times (VmAutoscalingNodeOverpromised is not held to
  "never" here: a new leader keeps each VM's room up to its maximum out of ``free`` until its
  agent reports, seconds that the alert's 2 minutes cover and the tier's 4 s may not).
- Every query of the Grafana dashboard drew numbers at some point of the run: no dead panel
  (the VMs grew and shrank, permits were granted short, resizes were timed).
"""

from __future__ import annotations

import json
import math
import ssl
import time
from collections.abc import Iterator

import pytest

from testkit.controlplane import Api, ApiError, wait_for
from testkit.manifests import MONITORING
from tests.node.harness import VM, Node
from tests.node.monitoring import (
    LEADING,
    NAMESPACE,
    Prometheus,
    Span,
    scraper_token,
    spans,
)

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(300)]

DRILL_ALERTS = ("VmAutoscalingNoExtenderLeading", "VmAutoscalingAgentCannotReachExtender")
# An alert fired by a drill starts while no extender leads, or this soon after: the agents'
# failures count in a window (15 s here) that ends after the outage.
AFTER_OUTAGE_SECONDS = 30


@pytest.fixture(scope="module")
def prom(watching: Prometheus | None, tuned: Node) -> Iterator[Prometheus]:
    if watching is None:
        pytest.skip("no prometheus binary (Debian's prometheus; scripts/setup installs it)")
    yield watching


def _pods(node: Node, selector: str) -> set[str]:
    """The pods ``selector`` selects, those being deleted left out."""
    out = node.kubectl("-n", NAMESPACE, "get", "pods", "-l", selector, "-o", "json").stdout
    return {p["metadata"]["name"] for p in json.loads(out)["items"]
            if not p["metadata"].get("deletionTimestamp")}  # fmt: skip


def test_the_scrapers_token_lists_pods_and_nothing_else(prom: Prometheus, tuned: Node) -> None:
    context = ssl.create_default_context(cafile=str(tuned.pki / "ca.crt"))
    api = Api("127.0.0.1", tuned.api_port, context, scraper_token(tuned))
    try:
        assert api.get("/api/v1/pods")["items"]
        for path in (f"/api/v1/namespaces/{NAMESPACE}/secrets", "/api/v1/nodes"):
            with pytest.raises(ApiError) as refused:
                api.get(path)
            assert refused.value.status == 403, path
    finally:
        api.close()


def _targets(p: Prometheus) -> list[tuple[str, str, str, str]]:
    """(job, pod or vm, health, last error) of every active target."""
    return [
        (t["labels"]["job"], t["labels"].get("pod") or t["labels"].get("vm", "?"), t["health"],
         t["lastError"])
        for t in p.api("targets", state="active")["activeTargets"]
    ]  # fmt: skip


def test_prometheus_scrapes_the_extender_every_agent_and_the_guests(
    prom: Prometheus, tuned: Node
) -> None:
    want = {
        "vm-autoscaling-extender": _pods(tuned, "app.kubernetes.io/name=scheduler-extender"),
        "vm-autoscaling-agent": _pods(tuned, "app.kubernetes.io/name=autoscaler-agent"),
    }

    def all_up() -> bool:
        up = {(job, pod) for job, pod, health, _ in _targets(prom) if health == "up"}
        return all((job, pod) in up for job, pods in want.items() for pod in pods)

    try:
        wait_for(all_up, timeout_seconds=60, what="every extender and agent pod up", interval=1)
    except AssertionError as e:
        raise AssertionError(f"{e}: want {want}, targets {_targets(prom)}") from e
    # Over the run: every pod each job ever scraped (pods were replaced by the drills), and
    # the guests of the example VMs while they ran.
    ever: dict[str, set[str]] = {}
    for series in prom.record("up == 1", step=2):
        m = series["metric"]
        ever.setdefault(m["job"], set()).add(m.get("pod") or m.get("vm", "?"))
    print(f"targets up now: {want}; ever up over the run: "
          f"{ {job: sorted(names) for job, names in ever.items()} }")  # fmt: skip
    assert f"default/{VM}" in ever.get("vm-autoscaling-guests", set()), ever

    # The extender's metrics came through its authenticated port: one replica leads.
    # (Once a scrape has caught up: the last drill may have handed the Lease over a moment ago.)
    def one_leads() -> bool:
        leading = prom.api("query", query=LEADING)["result"]
        return bool(leading) and float(leading[0]["value"][1]) == 1

    wait_for(one_leads, timeout_seconds=30, what="one extender leading, as scraped", interval=1)


def _alert_spans(p: Prometheus, cleared: set[str]) -> dict[str, list[Span]]:
    """When each alert fired; every span of an alert in ``cleared`` (which the alerts API has
    shown neither pending nor firing) ended, however recently."""
    out: dict[str, list[Span]] = {}
    for series in p.record('max by (alertname) (ALERTS{alertstate="firing"})'):
        name, times = series["metric"]["alertname"], [t for t, _ in series["values"]]
        out[name] = spans(times, 1.0, math.inf if name in cleared else series["until"])
    return out


def _outages(p: Prometheus) -> list[Span]:
    """When no scraped replica said it led (the alert's condition, without its ``for``)."""
    query = "sum(vmautoscale_extender_leading) < 1 or absent(vmautoscale_extender_leading)"
    found = [spans([t for t, _ in s["values"]], 1.0, s["until"]) for s in p.record(query)]
    return sorted((s for each in found for s in each), key=lambda s: s.start)


def test_the_drills_without_a_leader_fire_two_alerts_that_clear_after(
    prom: Prometheus, tuned: Node
) -> None:
    cleared_wait = time.monotonic()
    # The last drill may have ended a moment ago: its alerts may still be pending (their
    # condition holds, their ``for`` not over) or firing, until the agents' failures leave
    # the window.
    wait_for(lambda: not set(DRILL_ALERTS) & prom.active(), timeout_seconds=90,
             what=f"{DRILL_ALERTS} neither pending nor firing", interval=1)  # fmt: skip
    waited = time.monotonic() - cleared_wait
    fired, outages = _alert_spans(prom, set(DRILL_ALERTS)), _outages(prom)
    t0 = prom.started

    def at(t: float | None) -> str:
        return "-" if t is None else f"{t - t0:+.1f}s"

    print(f"record from {time.strftime('%H:%M:%S', time.gmtime(t0))} UTC; waited {waited:.1f}s "
          f"for the drill alerts to clear; no leader: "
          f"{[(at(o.start), at(o.end)) for o in outages]}")  # fmt: skip
    from_drills: dict[str, list[str]] = {}
    for name, found in sorted(fired.items()):
        for s in found:
            cause = [o for o in outages if o.start - 1 <= s.start <= (o.end or s.start)
                     + AFTER_OUTAGE_SECONDS]  # fmt: skip
            line = f"{name}: firing {at(s.start)}, cleared {at(s.end)}"
            if cause:
                o = cause[-1]
                line += f" ({s.start - o.start:.1f}s after the leader was lost"
                if s.end is not None and o.end is not None:
                    line += f", cleared {s.end - o.end:.1f}s after one led again"
                line += ")"
                from_drills.setdefault(name, []).append(line)
            print(line)
    # Each fired from a drill; all have cleared (the wait above).
    for name in DRILL_ALERTS:
        assert from_drills.get(name), (name, fired, outages)


def test_every_dashboard_panel_drew_over_the_run(prom: Prometheus) -> None:
    dashboard = json.loads((MONITORING / "dashboards" / "vm-autoscaling.json").read_text())
    queries = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
    drawn = [(title, q, prom.drawn(q)) for title, q in queries]
    dead = [(title, q) for title, q, lines in drawn if not lines]
    assert not dead, f"dead panels: {dead}"
    print(f"{len(queries)} queries of {len(dashboard['panels'])} panels drew numbers over the "
          f"run, {sum(n for *_, n in drawn)} series in all: {[n for *_, n in drawn]}")  # fmt: skip


def test_spans_split_on_a_gap_and_end_unless_the_record_ends_within_one() -> None:
    times = [10.0, 11.0, 13.0, 20.0, 21.0]  # a 2 s gap is a late evaluation, 7 s is a new span
    assert spans(times, 1.0, until=22.0) == [Span(10.0, 14.0), Span(20.0, None)]
    assert spans(times, 1.0, until=30.0) == [Span(10.0, 14.0), Span(20.0, 22.0)]
    assert spans(times, 1.0, until=math.inf)[-1] == Span(20.0, 22.0)
    assert spans([], 1.0, until=30.0) == []
