"""The ``vm-controller`` command's HTTP side and its operator mistakes."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from kube_io import KubeClient
from vm_controller.__main__ import main, make_app
from vm_controller.controller import Backoff, Controller
from vm_controller.metrics import ControllerMetrics
from vm_controller.migrator import ExtenderMoves, Migrator
from vm_runner.migration import MigrationConfig


async def test_ready_only_once_every_watch_has_listed(aiohttp_client):
    registry = CollectorRegistry()
    client = KubeClient.for_url("http://127.0.0.1:9")  # never called: nothing is watched here
    metrics = ControllerMetrics(registry)
    controller = Controller(client, metrics)
    moves = ExtenderMoves("http://127.0.0.1:9", "/nonexistent")  # never called either
    migrator = Migrator(controller, moves, metrics, MigrationConfig())
    http = await aiohttp_client(make_app(controller, migrator, registry))
    try:
        assert (await http.get("/healthz")).status == 200
        assert (await http.get("/readyz")).status == 503
        controller.vms_listed.set()
        assert (await http.get("/readyz")).status == 503
        controller.pods_listed.set()
        assert (await http.get("/readyz")).status == 503
        controller.services_listed.set()
        assert (await http.get("/readyz")).status == 503
        migrator.listed.set()
        assert (await http.get("/readyz")).status == 200
        metrics = await (await http.get("/metrics")).text()
        assert "vmautoscale_vmcontroller_reconciles_total" in metrics
        assert "vmautoscale_vmcontroller_pods_created_total" in metrics
    finally:
        await client.close()


def test_retries_back_off_per_key_doubling_to_the_cap_and_start_over_after_success() -> None:
    backoff = Backoff(first=0.5, cap=4.0)
    a, b = ("db", "a"), ("db", "b")
    assert [backoff.next_delay(a) for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.next_delay(b) == 0.5  # each key its own
    backoff.forget(a)
    assert backoff.next_delay(a) == 0.5


def test_an_unreadable_kubeconfig_is_one_line(tmp_path, capsys):
    code = main(["--kubeconfig", str(tmp_path / "missing"), "--http-port", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 4
    assert len(err) == 1 and err[0].startswith("vm-controller: kubeconfig ")


def test_migration_metrics_are_exported_with_prometheus_names() -> None:
    registry = CollectorRegistry()
    ControllerMetrics(registry)
    names = {m.name for m in registry.collect()}
    # prometheus_client drops the _total of counters in the family name.
    assert {
        "vmautoscale_vmcontroller_migrations_started",
        "vmautoscale_vmcontroller_migrations_succeeded",
        "vmautoscale_vmcontroller_migrations_failed",
        "vmautoscale_vmcontroller_migration_duration_seconds",
        "vmautoscale_vmcontroller_migration_downtime_seconds",
    } <= names


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--migration-downtime-ms", "0"], "downtime limit must be >= 1 ms"),
        (["--migration-deadline-seconds", "0"], "converge_deadline_seconds must be > 0"),
        (["--migration-target-pod-timeout-seconds", "0"], "must be > 0"),
    ],
)
def test_bad_migration_flags_are_one_line_before_any_connection(
    capsys: pytest.CaptureFixture[str], flags: list[str], words: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*flags, "--kubeconfig", "/nonexistent"])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("vm-controller: ") and words in line
