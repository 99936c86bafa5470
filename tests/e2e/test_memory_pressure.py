"""Memory pressure on a real guest: the three workloads of ``scripts/bench_memory_online.py``
under the runner's own memory onlining policy, with the real agent and extender.

One TCG guest (small, so that small workloads press it) runs, in order: a page-cache-heavy
workload (a data disk larger than the VM's maximum read in a loop, beside a process whose
anonymous memory grows), a kernel-memory-heavy one (empty files in a tmpfs: inodes and
dentries, which only the kernel's zones can hold), and the same kernel workload after the VM
grew to its maximum and shrank back. Each must end without an OOM kill, and the agent must
have grown the VM during it. Nothing asserts on time; the benchmark measures that.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.local_stack import GuestImage, stopping
from testkit.memory_workloads import WORKLOADS, Sizes, boot, oom_kills

pytestmark = [pytest.mark.qemu, pytest.mark.qemu_apart, pytest.mark.slow, pytest.mark.timeout(300)]

SIZES = Sizes(
    memory="256Mi",
    max_memory="768Mi",
    disk_mib=1024,
    anon_mib=224,
    files=150_000,
    fill_mib=480,
    shrink_after_seconds=2.0,
    release_seconds=5.0,  # longer than the agent's shrink window plus a scrape
    timeout_seconds=120.0,
)


def test_each_workload_grows_the_vm_without_an_oom(guest_image: GuestImage, tmp_path: Path):
    with stopping([]) as services:
        # No kernel arguments of our own: the runner's onlining policy is what is tested.
        guest, _ = boot(tmp_path, SIZES, "", services)
        for name, run in WORKLOADS.items():
            result = run(guest, SIZES)
            assert not result["was_killed"] and not result["was_stuck"], (name, result)
            assert oom_kills(guest) == 0, (name, result)
            if name == "grown":
                # It grew for the fill before shrinking back; the kernel workload after it may
                # start above its needs (memory the kernel took meanwhile stays plugged).
                assert result["fill_plugged_peak_mib"] > 0, (name, result)
            else:
                assert result["plugged_peak_mib"] > result["plugged_start_mib"], (name, result)
