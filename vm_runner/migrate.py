"""Shell: drives ``vm_runner.migration`` over QMP. Every decision is the pure machine's; this
module only sends the commands it names and reports what QEMU answered.

One short QMP session per step (``vm_runner.qmp.QmpClient``): a QMP socket serves one client at
a time, so holding one open for a whole move would lock out anyone else (the runner's own
shutdown, the agent) on that socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from vm_runner.migration import (
    Migration,
    MigrationConfig,
    Outcome,
    SourceView,
    Step,
    TargetView,
    begin,
)
from vm_runner.qmp import QmpClient, QmpError

log = structlog.get_logger(__name__)

# A QMP answer slower than this counts as no answer (a wedged or dying QEMU).
QMP_TIMEOUT_SECONDS = 10.0


async def _execute(socket: str, command: str, arguments: dict[str, object] | None = None) -> object:
    async def run() -> object:
        async with await QmpClient.connect(socket) as qmp:
            return await qmp.execute(command, arguments)

    return await asyncio.wait_for(run(), QMP_TIMEOUT_SECONDS)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None


async def observe_source(socket: str) -> SourceView:
    try:
        status = await _execute(socket, "query-status")
        migrate = await _execute(socket, "query-migrate")
    except (OSError, QmpError, TimeoutError):
        return SourceView(is_reachable=False, run_state="unreachable")
    assert isinstance(status, dict) and isinstance(migrate, dict)
    ram = migrate.get("ram")
    return SourceView(
        run_state=str(status.get("status")),
        migration_status=None if "status" not in migrate else str(migrate["status"]),
        total_time_ms=_int(migrate.get("total-time")),
        downtime_ms=_int(migrate.get("downtime")),
        transferred_bytes=_int(ram.get("transferred")) if isinstance(ram, dict) else None,
    )


async def observe_target(socket: str) -> TargetView:
    try:
        status = await _execute(socket, "query-status")
    except (OSError, QmpError, TimeoutError):
        return TargetView(run_state=None)
    assert isinstance(status, dict)
    return TargetView(run_state=str(status.get("status")))


async def _configure(socket: str, config: MigrationConfig) -> None:
    capabilities = [{"capability": "auto-converge", "state": config.auto_converge}]
    await _execute(socket, "migrate-set-capabilities", {"capabilities": capabilities})
    parameters: dict[str, object] = {"downtime-limit": config.downtime_limit_ms}
    # QEMU's max-bandwidth of 0 would mean "send nothing"; uncapped is the largest value.
    parameters["max-bandwidth"] = config.max_bandwidth_bytes_per_second or (1 << 62)
    await _execute(socket, "migrate-set-parameters", parameters)


async def _quit(socket: str) -> None:
    try:
        await _execute(socket, "quit")
    except (OSError, QmpError, TimeoutError) as e:
        # Gone already, or it went while answering: either way it no longer runs.
        log.info("migration_quit_unanswered", socket=socket, error=str(e))


async def migrate(
    *,
    source_qmp: str,
    target_qmp: str,
    target_uri: str,
    config: MigrationConfig,
    clock: Callable[[], float] | None = None,
    cut_over: Callable[[], Awaitable[None]] | None = None,
) -> Outcome:
    """Move the VM whose QMP socket is ``source_qmp`` to the incoming QEMU at ``target_uri``
    (``tcp:HOST:PORT``) whose QMP socket is ``target_qmp``. On success the source has been
    stopped by ``cut_over`` (default: QMP ``quit``; a pod's driver deletes the source pod
    instead, since a runner whose QEMU quits is restarted by its pod); on failure the target
    has quit, and the source runs (unless it died: ``Outcome`` says). Sockets may be
    ``tcp:HOST:PORT`` addresses (``QmpClient.connect``)."""
    now = clock or asyncio.get_running_loop().time
    state: Migration = begin(config, now=now())
    while True:
        action = state.next_action()
        log.debug("migration_step", step=action.step.value, phase=state.phase.value)
        match action.step:
            case Step.OBSERVE:
                await asyncio.sleep(action.wait_seconds)
                source, target = await asyncio.gather(
                    observe_source(source_qmp), observe_target(target_qmp)
                )
                state = state.observed(now(), source=source, target=target)
            case Step.CONFIGURE | Step.START:
                try:
                    if action.step is Step.CONFIGURE:
                        await _configure(source_qmp, config)
                        state = state.configured(now())
                    else:
                        await _execute(source_qmp, "migrate", {"uri": target_uri})
                        state = state.started(now())
                except (OSError, QmpError, TimeoutError) as e:
                    log.warning("migration_command_failed", step=action.step.value, error=str(e))
                    state = state.command_failed(now())
            case Step.CUT_OVER:
                await (cut_over() if cut_over is not None else _quit(source_qmp))
                state = state.cut_over(now())
            case Step.ABORT:
                try:
                    await _execute(source_qmp, "migrate_cancel")
                except (OSError, QmpError, TimeoutError) as e:
                    log.warning("migration_cancel_failed", error=str(e))
                await _quit(target_qmp)
                state = state.aborted(now(), source=await observe_source(source_qmp))
            case Step.RESUME_SOURCE:
                try:
                    await _execute(source_qmp, "cont")
                except (OSError, QmpError, TimeoutError) as e:
                    log.error("migration_source_not_resumed", error=str(e))
                state = state.resumed(now(), source=await observe_source(source_qmp))
            case Step.DONE:
                outcome = state.outcome()
                log.info(
                    "migration_finished",
                    succeeded=outcome.succeeded,
                    reason=outcome.reason.value,
                    total_seconds=round(outcome.total_seconds, 3),
                    downtime_ms=outcome.downtime_ms,
                    transferred_bytes=outcome.transferred_bytes,
                    is_source_running=outcome.is_source_running,
                )
                return outcome
