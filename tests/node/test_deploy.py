"""The deployment users run, on a real node, through docs/DEPLOY.md's own commands.

In order, on one node: ``kubectl apply -k manifests/`` (extender + its kube-scheduler, agent
DaemonSet, vm-controller Ready); ``kubectl apply -k manifests/examples`` (the PostgreSQL
VirtualMachine, its pod made by the vm-controller, placed by vm-scheduler through the
extender, QEMU in the vm-runner image, Guaranteed); then
``scripts/run-bench.sh`` in its cluster mode: the VM grows under pgbench and shrinks after, and
the container's cgroup (read from /sys/fs/cgroup, not the API) follows every permit.

Then memory: the example VM's ``max-memory`` is above its ``min-memory``; PostgreSQL sessions
in the guest take memory and give it back, the VM grows and shrinks live, and the guest is
never given memory the container's cgroup limit (read from /sys/fs/cgroup) has no room for.
Last, ``kubectl get vm``: the status the vm-controller wrote agrees with the pod.

The one departure from what a user applies: before scaling, the tier re-applies
``manifests/`` through its overlay (``tests/node/overlay.py``: room to grow on a 2-CPU node,
which an operator of a node this small needs too, and shorter shrink windows).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
import yaml

from protocol import annotations as ann
from protocol.quantity import cpu_millis, format_memory, memory_bytes
from protocol.virtualmachine import VirtualMachine
from testkit.controlplane import wait_for
from testkit.ports import free_port
from tests.node.harness import VM, Node, Obj, container_cgroup, wait_postgres
from tests.node.images import PGBENCH_IMAGE
from vm_controller import decide

ROOT = Path(__file__).resolve().parents[2]
CFS_PERIOD_US = 100_000

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_system_comes_up_with_kubectl_apply(deployed: Node) -> None:
    ds = deployed.kubectl(
        "-n", "vm-autoscaling", "get", "ds/autoscaler-agent", "-o", "jsonpath={.status.numberReady}"
    ).stdout
    assert ds == str(len(deployed.members))
    extenders = deployed.kubectl(
        "-n", "vm-autoscaling", "get", "pods", "-l", "app.kubernetes.io/name=scheduler-extender",
        "-o", "jsonpath={.items[*].spec.nodeName}",
    ).stdout.split()  # fmt: skip
    # Required anti-affinity met: a replica per node, neither Pending.
    assert len(extenders) == 2 and len(set(extenders)) == 2, extenders
    print(f"scheduler-extender replicas on {extenders}")
    # And the vm-controller, Ready once its watches (VMs, pods, Services) have listed.
    deployed.rollout("deployment/vm-controller")
    print(f"apply -k manifests/ to Ready: {deployed.timings['apply -k manifests/ to Ready']:.1f}s")


def test_example_vm_is_placed_by_the_extender_and_guaranteed(deployed: Node, vm: Obj) -> None:
    assert vm["spec"]["nodeName"] in deployed.members
    assert vm["status"]["qosClass"] == "Guaranteed"
    events = deployed.kubectl(
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        f"involvedObject.name={VM},reason=Scheduled",
        "-o",
        "jsonpath={.items[*].reportingComponent}",
    ).stdout
    assert "vm-scheduler" in events
    # QEMU runs in the vm container's cgroup, under TCG. The container counts as running as
    # soon as the runner (Python) starts, before it has spawned QEMU: wait for QEMU to appear.
    procs = container_cgroup(vm, "cpu") / "cgroup.procs"

    def cmdlines() -> list[str]:
        out = []
        for pid in procs.read_text().split():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except FileNotFoundError:  # gone since the cgroup was read
                continue
        return out

    def qemu() -> list[str]:
        return [c for c in cmdlines() if "qemu-system-x86_64" in c]

    try:
        found: list[str] = wait_for(qemu, timeout_seconds=60, what="QEMU in the vm container")
    except AssertionError as e:
        raise AssertionError(f"{e}: the container runs {cmdlines()}") from None
    assert "tcg" in found[0], found


# How often the VM container's cgroup limits are read: a change is seen at most this late.
CGROUP_POLL_SECONDS = 0.01


def cores(quota_us: int) -> float:
    return quota_us / CFS_PERIOD_US if quota_us > 0 else 0.0


@dataclass
class CgroupWatch:
    """Samples one of the VM container's cgroup files (an integer) every
    ``CGROUP_POLL_SECONDS``: (time, ``convert(value)``) at each change, -1 when unreadable.
    A sample's time is when the read that saw it began; ``reads`` keeps every read's."""

    file: Path
    convert: Callable[[int], float] = float
    samples: list[tuple[float, float]] = field(default_factory=list)
    reads: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.time()
            try:
                value = self.convert(int(self.file.read_text()))
            except (OSError, ValueError):
                value = -1
            self.reads.append(began)
            if not self.samples or self.samples[-1][1] != value:
                self.samples.append((began, value))
            self.stop.wait(CGROUP_POLL_SECONDS)

    def _seen_at(self, read: float) -> float:
        return [v for u, v in self.samples if u <= read][-1]

    def seen_after(self, t: float) -> float:
        """What the first read begun at or after ``t`` saw (the last value if none was): the
        file held it at some time after ``t``, however late this thread ran."""
        later = self.reads[bisect.bisect_left(self.reads, t) :]
        return self._seen_at(later[0]) if later else self.samples[-1][1]

    def most_during(self, a: float, b: float) -> float:
        """The largest value the file may have held at some time in ``[a, b]``: what the reads
        in it saw, and those just before and after it (each may have held through an end)."""
        first = max(0, bisect.bisect_right(self.reads, a) - 1)
        last = bisect.bisect_left(self.reads, b) + 1
        return max(self._seen_at(r) for r in self.reads[first:last])


@dataclass
class SpecWatch:
    """Samples the VM pod's CPU limit (spec, and as the kubelet reports it applied) and its
    permitted-vcpus annotation every 0.5 s: (time, values) at each change."""

    node: Node
    samples: list[tuple[float, tuple[str, str, str]]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        api = self.node.admin()
        try:
            while not self.stop.is_set():
                pod = api.pod("default", VM)
                (c,) = [c for c in pod["spec"]["containers"] if c["name"] == "vm"]
                (st,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == "vm"]
                now = (
                    c["resources"]["limits"]["cpu"],
                    st.get("resources", {}).get("limits", {}).get("cpu", "?"),
                    pod["metadata"]["annotations"].get("vm-autoscaling.io/permitted-vcpus", "-"),
                )
                if not self.samples or self.samples[-1][1] != now:
                    self.samples.append((time.time(), now))
                self.stop.wait(0.5)
        finally:
            api.close()


def cfs_counters(vm: Obj) -> tuple[int, int]:
    """The VM container's (nr_periods, nr_throttled), from its cgroup's cpu.stat."""
    text = (container_cgroup(vm, "cpu") / "cpu.stat").read_text()
    stat = dict(line.split() for line in text.splitlines())
    return int(stat["nr_periods"]), int(stat["nr_throttled"])


@dataclass
class ThrottleWatch:
    """Samples the VM container's CFS counters every ``THROTTLE_POLL_SECONDS``: (time,
    nr_periods, nr_throttled), the test's own reading of what the agent reads."""

    vm: Obj
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError, ValueError, KeyError):
                self.samples.append((time.time(), *cfs_counters(self.vm)))
            self.stop.wait(THROTTLE_POLL_SECONDS)

    def throttled_before(self, t: float, seconds: float) -> float | None:
        """The share of CFS periods the container was throttled in over ``seconds`` before
        ``t`` (0 if it ran in none: nothing to throttle), or None if too few samples cover it."""
        inside = [s for s in self.samples if t - seconds <= s[0] <= t]
        if len(inside) < 2:
            return None
        if inside[-1][1] == inside[0][1]:
            return 0.0
        return (inside[-1][2] - inside[0][2]) / (inside[-1][1] - inside[0][1])


THROTTLE_POLL_SECONDS = 0.1


# Load for the VM held at its quota: run-bench's defaults (8 clients, select-only), from the
# host's pgbench; long enough for the grow window and several permit retries (5 s apart).
HELD_LOAD_SECONDS = 25


def test_a_vm_held_at_its_quota_under_load_keeps_asking(deployed: Node, vm: Obj) -> None:
    """``manifests/`` as users apply them leave the example VM no room to grow on a 2-CPU node
    (the system pods' requests and the extender's reserve, tests/node/overlay.py): under load
    its container sits at its 1-core quota, throttled, and its guest reads less busy, not more.
    The agent sees the throttling and keeps asking for more, every permit retry, with no
    scrape in between that holds. Runs before the tier's overlay gives the VM room."""
    ip, node = vm["status"]["podIP"], vm["spec"]["nodeName"]
    quota = CgroupWatch(container_cgroup(vm, "cpu") / "cpu.cfs_quota_us", cores)
    throttling = ThrottleWatch(vm)
    threads = [threading.Thread(target=w.run, daemon=True) for w in (quota, throttling)]
    for thread in threads:
        thread.start()
    wait_postgres(ip)

    def wants() -> int:
        goals = [e for e in deployed.agent_events(0, node) if e["event"] == "goal"]
        return int(goals[-1]["desired_vcpus"]) if goals else 0

    # Quiet first (the guest fills its database at boot): the agent wants its minimum.
    wait_for(lambda: wants() == 1, timeout_seconds=240, what="a quiet VM", interval=2)
    periods_before, throttled_before = cfs_counters(vm)
    started = time.time()
    bench = subprocess.run(
        ["pgbench", "-h", ip, "-U", "bench", "-c", "8", "-j", "8", "-T", str(HELD_LOAD_SECONDS),
         "-b", "select-only", "--no-vacuum", "pgbench"],
        env={**os.environ, "PGPASSWORD": "bench", "PGCONNECT_TIMEOUT": "10"},
        capture_output=True, text=True, timeout=HELD_LOAD_SECONDS + 120, check=False,
    )  # fmt: skip
    ended = time.time()
    periods_after, throttled_after = cfs_counters(vm)
    quota.stop.set()
    throttling.stop.set()
    for thread in threads:
        thread.join()
    throttled = (throttled_after - throttled_before) / max(1, periods_after - periods_before)
    events = deployed.agent_events(started - 1, node)
    goals = [e for e in events if e["event"] == "goal"]
    asks = [e for e in events if e["event"] == "permit_requested" and e["kind"] == "request"]
    answers = [e for e in events if e["event"] == "permit_answered"]
    for e in sorted(goals + asks + answers, key=lambda e: e["t"]):
        print(
            f"{e['t'] - started:6.1f}s {e['event']}",
            e.get("desired_vcpus", e.get("requested_vcpus", e.get("outcome"))),
            e.get("reason", e.get("extender_reason", ""))[:220],
        )
    print(f"throttled in {throttled:.0%} of the VM container's CFS periods under load")
    print(bench.stdout[-600:], bench.stderr[-600:])
    assert bench.returncode == 0, bench.stderr
    assert throttled >= 0.1, (periods_before, periods_after, throttled_before, throttled_after)
    # No room: the quota never moved, and no answer permitted more than the 1 vCPU it has.
    assert {c for _, c in quota.samples} == {1}, quota.samples
    assert answers and {a["permit_vcpus"] for a in answers} == {1}, answers
    # The agent saw the demand through the throttling and asked, again at each retry...
    during = [a for a in asks if a["t"] <= ended and a["requested_vcpus"] > 1]
    assert len(during) >= 3, asks
    assert any("held back: throttled" in a["reason"] for a in during), during
    # ... and no scrape from its first request to the last seconds of the load (pgbench winding
    # down) that saw the container throttled held it back to its size. A scrape that did not
    # may hold: when the host itself is busy, the container gets less than its quota, is not
    # throttled, and its guest is really less busy (seen: "busy 0.24 of 1 vCPUs, load1 0.41"
    # mid-load) -- more vCPUs would not help it. The test judges each hold by its own reading
    # of the container's counters over the two seconds before it (the agent's scrape interval
    # is one): throttled in half the periods or more is far past the agent's 10 %.
    first = during[0]["t"]
    holds = [g for g in goals if first < g["t"] <= ended - 2 and g["desired_vcpus"] == 1]
    judged = [(g, throttling.throttled_before(g["t"], 2.0)) for g in holds]
    for g, share in judged:
        print(f"hold at {g['t'] - started:.1f}s; throttled in {share} of the periods before")
    wrong = [g for g, share in judged if share is None or share >= 0.5]
    assert wrong == [], (wrong, goals)
    gaps = [round(b["t"] - a["t"], 1) for a, b in itertools.pairwise(during)]
    print(
        f"load -> first request {first - started:.1f}s; requests while loaded {len(during)}, "
        f"{gaps} s apart; none permitted; no hold in the {ended - 2 - first:.1f}s after the first"
    )


def test_run_bench_grows_the_vm_under_load_and_shrinks_it_after(
    tuned: Node, vm: Obj, tmp_path: Path
) -> None:
    deployed = tuned
    watch = CgroupWatch(container_cgroup(vm, "cpu") / "cpu.cfs_quota_us", cores)
    spec = SpecWatch(deployed)
    threads = [threading.Thread(target=w.run, daemon=True) for w in (watch, spec)]
    for thread in threads:
        thread.start()
    # The guest is busy while it fills its database at boot, and may grow for that: the
    # benchmark starts from a quiet VM at its minimum, so a growth is the load's doing.
    ip = vm["status"]["podIP"]
    wait_postgres(ip)
    wait_for(
        lambda: watch.samples and watch.samples[-1][1] == 1,
        timeout_seconds=180,
        what="the VM at its minimum before the load",
        interval=1,
    )
    env = {
        **deployed.kubectl_env(),
        "VM_NAME": VM,
        "PGBENCH_IMAGE": PGBENCH_IMAGE,
        # The VM grows ~9 s after run-bench starts (the pgbench pod's start, the agent's 3 s
        # grow window, the permit, the resize): 20 s of load sustain it well past that.
        "DURATION": os.environ.get("VMA_NODE_BENCH_SECONDS", "20"),
        "WATCH_INTERVAL": "2",
        "COOLDOWN": "120",
        "PG_WAIT": "300",
        "STATE_PORT": str(free_port()),
        "AGENT_PORT": str(free_port()),
        "OUT": str(tmp_path / "out"),
    }
    started = time.time()
    result = subprocess.run(
        [str(ROOT / "scripts" / "run-bench.sh")],
        env=env,
        text=True,
        capture_output=True,
        timeout=700,
        check=False,
    )
    watch.stop.set()
    spec.stop.set()
    for thread in threads:
        thread.join()
    print(result.stdout[-2500:], result.stderr[-1500:])
    quota = [(round(t - started, 1), c) for t, c in watch.samples]
    print("cgroup cpu quota (s since run-bench started, cores):", quota)
    print(
        "pod cpu limit: spec, applied, permitted-vcpus:",
        [(round(t - started, 1), v) for t, v in spec.samples],
    )
    extender_log = deployed.kubectl(
        "-n", "vm-autoscaling", "logs", "deploy/scheduler-extender", "-c", "extender", check=False
    ).stdout
    print(
        "\n".join(
            line[:300]
            for line in extender_log.splitlines()
            if '"event":"request"' not in line or "/v1/permits" in line
        )
    )
    events = deployed.agent_events(started, vm["spec"]["nodeName"])
    for e in events:
        if e["event"] in ("permit_answered", "grow_online", "vcpus_resized", "resize_started") or (
            e.get("level") in ("warning", "error")
        ):
            print(
                f"{e['t'] - started:7.1f}s",
                e["event"],
                e.get("outcome", ""),
                e.get("permit_vcpus", e.get("online_vcpus", e.get("after", ""))),
                e.get("decision_to_online_seconds", ""),
                e.get("error", ""),
            )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "grew to" in result.stderr and "shrank to" in result.stderr
    # The plot, as the local bench draws it, from the agent's and the extender's samples.
    assert f"==> plot {tmp_path / 'out' / 'bench.png'}" in result.stderr
    assert (tmp_path / "out" / "bench.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    drawn = json.loads((tmp_path / "out" / "bench.json").read_text())["samples"]
    assert max(s["vcpus"] or 0 for s in drawn) >= 2, drawn
    assert max(s["tps"] or 0 for s in drawn) > 0, drawn
    # Each permit the extender recorded on the pod (permitted-vcpus) reached the container's
    # cgroup: the kubelet applied the extender's resize.
    permits = [(t, int(v[2])) for t, v in spec.samples if v[2] != "-"]
    changes = [p for i, p in enumerate(permits) if i == 0 or p[1] != permits[i - 1][1]]
    assert max(v for _, v in changes) >= 2, changes
    for t, vcpus in changes:
        followed = [u for u, c in watch.samples if u >= t - 1 and c == vcpus]
        assert followed, (t, vcpus, watch.samples)
        print(f"permit {vcpus} -> cgroup quota {vcpus} cores in {followed[0] - t:+.2f}s")

    # The guest never runs more vCPUs than its container's quota: onlined after the cgroup
    # grew, offlined before it shrank.
    # Each event is checked against the quota the first read after it saw (a sampler running
    # late on a busy host cannot make the right order look wrong).
    cores_at = watch.seen_after
    online = [e for e in events if e["event"] == "grow_online"]
    assert online
    for e in online:
        assert cores_at(e["t"]) >= e["online_vcpus"], (e, watch.samples)
    for e in events:
        if e["event"] == "vcpus_resized":
            assert cores_at(e["t"]) >= e["after"], (e, watch.samples)
    print(
        f"run-bench start -> vCPUs online: {online[0]['t'] - started:.1f}s "
        f"(decision -> online {online[0]['decision_to_online_seconds']}s)"
    )
    assert watch.samples[-1][1] == 1, watch.samples


def example_vm_memory() -> tuple[int, int, int]:
    """(min-memory, max-memory, the container's memory as the vm-controller writes it) of the
    example VM."""
    doc = yaml.safe_load((ROOT / "manifests" / "examples" / "pg-vm.yaml").read_text())
    pod = decide.desired_pod(msgspec.convert(doc, VirtualMachine))
    spec = ann.parse_vm_spec(pod["metadata"]["annotations"], pod_memory_bytes=0)
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == "vm"]
    written = memory_bytes(c["resources"]["limits"]["memory"])
    return spec.min_memory_bytes, spec.max_memory_bytes, written


@dataclass
class GuestMemoryWatch:
    """Samples the guest's MemTotal and MemAvailable from its node_exporter every 0.25 s:
    MemTotal (time, bytes) at each change, the guest's own view of its memory (what it has
    onlined of what QEMU plugged); MemAvailable as last read, with when that read began."""

    url: str
    samples: list[tuple[float, float]] = field(default_factory=list)
    # For each sample: when the scrape that read it began and ended (the guest had that
    # MemTotal at some time between the two).
    read_at: list[tuple[float, float]] = field(default_factory=list)
    available: tuple[float, float] = (0.0, -1.0)  # (when the read began, bytes)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.time()
            try:
                with urllib.request.urlopen(self.url, timeout=2) as answer:
                    text = answer.read().decode()
                values = {
                    name: float(line.split()[1])
                    for line in text.splitlines()
                    for name in ("MemTotal", "MemAvailable")
                    if line.startswith(f"node_memory_{name}_bytes ")
                }
                total, self.available = values["MemTotal"], (began, values["MemAvailable"])
            except (OSError, ValueError, KeyError, IndexError):
                total = -1
            if total > 0 and (not self.samples or self.samples[-1][1] != total):
                self.samples.append((time.time(), total))
                self.read_at.append((began, self.samples[-1][0]))
            self.stop.wait(0.25)

    def has_room_after(self, t: float, room: float) -> bool:
        """Whether a read begun after ``t`` saw at least ``room`` bytes available."""
        began, available = self.available
        return began > t and available >= room


# Sessions in the guest's PostgreSQL, each holding this many MiB in a PL/pgSQL variable (the
# backend's own memory, anonymous, as a process's) until the test releases them all together.
# The guest is booted with 1Gi and PostgreSQL, its data and the image already use ~450 MiB of it:
# 10 x 64 MiB do not fit without growing. At most one a second (64 MiB/s), so the use rises as a
# trend the agent sees coming; and none into a guest with less than HOG_ROOM available, as read
# after the last session said it held its memory (each is briefly twice its size while
# PL/pgSQL copies the value in). That is the load the agent's growing lets in, whatever the
# host's speed: on a busy host the TCG guest, the agent and the kubelet all slow down, and a
# load paced by the host's clock alone (two a second, 128 MiB/s; once even one a second beside
# the rest of the test suite) outran a grow that must wait for the kubelet, and the guest's OOM
# killer took a backend. The race of load against grow is the subject of the guest tests
# (tests/e2e/test_memory_pressure.py); this drill checks the order of limit and plug on a real
# kubelet. An agent that never grows leaves the next session waiting: the test fails.
HOG_SESSIONS, HOG_MIB, HOG_EVERY_SECONDS, HOG_HOLD_SECONDS = 10, 64, 1.0, 3
HOG_ROOM = 3 * HOG_MIB * 2**20
HOG_HELD = "hog holds its memory"
MEMORY_UNIT = 128 * 2**20  # the example's (the default memory-unit)


def psql(ip: str, sql: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["psql", "-h", ip, "-U", "bench", "-d", "pgbench", "-v", "ON_ERROR_STOP=1", "-qc", sql],
        env={**os.environ, "PGPASSWORD": "bench", "PGCONNECT_TIMEOUT": "10"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def hog(ip: str) -> subprocess.Popen[str]:
    """A session that takes HOG_MIB, says so (a NOTICE, printed by psql as it comes), and holds
    it until a row appears in ``hog_release`` (each statement of the loop sees the rows
    committed before it)."""
    return psql(
        ip,
        f"DO $$ DECLARE hog text := repeat(repeat('x', 1048576), {HOG_MIB}); BEGIN "
        f"RAISE NOTICE '{HOG_HELD}'; "
        "LOOP EXIT WHEN EXISTS (SELECT FROM hog_release); PERFORM pg_sleep(0.2); END LOOP; "
        "END $$",
    )


def run_hogs(ip: str, guest: GuestMemoryWatch) -> list[str]:
    """HOG_SESSIONS sessions paced as said above, released HOG_HOLD_SECONDS after the last
    holds; their outputs, but for the NOTICE each printed once it held its memory."""
    setup = psql(
        ip,
        "SET client_min_messages = warning; "
        "DROP TABLE IF EXISTS hog_release; CREATE TABLE hog_release (t int)",
    )
    assert setup.communicate(timeout=60)[0] == ""
    sessions: list[subprocess.Popen[str]] = []
    for _ in range(HOG_SESSIONS):
        if sessions:
            assert sessions[-1].stdout is not None
            line = sessions[-1].stdout.readline()
            assert HOG_HELD in line, line
            held = time.time()
            wait_for(
                functools.partial(guest.has_room_after, held, HOG_ROOM),
                timeout_seconds=60,
                what=f"{HOG_ROOM >> 20} MiB available in the guest for the next session",
                interval=0.1,
            )
            time.sleep(max(0.0, HOG_EVERY_SECONDS - (time.time() - held)))
        sessions.append(hog(ip))
    assert sessions[-1].stdout is not None
    line = sessions[-1].stdout.readline()
    assert HOG_HELD in line, line
    time.sleep(HOG_HOLD_SECONDS)
    release = psql(ip, "INSERT INTO hog_release VALUES (1)")
    assert release.communicate(timeout=60)[0] == ""
    return [p.communicate(timeout=120)[0] for p in sessions]


def test_memory_grows_live_only_into_the_limit_the_kubelet_applied(tuned: Node, vm: Obj) -> None:
    """The example VM's memory grows under its guest's own use and shrinks after it; the guest
    is never given memory before the kubelet has raised the container's memory limit for it,
    and the limit never comes down before the guest has given the memory back."""
    deployed = tuned
    min_memory, max_memory, written = example_vm_memory()
    assert max_memory > min_memory
    overhead = written - min_memory  # QEMU's room above the guest (``memory-overhead``)
    ip = vm["status"]["podIP"]
    restarts = deployed.pod("default", VM)["status"]["containerStatuses"][0]["restartCount"]
    limit = CgroupWatch(container_cgroup(vm, "memory") / "memory.limit_in_bytes")
    guest = GuestMemoryWatch(f"http://{ip}:9100/metrics")
    threads = [threading.Thread(target=w.run, daemon=True) for w in (limit, guest)]
    for thread in threads:
        thread.start()
    wait_postgres(ip)
    wait_for(
        lambda: limit.samples and limit.samples[-1][1] == written,
        timeout_seconds=120,
        what="the VM container's memory limit at its minimum before the load",
        interval=0.5,
    )
    started = time.time()
    outputs = run_hogs(ip, guest)
    held = time.time()
    grown = max(v for _, v in limit.samples)
    # After the sessions, back to the minimum: the agent's shrink window, the unplug, the
    # extender's notice, the kubelet's resize. Back within a memory-unit of it: the guest may
    # keep a few virtio-mem blocks it cannot give back (kernel memory landed in them, see
    # vm_runner/cmdline.py); the agent then reports the size it really has, and the container
    # keeps room for exactly that.
    shrunk = True
    try:
        wait_for(
            lambda: limit.samples[-1][1] < written + MEMORY_UNIT,
            timeout_seconds=120,
            what="the VM container's memory limit back at its minimum",
            interval=0.5,
        )
    except AssertionError:
        shrunk = False
    limit.stop.set()
    guest.stop.set()
    for thread in threads:
        thread.join()
    events = [
        e for e in deployed.agent_events(started - 1, vm["spec"]["nodeName"])
        if e["event"].startswith("memory_") or e.get("level") in ("warning", "error")
    ]  # fmt: skip
    for e in events:
        print(f"{e['t'] - started:7.2f}s", json.dumps({k: v for k, v in e.items() if k != "t"}))
    print("cgroup memory limit (s, MiB):",
          [(round(t - started, 2), int(v) >> 20) for t, v in limit.samples])  # fmt: skip
    print("guest MemTotal (s, MiB):",
          [(round(t - started, 2), int(v) >> 20) for t, v in guest.samples])  # fmt: skip

    pod = deployed.pod("default", VM)
    assert pod["status"]["containerStatuses"][0]["restartCount"] == restarts  # no OOM kill
    recorded = ann.parse_memory_overhead(pod["metadata"]["annotations"])
    assert recorded == overhead, pod["metadata"]["annotations"]
    starts = [e for e in events if e["event"] == "memory_resize_started"]
    grows = [e for e in starts if e["to_bytes"] > e["from_bytes"]]
    assert grows, events
    assert grown > written, limit.samples
    # The guest is given memory (QMP starts plugging) only once the container's limit has room
    # for all of it on top of QEMU's own: the limit read first after the agent's start of the
    # resize already has it. (Each check below reads the samples so that a late-running sampler
    # on a busy host cannot make a correct order look wrong.)
    for e in grows:
        assert limit.seen_after(e["t"]) >= e["to_bytes"] + overhead, (e, limit.samples)
    # What the guest itself reports never outgrows the limit's room, at any time the guest may
    # have reported it.
    for (t, total), (began, ended) in zip(guest.samples, guest.read_at, strict=True):
        assert total + overhead <= limit.most_during(began, ended), (t, total, limit.samples)

    # The limit comes down only after the guest has given the memory back: at each decrease,
    # the most the guest can hold by then (a resize under way: the larger of its two ends; a
    # finished one: what the guest has) fits under it. A decrease may land in the middle of the
    # next shrink: the kubelet applies it late (it refuses to go below the usage it last
    # sampled, from before the unplug, and retries on a later sync).
    def most_plugged_at(t: float) -> int:
        resizes = [e for e in events if e["event"].startswith("memory_resize_") and e["t"] <= t]
        if not resizes:
            # None begun yet: the guest has the minimum it had before the load (the limit was
            # seen going 1536 -> 1664 -> 1536 MiB before the first plug, a permit's size applied
            # and then a later one: the kubelet's order, harmless while nothing is plugged).
            return min_memory
        last = resizes[-1]
        if last["event"] == "memory_resize_started":
            return int(max(last["from_bytes"], last["to_bytes"]))
        assert last["event"] in ("memory_resize_succeeded", "memory_resize_incomplete"), last
        return int(last["current_memory_bytes"])

    for (_, before), (t, after) in zip(limit.samples, limit.samples[1:], strict=False):
        if 0 < after < before:
            assert most_plugged_at(t) + overhead <= after, (t, after, events)
    # Every session held its memory and ended: no backend lost to the guest's OOM killer.
    assert all(o == "" for o in outputs), outputs
    for e in grows:
        raised = next(u for u, v in limit.samples if v >= e["to_bytes"] + overhead)
        done = [d for d in events if d["event"] == "memory_resize_succeeded" and d["t"] >= e["t"]]
        print(
            f"memory {e['from_bytes'] >> 20} -> {e['to_bytes'] >> 20} MiB: limit raised "
            f"{raised - started:.2f}s, plug started {e['t'] - raised:+.2f}s after it, plugged "
            f"{(done[0]['t'] - raised) if done else float('nan'):+.2f}s after it"
        )
    first = next(u for u, v in limit.samples if v > written)
    print(
        f"memory: sessions started -> limit raised {first - started:.1f}s; "
        f"peak {int(grown) >> 20} MiB (limit); load ended -> "
        + (f"limit back down {limit.samples[-1][0] - held:.1f}s" if shrunk else "NOT SHRUNK")
    )
    finished = ("memory_resize_succeeded", "memory_resize_incomplete")
    shrinks = [e for e in starts if e["to_bytes"] < e["from_bytes"]]
    for e in shrinks:
        end = next((d for d in events if d["event"] in finished and d["t"] >= e["t"]), None)
        if end is None:
            continue
        lowered = [
            u for u, v in limit.samples if u >= end["t"] and 0 < v < e["from_bytes"] + overhead
        ]
        print(
            f"memory {e['from_bytes'] >> 20} -> {end['current_memory_bytes'] >> 20} MiB "
            f"({end['event']}) in {end['t'] - e['t']:.2f}s; limit lowered "
            f"{(lowered[0] - end['t']) if lowered else float('nan'):+.2f}s after"
        )
    assert shrunk, limit.samples
    # The container keeps room for what the guest kept, no less.
    kept = [e for e in events if e["event"] in finished][-1]
    assert limit.samples[-1][1] == kept["current_memory_bytes"] + overhead, (kept, limit.samples)


# ``kubectl get vm``'s columns (the CRD's additionalPrinterColumns), the age left out.
VM_COLUMNS = ["NAME", "PHASE", "NODE", "POD", "VCPUS", "PERMITTED-VCPUS", "MEMORY",
              "PERMITTED-MEMORY", "AGE"]  # fmt: skip


def test_kubectl_get_vm_shows_the_running_vm_as_its_pod_has_it(tuned: Node, vm: Obj) -> None:
    """``kubectl get vm`` prints the VirtualMachine's status, which the vm-controller writes
    from its pod: the node it runs on, the vCPUs and memory its container has as the kubelet
    applied them (less QEMU's room, the extender's ``memory-overhead``), and what the extender
    last permitted (its ``permitted-*`` annotations). After the tests above, which grew and
    shrank the VM, so the permits are the extender's, not the VM's minimum."""
    deployed = tuned
    min_memory, _, written = example_vm_memory()

    def expected() -> list[str]:
        pod = deployed.pod("default", VM)
        notes = pod["metadata"]["annotations"]
        (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == "vm"]
        limits = status["resources"]["limits"]
        cpus = -(-cpu_millis(limits["cpu"]) // 1000)
        overhead = ann.parse_memory_overhead(notes) or written - min_memory
        current = memory_bytes(limits["memory"]) - overhead
        # Where the extender has recorded no permit (this test run alone), the VM's minimum.
        vcpus, memory = ann.parse_permitted(notes)
        vcpus = vcpus or int(notes[ann.MIN_VCPUS])
        memory = memory or min_memory
        node = pod["spec"]["nodeName"]
        return [VM, "Running", node, VM, str(cpus), str(vcpus), format_memory(current),
                format_memory(memory)]  # fmt: skip

    def shown() -> list[str]:
        out = deployed.kubectl("get", "vm", "-n", "default", VM).stdout.splitlines()
        assert out[0].split() == VM_COLUMNS, out
        return out[1].split()[: len(VM_COLUMNS) - 1]

    def agree() -> tuple[list[str], list[str]] | None:
        want, got = expected(), shown()
        return (want, got) if want == got else None

    try:
        _, got = wait_for(agree, timeout_seconds=30, what="kubectl get vm as the pod has it")
    except AssertionError as e:
        raise AssertionError(f"{e}: shows {shown()}, the pod says {expected()}") from None
    print(f"kubectl get vm: {got}")
    ready = deployed.kubectl(
        "get", "vm", "-n", "default", VM, "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
    ).stdout  # fmt: skip
    assert ready == "True"
