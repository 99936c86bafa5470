"""Command line for ``python -m vm_runner``: flags to a ``VmSpec``, then ``supervisor.run``.

Bad flags exit with status 2 (argparse's convention) before QEMU starts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import tempfile
from pathlib import Path

import structlog

from vm_runner import supervisor
from vm_runner.cmdline import (
    DEFAULT_MACHINE_TYPE,
    QGA_SOCKET_SUFFIX,
    Accel,
    Forward,
    VcpuMode,
    VmSpec,
    parse_forward,
    parse_memory,
    qga_socket_beside,
    resolve_accel,
)

log = structlog.get_logger(__name__)

NODE_EXPORTER_PORT = 9100
POSTGRES_PORT = 5432
KVM_DEVICE = "/dev/kvm"


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m vm_runner",
        description="Boot one guest VM under QEMU with resizable vCPUs, and shut it down "
        "cleanly on SIGTERM (ACPI powerdown, then QMP quit, then kill).",
    )
    image = parser.add_argument_group("guest image (see vm_image/README.md)")
    image.add_argument("--kernel", required=True, help="guest kernel (bzImage), e.g. vmlinuz")
    image.add_argument("--initrd", help="initramfs; the whole guest for the minimal image")
    image.add_argument(
        "--disk",
        help="raw disk image attached as virtio /dev/vda and used as the root file system "
        "(adds root=/dev/vda rw to the kernel arguments); the full image",
    )
    image.add_argument(
        "--kernel-args",
        default="",
        help="extra kernel arguments, appended to 'console=ttyS0 panic=-1 quiet'",
    )
    sizing = parser.add_argument_group("sizing")
    sizing.add_argument(
        "--min-vcpus", type=int, required=True, help="vCPUs at boot; also the scale-down floor"
    )
    sizing.add_argument(
        "--max-vcpus",
        type=int,
        required=True,
        help="vCPU ceiling (QEMU maxcpus); the autoscaler adds vCPUs up to this",
    )
    sizing.add_argument(
        "--vcpu-mode",
        choices=[m.value for m in VcpuMode],
        default=VcpuMode.ONLINE.value,
        help="online: QEMU creates --max-vcpus vCPUs at boot, the guest kernel brings up "
        "--min-vcpus (maxcpus=), and the autoscaler onlines and offlines the others inside the "
        "guest through qemu-guest-agent on --qga-socket; survives any number of grow/shrink "
        "cycles. hotplug: boot --min-vcpus and let the autoscaler plug vCPUs with QMP "
        "device_add/device_del; on QEMU 7.2 under TCG, plugging again after an unplug kills "
        "QEMU (default: %(default)s)",
    )
    sizing.add_argument(
        "--memory",
        default="512Mi",
        help="guest RAM at boot, also the memory floor: bytes, or with a Ki, Mi or Gi suffix "
        "(default: %(default)s)",
    )
    sizing.add_argument(
        "--max-memory",
        help="most guest RAM (the pod's max-memory annotation): memory above --memory is a "
        "virtio-mem device the autoscaler plugs and unplugs live, starting unplugged; "
        "default: --memory (no memory hot-plug)",
    )
    sizing.add_argument(
        "--memory-block-size",
        default="2Mi",
        help="virtio-mem block size, the granularity of plug and unplug (a power of two; "
        "--max-memory minus --memory and the memory-unit must be multiples of it); small "
        "blocks let a shrink succeed in a fragmented guest (default: %(default)s)",
    )
    machine = parser.add_argument_group("machine")
    machine.add_argument(
        "--accel",
        choices=[a.value for a in Accel],
        default=Accel.AUTO.value,
        help="auto picks tcg unless KVM is known to boot guests here (--kvm-boots): on nested "
        "virtualisation /dev/kvm can open yet hang the guest kernel at boot (default: %(default)s)",
    )
    machine.add_argument(
        "--kvm-boots",
        action="store_true",
        default=os.environ.get("VM_RUNNER_KVM_BOOTS") == "1",
        help="declare that KVM boots guests on this host, so --accel auto uses it when /dev/kvm "
        "is usable (also VM_RUNNER_KVM_BOOTS=1)",
    )
    machine.add_argument(
        "--machine-type",
        default=DEFAULT_MACHINE_TYPE,
        help="QEMU machine type; a versioned one, never an alias, since a migration's target "
        "must run the source's exact type (default: %(default)s)",
    )
    machine.add_argument(
        "--incoming-port",
        type=int,
        help="start as a live migration's target: QEMU does not boot the guest but waits on "
        "this TCP port (all addresses) for the source's state, then runs it; every other flag "
        "must be the source's (vm_runner/README.md, 'Live migration')",
    )
    machine.add_argument(
        "--qemu-binary", default="qemu-system-x86_64", help="QEMU to run (default: %(default)s)"
    )
    sockets = parser.add_argument_group("sockets and ports")
    sockets.add_argument(
        "--qmp-socket",
        required=True,
        help="QMP unix socket for the autoscaler agent (its directory is created); in a pod, "
        "a hostPath directory shared with the agent",
    )
    sockets.add_argument(
        "--qga-socket",
        help="--vcpu-mode online: unix socket to the guest's qemu-guest-agent, for the "
        f"autoscaler agent; default: beside --qmp-socket, '.sock' replaced by "
        f"'{QGA_SOCKET_SUFFIX}' (qmp.sock -> qmp{QGA_SOCKET_SUFFIX}), the name the agent's "
        "qmp+qga:// URL expects",
    )
    sockets.add_argument(
        "--migration-socket",
        help="a QMP unix socket of its own for a live migration's driver (the agent holds "
        "--qmp-socket open, and a QMP socket serves one client at a time); on both the source "
        "and the target runner",
    )
    sockets.add_argument(
        "--migration-port",
        type=int,
        help="a QMP monitor on this TCP port (all addresses) for a live migration's driver in "
        "another pod (the vm-controller); it is a control channel to the VM: only a "
        "NetworkPolicy admitting the driver alone may expose it "
        "(manifests/vm-controller/migration-networkpolicy.yaml)",
    )
    sockets.add_argument(
        "--serial-socket",
        help="expose the guest's serial console (a root shell on the minimal image) on this unix "
        "socket; without it the console goes to stdout",
    )
    sockets.add_argument(
        "--forward",
        action="append",
        metavar="[ADDRESS:]HOSTPORT:GUESTPORT",
        help=f"forward a host TCP port to the guest (repeatable); default: "
        f"{NODE_EXPORTER_PORT}:{NODE_EXPORTER_PORT} (node_exporter) and "
        f"{POSTGRES_PORT}:{POSTGRES_PORT} (PostgreSQL, full image)",
    )
    sockets.add_argument(
        "--listen-address",
        default="127.0.0.1",
        help="host address for forwards that name none; 0.0.0.0 in a pod, so the agent can "
        "scrape the pod IP (default: %(default)s)",
    )
    shutdown = parser.add_argument_group("shutdown")
    shutdown.add_argument(
        "--grace-seconds",
        type=float,
        default=20.0,
        help="after SIGTERM, how long the guest gets to power off before QMP quit "
        "(default: %(default)s)",
    )
    shutdown.add_argument(
        "--quit-timeout-seconds",
        type=float,
        default=5.0,
        help="after QMP quit, how long QEMU gets to exit before SIGKILL (default: %(default)s)",
    )
    return parser


def spec_from_args(args: argparse.Namespace, *, is_kvm_usable: bool, control_socket: str) -> VmSpec:
    """Raises ``ValueError`` with a message fit for the user on any inconsistent flag."""
    forward_texts: list[str] = args.forward or [
        f"{NODE_EXPORTER_PORT}:{NODE_EXPORTER_PORT}",
        f"{POSTGRES_PORT}:{POSTGRES_PORT}",
    ]
    forwards: tuple[Forward, ...] = tuple(
        parse_forward(text, default_address=args.listen_address) for text in forward_texts
    )
    accel = resolve_accel(
        Accel(args.accel), is_kvm_usable=is_kvm_usable, is_kvm_boot_known=args.kvm_boots
    )
    vcpu_mode = VcpuMode(args.vcpu_mode)
    qga_socket: str | None = None
    if vcpu_mode is VcpuMode.ONLINE:
        qga_socket = args.qga_socket or qga_socket_beside(args.qmp_socket)
        if qga_socket == args.qmp_socket:
            raise ValueError(f"--qga-socket must differ from --qmp-socket ({qga_socket})")
    elif args.qga_socket is not None:
        raise ValueError("--qga-socket is only used with --vcpu-mode online")
    return VmSpec(
        qemu_binary=args.qemu_binary,
        kernel=args.kernel,
        initrd=args.initrd,
        disk=args.disk,
        kernel_args=tuple(args.kernel_args.split()),
        min_vcpus=args.min_vcpus,
        max_vcpus=args.max_vcpus,
        memory_bytes=parse_memory(args.memory),
        max_memory_bytes=None if args.max_memory is None else parse_memory(args.max_memory),
        memory_block_bytes=parse_memory(args.memory_block_size),
        accel=accel,
        qmp_socket=args.qmp_socket,
        vcpu_mode=vcpu_mode,
        qga_socket=qga_socket,
        control_socket=control_socket,
        serial_socket=args.serial_socket,
        forwards=forwards,
        machine_type=args.machine_type,
        incoming_port=args.incoming_port,
        migration_socket=args.migration_socket,
        migration_port=args.migration_port,
    )


# Beside the QMP socket (a pod's own directory, kept across its container's restarts): this
# runner has started QEMU in incoming mode once already.
INCOMING_MARKER = "incoming-started"


def _incoming_once(spec: VmSpec) -> VmSpec:
    """A migration target waits for the source's state only the first time its container
    starts. The pod's flags stay those of a target after the move (a pod's spec is fixed), so a
    runner restarted there (QEMU exited: the guest powered off, or QEMU died) would wait for a
    migration that never comes, and the VM would never run again; it boots the guest instead,
    as the VM's first pod would. (A restart during the move fails the move either way: the
    driver aborts it and deletes the target.)"""
    if spec.incoming_port is None:
        return spec
    marker = Path(spec.qmp_socket).parent / INCOMING_MARKER
    if marker.exists():
        log.warning("incoming_already_started_booting", marker=str(marker))
        return dataclasses.replace(spec, incoming_port=None)
    marker.touch()
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    is_kvm_usable = os.access(KVM_DEVICE, os.R_OK | os.W_OK)
    # The runner's private QMP socket: never in the shared directory, where the agent might
    # mistake it for the VM's (see cmdline.build_qemu_command).
    with tempfile.TemporaryDirectory(prefix="vm-runner-") as private_dir:
        try:
            spec = spec_from_args(
                args,
                is_kvm_usable=is_kvm_usable,
                control_socket=str(Path(private_dir) / "control.sock"),
            )
        except ValueError as e:
            parser.error(str(e))  # exits 2
        for path in (spec.qmp_socket, spec.qga_socket, spec.serial_socket, spec.migration_socket):
            if path is not None:
                # QEMU creates the socket (replacing a stale one) but not its directory.
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        spec = _incoming_once(spec)
        log.info(
            "vm_runner_configured",
            accel_requested=args.accel,
            accel=spec.accel.value,
            is_kvm_usable=is_kvm_usable,
            is_kvm_boot_known=args.kvm_boots,
            vcpu_mode=spec.vcpu_mode.value,
            qga_socket=spec.qga_socket,
            machine_type=spec.machine_type,
            incoming_port=spec.incoming_port,
        )
        return asyncio.run(
            supervisor.run(
                spec,
                grace_seconds=args.grace_seconds,
                quit_timeout_seconds=args.quit_timeout_seconds,
            )
        )
