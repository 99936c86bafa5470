"""scripts/watch-vcpus against a real HTTP server serving what the extender's /state serves."""

from __future__ import annotations

import functools
import http.server
import importlib.machinery
import importlib.util
import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from protocol.annotations import VmSpec
from scheduler_extender.core.ledger import Allocation, ForeignTag, NodeState, Owner
from scheduler_extender.core.podinfo import Demand
from scheduler_extender.state import dump_node
from testkit.manifests import ROOT

SCRIPT = ROOT / "scripts" / "watch-vcpus"
GIB = 2**30


def _load_script():
    loader = importlib.machinery.SourceFileLoader("watch_vcpus", str(SCRIPT))
    spec = importlib.util.spec_from_loader("watch_vcpus", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _alloc(uid, name, *, cpu_millis, owner=Owner.OWN, vm=None, vcpus=None, tag=None):
    d = Demand(cpu_millis, GIB)
    return Allocation(
        uid=uid,
        namespace="default",
        name=name,
        node="worker",
        owner=owner,
        tag=tag,
        priority=0,
        held=d,
        requests=d,
        allocated_at=1_700_000_000.0,
        vm=vm,
        vcpus=vcpus,
    )


def _state() -> dict:
    """Built by the extender's own dump, so the script is held to the real /state shape."""
    vm = VmSpec(min_vcpus=1, max_vcpus=4, min_memory_bytes=GIB, max_memory_bytes=GIB)
    own = {
        "u1": _alloc("u1", "pg-vm-0", cpu_millis=3000, vm=vm, vcpus=3),
        "u2": _alloc("u2", "plain-pod", cpu_millis=500),
    }
    foreign = {
        "u3": _alloc("u3", "kube-proxy", cpu_millis=250, owner=Owner.FOREIGN, tag=ForeignTag.STATIC)
    }
    worker = NodeState(
        name="worker",
        is_known=True,
        allocatable=Demand(8000, 16 * GIB),
        reserve=Demand(1600, 0),
        own=own,
        foreign=foreign,
        own_total=Demand(3500, 2 * GIB),
        foreign_total=Demand(250, GIB),
    )
    full = NodeState(
        name="worker2",
        is_known=True,
        allocatable=Demand(2000, 4 * GIB),
        reserve=Demand(400, 0),
        foreign={
            "u4": _alloc("u4", "hog", cpu_millis=2000, owner=Owner.FOREIGN, tag=ForeignTag.DEFAULT)
        },
        foreign_total=Demand(2000, GIB),
    )
    return {"nodes": [dump_node(worker), dump_node(full)]}


@pytest.fixture
def state_url() -> Iterator[str]:
    body = json.dumps(_state()).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/state":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=functools.partial(server.serve_forever, 0.05), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/state"
    finally:
        server.shutdown()
        server.server_close()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_once_prints_one_table_per_node_with_its_vms(state_url):
    result = _run("--once", "--url", state_url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NODE", "CPU", "RESERVE", "OURS", "OTHERS", "FREE", "STATE"]
    # 8 - 1.6 reserve - 3.5 ours - 0.25 others = 2.65 free
    assert lines[1].split() == ["worker", "8.00", "1.60", "3.50", "0.25", "2.65", "ok"]
    assert lines[2].split() == ["VM", "VCPUS", "MIN", "MAX", "HELD-CPU", "STATUS", "SINCE"]
    assert lines[3].split()[:6] == ["default/pg-vm-0", "3", "1", "4", "3.00", "bound"]
    assert lines[3].split()[6].startswith("2023-11-14T22:13:20")
    # Non-VM pods count in the node line but are not listed; neither are foreign pods.
    assert "plain-pod" not in result.stdout and "kube-proxy" not in result.stdout
    # worker2: 2 - 0.4 - 2 = -0.4, flagged.
    worker2 = next(line for line in lines if line.startswith("worker2"))
    assert worker2.split() == ["worker2", "2.00", "0.40", "0.00", "2.00", "-0.40", "OVERCOMMITTED"]
    assert "(no VMs)" in result.stdout


def test_vm_filter(state_url):
    result = _run("--once", "--url", state_url, "--vm", "nothing-matches")
    assert result.returncode == 0
    assert "pg-vm-0" not in result.stdout
    assert result.stdout.count("(no VMs)") == 2


def test_unreachable_extender_says_how_to_reach_it():
    from testkit.ports import free_port

    result = _run("--once", "--url", f"http://127.0.0.1:{free_port()}/state", "--timeout", "2")
    assert result.returncode == 1
    assert "port-forward deploy/scheduler-extender 10298:10298" in result.stderr


def test_not_a_state_document(state_url):
    result = _run("--once", "--url", state_url.replace("/state", "/other"))
    assert result.returncode == 1
    assert "HTTP 404" in result.stderr


def test_render_handles_an_empty_ledger():
    assert _load_script().render({"nodes": []}) == "no nodes known to the extender (yet)\n"


def test_default_url_is_the_verbs_listener_where_state_lives():
    from tests.deploy.system import EXTENDER_CFG

    assert f"http://127.0.0.1:{EXTENDER_CFG.listen.verbs.port}/state" == _load_script().DEFAULT_URL
