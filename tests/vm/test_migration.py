"""Live migration between two real runner processes on loopback (vm_runner.migrate).

One PostgreSQL guest, grown past its boot size (a second vCPU onlined, 256 MiB plugged into
virtio-mem) and given content (a file of random bytes, a table of rows), is first offered to a
target that is killed mid-transfer: the source must keep running with everything intact. Then
it moves to a second target: the guest there has the same online vCPUs, the same plugged
memory, the same file and rows, and the source runner has exited; a client that was idle in a
transaction on the source (its connection stays behind) loses its session on the target within
seconds, and the row it held is free again. The targets never boot a guest, so the test pays
for one boot.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from testkit.local_stack import (
    Guest,
    GuestImage,
    eventually,
    qmp_execute,
    start_runner,
    stopping,
    wait_booted,
)
from testkit.ports import free_port
from tests.support import require_binary
from tests.vm.conftest import MinimalImage
from vm_runner.cmdline import MIB, VIRTIO_MEM_ID
from vm_runner.migrate import migrate
from vm_runner.migration import MigrationConfig, Reason
from vm_runner.qmp import QmpClient

pytestmark = [
    pytest.mark.qemu,
    pytest.mark.qemu_apart,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(420),
]

PLUGGED = 256 * MIB
ROWS = 1000
PG_ENV = {**os.environ, "PGPASSWORD": "bench"}
UPDATE = "UPDATE moved SET x = x WHERE x = 1"
# The other sessions of the benchmark database, and what they are doing.
SESSIONS = (
    "SELECT state FROM pg_stat_activity WHERE datname = 'pgbench' AND pid <> pg_backend_pid()"
    " AND backend_type = 'client backend'"
)


def psql(port: int, sql: str) -> str:
    result = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "bench", "-d", "pgbench",
         "-tAc", sql],
        env=PG_ENV, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise OSError(result.stderr)
    return result.stdout.strip()


def checksum(guest: Guest) -> str:
    output = guest.type("md5sum /tmp/blob")
    match = re.search(r"\b([0-9a-f]{32})\s+/tmp/blob", output)
    assert match is not None, output
    return match.group(1)


def start(
    image: MinimalImage,
    workdir: Path,
    *,
    incoming_port: int | None = None,
    qmp_port: int | None = None,
) -> Guest:
    workdir.mkdir()
    return start_runner(
        GuestImage(kernel=image.kernel, initrd=image.initrd),
        workdir,
        min_vcpus=1,
        max_vcpus=2,
        memory="512Mi",
        max_memory="1Gi",
        postgres=True,
        migration_socket=True,
        incoming_port=incoming_port,
        migration_port=qmp_port,
    )


def migrate_to(
    source: Guest,
    target: Guest,
    port: int,
    config: MigrationConfig,
    *,
    qmp: tuple[str, str] | None = None,
):
    # The runners' migration sockets (the agent would hold the VM's QMP socket): the target's
    # exists only once its QEMU runs, which the driver waits for. ``qmp``: both sides' QMP
    # addresses instead (``tcp:HOST:PORT``: the runners' --migration-port, as the vm-controller
    # reaches runner pods).
    source_qmp, target_qmp = qmp or (str(source.migration_socket), str(target.migration_socket))
    return migrate(
        source_qmp=source_qmp,
        target_qmp=target_qmp,
        target_uri=f"tcp:127.0.0.1:{port}",
        config=config,
    )


async def kill_when_active(source: Guest, target: Guest) -> None:
    """SIGKILL the target's runner (QEMU follows it) once the source is sending."""
    while True:
        async with await QmpClient.connect(str(source.control_socket())) as qmp:
            status = await qmp.execute("query-migrate")
        if isinstance(status, dict) and status.get("status") == "active":
            break
        await asyncio.sleep(0.2)
    target.runner.process.send_signal(signal.SIGKILL)


async def migrate_and_kill_target(source: Guest, target: Guest, port: int):
    # 1 MiB/s: the transfer is still under way when the target dies.
    slow = MigrationConfig(max_bandwidth_bytes_per_second=MIB, converge_deadline_seconds=120)
    outcome, _ = await asyncio.gather(
        migrate_to(source, target, port, slow), kill_when_active(source, target)
    )
    return outcome


def test_guest_moves_with_its_size_and_data_and_a_killed_target_leaves_it_running(
    postgres_image: MinimalImage, tmp_path
):
    require_binary("qemu-system-x86_64")
    require_binary("psql")
    services = []
    with stopping(services):
        source_qmp_port = free_port()
        source = start(postgres_image, tmp_path / "source", qmp_port=source_qmp_port)
        services.append(source.runner)
        wait_booted(source)
        assert source.postgres_port is not None
        eventually(lambda: psql(source.postgres_port, "select 1"), lambda out: out == "1",
                   timeout_seconds=120, interval_seconds=1.0, what="PostgreSQL in the guest",
                   alive=[source.runner])  # fmt: skip
        psql(source.postgres_port, f"create table moved as select generate_series(1, {ROWS}) x")
        source.type("dd if=/dev/urandom of=/tmp/blob bs=1M count=8 2>/dev/null")
        blob = checksum(source)
        source.type("echo 1 > /sys/devices/system/cpu/cpu1/online")
        eventually(source.online_vcpus, lambda n: n == 2, timeout_seconds=60, what="2 vCPUs")
        asyncio.run(_plug(source))
        eventually(source.query_plugged_memory, lambda b: b == PLUGGED, timeout_seconds=60,
                   what="256 MiB plugged")  # fmt: skip

        # A target killed mid-transfer: the source runs on, unchanged.
        port = free_port()
        doomed = start(postgres_image, tmp_path / "doomed", incoming_port=port)
        services.append(doomed.runner)
        failed = asyncio.run(migrate_and_kill_target(source, doomed, port))
        assert not failed.succeeded
        assert failed.reason in (Reason.TARGET_DIED, Reason.QEMU_FAILED)
        assert failed.is_source_running
        status = qmp_execute(source.control_socket(), "query-status")
        assert isinstance(status, dict) and status["status"] == "running"
        assert psql(source.postgres_port, "select count(*) from moved") == str(ROWS)

        # A client idle in a transaction that holds a row's lock when the VM moves: its
        # connection stays with the source (QEMU's user network moves no forwarded connection).
        holder = subprocess.Popen(
            ["psql", "-h", "127.0.0.1", "-p", str(source.postgres_port), "-U", "bench",
             "-d", "pgbench", "-v", "ON_ERROR_STOP=1"],
            env=PG_ENV, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert holder.stdin is not None
        holder.stdin.write(f"BEGIN; {UPDATE};\n")
        holder.stdin.flush()
        eventually(lambda: psql(source.postgres_port, SESSIONS), lambda out: "idle in" in out,
                   timeout_seconds=30, what="a session idle in its transaction")  # fmt: skip

        # The real move, driven over QMP on TCP as the vm-controller drives runner pods.
        port, target_qmp_port = free_port(), free_port()
        target = start(postgres_image, tmp_path / "target", incoming_port=port,
                       qmp_port=target_qmp_port)  # fmt: skip
        services.append(target.runner)
        over_tcp = (f"tcp:127.0.0.1:{source_qmp_port}", f"tcp:127.0.0.1:{target_qmp_port}")
        outcome = asyncio.run(migrate_to(source, target, port, MigrationConfig(), qmp=over_tcp))
        assert outcome.succeeded, outcome
        assert outcome.downtime_ms is not None and outcome.transferred_bytes
        assert source.runner.process.wait(timeout=30) == 0  # the source QEMU quit, its runner too
        assert target.postgres_port is not None
        assert target.online_vcpus() == 2
        assert target.query_plugged_memory() == PLUGGED
        assert checksum(target) == blob
        assert psql(target.postgres_port, "select count(*) from moved") == str(ROWS)
        # Its session ends on the target and lets go of the row: the image's keepalives probe
        # the idle connection, and the target's QEMU, which never had it, answers with a reset.
        # Without them the session would hold the lock for the kernel's two hours.
        moved_at = time.monotonic()
        eventually(lambda: psql(target.postgres_port, f"SET lock_timeout = '1s'; {UPDATE}"),
                   lambda out: out.endswith("UPDATE 1"), timeout_seconds=60,
                   what="the row free on the target")  # fmt: skip
        released = time.monotonic() - moved_at
        assert psql(target.postgres_port, SESSIONS) == "", "the moved-away client's session"
        holder.kill()
        holder.communicate()  # closes its stdin too
        print(f"migration: {outcome}; the held row free on the target {released:.1f}s after")


async def _plug(guest: Guest) -> None:
    async with await QmpClient.connect(str(guest.control_socket())) as qmp:
        await qmp.execute(
            "qom-set",
            {"path": f"/machine/peripheral/{VIRTIO_MEM_ID}", "property": "requested-size",
             "value": PLUGGED},
        )  # fmt: skip
