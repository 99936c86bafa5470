"""Benchmark: how hot-plugged memory is onlined, under workloads that stall a guest's kernel.

For each onlining policy (``--policies``) boots the minimal guest under TCG with a virtio-mem
device and a data disk, the extender (standalone) and the agent, as ``scripts/bench_memory.py``
does, with the policy's kernel arguments after the runner's own (the last
``memhp_default_state`` wins):

* ``movable``: ``memhp_default_state=online_movable``: every plugged block in ZONE_MOVABLE,
  which kernel allocations cannot use, and which can all be unplugged again;
* ``normal``: ``memhp_default_state=online_kernel``: every block usable by the kernel, and
  then pinned by whatever the kernel puts there;
* ``auto-movable``: ``memhp_default_state=online memory_hotplug.online_policy=auto-movable
  memory_hotplug.auto_movable_ratio=R``: movable as long as movable memory stays within R% of
  the kernel's, normal beyond (Documentation/admin-guide/mm/memory-hotplug.rst).

Workloads, in order, on one guest per policy (``WORKLOADS``):

* ``page_cache``: the disk (larger than the VM's maximum) read over and over, filling the page
  cache, beside a process whose anonymous memory grows to ``--anon-mib``;
* ``kernel``: kernel memory: ``--files`` empty files in a tmpfs (inodes and dentries: slab,
  which only the kernel's zones can hold; MemAvailable counts part of it as reclaimable);
* ``grown``: the VM grows to its maximum (a process's anonymous memory growing to
  ``--fill-mib``) and shrinks back once it exits; then the kernel workload again.

For each: the guest's OOM kills (dmesg, cumulative), PSI memory ``full`` stall seconds, time
from the first poll showing pressure (PSI ``some`` rising, or MemAvailable below the agent's
low headroom) to MemTotal growing, the memory plugged at the end, and what was still plugged
after the workload's memory was freed and the agent's shrinks settled (``release``): what a
later shrink could not give back.

    .venv/bin/python scripts/bench_memory_online.py [--policies movable,auto-movable]

Prints one JSON object. Several minutes per policy on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.local_stack import (
    Agent,
    Guest,
    Service,
    VmPod,
    build_minimal_image,
    start_extender_and_agent,
    start_runner,
    stopping,
    value,
    wait_booted,
)

MiB = 2**20
POLICIES = {
    "movable": "memhp_default_state=online_movable",
    "normal": "memhp_default_state=online_kernel",
    "auto-movable": "memhp_default_state=online memory_hotplug.online_policy=auto-movable"
    " memory_hotplug.auto_movable_ratio={ratio}",
}
DONE = "/tmp/workload.done"


@dataclass(frozen=True)
class Sizes:
    memory: str = "512Mi"
    max_memory: str = "2048Mi"
    disk_mib: int = 3072  # above the maximum: the page cache can never hold it all
    anon_mib: int = 600
    files: int = 600_000
    fill_mib: int = 1200
    shrink_after_seconds: float = 4.0
    release_seconds: float = 8.0  # the plugged size settled: unchanged this long
    timeout_seconds: float = 300.0


def boot(
    workdir: Path, sizes: Sizes, kernel_args: str, services: list[Service]
) -> tuple[Guest, Agent]:
    """The guest with a sparse data disk, the extender and the agent; services are appended
    to ``services`` as they start, so the caller stops them whatever happens."""
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
            "memory": {"shrink_after_seconds": sizes.shrink_after_seconds},
            "extender": {"permit_retry_seconds": 1.0},
            "log": {"level": "info"},
        },
        started=services,
    )
    guest.type("mkdir -p /mnt/k && mount -t tmpfs -o size=8g,nr_inodes=0 tmpfs /mnt/k")
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
    result["plugged_after_release_mib"] = release(
        guest, "rm -rf /mnt/k; mkdir -p /mnt/k", wait_seconds=sizes.release_seconds
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


WORKLOADS = {"page_cache": page_cache, "kernel": kernel, "grown": grown}


def kernel_args_of(name: str, ratio: int) -> str:
    """A policy's kernel arguments; ``auto-movable-N`` is auto-movable with ratio N%."""
    base, _, own = name.partition("-movable-")
    if base == "auto" and own:
        return POLICIES["auto-movable"].format(ratio=int(own))
    return POLICIES[name].format(ratio=ratio)


def run_policy(name: str, sizes: Sizes, ratio: int, workdir: Path) -> dict[str, Any]:
    kernel_args = kernel_args_of(name, ratio)
    with stopping([]) as services:
        guest, agent = boot(workdir, sizes, kernel_args, services)
        out: dict[str, Any] = {"kernel_args": kernel_args}
        for workload, run in WORKLOADS.items():
            result = run(guest, sizes)
            result["oom_kills_since_boot"] = oom_kills(guest)
            out[workload] = result
            print(json.dumps({name: {workload: result}}), file=sys.stderr, flush=True)
        samples = agent.metrics()
        out["agent_memory_grows"] = value(
            samples, "vmautoscale_agent_memory_resizes_total", direction="grow", result="ok"
        )
        out["agent_pressure_grows"] = value(
            samples, "vmautoscale_agent_memory_pressure_grows_total"
        )
        out["agent_stalled_seconds"] = value(
            samples, "vmautoscale_agent_memory_stalled_seconds_total"
        )
        return out


def main(argv: list[str] | None = None) -> int:
    defaults = Sizes()
    parser = argparse.ArgumentParser(
        prog="scripts/bench_memory_online.py",
        description="OOMs, PSI stalls and give-back of hot-plugged memory under each onlining "
        "policy, on a real TCG guest with the real agent and extender; prints JSON.",
    )
    parser.add_argument(
        "--policies",
        default="movable,auto-movable,normal",
        help="comma-separated: movable, normal, auto-movable (--ratio), auto-movable-N",
    )
    parser.add_argument("--ratio", type=int, default=301, help="auto_movable_ratio, percent")
    parser.add_argument("--memory", default=defaults.memory)
    parser.add_argument("--max-memory", default=defaults.max_memory)
    parser.add_argument("--anon-mib", type=int, default=defaults.anon_mib)
    parser.add_argument("--files", type=int, default=defaults.files)
    parser.add_argument("--fill-mib", type=int, default=defaults.fill_mib)
    parser.add_argument("--release-seconds", type=float, default=defaults.release_seconds)
    parser.add_argument("--log-dir", help="copy each policy's runner, extender and agent logs here")
    args = parser.parse_args(argv)
    sizes = Sizes(
        memory=args.memory,
        max_memory=args.max_memory,
        anon_mib=args.anon_mib,
        files=args.files,
        fill_mib=args.fill_mib,
        release_seconds=args.release_seconds,
    )
    result: dict[str, Any] = {"config": vars(args) | {"accel": "tcg"}}
    for name in args.policies.split(","):
        with tempfile.TemporaryDirectory(prefix=f"bench-online-{name}-") as tmp:
            try:
                result[name] = run_policy(name, sizes, args.ratio, Path(tmp))
            except (OSError, AssertionError) as e:
                # A guest wedged in reclaim stops answering: that is this policy's result.
                result[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
                print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
            if args.log_dir:
                keep = Path(args.log_dir) / name
                keep.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, keep / log.name)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
