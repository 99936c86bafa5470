"""A real Prometheus scrapes the deployed system through manifests/monitoring, and its alerts
fire and clear from a drill.

``kubectl apply -k`` of the monitoring component on the tier's system; then Debian's
``prometheus``, run here on the host, scrapes the extender (with the token of the component's
ServiceAccount, which the extender reviews and authorizes), every agent and the VM's guest,
through the shipped scrape jobs. Debian builds it without Kubernetes discovery, so a thread
lists the pods with that same token every second and writes what ``kubernetes_sd_configs``
would have found (``testkit/prometheus.py``); the relabelling that picks and labels the
targets is the shipped one. The rules are the shipped ones with ``for`` divided by 30 and
their windows by 10, and Prometheus scrapes every 2 s and evaluates every second: the tier's
overlay of the timing, never of the expressions.

The drill: every extender replica stopped while the guest is loaded, so its agent asks for
vCPUs and cannot get through. VmAutoscalingNoExtenderLeading and
VmAutoscalingAgentCannotReachExtender must fire; with the extender back (and the VM grown)
both must clear. Then every query of the Grafana dashboard must return series.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit import prometheus
from testkit.controlplane import Api, ApiError, wait_for
from testkit.manifests import MONITORING, PROMETHEUS_FILES
from testkit.ports import free_port
from tests.node.conftest import example_vm
from tests.node.harness import VM, Node, Obj, wait_postgres

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(900)]

NAMESPACE = "vm-autoscaling"
SCRAPER_SECRET = "vm-autoscaling-scraper-token"
# 1m -> 2 s, 5m -> 10 s: longer than a scrape or two, so that one slow scrape of the extender
# (its first review of the token, a busy host) does not raise an alert by itself.
FOR_DIVISOR = 30
WINDOW_DIVISOR = 10  # [5m] -> [30s]: a 2 s scrape leaves 15 samples in every window
DRILL_ALERTS = ("VmAutoscalingNoExtenderLeading", "VmAutoscalingAgentCannotReachExtender")
# Busy tasks in the guest: more than a 2-CPU node can give, so the agent keeps asking.
LOAD_SESSIONS = 3
# generate_series in the select list streams (ProjectSet); in FROM it would be materialized.
BURN = "SELECT count(*) FROM (SELECT generate_series(1, 5000000000)) AS burn"


@dataclass
class Prom:
    url: str
    process: subprocess.Popen[bytes]
    work: Path

    def api(self, path: str, **query: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def firing(self) -> set[str]:
        return {a["labels"]["alertname"] for a in self.api("alerts")["alerts"]
                if a["state"] == "firing"}  # fmt: skip


def _scraper_token(node: Node) -> str:
    def token() -> str | None:
        out = node.kubectl("-n", NAMESPACE, "get", "secret", SCRAPER_SECRET, "-o",
                           "jsonpath={.data.token}", check=False)  # fmt: skip
        return base64.b64decode(out.stdout).decode() if out.returncode == 0 and out.stdout else None

    found: str = wait_for(token, timeout_seconds=30, what="the scraper's token", interval=0.5)
    return found


class Discovery:
    """What ``kubernetes_sd_configs`` does, with the scraper's token: list the pods every
    second and rewrite the targets files (only when they change)."""

    def __init__(self, node: Node, token: str, jobs: list[Obj], sd_dir: Path) -> None:
        context = ssl.create_default_context(cafile=str(node.pki / "ca.crt"))
        self.api = Api("127.0.0.1", node.api_port, context, token)
        self.jobs, self.sd_dir = jobs, sd_dir
        self._stop = threading.Event()
        self._last: object = None
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="discovery", daemon=True)
        self._thread.start()

    def refresh(self) -> None:
        pods = self.api.get("/api/v1/pods")["items"]
        seen = [(p["metadata"]["uid"], p.get("status", {}).get("podIP")) for p in pods]
        if seen != self._last:
            prometheus.write_targets(self.jobs, pods, self.sd_dir)
            self._last = seen

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.refresh()
            except (ApiError, OSError) as e:  # the API server is busy: try again next second
                print(f"discovery: {e}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.api.close()


@pytest.fixture(scope="module")
def monitored(tuned: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """The component applied as a user would (a kustomization that uses it), on the tuned
    system with the example VM running and its PostgreSQL up. The tier is left as found: the
    component deleted after, and the example VM too if this module had to start it (an
    earlier module may have deleted it, and later ones may count on that)."""
    had_vm = tuned.pod_or_none("default", VM) is not None
    wait_postgres(example_vm(tuned)["status"]["podIP"])
    use = tmp_path_factory.mktemp("monitoring")
    (use / "kustomization.yaml").write_text(
        yaml.safe_dump({"components": [os.path.relpath(MONITORING, use)]})
    )
    tuned.kubectl("apply", "-k", str(use))
    try:
        yield tuned
    finally:
        tuned.kubectl("delete", "-k", str(use), "--wait=false", check=False)
        if not had_vm:
            examples = str(MONITORING.parent / "examples")
            tuned.kubectl("delete", "-k", examples, "--wait=false", check=False)


@pytest.fixture(scope="module")
def prom(monitored: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    node = monitored
    work = tmp_path_factory.mktemp("prometheus")
    token = work / "token"
    token.write_text(_scraper_token(node))
    shipped = prometheus.load(PROMETHEUS_FILES / "scrape.yaml")["scrape_configs"]
    jobs = prometheus.file_sd_jobs(shipped, work)
    for job in jobs:
        if "authorization" in job:  # the in-cluster token path, here the Secret's token
            job["authorization"]["credentials_file"] = str(token)
    rules = prometheus.scaled_rules(
        prometheus.load(PROMETHEUS_FILES / "rules.yaml"),
        for_divisor=FOR_DIVISOR,
        window_divisor=WINDOW_DIVISOR,
    )
    (work / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "1s"},
        "rule_files": [str(work / "rules.yaml")],
        "scrape_configs": jobs,
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    discovery = Discovery(node, token.read_text(), shipped, work)
    port = free_port()
    log = (work / "prometheus.log").open("wb")
    process = subprocess.Popen(
        ["prometheus", f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    p = Prom(f"http://127.0.0.1:{port}", process, work)
    try:
        wait_for(lambda: _ready(p), timeout_seconds=60, what="Prometheus ready", interval=0.5)
        yield p
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        discovery.stop()


def _ready(p: Prom) -> bool:
    if p.process.poll() is not None:
        raise AssertionError(f"prometheus exited: {(p.work / 'prometheus.log').read_text()}")
    try:
        with urllib.request.urlopen(f"{p.url}/-/ready", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _pods(node: Node, selector: str) -> list[str]:
    out = node.kubectl("-n", NAMESPACE, "get", "pods", "-l", selector, "-o",
                       "jsonpath={.items[*].metadata.name}").stdout  # fmt: skip
    return out.split()


def _targets_up(p: Prom, node: Node) -> dict[str, int] | None:
    """Every extender and agent pod's target up, and the example VM's guest: targets by job."""
    want = {
        "vm-autoscaling-extender": len(_pods(node, "app.kubernetes.io/name=scheduler-extender")),
        "vm-autoscaling-agent": len(_pods(node, "app.kubernetes.io/name=autoscaler-agent")),
    }
    up: dict[str, int] = {}
    guest = False
    for t in p.api("targets", state="active")["activeTargets"]:
        job = t["labels"]["job"]
        if t["health"] == "up":
            up[job] = up.get(job, 0) + 1
            guest = guest or t["labels"].get("vm") == f"default/{VM}"
    got = {job: up.get(job, 0) for job in want}
    return up if got == want and guest else None


def _wait_targets(p: Prom, node: Node) -> dict[str, int]:
    """``_targets_up`` within a minute, or fail with every target's state and last error."""
    try:
        up: dict[str, int] = wait_for(lambda: _targets_up(p, node), timeout_seconds=60,
                                      what="every target up", interval=1)  # fmt: skip
    except AssertionError as e:
        states = [(t["labels"], t["health"], t["lastError"])
                  for t in p.api("targets", state="active")["activeTargets"]]  # fmt: skip
        raise AssertionError(f"{e}: {states}") from e
    return up


def test_the_scrapers_token_lists_pods_and_nothing_else(monitored: Node) -> None:
    context = ssl.create_default_context(cafile=str(monitored.pki / "ca.crt"))
    api = Api("127.0.0.1", monitored.api_port, context, _scraper_token(monitored))
    try:
        assert api.get("/api/v1/pods")["items"]
        for path in (f"/api/v1/namespaces/{NAMESPACE}/secrets", "/api/v1/nodes"):
            with pytest.raises(ApiError) as refused:
                api.get(path)
            assert refused.value.status == 403, path
    finally:
        api.close()


def test_prometheus_scrapes_the_extender_every_agent_and_the_guest(
    prom: Prom, monitored: Node
) -> None:
    started = time.monotonic()
    up = _wait_targets(prom, monitored)
    print(f"targets up {time.monotonic() - started:.1f}s after Prometheus was ready: {up}")
    # The extender's metrics came through its authenticated port: a leader is among them.
    leading = prom.api("query", query="sum(vmautoscale_extender_leading)")["result"]
    assert leading and float(leading[0]["value"][1]) == 1


class Load:
    """``LOAD_SESSIONS`` sessions burning CPU in the guest's PostgreSQL until cancelled."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        env = {**os.environ, "PGPASSWORD": "bench", "PGCONNECT_TIMEOUT": "10",
               "PGOPTIONS": "-c statement_timeout=180000"}  # fmt: skip
        self.env = env
        self.sessions = [
            subprocess.Popen(
                self._psql(BURN), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            for _ in range(LOAD_SESSIONS)
        ]

    def _psql(self, sql: str) -> list[str]:
        return ["psql", "-h", self.ip, "-U", "bench", "-d", "pgbench", "-qAtc", sql]

    def stop(self) -> None:
        cancel = ("SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity"
                  " WHERE query LIKE 'SELECT count(*) FROM (SELECT generate_series%'"
                  " AND pid <> pg_backend_pid()")  # fmt: skip
        subprocess.run(self._psql(cancel), env=self.env, capture_output=True, timeout=30,
                       check=False)  # fmt: skip
        for s in self.sessions:
            try:
                s.wait(timeout=15)
            except subprocess.TimeoutExpired:
                s.kill()
                s.wait()


def _wait_alerts(p: Prom, names: tuple[str, ...], *, firing: bool, since: float,
                 timeout: float) -> dict[str, float]:  # fmt: skip
    """When each alert of ``names`` was first seen firing (or gone), seconds after ``since``."""
    seen: dict[str, float] = {}

    def done() -> bool:
        now = p.firing()
        for name in names:
            if name not in seen and (name in now) == firing:
                seen[name] = time.monotonic() - since
        return len(seen) == len(names)

    wait_for(done, timeout_seconds=timeout, interval=0.5,
             what=f"{names} {'firing' if firing else 'cleared'} (seen: {seen})")  # fmt: skip
    return seen


def _vcpus(p: Prom) -> float | None:
    result = p.api("query", query=f'vmautoscale_agent_vm_current_vcpus{{vm="default/{VM}"}}')
    return float(result["result"][0]["value"][1]) if result["result"] else None


def test_extender_stopped_under_load_fires_two_alerts_that_clear_after(
    prom: Prom, monitored: Node
) -> None:
    node = monitored
    _wait_targets(prom, node)
    # Quiet before the drill (the rules ran before the first scrapes came in).
    wait_for(lambda: not set(DRILL_ALERTS) & prom.firing(), timeout_seconds=60,
             what=f"{DRILL_ALERTS} quiet before the drill", interval=1)  # fmt: skip
    replicas = node.kubectl("-n", NAMESPACE, "get", "deployment/scheduler-extender", "-o",
                            "jsonpath={.spec.replicas}").stdout  # fmt: skip
    ip = node.pod("default", VM)["status"]["podIP"]
    # At its minimum (idle, it shrinks there), so that it has room to grow once answered.
    before = wait_for(lambda: _vcpus(prom) == 1 and 1.0, timeout_seconds=90,
                      what=f"{VM} at 1 vCPU", interval=1)  # fmt: skip
    stopped = time.monotonic()
    node.kubectl("-n", NAMESPACE, "scale", "deployment/scheduler-extender", "--replicas=0")
    load = Load(ip)
    try:
        fired = _wait_alerts(prom, DRILL_ALERTS, firing=True, since=stopped, timeout=120)
        for name, t in fired.items():
            print(f"{name} firing {t:.1f}s after the extender was stopped")
        restored = time.monotonic()
        node.kubectl("-n", NAMESPACE, "scale", "deployment/scheduler-extender",
                     f"--replicas={replicas}")  # fmt: skip

        # The VM, loaded all along, grows once a leader answers: a resize under the new
        # extender, which the latency panels below read.
        def grown() -> bool:
            now = _vcpus(prom)
            return now is not None and now > before

        wait_for(grown, timeout_seconds=120, what=f"{VM} grown from {before} vCPUs", interval=1)
        print(f"{VM} grew {time.monotonic() - restored:.1f}s after the extender was restored")
    finally:
        load.stop()
        node.kubectl("-n", NAMESPACE, "scale", "deployment/scheduler-extender",
                     f"--replicas={replicas}")  # fmt: skip
    cleared = _wait_alerts(prom, DRILL_ALERTS, firing=False, since=restored, timeout=120)
    for name, t in cleared.items():
        print(f"{name} cleared {t:.1f}s after the extender was restored")
    node.rollout("deployment/scheduler-extender")


def test_every_dashboard_query_returns_series(prom: Prom, monitored: Node) -> None:
    dashboard = json.loads((MONITORING / "dashboards" / "vm-autoscaling.json").read_text())
    queries = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
    _wait_targets(prom, monitored)
    started = time.monotonic()
    empty: list[tuple[str, str]] = list(queries)

    def all_answer() -> bool:
        empty[:] = [(t, q) for t, q in empty if not prom.api("query", query=q)["result"]]
        return not empty

    try:
        wait_for(all_answer, timeout_seconds=60, what="every panel's query answered", interval=1)
    except AssertionError as e:
        raise AssertionError(f"dead panels: {empty}") from e
    print(f"{len(queries)} dashboard queries returned series"
          f" ({time.monotonic() - started:.1f}s after the targets were up)")  # fmt: skip
