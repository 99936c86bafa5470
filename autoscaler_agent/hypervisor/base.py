"""The seam between the agent and a VM's hypervisor: the ``Hypervisor`` protocol and ``VcpuState``.

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

    async def close(self) -> None:
        """Release connections; the object must not be used afterwards."""
        ...
