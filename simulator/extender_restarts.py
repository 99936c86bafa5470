"""The extender's restarts: what a new incarnation rebuilds from the API server, and when its
agents notice.

Pure: no I/O, no clock. A fresh ``ExtenderLife`` lists the nodes and the live pods, each VM
at its durable ``permitted-*`` annotation (which lags the permits granted: the lost ones are
what the agents' ``lastPermit`` must put right), and the pending pods. It must not read what
a real extender could not know after a restart: the VMs' real sizes are only used to say, in
the log, how far the rebuilt ledger is behind.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence

from scheduler_extender.admission import queue as adm
from scheduler_extender.admission.quota import QuotaConfig
from scheduler_extender.core.podinfo import PodInfo
from simulator.records import ExtenderLife, ForeignRecord, NodeRecord, VmRecord


def rebuild_extender(
    *,
    epoch: int,
    quotas: QuotaConfig,
    nodes: Iterable[NodeRecord],
    vms: Sequence[VmRecord],
    foreign: Sequence[ForeignRecord],
    pending: Sequence[VmRecord],
    annotations: Mapping[str, int],
    now: float,
    memory_annotations: Mapping[str, int] | None = None,
    on_change: Callable[[str], None],
) -> tuple[ExtenderLife, int]:
    """A fresh extender that listed nodes and pods and rebuilt its ledger; and how many pods
    it found."""
    ext = ExtenderLife(epoch, quotas)
    ext.ledger.subscribe(on_change)
    ext.ledger.replace_nodes((n.name, n.allocatable, dict(n.labels)) for n in nodes)
    pods: list[PodInfo] = [
        vm.info(
            node=vm.node,
            permitted=annotations.get(vm.uid),
            permitted_memory=(memory_annotations or {}).get(vm.uid),
        )
        for vm in vms
        if vm.node is not None and not vm.is_deleted
    ]
    pods.extend(f.info() for f in foreign if f.node is not None)
    ext.ledger.replace_pods(pods, at=now)
    for vm in pending:
        ext.admission.observe_pending(vm.info(node=None, permitted=None))
    adm.recheck(ext.admission, now=now)
    return ext, len(pods)


def restart_detail(ext: ExtenderLife, vms: Sequence[VmRecord], pods: int) -> str:
    """The log's account of a restart: the VMs the rebuilt ledger holds at another size than
    they run, until their agents speak."""
    behind = [
        vm.spec.name
        for vm in vms
        if vm.node is not None and not vm.is_deleted and ext.ledger.pods[vm.uid].vcpus != vm.vcpus
    ]
    return (
        f"rebuilt {pods} pods; ledger differs from the VM's size for"
        f" {len(behind)} VM(s) until their agents speak"
        + (f": {', '.join(behind[:5])}" if behind else "")
    )


def vms_by_node(vms: Sequence[VmRecord]) -> dict[str, list[VmRecord]]:
    """The live VMs on each node, in VM order: whom each node's agent reports for."""
    by_node: dict[str, list[VmRecord]] = {}
    for vm in vms:
        if vm.node is not None and not vm.is_deleted:
            by_node.setdefault(vm.node, []).append(vm)
    return by_node


def epoch_seen_after(node: str, period_seconds: float) -> float:
    """When a node's agent sees a new epoch, after it started: at its next exchange with the
    extender, at the latest its periodic empty batch; spread deterministically over that
    period by the node's name, so no instant takes every node's reports at once."""
    return (zlib.crc32(node.encode()) % 1000) / 1000 * period_seconds
