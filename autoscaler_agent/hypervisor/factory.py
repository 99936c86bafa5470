"""Build a ``Hypervisor`` from a VM's ``hypervisor`` annotation URL.

Pure apart from constructing the client (no I/O happens until it is first used). The URL names
a path *on the host*; the agent sees the host's socket directory mounted at ``root``, so the
path is resolved below ``root`` and anything that would escape it is refused: the annotation is
written by users, and must not let them point the agent at arbitrary sockets.

    qmp:///run/vm/qmp.sock                  -> QmpClient(root/run/vm/qmp.sock)
    qmp+qga:///run/vm/qmp.sock              -> QgaVcpuHypervisor: vCPUs through qemu-guest-agent
                                               on root/run/vm/qmp.qga.sock, memory through
                                               QMP on root/run/vm/qmp.sock
    qmp+qga:///run/vm/qmp.sock?qga=/run/vm/ga.sock   the same, with the QGA socket named
    cloud-hypervisor:///var/run/ch/ch.sock  -> CloudHypervisorClient(root/var/run/ch/ch.sock)
    ch-remote:///var/run/ch/ch.sock         -> ChRemoteClient(root/var/run/ch/ch.sock)

``qmp+qga`` is for VMs that ``vm_runner --vcpu-mode online`` starts (its default): by default
the QGA socket is the QMP socket's path with ``.sock`` replaced by ``.qga.sock``, the name the
runner gives it (``vm_runner.cmdline.qga_socket_beside``; a test pins that both agree). Every
path, the QGA one included, is confined below ``root``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final
from urllib.parse import parse_qs, unquote, urlsplit

from autoscaler_agent.hypervisor.base import Hypervisor
from autoscaler_agent.hypervisor.ch_remote import DEFAULT_BINARY, ChRemoteClient
from autoscaler_agent.hypervisor.cloud_hypervisor import CloudHypervisorClient
from autoscaler_agent.hypervisor.qga import QgaClient, QgaVcpuHypervisor
from autoscaler_agent.hypervisor.qmp import (
    DEFAULT_MEMORY_RESIZE_TIMEOUT_SECONDS,
    DEFAULT_MEMORY_STALL_SECONDS,
    DEFAULT_UNPLUG_TIMEOUT_SECONDS,
    QmpClient,
)

SCHEMES: Final = ("qmp", "qmp+qga", "cloud-hypervisor", "ch-remote")
DEFAULT_TIMEOUT_SECONDS: Final = 5.0
QGA_SOCKET_SUFFIX: Final = ".qga.sock"


MEMORY_SIGNAL_SOCKET_SUFFIX: Final = ".memory.sock"


def memory_signal_socket_beside(qmp_socket: str) -> str:
    """``/run/vm/qmp.sock`` -> ``/run/vm/qmp.memory.sock``: the host end of the guest's
    memory-pressure port, where ``vm_runner`` always puts it (the same function there; a test
    pins that both agree)."""
    return qmp_socket.removesuffix(".sock") + MEMORY_SIGNAL_SOCKET_SUFFIX


def memory_signal_socket_from_url(url: str, *, root: Path) -> Path | None:
    """The memory-signal socket (below ``root``) of a QEMU VM's hypervisor URL; None for the
    other hypervisors, which have no such port. ValueError as ``socket_paths_from_url``."""
    scheme, _, _ = socket_paths_from_url(url, root=root)
    if scheme not in ("qmp", "qmp+qga"):
        return None
    return _below_root(url, memory_signal_socket_beside(unquote(urlsplit(url).path)), root)


def qga_socket_beside(qmp_socket: str) -> str:
    """``/run/vm/qmp.sock`` -> ``/run/vm/qmp.qga.sock``: where ``vm_runner`` puts the QGA
    socket unless told otherwise (the runner's container does not ship this package, hence
    the rule is written in both; ``tests/hypervisor/test_factory.py`` pins that they agree)."""
    return qmp_socket.removesuffix(".sock") + QGA_SOCKET_SUFFIX


def _below_root(url: str, host_path: str, root: Path) -> Path:
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
    return resolved


def socket_paths_from_url(url: str, *, root: Path) -> tuple[str, Path, Path | None]:
    """``(scheme, path below root, QGA socket below root or None)``; ValueError saying what is
    wrong with ``url``. Only ``qmp+qga`` takes a query, and only ``qga=<absolute path>``."""
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
    if parts.fragment or (parts.query and parts.scheme != "qmp+qga"):
        raise ValueError(f"hypervisor URL {url!r}: must not have a query or fragment")
    host_path = unquote(parts.path)
    resolved = _below_root(url, host_path, root)
    if parts.scheme != "qmp+qga":
        return parts.scheme, resolved, None
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as e:
        raise ValueError(f"hypervisor URL {url!r}: unreadable query ({e})") from e
    if set(query) - {"qga"} or len(query.get("qga", [])) > 1:
        raise ValueError(
            f"hypervisor URL {url!r}: the only query parameter is qga=<socket path>, once"
        )
    qga_host_path = query["qga"][0] if "qga" in query else qga_socket_beside(host_path)
    qga = _below_root(url, qga_host_path, root)
    if qga == resolved:
        raise ValueError(f"hypervisor URL {url!r}: the QGA socket must not be the QMP socket")
    return parts.scheme, resolved, qga


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
    ``unplug_timeout_seconds`` is how long QEMU vCPU shrinks (and QGA vCPU changes, if longer
    than ``timeout_seconds``) wait for the guest; a QEMU memory
    resize waits while the guest makes progress, until it stalls ``memory_stall_seconds`` or
    ``memory_resize_timeout_seconds`` pass."""
    scheme, path, qga_path = socket_paths_from_url(url, root=root)
    if scheme in ("qmp", "qmp+qga"):
        qmp = QmpClient(
            path,
            command_timeout_seconds=timeout_seconds,
            unplug_timeout_seconds=unplug_timeout_seconds,
            memory_stall_seconds=memory_stall_seconds,
            memory_resize_timeout_seconds=memory_resize_timeout_seconds,
        )
        if qga_path is None:
            return qmp
        # The guest gets as long to online or offline vCPUs as QEMU's unplug waits for it.
        qga = QgaClient(
            qga_path,
            command_timeout_seconds=timeout_seconds,
            set_vcpus_timeout_seconds=max(timeout_seconds, unplug_timeout_seconds),
        )
        return QgaVcpuHypervisor(qga, qmp)
    if scheme == "cloud-hypervisor":
        return CloudHypervisorClient(path, timeout_seconds=timeout_seconds)
    return ChRemoteClient(path, binary=ch_remote_binary, timeout_seconds=timeout_seconds)
