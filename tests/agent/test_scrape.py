"""Parsing node_exporter pages (pure) and fetching them over HTTP, incl. a real node_exporter."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from autoscaler_agent.scrape import (
    ScrapeError,
    fetch_samples,
    find_cpu_stat,
    parse_cpu_stat,
    parse_samples,
    read_cfs_counters,
)
from testkit.agent_fakes import serving
from testkit.ports import free_port
from tests.support import require_binary

DATA = Path(__file__).parent / "data"

PAGE = """\
# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.
# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{cpu="0",mode="idle"} 100.5
node_cpu_seconds_total{cpu="0",mode="user"} 20
node_cpu_seconds_total{cpu="1",mode="idle"} 99.5
node_cpu_seconds_total{cpu="1",mode="system"} 10
node_cpu_seconds_total{cpu="1",mode="iowait"} 2
# HELP node_procs_running Number of processes in runnable state.
# TYPE node_procs_running gauge
node_procs_running 3
# HELP node_load1 1m load average.
# TYPE node_load1 gauge
node_load1 2.25
# TYPE node_memory_MemAvailable_bytes gauge
node_memory_MemAvailable_bytes 2.5e+08
# TYPE node_memory_MemTotal_bytes gauge
node_memory_MemTotal_bytes 1e+09
# TYPE go_goroutines gauge
go_goroutines 8
"""


def test_parse_full_page():
    s = parse_samples(PAGE)
    assert s.load1 == 2.25
    assert s.cpu_seconds_total == 232.0
    assert s.cpu_idle_seconds_total == 202.0  # iowait is idle: waiting on a disk needs no vCPU
    assert (s.cpu_count, s.procs_running) == (2, 3.0)
    assert (s.memory_available_bytes, s.memory_total_bytes) == (2.5e8, 1e9)


def test_parse_untyped_counter_and_missing_series():
    s = parse_samples('node_cpu_seconds_total{cpu="0",mode="user"} 5\n')
    assert (s.load1, s.cpu_seconds_total, s.cpu_idle_seconds_total) == (None, 5.0, 0.0)
    assert (s.cpu_count, s.procs_running) == (1, None)
    assert parse_samples("") == parse_samples("# nothing here\n")


def test_parse_a_real_node_exporter_page():
    """A whole page of Debian's prometheus-node-exporter 1.5.0 (default collectors, 2 CPUs)."""
    text = (DATA / "node_exporter_1.5.txt").read_text()
    s = parse_samples(text)
    assert (s.load1, s.procs_running, s.cpu_count) == (1.82, 4.0, 2)
    # Sums of the cpu="0" and cpu="1" series, all modes; idle + iowait for the idle part.
    assert s.cpu_seconds_total == pytest.approx(5157.39)
    assert s.cpu_idle_seconds_total == pytest.approx(1421.62)
    assert (s.memory_total_bytes, s.memory_available_bytes) == (25274793984.0, 23659872256.0)
    # The pressure collector's PSI counters (memory some/full): present, and zero on that host.
    assert (s.memory_waiting_seconds_total, s.memory_stalled_seconds_total) == (0.0, 0.0)


def test_parse_memory_pressure_typed_and_untyped():
    typed = (
        "# TYPE node_pressure_memory_waiting_seconds_total counter\n"
        "node_pressure_memory_waiting_seconds_total 12.5\n"
        "# TYPE node_pressure_memory_stalled_seconds_total counter\n"
        "node_pressure_memory_stalled_seconds_total 3.25\n"
    )
    untyped = "".join(line + "\n" for line in typed.splitlines() if not line.startswith("#"))
    for text in (typed, untyped):
        s = parse_samples(text)
        assert (s.memory_waiting_seconds_total, s.memory_stalled_seconds_total) == (12.5, 3.25)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("node_load1 abc\n", id="value-not-a-number"),
        pytest.param("node_load1{ 1\n", id="broken-labels"),
        pytest.param("<html>502 Bad Gateway</html>\n", id="html"),
        pytest.param('node_load1{a="b"} \n', id="missing-value"),
    ],
)
def test_parse_malformed(text):
    with pytest.raises(ScrapeError) as e:
        parse_samples(text)
    assert e.value.kind == "malformed"


def _app(handler):
    app = web.Application()
    app.router.add_get("/metrics", handler)
    return app


async def test_fetch_ok_and_http_errors():
    async def ok(request):
        return web.Response(text=PAGE)

    async def fail(request):
        return web.Response(status=500, text="oops")

    async with (
        serving(_app(ok)) as ok_url,
        serving(_app(fail)) as fail_url,
        aiohttp.ClientSession() as session,
    ):
        assert (await fetch_samples(session, ok_url + "/metrics", 1.0)).load1 == 2.25
        with pytest.raises(ScrapeError) as e:
            await fetch_samples(session, fail_url + "/metrics", 1.0)
        assert e.value.kind == "http_status"


async def test_fetch_reads_a_page_sent_in_chunks():
    """A slow exporter (a guest under TCG) writes its page in pieces: all of it is parsed.

    ``content.read(n)`` returns only what has arrived, so this used to parse half a page and
    fail as "malformed" (seen on every other scrape of the e2e guest).
    """
    half = len(PAGE) // 2

    async def chunked(request):
        response = web.StreamResponse()
        response.content_type = "text/plain"
        await response.prepare(request)
        await response.write(PAGE[:half].encode())
        await asyncio.sleep(0.05)
        await response.write(PAGE[half:].encode())
        await response.write_eof()
        return response

    async with serving(_app(chunked)) as base, aiohttp.ClientSession() as session:
        samples = await fetch_samples(session, base + "/metrics", 2.0)
    assert samples == parse_samples(PAGE)


async def test_fetch_timeout_and_unreachable():
    async def slow(request):
        await asyncio.sleep(0.4)  # longer than the 0.1 s timeout; short for the cleanup
        return web.Response(text=PAGE)

    async with serving(_app(slow)) as base, aiohttp.ClientSession() as session:
        url = base + "/metrics"
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(ScrapeError) as e:
            await fetch_samples(session, url, 0.1)
        assert e.value.kind == "timeout"
        assert loop.time() - start < 1.0
        with pytest.raises(ScrapeError) as e:
            await fetch_samples(session, f"http://127.0.0.1:{free_port()}/metrics", 1.0)
        assert e.value.kind == "unreachable"


@pytest.mark.node_exporter
async def test_real_node_exporter():
    binary = require_binary("prometheus-node-exporter", "/usr/bin")
    port = free_port()
    # Popen only forks; the exporter then runs on its own while the loop scrapes it.
    proc = subprocess.Popen(  # noqa: ASYNC220
        [
            binary,
            f"--web.listen-address=127.0.0.1:{port}",
            "--collector.disable-defaults",
            "--collector.loadavg",
            "--collector.cpu",
            "--collector.meminfo",
            "--collector.stat",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        async with aiohttp.ClientSession() as session:
            samples = None

            async def try_fetch():
                nonlocal samples
                try:
                    samples = await fetch_samples(session, url, 1.0)
                except ScrapeError:
                    await asyncio.sleep(0.05)

            async with asyncio.timeout(10):
                while samples is None:
                    await try_fetch()
        assert samples.load1 is not None and samples.load1 >= 0
        assert samples.cpu_seconds_total > 0 and samples.cpu_idle_seconds_total >= 0
        assert samples.memory_total_bytes > samples.memory_available_bytes > 0
        # The exporter reads /proc/stat while it runs, so it counts itself as runnable.
        assert samples.procs_running is not None and samples.procs_running >= 1
        assert samples.cpu_count is not None and samples.cpu_count >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_parse_steal_time():
    s = parse_samples(
        'node_cpu_seconds_total{cpu="0",mode="steal"} 4\n'
        'node_cpu_seconds_total{cpu="0",mode="idle"} 6\n'
    )
    assert (s.cpu_seconds_total, s.cpu_idle_seconds_total, s.cpu_steal_seconds_total) == (
        10.0,
        6.0,
        4.0,
    )
    assert parse_samples(PAGE).cpu_steal_seconds_total is None  # a TCG guest reports none


# cpu.stat as cgroup v1 (the cpu controller) and v2 write it.
CPU_STAT_V1 = "nr_periods 1200\nnr_throttled 300\nthrottled_time 41000000000\n"
CPU_STAT_V2 = (
    "usage_usec 99\nuser_usec 50\nsystem_usec 49\nnr_periods 1200\nnr_throttled 300\n"
    "throttled_usec 41000000\nnr_bursts 0\nburst_usec 0\n"
)


@pytest.mark.parametrize("text", [CPU_STAT_V1, CPU_STAT_V2], ids=["v1", "v2"])
def test_parse_cpu_stat(text):
    assert parse_cpu_stat(text) == (1200.0, 300.0)


@pytest.mark.parametrize(
    "text", ["", "usage_usec 5\n", "nr_periods x\nnr_throttled 1\n"], ids=["empty", "no-cfs", "bad"]
)
def test_parse_cpu_stat_without_the_counters(text):
    assert parse_cpu_stat(text) is None


def test_the_containers_cpu_stat_is_the_first_directory_that_has_one(tmp_path):
    v1 = tmp_path / "cpu" / "kubepods" / "podu" / "c"
    v1.mkdir(parents=True)
    (v1 / "cpu.stat").write_text(CPU_STAT_V1)
    dirs = ("kubepods/podu/c", "cpu/kubepods/podu/c")
    assert find_cpu_stat(tmp_path, dirs) == v1 / "cpu.stat"
    assert read_cfs_counters(v1 / "cpu.stat") == (1200.0, 300.0)
    assert find_cpu_stat(tmp_path, ("kubepods/other/c",)) is None
    assert find_cpu_stat(tmp_path, ()) is None
    assert read_cfs_counters(tmp_path / "gone" / "cpu.stat") is None


def test_the_containers_cpu_stat_below_a_kubelets_own_cgroup_root(tmp_path):
    # kubelet --cgroup-root=/vma-node2: kubepods one directory down, in each hierarchy.
    v1 = tmp_path / "cpu" / "vma-node2" / "kubepods" / "podu" / "c"
    v1.mkdir(parents=True)
    (v1 / "cpu.stat").write_text(CPU_STAT_V2)
    dirs = ("kubepods/podu/c", "cpu/kubepods/podu/c")
    assert find_cpu_stat(tmp_path, dirs) == v1 / "cpu.stat"
