"""Runs QEMU as a child and ends it cleanly: the imperative shell around ``build_qemu_command``.

Shutdown ladder on SIGTERM/SIGINT, each step only if the previous one did not end QEMU:

1. QMP ``system_powerdown`` (ACPI power button): the guest shuts down its services and powers
   off, and QEMU exits by itself. Waits ``grace_seconds``.
2. QMP ``quit``: QEMU stops at once (the guest sees a power cut). Waits ``quit_timeout_seconds``.
3. SIGKILL.

A step whose QMP command cannot be sent is skipped without waiting. QEMU also gets SIGKILL from
the kernel if the runner itself dies (PDEATHSIG), so it is never left behind as an orphan.

A QEMU that has sent its VM away (a live migration's source: QEMU's run state ``postmigrate``,
the guest paused for good and running on the target) starts at step 2: the paused guest cannot
answer the power button, and waiting for it would only hold the pod, its room on the node and
its DNS record for ``grace_seconds`` after the move.

Keep ``grace_seconds + quit_timeout_seconds`` below the pod's ``terminationGracePeriodSeconds``,
or the kubelet's own SIGKILL takes the last step for us.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import os
import signal

import structlog

from vm_runner.cmdline import VmSpec, build_qemu_command
from vm_runner.qmp import QmpClient, QmpError

log = structlog.get_logger(__name__)

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# Loaded before forking: the child may only make the prctl call, not load libraries.
_LIBC = ctypes.CDLL(None, use_errno=True)


def _die_with_runner() -> None:
    """Runs in the QEMU child between fork and exec.

    QEMU sits in its own session (see ``run``), so nothing else ties its life to ours: if the
    runner is SIGKILLed (OOM killer, a test's cleanup, a forced delete outside a container) QEMU
    would live on as an orphan holding the sockets and ports. With PDEATHSIG the kernel kills it.
    """
    if _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        os._exit(127)  # never run a QEMU we could leak


class Shutdown(enum.Enum):
    """How QEMU ended, reported in the final log line."""

    GUEST = "guest"  # QEMU exited on its own (guest poweroff, panic or reboot, or a QEMU error)
    POWERDOWN = "powerdown"
    QUIT = "quit"
    KILL = "kill"


async def _wait(process: asyncio.subprocess.Process, timeout_seconds: float) -> bool:
    try:
        await asyncio.wait_for(process.wait(), timeout_seconds)
    except TimeoutError:
        return False
    return True


async def _qmp(spec: VmSpec, command: str) -> bool:
    try:
        async with await QmpClient.connect(spec.control_socket) as qmp:
            await qmp.execute(command)
    except (OSError, QmpError) as e:
        log.warning("qmp_command_failed", command=command, error=str(e))
        return False
    return True


async def _run_state(spec: VmSpec) -> str | None:
    """QEMU's run state (``query-status``), None when it does not answer."""
    try:
        async with await QmpClient.connect(spec.control_socket) as qmp:
            status = await qmp.execute("query-status")
    except (OSError, QmpError):
        return None
    return str(status.get("status")) if isinstance(status, dict) else None


async def stop(
    process: asyncio.subprocess.Process,
    spec: VmSpec,
    *,
    grace_seconds: float,
    quit_timeout_seconds: float,
) -> Shutdown:
    """Walk the shutdown ladder (module docstring) and say which step ended QEMU."""
    if process.returncode is not None:
        return Shutdown.GUEST
    moved_away = await _run_state(spec) == "postmigrate"
    if moved_away:
        log.info("moved_away_quitting")
    else:
        log.info("powerdown_requested", grace_seconds=grace_seconds)
    # A step whose QMP command could not be sent is skipped without waiting: nothing will happen.
    if not moved_away and await _qmp(spec, "system_powerdown"):
        if await _wait(process, grace_seconds):
            return Shutdown.POWERDOWN
        log.warning("guest_ignored_powerdown", grace_seconds=grace_seconds)
    if await _qmp(spec, "quit"):
        if await _wait(process, quit_timeout_seconds):
            return Shutdown.QUIT
        log.error("qemu_ignored_quit", timeout_seconds=quit_timeout_seconds)
    log.error("qemu_killing", pid=process.pid)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()
    return Shutdown.KILL


async def run(spec: VmSpec, *, grace_seconds: float, quit_timeout_seconds: float) -> int:
    """Run the VM until it ends or we are told to stop; returns the process exit status."""
    argv = build_qemu_command(spec)
    log.info("qemu_starting", argv=argv, accel=spec.accel.value)
    # The handlers go in before QEMU starts: a SIGTERM from the moment QEMU exists (the kubelet
    # may send one at once) takes the ladder, never the default action that would end the
    # runner and, through PDEATHSIG, QEMU with the guest unflushed.
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_requested.set)
    process: asyncio.subprocess.Process | None = None
    try:
        # New session: a ^C on the terminal goes to the runner only, which then powers down
        # cleanly instead of QEMU dying from the same SIGINT.
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_runner,
        )
        log.info("qemu_started", pid=process.pid)
        exited = asyncio.create_task(process.wait())
        stopping = asyncio.create_task(stop_requested.wait())
        await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        how = Shutdown.GUEST
        if not exited.done():
            how = await stop(
                process,
                spec,
                grace_seconds=grace_seconds,
                quit_timeout_seconds=quit_timeout_seconds,
            )
        returncode = await exited
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        # Only on an unexpected error above: never leak QEMU.
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()
    log.info("qemu_exited", how=how.value, returncode=returncode)
    if how is Shutdown.GUEST:
        return returncode
    # We were asked to stop: success if the guest went down cleanly or at least QEMU did.
    return 0 if how in (Shutdown.POWERDOWN, Shutdown.QUIT) else 1
