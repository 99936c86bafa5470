"""Memory pressure on a real guest: the workloads of ``scripts/bench_memory_online.py`` under
the runner's own memory onlining (the guest's memory-onliner) and the guest's fast path
(memory-watch's memory.high and its signals), with the real agent and extender.

One TCG guest, 512 MiB at boot and 2.5 GiB at most (the runner's shape that issue 39 found
OOM-killed), runs, in order: a page-cache-heavy workload (a data disk larger than the VM's
maximum read in a loop, beside a process whose anonymous memory grows), a kernel-memory-heavy
one (600,000 empty files in a tmpfs: inodes and dentries, more than the boot memory, which
only blocks onlined to a kernel zone can hold), the same kernel workload after the VM grew to
its maximum and shrank back, and ``dd`` writing twice the boot memory into a tmpfs faster than
one scrape interval. One guest for all of them: each boot costs the suite's QEMU tier. Each
must end without an OOM kill, and the agent must have grown the VM during it. Nothing asserts
on time; the benchmark measures that.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testkit.local_stack import GuestImage, stopping, value
from testkit.memory_workloads import WORKLOADS, Sizes, boot, oom_kills, oom_report

pytestmark = [pytest.mark.qemu, pytest.mark.qemu_apart, pytest.mark.slow, pytest.mark.timeout(480)]

SIZES = Sizes(
    memory="512Mi",
    max_memory="2560Mi",
    disk_mib=3072,  # sparse; larger than the VM's maximum
    anon_mib=600,
    files=600_000,  # ~600 MiB of inodes and dentries: more than the guest's boot memory
    fill_mib=1200,
    writer_mib=1024,  # twice the boot memory, at dd's speed
    shrink_after_seconds=2.0,
    release_seconds=5.0,  # longer than the agent's shrink window plus a scrape
    timeout_seconds=240.0,
)


def test_each_workload_grows_the_vm_without_an_oom(guest_image: GuestImage, tmp_path: Path):
    with stopping([]) as services:
        # No kernel arguments of our own: the runner's onlining is what is tested.
        guest, agent = boot(tmp_path, SIZES, "", services)
        for name, run in WORKLOADS.items():
            result = run(guest, SIZES)
            print(name, result)  # the figures, in the run's log (-rP)
            assert not result["was_killed"] and not result["was_stuck"], (name, result)
            if oom_kills(guest) != 0:
                pytest.fail(f"{name}: OOM in the guest: {result}\n{oom_report(guest)}")
            if name == "grown":
                # It grew for the fill before shrinking back; the kernel workload after it may
                # start above its needs (memory the kernel took meanwhile stays plugged).
                assert result["fill_plugged_peak_mib"] > 0, (name, result)
            else:
                assert result["plugged_peak_mib"] > result["plugged_start_mib"], (name, result)
            if name == "kernel":
                # The kernel's growth went to a kernel zone: the onliner chose it.
                out = guest.type(
                    'echo "kernel=$(dmesg | grep -c "memory-onliner: .* online_kernel")"'
                )
                assert re.search(r"kernel=[1-9]", out), (out, oom_report(guest))
        # The writer crossed its memory.high: the guest said so on its port, and the agent
        # heard it (the fast path is wired end to end, not only its scrapes).
        signals = value(agent.metrics(), "vmautoscale_agent_memory_signals_total")
        assert signals is not None and signals > 0
