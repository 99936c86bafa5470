"""A real Prometheus watching the tier's system, through manifests/monitoring, from the tier's
overlay on to its end.

``start`` applies the monitoring component as a user would (a kustomization that uses it),
then runs Debian's ``prometheus`` on the host with the shipped scrape jobs and rules:

- the extender is scraped with the token of the component's ServiceAccount (the Secret
  ``vm-autoscaling-scraper-token``), which the extender reviews and authorizes, the agents and
  the guests' node_exporter without one, as ``prometheus/scrape.yaml`` says;
- Debian builds Prometheus without Kubernetes discovery, so a thread lists the pods with that
  same token every scrape interval and writes what ``kubernetes_sd_configs`` would have found
  (``testkit/prometheus.py``); the relabelling that picks and labels the targets is the
  shipped one;
- the rules are the shipped ones with ``for`` divided by ``FOR_DIVISOR`` and their windows by
  ``WINDOW_DIVISOR``; Prometheus scrapes every 2 s (the guests every 10 s) and evaluates
  every second: the tier's overlay of the timing, never of the expressions. It runs at
  SCHED_IDLE: on this host it shares the CPUs with the nodes it watches.

It runs while the tier's drills run (the extender's leader deleted, its node stopped, it cut
off from the API server, VMs growing under load), so ``tests/node/test_monitoring.py``, run
last, reads from its record what they raised and what every dashboard panel drew.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testkit import prometheus
from testkit.controlplane import Api, ApiError, wait_for
from testkit.manifests import MONITORING, PROMETHEUS_FILES
from testkit.ports import free_port
from tests.node.harness import Node, Obj

NAMESPACE = "vm-autoscaling"
SCRAPER_SECRET = "vm-autoscaling-scraper-token"
# for: 1m -> 2 s, 2m -> 4 s, 5m -> 10 s: seconds where a cluster would wait minutes.
FOR_DIVISOR = 30
# [5m] -> [15s]: seven 2 s scrapes in every window; an alert on a rate clears 15 s after the
# last failure it counts.
WINDOW_DIVISOR = 20
SCRAPE_SECONDS = 2
GUESTS_JOB, GUESTS_SCRAPE = "vm-autoscaling-guests", "10s"
LEADING = "sum(vmautoscale_extender_leading)"
GAP_STEPS = 3


def binary() -> str | None:
    return shutil.which("prometheus")


@dataclass(frozen=True)
class Span:
    """A stretch of the record, in Unix seconds: ``end`` is the first instant it no longer
    held (None: it still holds at the end of the record)."""

    start: float
    end: float | None


def spans(timestamps: list[float], step: float, until: float) -> list[Span]:
    """The stretches covered by ``timestamps`` (a range query's sample times, ``step`` apart;
    a gap of up to ``GAP_STEPS`` steps, a rule evaluation late on a busy host, does not split
    one); one still covered at ``until`` (the query's end) has no end."""
    out: list[Span] = []
    times = sorted(timestamps)
    first = 0
    for i in range(1, len(times) + 1):
        if i == len(times) or times[i] - times[i - 1] > step * GAP_STEPS:
            last = times[i - 1]
            out.append(
                Span(times[first], None if until - last <= step * GAP_STEPS else last + step)
            )
            first = i
    return out


class Discovery:
    """What ``kubernetes_sd_configs`` does, with the scraper's token: list the pods every
    scrape interval and rewrite the targets files (only when they change)."""

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
        while not self._stop.wait(SCRAPE_SECONDS):
            try:
                self.refresh()
            except (ApiError, OSError) as e:  # the API server is busy: try again next second
                print(f"discovery: {e}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.api.close()


def scraper_token(node: Node) -> str:
    """The component's ServiceAccount token, once the token controller has written it."""

    def token() -> str | None:
        out = node.kubectl("-n", NAMESPACE, "get", "secret", SCRAPER_SECRET, "-o",
                           "jsonpath={.data.token}", check=False)  # fmt: skip
        return base64.b64decode(out.stdout).decode() if out.returncode == 0 and out.stdout else None

    found: str = wait_for(token, timeout_seconds=30, what="the scraper's token", interval=0.5)
    return found


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    work: Path
    discovery: Discovery
    started: float  # Unix seconds: the record begins here

    def api(self, path: str, **query: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def active(self) -> set[str]:
        """The alerts pending (their condition holds, their ``for`` not yet over) or firing."""
        return {a["labels"]["alertname"] for a in self.api("alerts")["alerts"]}

    def record(self, query: str, step: float = 1.0) -> list[Obj]:
        """``query`` over the whole record: every series, its (time, value) samples."""
        now = time.time()
        result: list[Obj] = self.api(
            "query_range", query=query, start=str(self.started), end=str(now), step=str(step)
        )["result"]
        return [
            {"metric": s["metric"], "values": [(float(t), float(v)) for t, v in s["values"]],
             "until": now}
            for s in result
        ]  # fmt: skip

    def drawn(self, query: str) -> int:
        """How many of ``query``'s series gave a number (not NaN) somewhere in the record:
        the lines a panel of it would have drawn over the run."""
        return sum(
            any(not math.isnan(v) for _, v in series["values"])
            for series in self.record(query, step=SCRAPE_SECONDS)
        )

    def stop(self) -> None:
        # Killed, not terminated: its record is read, and a clean shutdown (the head block
        # written out) took seconds for nothing.
        self.process.kill()
        self.process.wait()
        self.discovery.stop()


def _ready(p: Prometheus) -> bool:
    if p.process.poll() is not None:
        raise AssertionError(f"prometheus exited: {(p.work / 'prometheus.log').read_text()}")
    try:
        with urllib.request.urlopen(f"{p.url}/-/ready", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def start(node: Node, work: Path) -> Prometheus:
    """The component applied, Prometheus scraping through it, once it answers."""
    use = work / "use"
    use.mkdir()
    (use / "kustomization.yaml").write_text(
        yaml.safe_dump({"components": [os.path.relpath(MONITORING, use)]})
    )
    node.kubectl("apply", "-k", str(use))
    token = work / "token"
    token.write_text(scraper_token(node))
    shipped = prometheus.load(PROMETHEUS_FILES / "scrape.yaml")["scrape_configs"]
    jobs = prometheus.file_sd_jobs(shipped, work)
    for job in jobs:
        if "authorization" in job:  # the in-cluster token path, here the Secret's token
            job["authorization"]["credentials_file"] = str(token)
        if job["job_name"] == GUESTS_JOB:
            # The guest's node_exporter runs on the emulated CPU of a VM under load (the agent
            # scrapes it every second already); no panel reads it, one alert does.
            job["scrape_interval"], job["scrape_timeout"] = GUESTS_SCRAPE, GUESTS_SCRAPE
    rules = prometheus.scaled_rules(
        prometheus.load(PROMETHEUS_FILES / "rules.yaml"),
        for_divisor=FOR_DIVISOR,
        window_divisor=WINDOW_DIVISOR,
    )
    (work / "rules.yaml").write_text(yaml.safe_dump(rules))
    interval = f"{SCRAPE_SECONDS}s"
    config = {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": "1s",
        },
        "rule_files": [str(work / "rules.yaml")],
        "scrape_configs": jobs,
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    discovery = Discovery(node, token.read_text(), shipped, work)
    port = free_port()
    with (work / "prometheus.log").open("wb") as log:
        # A cluster's Prometheus runs elsewhere than the nodes it watches; here it shares the
        # 2-core host with them, so it takes only what they leave: SCHED_IDLE (any other
        # task that wakes preempts it; nice 19 would still outweigh the tier's system pods,
        # whose CPU requests the overlay sets to 0: cpu.shares 2), one Go thread.
        process = subprocess.Popen(
            ["chrt", "--idle", "0", str(binary()), f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "GOMAXPROCS": "1"},
        )  # fmt: skip
    p = Prometheus(f"http://127.0.0.1:{port}", process, work, discovery, time.time())
    try:
        wait_for(lambda: _ready(p), timeout_seconds=60, what="Prometheus ready", interval=0.5)
        # The record begins with the extenders scraped: before, every series is absent.
        wait_for(lambda: p.api("query", query=LEADING)["result"], timeout_seconds=60,
                 what="the extenders scraped", interval=0.5)  # fmt: skip
    except BaseException:
        p.stop()
        raise
    p.started = time.time()
    return p
