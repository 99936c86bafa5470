"""A VM under pgbench moved live to the other node by the vm-controller (issue 36's drill).

Runs after test_failures, which leaves the example VM ``pg-vm`` freshly applied on a worker and
the double VMs filling node 1; they go first (test_node_failures' drills remove them
anyway), so the move pays for no guest boot of its own. Then, with rows written and pgbench
loading the guest: a ``VirtualMachineMigration`` to the other node, carried out by the
vm-controller as deployed (``kubectl apply -k manifests/``): the extender reserves the target's
room, the target runner pod starts in QEMU's incoming mode, the controller drives QEMU over
TCP QMP and cuts over. Asserted: the migration Succeeded; the VirtualMachine's status names
the new pod and node; the guest has the same online vCPUs (its node_exporter) and plugged
memory (QMP); the rows are there, read through the VM's Service (its DNS name, as the tier's
DNS answers it); pgbench connects again through it; the leader's ledger holds nothing for the
source afterwards; no ledger sample over-committed a node during the move
(``OverCommitWatch``). Printed: the move's total time, QEMU's downtime, the time to the first
answered query after.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from protocol import annotations as ann
from testkit.controlplane import wait_for
from tests.node.conftest import example_vm
from tests.node.harness import VM, Node, Obj, wait_postgres
from tests.node.test_dns import decode, query
from tests.node.test_node_failures import OverCommitWatch, _leader_ledger
from vm_controller import decide
from vm_runner.cmdline import VIRTIO_MEM_ID
from vm_runner.qmp import QmpClient

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]
PG_ENV = {**os.environ, "PGPASSWORD": "bench", "PGUSER": "bench", "PGDATABASE": "pgbench"}
SERVICE_NAME = f"{VM}.{VM}.default.svc.cluster.local"  # the pod's record in the VM's Service
ROWS = 2000
QMP_PORT = 4445  # decide.MIGRATION_QMP_PORT: every VirtualMachine runner's --migration-port
METRICS_PORT = 9100


def psql(host: str, sql: str, timeout: float = 20) -> str:
    """``sql`` through libpq at ``host`` (a comma-separated list: libpq tries each in turn, as
    for a name with several addresses)."""
    result = subprocess.run(
        ["psql", "-h", host, "-tAc", sql, "-v", "ON_ERROR_STOP=1"],
        env={**PG_ENV, "PGCONNECT_TIMEOUT": "3"}, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    if result.returncode:
        raise OSError(result.stderr.strip())
    return result.stdout.strip()


def query_or_none(host: str, sql: str) -> str | None:
    """``psql`` that answers None where it fails (nothing there yet, or no longer)."""
    try:
        return psql(host, sql)
    except (OSError, subprocess.TimeoutExpired):
        return None


def service_addresses(node: Node) -> list[str]:
    """The A records of the VM's Service name, from the tier's DNS (what a client in a pod
    would get)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        s.sendto(query(SERVICE_NAME), (node.ip, 53))
        _, rcode, addresses = decode(s.recv(512))
    return addresses if rcode == 0 else []


def online_vcpus(ip: str) -> int:
    """The CPUs the guest has online: node_exporter's ``node_cpu_seconds_total`` lists those."""
    with urllib.request.urlopen(f"http://{ip}:{METRICS_PORT}/metrics", timeout=10) as r:
        text = r.read().decode()
    return len(set(re.findall(r'^node_cpu_seconds_total\{cpu="(\d+)"', text, flags=re.M)))


def plugged_bytes(ip: str) -> int:
    """The virtio-mem device's plugged size, as QEMU says (the runner's TCP QMP)."""

    async def get() -> int:
        async with await QmpClient.connect(f"tcp:{ip}:{QMP_PORT}") as qmp:
            size = await qmp.execute(
                "qom-get", {"path": f"/machine/peripheral/{VIRTIO_MEM_ID}", "property": "size"}
            )
        assert isinstance(size, int), size
        return size

    return asyncio.run(asyncio.wait_for(get(), 15))


def pod_annotations(node: Node, pod: str) -> dict[str, str]:
    found: dict[str, str] = node.pod("default", pod)["metadata"].get("annotations", {})
    return found


def vm_status(node: Node) -> Obj:
    out = node.kubectl("get", "virtualmachine", VM, "-o", "json").stdout
    status: Obj = json.loads(out).get("status", {})
    return status


def vm_pods(node: Node) -> list[Obj]:
    out = node.kubectl(
        "get", "pods", "-n", "default", "-l", f"{decide.VM_NAME_LABEL}={VM}", "-o", "json"
    ).stdout
    pods: list[Obj] = json.loads(out)["items"]
    return pods


def migration(node: Node, name: str) -> Obj:
    out = node.kubectl("get", "virtualmachinemigration", name, "-o", "json").stdout
    obj: Obj = json.loads(out)
    return obj


def test_a_vm_under_pgbench_moves_to_the_other_node_with_its_data_and_size(tuned: Node) -> None:
    node = tuned
    if not node.workers:
        pytest.fail("the move needs a cluster of two or more nodes")
    # The double VMs fill one node (test_failures): the move goes there.
    node.kubectl("delete", "-k", str(ROOT / "manifests" / "examples" / "double"),
                 "--ignore-not-found", "--wait=true", timeout=180)  # fmt: skip
    if not node.kubectl("get", "virtualmachine", VM, "--ignore-not-found", "-o", "name").stdout:
        # Run alone (-k): the VM starts where test_failures leaves it, on a worker (one CPU:
        # the VM is 1 vCPU there), so that node 1 (two CPUs) has room for it at any size.
        node.kubectl("cordon", node.name)
        try:
            example_vm(node)
        finally:
            node.kubectl("uncordon", node.name)
    source = example_vm(node)
    ip, here = source["status"]["podIP"], source["spec"]["nodeName"]
    source_name = source["metadata"]["name"]
    assert here != node.name, f"{VM} runs on node 1; the move goes there from a worker"
    there = node.name
    wait_postgres(ip)
    psql(ip, "DROP TABLE IF EXISTS moved; CREATE TABLE moved AS SELECT i, md5(i::text) AS v"
             f" FROM generate_series(1, {ROWS}) AS i")  # fmt: skip
    digest = "SELECT count(*) || ' ' || md5(string_agg(v, ',' ORDER BY i)) FROM moved"
    written = psql(ip, digest)
    load = subprocess.Popen(
        ["pgbench", "-h", ip, "-c", "4", "-j", "2", "-T", "300", "-P", "2", "--no-vacuum"],
        env=PG_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        name = f"{VM}-to-{there}"
        body = {
            "apiVersion": "vm-autoscaling.io/v1alpha1",
            "kind": "VirtualMachineMigration",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"vmName": VM, "targetNode": there},
        }
        with OverCommitWatch(node, interval=0.5):
            started = time.monotonic()
            node.kubectl("create", "-f", "-", input_text=json.dumps(body))
            # The size to keep: the guest's once the source carries the move's mark (the agent
            # resizes it no more), before the target pod exists (the mark comes first).
            wait_for(
                lambda: ann.MIGRATION in pod_annotations(node, source_name)
                or migration(node, name).get("status", {}).get("phase") == "Failed",
                timeout_seconds=30, what=f"{source_name} marked as moving", interval=0.1,
            )  # fmt: skip
            refused = migration(node, name).get("status", {})
            assert refused.get("phase") != "Failed", refused
            vcpus, plugged = online_vcpus(ip), plugged_bytes(ip)
            # What the VM's name resolves to, all through the move; and the addresses of its
            # pods still a move's target, listed after each answer: an address in both was
            # given to a client before that pod ran the guest.
            resolved: list[list[str]] = []
            early: list[str] = []

            def finished() -> Obj | None:
                resolved.append(service_addresses(node))
                targets = {
                    p["status"].get("podIP")
                    for p in vm_pods(node)
                    if decide.MIGRATION_TARGET_LABEL in p["metadata"].get("labels", {})
                }
                early.extend(a for a in resolved[-1] if a in targets)
                m = migration(node, name)
                return m if m.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

            done: Obj = wait_for(
                finished, timeout_seconds=240, what=f"{name} finished", interval=0.2
            )
            moved = time.monotonic()
            status = done["status"]
            assert status["phase"] == "Succeeded", status
            pod: str = status["targetPod"]
            target = node.pod("default", pod)
            # Read at once: the agent there resizes the VM again from now on.
            new_ip = target["status"]["podIP"]
            size = (online_vcpus(new_ip), plugged_bytes(new_ip))
            # The first query answered through the VM's Service name after the move.
            rows = wait_for(
                lambda: query_or_none(",".join(service_addresses(node)) or "0.0.0.0", digest),
                timeout_seconds=60, what="a query through the Service", interval=0.2,
            )  # fmt: skip
            answered = time.monotonic()
            # The source pod goes (QEMU's shutdown); its room with it.
            wait_for(lambda: node.pod_or_none("default", status["sourcePod"]) is None,
                     timeout_seconds=90, what=f"{status['sourcePod']} gone")  # fmt: skip
    finally:
        load.kill()
        bench = load.communicate()[0]
    print(f"pgbench during the move (-P 2):\n{bench[-1500:]}")
    print(
        f"{VM} moved {here} -> {there} under pgbench: created -> Succeeded "
        f"{moved - started:.1f}s (QEMU total {status.get('totalMilliseconds')} ms, downtime "
        f"{status.get('downtimeMilliseconds')} ms); Succeeded -> first query answered through "
        f"the Service {answered - moved:.2f}s"
    )
    print(f"the guest's size before and after: {vcpus} vCPUs online, {plugged} B plugged; "
          f"after: {size}")  # fmt: skip
    assert rows == written
    seen = [a for i, a in enumerate(resolved) if i == 0 or a != resolved[i - 1]]
    print(f"the VM's name resolved to, in turn, during the move: {seen}")
    assert not early, (early, seen)
    assert seen[0] == [ip], seen
    assert target["spec"]["nodeName"] == there
    assert size == (vcpus, plugged)
    wait_for(
        lambda: (vm_status(node).get("pod"), vm_status(node).get("node")) == (pod, there),
        timeout_seconds=30, what=f"the VirtualMachine's status naming {pod} on {there}",
    )  # fmt: skip
    # pgbench's clients connect again, through the Service.
    again = subprocess.run(
        ["pgbench", "-h", ",".join(service_addresses(node)), "-c", "4", "-j", "2", "-t", "20",
         "--no-vacuum"],
        env=PG_ENV, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "number of transactions actually processed: 80/80" in again.stdout, again.stdout
    ledger = _leader_ledger(node)
    held = {n: sorted(e["pod"] for e in v["allocations"]) for n, v in ledger.items()}
    print(f"the leader's ledger after the move: {held}")
    assert f"default/{source_name}" not in held.get(here, []), held
    assert f"default/{pod}" in held.get(there, []), held
    node.kubectl("delete", "virtualmachinemigration", name, "--wait=false")
