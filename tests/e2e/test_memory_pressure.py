"""Memory pressure on a real guest: workloads of ``scripts/bench_memory_online.py`` under the
runner's own memory onlining (the guest's memory-onliner) and the guest's fast path
(memory-watch's memory.high and its signals), with the real agent and extender.

One TCG guest, 512 MiB at boot and 2.5 GiB at most (the runner's shape that issue 39 found
OOM-killed), runs, in order: a kernel-memory-heavy workload (300,000 empty files in a
tmpfs: inodes and dentries, which only blocks onlined to a kernel zone can hold), ``dd``
writing twice the boot memory into a tmpfs faster than one scrape interval, and a
page-cache-heavy one (a data disk larger than the VM's maximum read in a loop, beside a
process whose anonymous memory grows). One guest for all of them: each boot costs the
suite's QEMU tier. Each must end without an OOM kill, and the agent must have grown the VM
during it; the kernel workload's growth must have gone to a kernel zone (what the onliner
logged), and the guest's signals (its workload crossing memory.high) must have reached the
agent. Nothing asserts on time; the benchmark measures that. Printed per workload: its
figures (``watch``, ``release``), the signals the agent heard and, for each grow decided on a
scrape a signal brought forward, the seconds from the signal to the memory plugged by the
fast path and as the scrapes alone would have done it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

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
    writer_mib=1024,  # twice the boot memory, at dd's speed
    shrink_after_seconds=2.0,
    release_seconds=4.0,  # longer than the agent's shrink window plus a scrape
    timeout_seconds=180.0,
)
ORDER = ("kernel", "writer", "page_cache")


def online_kernel_blocks(guest: Guest) -> int:
    out = guest.type('echo "kernel=$(dmesg | grep -c "memory-onliner: .* online_kernel")"')
    found = re.search(r"kernel=(\d+)", out)
    return int(found.group(1)) if found else -1


def memory_signals(agent: Agent) -> float:
    return value(agent.metrics(), "vmautoscale_agent_memory_signals_total") or 0.0


def test_each_workload_grows_the_vm_without_an_oom(guest_image: GuestImage, tmp_path: Path) -> None:
    with stopping([]) as services:
        # No kernel arguments of our own: the runner's onlining is what is tested.
        started = time.monotonic()
        guest, agent = boot(tmp_path, SIZES, "", services)
        print(f"boot {time.monotonic() - started:.1f}s")
        for name in ORDER:
            started = time.monotonic()
            kernel_blocks = online_kernel_blocks(guest)
            logged, signals = log_lines(agent), memory_signals(agent)
            result = WORKLOADS[name](guest, SIZES)
            result["signals"] = memory_signals(agent) - signals
            result["signalled_grows"] = signalled_grows(agent_events(agent, skip=logged))
            print(name, f"{time.monotonic() - started:.1f}s", result)  # in the run's log (-rP)
            assert not result["was_killed"] and not result["was_stuck"], (name, result)
            if oom_kills(guest) != 0:
                pytest.fail(f"{name}: OOM in the guest: {result}\n{oom_report(guest)}")
            assert result["plugged_peak_mib"] > result["plugged_start_mib"], (name, result)
            if name == "kernel":
                # The kernel's growth went to a kernel zone: the onliner chose it.
                assert online_kernel_blocks(guest) > kernel_blocks, oom_report(guest)
        # A workload crossed its memory.high: the guest said so on its port, and the agent
        # heard it (the fast path is wired end to end, not only its scrapes).
        assert memory_signals(agent) > 0
