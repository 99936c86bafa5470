"""The ``vm-controller`` command's HTTP side and its operator mistakes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kube_io import KubeClient
from vm_controller.__main__ import main, make_app
from vm_controller.controller import Controller
from vm_controller.metrics import ControllerMetrics


async def test_ready_only_once_every_watch_has_listed(aiohttp_client):
    registry = CollectorRegistry()
    client = KubeClient.for_url("http://127.0.0.1:9")  # never called: nothing is watched here
    controller = Controller(client, ControllerMetrics(registry))
    http = await aiohttp_client(make_app(controller, registry))
    try:
        assert (await http.get("/healthz")).status == 200
        assert (await http.get("/readyz")).status == 503
        controller.vms_listed.set()
        assert (await http.get("/readyz")).status == 503
        controller.pods_listed.set()
        assert (await http.get("/readyz")).status == 503
        controller.services_listed.set()
        assert (await http.get("/readyz")).status == 200
        metrics = await (await http.get("/metrics")).text()
        assert "vmautoscale_vmcontroller_reconciles_total" in metrics
        assert "vmautoscale_vmcontroller_pods_created_total" in metrics
    finally:
        await client.close()


def test_an_unreadable_kubeconfig_is_one_line(tmp_path, capsys):
    code = main(["--kubeconfig", str(tmp_path / "missing"), "--http-port", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 4
    assert len(err) == 1 and err[0].startswith("vm-controller: kubeconfig ")
