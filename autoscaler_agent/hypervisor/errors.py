"""Typed errors of the hypervisor clients, and whether retrying can help.

Pure: no I/O. Callers look at the class (and ``is_retryable``), never at an HTTP status or a
QMP error class: the clients translate those here, once.

::

    HypervisorError                 is_retryable   raised when
    ├── HypervisorUnavailable       yes            socket missing, connection refused or lost,
    │                                              timeout, hypervisor CLI not runnable
    ├── ResizeInProgress            yes            cloud-hypervisor 429: an earlier vCPU removal
    │                                              is still pending
    ├── VmNotFound                  no             cloud-hypervisor 404: no VM created behind
    │                                              the socket
    ├── ResizeRejected              no             cloud-hypervisor 400/500, QMP device_add
    │                                              error, request outside 1..max (never sent)
    ├── UnplugNotCompleted          no             QEMU: the guest did not release a vCPU in
    │                                              time (or cannot: no guest); ``.state`` is
    │                                              what is in effect afterwards
    ├── MemoryResizeIncomplete      no             the guest did not plug or unplug all the
    │                                              memory asked for (a shrink of memory in
    │                                              use, no virtio-mem driver); ``.state`` is
    │                                              what is in effect afterwards
    ├── VcpuResizeIncomplete        no             QGA: the guest onlined or offlined fewer
    │                                              vCPUs than asked (refused, or cannot
    │                                              offline one); ``.state`` is what is online
    └── UnexpectedResponse          no             an answer the client cannot interpret
        ├── QmpCommandFailed        no             a QMP command answered ``{"error": ...}``
        └── QgaCommandFailed        no             a QGA command answered ``{"error": ...}``

``UnplugNotCompleted`` is not retryable on purpose: re-sending ``device_del`` for a vCPU whose
unplug is still pending only earns "already in the process of unplug". The caller should take
``.state`` as the truth and decide again on its next tick.

Every message names the operation and includes the hypervisor's own error text (``.detail``).
"""

from __future__ import annotations

from typing import ClassVar

from autoscaler_agent.hypervisor.base import MemoryState, VcpuState


class HypervisorError(Exception):
    """Base class. ``detail`` is the hypervisor's own error text, if it gave any."""

    is_retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        if detail:
            message = f"{message}: {detail}"
        super().__init__(message)
        self.detail = detail


class HypervisorUnavailable(HypervisorError):
    """The hypervisor could not be reached or did not answer in time."""

    is_retryable = True


class ResizeInProgress(HypervisorError):
    """An earlier resize (a pending vCPU removal) must finish first."""

    is_retryable = True


class VmNotFound(HypervisorError):
    """The hypervisor runs but has no VM to act on."""


class ResizeRejected(HypervisorError):
    """The hypervisor (or the client, before sending) refused this resize."""


class UnplugNotCompleted(HypervisorError):
    """The guest did not release the vCPU(s) being removed; ``state`` is what is in effect."""

    def __init__(self, message: str, *, state: VcpuState, detail: str | None = None) -> None:
        super().__init__(message, detail=detail)
        self.state = state

    @property
    def vcpus_in_effect(self) -> int:
        return self.state.current


class MemoryResizeIncomplete(HypervisorError):
    """The guest stopped short of the memory size asked for; ``state`` is what is in effect.

    Not retryable: the guest gave what it could (for a shrink, the rest is in use), and the
    device was set to the size reached, so asking again at once would only repeat the wait.
    The caller takes ``state`` as the truth and decides again later.
    """

    def __init__(self, message: str, *, state: MemoryState, detail: str | None = None) -> None:
        super().__init__(message, detail=detail)
        self.state = state


class VcpuResizeIncomplete(HypervisorError):
    """The guest onlined or offlined fewer vCPUs than asked; ``state`` is what is online.

    Not retryable: the guest answered (it refused, or cannot offline a vCPU), so asking again
    at once would get the same answer. The caller takes ``state`` as the truth.
    """

    def __init__(self, message: str, *, state: VcpuState, detail: str | None = None) -> None:
        super().__init__(message, detail=detail)
        self.state = state


class UnexpectedResponse(HypervisorError):
    """The hypervisor answered something this client cannot interpret."""


class QmpCommandFailed(UnexpectedResponse):
    """A QMP command answered with an error; ``error_class`` is QMP's ``class`` field."""

    def __init__(self, command: str, *, error_class: str, desc: str) -> None:
        super().__init__(f"QMP {command} failed ({error_class})", detail=desc)
        self.command = command
        self.error_class = error_class
        self.desc = desc


class QgaCommandFailed(UnexpectedResponse):
    """A qemu-guest-agent command answered with an error; ``error_class`` is its ``class``."""

    def __init__(self, command: str, *, error_class: str, desc: str) -> None:
        super().__init__(f"QGA {command} failed ({error_class})", detail=desc)
        self.command = command
        self.error_class = error_class
        self.desc = desc
