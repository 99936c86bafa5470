"""Memory pressure on a real guest: workloads of ``scripts/bench_memory_online.py`` under the
runner's own memory onlining (the guest's memory-onliner) and the guest's fast path
(memory-watch's memory.high and its signals), with the real agent and extender.

Two TCG guests, each 2.5 GiB at most (the runner's defaults otherwise: issue 39 asks that none
of these OOM-kill a guest under them):

- 512 MiB at boot: a kernel-memory-heavy workload (300,000 empty files in a tmpfs: inodes and
  dentries, which only blocks onlined to a kernel zone can hold), then a page-cache-heavy one
  (a data disk larger than the VM's maximum read in a loop, beside a process whose anonymous
  memory grows);
- 256 MiB at boot, issue 39's writer guest: ``dd`` writing 1 GiB (four times the boot memory)
  into a tmpfs faster than one scrape interval, while the guest is at its smallest. One boot
  at 256 MiB for all three was tried: beside the real-node tier, the kernel workload killed
  that guest, and the issue asks for the kernel case at 512 MiB.

Each workload must end without an OOM kill, and the agent must have grown the VM during it
(the writer's guest: enough to hold what it wrote); the kernel workload's growth must have gone
to a kernel zone (what the onliner logged), and the page-cache guest's signals (its workload
crossing memory.high) must have reached the agent. Nothing asserts on time; the benchmark
measures that. Printed per workload: its figures (``watch``, ``release``), the signals the
agent heard and, for each grow decided on a scrape a signal brought forward, the seconds from
the signal to the memory plugged by the fast path and as the scrapes alone would have done it.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from testkit.local_stack import Agent, Guest, GuestImage, stopping, value
from testkit.memory_workloads import (
    WORKLOADS,
    Sizes,
    agent_events,
    boot,
    log_lines,
    oom_kills,
    oom_report,
    signalled_grows,
)

pytestmark = [pytest.mark.qemu, pytest.mark.qemu_apart, pytest.mark.slow, pytest.mark.timeout(300)]

SIZES = Sizes(
    memory="512Mi",
    max_memory="2560Mi",
    disk_mib=3072,  # sparse; larger than the VM's maximum
    anon_mib=400,
    # Half of issue 39's 600,000 (scripts/bench_memory_online.py's default), for the suite's
    # time: still more kernel memory than the boot memory leaves free, so the agent grows and
    # the onliner must choose a kernel zone, which the test reads from its log.
    files=300_000,
    shrink_after_seconds=2.0,
    release_seconds=4.0,  # longer than the agent's shrink window plus a scrape
    timeout_seconds=180.0,
)
ORDER = ("kernel", "page_cache")
WRITER_BOOT_MIB = 256
WRITER_SIZES = replace(SIZES, memory=f"{WRITER_BOOT_MIB}Mi", writer_mib=1024)


def online_kernel_blocks(guest: Guest) -> int:
    out = guest.type('echo "kernel=$(dmesg | grep -c "memory-onliner: .* online_kernel")"')
    found = re.search(r"kernel=(\d+)", out)
    return int(found.group(1)) if found else -1


def memory_signals(agent: Agent) -> float:
    return value(agent.metrics(), "vmautoscale_agent_memory_signals_total") or 0.0


def _run(guest: Guest, agent: Agent, name: str, sizes: Sizes) -> dict[str, Any]:
    """One workload, checked: no OOM kill, not stuck, and the VM grew during it."""
    started = time.monotonic()
    logged, signals = log_lines(agent), memory_signals(agent)
    result = WORKLOADS[name](guest, sizes)
    result["signals"] = memory_signals(agent) - signals
    result["signalled_grows"] = signalled_grows(agent_events(agent, skip=logged))
    print(name, f"{time.monotonic() - started:.1f}s", result)  # in the run's log (-rP)
    assert not result["was_killed"] and not result["was_stuck"], (name, result)
    if oom_kills(guest) != 0:
        pytest.fail(f"{name}: OOM in the guest: {result}\n{oom_report(guest)}")
    assert result["plugged_peak_mib"] > result["plugged_start_mib"], (name, result)
    return result


def test_each_workload_grows_the_vm_without_an_oom(guest_image: GuestImage, tmp_path: Path) -> None:
    with stopping([]) as services:
        # No kernel arguments of our own: the runner's onlining is what is tested.
        started = time.monotonic()
        guest, agent = boot(tmp_path, SIZES, "", services)
        print(f"boot {time.monotonic() - started:.1f}s")
        for name in ORDER:
            kernel_blocks = online_kernel_blocks(guest)
            _run(guest, agent, name, SIZES)
            if name == "kernel":
                # The kernel's growth went to a kernel zone: the onliner chose it.
                assert online_kernel_blocks(guest) > kernel_blocks, oom_report(guest)
        # A workload crossed its memory.high: the guest said so on its port, and the agent
        # heard it (the fast path is wired end to end, not only its scrapes).
        assert memory_signals(agent) > 0


def test_a_dd_writer_into_a_256_mib_guest_grows_it_without_an_oom(
    guest_image: GuestImage, tmp_path: Path
) -> None:
    with stopping([]) as services:
        started = time.monotonic()
        guest, agent = boot(tmp_path, WRITER_SIZES, "", services)
        print(f"boot {time.monotonic() - started:.1f}s")
        result = _run(guest, agent, "writer", WRITER_SIZES)
        # It grew to hold what it wrote (not only the grow an idle 256 MiB guest gets anyway:
        # its 67 MiB available are below the agent's least headroom).
        assert result["plugged_peak_mib"] + WRITER_BOOT_MIB >= WRITER_SIZES.writer_mib, result
