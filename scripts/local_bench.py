"""Local run-bench: pgbench on this machine while the real agent scales a real QEMU VM.

    scripts/run-bench.sh --local [--duration 60] [--clients 8] ...      (or run this file)
    VM_NAME=pg-vm-1 scripts/run-bench.sh --local                         (another VM pod)

Everything is real and local (docs/LOCAL.md): a PostgreSQL cluster initialised in a temporary
directory (as the ``postgres`` user when run as root: initdb refuses root), the host's
``prometheus-node-exporter`` on a loopback port, the minimal guest under ``vm_runner`` (QEMU,
TCG), ``scheduler-extender serve --standalone examples/local/cluster.yaml`` and
``autoscaler-agent --standalone``. The agent scales the VM from the *host's* node_exporter, where
pgbench and PostgreSQL put their load; the guest only has to be a VM that can be hot-plugged and
unplugged (vCPUs are read from QMP on the runner's control socket).

Phases: ``idle`` (``--warmup`` seconds), ``load`` (pgbench for ``--duration`` seconds), ``cool``
(until the VM is back at its minimum and its reservation released, at most ``--cooldown``
seconds). Each second one row goes to the terminal: VM vCPUs, permit, node free CPU, pgbench
tps and the host's load. At the end: ``OUT/bench.json`` (every sample) and ``OUT/bench.png``
(vCPUs over time with the load overlaid).

Shell: it drives processes and prints; the scaling decisions are the agent's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.local_stack import (
    REPO,
    Agent,
    Extender,
    Guest,
    Service,
    VmPod,
    build_minimal_image,
    eventually,
    free_port,
    scrape,
    spawn,
    start_agent,
    start_extender,
    start_runner,
    value,
    wait_booted,
    write_agent_files,
)

EXAMPLES = REPO / "examples" / "local"


class BenchError(Exception):
    """Something the bench needs is missing or broken; the message says what to do."""


# -- PostgreSQL --------------------------------------------------------------------------------


def postgres_bindir() -> Path:
    """Where initdb and postgres are: Debian keeps them off PATH, in /usr/lib/postgresql/N/bin."""
    versions = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if p.parent.name.isdigit()]
    newest_first = sorted(versions, key=lambda p: int(p.parent.name), reverse=True)
    on_path = [Path(d) for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    for directory in [*newest_first, *on_path]:
        if (directory / "initdb").is_file():
            return directory
    raise BenchError("PostgreSQL is not installed (scripts/setup installs it: apt postgresql)")


@dataclass
class Postgres:
    service: Service
    port: int
    datadir: Path


@contextlib.contextmanager
def postgres(workdir: Path) -> Iterator[Postgres]:
    """A throwaway cluster on 127.0.0.1:PORT; removed on exit.

    As root, initdb and postgres run as the ``postgres`` user (Debian's package creates it) in a
    directory it owns: initdb refuses to run as root. No systemd, no pg_ctlcluster: the
    postmaster is our child, so it cannot outlive the bench.
    """
    bindir = postgres_bindir()
    user = None
    # A directory of its own under the system temp dir: the bench's workdir is root's 0700.
    pgroot = Path(tempfile.mkdtemp(prefix="vm-bench-pg-"))
    if os.geteuid() == 0:
        user = "postgres"
        try:
            entry = pwd.getpwnam(user)
        except KeyError as e:
            raise BenchError("running as root needs the 'postgres' user (apt postgresql)") from e
        os.chown(pgroot, entry.pw_uid, entry.pw_gid)
    datadir = pgroot / "data"
    port = free_port()
    try:
        # --no-sync and fsync=off: a benchmark of CPU scaling, not of this machine's disk.
        init = subprocess.run(
            [str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust",
             "-E", "UTF8", "--no-sync"],
            capture_output=True, text=True, timeout=120, check=False, cwd=pgroot,
            user=user, group=None if user is None else pwd.getpwnam(user).pw_gid,
            extra_groups=None if user is None else [],
        )  # fmt: skip
        if init.returncode != 0:
            raise BenchError(f"initdb failed:\n{init.stdout}\n{init.stderr}")
        service = spawn(
            "postgres",
            [str(bindir / "postgres"), "-D", str(datadir), "-p", str(port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={pgroot}",
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "max_connections=64"],
            log_path=workdir / "postgres.log",
            user=user,
            cwd=pgroot,  # the checkout may be closed to the postgres user
        )  # fmt: skip
        service.stop_signal = signal.SIGINT  # fast shutdown: disconnect clients, stop
        pg = Postgres(service=service, port=port, datadir=datadir)
        try:
            eventually(
                lambda: pg_isready(bindir, port),
                bool,
                timeout_seconds=30,
                what="PostgreSQL accepting connections",
                alive=[service],
            )
            yield pg
        finally:
            service.stop(timeout_seconds=20)
    finally:
        shutil.rmtree(pgroot, ignore_errors=True)


def pg_isready(bindir: Path, port: int) -> bool:
    isready = shutil.which("pg_isready") or str(bindir / "pg_isready")
    argv = [isready, "-q", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
    return subprocess.run(argv, timeout=10, check=False).returncode == 0


def pgbench_binary() -> str:
    found = shutil.which("pgbench") or str(postgres_bindir() / "pgbench")
    if not Path(found).is_file():
        raise BenchError("pgbench is not installed (scripts/setup installs postgresql-client)")
    return found


# -- the host's node_exporter ------------------------------------------------------------------


def start_host_exporter(workdir: Path) -> tuple[Service, str]:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        raise BenchError("prometheus-node-exporter is not installed (scripts/setup installs it)")
    port = free_port()
    # Only what the agent reads (cpu, loadavg, stat, meminfo): a full page every second would
    # cost the host CPU the benchmark is about.
    service = spawn(
        "node_exporter",
        [binary, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
         "--collector.cpu", "--collector.loadavg", "--collector.stat", "--collector.meminfo"],
        log_path=workdir / "node_exporter.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"
    eventually(
        lambda: scrape(url),
        lambda s: "node_load1" in s,
        timeout_seconds=20,
        what="the host's node_exporter",
        alive=[service],
    )
    return service, url


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


@dataclass
class Sample:
    t: float  # seconds since the bench started sampling
    phase: str  # idle, load, cool
    vcpus: int | None  # plugged into QEMU (QMP query-cpus-fast)
    # The VM's reservation (its permit) in the extender's ledger, read just before and just
    # after the vCPUs: a grow raises it before plugging, a shrink lowers it after unplugging.
    reserved_before: float | None
    reserved_after: float | None
    agent_permitted: float | None
    agent_desired: float | None
    node_free_cpu: float | None
    tps: float | None
    host_load1: float | None


def take_sample(
    t: float, phase: str, *, guest: Guest, extender: Extender, agent: Agent, vm: VmPod,
    host_url: str, tps: float | None,
) -> Sample:  # fmt: skip
    def attempt(read: Any) -> Any:
        try:
            return read()
        except (OSError, ValueError, KeyError, StopIteration):
            return None  # one missed reading is a gap in the table, not a reason to stop

    before = attempt(lambda: extender.reserved_millis(vm) / 1000)
    vcpus = attempt(guest.query_vcpus)
    after = attempt(lambda: extender.reserved_millis(vm) / 1000)
    free = attempt(lambda: extender.node(vm.node)["free"]["cpuMillis"] / 1000)
    metrics = attempt(agent.metrics) or {}
    host = attempt(lambda: scrape(host_url, timeout_seconds=2)) or {}
    return Sample(
        t=round(t, 2),
        phase=phase,
        vcpus=vcpus,
        reserved_before=before,
        reserved_after=after,
        agent_permitted=agent.gauge(metrics, "permitted_vcpus"),
        agent_desired=agent.gauge(metrics, "desired_vcpus"),
        node_free_cpu=free,
        tps=tps,
        host_load1=value(host, "node_load1"),
    )


HEADER = f"{'t (s)':>6}  {'phase':<5}  {'vCPUs':>5}  {'permit':>6}  {'wants':>5}  {'node free':>9}  {'tps':>7}  {'host load1':>10}"  # noqa: E501


def row(s: Sample) -> str:
    def f(v: float | None, width: int, digits: int = 0) -> str:
        return f"{'-' if v is None else f'{v:.{digits}f}':>{width}}"

    return (
        f"{s.t:>6.0f}  {s.phase:<5}  {f(s.vcpus, 5)}  {f(s.reserved_after, 6)}  "
        f"{f(s.agent_desired, 5)}  {f(s.node_free_cpu, 9, 1)}  {f(s.tps, 7)}  "
        f"{f(s.host_load1, 10, 2)}"
    )


def plot(samples: list[Sample], path: Path, *, vm: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    top.step(t, [s.vcpus for s in samples], where="post", label="VM vCPUs (QMP)", linewidth=2)
    top.step(t, [s.reserved_after for s in samples], where="post", linestyle="--",
             label="permit (extender /state)")  # fmt: skip
    top.step(t, [s.agent_desired for s in samples], where="post", linestyle=":",
             label="wanted (agent)")  # fmt: skip
    top.set_ylabel("vCPUs")
    top.set_title(f"{vm}: vCPUs under pgbench load (local run-bench)")
    bottom.plot(t, [s.tps for s in samples], label="pgbench tps", color="tab:green")
    bottom.set_ylabel("tps")
    load_axis = bottom.twinx()
    load_axis.plot(t, [s.host_load1 for s in samples], label="host load1", color="tab:red")
    load_axis.set_ylabel("host load1")
    bottom.set_xlabel("seconds")
    loaded = [s.t for s in samples if s.phase == "load"]
    if loaded:
        for axis in (top, bottom):
            axis.axvspan(loaded[0], loaded[-1], alpha=0.12, color="tab:orange", label="_load")
    top.legend(loc="upper left")
    bottom.legend(loc="upper left")
    load_axis.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="run-bench.sh --local",
        description="pgbench on this machine while the real agent scales a real QEMU VM"
        " (docs/LOCAL.md). VM_NAME (environment) picks the VM pod; default pg-vm-0.",
    )
    p.add_argument("--duration", type=float, default=60, help="seconds of pgbench load (60)")
    p.add_argument("--clients", type=int, default=8, help="pgbench clients and threads (8)")
    p.add_argument("--scale", type=int, default=5, help="pgbench -i scale factor (5)")
    p.add_argument("--warmup", type=float, default=5, help="idle seconds before the load (5)")
    p.add_argument(
        "--cooldown", type=float, default=90,
        help="at most this many seconds after the load for the VM to shrink back (90)",
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
        say("building the minimal guest image (cached)")
        image = build_minimal_image()
        say(f"booting {vm.key} (QEMU {args.accel}, {vm.min_vcpus}..{vm.max_vcpus} vCPUs)")
        guest = start_runner(
            image, workdir, min_vcpus=vm.min_vcpus, max_vcpus=vm.max_vcpus, accel=args.accel
        )
        services.append(guest.runner)
        with postgres(workdir) as pg:
            say(f"PostgreSQL on 127.0.0.1:{pg.port}; pgbench -i -s {args.scale}")
            init = subprocess.run(
                [pgbench, "-i", "-q", "-s", str(args.scale), "-h", "127.0.0.1", "-p", str(pg.port),
                 "-U", "postgres", "postgres"],
                capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            if init.returncode != 0:
                raise BenchError(f"pgbench -i failed:\n{init.stderr}")
            exporter, host_url = start_host_exporter(workdir)
            services.append(exporter)
            wait_booted(guest)
            extender = start_extender(
                workdir, cluster_file, base_config=yaml.safe_load(args.extender_config.read_text())
            )
            services.append(extender.service)
            config, vms, port = write_agent_files(
                workdir, vm, extender=extender, qmp_socket=guest.qmp_socket,
                metrics_url=host_url, base_config=yaml.safe_load(args.agent_config.read_text()),
            )  # fmt: skip
            agent = start_agent(workdir, vm, config=config, vms=vms, port=port)
            services.append(agent.service)
            say(f"agent and extender up; the agent scales {vm.key} from the host's node_exporter")
            result = measure(args, vm=vm, guest=guest, extender=extender, agent=agent,
                             host_url=host_url, pgbench=pgbench, pg=pg, out=out)  # fmt: skip
    finally:
        for service in reversed(services):
            service.stop(timeout_seconds=30 if service.name == "runner" else 10)
        for log in workdir.glob("*.log"):
            with contextlib.suppress(OSError):
                shutil.copy(log, out / log.name)
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def measure(
    args: argparse.Namespace, *, vm: VmPod, guest: Guest, extender: Extender, agent: Agent,
    host_url: str, pgbench: str, pg: Postgres, out: Path,
) -> dict[str, Any]:  # fmt: skip
    samples: list[Sample] = []
    started = time.monotonic()
    alive = [guest.runner, extender.service, agent.service, pg.service]

    def tick(phase: str, tps: float | None) -> Sample:
        for service in alive:
            if not service.is_running():
                raise BenchError(f"{service.name} exited; its log ends:\n{service.log_tail()}")
        s = take_sample(time.monotonic() - started, phase, guest=guest, extender=extender,
                        agent=agent, vm=vm, host_url=host_url, tps=tps)  # fmt: skip
        samples.append(s)
        if not args.quiet:
            print(row(s), flush=True)
        return s

    def every_second(until: float) -> Iterator[float]:
        while (now := time.monotonic()) < until:
            yield now
            time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))

    if not args.quiet:
        print(HEADER, flush=True)
    for _ in every_second(time.monotonic() + args.warmup):
        tick("idle", None)
    bench = subprocess.Popen(
        [pgbench, "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-c",
         str(args.clients), "-j", str(args.clients), "-T", str(int(args.duration)), "-P", "1",
         "--no-vacuum", "postgres"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    progress = PgbenchProgress(bench, out / "pgbench.log")
    load_started = time.monotonic() - started
    try:
        for _ in every_second(time.monotonic() + args.duration + 30):
            if bench.poll() is not None:
                break
            tick("load", progress.tps)
    finally:
        if bench.poll() is None:
            bench.terminate()
        bench.wait(30)
        progress.finish()
    load_ended = time.monotonic() - started
    if bench.returncode != 0:
        raise BenchError(f"pgbench exited with {bench.returncode}; see {out / 'pgbench.log'}")
    has_grown = any((s.vcpus or 0) > vm.min_vcpus for s in samples)
    for _ in every_second(time.monotonic() + args.cooldown):
        s = tick("cool", None)
        has_grown = has_grown or (s.vcpus or 0) > vm.min_vcpus
        # Back at the minimum, vCPUs and permit: nothing more to watch. (A VM that never grew
        # is watched for the whole cooldown: a late grow is something to see too.)
        if has_grown and s.vcpus == vm.min_vcpus and s.reserved_after == vm.min_vcpus:
            break
    plot_path = out / "bench.png"
    plot(samples, plot_path, vm=vm.key)
    result = {
        "vm": vm.key,
        "min_vcpus": vm.min_vcpus,
        "max_vcpus": vm.max_vcpus,
        "load_started_seconds": round(load_started, 2),
        "load_ended_seconds": round(load_ended, 2),
        "pgbench": {"clients": args.clients, "scale": args.scale, **progress.summary},
        "plot": str(plot_path),
        "samples": [asdict(s) for s in samples],
    }
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except BenchError as e:
        print(f"run-bench --local: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("run-bench --local: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    vcpus = [s["vcpus"] for s in result["samples"] if s["vcpus"] is not None]
    print(
        f"==> {result['vm']}: vCPUs {min(vcpus)}..{max(vcpus)}; pgbench"
        f" {result['pgbench'].get('tps', 0):.0f} tps; {result['plot']},"
        f" {Path(result['plot']).with_name('bench.json')}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
