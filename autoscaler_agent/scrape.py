"""Reading a guest's node_exporter: ``fetch_samples`` (I/O) and ``parse_samples`` (pure).

``parse_samples`` is pure: no I/O. It keeps only the few series the policy uses (load1,
procs_running from the default ``stat`` collector, the CPU counters summed over CPUs with the
number of CPUs, memory), so the parse result is small whatever the exporter exposes.
``fetch_samples`` is the thin aiohttp shell around it; every way a scrape can fail comes out
as ``ScrapeError`` with a short ``kind`` for the error counter, so the caller keeps the VM's
size and moves on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from autoscaler_agent.policy import Samples

# A node_exporter page is ~100 KiB with every collector on; anything far larger is not one, and
# reading it all would cost the agent more CPU than the VM is worth.
MAX_BODY_BYTES = 8 * 2**20
# With a ``# TYPE ... counter`` line the parser names the family without "_total"; without one
# (an untyped series) it keeps the full name.
_CPU_FAMILIES = frozenset({"node_cpu_seconds", "node_cpu_seconds_total"})
# Memory pressure (PSI) from the pressure collector: ``some`` is "waiting", ``full`` "stalled".
# A counter's family is named without ``_total`` by the parser, as the CPU one is.
_WAITING_FAMILIES = frozenset(
    {"node_pressure_memory_waiting_seconds", "node_pressure_memory_waiting_seconds_total"}
)
_STALLED_FAMILIES = frozenset(
    {"node_pressure_memory_stalled_seconds", "node_pressure_memory_stalled_seconds_total"}
)
# Time a CPU had nothing to run: iowait is idle time spent while some I/O was pending, and a
# VM waiting on its disk does not need more vCPUs.
_IDLE_MODES = frozenset({"idle", "iowait"})


class ScrapeError(Exception):
    """A scrape that gave no usable samples. ``kind`` is a low-cardinality label value."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def parse_samples(text: str) -> Samples:
    """The policy's inputs from Prometheus text exposition; raises ScrapeError if malformed.

    A page without ``node_load1`` is not an error here (the policy then holds); a page that does
    not parse is, because nothing on it can be trusted.
    """
    load1: float | None = None
    procs_running: float | None = None
    cpus: set[str] = set()
    cpu_total: float | None = None
    cpu_idle: float | None = None
    cpu_steal: float | None = None
    mem_avail: float | None = None
    mem_total: float | None = None
    waiting: float | None = None
    stalled: float | None = None
    try:
        for family in text_string_to_metric_families(text):
            name = family.name
            if name == "node_load1":
                for s in family.samples:
                    load1 = s.value
            elif name == "node_procs_running":
                for s in family.samples:
                    procs_running = float(s.value)
            elif name in _CPU_FAMILIES:
                for s in family.samples:
                    if s.name != "node_cpu_seconds_total":
                        continue
                    cpu_total = (cpu_total or 0.0) + s.value
                    cpus.add(s.labels.get("cpu", ""))
                    mode = s.labels.get("mode")
                    if mode in _IDLE_MODES:
                        cpu_idle = (cpu_idle or 0.0) + s.value
                    elif mode == "steal":
                        cpu_steal = (cpu_steal or 0.0) + s.value
            elif name == "node_memory_MemAvailable_bytes":
                for s in family.samples:
                    mem_avail = s.value
            elif name == "node_memory_MemTotal_bytes":
                for s in family.samples:
                    mem_total = s.value
            elif name in _WAITING_FAMILIES:
                for s in family.samples:
                    if s.name == "node_pressure_memory_waiting_seconds_total":
                        waiting = s.value
            elif name in _STALLED_FAMILIES:
                for s in family.samples:
                    if s.name == "node_pressure_memory_stalled_seconds_total":
                        stalled = s.value
    except (ValueError, TypeError, KeyError, IndexError) as e:
        # prometheus_client raises plain ValueError (and, on some garbage, IndexError or
        # KeyError) rather than one parse error type.
        raise ScrapeError("malformed", str(e) or type(e).__name__) from e
    if cpu_total is not None and cpu_idle is None:
        cpu_idle = 0.0  # a fully busy guest may expose no idle series at all
    return Samples(
        load1=load1,
        procs_running=procs_running,
        cpu_seconds_total=cpu_total,
        cpu_idle_seconds_total=cpu_idle,
        cpu_count=len(cpus) if cpus else None,
        cpu_steal_seconds_total=cpu_steal,
        memory_available_bytes=mem_avail,
        memory_total_bytes=mem_total,
        memory_waiting_seconds_total=waiting,
        memory_stalled_seconds_total=stalled,
    )


# The deadline is the scrape's own and enforced inside; callers pass the configured one.
async def fetch_samples(
    session: aiohttp.ClientSession,
    url: str,
    timeout: float,  # noqa: ASYNC109
) -> Samples:
    """GET ``url`` and parse it; raises ScrapeError (never hangs longer than ``timeout``)."""
    try:
        async with asyncio.timeout(timeout):
            async with session.get(url, headers={"Accept": "text/plain"}) as resp:
                if resp.status != 200:
                    raise ScrapeError("http_status", f"GET {url}: HTTP {resp.status}")
                # Read to the end: ``content.read(n)`` returns only what has arrived so far, so a
                # page that comes in several chunks (a slow guest's exporter) was cut short.
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_any():
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        raise ScrapeError("too_large", f"GET {url}: body over {MAX_BODY_BYTES} B")
                    chunks.append(chunk)
                body = b"".join(chunks)
                charset = resp.charset or "utf-8"
    except TimeoutError as e:
        raise ScrapeError("timeout", f"GET {url}: no answer within {timeout}s") from e
    except aiohttp.ClientError as e:
        raise ScrapeError("unreachable", f"GET {url}: {e}") from e
    try:
        text = body.decode(charset)
    except (UnicodeDecodeError, LookupError) as e:
        raise ScrapeError("malformed", f"GET {url}: {e}") from e
    return parse_samples(text)


def parse_cpu_stat(text: str) -> tuple[float, float] | None:
    """(CFS periods, throttled periods) from a cgroup's ``cpu.stat``, or None without them.

    The two keys are the same in cgroup v1 (``cpu`` controller) and v2
    (Documentation/admin-guide/cgroup-v2.rst, "cpu.stat": ``nr_periods``, ``nr_throttled``);
    the throttled *time* is not (v1 ``throttled_time`` in ns, v2 ``throttled_usec``), and the
    policy needs only the share of periods, so it reads these two.
    """
    values: dict[str, float] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in ("nr_periods", "nr_throttled"):
            try:
                values[key] = float(value)
            except ValueError:
                return None
    if len(values) != 2:
        return None
    return values["nr_periods"], values["nr_throttled"]


def find_cpu_stat(root: Path, dirs: tuple[str, ...]) -> Path | None:
    """The VM container's ``cpu.stat``: in the first of ``dirs`` (below the host's cgroup
    filesystem, ``root``) that has one, or else one directory further down, where a kubelet
    run with a ``cgroupRoot`` of its own (one path component, ``/kubelet`` say) puts its
    ``kubepods``. None if there is none (yet). Looks at a few directories: the caller keeps
    the answer rather than asking at every scrape."""
    for d in dirs:
        path = root / d / "cpu.stat"
        if path.is_file():
            return path
    for d in dirs:
        controller, found, below = d.partition("kubepods")
        if found:
            for path in (root / controller).glob(f"*/kubepods{below}/cpu.stat"):
                return path
    return None


def read_cfs_counters(path: Path) -> tuple[float, float] | None:
    """The counters of a ``cpu.stat`` (``parse_cpu_stat``); None if it cannot be read (the
    container is gone). One small file of a virtual filesystem: it never blocks on a disk."""
    try:
        return parse_cpu_stat(path.read_text())
    except OSError:
        return None
