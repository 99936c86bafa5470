"""The whole system on one machine, as child processes: a QEMU guest, the extender, the agent.

Shell only, no policy. Used by ``scripts/local_bench.py`` (``scripts/run-bench.sh --local``) and
by the end-to-end tests in ``tests/e2e/``, so that both drive exactly the same real binaries the
same way:

* ``start_runner``: ``python -m vm_runner`` (QEMU, the minimal or the postgres guest) with a QMP
  socket for the agent (and, in the runner's default ``--vcpu-mode online``, a QGA socket beside
  it), a serial console socket, and the guest's node_exporter (and PostgreSQL, for the postgres
  guest) forwarded to loopback ports.
* ``write_cluster`` + ``start_extender``: ``scheduler-extender serve --standalone`` with a
  static token, nodes and pods from one YAML file.
* ``write_agent_files`` + ``start_agent``: ``autoscaler-agent --standalone`` for one VM.

Everything is synchronous (``subprocess.Popen``, ``urllib``, blocking sockets): the callers
are a CLI loop and module-scoped pytest fixtures, neither of which wants an event loop.

Children get ``PR_SET_PDEATHSIG`` = SIGTERM: if the parent dies without cleaning up (a test
killed by its timeout, a SIGKILLed bench), the children still stop, and the runner still
powers its guest down. ``Service.stop`` is the orderly path and is always bounded.

QMP serves one client per socket and the agent keeps its socket open, so the vCPU count is read
(``query_vcpus``) from the runner's private control socket, whose path the runner logs in its
``qemu_starting`` line. Connections there are short, so the runner can still use it to shut
the guest down.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import yaml
from prometheus_client.parser import text_string_to_metric_families

from testkit.controlplane import extender_command
from testkit.ports import free_port
from vm_runner.cmdline import qga_socket_beside

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _primary_group(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_gid


# -- processes ---------------------------------------------------------------------------------


@dataclass
class Service:
    """A child process whose stdout and stderr go to ``log_path``."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    # PostgreSQL's postmaster takes SIGINT as "fast shutdown" (SIGTERM waits for clients).
    stop_signal: int = signal.SIGTERM

    def is_running(self) -> bool:
        return self.process.poll() is None

    def stop(self, *, timeout_seconds: float = 10.0) -> int:
        """SIGTERM, wait up to ``timeout_seconds``, then SIGKILL; the exit status."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(self.stop_signal)
            try:
                return self.process.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_events(self) -> list[dict[str, Any]]:
        """The structlog JSON lines of the log (the binaries log JSON when not on a TTY)."""
        events = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    events.append(json.loads(line))
        return events


def spawn(
    name: str,
    argv: list[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    user: str | None = None,
    cwd: Path = REPO,
) -> Service:
    # PYTHONPATH: the packages run from the checkout whether or not the venv has them installed.
    child_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Own session: a ^C in the terminal reaches only the bench, which then stops the
            # children in order (the agent before the VM it resizes).
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, no locks or threads
            # Runs after the switch to ``user`` (CPython calls preexec_fn last), which matters:
            # changing the uid clears the parent-death signal.
            user=user,
            group=None if user is None else _primary_group(user),
            extra_groups=None if user is None else [],
        )
    return Service(name=name, process=process, log_path=log_path)


@contextlib.contextmanager
def stopping(services: list[Service]) -> Iterator[list[Service]]:
    """Stop every service in ``services`` on exit, last started first, even on errors."""
    try:
        yield services
    finally:
        for service in reversed(services):
            service.stop(timeout_seconds=30 if service.name == "runner" else 10)


# -- waiting -----------------------------------------------------------------------------------


def eventually(
    probe: Callable[[], T],
    accept: Callable[[T], bool],
    *,
    timeout_seconds: float,
    what: str,
    interval_seconds: float = 0.5,
    alive: list[Service] | None = None,
) -> T:
    """Poll ``probe`` until ``accept`` holds; AssertionError with the last value after the bound.

    Services in ``alive`` must keep running: if one exits, waiting longer cannot help, so the
    error (with the end of its log) comes at once.
    """
    deadline = time.monotonic() + timeout_seconds
    last: object = "no answer yet"
    while True:
        try:
            value = probe()
        except (OSError, ValueError, KeyError) as e:  # not up yet, or a half-written answer
            last = e
        else:
            if accept(value):
                return value
            last = value
        for service in alive or ():
            if not service.is_running():
                raise AssertionError(
                    f"{service.name} exited ({service.process.returncode}) while waiting for"
                    f" {what}; its log ends:\n{service.log_tail()}"
                )
        if time.monotonic() >= deadline:
            # The services' own accounts, so that a wait run out on a starved host can be read
            # afterwards (what the agent decided, what the extender answered).
            logs = "".join(f"\n{s.name}'s log ends:\n{s.log_tail()}" for s in alive or ())
            raise AssertionError(
                f"{what} not seen within {timeout_seconds}s; last: {last!r:.400}{logs}"
            )
        time.sleep(interval_seconds)


# -- HTTP and Prometheus text ------------------------------------------------------------------

Samples = dict[str, list[tuple[dict[str, str], float]]]


def http_get(url: str, *, timeout_seconds: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_seconds) as response:
        body: bytes = response.read()
        return body.decode()


def parse_metrics(text: str) -> Samples:
    """Prometheus text to ``{sample name: [(labels, value), ...]}``, with prometheus-client's
    own parser (the one the agent uses), so label values with commas or escapes are right."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return samples


def scrape(url: str, *, timeout_seconds: float = 5.0) -> Samples:
    return parse_metrics(http_get(url, timeout_seconds=timeout_seconds))


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of the series of ``name`` whose labels include ``labels``; None if there are none."""
    found = [v for ls, v in samples.get(name, []) if all(ls.get(k) == x for k, x in labels.items())]
    return sum(found) if found else None


def online_cpus(samples: Samples) -> int:
    """CPUs node_exporter reports: an offline CPU has no ``node_cpu_seconds_total`` series."""
    return len({labels["cpu"] for labels, _ in samples.get("node_cpu_seconds_total", [])})


# -- the guest ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GuestImage:
    kernel: Path
    initrd: Path


# Where guest images are built and cached: ``vm_image/build`` (the build's own default), or
# ``$VMA_IMAGE_ROOT``, which scripts/test points at the user's cache so that a fresh clone
# reuses the images an earlier run built (the build is keyed by its manifest, and takes a lock
# per output directory).
IMAGE_ROOT: Final = Path(os.environ.get("VMA_IMAGE_ROOT") or REPO / "vm_image/build")


def build_image(variant: str = "minimal") -> GuestImage:
    """``python -m vm_image VARIANT`` (cached under ``IMAGE_ROOT``: seconds when built)."""
    result = subprocess.run(
        [sys.executable, "-m", "vm_image", variant, "--out", str(IMAGE_ROOT),
         "--cache", str(IMAGE_ROOT / "debs")],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"building the {variant} guest image failed:\n{result.stderr}")
    out = Path(result.stdout.strip())
    return GuestImage(kernel=out / "vmlinuz", initrd=out / "initramfs.cpio.gz")


def build_minimal_image() -> GuestImage:
    return build_image("minimal")


@dataclass
class Guest:
    """A booted (or booting) minimal guest under ``vm_runner``."""

    runner: Service
    vcpu_mode: str  # the runner's --vcpu-mode: "online" (QGA) or "hotplug" (QMP device_add)
    qmp_socket: Path  # the agent's
    serial_socket: Path
    metrics_port: int  # the guest's node_exporter, forwarded to 127.0.0.1
    min_vcpus: int
    max_vcpus: int
    postgres_port: int | None = None  # the postgres guest's :5432, forwarded to 127.0.0.1
    # The runner's --migration-socket: a QMP socket for a live migration's driver, or None.
    migration_socket: Path | None = None
    _control_socket: Path | None = field(default=None, repr=False)

    @property
    def qga_socket(self) -> Path:
        """The guest agent's socket in online mode (the runner's default name for it)."""
        return Path(qga_socket_beside(str(self.qmp_socket)))

    @property
    def hypervisor_url(self) -> str:
        """The agent's URL for this VM, relative to the socket directory as its root."""
        scheme = "qmp+qga" if self.vcpu_mode == "online" else "qmp"
        return f"{scheme}:///{self.qmp_socket.name}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def scrape(self, *, timeout_seconds: float = 5.0) -> Samples:
        return scrape(self.metrics_url, timeout_seconds=timeout_seconds)

    def online_vcpus(self, *, timeout_seconds: float = 5.0) -> int:
        """CPUs the guest kernel has online, as its node_exporter reports them."""
        return online_cpus(self.scrape(timeout_seconds=timeout_seconds))

    def control_socket(self) -> Path:
        """The runner's private QMP socket, from its ``qemu_starting`` log line."""
        if self._control_socket is None:
            for event in self.runner.log_events():
                if event.get("event") == "qemu_starting":
                    for arg in event["argv"]:
                        if arg.startswith("socket,id=control,"):
                            path = next(p for p in arg.split(",") if p.startswith("path="))
                            self._control_socket = Path(path.removeprefix("path="))
            if self._control_socket is None:
                raise OSError("the runner has not logged qemu_starting yet")
        return self._control_socket

    def query_vcpus(self) -> int:
        """vCPUs plugged into QEMU right now (QMP ``query-cpus-fast``), online or not."""
        answer = qmp_execute(self.control_socket(), "query-cpus-fast")
        assert isinstance(answer, list)
        return len(answer)

    def query_plugged_memory(self) -> int:
        """Bytes the guest has plugged into the virtio-mem device (QMP query-memory-devices;
        0 without one)."""
        answer = qmp_execute(self.control_socket(), "query-memory-devices")
        assert isinstance(answer, list)
        return sum(int(d["data"]["size"]) for d in answer if d.get("type") == "virtio-mem")

    def type(self, command: str, *, timeout_seconds: float = 30.0) -> str:
        """Run ``command`` in the guest's root shell; its output (up to a marker we wait for).

        The marker is computed by the guest's shell, so the echo of our own keystrokes cannot
        satisfy the wait.
        """
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as console:
            console.settimeout(timeout_seconds)
            console.connect(str(self.serial_socket))
            console.sendall(command.encode() + b"\necho done-$((6 * 7))\n")
            seen = b""
            deadline = time.monotonic() + timeout_seconds
            while b"done-42" not in seen:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"guest shell did not answer {command!r}; saw {seen!r}")
                chunk = console.recv(4096)
                if not chunk:
                    raise OSError(f"serial console closed; saw {seen!r}")
                seen += chunk
            return seen.decode(errors="replace")

    def start_busy_loops(self, count: int) -> None:
        # Busy loops at niceness 19 (busybox has no `nice`): they keep every vCPU busy and the
        # run queue long, but node_exporter (nice 0) still gets the CPU it needs to answer
        # scrapes; at nice 0 a saturated TCG guest's scrapes outlast any timeout. `sh -c`
        # makes $$ the loop's own pid (in a `( ... )` subshell $$ is the login shell's).
        loop = "sh -c 'renice -n 19 $$ > /dev/null; exec yes > /dev/null' &"
        self.type(" ".join([loop] * count))

    def stop_busy_loops(self) -> None:
        self.type("killall yes 2> /dev/null; true")


def qmp_execute(path: Path, command: str, *, timeout_seconds: float = 10.0) -> object:
    """One short QMP session: greeting, ``qmp_capabilities``, ``command``; its ``return``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_seconds)
        sock.connect(str(path))
        stream = sock.makefile("rwb")
        greeting = json.loads(stream.readline())
        if "QMP" not in greeting:
            raise OSError(f"not a QMP greeting: {greeting!r}")
        answer: object = None
        for execute in ("qmp_capabilities", command):
            stream.write(json.dumps({"execute": execute}).encode() + b"\n")
            stream.flush()
            while True:
                line = stream.readline()
                if not line:
                    raise OSError("QMP socket closed")
                message = json.loads(line)
                if "event" in message:
                    continue
                if "error" in message:
                    raise OSError(f"QMP {execute}: {message['error']}")
                answer = message["return"]
                break
        return answer


def start_runner(
    image: GuestImage,
    workdir: Path,
    *,
    min_vcpus: int = 1,
    max_vcpus: int = 4,
    memory: str = "512Mi",
    max_memory: str | None = None,
    accel: str = "tcg",
    grace_seconds: float = 10,
    postgres: bool = False,
    vcpu_mode: str = "online",
    kernel_args: str = "",
    disk: Path | None = None,
    incoming_port: int | None = None,
    migration_socket: bool = False,
    migration_port: int | None = None,
) -> Guest:
    """Start the guest; returns at once (``wait_booted`` waits for node_exporter).

    ``kernel_args``: the runner's ``--kernel-args``, after its own (the last of a repeated
    argument wins: e.g. another ``memhp_default_state``). ``disk``: a raw image attached as
    the guest's /dev/vda (the minimal guest keeps its initramfs as root and only reads it).

    ``postgres``: also forward a loopback port to the guest's 5432 (the postgres image).
    ``vcpu_mode``: the runner's ``--vcpu-mode``; in ``online`` the agent's QGA socket is
    ``Guest.qga_socket`` (beside the QMP socket, as the runner names it).
    ``incoming_port``: start as a live migration's target on that port (the guest does not boot;
    ``wait_booted`` then waits for the migration to bring it over). ``migration_socket``: give
    the runner a QMP socket for the migration's driver (``Guest.migration_socket``);
    ``migration_port``: a QMP monitor on that TCP port instead, as a pod's runner has for the
    vm-controller (``vm_controller.migrations``).
    """
    port = free_port()
    pg_port = free_port() if postgres else None
    pg_forward = [] if pg_port is None else ["--forward", f"127.0.0.1:{pg_port}:5432"]
    qmp_socket = workdir / "sockets" / "vm-qmp.sock"
    serial_socket = workdir / "serial.sock"
    migration = workdir / "sockets" / "vm-migration.sock" if migration_socket else None
    runner = spawn(
        "runner",
        [
            sys.executable, "-m", "vm_runner",
            "--kernel", str(image.kernel), "--initrd", str(image.initrd),
            "--min-vcpus", str(min_vcpus), "--max-vcpus", str(max_vcpus), "--memory", memory,
            "--accel", accel, "--qmp-socket", str(qmp_socket),
            "--serial-socket", str(serial_socket), "--forward", f"127.0.0.1:{port}:9100",
            "--grace-seconds", str(grace_seconds), "--vcpu-mode", vcpu_mode, *pg_forward,
            *(["--max-memory", max_memory] if max_memory is not None else []),
            *(["--kernel-args", kernel_args] if kernel_args else []),
            *(["--disk", str(disk)] if disk is not None else []),
            *(["--incoming-port", str(incoming_port)] if incoming_port is not None else []),
            *(["--migration-socket", str(migration)] if migration is not None else []),
            *(["--migration-port", str(migration_port)] if migration_port is not None else []),
        ],
        log_path=workdir / "runner.log",
    )  # fmt: skip
    return Guest(
        runner=runner,
        vcpu_mode=vcpu_mode,
        qmp_socket=qmp_socket,
        serial_socket=serial_socket,
        metrics_port=port,
        min_vcpus=min_vcpus,
        max_vcpus=max_vcpus,
        postgres_port=pg_port,
        migration_socket=migration,
    )


def wait_booted(guest: Guest, *, timeout_seconds: float = 90) -> Samples:
    """Until the guest's node_exporter answers with CPU counters (about 7 s under TCG)."""
    return eventually(
        guest.scrape,
        lambda s: "node_cpu_seconds_total" in s,
        timeout_seconds=timeout_seconds,
        what="the guest's node_exporter",
        alive=[guest.runner],
    )


# -- the extender ------------------------------------------------------------------------------

TOKEN = "local-e2e-token"  # auth mode static: the extender accepts it for any node


@dataclass(frozen=True)
class VmPod:
    """The VM as a pod in the standalone cluster file and as a VM in the agent's file."""

    name: str = "vm-0"
    namespace: str = "local"
    uid: str = "00000000-0000-4000-8000-00000000e2e0"
    node: str = "local-node"
    min_vcpus: int = 1
    max_vcpus: int = 4
    memory: str = "512Mi"
    # With max_memory: min-memory/max-memory annotations (the runner's --memory/--max-memory).
    max_memory: str | None = None
    memory_unit: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def write_cluster(path: Path, vm: VmPod, *, node_cpu: str, foreign_cpu: str | None = None) -> None:
    """A node of ``node_cpu`` with the VM on it (at its minimum) and maybe a foreign pod."""
    pods: list[dict[str, Any]] = [
        {
            "namespace": vm.namespace,
            "name": vm.name,
            "uid": vm.uid,
            "node": vm.node,
            "labels": {"vm-autoscaling.io/vm": "true"},
            "annotations": {
                "vm-autoscaling.io/min-vcpus": str(vm.min_vcpus),
                "vm-autoscaling.io/max-vcpus": str(vm.max_vcpus),
                **(
                    {
                        "vm-autoscaling.io/min-memory": vm.memory,
                        "vm-autoscaling.io/max-memory": vm.max_memory,
                    }
                    if vm.max_memory is not None
                    else {}
                ),
                **(
                    {"vm-autoscaling.io/memory-unit": vm.memory_unit}
                    if vm.memory_unit is not None
                    else {}
                ),
            },
            "requests": {"cpu": str(vm.min_vcpus), "memory": vm.memory},
        }
    ]
    if foreign_cpu is not None:
        pods.append(
            {
                "namespace": "kube-system",
                "name": "someone-else",
                "uid": "00000000-0000-4000-8000-0000000f0e19",
                "node": vm.node,
                "scheduler_name": "default-scheduler",
                "requests": {"cpu": foreign_cpu, "memory": "64Mi"},
            }
        )
    cluster = {"nodes": [{"name": vm.node, "cpu": node_cpu, "memory": "8Gi"}], "pods": pods}
    path.write_text(yaml.safe_dump(cluster, sort_keys=False))


@dataclass
class Extender:
    service: Service
    permits_port: int
    verbs_port: int  # /state and /metrics are only here (not on the permit port)
    token: str  # auth mode static: accepted for any node

    @property
    def state_url(self) -> str:
        return f"http://127.0.0.1:{self.verbs_port}/state"

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(http_get(self.state_url))
        return state

    def node(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = next(n for n in self.state()["nodes"] if n["name"] == name)
        return node

    def reserved_memory(self, vm: VmPod) -> int:
        """What the ledger holds for the VM's memory (its last permit), in bytes."""
        allocation = next(a for a in self.node(vm.node)["allocations"] if a["uid"] == vm.uid)
        memory: int = allocation["resources"]["memoryBytes"]
        return memory

    def reserved_millis(self, vm: VmPod) -> int:
        """What the ledger holds for the VM (its last permit), in milliCPU."""
        allocation = next(a for a in self.node(vm.node)["allocations"] if a["uid"] == vm.uid)
        millis: int = allocation["resources"]["cpuMillis"]
        return millis


def start_extender(
    workdir: Path, cluster: Path, *, base_config: dict[str, Any] | None = None
) -> Extender:
    """The extender on two free loopback ports; ``base_config`` (e.g. examples/local) or ours."""
    verbs_port, permits_port = free_port(), free_port()
    config = base_config or {
        "auth": {"mode": "static", "static_token": TOKEN},
        # No host share kept back: the node's cpu in the cluster file is exactly what VMs get.
        "system_reserve": {"cpu_fraction": 0.0},
        "shutdown_timeout_seconds": 2,
    }
    config = {
        **config,
        "listen": {
            "verbs": {"host": "127.0.0.1", "port": verbs_port},
            "permits": {"host": "127.0.0.1", "port": permits_port},
        },
    }
    config_path = workdir / "extender.yaml"
    config_path.write_text(yaml.safe_dump(config))
    service = spawn(
        "extender",
        extender_command(config_path, standalone=cluster),
        log_path=workdir / "extender.log",
    )
    extender = Extender(
        service=service,
        permits_port=permits_port,
        verbs_port=verbs_port,
        token=config["auth"]["static_token"],
    )
    eventually(
        extender.state,
        lambda s: all(s["synced"].values()),
        timeout_seconds=30,
        what="the extender's /state",
        alive=[service],
    )
    return extender


# -- the agent ---------------------------------------------------------------------------------


@dataclass
class Agent:
    service: Service
    port: int
    vm: VmPod

    def metrics(self) -> Samples:
        return scrape(f"http://127.0.0.1:{self.port}/metrics")

    def gauge(self, samples: Samples, name: str) -> float | None:
        return value(samples, f"vmautoscale_agent_vm_{name}", vm=self.vm.key)


def write_agent_files(
    workdir: Path,
    vm: VmPod,
    *,
    extender: Extender,
    qmp_socket: Path,
    metrics_url: str,
    policy: dict[str, float] | None = None,
    permit_retry_seconds: float = 1.0,
    base_config: dict[str, Any] | None = None,
    hypervisor_url: str | None = None,
) -> tuple[Path, Path, int]:
    """The agent's config and VMs file; returns their paths and its HTTP port.

    ``base_config`` (e.g. examples/local/agent.yaml) replaces our defaults; either way the
    extender URL, token file, socket root and HTTP port are filled in here.
    """
    port = free_port()
    token_file = workdir / "agent-token"
    token_file.write_text(extender.token)
    config: dict[str, Any] = base_config or {
        "scrape": {"interval_seconds": 1.0, "timeout_seconds": 0.9},
        "policy": policy or {},
        "extender": {"permit_retry_seconds": permit_retry_seconds},
        "retry": {"backoff_initial_seconds": 0.5, "backoff_max_seconds": 2.0},
        "hypervisor": {"unplug_timeout_seconds": 10.0},
        "log": {"level": "info"},
    }
    config = {
        **config,
        "extender": {
            **config.get("extender", {}),
            "url": f"http://127.0.0.1:{extender.permits_port}",
            "token_file": str(token_file),
        },
        # The hypervisor URL is resolved below socket_root (as the node's hostPath would be).
        "hypervisor": {**config.get("hypervisor", {}), "socket_root": str(qmp_socket.parent)},
        "http": {"host": "127.0.0.1", "port": port},
    }
    vms = {
        "vms": [
            {
                "name": vm.name,
                "namespace": vm.namespace,
                "uid": vm.uid,
                "node": vm.node,
                "min_vcpus": vm.min_vcpus,
                "max_vcpus": vm.max_vcpus,
                "memory": vm.memory,
                **({"max_memory": vm.max_memory} if vm.max_memory is not None else {}),
                **({"memory_unit": vm.memory_unit} if vm.memory_unit is not None else {}),
                "hypervisor": hypervisor_url or f"qmp:///{qmp_socket.name}",
                "metrics_url": metrics_url,
            }
        ]
    }
    config_path, vms_path = workdir / "agent.yaml", workdir / "vms.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    vms_path.write_text(yaml.safe_dump(vms, sort_keys=False))
    return config_path, vms_path, port


def start_extender_and_agent(
    workdir: Path,
    guest: Guest,
    vm: VmPod,
    *,
    node_cpu: str,
    foreign_cpu: str | None = None,
    agent_config: dict[str, Any],
    started: list[Service],
) -> tuple[Extender, Agent]:
    """A one-node extender holding ``vm`` (and maybe a foreign pod) and an agent for ``guest``;
    each service is appended to ``started`` as soon as it runs, so the caller stops it even if
    a later step fails."""
    write_cluster(workdir / "cluster.yaml", vm, node_cpu=node_cpu, foreign_cpu=foreign_cpu)
    extender = start_extender(workdir, workdir / "cluster.yaml")
    started.append(extender.service)
    config, vms, port = write_agent_files(
        workdir,
        vm,
        extender=extender,
        qmp_socket=guest.qmp_socket,
        hypervisor_url=guest.hypervisor_url,
        metrics_url=guest.metrics_url,
        base_config=agent_config,
    )
    agent = start_agent(workdir, vm, config=config, vms=vms, port=port)
    started.append(agent.service)
    return extender, agent


def start_agent(workdir: Path, vm: VmPod, *, config: Path, vms: Path, port: int) -> Agent:
    service = spawn(
        "agent",
        [sys.executable, "-m", "autoscaler_agent", "--config", str(config),
         "--standalone", str(vms)],
        log_path=workdir / "agent.log",
        env={"NODE_NAME": vm.node},
    )  # fmt: skip
    agent = Agent(service=service, port=port, vm=vm)
    # Up once it has read the VM's size through QMP: the gauge appears after the first read.
    eventually(
        agent.metrics,
        lambda s: agent.gauge(s, "current_vcpus") is not None,
        timeout_seconds=30,
        what="the agent's first vCPU read",
        alive=[service],
    )
    return agent
