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

# Ignores SIGTERM like a QEMU whose guest ignores the power button, and serves no QMP.
DEAF_QEMU = "#!/bin/sh\ntrap '' TERM\nexec sleep 600\n"


def start_runner(
    tmp_path: Path, qemu_script: str = DEAF_QEMU, *, grace_seconds: float = 0.5
) -> tuple[subprocess.Popen[bytes], Path]:
    fake_qemu = tmp_path / "fake-qemu"
    fake_qemu.write_text(qemu_script)
    fake_qemu.chmod(0o755)
    log_path = tmp_path / "runner.log"
    with log_path.open("wb") as log:
        runner = subprocess.Popen(
            [sys.executable, "-m", "vm_runner", "--qemu-binary", str(fake_qemu),
             "--kernel", "/nonexistent", "--min-vcpus", "1", "--max-vcpus", "2",
             "--accel", "tcg", "--qmp-socket", str(tmp_path / "qmp" / "vm.sock"),
             "--grace-seconds", str(grace_seconds), "--quit-timeout-seconds", str(grace_seconds)],
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


# A QEMU that has sent its VM away: its control socket answers query-status with
# ``postmigrate`` and quits on ``quit``; ``system_powerdown`` is answered and ignored, as a
# paused guest would (it never powers off).
MOVED_AWAY_QEMU = r"""
import json, os, socket, sys
path = next(a for a in sys.argv if a.startswith("socket,id=control,"))
path = path.split("path=", 1)[1].split(",server=")[0]
server = socket.socket(socket.AF_UNIX)
server.bind(path)
server.listen()
while True:
    conn, _ = server.accept()
    stream = conn.makefile("rwb")
    stream.write(b'{"QMP": {"version": {}, "capabilities": []}}\n')
    stream.flush()
    for line in stream:
        command = json.loads(line)["execute"]
        answer = {"status": "postmigrate", "running": False} if command == "query-status" else {}
        stream.write(json.dumps({"return": answer}).encode() + b"\n")
        stream.flush()
        print(command, file=sys.stderr, flush=True)
        if command == "quit":
            os._exit(0)
    conn.close()
"""


def test_a_qemu_that_sent_its_vm_away_is_quit_without_the_power_button(tmp_path):
    """A live migration's source: the guest runs on the target, and this paused copy would
    ignore the power button for the whole grace period (600 s here)."""
    runner, log_path = start_runner(
        tmp_path, f"#!{sys.executable}\n{MOVED_AWAY_QEMU}", grace_seconds=600
    )
    try:
        wait_for_qemu_pid(log_path)
        control = next(e for e in events(log_path) if e["event"] == "qemu_starting")["argv"]
        socket_path = Path(
            next(a for a in control if a.startswith("socket,id=control,"))
            .split("path=", 1)[1].split(",server=")[0]
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=60) == 0
    finally:
        runner.kill()
    names = [e["event"] for e in events(log_path)]
    assert "moved_away_quitting" in names and "powerdown_requested" not in names, names
    assert events(log_path)[-1]["how"] == "quit"
    sent = [line for line in log_path.read_text().splitlines() if not line.startswith("{")]
    assert "system_powerdown" not in sent and sent[-1] == "quit", sent


def test_a_migration_target_restarted_boots_the_guest_instead_of_waiting_again(tmp_path):
    """The first start of a target waits for the source's state (``-incoming``); a restart of
    the same pod's runner (its socket directory kept) boots the guest, as the pod's flags stay a
    target's after the move."""
    fake_qemu = tmp_path / "fake-qemu"
    argvs = tmp_path / "argv"
    fake_qemu.write_text(f'#!/bin/sh\necho "$*" >> {argvs}\n')  # and exits at once, as QEMU may
    fake_qemu.chmod(0o755)
    for _ in range(2):
        subprocess.run(
            [sys.executable, "-m", "vm_runner", "--qemu-binary", str(fake_qemu),
             "--kernel", "/nonexistent", "--min-vcpus", "1", "--max-vcpus", "2",
             "--accel", "tcg", "--qmp-socket", str(tmp_path / "pod" / "qmp.sock"),
             "--incoming-port", "4444"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=True,
        )  # fmt: skip
    first, second = argvs.read_text().splitlines()
    assert "-incoming tcp:0:4444" in first
    assert "-incoming" not in second
