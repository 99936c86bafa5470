"""Boots the real minimal guest under TCG and scales it up live, end to end.

What it proves, in order: the runner's command line boots the image; node_exporter inside the
guest is reachable through the user-net forward and sees 1 CPU; a raw QMP ``device_add`` plus the
guest's onliner makes it 2 CPUs; SIGTERM makes the runner power the guest down through ACPI and
exit 0. (Load inside the guest, and the agent growing it, is tests/e2e/test_guest_scaling.py.)

Every wait is bounded, generously (90 s per step): the same machine shared with other test runs
makes TCG several times slower. The hot-plug waits until the guest is 10 s past its boot, by its
own clock (see ``SETTLED_SECONDS``).
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

from testkit.local_stack import Samples, parse_metrics
from testkit.ports import free_port
from tests.support import require_binary
from tests.vm.conftest import REPO, MinimalImage

T = TypeVar("T")

pytestmark = [pytest.mark.qemu, pytest.mark.slow, pytest.mark.timeout(300)]


# A vCPU hot-added in the guest's first seconds sometimes hangs the whole guest under TCG (the
# kernel stops at "smpboot: Booting Node 0 Processor 1"; node_exporter and ACPI powerdown go
# unanswered): 1 of 6 runs of this test, 3 of 10 of a bare QEMU hot-adding at once (with and
# without tsc=unstable and single-threaded TCG); none of 14 hot-adding 10 s after boot. The
# hot-plug vCPU mode is not the runner's default (online), and the agent grows a VM only after
# its grow window of load; this test waits the same way.
SETTLED_SECONDS = 10.0


def guest_uptime(samples: Samples) -> float:
    """Seconds since the guest booted, by its own clock: the boot vCPU's time in every mode."""
    return sum(v for labels, v in samples.get("node_cpu_seconds_total", []) if labels["cpu"] == "0")


def online_cpus(samples: Samples) -> int:
    return len({labels["cpu"] for labels, _ in samples.get("node_cpu_seconds_total", [])})


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
            "--accel", "tcg", "--qmp-socket", str(qmp_socket), "--vcpu-mode", "hotplug",
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
            samples = await eventually(
                scrape,
                lambda s: guest_uptime(s) >= SETTLED_SECONDS,
                timeout_seconds=90,
                what=f"the guest {SETTLED_SECONDS} s past its boot",
            )

            mark = time.monotonic()
            await hotplug_one_vcpu(qmp_socket)
            samples = await eventually(
                scrape, lambda s: online_cpus(s) == 2, timeout_seconds=90, what="2 online CPUs"
            )
            timings["hotplug_to_online"] = time.monotonic() - mark

            # Load inside the guest reaching its node_exporter (and the agent growing the VM
            # for it) is shown by tests/e2e/test_guest_scaling.py; here busy loops on a
            # saturated TCG guest made scrapes time out on a loaded host, one run in three.

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
