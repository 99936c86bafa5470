"""Pure: the live-migration state machine. It decides the next step from what QMP last said on
both sides and an explicit ``now``; it does no I/O, never sleeps and reads no clock.

The shell (``vm_runner.migrate``) loops: ``next_step(now)``, do it, report the result with a
past-tense event (``configured``, ``started``, ``observed``, ``cut_over``, ``aborted``), and
wait ``wait_seconds`` when told to. The same machine can drive runner processes on loopback
or runner pods on two nodes: only the shell knows where the QMP sockets are.

The order, and why (../shared/reference/migration.md):

1. Wait for the target to listen: its ``query-status`` says ``inmigrate``. Its QMP answers only
   once QEMU has parsed the whole command line (and refused a different device set).
2. Configure the source (auto-converge, downtime limit, bandwidth), then ``migrate``.
3. Poll the source's ``query-migrate`` until ``completed``; past ``converge_deadline_seconds``
   of not completing, give up.
4. Cut over only once the *target's* ``query-status`` says ``running``: right after the source
   says completed the target can still say ``inmigrate``, and a target that then fails to run
   would leave no running copy if the source were already gone.
5. On any failure, abort: ``migrate_cancel`` on the source, the target stopped, and the source
   resumed (``cont``) if it was left paused (after ``completed`` it sits in ``postmigrate``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

# query-migrate statuses after which the source is no longer sending (QEMU's MigrationStatus).
_FAILED = frozenset({"failed", "cancelled", "cancelling"})
_COMPLETED = "completed"
# Run states in which the source's vCPUs are stopped and ``cont`` resumes them.
_PAUSED = frozenset({"postmigrate", "paused", "finish-migrate"})


@dataclass(frozen=True, kw_only=True)
class MigrationConfig:
    """Tunables; durations in seconds, bandwidth in bytes per second."""

    # QEMU's own default is 300 ms; the guest is paused for at most about this long at the end.
    downtime_limit_ms: int = 300
    # 0: uncapped. QEMU's default cap is 128 MiB/s; on a shared node a cap keeps the move from
    # starving other pods' network.
    max_bandwidth_bytes_per_second: int = 0
    # Throttles the guest's vCPUs while it dirties memory faster than the link carries it:
    # without it, a memcpy-heavy guest never converged here.
    auto_converge: bool = True
    target_ready_timeout_seconds: float = 60.0
    converge_deadline_seconds: float = 300.0
    # After the source says completed: how long the target gets to say running.
    cutover_timeout_seconds: float = 30.0
    poll_seconds: float = 0.5

    def __post_init__(self) -> None:
        if self.downtime_limit_ms < 1:
            raise ValueError(f"downtime limit must be >= 1 ms, got {self.downtime_limit_ms}")
        if self.max_bandwidth_bytes_per_second < 0:
            raise ValueError("max bandwidth must be >= 0 (0: uncapped)")
        for name in ("target_ready_timeout_seconds", "converge_deadline_seconds",
                     "cutover_timeout_seconds", "poll_seconds"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")


@dataclass(frozen=True, kw_only=True)
class SourceView:
    """The source as its QMP last answered; ``is_reachable`` False: no answer (QEMU gone)."""

    is_reachable: bool = True
    run_state: str = "running"  # query-status
    migration_status: str | None = None  # query-migrate "status"; None before any migrate
    total_time_ms: int | None = None
    downtime_ms: int | None = None
    transferred_bytes: int | None = None


@dataclass(frozen=True, kw_only=True)
class TargetView:
    """The target as its QMP last answered; ``run_state`` None: no answer (not up, or gone)."""

    run_state: str | None = None


class Phase(enum.Enum):
    WAITING_FOR_TARGET = "waiting_for_target"
    CONFIGURING = "configuring"
    STARTING = "starting"
    MIGRATING = "migrating"  # the source sends; also waiting for the target to run after
    CUTTING_OVER = "cutting_over"
    ABORTING = "aborting"
    RESUMING_SOURCE = "resuming_source"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Step(enum.Enum):
    """What the shell does next."""

    OBSERVE = "observe"  # query both sides (after ``wait_seconds``), then ``observed``
    CONFIGURE = "configure"  # migrate-set-capabilities + migrate-set-parameters on the source
    START = "start"  # migrate to the target's URI
    CUT_OVER = "cut_over"  # stop the source: the target runs the VM
    ABORT = "abort"  # migrate_cancel on the source (if reachable), stop the target
    RESUME_SOURCE = "resume_source"  # cont on the source
    DONE = "done"


class Reason(enum.Enum):
    """Why a migration ended as it did."""

    COMPLETED = "completed"
    TARGET_NEVER_READY = "target_never_ready"
    NOT_CONVERGING = "not_converging"
    TARGET_NEVER_RAN = "target_never_ran"
    TARGET_DIED = "target_died"
    SOURCE_DIED = "source_died"
    QEMU_FAILED = "qemu_failed"  # query-migrate said failed or cancelled
    COMMAND_FAILED = "command_failed"  # a QMP command on the source was refused


@dataclass(frozen=True, kw_only=True)
class Action:
    step: Step
    wait_seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How a finished migration went. Times by the driver's clock from the first step; QEMU's
    figures as its source last reported them (None when it never got that far)."""

    succeeded: bool
    reason: Reason
    total_seconds: float
    qemu_total_time_ms: int | None
    downtime_ms: int | None
    transferred_bytes: int | None
    # Whether the source still runs the VM (a failure that left it running is the safe kind).
    is_source_running: bool


@dataclass(frozen=True, kw_only=True)
class Migration:
    """One move's state. Immutable: every event returns the next state."""

    config: MigrationConfig
    began_at: float
    phase: Phase = Phase.WAITING_FOR_TARGET
    started_at: float | None = None  # when ``migrate`` was accepted
    completed_at: float | None = None  # when the source first said completed
    ended_at: float | None = None
    reason: Reason | None = None
    source: SourceView = SourceView()
    target: TargetView = TargetView()

    # -- the decision ---------------------------------------------------------------------

    def next_action(self) -> Action:
        match self.phase:
            case Phase.CONFIGURING:
                return Action(step=Step.CONFIGURE)
            case Phase.STARTING:
                return Action(step=Step.START)
            case Phase.CUTTING_OVER:
                return Action(step=Step.CUT_OVER)
            case Phase.ABORTING:
                return Action(step=Step.ABORT)
            case Phase.RESUMING_SOURCE:
                return Action(step=Step.RESUME_SOURCE)
            case Phase.SUCCEEDED | Phase.FAILED:
                return Action(step=Step.DONE)
            case _:
                return Action(step=Step.OBSERVE, wait_seconds=self.config.poll_seconds)

    # -- events ---------------------------------------------------------------------------

    def observed(self, now: float, *, source: SourceView, target: TargetView) -> Migration:
        """Both sides' latest answers; moves on, or gives up, from them and ``now``."""
        state = replace(self, source=source, target=target)
        if self.phase is Phase.WAITING_FOR_TARGET:
            if not source.is_reachable:
                return state._fail(now, Reason.SOURCE_DIED)
            if target.run_state == "inmigrate":
                return replace(state, phase=Phase.CONFIGURING)
            if now - self.began_at >= self.config.target_ready_timeout_seconds:
                return state._fail(now, Reason.TARGET_NEVER_READY)
            return state
        if self.phase is not Phase.MIGRATING:
            return state
        assert self.started_at is not None
        status = source.migration_status
        if status == _COMPLETED and target.run_state == "running":
            # The VM runs on the target: cut over even if the source has died meanwhile.
            return replace(state, phase=Phase.CUTTING_OVER)
        if target.run_state is None:
            return state._fail(now, Reason.TARGET_DIED)
        if not source.is_reachable:
            return state._fail(now, Reason.SOURCE_DIED)
        if status in _FAILED:
            return state._fail(now, Reason.QEMU_FAILED)
        if status == _COMPLETED:
            completed_at = self.completed_at if self.completed_at is not None else now
            if now - completed_at >= self.config.cutover_timeout_seconds:
                return state._fail(now, Reason.TARGET_NEVER_RAN)
            return replace(state, completed_at=completed_at)
        if now - self.started_at >= self.config.converge_deadline_seconds:
            return state._fail(now, Reason.NOT_CONVERGING)
        return state

    def configured(self, now: float) -> Migration:
        return replace(self, phase=Phase.STARTING)

    def started(self, now: float) -> Migration:
        return replace(self, phase=Phase.MIGRATING, started_at=now)

    def command_failed(self, now: float) -> Migration:
        """A QMP command on the source was refused or its socket broke (CONFIGURE, START)."""
        return self._fail(now, Reason.COMMAND_FAILED)

    def cut_over(self, now: float) -> Migration:
        return replace(self, phase=Phase.SUCCEEDED, reason=Reason.COMPLETED, ended_at=now)

    def aborted(self, now: float, *, source: SourceView) -> Migration:
        """The target is stopped and any transfer cancelled; ``source``: the source since."""
        if source.is_reachable and source.run_state in _PAUSED:
            return replace(self, phase=Phase.RESUMING_SOURCE, source=source)
        return replace(self, phase=Phase.FAILED, source=source, ended_at=now)

    def resumed(self, now: float, *, source: SourceView) -> Migration:
        return replace(self, phase=Phase.FAILED, source=source, ended_at=now)

    def _fail(self, now: float, reason: Reason) -> Migration:
        del now  # the end is stamped once the abort is done
        return replace(self, phase=Phase.ABORTING, reason=reason)

    # -- the result -----------------------------------------------------------------------

    def outcome(self) -> Outcome:
        if self.phase not in (Phase.SUCCEEDED, Phase.FAILED):
            raise ValueError(f"the migration has not ended (phase {self.phase.value})")
        assert self.ended_at is not None and self.reason is not None
        succeeded = self.phase is Phase.SUCCEEDED
        return Outcome(
            succeeded=succeeded,
            reason=self.reason,
            total_seconds=self.ended_at - self.began_at,
            qemu_total_time_ms=self.source.total_time_ms,
            downtime_ms=self.source.downtime_ms,
            transferred_bytes=self.source.transferred_bytes,
            is_source_running=not succeeded
            and self.source.is_reachable
            and self.source.run_state == "running",
        )


def begin(config: MigrationConfig, *, now: float) -> Migration:
    return Migration(config=config, began_at=now)
