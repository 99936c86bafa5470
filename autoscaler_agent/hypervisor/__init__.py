"""The agent's hypervisor layer: resize a VM's vCPUs through QEMU (QMP) or cloud-hypervisor.

Shell: clients only. They translate one call into the hypervisor's API and its answers into
``errors``; they hold no policy (sizes, retries, backoff belong to ``autoscaler_agent.core``).

Modules:
    base              the ``Hypervisor`` protocol and ``VcpuState``
    errors            the error tree, with ``is_retryable``
    ch_api            cloud-hypervisor wire types and status mapping (pure)
    cloud_hypervisor  HTTP over the VM's API socket
    ch_remote         the ``ch-remote`` CLI
    qmp               QEMU's QMP: vCPU hot-plug and unplug
    factory           ``hypervisor_from_url`` for the pod's ``hypervisor`` annotation
"""

from autoscaler_agent.hypervisor.base import Hypervisor, VcpuState
from autoscaler_agent.hypervisor.errors import (
    HypervisorError,
    HypervisorUnavailable,
    QmpCommandFailed,
    ResizeInProgress,
    ResizeRejected,
    UnexpectedResponse,
    UnplugNotCompleted,
    VmNotFound,
)
from autoscaler_agent.hypervisor.factory import hypervisor_from_url

__all__ = [
    "Hypervisor",
    "HypervisorError",
    "HypervisorUnavailable",
    "QmpCommandFailed",
    "ResizeInProgress",
    "ResizeRejected",
    "UnexpectedResponse",
    "UnplugNotCompleted",
    "VcpuState",
    "VmNotFound",
    "hypervisor_from_url",
]
