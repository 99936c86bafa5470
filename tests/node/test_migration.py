"""A VM under pgbench, its grow cut short by its node's room, moved live by relief to a node
with room for its requested size, where it grows to it (issue 37's drill, on issue 36's move).

Runs after test_failures, which leaves the example VM ``pg-vm`` freshly applied on a worker (one
CPU: the VM holds all of it at 1 vCPU) at node 1's size (``RELIEVABLE_MAX_VCPUS``, 2: at the
example's 4 it would ask for more than any node here has), opted out of moves until this drill
(``neverMove``: its guest's boot asks for more too, and is cut short, which would move it
before the drill's rows are written), and the double VMs on node 1 on their way out. With rows
written, pgbench loads the guest and the drill opts the VM in: the agent asks for 2 vCPUs, the
worker has no room (the answer is cut short by the node; if the boot's last ask is recent,
that want is still live and relief acts on it at once), and node 1 has room for the VM's
requested size once the double VMs' pods are gone.
The test does nothing else but load the VM: the extender's relief (on in the tier's overlay, a
pass a second) creates a ``VirtualMachineMigration`` (``GrowerToRoom``), the
vm-controller carries it out as deployed (``kubectl apply -k manifests/``): the extender
reserves the target's room, the target runner pod starts in QEMU's incoming mode, the
controller drives QEMU over TCP QMP and cuts over; pgbench, started again through the VM's
Service (the source's clients lose their connections with it), loads the guest on node 1, whose
agent asks again and gets it.
Asserted: the migration is relief's, to node 1, and Succeeded; an Event on the VM's pod says
why; the guest kept its size through the move (online vCPUs from its node_exporter, plugged
memory from QMP) and then reached its requested vCPUs on node 1; the VirtualMachine's status
names the new pod and node; the VM's name led to the source until the cut-over and never to the
target before it ran the guest; the rows are there, read through the VM's Service (its DNS name,
as the tier's DNS answers it); pgbench completes through it; the leader's ledger holds nothing
for the source afterwards; no ledger sample over-committed a node (``OverCommitWatch``).
Printed, from the load's start: the first grow cut short, the opt-in, room on node 1, move
created, Succeeded, grown to the requested size; from the moment relief may act (cut short and
opted in) to the move's creation, its success and the full size; QEMU's downtime; the time to
the first answered query after the move.
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
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from autoscaler_agent.policy import Samples
from autoscaler_agent.scrape import ScrapeError, parse_samples
from protocol import annotations as ann
from protocol.virtualmachine import RELIEF_LABEL
from testkit.controlplane import wait_for
from tests.node.conftest import RELIEVABLE_MAX_VCPUS, example_vm, opt_in
from tests.node.harness import VM, Node, Obj, wait_postgres
from tests.node.test_dns import decode, query
from tests.node.test_node_failures import LEASE, OverCommitWatch, _leader_ledger
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


def relief_migrations(node: Node, since: float) -> list[Obj]:
    """The VirtualMachineMigrations relief made for the VM (labelled with their reason) since
    ``since`` (epoch seconds, the API server's creation time, whole seconds)."""
    out = node.kubectl("get", "virtualmachinemigration", "-l", RELIEF_LABEL, "-o", "json").stdout
    found = []
    for m in json.loads(out)["items"]:
        created = datetime.fromisoformat(m["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        if m["spec"]["vmName"] == VM and created.timestamp() >= int(since):
            found.append(m)
    return found


def _after_the_move(node: Node, there: str, ip: str, since: float) -> str:
    """For a grow that did not come: the agent's decisions and asks for the VM on ``there``
    since ``since``, and the sessions of the guest's server (a lock held by a session whose
    client went with the source would stall the load)."""
    lines = [
        f"{e['event']}: {e.get('reason') or e.get('extender_reason') or e.get('error') or ''}"
        for e in node.agent_events(since, there)
        if e.get("vm", "").startswith(f"default/{VM}")
        and e["event"] in ("goal", "permit_requested", "permit_answered", "scrape_failed")
    ]  # fmt: skip
    sessions = query_or_none(
        ip, "SELECT state, wait_event_type, wait_event, now() - xact_start, client_addr"
        " FROM pg_stat_activity WHERE datname = 'pgbench' AND pid <> pg_backend_pid()",
    )  # fmt: skip
    return (f"the agent on {there} since the move: {lines[-12:]}\n"
            f"the guest's load: {_guest_load(ip)}\nthe guest's sessions:\n{sessions}")  # fmt: skip


def _guest_load(ip: str, seconds: float = 2.0) -> str:
    """The guest's busy fraction over ``seconds``, load1 and run queue, read from its
    node_exporter as the agent reads them (``parse_samples``), or why they could not be read."""

    def sample() -> Samples:
        with urllib.request.urlopen(f"http://{ip}:{METRICS_PORT}/metrics", timeout=5) as r:
            return parse_samples(r.read().decode())

    try:
        before = sample()
        time.sleep(seconds)
        after = sample()
    except (OSError, ScrapeError) as e:
        return f"unread ({e})"
    total = (after.cpu_seconds_total or 0.0) - (before.cpu_seconds_total or 0.0)
    idle = (after.cpu_idle_seconds_total or 0.0) - (before.cpu_idle_seconds_total or 0.0)
    busy = 1 - idle / total if total > 0 else float("nan")
    return (f"busy {busy:.2f} over {seconds:.0f}s, load1 {after.load1}, procs_running "
            f"{after.procs_running}")  # fmt: skip


def _lease_transitions(node: Node) -> int:
    lease = node.admin_get(LEASE)["spec"]
    return int(lease.get("leaseTransitions", 0))


@pytest.fixture
def forgetting_its_moves(tuned: Node) -> Iterator[Node]:
    """``tuned``, and afterwards, whatever the outcome, the VM's relief migrations deleted:
    relief counts a VM's moves from them: a failed one left behind would hold the VM in its
    failure backoff, and one not ended would fill relief's budget, so that test_drain's drain
    could not move it."""
    began = time.time()
    yield tuned
    for m in relief_migrations(tuned, began):
        tuned.kubectl(
            "delete", "virtualmachinemigration", m["metadata"]["name"], "--wait=false",
            check=False,
        )  # fmt: skip


def test_a_vm_cut_short_under_pgbench_is_moved_by_relief_and_grows_to_its_request(
    forgetting_its_moves: Node,
) -> None:
    node = forgetting_its_moves
    if not node.workers:
        pytest.fail("the move needs a cluster of two or more nodes")
    double = str(ROOT / "manifests" / "examples" / "double")
    if not node.kubectl("get", "virtualmachine", VM, "--ignore-not-found", "-o", "name").stdout:
        # Run alone (-k): the VM starts where test_failures leaves it, on a worker, at node 1's
        # size; node 1 has room at once (no double VMs).
        node.kubectl("cordon", node.name)
        try:
            example_vm(node, max_vcpus=RELIEVABLE_MAX_VCPUS)
        finally:
            node.kubectl("uncordon", node.name)
    source = example_vm(node, max_vcpus=RELIEVABLE_MAX_VCPUS)
    ip, here = source["status"]["podIP"], source["spec"]["nodeName"]
    booted = datetime.fromisoformat(
        source["metadata"]["creationTimestamp"].replace("Z", "+00:00")
    ).timestamp()
    source_name = source["metadata"]["name"]
    assert source["metadata"]["annotations"][ann.MAX_VCPUS] == str(RELIEVABLE_MAX_VCPUS)
    assert here != node.name, f"{VM} runs on node 1; relief moves it there from a worker"
    there = node.name
    wait_postgres(ip)
    psql(ip, "DROP TABLE IF EXISTS moved; CREATE TABLE moved AS SELECT i, md5(i::text) AS v"
             f" FROM generate_series(1, {ROWS}) AS i")  # fmt: skip
    digest = "SELECT count(*) || ' ' || md5(string_agg(v, ',' ORDER BY i)) FROM moved"
    written = psql(ip, digest)
    doubles = [f"{VM}-a", f"{VM}-b"]

    outputs: dict[int, str] = {}

    def ended(load: subprocess.Popen[str]) -> str:
        """The output of ``load``, killed first if still running."""
        if load.pid not in outputs:
            load.kill()
            outputs[load.pid] = load.communicate()[0]
        return outputs[load.pid]

    def pgbench(host: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["pgbench", "-h", host, "-c", "4", "-j", "2", "-T", "300", "-P", "2", "--no-vacuum"],
            env=PG_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    transitions = _lease_transitions(node)
    with OverCommitWatch(node, interval=0.5):
        started = time.time()
        # The load on the source; its clients lose their connections when the source goes.
        loads = [pgbench(ip)]
        try:
            opt_in(node)
            opted = time.time()
            # Node 1's room comes back once the double VMs' guests have powered off.
            node.kubectl("delete", "-k", double, "--ignore-not-found", "--wait=false")
            room: list[float] = []

            def created() -> Obj | None:
                if not room and all(node.pod_or_none("default", d) is None for d in doubles):
                    room.append(time.time())
                found = relief_migrations(node, started)
                return found[0] if found else None

            made: Obj = wait_for(created, timeout_seconds=120, what="relief's migration of "
                                 f"{VM}", interval=0.2)  # fmt: skip
            seen = time.time()
            name = made["metadata"]["name"]
            # The size to keep: the guest's once the source carries the move's mark (the
            # agent resizes it no more), before the target pod exists (the mark comes first).
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
            moved = time.time()
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
            answered = time.time()
            # The load again, on the moved VM through its Service: what it grows for there,
            # once the name leads to the target alone. pgbench takes the first address that
            # answers, and a source still listed (it answers until it stops) ends the clients
            # with it: once seen, no load on the target and so no grow.
            alone = wait_for(
                lambda: (a := service_addresses(node)) == [new_ip] and a,
                timeout_seconds=30, what=f"{SERVICE_NAME} leading to {new_ip} alone",
                interval=0.2,
            )  # fmt: skip
            # The query above may have been the source's, still answering: pgbench's clients
            # connect once, and a refused connection ends them (no load, no grow).
            wait_for(lambda: query_or_none(new_ip, "SELECT 1"), timeout_seconds=30,
                     what=f"{new_ip} answering a query itself", interval=0.2)  # fmt: skip
            loads.append(pgbench(",".join(alone)))
            # What the agent on the worker asked for and was refused for lack of room, before
            # the move: under the load, or already while the guest booted (then relief acts as
            # soon as the drill opts the VM in, on that want, still asked for).
            answers = [
                e for e in node.agent_events(booted, here)
                if e["event"] == "permit_answered" and e["outcome"] in ("denied", "partial")
                and e["t"] <= seen
            ]  # fmt: skip
            assert answers, "no grow of the VM was cut short on the worker before the move"
            cut, requested = answers[0]["t"], int(answers[-1]["requested_vcpus"])
            assert all("node" in a["extender_reason"] for a in answers), answers
            try:
                wait_for(lambda: online_vcpus(new_ip) == requested, timeout_seconds=60,
                         what=f"{VM} at its requested {requested} vCPUs on {there}",
                         interval=0.2)  # fmt: skip
            except AssertionError as e:
                # What the load met and what the agent there made of it, in the failure's own
                # message (a CI excerpt may keep little else).
                raise AssertionError(
                    f"{e}\npgbench after the move (-P 2):\n{ended(loads[-1])[-600:]}\n"
                    f"{_after_the_move(node, there, new_ip, moved)}"
                ) from e
            grown = time.time()
        finally:
            bench = [ended(load) for load in loads]
            # Here, so that a failure shows what the load saw too.
            print(f"pgbench on the source (-P 2):\n{bench[0][-1200:]}")
            if len(bench) > 1:
                print(f"pgbench after the move, through the Service (-P 2):\n{bench[-1][-800:]}")
    # The source pod goes (QEMU's shutdown); its room with it.
    wait_for(lambda: node.pod_or_none("default", status["sourcePod"]) is None,
             timeout_seconds=90, what=f"{status['sourcePod']} gone")  # fmt: skip
    at = room[0] - started if room else float("nan")
    # Relief may act once the VM is cut short and opted in, whichever comes last.
    could = max(cut, opted)
    print(
        f"{VM} under pgbench on {here}, relieved to {there}, from the load's start: first cut "
        f"short {cut - started:.1f}s ({len(answers)} answers cut short before the move, the "
        f"last asking {requested} vCPUs), opted in {opted - started:.1f}s, room on {there} "
        f"{at:.1f}s, move created {seen - started:.1f}s, Succeeded {moved - started:.1f}s "
        f"(QEMU total {status.get('totalMilliseconds')} ms, downtime "
        f"{status.get('downtimeMilliseconds')} ms), grown to {requested} vCPUs "
        f"{grown - started:.1f}s; cut short and opted in -> move created {seen - could:.1f}s "
        f"-> Succeeded {moved - seen:.1f}s -> grown {grown - moved:.1f}s (cut short and opted "
        f"in -> full size {grown - could:.1f}s); Succeeded -> first query answered through the "
        f"Service {answered - moved:.2f}s"
    )
    print(f"the guest's size before and after the move: {vcpus} vCPUs online, {plugged} B "
          f"plugged; after: {size}")  # fmt: skip
    assert made["metadata"]["labels"][RELIEF_LABEL] == "GrowerToRoom", made["metadata"]
    assert made["spec"].get("targetNode") == there, made["spec"]
    assert rows == written
    turns = [a for i, a in enumerate(resolved) if i == 0 or a != resolved[i - 1]]
    print(f"the VM's name resolved to, in turn, during the move: {turns}")
    assert not early, (early, turns)
    assert turns[0] == [ip], turns
    assert target["spec"]["nodeName"] == there
    assert size == (vcpus, plugged)
    assert vcpus < requested <= RELIEVABLE_MAX_VCPUS
    events = node.kubectl(
        "get", "events", "-n", "default", "-o", "jsonpath={.items[*].message}",
        "--field-selector", f"involvedObject.name={source_name},reason=GrowerToRoom",
    ).stdout  # fmt: skip
    # An Event is a courtesy, queued by the leader and dropped by one that stops leading (on a
    # starved host the pair once failed over mid-move): asserted when one extender led throughout.
    if _lease_transitions(node) == transitions:
        assert name in events, events
    else:
        print(f"the extender's leadership changed during the move; its Event: {events!r}")
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
