"""The agent's hypervisor layer: resize a VM's vCPUs and memory through QEMU (QMP, and
qemu-guest-agent for vCPUs onlined in the guest) or cloud-hypervisor.

Shell: clients only. They translate one call into the hypervisor's API and its answers into
``errors``; they hold no policy (sizes, retries, backoff belong to ``autoscaler_agent.core``).

Modules:
    base              the ``Hypervisor`` protocol, ``VcpuState`` and ``MemoryState``
    errors            the error tree, with ``is_retryable``
    ch_api            cloud-hypervisor wire types and status mapping (pure)
    cloud_hypervisor  HTTP over the VM's API socket
    ch_remote         the ``ch-remote`` CLI
    qmp               QEMU's QMP: vCPU hot-plug and unplug, virtio-mem resize
    qga               qemu-guest-agent: vCPUs onlined and offlined in the guest; memory by QMP
    unix              opening a unix socket with a bounded wait (QMP, QGA)
    factory           ``hypervisor_from_url`` for the pod's ``hypervisor`` annotation
    signals           the guest's memory-pressure lines (``memory_signal_socket_from_url``)
"""

from autoscaler_agent.hypervisor.base import Hypervisor, MemoryState, VcpuState
from autoscaler_agent.hypervisor.errors import (
    HypervisorError,
    HypervisorUnavailable,
    MemoryResizeIncomplete,
    QgaCommandFailed,
    QmpCommandFailed,
    ResizeInProgress,
    ResizeRejected,
    UnexpectedResponse,
    UnplugNotCompleted,
    VcpuResizeIncomplete,
    VmNotFound,
)
from autoscaler_agent.hypervisor.factory import (
    hypervisor_from_url,
    memory_signal_socket_from_url,
)

__all__ = [
    "Hypervisor",
    "HypervisorError",
    "HypervisorUnavailable",
    "MemoryResizeIncomplete",
    "MemoryState",
    "QgaCommandFailed",
    "QmpCommandFailed",
    "ResizeInProgress",
    "ResizeRejected",
    "UnexpectedResponse",
    "UnplugNotCompleted",
    "VcpuResizeIncomplete",
    "VcpuState",
    "VmNotFound",
    "hypervisor_from_url",
    "memory_signal_socket_from_url",
]
