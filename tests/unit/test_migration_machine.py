"""The live-migration state machine (vm_runner.migration), step by step in virtual time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vm_runner.migration import (
    Action,
    Migration,
    MigrationConfig,
    Phase,
    Reason,
    SourceView,
    Step,
    TargetView,
    begin,
)

CONFIG = MigrationConfig(
    target_ready_timeout_seconds=10,
    converge_deadline_seconds=60,
    cutover_timeout_seconds=5,
    poll_seconds=0.5,
)
T0 = 1000.0
READY = TargetView(run_state="inmigrate")
RUNNING = TargetView(run_state="running")
GONE = TargetView(run_state=None)


def sending(**figures) -> SourceView:
    return SourceView(migration_status="active", **figures)


def completed() -> SourceView:
    return SourceView(
        run_state="postmigrate",
        migration_status="completed",
        total_time_ms=800,
        downtime_ms=40,
        transferred_bytes=150 * 2**20,
    )


def migrating(now: float = T0 + 1) -> Migration:
    state = begin(CONFIG, now=T0).observed(now, source=SourceView(), target=READY)
    return state.configured(now).started(now)


def test_waits_for_the_target_then_configures_starts_and_polls():
    state = begin(CONFIG, now=T0)
    assert state.next_action() == Action(step=Step.OBSERVE, wait_seconds=0.5)
    state = state.observed(T0 + 1, source=SourceView(), target=GONE)  # not listening yet
    assert state.next_action().step is Step.OBSERVE
    state = state.observed(T0 + 2, source=SourceView(), target=READY)
    assert state.next_action() == Action(step=Step.CONFIGURE)
    state = state.configured(T0 + 2)
    assert state.next_action() == Action(step=Step.START)
    state = state.started(T0 + 2)
    assert state.next_action() == Action(step=Step.OBSERVE, wait_seconds=0.5)


def test_cuts_over_only_once_the_target_runs():
    state = migrating().observed(T0 + 3, source=completed(), target=READY)  # still inmigrate
    assert state.phase is Phase.MIGRATING
    state = state.observed(T0 + 4, source=completed(), target=RUNNING)
    assert state.next_action() == Action(step=Step.CUT_OVER)
    outcome = state.cut_over(T0 + 4.5).outcome()
    assert outcome.succeeded and outcome.reason is Reason.COMPLETED
    assert outcome.total_seconds == 4.5
    assert (outcome.qemu_total_time_ms, outcome.downtime_ms) == (800, 40)
    assert outcome.transferred_bytes == 150 * 2**20
    assert not outcome.is_source_running


def test_a_source_gone_after_completion_still_cuts_over_to_the_running_target():
    gone = SourceView(is_reachable=False, migration_status="completed")
    state = migrating().observed(T0 + 3, source=gone, target=RUNNING)
    assert state.next_action().step is Step.CUT_OVER


@pytest.mark.parametrize(
    ("observations", "reason"),
    [
        ([(T0 + 10, SourceView(), GONE)], Reason.TARGET_NEVER_READY),
        ([(T0 + 30, sending(), GONE)], Reason.TARGET_DIED),
        ([(T0 + 30, SourceView(is_reachable=False), READY)], Reason.SOURCE_DIED),
        ([(T0 + 30, SourceView(migration_status="failed"), READY)], Reason.QEMU_FAILED),
        ([(T0 + 61, sending(), READY)], Reason.NOT_CONVERGING),
        ([(T0 + 3, completed(), READY), (T0 + 8, completed(), READY)], Reason.TARGET_NEVER_RAN),
    ],
    ids=["target-never-ready", "target-died", "source-died", "qemu-failed", "not-converging",
         "target-never-ran"],
)  # fmt: skip
def test_every_failure_aborts(observations, reason):
    state = begin(CONFIG, now=T0) if reason is Reason.TARGET_NEVER_READY else migrating()
    for now, source, target in observations:
        state = state.observed(now, source=source, target=target)
    assert state.next_action() == Action(step=Step.ABORT)
    assert state.reason is reason


def test_an_abort_resumes_a_paused_source_and_ends_with_it_running():
    state = migrating().observed(T0 + 3, source=completed(), target=READY)
    state = state.observed(T0 + 8, source=completed(), target=READY)
    state = state.aborted(T0 + 9, source=SourceView(run_state="postmigrate"))
    assert state.next_action() == Action(step=Step.RESUME_SOURCE)
    outcome = state.resumed(T0 + 9.5, source=SourceView()).outcome()
    assert not outcome.succeeded
    assert outcome.reason is Reason.TARGET_NEVER_RAN
    assert outcome.is_source_running
    assert outcome.total_seconds == 9.5


def test_a_refused_command_aborts():
    state = begin(CONFIG, now=T0).observed(T0, source=SourceView(), target=READY)
    state = state.command_failed(T0 + 1)
    assert state.next_action().step is Step.ABORT
    assert state.aborted(T0 + 1, source=SourceView()).outcome().is_source_running


def test_outcome_before_the_end_is_refused():
    with pytest.raises(ValueError, match="has not ended"):
        migrating().outcome()


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="downtime limit"):
        MigrationConfig(downtime_limit_ms=0)
    with pytest.raises(ValueError, match="poll_seconds"):
        MigrationConfig(poll_seconds=0)


sources = st.builds(
    SourceView,
    is_reachable=st.booleans(),
    run_state=st.sampled_from(["running", "postmigrate", "paused", "finish-migrate"]),
    migration_status=st.sampled_from(
        [None, "setup", "active", "device", "completed", "failed", "cancelled"]
    ),
)
targets = st.builds(TargetView, run_state=st.sampled_from([None, "inmigrate", "running", "paused"]))
steps = st.lists(
    st.tuples(st.floats(0, 20), sources, targets, st.booleans()), min_size=1, max_size=60
)


@given(steps)
def test_never_cuts_over_unless_the_target_runs_and_always_ends(script):
    """Whatever both sides say, in any order: a cut-over follows only a completed source and a
    running target; any other end is an abort; and the machine ends within its deadlines."""
    now = T0
    state = begin(CONFIG, now=now)
    for delay, source, target, command_ok in [*script, *[(30.0, SourceView(), GONE, True)] * 4]:
        now += delay
        action = state.next_action()
        if action.step is Step.DONE:
            break
        if action.step is Step.OBSERVE:
            state = state.observed(now, source=source, target=target)
            if state.next_action().step is Step.CUT_OVER:
                assert source.migration_status == "completed"
                assert target.run_state == "running"
        elif action.step in (Step.CONFIGURE, Step.START):
            if not command_ok:
                state = state.command_failed(now)
            elif action.step is Step.CONFIGURE:
                state = state.configured(now)
            else:
                state = state.started(now)
        elif action.step is Step.CUT_OVER:
            state = state.cut_over(now)
        elif action.step is Step.ABORT:
            assert state.reason is not None and state.reason is not Reason.COMPLETED
            state = state.aborted(now, source=source)
        elif action.step is Step.RESUME_SOURCE:
            state = state.resumed(now, source=SourceView())
    assert state.next_action().step is Step.DONE
    outcome = state.outcome()
    assert outcome.succeeded == (outcome.reason is Reason.COMPLETED)
