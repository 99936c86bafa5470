"""Benchmark: live migration of a real PostgreSQL guest between two runners on loopback.

For each guest memory size (``--sizes``), boots the postgres guest under TCG with a virtio-mem
device (half the size plugged), moves it idle to a second runner started in incoming mode, then
runs pgbench against it (``--clients`` connections, from the host through the forwarded port)
and moves it again, under that load, to a third. Each move is ``vm_runner.migrate`` with its
defaults (auto-converge, 300 ms downtime limit, no bandwidth cap): its total time (the
driver's, from the first QMP command to the source's quit), QEMU's own total time, the downtime
QEMU reports and the bytes sent. The line to beat: QEMU's default downtime target, 300 ms
(``downtime_to_qemu_default``, below 1 is better).

    .venv/bin/python scripts/bench_migration.py [--sizes 1Gi,2Gi] [--clients 4]

Prints one JSON object. About a minute per size on a 2-core machine (a boot each); not part of
the suite's benchmark step for that reason: tests/vm/test_migration.py moves a guest there.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from testkit import bench as kit
from testkit.local_stack import (
    Guest,
    build_image,
    eventually,
    qmp_execute,
    start_runner,
    stopping,
    wait_booted,
)
from testkit.ports import free_port
from vm_runner.cmdline import MIB, VIRTIO_MEM_ID, parse_memory
from vm_runner.migrate import migrate
from vm_runner.migration import MigrationConfig
from vm_runner.qmp import QmpClient

QEMU_DEFAULT_DOWNTIME_MS = 300
PG_ENV = {**os.environ, "PGPASSWORD": "bench"}


def psql(port: int, sql: str) -> str:
    done = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "bench", "-d", "pgbench", "-tAc", sql],
        env=PG_ENV, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise OSError(done.stderr.strip())
    return done.stdout.strip()


def move(
    source: Guest, image: Any, workdir: Path, size: str, services: list[Any]
) -> tuple[Guest, dict[str, Any]]:
    port = free_port()
    target = start_runner(
        image, workdir, min_vcpus=1, max_vcpus=2, memory=size,
        max_memory=f"{2 * parse_memory(size) // MIB}Mi", postgres=True, migration_socket=True,
        incoming_port=port,
    )  # fmt: skip
    services.append(target.runner)
    outcome = asyncio.run(
        migrate(
            source_qmp=str(source.migration_socket),
            target_qmp=str(target.migration_socket),
            target_uri=f"tcp:127.0.0.1:{port}",
            config=MigrationConfig(),
        )
    )
    if not outcome.succeeded:
        raise kit.BenchError(f"migration failed: {outcome.reason.value}")
    downtime = outcome.downtime_ms
    return target, {
        "total_seconds": round(outcome.total_seconds, 3),
        "qemu_total_time_ms": outcome.qemu_total_time_ms,
        "downtime_ms": downtime,
        "transferred_mib": round((outcome.transferred_bytes or 0) / MIB, 1),
        "downtime_to_qemu_default": None
        if downtime is None
        else round(downtime / QEMU_DEFAULT_DOWNTIME_MS, 3),
    }


def one_size(image: Any, root: Path, size: str, clients: int) -> dict[str, Any]:
    services: list[Any] = []
    with stopping(services):
        total = parse_memory(size)
        source = start_runner(
            image, root / "a", min_vcpus=1, max_vcpus=2, memory=size,
            max_memory=f"{2 * total // MIB}Mi", postgres=True, migration_socket=True,
        )  # fmt: skip
        services.append(source.runner)
        wait_booted(source, timeout_seconds=180)
        assert source.postgres_port is not None
        pg = source.postgres_port
        eventually(
            lambda: psql(pg, "select 1"), lambda out: out == "1", timeout_seconds=180,
            interval_seconds=1.0, what="PostgreSQL in the guest", alive=[source.runner],
        )  # fmt: skip
        qmp_plug(source, total // 2)
        (root / "b").mkdir()
        target, idle = move(source, image, root / "b", size, services)
        assert target.postgres_port is not None
        eventually(lambda: psql(target.postgres_port or 0, "select 1"), lambda out: out == "1",
                   timeout_seconds=60, what="PostgreSQL after the move")  # fmt: skip
        pgbench = subprocess.Popen(
            ["pgbench", "-h", "127.0.0.1", "-p", str(target.postgres_port), "-U", "bench",
             "-n", "-c", str(clients), "-T", "600", "pgbench"],
            env=PG_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(5)  # the load under way, its pages dirtied
            if pgbench.poll() is not None:
                raise kit.BenchError("pgbench ended before the move")
            (root / "c").mkdir()
            _, loaded = move(target, image, root / "c", size, services)
        finally:
            pgbench.kill()
            pgbench.wait()
    return {"memory_mib": total // MIB, "plugged_mib": total // 2 // MIB, "idle": idle,
            "pgbench": loaded}  # fmt: skip


def qmp_plug(guest: Guest, size_bytes: int) -> None:
    async def plug() -> None:
        async with await QmpClient.connect(str(guest.qmp_socket)) as qmp:
            path = f"/machine/peripheral/{VIRTIO_MEM_ID}"
            value = {"path": path, "property": "requested-size", "value": size_bytes}
            await qmp.execute("qom-set", value)

    asyncio.run(plug())
    eventually(lambda: plugged(guest), lambda b: b == size_bytes, timeout_seconds=120,
               what="memory plugged")  # fmt: skip


def plugged(guest: Guest) -> int:
    answer = qmp_execute(guest.qmp_socket, "query-memory-devices")
    assert isinstance(answer, list)
    return sum(int(d["data"]["size"]) for d in answer if d.get("type") == "virtio-mem")


def run() -> int:
    parser = kit.command(__doc__)
    parser.add_argument(
        "--sizes",
        default="1Gi,2Gi",
        help="guest boot memory sizes, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=4,
        help="pgbench connections during the loaded move (default: %(default)s)",
    )
    args = parser.parse_args()
    for program in ("qemu-system-x86_64", "psql", "pgbench"):
        if shutil.which(program) is None:
            raise kit.BenchError(f"{program} is not installed (scripts/setup installs it)")
    image = build_image("postgres")
    results = []
    for size in args.sizes.split(","):
        with tempfile.TemporaryDirectory(prefix="bench-migration-") as tmp:
            root = Path(tmp)
            (root / "a").mkdir()
            results.append(one_size(image, root, size, args.clients))
    kit.emit(
        {
            "config": {"downtime_limit_ms": MigrationConfig().downtime_limit_ms,
                       "auto_converge": True, "accel": "tcg", "clients": args.clients},
            "qemu_default_downtime_ms": QEMU_DEFAULT_DOWNTIME_MS,
            "results": results,
        }
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    kit.main(run)
