"""Memory workloads for a real guest under the agent: what ``scripts/bench_memory_online.py``
measures under each memory onlining policy and ``tests/e2e/test_memory_pressure.py`` checks
under the runner's own.

``boot`` starts the minimal guest (with a virtio-mem device and a sparse data disk), the
extender and the agent; ``WORKLOADS`` are, in order:

* ``page_cache``: the data disk (larger than the VM's maximum) read over and over, filling
  the page cache, beside a process whose anonymous memory grows to ``Sizes.anon_mib``;
* ``kernel``: kernel memory: ``Sizes.files`` empty files in a tmpfs (inodes and dentries:
  slab, which only the kernel's zones can hold, and which MemAvailable counts in part as
  reclaimable);
* ``grown``: the VM grows to its maximum (a process's anonymous memory growing to
  ``Sizes.fill_mib``, at the grower's pace) and shrinks back once it exits; then the kernel
  workload again;
* ``writer``: ``dd`` writes ``Sizes.writer_mib`` into a tmpfs as fast as it can (memory no
  reclaim can free, faster than one scrape interval), then the file is removed.

Each returns the guest's figures while it ran (``watch``) and what stayed plugged once the
agent's shrinks settled after its memory was freed (``release``).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from testkit.local_stack import (
    Agent,
    Guest,
    Service,
    VmPod,
    build_minimal_image,
    start_extender_and_agent,
    start_runner,
    value,
    wait_booted,
)

MiB = 2**20
DONE = "/tmp/workload.done"
# The tmpfs the kernel and writer workloads fill: no size or inode limit of its own.
MOUNT_TMPFS = "mount -t tmpfs -o size=8g,nr_inodes=0 tmpfs /mnt/k"


@dataclass(frozen=True)
class Sizes:
    memory: str = "512Mi"
    max_memory: str = "2560Mi"
    disk_mib: int = 3072  # above the maximum: the page cache can never hold it all
    anon_mib: int = 600
    files: int = 600_000
    fill_mib: int = 1200
    writer_mib: int = 1024
    shrink_after_seconds: float = 4.0
    release_seconds: float = 8.0  # the plugged size settled: unchanged this long
    timeout_seconds: float = 300.0


def boot(
    workdir: Path,
    sizes: Sizes,
    kernel_args: str,
    services: list[Service],
    *,
    guest_signals: bool = True,
) -> tuple[Guest, Agent]:
    """The guest with a sparse data disk, the extender and the agent; services are appended
    to ``services`` as they start, so the caller stops them whatever happens.
    ``guest_signals``: whether the agent reads the guest's memory-pressure port (the fast
    path) or waits for its scrapes alone."""
    disk = workdir / "data.img"
    with disk.open("wb") as f:
        f.truncate(sizes.disk_mib * MiB)  # sparse: costs nothing on the host
    guest = start_runner(
        build_minimal_image(),
        workdir,
        min_vcpus=1,
        max_vcpus=2,
        memory=sizes.memory,
        max_memory=sizes.max_memory,
        kernel_args=kernel_args,
        disk=disk,
    )
    services.append(guest.runner)
    wait_booted(guest)
    vm = VmPod(min_vcpus=1, max_vcpus=2, memory=sizes.memory, max_memory=sizes.max_memory)
    _, agent = start_extender_and_agent(
        workdir,
        guest,
        vm,
        node_cpu="4",
        agent_config={
            "scrape": {"interval_seconds": 1.0, "timeout_seconds": 0.9},
            "memory": {
                "shrink_after_seconds": sizes.shrink_after_seconds,
                "guest_signals": guest_signals,
            },
            "extender": {"permit_retry_seconds": 1.0},
            "log": {"level": "info"},
        },
        started=services,
    )
    guest.type(f"mkdir -p /mnt/k && {MOUNT_TMPFS}")
    return guest, agent


def poll(guest: Guest) -> tuple[float, float, float, float] | None:
    """(MemTotal, MemAvailable, PSI some seconds, PSI full seconds); None on a missed poll."""
    try:
        s = guest.scrape(timeout_seconds=2.0)
    except (OSError, ValueError):  # a stalled TCG guest's exporter may miss a poll
        return None
    return (
        value(s, "node_memory_MemTotal_bytes") or 0.0,
        value(s, "node_memory_MemAvailable_bytes") or 0.0,
        value(s, "node_pressure_memory_waiting_seconds_total") or 0.0,
        value(s, "node_pressure_memory_stalled_seconds_total") or 0.0,
    )


def watch(guest: Guest, command: str, *, timeout_seconds: float) -> dict[str, Any]:
    """Run ``command`` in the guest's background and watch it until it finishes."""
    first = None
    while first is None:
        first = poll(guest)
    total0, _, some0, full0 = first
    plugged_start = guest.query_plugged_memory()
    type_in(guest, f"rm -f {DONE}; ({command}; echo finished > {DONE}) >/dev/null 2>&1 &")
    start = time.monotonic()
    pressure_at = online_at = None
    last_some, full = some0, full0
    plugged_peak = plugged_start
    is_oom = is_stuck = False
    while True:
        sample = poll(guest)
        now = time.monotonic()
        if sample is not None:
            total, avail, some, full = sample
            low = avail < max(128 * MiB, 0.2 * (total - avail))
            if pressure_at is None and (some > last_some + 0.05 or low):
                pressure_at = now
            if online_at is None and total > total0:
                online_at = now
            last_some = some
        plugged_peak = max(plugged_peak, guest.query_plugged_memory())
        try:
            if "finished" in guest.type(f"cat {DONE} 2>/dev/null", timeout_seconds=60):
                break
        except TimeoutError:
            # The guest's shell did not answer for a minute: the guest is stuck in reclaim.
            is_stuck = True
            break
        except OSError as e:
            # The OOM killer took the guest's shell (busybox init starts another): the
            # workload is dead too; its kills are counted from dmesg afterwards.
            if "Out of memory" not in str(e):
                raise
            is_oom = True
            time.sleep(2)
            break
        if not guest.runner.is_running():
            raise AssertionError(f"the guest exited; its log ends:\n{guest.runner.log_tail()}")
        if now - start > timeout_seconds:
            raise AssertionError(f"{command!r} did not finish within {timeout_seconds}s")
        time.sleep(0.2)
    return {
        "seconds": round(time.monotonic() - start, 1),
        "full_stall_seconds": round(full - full0, 3),
        "pressure_to_online_seconds": (
            round(max(0.0, online_at - pressure_at), 2)
            if pressure_at is not None and online_at is not None
            else None
        ),
        "was_killed": is_oom,
        "was_stuck": is_stuck,
        "plugged_start_mib": plugged_start // MiB,
        "plugged_peak_mib": plugged_peak // MiB,
    }


def release(guest: Guest, command: str, *, wait_seconds: float) -> int:
    """Free the workload's memory (``command``), then wait for the agent's shrinks to settle:
    until the plugged size is 0 or has not moved for ``wait_seconds`` (at most 120 s). Returns
    the MiB still plugged: what a shrink could not give back."""
    type_in(guest, command, timeout_seconds=300)
    start = changed_at = time.monotonic()
    plugged = guest.query_plugged_memory()
    while plugged and time.monotonic() - changed_at < wait_seconds:
        if time.monotonic() - start > 120:
            break
        time.sleep(0.5)
        now = guest.query_plugged_memory()
        if now != plugged:
            plugged, changed_at = now, time.monotonic()
    return plugged // MiB


def type_in(guest: Guest, command: str, *, timeout_seconds: float = 60.0) -> str:
    """``guest.type``, again after an OOM kill took the shell (busybox init restarts it)."""
    for _ in range(5):
        try:
            return guest.type(command, timeout_seconds=timeout_seconds)
        except OSError as e:
            if "closed" not in str(e) and "Out of memory" not in str(e):
                raise
            time.sleep(2)
    return guest.type(command, timeout_seconds=timeout_seconds)


def oom_kills(guest: Guest) -> int:
    out = type_in(guest, 'echo "oom=$(dmesg | grep -ci -e "out of memory" -e oom-kill)"')
    found = re.search(r"oom=(\d+)", out)
    return int(found.group(1)) if found else -1


def oom_report(guest: Guest) -> str:
    """What the guest's kernel said of its OOM kills (who asked, in which zone, whom it
    killed) and what the memory onliner chose: the message of a failed no-OOM assertion."""
    return type_in(
        guest,
        "dmesg | grep -i -e 'invoked oom' -e 'out of memory' -e oom-kill -e 'memory-onliner'"
        " -e 'Node 0 Normal free' -e 'Node 0 Movable free' | tail -n 40",
    )


def agent_events(agent: Agent, *, skip: int = 0) -> list[dict[str, Any]]:
    """The agent's log lines (JSON) from the ``skip``-th on; what is not JSON is left out."""
    events = []
    lines = agent.service.log_path.read_text(errors="replace").splitlines()
    for line in lines[skip:]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event:
            events.append(event)
    return events


def log_lines(agent: Agent) -> int:
    return len(agent.service.log_path.read_text(errors="replace").splitlines())


def signalled_grows(events: list[dict[str, Any]]) -> list[dict[str, float]]:
    """For each memory grow the agent decided on a scrape a guest's signal brought forward
    (its ``memory_goal`` line says so): seconds from the signal to the memory plugged (its
    next ``memory_resize_succeeded``), by the fast path and as the scrapes alone would have
    done it (the same decision, ``scrape_later_seconds`` later)."""
    grows = []
    for i, event in enumerate(events):
        if event["event"] != "memory_goal" or "signal_to_goal_seconds" not in event:
            continue
        decided = datetime.fromisoformat(event["timestamp"])
        plugged = next(
            (e for e in events[i + 1 :] if e["event"] == "memory_resize_succeeded"), None
        )
        if plugged is None:
            continue
        to_plugged = (datetime.fromisoformat(plugged["timestamp"]) - decided).total_seconds()
        fast = event["signal_to_goal_seconds"] + to_plugged
        grows.append(
            {
                "fast_path_seconds": round(fast, 2),
                "scrape_seconds": round(fast + event["scrape_later_seconds"], 2),
            }
        )
    return grows


def grow_anon(mib: int) -> str:
    """A shell command: a process whose anonymous memory grows by 1 MiB strings to ``mib``
    (64 MiB a second), held for 2 s."""
    return (
        'awk \'BEGIN { s = sprintf("%1048576s", "");'
        f' for (i = 0; i < {mib}; i++) {{ a[i] = s i; if (i % 64 == 63) system("sleep 1") }}'
        ' system("sleep 2") }\''
    )


def page_cache(guest: Guest, sizes: Sizes) -> dict[str, Any]:
    guest.type(
        "(while true; do dd if=/dev/vda of=/dev/null bs=1M 2>/dev/null; done) &"
        " echo $! > /tmp/reader.pid"
    )
    result = watch(guest, grow_anon(sizes.anon_mib), timeout_seconds=sizes.timeout_seconds)
    result["plugged_after_release_mib"] = release(
        guest,
        "kill $(cat /tmp/reader.pid); killall dd; echo 1 > /proc/sys/vm/drop_caches",
        wait_seconds=sizes.release_seconds,
    )
    return result


def kernel(guest: Guest, sizes: Sizes) -> dict[str, Any]:
    result = watch(
        guest,
        f"cd /mnt/k && seq 1 {sizes.files} | xargs touch",
        timeout_seconds=sizes.timeout_seconds,
    )
    # Unmounted, not removed file by file: the kernel frees every inode and dentry at once,
    # where rm -rf of 600,000 files under TCG takes longer than creating them.
    result["plugged_after_release_mib"] = release(
        guest, f"umount /mnt/k && {MOUNT_TMPFS}", wait_seconds=sizes.release_seconds
    )
    return result


def grown(guest: Guest, sizes: Sizes) -> dict[str, Any]:
    # At the anonymous grower's pace: this is about the VM after a grow to its maximum and a
    # shrink back, not about a writer outrunning the agent (a small guest written into at
    # dd's speed can be OOM-killed before any agent's next scrape).
    fill = watch(guest, grow_anon(sizes.fill_mib), timeout_seconds=sizes.timeout_seconds)
    after_fill = release(guest, "true", wait_seconds=sizes.release_seconds)
    result = kernel(guest, sizes)
    result["fill_plugged_peak_mib"] = fill["plugged_peak_mib"]
    result["fill_plugged_after_release_mib"] = after_fill
    return result


def writer(guest: Guest, sizes: Sizes) -> dict[str, Any]:
    result = watch(
        guest,
        f"dd if=/dev/zero of=/mnt/k/written bs=1M count={sizes.writer_mib}",
        timeout_seconds=sizes.timeout_seconds,
    )
    result["plugged_after_release_mib"] = release(
        guest, "rm -f /mnt/k/written", wait_seconds=sizes.release_seconds
    )
    return result


WORKLOADS = {"page_cache": page_cache, "kernel": kernel, "grown": grown, "writer": writer}
