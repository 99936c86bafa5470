"""A process's CPU time and memory, from /proc (proc(5)), for the benchmarks' figures."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds ``pid`` has used (its threads', not its children's)."""
    # After the command name (which may hold spaces and parentheses): utime and stime are
    # fields 14 and 15 (1-based) of the whole line.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_mib(pid: int, field: str) -> float:
    """A kB field of /proc/PID/status (``VmRSS``, ``VmHWM``) in MiB, 0.0 when absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def children(pid: int) -> list[int]:
    """The processes ``pid`` started and that still run (its main thread's children), e.g.
    the extender's permit front; none once it is gone."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def children_cpu_seconds(pid: int) -> float:
    """The CPU seconds of ``pid``'s running children (``cpu_seconds`` of each)."""
    total = 0.0
    for child in children(pid):
        try:
            total += cpu_seconds(child)
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended between the two reads
    return total


def wakeups(pid: int) -> int:
    """How many times ``pid``'s threads gave up the CPU to wait (``voluntary_ctxt_switches``
    summed over /proc/PID/task): for an event loop, about one per poll that found nothing
    ready, so per request it says how often the process slept and was woken again."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            continue  # the thread ended between the listing and the read
    return total
