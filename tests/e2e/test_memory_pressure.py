"""Memory pressure on a real guest: the workloads of ``scripts/bench_memory_online.py`` under
the runner's own memory onlining (the guest's memory-onliner) and the guest's fast path
(memory-watch's memory.high and its signals), with the real agent and extender.

A small TCG guest (so that small workloads press it) runs, in order: a page-cache-heavy
workload (a data disk larger than the VM's maximum read in a loop, beside a process whose
anonymous memory grows), a kernel-memory-heavy one (empty files in a tmpfs: inodes and
dentries, which only the kernel's zones can hold), the same kernel workload after the VM grew
to its maximum and shrank back, and ``dd`` writing into a tmpfs faster than one scrape
interval. A second guest, booted at 512 MiB, creates 600,000 files: more kernel memory than
its boot memory, which only blocks onlined to a kernel zone can hold. Each must end without
an OOM kill, and the agent must have grown the VM during it. Nothing asserts on time; the
benchmark measures that.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testkit.local_stack import GuestImage, stopping, value
from testkit.memory_workloads import WORKLOADS, Sizes, boot, kernel, oom_kills, oom_report

pytestmark = [pytest.mark.qemu, pytest.mark.qemu_apart, pytest.mark.slow, pytest.mark.timeout(300)]

SIZES = Sizes(
    memory="256Mi",
    max_memory="768Mi",
    disk_mib=1024,
    anon_mib=224,
    files=150_000,
    fill_mib=480,
    writer_mib=400,
    shrink_after_seconds=2.0,
    release_seconds=5.0,  # longer than the agent's shrink window plus a scrape
    timeout_seconds=120.0,
)
# The kernel workload that a boot-sized part of movable memory could not hold (issue: the
# kernel's auto-movable policy at ratio 100 was OOM-killed by it).
FILES_512 = Sizes(
    memory="512Mi",
    max_memory="2560Mi",
    disk_mib=64,
    files=600_000,
    shrink_after_seconds=2.0,
    release_seconds=5.0,
    timeout_seconds=240.0,
)


def test_each_workload_grows_the_vm_without_an_oom(guest_image: GuestImage, tmp_path: Path):
    with stopping([]) as services:
        # No kernel arguments of our own: the runner's onlining is what is tested.
        guest, agent = boot(tmp_path, SIZES, "", services)
        for name, run in WORKLOADS.items():
            result = run(guest, SIZES)
            assert not result["was_killed"] and not result["was_stuck"], (name, result)
            if oom_kills(guest) != 0:
                pytest.fail(f"{name}: OOM in the guest: {result}\n{oom_report(guest)}")
            if name == "grown":
                # It grew for the fill before shrinking back; the kernel workload after it may
                # start above its needs (memory the kernel took meanwhile stays plugged).
                assert result["fill_plugged_peak_mib"] > 0, (name, result)
            else:
                assert result["plugged_peak_mib"] > result["plugged_start_mib"], (name, result)
        # The writer crossed its memory.high: the guest said so on its port, and the agent
        # heard it (the fast path is wired end to end, not only its scrapes).
        signals = value(agent.metrics(), "vmautoscale_agent_memory_signals_total")
        assert signals is not None and signals > 0


def test_600000_files_in_a_512_mib_guest_get_kernel_memory(guest_image: GuestImage, tmp_path: Path):
    with stopping([]) as services:
        guest, _ = boot(tmp_path, FILES_512, "", services)
        result = kernel(guest, FILES_512)
        assert not result["was_killed"] and not result["was_stuck"], result
        if oom_kills(guest) != 0:
            pytest.fail(f"OOM in the guest: {result}\n{oom_report(guest)}")
        assert result["plugged_peak_mib"] > result["plugged_start_mib"], result
        # The growth went to a kernel zone: the onliner chose it for this workload.
        out = guest.type('echo "kernel=$(dmesg | grep -c "memory-onliner: .* online_kernel")"')
        found = re.search(r"kernel=(\d+)", out)
        assert found is not None and int(found.group(1)) > 0, out
