"""A drain on the real nodes: a node emptied, its VM running elsewhere with its data intact.

Relief's live scale-down (``scheduler_extender.relief``, rule 4 of ``core.relief``) started as
an operator starts it (docs/DEPLOY.md, "Live scale-down"): ``kubectl taint`` of the node the
example VM runs on with ``vm-autoscaling.io/draining:NoSchedule``, the taint being the drain.
The tier's overlay turns drains on and holds back relief's own choice of a node (its share),
so this is the one drain of the tier.

What it shows: relief moves the VM away live (a VirtualMachineMigration labelled ``Drain``,
Succeeded); rows written before at the VM's pod IP read back after through the VM's Service;
then every other pod there that ``kubectl drain --ignore-daemonsets`` would evict is evicted
(an ``EvictedForDrain`` Event names it: the Eviction API, never a delete) and its controller
makes it again elsewhere or leaves it Pending, while the DaemonSet pods stay (same uid); the
leader reports the node emptied (``vmautoscale_extender_relief_nodes_emptied``); no ledger
sample over-committed a node (``OverCommitWatch``). Printed: taint -> migration created ->
Succeeded (QEMU's downtime) -> the source pod gone -> pods evicted -> emptied, seconds from the
taint.

It runs after every other module of the tier but test_monitoring (``conftest.py``): it moves
the VM off its node and evicts a replica of the scheduler pair, whose replacement stays Pending
while the node is drained (required anti-affinity: the other node has the other replica). The
drill then removes the taint, which ends the drain, and waits for the system to be whole again
(both replicas Ready, one leading), as test_monitoring's scrapes expect.
"""

from __future__ import annotations

import json
import re
import time

import msgspec
import pytest

from protocol.annotations import DRAIN_TAINT, is_vm
from protocol.kube import Pod
from protocol.virtualmachine import RELIEF_LABEL
from scheduler_extender.core.podinfo import Disruption, disruption_of
from scheduler_extender.core.relief import MoveReason
from testkit.controlplane import wait_for
from tests.node.conftest import RELIEVABLE_MAX_VCPUS, example_vm, opt_in
from tests.node.harness import VM, Node, Obj, wait_postgres
from tests.node.test_migration import (
    SERVICE_NAME,
    migration,
    psql,
    query_or_none,
    relief_migrations,
    service_addresses,
)
from tests.node.test_node_failures import (
    DRILL,
    OverCommitWatch,
    _extender_get,
    _leader,
    _leader_ledger,
    _vm_pod,
    _wait_whole,
)

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(400)]

ROWS = 2000
EMPTIED = "vmautoscale_extender_relief_nodes_emptied"


def _pods_on(node: Node, name: str) -> list[Obj]:
    """Every pod bound to node ``name`` and not terminating, all namespaces."""
    out = node.kubectl(
        "get", "pods", "-A", "--field-selector", f"spec.nodeName={name}", "-o", "json"
    ).stdout
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def _key(pod: Obj) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def _emptied(node: Node) -> float | None:
    """The leading extender's ``relief_nodes_emptied`` (None: no leader answers now)."""
    leader = _leader(node)
    body = _extender_get(node, leader, "/metrics", timeout_seconds=5) if leader else None
    found = re.search(rf"^{EMPTIED} (\S+)$", body, flags=re.M) if body is not None else None
    return float(found.group(1)) if found else None


def _seen_by_leader(node: Node, drained: str) -> dict[str, object]:
    """What the leader's ledger says of the VMs on ``drained`` and of the room elsewhere: what
    the drain's move waits for (a VM unverified since a failover, too large for the room)."""
    ledger = _leader_ledger(node)
    vms = [
        {k: e[k] for k in ("pod", "resources", "unverified") if k in e}
        for e in ledger[drained]["allocations"]
    ]  # fmt: skip
    free = {n: v["free"] for n, v in ledger.items() if n != drained}
    return {"vms": vms, "free elsewhere": free}


def _relief_said(node: Node) -> list[str]:
    """The leading extender's last relief log lines (why it moves nothing, if it says so)."""
    leader = _leader(node)
    if leader is None:
        return ["(no leader)"]
    out = node.kubectl(
        "-n", "vm-autoscaling", "logs", leader["metadata"]["name"], "-c", "extender",
        "--tail", "400", check=False,
    ).stdout  # fmt: skip
    return [line for line in out.splitlines() if '"relief' in line or '"drain' in line][-6:]


def _evicted_for_drain(node: Node) -> set[str]:
    """The pods an ``EvictedForDrain`` Event names (namespace/name)."""
    out = node.kubectl(
        "get", "events", "-A", "--field-selector", "reason=EvictedForDrain", "-o", "json"
    ).stdout
    return {
        f"{e['involvedObject']['namespace']}/{e['involvedObject']['name']}"
        for e in json.loads(out)["items"]
    }


def test_a_drained_node_is_emptied_with_its_vm_moved_live_and_its_data_intact(
    tuned: Node,
) -> None:
    node = tuned
    began = time.time()
    if not node.workers:
        pytest.fail("a drain needs a cluster of two or more nodes")
    if not node.kubectl("get", "virtualmachine", VM, "--ignore-not-found", "-o", "name").stdout:
        example_vm(node, max_vcpus=RELIEVABLE_MAX_VCPUS)  # run alone (-k): a VM to move
    opt_in(node)
    whole = _wait_whole(node, "the system whole before the drain")
    # test_node_failures' VM pods without a VirtualMachine (nothing could move them), deleted
    # as its drills end, may still be going: the drain waits for them (no eviction while a VM
    # pod of ours is on the node), only none may be left on the node afterwards.
    drill_pods = node.kubectl("get", "pods", "-A", "-l", DRILL, "-o", "name").stdout.split()
    source = _vm_pod(node)
    here, ip, source_name = (
        source["spec"]["nodeName"], source["status"]["podIP"], source["metadata"]["name"]
    )  # fmt: skip
    # What the drain is to do with each pod there: the core's reading of kubectl drain's
    # filters (``disruption_of``), the VMs aside.
    fate: dict[str, Disruption] = {}
    uids: dict[str, str] = {}
    for pod in _pods_on(node, here):
        if is_vm(pod["metadata"].get("labels")):
            continue
        fate[_key(pod)] = disruption_of(msgspec.convert(pod, Pod))
        uids[_key(pod)] = pod["metadata"]["uid"]
    print(f"on {here} before the drain: {VM} ({source_name}) and {fate}")
    blocking = {k: d for k, d in fate.items() if d.blocks}
    assert not blocking, f"pods kubectl drain would refuse to evict: {blocking}"
    to_evict = sorted(k for k, d in fate.items() if d is Disruption.EVICT)
    left = sorted(k for k, d in fate.items() if d.is_left)
    assert to_evict and left, fate
    leader = _leader(node)
    self_evicting = leader is not None and leader["spec"]["nodeName"] == here
    looked = time.time()
    wait_postgres(ip)
    psql(ip, "DROP TABLE IF EXISTS drained; CREATE TABLE drained AS SELECT i, md5(i::text) AS v"
             f" FROM generate_series(1, {ROWS}) AS i")  # fmt: skip
    digest = "SELECT count(*) || ' ' || md5(string_agg(v, ',' ORDER BY i)) FROM drained"
    written = psql(ip, digest)
    written_at = time.time()
    before = _seen_by_leader(node, here)
    with OverCommitWatch(node, interval=0.5):
        tainted = time.time()
        node.kubectl("taint", "node", here, f"{DRAIN_TAINT}=manual:NoSchedule")
        try:

            def drain_migration() -> Obj | None:
                found = [
                    m for m in relief_migrations(node, tainted)
                    if m["metadata"]["labels"][RELIEF_LABEL] == MoveReason.DRAIN.value
                ]  # fmt: skip
                return found[0] if found else None

            try:
                made: Obj = wait_for(
                    drain_migration, timeout_seconds=90,
                    what=f"relief's Drain migration of {VM}", interval=0.2,
                )  # fmt: skip
            except AssertionError as e:
                said, seen = _relief_said(node), _seen_by_leader(node, here)
                raise AssertionError(f"{e}; the leader on relief: {said}; ledger: {seen}") from e
            created = time.time()
            name = made["metadata"]["name"]
            at_move = _seen_by_leader(node, here)

            def finished() -> Obj | None:
                m = migration(node, name)
                return m if m.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

            status = wait_for(finished, timeout_seconds=180, what=f"{name} finished",
                              interval=0.2)["status"]  # fmt: skip
            moved = time.time()
            assert status["phase"] == "Succeeded", status
            wait_for(lambda: node.pod_or_none("default", source_name) is None,
                     timeout_seconds=90, what=f"{source_name} gone")  # fmt: skip
            gone = time.time()
            wait_for(
                lambda: not {_key(p) for p in _pods_on(node, here)} & set(to_evict),
                timeout_seconds=90, what=f"{to_evict} evicted from {here}", interval=0.2,
            )  # fmt: skip
            evicted = time.time()
            wait_for(lambda: (_emptied(node) or 0) >= 1, timeout_seconds=90,
                     what=f"the leader reporting {here} emptied", interval=0.5)  # fmt: skip
            emptied = time.time()
            staying = {_key(p): p["metadata"]["uid"] for p in _pods_on(node, here)}
            events = _evicted_for_drain(node)
        finally:
            node.kubectl("taint", "node", here, f"{DRAIN_TAINT}-", check=False)
    target = node.pod("default", status["targetPod"])
    rows = wait_for(
        lambda: query_or_none(",".join(service_addresses(node)) or "0.0.0.0", digest),
        timeout_seconds=60, what=f"a query through {SERVICE_NAME}", interval=0.2,
    )  # fmt: skip
    print(f"before the taint {tainted - began:.1f}s (system whole {whole:.1f}s, pods read "
          f"{looked - began:.1f}s, rows written {written_at - began:.1f}s; light VMs still "
          f"there: {drill_pods}); the leader's ledger at the taint: {before};"
          f" at the move's creation: {at_move}")  # fmt: skip
    print(
        f"drain of {here} (taint by hand; {len(to_evict)} pods to evict, {len(left)} left): "
        f"taint -> migration created {created - tainted:.1f}s -> Succeeded "
        f"{moved - tainted:.1f}s (QEMU total {status.get('totalMilliseconds')} ms, downtime "
        f"{status.get('downtimeMilliseconds')} ms) -> source pod gone {gone - tainted:.1f}s "
        f"-> pods evicted {evicted - tainted:.1f}s -> emptied {emptied - tainted:.1f}s"
    )
    print(f"evicted {to_evict} (Events: {sorted(events & set(to_evict))}; the leader was on "
          f"{here}: {self_evicting}); left {sorted(staying)}")  # fmt: skip
    assert target["spec"]["nodeName"] != here
    assert made["spec"].get("targetNode") == target["spec"]["nodeName"], made["spec"]
    assert rows == written
    # DaemonSet pods stay, the same pods; nothing else is left there.
    assert staying == {k: uids[k] for k in left}, (staying, left)
    # Through the Eviction API: an Event per pod evicted. A leader that evicts its own pod
    # steps down as it stops, and may drop its queued Events (they are courtesies).
    missing = set(to_evict) - events
    if self_evicting and leader is not None:
        missing.discard(_key(leader))
    assert not missing, (missing, events)
    node.kubectl("delete", "virtualmachinemigration", name, "--wait=false")
    restored = _wait_whole(node, "the system whole after the drain ended")
    print(f"taint removed -> both replicas Ready, one leading: {restored:.1f}s")
