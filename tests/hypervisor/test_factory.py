"""hypervisor_from_url: schemes, paths confined below the socket root, clear refusals."""

from __future__ import annotations

import pytest

from autoscaler_agent.hypervisor import factory
from autoscaler_agent.hypervisor.ch_remote import ChRemoteClient
from autoscaler_agent.hypervisor.cloud_hypervisor import CloudHypervisorClient
from autoscaler_agent.hypervisor.factory import hypervisor_from_url
from autoscaler_agent.hypervisor.qga import QgaVcpuHypervisor
from autoscaler_agent.hypervisor.qmp import QmpClient
from vm_runner import cmdline


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
        ("qmp+qga:///run/vm/qmp.sock?qga=/../outside.sock", "escapes the socket root"),
        ("qmp+qga:///run/vm/qmp.sock?qga=%2F..%2F..%2Fx.sock", "escapes the socket root"),
        ("qmp+qga:///../qmp.sock", "escapes the socket root"),
        ("qmp+qga:///run/vm/qmp.sock?qga=run/ga.sock", "needs an absolute socket path"),
        ("qmp+qga:///run/vm/qmp.sock?qga=/run/vm/qmp.sock", "must not be the QMP socket"),
        ("qmp+qga:///run/vm/qmp.sock?qga=/a.sock&qga=/b.sock", "qga=<socket path>, once"),
        ("qmp+qga:///run/vm/qmp.sock?exec=/bin/sh", "qga=<socket path>, once"),
        ("qmp+qga:///run/vm/qmp.sock?qga", "unreadable query"),
        ("qmp+qga:///run/vm/qmp.sock#x", "must not have a query or fragment"),
        ("qmp+qga://node-1/run/vm/qmp.sock", "must not name a host"),
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
        "qga-dotdot",
        "qga-encoded-dotdot",
        "qga-qmp-dotdot",
        "qga-relative",
        "qga-is-qmp",
        "qga-twice",
        "qga-unknown-parameter",
        "qga-bare-parameter",
        "qga-fragment",
        "qga-host",
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


@pytest.mark.parametrize(
    ("url", "qmp", "qga"),
    [
        ("qmp+qga:///run/vm/qmp.sock", "run/vm/qmp.sock", "run/vm/qmp.qga.sock"),
        ("qmp+qga:///run/vm/uid-1.sock", "run/vm/uid-1.sock", "run/vm/uid-1.qga.sock"),
        ("qmp+qga:///run/vm/qmp.sock?qga=/run/ga/a.sock", "run/vm/qmp.sock", "run/ga/a.sock"),
        ("qmp+qga:///run/vm/qmp.sock?qga=%2Frun%2Fga.sock", "run/vm/qmp.sock", "run/ga.sock"),
    ],
    ids=["beside-qmp", "pod-uid-name", "named", "percent-encoded"],
)
async def test_qmp_qga_composes_both_sockets_below_root(tmp_path, url, qmp, qga):
    client = hypervisor_from_url(url, root=tmp_path, timeout_seconds=3, unplug_timeout_seconds=7)
    assert isinstance(client, QgaVcpuHypervisor)
    assert client.qmp.socket_path == tmp_path.resolve() / qmp
    assert client.qga.socket_path == tmp_path.resolve() / qga
    assert client.qga.command_timeout_seconds == 3
    assert client.qga.set_vcpus_timeout_seconds == 7
    await client.close()


def test_qga_socket_symlinked_out_of_root_is_refused(tmp_path):
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "run" / "vm.qga.sock").symlink_to(tmp_path / "elsewhere.sock")
    with pytest.raises(ValueError, match="escapes the socket root"):
        hypervisor_from_url("qmp+qga:///run/vm.sock", root=root)


@pytest.mark.parametrize(
    "qmp", ["/run/vm/qmp.sock", "/var/run/vm-autoscaling/qmp/3f2a.sock", "/run/vm/monitor"]
)
def test_agent_and_runner_derive_the_same_qga_socket(qmp):
    """The runner's container does not ship the agent, so the rule is written twice."""
    assert factory.qga_socket_beside(qmp) == cmdline.qga_socket_beside(qmp)


@pytest.mark.parametrize(
    "qmp", ["/run/vm/qmp.sock", "/var/run/vm-autoscaling/qmp/3f2a.sock", "/run/vm/monitor"]
)
def test_agent_and_runner_derive_the_same_memory_signal_socket(qmp):
    assert factory.memory_signal_socket_beside(qmp) == cmdline.memory_signal_socket_beside(qmp)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("qmp:///run/vm/qmp.sock", "run/vm/qmp.memory.sock"),
        ("qmp+qga:///run/vm/qmp.sock?qga=/run/vm/ga.sock", "run/vm/qmp.memory.sock"),
        ("cloud-hypervisor:///run/vm/ch.sock", None),
        ("ch-remote:///run/vm/ch.sock", None),
    ],
)
def test_memory_signal_socket_of_each_hypervisor(tmp_path, url, expected):
    found = factory.memory_signal_socket_from_url(url, root=tmp_path)
    assert found == (None if expected is None else tmp_path / expected)
