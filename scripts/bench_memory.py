"""Benchmark: memory pressure in a real guest -> memory online, and the shrink after it.

Boots the minimal guest under TCG with a virtio-mem device (``--memory`` .. ``--max-memory``),
the extender (standalone) and the agent, as ``tests/e2e/test_memory_scaling.py`` does. Each
round writes ``--step-mib`` MiB into a tmpfs in the guest (in the background, as fast as the
guest can) and times, from the moment the write starts:

* ``pressure_to_online``: from the first poll (the guest's node_exporter, every 0.1 s) where the
  guest is under memory pressure (MemAvailable below the agent's low headroom, max(128 MiB,
  20% of the use)), to the first poll where MemTotal shows more memory than it had: the agent
  saw the pressure, got the permit, plugged memory and the guest onlined it. 0 when the agent
  grew before the guest reached that point (it projects a fast-rising use ahead);
  ``write_to_online`` is the same from the start of the write (under TCG the write itself
  takes seconds);
* then deletes the files and times ``shrink``: until the device's plugged size (QMP) is back at
  0 and the extender's record at the minimum. It includes the agent's shrink window
  (``--shrink-after-seconds``), reported beside it.

Baseline, measured in the same run before the agent starts: the same amount plugged straight
through QMP, from ``qom-set`` to MemTotal showing it (``plug_to_online``). The ratio says what
the agent's loop (scrape interval, decision, permit round trip) adds to the hypervisor's and
guest's own time. OOM kills in the guest are counted; any is a failure of the policy.

    .venv/bin/python scripts/bench_memory.py [--rounds 6] [--step-mib 300]

Prints one JSON object. A couple of minutes on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import structlog

from autoscaler_agent.hypervisor.qmp import QmpClient
from testkit import bench as kit
from testkit.local_stack import (
    Guest,
    VmPod,
    build_minimal_image,
    eventually,
    start_extender_and_agent,
    start_runner,
    stopping,
    value,
    wait_booted,
)

MiB = 2**20


def mem_total(guest: Guest) -> float:
    total = value(guest.scrape(timeout_seconds=2.0), "node_memory_MemTotal_bytes")
    if total is None:
        raise ValueError("no MemTotal")
    return total


def watch_grow(guest: Guest, before: float, *, timeout_seconds: float) -> tuple[float, float]:
    """Poll until MemTotal > ``before``; (seconds under pressure before that, when it was)."""
    start = time.monotonic()
    pressure_at: float | None = None
    while True:
        try:
            samples = guest.scrape(timeout_seconds=2.0)
        except (OSError, ValueError):  # a busy TCG guest's exporter may miss a poll
            samples = {}
        now = time.monotonic()
        total = value(samples, "node_memory_MemTotal_bytes") or 0.0
        avail = value(samples, "node_memory_MemAvailable_bytes") or 0.0
        if total > before:
            return (now - pressure_at if pressure_at is not None else 0.0), now
        if pressure_at is None and avail < max(128 * MiB, 0.2 * (total - avail)):
            pressure_at = now
        if now - start > timeout_seconds:
            raise AssertionError(f"MemTotal still {total / MiB:.0f} MiB after {timeout_seconds}s")
        if not guest.runner.is_running():
            raise AssertionError(f"the guest exited; its log ends:\n{guest.runner.log_tail()}")
        time.sleep(0.1)


def wait_total_above(guest: Guest, threshold: float, *, timeout_seconds: float) -> float:
    """Seconds until MemTotal > threshold, polled every 0.1 s."""
    start = time.monotonic()
    eventually(
        lambda: mem_total(guest),
        lambda t: t > threshold,
        timeout_seconds=timeout_seconds,
        what=f"MemTotal above {threshold / MiB:.0f} MiB",
        interval_seconds=0.1,
        alive=[guest.runner],
    )
    return time.monotonic() - start


def baseline(guest: Guest, step: int, rounds: int) -> list[float]:
    """Direct QMP plug of ``step`` bytes -> MemTotal shows it; then unplug."""

    async def run() -> list[float]:
        client = QmpClient(guest.qmp_socket)
        times = []
        try:
            state = await client.memory()
            for _ in range(rounds):
                before = mem_total(guest)
                start = time.monotonic()
                await client.resize_memory(state.min + step)
                await asyncio.to_thread(
                    wait_total_above, guest, before + step / 2, timeout_seconds=60
                )
                times.append(time.monotonic() - start)
                await client.resize_memory(state.min)
        finally:
            await client.close()
        return times

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = kit.command(__doc__, prog="scripts/bench_memory.py")
    parser.add_argument("--rounds", type=int, default=6, help="allocations (default: %(default)s)")
    parser.add_argument(
        "--step-mib",
        type=int,
        default=300,
        help="MiB written into a tmpfs per round, in one go (default: %(default)s)",
    )
    parser.add_argument("--memory", default="512Mi", help="boot memory (default: %(default)s)")
    parser.add_argument(
        "--max-memory", default="2048Mi", help="virtio-mem ceiling (default: %(default)s)"
    )
    parser.add_argument(
        "--shrink-after-seconds",
        type=float,
        default=4.0,
        help="the agent's memory shrink window (default: %(default)s; production default 30)",
    )
    parser.add_argument(
        "--log-dir", help="copy the runner's, extender's and agent's logs here at the end"
    )
    args = parser.parse_args(argv)
    step = args.step_mib * MiB
    # The baseline's QMP client logs through structlog: to stderr, so stdout is the JSON alone.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    image = build_minimal_image()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp, stopping([]) as services:
        workdir = Path(tmp)
        guest = start_runner(
            image, workdir, min_vcpus=1, max_vcpus=2, memory=args.memory, max_memory=args.max_memory
        )
        services.append(guest.runner)
        boot_started = time.monotonic()
        wait_booted(guest)
        boot_seconds = time.monotonic() - boot_started
        plug_times = baseline(guest, step, args.rounds)

        vm = VmPod(min_vcpus=1, max_vcpus=2, memory=args.memory, max_memory=args.max_memory)
        extender, agent = start_extender_and_agent(
            workdir,
            guest,
            vm,
            node_cpu="4",
            agent_config={
                "scrape": {"interval_seconds": 1.0, "timeout_seconds": 0.9},
                "policy": {"grow_after_seconds": 30.0},
                "memory": {"shrink_after_seconds": args.shrink_after_seconds},
                "extender": {"permit_retry_seconds": 1.0},
                "log": {"level": "info"},
            },
            started=services,
        )
        minimum = extender.reserved_memory(vm)
        guest.type("mkdir -p /mnt/hog && mount -t tmpfs -o size=4g tmpfs /mnt/hog")

        pressure, write_to_online, shrink = [], [], []
        for i in range(args.rounds):
            before = mem_total(guest)
            start = time.monotonic()
            guest.type(
                f"dd if=/dev/zero of=/mnt/hog/f{i} bs=1M count={args.step_mib} 2>/dev/null &"
            )
            under_pressure, online_at = watch_grow(guest, before, timeout_seconds=120)
            pressure.append(under_pressure)
            write_to_online.append(online_at - start)
            guest.type("wait")  # the write finished (or was killed)
            start = time.monotonic()
            guest.type("rm -f /mnt/hog/*")
            eventually(
                lambda: (guest.query_plugged_memory(), extender.reserved_memory(vm)),
                lambda o: o == (0, minimum),
                timeout_seconds=120,
                what="memory back at the minimum",
                interval_seconds=0.1,
                alive=services,
            )
            shrink.append(time.monotonic() - start)

        out = guest.type('echo "oom=$(dmesg | grep -ci -e "out of memory" -e oom-kill)"')
        found = re.search(r"oom=(\d+)", out)
        samples = agent.metrics()
        count = value(samples, "vmautoscale_agent_memory_grow_to_online_seconds_count") or 0
        total = value(samples, "vmautoscale_agent_memory_grow_to_online_seconds_sum") or 0.0
        p = kit.summary(pressure, unit="s")
        b = kit.summary(plug_times, unit="s")
        result = {
            "config": {
                "rounds": args.rounds,
                "step_mib": args.step_mib,
                "memory": args.memory,
                "max_memory": args.max_memory,
                "virtio_mem_block_size": "2Mi",
                "scrape_interval_seconds": 1.0,
                "shrink_after_seconds": args.shrink_after_seconds,
                "accel": "tcg",
            },
            "boot_seconds": round(boot_seconds, 1),
            "baseline_plug_to_online": b,
            "pressure_to_online": p,
            "write_to_online": kit.summary(write_to_online, unit="s"),
            "agent_decision_to_online_mean_s": round(total / count, 3) if count else None,
            "shrink": kit.summary(shrink, unit="s"),
            "shrink_minus_window_p50_s": round(
                kit.percentile(shrink, 50) - args.shrink_after_seconds, 3
            ),
            "oom_kills": int(found.group(1)) if found else None,
            # pressure_to_online is often 0 (the agent grew first): the ratios that say what
            # the agent adds are its own decision -> online and the p99 under pressure.
            "ratios": {
                "agent_decision_to_online_mean_vs_plug_mean": (
                    round(total / count / b["mean_s"], 2) if count else None
                ),
                "pressure_to_online_p99_vs_plug_p99": round(p["p99_s"] / b["p99_s"], 2),
            },
        }
        kit.emit(result)
        if args.log_dir:
            Path(args.log_dir).mkdir(parents=True, exist_ok=True)
            for log in workdir.glob("*.log"):
                shutil.copy(log, Path(args.log_dir) / log.name)
    return 0


if __name__ == "__main__":
    kit.main(main)
