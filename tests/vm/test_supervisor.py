"""The runner's process handling with a stand-in for QEMU (a shell script that only sleeps):
fast, and no QEMU needed. The real powerdown path is covered by ``test_boot.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.vm.conftest import REPO


def start_runner(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    fake_qemu = tmp_path / "fake-qemu"
    # Ignores SIGTERM like a QEMU whose guest ignores the power button, and serves no QMP.
    fake_qemu.write_text("#!/bin/sh\ntrap '' TERM\nexec sleep 600\n")
    fake_qemu.chmod(0o755)
    log_path = tmp_path / "runner.log"
    with log_path.open("wb") as log:
        runner = subprocess.Popen(
            [sys.executable, "-m", "vm_runner", "--qemu-binary", str(fake_qemu),
             "--kernel", "/nonexistent", "--min-vcpus", "1", "--max-vcpus", "2",
             "--accel", "tcg", "--qmp-socket", str(tmp_path / "qmp" / "vm.sock"),
             "--grace-seconds", "0.5", "--quit-timeout-seconds", "0.5"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    return runner, log_path


def events(log_path: Path) -> list[dict]:
    return [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]


def wait_for_qemu_pid(log_path: Path) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        started = [e for e in events(log_path) if e["event"] == "qemu_started"]
        if started:
            return int(started[0]["pid"])
        time.sleep(0.05)
    raise AssertionError(f"runner never started QEMU: {log_path.read_text()}")


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes once reaped or a zombie.
    with open(f"/proc/{pid}/stat") as f:  # noqa: PTH123
        return f.read().split(") ", 1)[1][0] != "Z"


def wait_until_dead(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_unresponsive_qemu_is_killed_after_the_ladder(tmp_path):
    runner, log_path = start_runner(tmp_path)
    try:
        qemu_pid = wait_for_qemu_pid(log_path)
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=20) == 1
    finally:
        runner.kill()
    names = [e["event"] for e in events(log_path)]
    # The fake serves no QMP, so both QMP steps fail at once and the ladder ends in SIGKILL.
    assert names[names.index("powerdown_requested") :] == [
        "powerdown_requested", "qmp_command_failed", "qmp_command_failed", "qemu_killing",
        "qemu_exited",
    ]  # fmt: skip
    assert events(log_path)[-1]["how"] == "kill"
    assert wait_until_dead(qemu_pid)


def test_qemu_dies_with_a_killed_runner(tmp_path):
    runner, log_path = start_runner(tmp_path)
    try:
        qemu_pid = wait_for_qemu_pid(log_path)
        assert is_alive(qemu_pid)
        runner.kill()  # no chance to clean up: only PDEATHSIG can take QEMU down
        runner.wait(timeout=10)
        assert wait_until_dead(qemu_pid)
    finally:
        runner.kill()
