"""The one translation from the core's ``PermitCall`` to the wire's ``ResourceRequest``.

Pure: no I/O. Used by the runner (before the extender client batches it) and by the simulator
(before ``decide_batch``), so both send exactly what the same state would send.

Each resource is read on its own on the wire (``protocol.permits``): ``requested`` above
``current`` is a request, below it a notice, equal steady. A VM whose memory is not managed
(no hot-plug device known) reports its minimum memory as steady, with the same as its last
permit: the extender then holds exactly what the VM booted with.
"""

from __future__ import annotations

from autoscaler_agent.core import PermitCall
from protocol.annotations import VmSpec
from protocol.permits import LoadReport, PodRef, ResourceRequest, Resources


def resource_request(call: PermitCall, *, pod: PodRef, node: str, spec: VmSpec) -> ResourceRequest:
    """``call`` for ``pod`` on ``node`` as the extender reads it."""
    cpu = call.vcpus
    mem = call.memory
    steady = spec.min_memory_bytes
    load1 = call.load1
    return ResourceRequest(
        pod=pod,
        node=node,
        current=Resources(vcpus=cpu.current, memory_bytes=steady if mem is None else mem.current),
        requested=Resources(
            vcpus=cpu.requested, memory_bytes=steady if mem is None else mem.requested
        ),
        last_permit=Resources(
            vcpus=cpu.last_permit, memory_bytes=steady if mem is None else mem.last_permit
        ),
        # What the guest showed, for the extender's logs and the recommender; none before
        # the first scrape (or with a nonsense load1).
        load=LoadReport(
            load1=load1,
            cpu_busy_fraction=call.cpu_busy_fraction,
            memory_used_fraction=call.memory_used_fraction,
        )
        if load1 is not None and load1 >= 0
        else None,
    )
