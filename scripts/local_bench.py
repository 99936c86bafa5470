"""Local run-bench: pgbench against PostgreSQL in a real QEMU VM that the real agent scales.

    scripts/run-bench.sh --local [--duration 90] [--clients 8] ...      (or run this file)
    VM_NAME=pg-vm-1 scripts/run-bench.sh --local                         (another VM pod)

Everything is real and local (docs/LOCAL.md): the ``postgres`` guest image (vm_image/README.md:
PostgreSQL 15 and node_exporter in a busybox initramfs; the guest fills a ``pgbench`` database
at boot) under ``vm_runner`` (QEMU, TCG) with its 5432 and 9100 forwarded to loopback ports,
``scheduler-extender serve --standalone examples/local/cluster.yaml`` and ``autoscaler-agent
--standalone``. pgbench runs on this machine against the forwarded port, so the transactions
run in the guest; the agent scales the VM from the *guest's* node_exporter only.

Phases: ``idle`` (``--warmup`` seconds at the minimum), then ``--bursts`` times (2): ``load``
(pgbench for ``--duration`` seconds) and ``cool`` (until the VM is back at its minimum and its
reservation released, at most ``--cooldown`` seconds). Two bursts show that the VM survives
growing again after a shrink (the hot-plug mode on QEMU 7.2 under TCG does not).

Each second one row goes to the terminal: the VM's vCPUs (QGA or QMP, by mode), vCPUs
online in the guest, permit, what the agent wants, the node's free CPU, pgbench tps and the
agent's stuck signal. At the end: ``OUT/bench.json`` (every sample and the verdict),
``OUT/bench.png`` (all of it on one time axis) and a verdict line: per burst grew to N in X s,
tps at each size, shrank in Y s; cycles survived (bursts that grew and shrank, QEMU alive);
decision-to-online latency p50/p99 (the agent's histogram), stuck or not. Exit status 3 when
the VM did not grow under a load, did not shrink back after it, or its QEMU died.

Shell: it drives processes and prints; the scaling decisions are the agent's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from testkit import bench as kit
from testkit.bench import BenchError
from testkit.bench_plot import HEADER, Sample, plot, row
from testkit.local_stack import (
    REPO,
    Agent,
    Extender,
    Guest,
    Samples,
    Service,
    VmPod,
    build_image,
    eventually,
    start_agent,
    start_extender,
    start_runner,
    wait_booted,
    write_agent_files,
)

EXAMPLES = REPO / "examples" / "local"


# What the postgres guest creates (vm_image/guest/postgres-guest) and fills at boot.
PGUSER = PGPASSWORD = "bench"
PGDATABASE = "pgbench"
IMAGE_SCALE = 5  # vm_image/postgres.py PGBENCH_SCALE


def pgbench_binary() -> str:
    found = shutil.which("pgbench")
    if found is None:
        raise BenchError("pgbench is not installed (scripts/setup installs postgresql-client)")
    return found


def pg_isready(port: int) -> bool:
    """The guest's PostgreSQL answers on the forwarded port (it listens only once filled)."""
    isready = shutil.which("pg_isready")
    if isready is None:
        raise BenchError("pg_isready is not installed (scripts/setup installs postgresql-client)")
    argv = [isready, "-q", "-h", "127.0.0.1", "-p", str(port), "-U", PGUSER, "-d", PGDATABASE]
    return subprocess.run(argv, timeout=20, check=False).returncode == 0


def pg_env() -> dict[str, str]:
    return {**os.environ, "PGPASSWORD": PGPASSWORD}


# -- pgbench progress --------------------------------------------------------------------------

_PROGRESS = re.compile(r"progress: ([\d.]+) s, ([\d.]+) tps")


class PgbenchProgress:
    """Reads ``pgbench -P 1`` lines from its stderr in a thread; ``tps`` is the latest."""

    def __init__(self, process: subprocess.Popen[str], log_path: Path) -> None:
        self.tps: float | None = None
        self.summary: dict[str, float] = {}
        self._process = process
        self._log = log_path.open("w")
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._log.write(line)
            self._log.flush()
            if match := _PROGRESS.search(line):
                self.tps = float(match.group(2))
            elif line.startswith("tps = "):
                self.summary["tps"] = float(line.split()[2])
            elif line.startswith("number of transactions actually processed"):
                self.summary["transactions"] = float(line.split(":")[1].split("/")[0])

    def finish(self) -> None:
        self._thread.join(timeout=10)
        self._log.close()


# -- sampling, table, plot ---------------------------------------------------------------------


def take_sample(
    t: float, phase: str, *, burst: int, guest: Guest, extender: Extender, agent: Agent,
    vm: VmPod, tps: float | None,
) -> Sample:  # fmt: skip
    def attempt(read: Any) -> Any:
        try:
            return read()
        except (OSError, ValueError, KeyError, StopIteration):
            return None  # one missed reading is a gap in the table, not a reason to stop

    before = attempt(lambda: extender.reserved_millis(vm) / 1000)
    metrics: Samples = {}
    if guest.vcpu_mode == "online":
        metrics = attempt(agent.metrics) or {}
        current = agent.gauge(metrics, "current_vcpus")
        vcpus = None if current is None else int(current)
    else:
        vcpus = attempt(guest.query_vcpus)
    after = attempt(lambda: extender.reserved_millis(vm) / 1000)
    free = attempt(lambda: extender.node(vm.node)["free"]["cpuMillis"] / 1000)
    metrics = metrics or attempt(agent.metrics) or {}
    return Sample(
        t=round(t, 2),
        phase=phase,
        burst=burst,
        vcpus=vcpus,
        # The agent's reading of the guest's node_exporter: a second scraper would take guest
        # CPU from the workload (and from the agent's own scrapes) under TCG.
        online=agent.gauge(metrics, "online_vcpus"),
        reserved_before=before,
        reserved_after=after,
        agent_desired=agent.gauge(metrics, "desired_vcpus"),
        node_free_cpu=free,
        tps=tps,
        stuck=agent.gauge(metrics, "stuck"),
    )


# -- the verdict -------------------------------------------------------------------------------


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative ``(le, count)`` buckets; None if empty.

    Linear inside the bucket the quantile falls in; the ``+Inf`` bucket answers with the
    highest finite bound (as Prometheus does).
    """
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def latency_buckets(metrics: Samples) -> list[tuple[float, float]]:
    return [
        (float(labels["le"]), v)
        for labels, v in metrics.get("vmautoscale_agent_grow_to_online_seconds_bucket", [])
    ]


@dataclass(frozen=True)
class Burst:
    """One pgbench load and the cool-down after it."""

    grew_to: int | None  # peak vCPUs during the load, if above the minimum
    grow_seconds: float | None  # load start -> the peak plugged and online
    tps_by_vcpus: dict[int, float]  # mean tps during the load, by vCPUs online in the guest
    shrink_seconds: float | None  # load end -> back at the minimum, permit released

    @property
    def is_cycle(self) -> bool:
        return self.grew_to is not None and self.shrink_seconds is not None

    def part(self) -> str:
        def sec(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}s"

        tps = ", ".join(f"{n}: {t:.0f}" for n, t in sorted(self.tps_by_vcpus.items()))
        sizes = sorted(self.tps_by_vcpus)
        rise = (
            f"tps {self.tps_by_vcpus[sizes[0]]:.0f}->{self.tps_by_vcpus[sizes[-1]]:.0f}"
            if sizes else "tps -"
        )  # fmt: skip
        grew = (
            f"grew to {self.grew_to} in {sec(self.grow_seconds)}"
            if self.grew_to is not None else "DID NOT GROW"
        )  # fmt: skip
        shrank = (
            f"shrank in {sec(self.shrink_seconds)}"
            if self.shrink_seconds is not None else "DID NOT SHRINK"
        )  # fmt: skip
        return f"{grew}, {rise} (by vCPUs online {{{tps}}}), {shrank}"


@dataclass(frozen=True)
class Verdict:
    bursts: list[Burst]
    bursts_planned: int
    is_vm_alive: bool  # QEMU (the runner) still ran at the end
    latency_p50: float | None
    latency_p99: float | None
    latency_count: int
    stuck_seconds: int  # samples (about one a second) in which the agent said "stuck"

    @property
    def cycles_survived(self) -> int:
        """Bursts in a row, from the first, that grew and shrank back with QEMU alive."""
        count = 0
        for burst in self.bursts:
            if not burst.is_cycle:
                break
            count += 1
        return count if self.is_vm_alive else min(count, len(self.bursts) - 1)

    @property
    def ok(self) -> bool:
        return self.is_vm_alive and self.cycles_survived == self.bursts_planned

    def line(self, vm: str) -> str:
        def sec(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}s"

        parts = "; ".join(
            f"burst {i}: {b.part()}" if len(self.bursts) > 1 else b.part()
            for i, b in enumerate(self.bursts, 1)
        )
        died = "" if self.is_vm_alive else ", QEMU DIED"
        return (
            f"{vm}: {parts}; cycles survived {self.cycles_survived}/{self.bursts_planned}{died};"
            f" decision->online p50 {sec(self.latency_p50)} p99 {sec(self.latency_p99)}"
            f" (n={self.latency_count}); stuck {self.stuck_seconds}s"
        )


def judge_burst(
    samples: list[Sample], *, min_vcpus: int, load_started: float, load_ended: float
) -> Burst:
    """One burst, from its samples (its load and the cool-down after it)."""
    during = [s for s in samples if s.phase == "load"]
    after = [s for s in samples if s.phase == "cool"]
    peak = max((s.vcpus for s in during if s.vcpus is not None), default=min_vcpus)
    grew_to = peak if peak > min_vcpus else None
    grow_seconds = next(
        (s.t - load_started for s in during if s.vcpus == peak and (s.online or 0) >= peak),
        None,
    )
    by_size: dict[int, list[float]] = {}
    for s in during:
        if s.online is not None and s.tps is not None:
            by_size.setdefault(int(s.online), []).append(s.tps)
    shrink_seconds = next(
        (
            s.t - load_ended
            for s in after
            if s.vcpus == min_vcpus and s.reserved_after == min_vcpus
        ),
        None,
    ) if grew_to is not None else None  # fmt: skip
    return Burst(
        grew_to=grew_to,
        grow_seconds=None if grew_to is None else grow_seconds,
        tps_by_vcpus={n: sum(v) / len(v) for n, v in sorted(by_size.items())},
        shrink_seconds=shrink_seconds,
    )


def judge(
    samples: list[Sample], *, min_vcpus: int, loads: list[tuple[float, float]],
    bursts_planned: int, is_vm_alive: bool, latency: list[tuple[float, float]],
) -> Verdict:  # fmt: skip
    """What the run showed, from its samples, the (start, end) of each load and the agent's
    grow latency histogram."""
    bursts = [
        judge_burst(
            [s for s in samples if s.burst == i],
            min_vcpus=min_vcpus,
            load_started=started,
            load_ended=ended,
        )
        for i, (started, ended) in enumerate(loads, 1)
    ]
    total = max((c for b, c in latency if b == float("inf")), default=0.0)
    return Verdict(
        bursts=bursts,
        bursts_planned=bursts_planned,
        is_vm_alive=is_vm_alive,
        latency_p50=histogram_quantile(latency, 0.5),
        latency_p99=histogram_quantile(latency, 0.99),
        latency_count=int(total),
        stuck_seconds=sum(1 for s in samples if s.stuck),
    )


# -- main --------------------------------------------------------------------------------------


def pick_vm(cluster: dict[str, Any], name: str) -> VmPod:
    """The VM pod VM_NAME names in the cluster file (labelled as a VM, placed on a node)."""
    vms = [
        p for p in cluster.get("pods", [])
        if p.get("labels", {}).get("vm-autoscaling.io/vm") == "true" and p.get("node")
    ]  # fmt: skip
    for pod in vms:
        if pod["name"] == name:
            notes = pod.get("annotations", {})
            return VmPod(
                name=pod["name"],
                namespace=pod.get("namespace", "default"),
                uid=pod["uid"],
                node=pod["node"],
                min_vcpus=int(notes.get("vm-autoscaling.io/min-vcpus", "1")),
                max_vcpus=int(notes.get("vm-autoscaling.io/max-vcpus", "4")),
                memory=pod.get("requests", {}).get("memory", "512Mi"),
            )
    names = ", ".join(p["name"] for p in vms) or "none"
    raise BenchError(f"VM_NAME={name}: no such VM pod on a node in the cluster file ({names})")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="run-bench.sh --local",
        description="pgbench against PostgreSQL in a real QEMU VM while the real agent scales it"
        " (docs/LOCAL.md). VM_NAME (environment) picks the VM pod; default pg-vm-0."
        " Exit status: 0 the VM grew and shrank back after every burst; 1 a tool or process"
        " failed; 3 the VM did not grow under a load, did not shrink back after it, or its"
        " QEMU died.",
    )
    p.add_argument("--duration", type=float, default=90, help="seconds of each pgbench load (90)")
    p.add_argument(
        "--bursts", type=_positive_int, default=2,
        help="pgbench loads, each followed by the cool-down: 2 shows the VM growing again"
        " after a shrink (2)",
    )  # fmt: skip
    p.add_argument("--clients", type=int, default=8, help="pgbench clients and threads (8)")
    p.add_argument(
        "--scale", type=int, default=IMAGE_SCALE,
        help=f"pgbench scale factor; the guest fills {IMAGE_SCALE} at boot, another value"
        f" re-initialises from this machine first (slow under TCG) ({IMAGE_SCALE})",
    )  # fmt: skip
    p.add_argument(
        "--builtin", default="select-only",
        help="pgbench built-in script (-b): select-only is CPU-bound in the guest, so its tps"
        " follows the vCPUs; tpcb-like mostly waits on row locks at this scale (select-only)",
    )  # fmt: skip
    p.add_argument("--warmup", type=float, default=10, help="idle seconds before the load (10)")
    p.add_argument(
        "--cooldown", type=float, default=120,
        help="at most this many seconds after the load for the VM to shrink back (120)",
    )  # fmt: skip
    p.add_argument(
        "--boot-timeout", type=float, default=300,
        help="seconds to wait for the guest's PostgreSQL to accept connections (300)",
    )  # fmt: skip
    p.add_argument(
        "--cluster", type=Path, default=EXAMPLES / "cluster.yaml",
        help="standalone cluster file: the node and the VM pods; VM_NAME picks one of them"
        " (examples/local/cluster.yaml)",
    )  # fmt: skip
    p.add_argument(
        "--extender-config", type=Path, default=EXAMPLES / "extender.yaml",
        help="scheduler-extender config; the bench fills in free listen ports and needs"
        " auth.mode static (examples/local/extender.yaml)",
    )  # fmt: skip
    p.add_argument(
        "--agent-config", type=Path, default=EXAMPLES / "agent.yaml",
        help="autoscaler-agent config; the bench fills in the extender URL, token, socket root"
        " and HTTP port"
        " (examples/local/agent.yaml)",
    )  # fmt: skip
    p.add_argument("--accel", default="tcg", help="vm_runner --accel (tcg; see vm_runner/README)")
    p.add_argument(
        "--vcpu-mode", choices=("online", "hotplug"), default="online",
        help="vm_runner --vcpu-mode: online (vCPUs present from boot, onlined in the guest"
        " through qemu-guest-agent; survives repeated cycles) or hotplug (QMP device_add; on"
        " QEMU 7.2 under TCG a grow after a shrink kills QEMU) (online)",
    )  # fmt: skip
    p.add_argument(
        "--out", type=Path, default=REPO / "out" / "local-bench",
        help="directory for bench.json, bench.png and every process's log (out/local-bench)",
    )  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no live table")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    cluster = yaml.safe_load(args.cluster.read_text())
    vm = pick_vm(cluster, os.environ.get("VM_NAME") or "pg-vm-0")
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="vm-bench-"))
    # The other VM pods stay out (examples/local/cluster.yaml says why); other pods stay in.
    cluster["pods"] = [
        p for p in cluster.get("pods", [])
        if p["name"] == vm.name or p.get("labels", {}).get("vm-autoscaling.io/vm") != "true"
    ]  # fmt: skip
    cluster_file = workdir / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(cluster, sort_keys=False))
    services: list[Service] = []

    def say(message: str) -> None:
        print(f"==> {message}", file=sys.stderr, flush=True)

    try:
        pgbench = pgbench_binary()
        say("building the postgres guest image (cached; about a minute the first time)")
        started = time.monotonic()
        image = build_image("postgres")
        say(f"booting {vm.key} (QEMU {args.accel}, {vm.min_vcpus}..{vm.max_vcpus} vCPUs,"
            f" {vm.memory}); the guest initialises PostgreSQL in RAM")  # fmt: skip
        guest = start_runner(
            image, workdir, min_vcpus=vm.min_vcpus, max_vcpus=vm.max_vcpus, memory=vm.memory,
            accel=args.accel, postgres=True, vcpu_mode=args.vcpu_mode,
        )  # fmt: skip
        services.append(guest.runner)
        assert guest.postgres_port is not None
        port = guest.postgres_port
        wait_booted(guest)
        try:
            eventually(lambda: pg_isready(port), bool, timeout_seconds=args.boot_timeout,
                       interval_seconds=1.0, what="PostgreSQL in the guest",
                       alive=[guest.runner])  # fmt: skip
        except AssertionError as e:
            raise BenchError(
                f"the guest's PostgreSQL did not accept connections within {args.boot_timeout:.0f}s"
                f" (--boot-timeout); the guest logs it to /var/log/postgres.log and its kernel"
                f" log ({e})"
            ) from e
        say(f"PostgreSQL in the guest is ready on 127.0.0.1:{port},"
            f" {time.monotonic() - started:.0f}s after the build started")  # fmt: skip
        if args.scale != IMAGE_SCALE:
            say(f"pgbench -i -s {args.scale} (from this machine, into the guest)")
            init = subprocess.run(
                [pgbench, "-i", "-q", "-s", str(args.scale), "-h", "127.0.0.1", "-p", str(port),
                 "-U", PGUSER, PGDATABASE],
                capture_output=True, text=True, timeout=1800, check=False, env=pg_env(),
            )  # fmt: skip
            if init.returncode != 0:
                raise BenchError(f"pgbench -i failed:\n{init.stderr}")
        extender = start_extender(
            workdir, cluster_file, base_config=yaml.safe_load(args.extender_config.read_text())
        )
        services.append(extender.service)
        config, vms, http_port = write_agent_files(
            workdir, vm, extender=extender, qmp_socket=guest.qmp_socket,
            hypervisor_url=guest.hypervisor_url, metrics_url=guest.metrics_url,
            base_config=yaml.safe_load(args.agent_config.read_text()),
        )  # fmt: skip
        agent = start_agent(workdir, vm, config=config, vms=vms, port=http_port)
        services.append(agent.service)
        say(f"agent and extender up; the agent scales {vm.key} from the guest's node_exporter")
        result = measure(args, vm=vm, guest=guest, extender=extender, agent=agent,
                         pgbench=pgbench, out=out)  # fmt: skip
    finally:
        for service in reversed(services):
            service.stop(timeout_seconds=30 if service.name == "runner" else 10)
        for log in workdir.glob("*.log"):
            with contextlib.suppress(OSError):
                shutil.copy(log, out / log.name)
        shutil.rmtree(workdir, ignore_errors=True)
    return result


class VmDied(Exception):
    """QEMU (the runner) exited during the run: the verdict says so."""


def measure(
    args: argparse.Namespace, *, vm: VmPod, guest: Guest, extender: Extender, agent: Agent,
    pgbench: str, out: Path,
) -> dict[str, Any]:  # fmt: skip
    samples: list[Sample] = []
    started = time.monotonic()
    alive = [extender.service, agent.service]

    def tick(phase: str, burst: int, tps: float | None) -> Sample:
        if not guest.runner.is_running():
            raise VmDied(f"the VM's QEMU exited; its log ends:\n{guest.runner.log_tail()}")
        for service in alive:
            if not service.is_running():
                raise BenchError(f"{service.name} exited; its log ends:\n{service.log_tail()}")
        s = take_sample(time.monotonic() - started, phase, burst=burst, guest=guest,
                        extender=extender, agent=agent, vm=vm, tps=tps)  # fmt: skip
        samples.append(s)
        if not args.quiet:
            print(row(s), flush=True)
        return s

    def every_second(until: float) -> Iterator[float]:
        while (now := time.monotonic()) < until:
            yield now
            time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))

    def one_burst(burst: int) -> None:
        """pgbench, then the cool-down; sets ``loads[-1]`` to (load start, load end)."""
        assert guest.postgres_port is not None
        bench = subprocess.Popen(
            [pgbench, "-h", "127.0.0.1", "-p", str(guest.postgres_port), "-U", PGUSER, "-c",
             str(args.clients), "-j", str(args.clients), "-T", str(int(args.duration)), "-P",
             "1", "-b", args.builtin, "--no-vacuum", PGDATABASE],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=pg_env(),
        )  # fmt: skip
        log_name = "pgbench.log" if burst == 1 else f"pgbench-{burst}.log"
        progress = PgbenchProgress(bench, out / log_name)
        load_started = time.monotonic() - started
        try:
            for _ in every_second(time.monotonic() + args.duration + 60):
                if bench.poll() is not None:
                    break
                tick("load", burst, progress.tps)
        finally:
            if bench.poll() is None:
                bench.terminate()
            bench.wait(30)
            progress.finish()
        load_ended = time.monotonic() - started
        loads[-1] = (load_started, load_ended)
        summaries.append(progress.summary)
        if bench.returncode != 0 and guest.runner.is_running():
            raise BenchError(f"pgbench exited with {bench.returncode}; see {out / log_name}")
        has_grown = any((s.vcpus or 0) > vm.min_vcpus for s in samples if s.burst == burst)
        for _ in every_second(time.monotonic() + args.cooldown):
            s = tick("cool", burst, None)
            has_grown = has_grown or (s.vcpus or 0) > vm.min_vcpus
            # Back at the minimum, vCPUs and permit: nothing more to watch. (A VM that never
            # grew is watched for the whole cooldown: a late grow is something to see too.)
            if has_grown and s.vcpus == vm.min_vcpus and s.reserved_after == vm.min_vcpus:
                break

    if not args.quiet:
        print(HEADER, flush=True)
    loads: list[tuple[float, float]] = []
    summaries: list[dict[str, float]] = []
    is_vm_alive = True
    try:
        for _ in every_second(time.monotonic() + args.warmup):
            tick("idle", 0, None)
        for burst in range(1, args.bursts + 1):
            # Appended before it runs (and completed once its load ends): a burst QEMU died in
            # is judged too, as not survived.
            now = time.monotonic() - started
            loads.append((now, now))
            one_burst(burst)
    except VmDied as e:
        is_vm_alive = False
        print(f"==> {e}", file=sys.stderr, flush=True)
    plot_path = out / "bench.png"
    plot(samples, plot_path, vm=vm.key, vcpu_mode=guest.vcpu_mode)
    try:
        latency = latency_buckets(agent.metrics())
    except (OSError, ValueError):
        latency = []
    verdict = judge(samples, min_vcpus=vm.min_vcpus, loads=loads, bursts_planned=args.bursts,
                    is_vm_alive=is_vm_alive, latency=latency)  # fmt: skip
    result = {
        "vm": vm.key,
        "vcpu_mode": guest.vcpu_mode,
        "min_vcpus": vm.min_vcpus,
        "max_vcpus": vm.max_vcpus,
        "loads_seconds": [[round(a, 2), round(b, 2)] for a, b in loads],
        "pgbench": {
            "clients": args.clients,
            "scale": args.scale,
            "builtin": args.builtin,
            "bursts": summaries,
        },
        "verdict": {
            **asdict(verdict),
            "cycles_survived": verdict.cycles_survived,
            "ok": verdict.ok,
            "line": verdict.line(vm.key),
        },
        "plot": str(plot_path),
        "samples": [asdict(s) for s in samples],
    }
    (out / "bench.json").write_text(kit.to_json(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    """Exit statuses: 3 for a run whose verdict failed; otherwise as every benchmark's
    (``testkit.bench.main``)."""
    args = parse_args(argv)
    result = run(args)
    print(f"==> plot {result['plot']}, samples {Path(result['plot']).with_name('bench.json')}",
          file=sys.stderr)  # fmt: skip
    print(f"==> {result['verdict']['line']}", file=sys.stderr)
    return 0 if result["verdict"]["ok"] else 3


if __name__ == "__main__":
    kit.main(main, name="run-bench --local")
