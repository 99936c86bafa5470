"""Benchmark: how hot-plugged memory is onlined, under workloads that stall a guest's kernel.

For each onlining policy (``--policies``) boots the minimal guest under TCG with a virtio-mem
device, the extender (standalone) and the agent, as ``scripts/bench_memory.py`` does, with
the policy's kernel arguments after the runner's own (the last ``memhp_default_state`` wins):

* ``movable``: ``memhp_default_state=online_movable`` (the runner's default): every plugged
  block in ZONE_MOVABLE, which kernel allocations cannot use, and which can all be unplugged;
* ``normal``: ``memhp_default_state=online_kernel``: every block usable by the kernel, and
  then pinned by what the kernel puts there;
* ``auto-movable``: ``memhp_default_state=online memory_hotplug.online_policy=auto-movable
  memory_hotplug.auto_movable_ratio=R``: movable as long as movable memory stays within R% of
  the kernel's, normal beyond (Documentation/admin-guide/mm/memory-hotplug.rst).

Workloads, in order, on one guest per policy:

* ``kernel``: kernel memory: ``--files`` empty files in a tmpfs (inodes and dentries: slab);
* ``grown``: the VM first grows to its maximum (``--fill-mib`` written into a tmpfs) and
  shrinks back once that is deleted, then the same kernel workload again.

(A page-cache workload needs a disk; the minimal guest has none, so it is left out here.)

For each: whether the guest OOM-killed anything (dmesg), PSI memory ``full`` stall seconds
(node_exporter), time from the first poll showing pressure (PSI ``some`` rising) to MemTotal
growing, the memory plugged at the end of the workload, and what was still plugged after the
files were deleted and the agent's shrink window passed: what a later shrink could not give
back.

    .venv/bin/python scripts/bench_memory_online.py [--policies movable,auto-movable]

Prints one JSON object. Several minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.local_stack import (
    Guest,
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


def poll(guest: Guest) -> tuple[float, float, float]:
    """(MemTotal, PSI some seconds, PSI full seconds); zeros on a missed poll."""
    try:
        s = guest.scrape(timeout_seconds=2.0)
    except (OSError, ValueError):  # a stalled TCG guest's exporter may miss a poll
        return 0.0, 0.0, 0.0
    return (
        value(s, "node_memory_MemTotal_bytes") or 0.0,
        value(s, "node_pressure_memory_waiting_seconds_total") or 0.0,
        value(s, "node_pressure_memory_stalled_seconds_total") or 0.0,
    )


def ooms(guest: Guest) -> int:
    out = guest.type('echo "oom=$(dmesg | grep -ci -e "out of memory" -e oom-kill)"')
    found = re.search(r"oom=(\d+)", out)
    return int(found.group(1)) if found else -1


def kernel_workload(guest: Guest, files: int, *, timeout_seconds: float) -> dict[str, object]:
    """``files`` empty files in a tmpfs, watched every 0.2 s until the command returns."""
    total0, some0, full0 = poll(guest)
    guest.type("mkdir -p /mnt/k && mount -t tmpfs -o size=4g,nr_inodes=0 tmpfs /mnt/k")
    start = time.monotonic()
    guest.type(f"(cd /mnt/k && seq 1 {files} | xargs touch; echo finished > /tmp/k.done) &")
    pressure_at = online_at = None
    last_some = some0
    full = full0
    while time.monotonic() - start < timeout_seconds:
        total, some, full_now = poll(guest)
        now = time.monotonic()
        if total and pressure_at is None and some > last_some + 0.05:
            pressure_at = now
        if total and online_at is None and total > total0:
            online_at = now
        last_some = some or last_some
        full = full_now or full
        if "finished" in guest.type("cat /tmp/k.done 2>/dev/null", timeout_seconds=60):
            break
        if not guest.runner.is_running():
            raise AssertionError(f"the guest exited; its log ends:\n{guest.runner.log_tail()}")
        time.sleep(0.2)
    else:
        raise AssertionError(f"{files} files not created within {timeout_seconds}s")
    to_online = (
        round(max(0.0, online_at - pressure_at), 2)
        if pressure_at is not None and online_at is not None
        else None
    )
    return {
        "seconds": round(time.monotonic() - start, 1),
        "full_stall_seconds": round(full - full0, 3),
        "pressure_to_online_seconds": to_online,
        "plugged_mib": guest.query_plugged_memory() // MiB,
    }


def release(guest: Guest, *, wait_seconds: float) -> int:
    """Delete the files; MiB still plugged after ``wait_seconds`` (the agent's shrink)."""
    guest.type("rm -rf /mnt/k/* /mnt/hog/* /tmp/k.done; umount /mnt/k", timeout_seconds=120)
    time.sleep(wait_seconds)
    return guest.query_plugged_memory() // MiB


def run_policy(name: str, args: argparse.Namespace, workdir: Path) -> dict[str, object]:
    kernel_args = POLICIES[name].format(ratio=args.ratio)
    with stopping([]) as services:
        guest = start_runner(
            build_minimal_image(),
            workdir,
            min_vcpus=1,
            max_vcpus=2,
            memory=args.memory,
            max_memory=args.max_memory,
            kernel_args=kernel_args,
        )
        services.append(guest.runner)
        wait_booted(guest)
        vm = VmPod(min_vcpus=1, max_vcpus=2, memory=args.memory, max_memory=args.max_memory)
        _, agent = start_extender_and_agent(
            workdir,
            guest,
            vm,
            node_cpu="4",
            agent_config={
                "scrape": {"interval_seconds": 1.0, "timeout_seconds": 0.9},
                "memory": {"shrink_after_seconds": args.shrink_after_seconds},
                "extender": {"permit_retry_seconds": 1.0},
                "log": {"level": "info"},
            },
            started=services,
        )
        out: dict[str, object] = {"kernel_args": kernel_args}
        kernel = kernel_workload(guest, args.files, timeout_seconds=args.timeout_seconds)
        kernel["plugged_after_release_mib"] = release(guest, wait_seconds=args.release_seconds)
        kernel["oom_kills"] = ooms(guest)
        out["kernel"] = kernel
        guest.type("mkdir -p /mnt/hog && mount -t tmpfs -o size=4g tmpfs /mnt/hog")
        guest.type(f"dd if=/dev/zero of=/mnt/hog/fill bs=1M count={args.fill_mib} 2>/dev/null")
        peak = guest.query_plugged_memory() // MiB
        after_fill = release(guest, wait_seconds=args.release_seconds)
        grown = kernel_workload(guest, args.files, timeout_seconds=args.timeout_seconds)
        grown["fill_peak_plugged_mib"] = peak
        grown["fill_plugged_after_release_mib"] = after_fill
        grown["plugged_after_release_mib"] = release(guest, wait_seconds=args.release_seconds)
        grown["oom_kills"] = ooms(guest)  # cumulative since boot
        out["grown"] = grown
        samples = agent.metrics()
        out["agent_pressure_grows"] = value(
            samples, "vmautoscale_agent_memory_pressure_grows_total"
        )
        out["agent_memory_grows"] = value(
            samples, "vmautoscale_agent_memory_resizes_total", direction="grow", result="ok"
        )
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench_memory_online.py",
        description="OOMs, PSI stalls and give-back of hot-plugged memory under each onlining "
        "policy, on a real TCG guest with the real agent and extender; prints JSON.",
    )
    parser.add_argument("--policies", default="movable,auto-movable,normal")
    parser.add_argument("--ratio", type=int, default=301, help="auto_movable_ratio, percent")
    parser.add_argument("--files", type=int, default=300_000, help="files per kernel workload")
    parser.add_argument("--fill-mib", type=int, default=1200, help="MiB written to grow to max")
    parser.add_argument("--memory", default="512Mi")
    parser.add_argument("--max-memory", default="2048Mi")
    parser.add_argument("--shrink-after-seconds", type=float, default=4.0)
    parser.add_argument("--release-seconds", type=float, default=15.0)
    parser.add_argument("--timeout-seconds", type=float, default=300.0)
    args = parser.parse_args(argv)
    result: dict[str, object] = {
        "config": {k: v for k, v in vars(args).items() if k != "policies"} | {"accel": "tcg"}
    }
    for name in args.policies.split(","):
        with tempfile.TemporaryDirectory(prefix=f"bench-online-{name}-") as tmp:
            result[name] = run_policy(name, args, Path(tmp))
        print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
