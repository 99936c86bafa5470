"""hypervisor_from_url: schemes, paths confined below the socket root, clear refusals."""

from __future__ import annotations

import pytest

from autoscaler_agent.hypervisor.ch_remote import ChRemoteClient
from autoscaler_agent.hypervisor.cloud_hypervisor import CloudHypervisorClient
from autoscaler_agent.hypervisor.factory import hypervisor_from_url
from autoscaler_agent.hypervisor.qmp import QmpClient


@pytest.mark.parametrize(
    ("url", "kind", "relative"),
    [
        ("qmp:///run/vm/qmp.sock", QmpClient, "run/vm/qmp.sock"),
        ("cloud-hypervisor:///var/run/ch/ch.sock", CloudHypervisorClient, "var/run/ch/ch.sock"),
        ("ch-remote:///var/run/ch/ch.sock", ChRemoteClient, "var/run/ch/ch.sock"),
        ("qmp:///run/vm/../vm/qmp.sock", QmpClient, "run/vm/qmp.sock"),
        ("qmp:///run/vm%20a/qmp.sock", QmpClient, "run/vm a/qmp.sock"),
    ],
    ids=["qmp", "cloud-hypervisor", "ch-remote", "dotdot-inside-root", "percent-encoded"],
)
async def test_builds_the_client_for_the_scheme_below_root(tmp_path, url, kind, relative):
    client = hypervisor_from_url(url, root=tmp_path, timeout_seconds=3, ch_remote_binary="x")
    assert type(client) is kind
    assert client.socket_path == tmp_path.resolve() / relative
    await client.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("qmp:///../etc/passwd", "escapes the socket root"),
        ("qmp:///run/../../outside.sock", "escapes the socket root"),
        ("qmp:///run/%2e%2e/%2e%2e/outside.sock", "escapes the socket root"),
        ("qmp:///", "needs an absolute socket path"),
        ("qmp:run/vm/qmp.sock", "needs an absolute socket path"),
        ("qmp://node-1/run/vm/qmp.sock", "must not name a host ('node-1')"),
        ("cloud-hypervisor://localhost/x.sock", "must not name a host"),
        ("http:///run/vm/qmp.sock", "unknown scheme 'http'"),
        ("/run/vm/qmp.sock", "unknown scheme ''"),
        ("qmp:///run/vm/qmp.sock?x=1", "must not have a query"),
        ("qmp:///run/%00/qmp.sock", "NUL byte"),
    ],
    ids=[
        "dotdot",
        "dotdot-deeper",
        "encoded-dotdot",
        "root-itself",
        "relative",
        "host",
        "localhost",
        "http",
        "no-scheme",
        "query",
        "nul",
    ],
)
def test_refuses_with_a_clear_message(tmp_path, url, message):
    with pytest.raises(ValueError, match="hypervisor URL") as info:
        hypervisor_from_url(url, root=tmp_path)
    assert message in str(info.value)


def test_refuses_a_symlink_that_leads_out_of_root(tmp_path):
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "run" / "vm").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="escapes the socket root"):
        hypervisor_from_url("qmp:///run/vm/qmp.sock", root=root)
