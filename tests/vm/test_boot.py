"""Boots the real minimal guest under TCG and scales it up live, end to end.

What it proves, in order: the runner's command line boots the image; node_exporter inside the
guest is reachable through the user-net forward and sees 1 CPU; a raw QMP ``device_add`` plus the
guest's onliner makes it 2 CPUs; keystrokes on the serial console reach a shell (load rises);
SIGTERM makes the runner power the guest down through ACPI and exit 0.

Every wait is bounded. Timings measured on the 2-core development machine when quiet: build 3-6 s
cached (about 10 s with downloads), boot 7 s, hot-plug to online CPU 13 s (the guest kernel's
``cpu_up`` is slow under TCG), load visible within 3-20 s, SIGTERM to exit 3-8 s; 33 s in all.
The bounds (90 s per step) are generous because the same machine, shared with other test runs
at a load average of 12, made TCG several times slower.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from tests.support import free_port, require_binary
from tests.vm.conftest import REPO, MinimalImage

T = TypeVar("T")
Samples = dict[str, list[tuple[dict[str, str], float]]]

pytestmark = [pytest.mark.qemu, pytest.mark.slow, pytest.mark.timeout(300)]


def parse_metrics(text: str) -> Samples:
    """Prometheus text to ``{name: [(labels, value), ...]}``; enough for node_exporter."""
    samples: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, label_text = series.partition("{")
        labels = {}
        for pair in label_text.rstrip("}").split(","):
            if pair:
                key, _, quoted = pair.partition("=")
                labels[key] = quoted.strip('"')
        samples.setdefault(name, []).append((labels, float(value)))
    return samples


def online_cpus(samples: Samples) -> int:
    return len({labels["cpu"] for labels, _ in samples.get("node_cpu_seconds_total", [])})


def load1(samples: Samples) -> float:
    return samples["node_load1"][0][1]


async def eventually(
    probe: Callable[[], Awaitable[T]],
    accept: Callable[[T], bool],
    *,
    timeout_seconds: float,
    what: str,
    interval_seconds: float = 0.5,
) -> T:
    """Poll ``probe`` until ``accept`` holds; fail with the last value after the bound."""
    deadline = time.monotonic() + timeout_seconds
    last: object = "no answer yet"
    while time.monotonic() < deadline:
        try:
            value = await probe()
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            last = e
        else:
            if accept(value):
                return value
            last = value
        await asyncio.sleep(interval_seconds)
    raise AssertionError(f"{what} not seen within {timeout_seconds}s; last: {last!r:.300}")


class RawQmp:
    """The QMP wire by hand: one JSON object per line, events interleaved with answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.events: list[dict[str, Any]] = []

    async def execute(self, command: str, **arguments) -> object:
        request = {"execute": command, **({"arguments": arguments} if arguments else {})}
        self.writer.write(json.dumps(request).encode() + b"\n")
        await self.writer.drain()
        while True:
            message = json.loads(await asyncio.wait_for(self.reader.readline(), 10))
            if "event" in message:
                self.events.append(message)
                continue
            assert "error" not in message, message
            return message["return"]


async def hotplug_one_vcpu(qmp_socket: Path) -> dict[str, Any]:
    reader, writer = await asyncio.open_unix_connection(str(qmp_socket))
    try:
        greeting = json.loads(await asyncio.wait_for(reader.readline(), 10))
        assert "QMP" in greeting
        qmp = RawQmp(reader, writer)
        assert await qmp.execute("qmp_capabilities") == {}
        slots = await qmp.execute("query-hotpluggable-cpus")
        assert isinstance(slots, list)
        assert len(slots) == 4
        assert sum("qom-path" in slot for slot in slots) == 1  # only the boot vCPU is plugged
        free: dict[str, Any] = next(slot for slot in slots if "qom-path" not in slot)
        await qmp.execute("device_add", driver=free["type"], id="vcpu-hp1", **free["props"])
        plugged = await qmp.execute("query-hotpluggable-cpus")
        assert isinstance(plugged, list)
        assert sum("qom-path" in slot for slot in plugged) == 2
        return free
    finally:
        writer.close()
        await writer.wait_closed()


def log_events(stderr_path: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for line in stderr_path.read_text().splitlines() if line.startswith("{")
    ]


async def test_guest_boots_hotplugs_a_vcpu_and_powers_down(minimal_image: MinimalImage, tmp_path):
    require_binary("qemu-system-x86_64")
    port = free_port()
    qmp_socket = tmp_path / "qmp" / "vm.sock"  # the runner must create the directory
    serial_socket = tmp_path / "serial.sock"
    stderr_path = tmp_path / "runner.log"
    timings: dict[str, float] = {}
    started = time.monotonic()
    with stderr_path.open("wb") as stderr, (tmp_path / "console.log").open("wb") as stdout:
        runner = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vm_runner",
            "--kernel", str(minimal_image.kernel), "--initrd", str(minimal_image.initrd),
            "--min-vcpus", "1", "--max-vcpus", "4", "--memory", "512Mi",
            "--accel", "tcg", "--qmp-socket", str(qmp_socket),
            "--serial-socket", str(serial_socket), "--forward", f"127.0.0.1:{port}:9100",
            "--grace-seconds", "40",
            cwd=REPO, stdout=stdout, stderr=stderr,
        )  # fmt: skip
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:

            async def scrape():
                async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                    response.raise_for_status()
                    return parse_metrics(await response.text())

            samples = await eventually(
                scrape, lambda s: "node_cpu_seconds_total" in s, timeout_seconds=90, what="boot"
            )
            timings["boot"] = time.monotonic() - started
            assert online_cpus(samples) == 1

            mark = time.monotonic()
            await hotplug_one_vcpu(qmp_socket)
            samples = await eventually(
                scrape, lambda s: online_cpus(s) == 2, timeout_seconds=90, what="2 online CPUs"
            )
            timings["hotplug_to_online"] = time.monotonic() - mark

            # The baseline is taken while the guest is idle: with both vCPUs busy, a scrape can
            # take seconds under TCG. Any later rise above it comes from the busy loops.
            baseline = load1(samples)
            mark = time.monotonic()
            reader, writer = await asyncio.open_unix_connection(str(serial_socket))
            try:
                # One busy loop per vCPU, then a marker computed by the shell itself (so an echo
                # of our own keystrokes cannot satisfy the check). Niceness 19: the loops still
                # count in the load average, but node_exporter keeps the CPU it needs to answer;
                # at nice 0, scrapes of a saturated TCG guest on a busy host outlast any timeout.
                busy = b"(renice -n 19 $$ > /dev/null; exec yes > /dev/null) &\n"  # no busybox nice
                writer.write(busy + busy + b"echo typed-$((6 * 7))\n")
                await writer.drain()
                seen = b""
                while b"typed-42" not in seen:
                    chunk = await asyncio.wait_for(reader.read(4096), 20)
                    assert chunk, f"serial console closed; saw {seen!r}"
                    seen += chunk
                samples = await eventually(
                    scrape,
                    lambda s: load1(s) > baseline + 0.3,
                    timeout_seconds=90,
                    what=f"node_load1 rising above {baseline} + 0.3",
                    interval_seconds=1,
                )
                timings["load_visible"] = time.monotonic() - mark
                # Both busy loops are runnable whenever the guest is sampled.
                assert samples["node_procs_running"][0][1] >= 2
                # Stop them before the power button: on a loaded CI host a guest saturated
                # under TCG can take longer than the grace period to run acpid's handler.
                writer.write(b"killall yes; echo stopped-$((6 * 7))\n")
                await writer.drain()
                seen = b""
                while b"stopped-42" not in seen:
                    chunk = await asyncio.wait_for(reader.read(4096), 20)
                    assert chunk, f"serial console closed; saw {seen!r}"
                    seen += chunk
            finally:
                writer.close()
                await writer.wait_closed()

        mark = time.monotonic()
        runner.send_signal(signal.SIGTERM)
        returncode = await asyncio.wait_for(runner.wait(), 70)
        timings["sigterm_to_exit"] = time.monotonic() - mark
    finally:
        if runner.returncode is None:  # the test failed midway: still shut down cleanly
            runner.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(runner.wait(), 70)
            except TimeoutError:
                runner.kill()  # QEMU follows: the runner sets PDEATHSIG on it
                await runner.wait()

    assert returncode == 0
    exited = [e for e in log_events(stderr_path) if e["event"] == "qemu_exited"]
    assert exited == [exited[0]]
    assert exited[0]["how"] == "powerdown"  # the guest's acpid handled the power button
    assert exited[0]["returncode"] == 0
    print(f"timings (s): { {k: round(v, 1) for k, v in timings.items()} }")
