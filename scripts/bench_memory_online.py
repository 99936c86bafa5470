"""Benchmark: how hot-plugged memory is onlined, under workloads that stall a guest's kernel.

For each onlining policy (``--policies``) boots the minimal guest under TCG with a virtio-mem
device and a data disk, the extender (standalone) and the agent, as ``scripts/bench_memory.py``
does, with the policy's kernel arguments after the runner's own (the last
``memhp_default_state`` wins):

* ``guest``: the runner's own (``memhp_default_state=offline``): the guest's memory-onliner
  chooses each block's zone when it comes online (vm_image/guest/memory-onliner); and
  ``guest-scrape``, the same with the agent not reading the guest's memory-pressure signals:
  only its scrapes (the fast path's figures are the difference);

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
  ``--fill-mib``) and shrinks back once it exits; then the kernel workload again;
* ``writer``: ``dd`` writes ``--writer-mib`` into a tmpfs as fast as it can.

For each: the guest's OOM kills (dmesg, cumulative), PSI memory ``full`` stall seconds, time
from the first poll showing pressure (PSI ``some`` rising, or MemAvailable below the agent's
low headroom) to MemTotal growing, for each grow the agent decided on a scrape the guest's
signal brought forward the seconds from that signal to the memory plugged (and as the scrapes
alone would have done it), the memory plugged at the end, and what was still plugged
after the workload's memory was freed and the agent's shrinks settled (``release``): what a
later shrink could not give back.

    .venv/bin/python scripts/bench_memory_online.py [--policies movable,auto-movable]

Prints one JSON object. Several minutes per policy on a 2-core machine.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from testkit import bench as kit
from testkit.local_stack import stopping, value
from testkit.memory_workloads import (
    WORKLOADS,
    Sizes,
    agent_events,
    boot,
    log_lines,
    oom_kills,
    signalled_grows,
)

POLICIES = {
    # The runner's own: the guest's memory-onliner chooses each block's zone.
    "guest": "",
    "movable": "memhp_default_state=online_movable",
    "normal": "memhp_default_state=online_kernel",
    "auto-movable": "memhp_default_state=online memory_hotplug.online_policy=auto-movable"
    " memory_hotplug.auto_movable_ratio={ratio}",
}


def kernel_args_of(name: str, ratio: int) -> str:
    """A policy's kernel arguments; ``auto-movable-N`` is auto-movable with ratio N%."""
    name = name.removesuffix("-scrape")
    base, _, own = name.partition("-movable-")
    if base == "auto" and own:
        return POLICIES["auto-movable"].format(ratio=int(own))
    return POLICIES[name].format(ratio=ratio)


def run_policy(
    name: str, sizes: Sizes, ratio: int, workdir: Path, workloads: list[str]
) -> dict[str, Any]:
    kernel_args = kernel_args_of(name, ratio)
    with stopping([]) as services:
        guest, agent = boot(
            workdir, sizes, kernel_args, services, guest_signals=not name.endswith("-scrape")
        )
        out: dict[str, Any] = {"kernel_args": kernel_args}
        for workload in workloads:
            logged = log_lines(agent)
            result = WORKLOADS[workload](guest, sizes)
            result["signalled_grows"] = signalled_grows(agent_events(agent, skip=logged))
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
        out["agent_memory_signals"] = value(samples, "vmautoscale_agent_memory_signals_total")
        return out


def main(argv: list[str] | None = None) -> int:
    defaults = Sizes()
    parser = kit.command(__doc__, prog="scripts/bench_memory_online.py")
    parser.add_argument(
        "--policies",
        default="guest,guest-scrape,auto-movable-100",
        help="comma-separated: guest, movable, normal, auto-movable (--ratio), auto-movable-N;"
        " each with -scrape: the agent ignores the guest's memory-pressure signals",
    )
    parser.add_argument("--ratio", type=int, default=301, help="auto_movable_ratio, percent")
    parser.add_argument("--memory", default=defaults.memory, help="boot memory (%(default)s)")
    parser.add_argument(
        "--max-memory", default=defaults.max_memory, help="virtio-mem ceiling (%(default)s)"
    )
    parser.add_argument(
        "--anon-mib",
        type=int,
        default=defaults.anon_mib,
        help="page_cache: the anonymous process grows to this (%(default)s)",
    )
    parser.add_argument(
        "--files",
        type=int,
        default=defaults.files,
        help="kernel: empty files created in a tmpfs (%(default)s)",
    )
    parser.add_argument(
        "--fill-mib",
        type=int,
        default=defaults.fill_mib,
        help="grown: the anonymous memory that takes the VM to its maximum (%(default)s)",
    )
    parser.add_argument(
        "--writer-mib",
        type=int,
        default=defaults.writer_mib,
        help="writer: MiB dd writes into a tmpfs (%(default)s)",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help="comma-separated, in order, from: %(default)s",
    )
    parser.add_argument(
        "--release-seconds",
        type=float,
        default=defaults.release_seconds,
        help="the plugged size counts as settled once unchanged this long (%(default)s)",
    )
    parser.add_argument("--log-dir", help="copy each policy's runner, extender and agent logs here")
    args = parser.parse_args(argv)
    sizes = Sizes(
        memory=args.memory,
        max_memory=args.max_memory,
        anon_mib=args.anon_mib,
        files=args.files,
        fill_mib=args.fill_mib,
        writer_mib=args.writer_mib,
        release_seconds=args.release_seconds,
    )
    workloads = args.workloads.split(",")
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"--workloads: unknown {', '.join(sorted(unknown))}")
    result: dict[str, Any] = {"config": vars(args) | {"accel": "tcg"}}
    for name in args.policies.split(","):
        with tempfile.TemporaryDirectory(prefix=f"bench-online-{name}-") as tmp:
            try:
                result[name] = run_policy(name, sizes, args.ratio, Path(tmp), workloads)
            except (OSError, AssertionError) as e:
                # A guest wedged in reclaim stops answering: that is this policy's result.
                result[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
                print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
            if args.log_dir:
                keep = Path(args.log_dir) / name
                keep.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, keep / log.name)
    kit.emit(result)
    return 0


if __name__ == "__main__":
    kit.main(main)
