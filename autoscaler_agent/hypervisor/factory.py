"""Build a ``Hypervisor`` from a VM's ``hypervisor`` annotation URL.

Pure apart from constructing the client (no I/O happens until it is first used). The URL names
a path *on the host*; the agent sees the host's socket directory mounted at ``root``, so the
path is resolved below ``root`` and anything that would escape it is refused: the annotation is
written by users, and must not let them point the agent at arbitrary sockets.

    qmp:///run/vm/qmp.sock                  -> QmpClient(root/run/vm/qmp.sock)
    cloud-hypervisor:///var/run/ch/ch.sock  -> CloudHypervisorClient(root/var/run/ch/ch.sock)
    ch-remote:///var/run/ch/ch.sock         -> ChRemoteClient(root/var/run/ch/ch.sock)
"""

from __future__ import annotations

from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from autoscaler_agent.hypervisor.base import Hypervisor
from autoscaler_agent.hypervisor.ch_remote import DEFAULT_BINARY, ChRemoteClient
from autoscaler_agent.hypervisor.cloud_hypervisor import CloudHypervisorClient
from autoscaler_agent.hypervisor.qmp import (
    DEFAULT_MEMORY_RESIZE_TIMEOUT_SECONDS,
    DEFAULT_MEMORY_STALL_SECONDS,
    DEFAULT_UNPLUG_TIMEOUT_SECONDS,
    QmpClient,
)

SCHEMES: Final = ("qmp", "cloud-hypervisor", "ch-remote")
DEFAULT_TIMEOUT_SECONDS: Final = 5.0


def socket_path_from_url(url: str, *, root: Path) -> tuple[str, Path]:
    """``(scheme, path below root)``; ValueError saying what is wrong with ``url``."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(
            f"hypervisor URL {url!r}: unknown scheme {parts.scheme!r}, "
            f"expected one of {', '.join(s + '://' for s in SCHEMES)}"
        )
    if parts.netloc:
        raise ValueError(
            f"hypervisor URL {url!r}: must not name a host ({parts.netloc!r}); the socket is "
            f"local, write {parts.scheme}:///path"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"hypervisor URL {url!r}: must not have a query or fragment")
    host_path = unquote(parts.path)
    if not host_path.startswith("/") or host_path.strip("/") == "":
        raise ValueError(f"hypervisor URL {url!r}: needs an absolute socket path")
    if "\0" in host_path:
        raise ValueError(f"hypervisor URL {url!r}: the path contains a NUL byte")
    base = root.resolve()
    # resolve() also follows symlinks, so a link inside root that points out of it is refused.
    resolved = (base / host_path.lstrip("/")).resolve()
    if resolved == base or not resolved.is_relative_to(base):
        raise ValueError(
            f"hypervisor URL {url!r}: path {host_path!r} escapes the socket root {str(root)!r}"
        )
    return parts.scheme, resolved


def hypervisor_from_url(
    url: str,
    *,
    root: Path,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    unplug_timeout_seconds: float = DEFAULT_UNPLUG_TIMEOUT_SECONDS,
    memory_stall_seconds: float = DEFAULT_MEMORY_STALL_SECONDS,
    memory_resize_timeout_seconds: float = DEFAULT_MEMORY_RESIZE_TIMEOUT_SECONDS,
    ch_remote_binary: str = DEFAULT_BINARY,
) -> Hypervisor:
    """The client for ``url``. ``timeout_seconds`` bounds each request (or CLI run);
    ``unplug_timeout_seconds`` is how long QEMU vCPU shrinks wait for the guest; a QEMU memory
    resize waits while the guest makes progress, until it stalls ``memory_stall_seconds`` or
    ``memory_resize_timeout_seconds`` pass."""
    scheme, path = socket_path_from_url(url, root=root)
    if scheme == "qmp":
        return QmpClient(
            path,
            command_timeout_seconds=timeout_seconds,
            unplug_timeout_seconds=unplug_timeout_seconds,
            memory_stall_seconds=memory_stall_seconds,
            memory_resize_timeout_seconds=memory_resize_timeout_seconds,
        )
    if scheme == "cloud-hypervisor":
        return CloudHypervisorClient(path, timeout_seconds=timeout_seconds)
    return ChRemoteClient(path, binary=ch_remote_binary, timeout_seconds=timeout_seconds)
