"""The seam between the agent and a VM's hypervisor: the ``Hypervisor`` protocol, ``VcpuState``
and ``MemoryState``.

Pure: types only, no I/O. Implementations (``qmp``, ``cloud_hypervisor``, ``ch_remote``) are thin
clients that translate one call into the hypervisor's own API and raise the typed errors of
``errors``; none of them decides *whether* to resize (that is ``autoscaler_agent.core``'s job).
"""

from __future__ import annotations

from typing import Annotated, Protocol

import msgspec

Vcpus = Annotated[int, msgspec.Meta(ge=0)]


class VcpuState(msgspec.Struct, frozen=True, kw_only=True):
    """The vCPUs a VM has now, as its hypervisor reports them.

    ``current`` counts vCPUs plugged into the VM (for QEMU: present, whether or not the guest has
    onlined them). ``max`` is the ceiling fixed when the VM was booted (QEMU ``maxcpus``,
    cloud-hypervisor ``max_vcpus``). Normally ``1 <= current <= max``; a hypervisor that reports
    otherwise is passed through unchanged rather than "corrected" here.
    """

    current: Vcpus
    max: Vcpus


Bytes = Annotated[int, msgspec.Meta(ge=0)]


class MemoryState(msgspec.Struct, frozen=True, kw_only=True):
    """The memory a VM has now, as its hypervisor reports it, in bytes.

    ``current`` is the boot memory plus what is plugged into the hot-plug device now (for QEMU:
    the virtio-mem device's ``size``, i.e. what the guest has really plugged, not what was
    requested). ``max`` is the ceiling fixed at boot (QEMU: boot memory plus the device's
    ``max-size``); ``min`` is the boot memory, which can never be unplugged. Sizes between move
    in steps of ``block`` (virtio-mem's block size; ``max - min`` when there is no device).
    """

    current: Bytes
    min: Bytes
    max: Bytes
    block: Bytes


class Hypervisor(Protocol):
    """One VM's hypervisor. Every call goes to the hypervisor; nothing is cached."""

    async def vcpus(self) -> VcpuState:
        """Read the VM's vCPU count and ceiling."""
        ...

    async def resize(self, vcpus: int) -> VcpuState:
        """Ask for exactly ``vcpus`` vCPUs; return what the hypervisor reports afterwards.

        Raises ``ResizeRejected`` without contacting the hypervisor's resize API when ``vcpus``
        is outside ``1..max``. Asking for the current count is a no-op.
        """
        ...

    async def memory(self) -> MemoryState:
        """Read the VM's memory: current, floor, ceiling and block size."""
        ...

    async def resize_memory(self, memory_bytes: int) -> MemoryState:
        """Ask for exactly ``memory_bytes`` of memory and wait until the guest has it.

        Raises ``ResizeRejected`` without resizing when the size is outside ``min..max`` or not
        ``min`` plus whole blocks. Raises ``MemoryResizeIncomplete`` (with the size in effect)
        when the guest does not get there: a shrink it cannot complete ends at what the guest
        gave back, and the device is then asked for exactly that size, so it stays there.
        """
        ...

    async def close(self) -> None:
        """Release connections; the object must not be used afterwards."""
        ...
