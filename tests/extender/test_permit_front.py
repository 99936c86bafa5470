"""The permit front: the permit port in its own process, its desk across a socketpair.

In process (``front_via="channel"``): the merged /metrics and a front whose main process is
gone. Then the real ``serve`` (``python -m scheduler_extender``, standalone, static token) as
users run it: a permit granted through the child, the child killed and restarted, the main
process killed and the child gone with it, and gzip bombs on the permit port while filter
calls go on.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from scheduler_extender.http.front import ChannelDesk
from scheduler_extender.http.permit_port import DESK
from testkit.kube_api import FakeKubeApi, node_object
from testkit.ports import free_port
from tests.extender.conftest import STATIC_TOKEN, Running, StartExtender, wait_until
from tests.extender.helpers import filter_body, permit_batch, vm_pod

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "standalone-cluster.yaml"
AUTH = {"Authorization": f"Bearer {STATIC_TOKEN}"}
PG1 = "00000000-0000-0000-0000-000000000001"


@pytest.fixture
def front_via() -> str:
    return "channel"


async def _one_vm(kube_api: FakeKubeApi, start_extender: StartExtender) -> Running:
    kube_api.add_node(node_object("node-a", cpu="8"))
    kube_api.add_pod(vm_pod("vm-1", uid="u-1", node="node-a"))
    return await start_extender()


GROW = permit_batch("node-a", uid="u-1", current=1, requested=2)


async def test_metrics_merge_the_fronts_families_into_one_exposition(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    running = await _one_vm(kube_api, start_extender)
    body = GROW
    assert (await running.permits.post("/v1/permits", json=body, headers=AUTH)).status == 200
    assert (await running.permits.post("/v1/permits", json=body)).status == 401
    assert (await running.verbs.post("/filter", data=b"{")).status == 400
    text = await (await running.verbs.get("/metrics")).text()
    # One family, the verbs of both processes in it: the text format allows each name once.
    assert text.count("# TYPE vmautoscale_extender_verb_duration_seconds ") == 1
    assert text.count("# TYPE vmautoscale_extender_verb_errors_total ") == 1
    for sample in (
        'vmautoscale_extender_verb_duration_seconds_count{verb="permits"} 2.0',
        'vmautoscale_extender_verb_duration_seconds_count{verb="filter"} 1.0',
        'vmautoscale_extender_verb_errors_total{verb="permits"} 1.0',
        'vmautoscale_extender_verb_errors_total{verb="filter"} 1.0',
        'vmautoscale_extender_permits_total{status="granted"} 1.0',
    ):
        assert sample in text


async def test_a_front_whose_main_process_is_gone_answers_503(
    kube_api: FakeKubeApi, start_extender: StartExtender
) -> None:
    running = await _one_vm(kube_api, start_extender)
    # The main side is reached only through the channel: its end, as a dead process's would.
    desk = running.permits.server.app[DESK]  # type: ignore[union-attr]
    assert isinstance(desk, ChannelDesk)
    await desk.channel.close()
    response = await running.permits.post("/v1/permits", json=GROW, headers=AUTH)
    assert response.status == 503
    assert (await response.json())["reason"] == "FrontOrphaned"
    assert (await running.permits.get("/readyz")).status == 503
    assert running.extender.ledger.pods["u-1"].vcpus == 1


# --- the real two-process ``serve`` ------------------------------------------------------------


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    verbs: str
    permits: str
    log: Path

    def fronts(self) -> list[int]:
        """The main process's children that are permit fronts."""
        pids = []
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        for pid in children.read_text().split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if b"permit-front" in cmdline:
                pids.append(int(pid))
        return pids

    def log_events(self, event: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if f'"{event}"' in line]


async def _status(session: aiohttp.ClientSession, url: str) -> int | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
            return response.status
    except (aiohttp.ClientError, TimeoutError):
        return None


async def _wait_ready(session: aiohttp.ClientSession, served: Served) -> None:
    async with asyncio.timeout(60):
        while await _status(session, served.permits + "/readyz") != 200:
            assert served.process.poll() is None, served.log.read_text()
            await asyncio.sleep(0.1)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    verbs, permits = free_port(), free_port()
    config = tmp_path / "extender.yaml"
    config.write_text(
        f"auth: {{mode: static, static_token: {STATIC_TOKEN}}}\n"
        f"listen: {{verbs: {{port: {verbs}}}, permits: {{host: 127.0.0.1, port: {permits}}}}}\n"
    )
    log = tmp_path / "extender.log"
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: ASYNC220 (a process for the whole test)
            [
                *(sys.executable, "-m", "scheduler_extender", "serve"),
                *("--config", str(config), "--standalone", str(CLUSTER)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    it = Served(process, f"http://127.0.0.1:{verbs}", f"http://127.0.0.1:{permits}", log)
    try:
        async with aiohttp.ClientSession() as session:
            await _wait_ready(session, it)
        yield it
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _grow(seq: int, requested: int) -> dict[str, Any]:
    """pg-1 of examples/standalone-cluster.yaml (4 vCPUs, 4 GiB) asks for ``requested``."""
    body = permit_batch(
        "node-a",
        uid=PG1,
        name="pg-1",
        current=4,
        requested=requested,
        protocol=(1, 2),
        memory=(4 * 2**30, 4 * 2**30),
    )
    body["requests"][0]["seq"] = seq
    return body


async def _pg1_vcpus(session: aiohttp.ClientSession, served: Served) -> int:
    async with session.get(served.verbs + "/state") as response:
        state = await response.json()
    (alloc,) = [a for node in state["nodes"] for a in node["allocations"] if a["uid"] == PG1]
    vcpus: int = alloc["vm"]["vcpus"]
    return vcpus


async def test_a_permit_is_granted_through_the_front_process(served: Served) -> None:
    (front,) = served.fronts()
    assert front != served.process.pid
    async with aiohttp.ClientSession() as session:
        async with session.post(
            served.permits + "/v1/permits", json=_grow(1, 6), headers=AUTH
        ) as response:
            assert response.status == 200, await response.text()
            (permit,) = (await response.json())["permits"]
        assert permit["status"] == "granted" and permit["permit"]["vcpus"] == 6
        assert await _pg1_vcpus(session, served) == 6
        # The replay check is the main process's: the same seq again is refused.
        async with session.post(
            served.permits + "/v1/permits", json=_grow(1, 8), headers=AUTH
        ) as response:
            (permit,) = (await response.json())["permits"]
        assert permit["error"]["reason"] == "StaleSequence"
        assert await _pg1_vcpus(session, served) == 6
        async with session.get(served.verbs + "/metrics") as response:
            text = await response.text()
    assert 'vmautoscale_extender_verb_duration_seconds_count{verb="permits"} 2.0' in text
    assert 'vmautoscale_extender_permits_total{status="granted"} 1.0' in text
    # The front runs only when the main process does not want the core.
    assert os.sched_getscheduler(front) == os.SCHED_IDLE
    assert os.sched_getscheduler(served.process.pid) == os.SCHED_OTHER


async def test_a_killed_front_is_restarted_and_the_port_serves_again(served: Served) -> None:
    (front,) = served.fronts()
    os.kill(front, signal.SIGKILL)
    async with aiohttp.ClientSession() as session:
        await wait_until(lambda: served.fronts() not in ([], [front]), timeout_seconds=60)
        await _wait_ready(session, served)
        async with session.post(
            served.permits + "/v1/permits", json=_grow(1, 5), headers=AUTH
        ) as response:
            assert response.status == 200
        assert await _pg1_vcpus(session, served) == 5
        # The main process kept serving kube-scheduler's listener throughout.
        assert await _status(session, served.verbs + "/healthz") == 200
    (exited,) = served.log_events("permit_front_exited")
    assert '"returncode":-9' in exited
    assert served.process.poll() is None


async def test_the_front_exits_with_the_main_process(served: Served) -> None:
    (front,) = served.fronts()
    served.process.kill()
    served.process.wait()
    await wait_until(lambda: _gone(front), timeout_seconds=30)


def _gone(pid: int) -> bool:
    """Exited (a zombie waits for a parent that is gone: it has exited all the same)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status


async def test_sigterm_stops_both_processes(served: Served) -> None:
    (front,) = served.fronts()
    served.process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(served.process.wait, 30) == 0
    assert _gone(front)
    assert served.log_events("permit_front_exited") == []


async def test_gzip_bombs_on_the_permit_port_while_filter_calls_go_on(served: Served) -> None:
    bomb = gzip.compress(b"[" * (64 * 2**20), compresslevel=9)
    pending = vm_pod("pg-2", uid="00000000-0000-0000-0000-000000000002", memory="2Gi")
    body = filter_body(pending, ["node-a", "node-b"])
    bomb_statuses: list[int | str] = []
    filter_statuses: list[int] = []

    async def bomber(session: aiohttp.ClientSession) -> None:
        for _ in range(4):
            headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
            try:
                async with session.post(
                    served.permits + "/v1/permits", data=bomb, headers=headers
                ) as response:
                    bomb_statuses.append(response.status)
            except aiohttp.ClientError as e:
                # Refused before its body was read: the connection closes under the sender.
                bomb_statuses.append(type(e).__name__)

    async with aiohttp.ClientSession() as attack, aiohttp.ClientSession() as scheduler:
        bombers = [asyncio.create_task(bomber(attack)) for _ in range(4)]
        while not all(b.done() for b in bombers) or len(filter_statuses) < 20:
            async with scheduler.post(served.verbs + "/filter", json=body) as response:
                filter_statuses.append(response.status)
                result = await response.json()
            assert result["NodeNames"] == ["node-a", "node-b"], result
        await asyncio.gather(*bombers)
        # The agents' port still works, and the front that took the bombs is the first one.
        async with scheduler.post(
            served.permits + "/v1/permits", json=_grow(1, 5), headers=AUTH
        ) as response:
            assert response.status == 200
    assert set(filter_statuses) == {200}
    assert len(bomb_statuses) == 16 and 200 not in bomb_statuses, bomb_statuses
    assert 401 in bomb_statuses, bomb_statuses
    assert served.log_events("permit_front_exited") == []
