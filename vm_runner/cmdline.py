"""Pure: turns a ``VmSpec`` into the exact QEMU argv. No I/O, no environment, no clock.

Every QEMU flag the project relies on is chosen here, with the reason next to it, so the unit
tests can pin the command line without starting QEMU.

The specs are frozen dataclasses rather than ``msgspec.Struct`` (the house default): they never
cross a wire, and the runner's container then needs only Debian's ``python3-structlog``
(bookworm has no ``python3-msgspec``), so no pip in the VM pod image.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

MIB = 1024 * 1024
_MEMORY_UNITS = {"": 1, "Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB}

# Kernel arguments every guest gets. console=ttyS0: the serial port is the only console (no VGA).
# panic=-1: reboot at once on a kernel panic, which -no-reboot turns into QEMU exiting, so the pod
# restarts instead of hanging. quiet: under TCG every console byte is emulated UART work.
BASE_KERNEL_ARGS = ("console=ttyS0", "panic=-1", "quiet")
DISK_KERNEL_ARGS = ("root=/dev/vda", "rw")
# With hot-pluggable memory (max_memory_bytes above memory_bytes): the kernel onlines no memory
# block itself; the guest's memory-onliner (vm_image/guest/memory-onliner) does, choosing each
# block's zone when it comes online. ZONE_MOVABLE can be unplugged again, because the kernel
# never puts its own unmovable allocations there, but holds no kernel data (slab, page tables,
# the memmap of the hot-plugged memory itself); a kernel zone holds them and may be pinned by
# them. The kernel's own policies choose by amount, not by need, and each failed one workload
# when measured on the minimal guest under TCG with the real agent
# (scripts/bench_memory_online.py; the figures are in its output): with every block movable
# (online_movable, or auto-movable at its default ratio of 301%) a guest filling its kernel
# memory (many files in a tmpfs) stalled and OOM-killed while the plugged memory sat free;
# auto-movable at 100% keeps the first boot-sized part of what is plugged movable, so a 512 MiB
# guest creating 600,000 files was OOM-killed before any kernel-zone memory came; every block
# normal (online_kernel) survives that, but nothing then keeps the kernel's allocations out of
# any block, and shrinks give back what happens to be free. The onliner gives a block to a
# kernel zone when unreclaimable kernel memory is growing at that moment or already fills half
# of the kernel zones, or when the kernel zones are nearly out of memory reclaim could free,
# and to ZONE_MOVABLE otherwise: kernel growth gets kernel memory at once, anonymous and
# page-cache growth stay unpluggable.
# Linux's Documentation/admin-guide/mm/memory-hotplug.rst describes the zones and the states a
# block can be onlined to.
MEMORY_HOTPLUG_KERNEL_ARGS = ("memhp_default_state=offline",)
# virtio-mem's block size: the unit in which memory is plugged and unplugged. 2 MiB (QEMU's
# default on x86, the THP size) rather than 128 MiB (a whole Linux memory block): the guest then
# unplugs in 2 MiB pieces, so a shrink succeeds as far as there are free 2 MiB ranges, instead
# of needing a whole free 128 MiB block (which a few pinned pages anywhere in it prevent). The
# cost, a bitmap of sub-blocks in the guest driver, is negligible. Every size the agent asks
# for (``memory-unit`` steps from ``min-memory``) must be a multiple of it.
DEFAULT_MEMORY_BLOCK_BYTES = 2 * MIB
# The virtio-mem device's QOM id; the agent finds the device through query-memory-devices, so
# it does not depend on this name, but the runner's own logs and tests do.
VIRTIO_MEM_ID = "vmem0"
# The virtio-serial port name qemu-guest-agent looks for (its default path is
# /dev/virtio-ports/<this>; libvirt uses the same name).
QGA_PORT_NAME = "org.qemu.guest_agent.0"
QGA_SOCKET_SUFFIX = ".qga.sock"
# The versioned machine type rather than the ``q35`` alias: a live migration's target must run
# the very machine type of its source (QEMU refuses another), and the alias names whatever the
# installed QEMU's newest is, so two nodes with different QEMU builds would disagree. 7.2 is
# Debian bookworm's QEMU; a newer QEMU still offers pc-q35-7.2.
DEFAULT_MACHINE_TYPE = "pc-q35-7.2"
# With hot-pluggable memory: the virtio-serial port on which the guest's memory-watch says "my
# workload crossed memory.high" (vm_image/guest/memory-watch), one line per crossing, and the
# suffix of its host end, a unix socket beside the QMP socket that the agent reads (the agent's
# ``autoscaler_agent.hypervisor.factory.memory_signal_socket_beside`` derives the same name).
MEMORY_SIGNAL_PORT_NAME = "org.vm-autoscaling.memory.0"
MEMORY_SIGNAL_SOCKET_SUFFIX = ".memory.sock"


class VcpuMode(enum.Enum):
    """How the VM's vCPU count changes while it runs (``vm_runner/README.md`` says why
    ``ONLINE`` is the default).

    ``ONLINE``: QEMU creates all ``max_vcpus`` at boot; the kernel brings up ``min_vcpus``
    (``maxcpus=MIN``) and the rest stay offline until the host asks the guest, through
    qemu-guest-agent on a virtio-serial port, to online or offline them. QEMU's CPU objects
    never change, so any number of grow/shrink cycles is safe.
    ``HOTPLUG``: QEMU boots ``min_vcpus``; the agent plugs and unplugs the others with QMP
    ``device_add``/``device_del``. On QEMU 7.2 under TCG, plugging again after any unplug
    kills QEMU (SIGSEGV or "corrupted double-linked list").
    """

    ONLINE = "online"
    HOTPLUG = "hotplug"


def qga_socket_beside(qmp_socket: str) -> str:
    """The QGA socket's default path: the QMP socket's, with ``.sock`` turned into
    ``.qga.sock`` (``/run/vm/qmp.sock`` -> ``/run/vm/qmp.qga.sock``), or ``.qga.sock`` appended.

    The agent's ``qmp+qga://`` URL derives the same name
    (``autoscaler_agent.hypervisor.factory``), so an annotation names only the QMP socket.
    """
    return qmp_socket.removesuffix(".sock") + QGA_SOCKET_SUFFIX


def memory_signal_socket_beside(qmp_socket: str) -> str:
    """``/run/vm/qmp.sock`` -> ``/run/vm/qmp.memory.sock``: the host end of the guest's
    memory-pressure port (``MEMORY_SIGNAL_PORT_NAME``), always beside the QMP socket."""
    return qmp_socket.removesuffix(".sock") + MEMORY_SIGNAL_SOCKET_SUFFIX


class Accel(enum.Enum):
    """Requested accelerator. ``AUTO`` is resolved by ``resolve_accel`` before building argv."""

    AUTO = "auto"
    KVM = "kvm"
    TCG = "tcg"


@dataclass(frozen=True, kw_only=True)
class Forward:
    """A user-net host forward: ``address:host_port`` on the host to ``guest_port`` in the guest."""

    address: str
    host_port: int
    guest_port: int


@dataclass(frozen=True, kw_only=True)
class VmSpec:
    """Everything that shapes the QEMU command line.

    Invariants (checked in ``__post_init__``): ``1 <= min_vcpus <= max_vcpus``; memory is a
    whole number of MiB (QEMU's ``-m`` unit); ``accel`` is already resolved (never ``AUTO``);
    ``qga_socket`` is set in ``VcpuMode.ONLINE``.
    """

    qemu_binary: str = "qemu-system-x86_64"
    kernel: str
    initrd: str | None = None
    disk: str | None = None
    kernel_args: tuple[str, ...] = ()
    min_vcpus: int
    max_vcpus: int
    memory_bytes: int
    # Most memory the VM may grow to; None (or == memory_bytes): no memory hot-plug device.
    max_memory_bytes: int | None = None
    memory_block_bytes: int = DEFAULT_MEMORY_BLOCK_BYTES
    accel: Accel
    qmp_socket: str
    control_socket: str
    serial_socket: str | None = None
    forwards: tuple[Forward, ...] = ()
    vcpu_mode: VcpuMode = VcpuMode.ONLINE
    # The host end of the guest agent's port; required in ONLINE mode, unused in HOTPLUG.
    qga_socket: str | None = None
    machine_type: str = DEFAULT_MACHINE_TYPE
    # A third QMP monitor, for whoever drives a live migration (vm_runner.migrate): the agent
    # holds the VM's QMP socket open, and a QMP socket serves one client at a time.
    migration_socket: str | None = None
    # A migration target: QEMU starts paused, listening on this TCP port (all addresses) for
    # the source's state (``-incoming tcp:0:PORT``); None: boot the guest. Everything else must
    # be the source's spec unchanged: QEMU checks the device set, and virtio-mem's plugged
    # state travels with the migration (the target's ``requested-size=0`` is fine).
    incoming_port: int | None = None
    # A QMP monitor on TCP (all addresses) for a driver in another pod; None: none.
    migration_port: int | None = None

    def __post_init__(self) -> None:
        if self.vcpu_mode is VcpuMode.ONLINE and self.qga_socket is None:
            raise ValueError("vcpu mode online needs a QGA socket (qga_socket)")
        if not 1 <= self.min_vcpus <= self.max_vcpus:
            raise ValueError(
                f"need 1 <= min_vcpus <= max_vcpus, got {self.min_vcpus} and {self.max_vcpus}"
            )
        if self.memory_bytes <= 0 or self.memory_bytes % MIB:
            raise ValueError(
                f"memory must be a positive whole number of MiB, got {self.memory_bytes}"
            )
        block = self.memory_block_bytes
        if block < MIB or block & (block - 1):
            raise ValueError(f"memory block size must be a power of two >= 1Mi, got {block}")
        if self.max_memory_bytes is not None:
            if self.max_memory_bytes < self.memory_bytes:
                raise ValueError(
                    f"max memory ({self.max_memory_bytes}) must be >= memory ({self.memory_bytes})"
                )
            if (self.max_memory_bytes - self.memory_bytes) % block:
                raise ValueError(
                    f"max memory minus memory ({self.max_memory_bytes - self.memory_bytes}) must"
                    f" be a whole number of memory blocks ({block // MIB}Mi)"
                )
        if self.accel is Accel.AUTO:
            raise ValueError("accel must be resolved (resolve_accel) before building a VmSpec")
        for name, port in (("incoming", self.incoming_port), ("migration", self.migration_port)):
            if port is not None and not 1 <= port <= 65535:
                raise ValueError(f"{name} port {port} is outside 1..65535")
        if self.migration_port is not None and self.migration_port == self.incoming_port:
            raise ValueError(f"migration port and incoming port are both {self.migration_port}")


def parse_memory(text: str) -> int:
    """Bytes from a Kubernetes-style binary quantity: ``512Mi``, ``1Gi``, ``65536Ki`` or bytes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", text.strip())
    if match is None:
        raise ValueError(f"memory {text!r}: expected a number with an optional Ki, Mi or Gi suffix")
    return int(match.group(1)) * _MEMORY_UNITS[match.group(2) or ""]


def parse_forward(text: str, *, default_address: str) -> Forward:
    """``[ADDRESS:]HOSTPORT:GUESTPORT`` to a ``Forward``."""
    parts = text.rsplit(":", 2)
    if len(parts) == 2:
        parts = [default_address, *parts]
    if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
        raise ValueError(f"forward {text!r}: expected [ADDRESS:]HOSTPORT:GUESTPORT")
    address, host_port, guest_port = parts[0], int(parts[1]), int(parts[2])
    for port in (host_port, guest_port):
        if not 1 <= port <= 65535:
            raise ValueError(f"forward {text!r}: port {port} is outside 1..65535")
    return Forward(address=address, host_port=host_port, guest_port=guest_port)


def resolve_accel(requested: Accel, *, is_kvm_usable: bool, is_kvm_boot_known: bool) -> Accel:
    """The accelerator to use; ``AUTO`` means TCG unless KVM is *known* to boot guests here.

    Why not "KVM whenever /dev/kvm opens": on this project's CI machines (nested virtualisation)
    /dev/kvm opens and a paused QEMU runs, yet a guest kernel hangs silently right after "Probing
    EDD" (shared/reference/qemu-guest.md). A hang is worse than slowness, so KVM is opt-in: the
    operator states that it boots (``--kvm-boots`` / ``VM_RUNNER_KVM_BOOTS=1``).
    """
    if requested is Accel.KVM and not is_kvm_usable:
        raise ValueError("--accel kvm requested but /dev/kvm is not usable (missing or no access)")
    if requested is not Accel.AUTO:
        return requested
    return Accel.KVM if is_kvm_usable and is_kvm_boot_known else Accel.TCG


def _escape(value: str) -> str:
    # QEMU option values are comma-separated; a literal comma in a path is written ",,".
    return value.replace(",", ",,")


def _socket_chardev(chardev_id: str, path: str) -> str:
    # server=on: QEMU creates the socket; wait=off: boot does not wait for a client to connect.
    return f"socket,id={chardev_id},path={_escape(path)},server=on,wait=off"


def has_memory_hotplug(spec: VmSpec) -> bool:
    return spec.max_memory_bytes is not None and spec.max_memory_bytes > spec.memory_bytes


def _memory_option(spec: VmSpec) -> str:
    boot = f"{spec.memory_bytes // MIB}M"
    if not has_memory_hotplug(spec):
        return boot
    # maxmem reserves the guest-physical room the virtio-mem device lives in. No DIMM slots:
    # virtio-mem needs none (QEMU 7.2 accepts maxmem without slots).
    assert spec.max_memory_bytes is not None
    return f"{boot},maxmem={spec.max_memory_bytes // MIB}M"


def _virtio_mem_options(spec: VmSpec) -> list[str]:
    """A RAM backend of (max - boot) memory and the virtio-mem device on it, plugged at 0.

    The backend is an anonymous mapping that QEMU does not preallocate: the host only gives the
    VM the pages the guest touches, and virtio-mem discards the pages of every block the guest
    unplugs, so a shrink returns memory to the host too. ``requested-size=0``: the VM starts at
    its minimum; the autoscaler agent raises it over QMP (``qom-set``).
    """
    assert spec.max_memory_bytes is not None
    size = (spec.max_memory_bytes - spec.memory_bytes) // MIB
    block = spec.memory_block_bytes // MIB
    return [
        "-object",
        f"memory-backend-ram,id={VIRTIO_MEM_ID}-ram,size={size}M",
        "-device",
        f"virtio-mem-pci,id={VIRTIO_MEM_ID},memdev={VIRTIO_MEM_ID}-ram,"
        f"block-size={block}M,requested-size=0",
    ]


def _smp_option(spec: VmSpec) -> str:
    if spec.vcpu_mode is VcpuMode.ONLINE:
        # Every vCPU exists from boot (the kernel's maxcpus= keeps all but min_vcpus offline),
        # and maxcpus equal to it leaves no hot-plug slot: nothing can device_add a vCPU.
        return f"{spec.max_vcpus},maxcpus={spec.max_vcpus}"
    # Boot with min_vcpus; the rest are empty hot-plug slots for QMP device_add.
    return f"{spec.min_vcpus},maxcpus={spec.max_vcpus}"


def _serial_port_options(spec: VmSpec) -> list[str]:
    """A virtio-serial controller and its ports, each with a unix socket as its host end that
    the agent connects to (QEMU listens): in ``VcpuMode.ONLINE`` one named as qemu-guest-agent
    expects (the guest's qemu-ga answers on it); with memory hot-plug the guest's
    memory-pressure port (its memory-watch writes on it). Nothing without either."""
    ports = []
    if spec.vcpu_mode is VcpuMode.ONLINE:
        assert spec.qga_socket is not None
        ports.append(("qga0", spec.qga_socket, QGA_PORT_NAME))
    if has_memory_hotplug(spec):
        path = memory_signal_socket_beside(spec.qmp_socket)
        ports.append(("memsig0", path, MEMORY_SIGNAL_PORT_NAME))
    if not ports:
        return []
    argv = ["-device", "virtio-serial-pci,id=vser0"]
    for chardev_id, path, name in ports:
        argv += ["-chardev", _socket_chardev(chardev_id, path)]
        argv += ["-device", f"virtserialport,bus=vser0.0,chardev={chardev_id},name={name}"]
    return argv


def build_qemu_command(spec: VmSpec) -> list[str]:
    """The full argv (binary first) that runs ``spec``."""
    argv = [
        spec.qemu_binary,
        # No default devices (VGA, default NIC, parallel port...) and no host config file: the
        # command line alone describes the machine, so it is reproducible and testable.
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        # q35 has ACPI CPU hot-plug, which is how vCPUs are added and removed live.
        "-machine",
        f"{spec.machine_type},accel={spec.accel.value}",
        "-smp",
        _smp_option(spec),
        "-m",
        _memory_option(spec),
        "-kernel",
        spec.kernel,
    ]
    if spec.initrd is not None:
        argv += ["-initrd", spec.initrd]
    hotplug = has_memory_hotplug(spec)
    kernel_args = [
        *BASE_KERNEL_ARGS,
        *(DISK_KERNEL_ARGS if spec.disk else ()),
        *(MEMORY_HOTPLUG_KERNEL_ARGS if hotplug else ()),
        # Online mode: the kernel brings up only min_vcpus of the max_vcpus QEMU created; the
        # guest's cpu-onliner sees maxcpus= and leaves the rest to the host (qemu-ga).
        *((f"maxcpus={spec.min_vcpus}",) if spec.vcpu_mode is VcpuMode.ONLINE else ()),
        *spec.kernel_args,
    ]
    argv += ["-append", " ".join(kernel_args)]
    if hotplug:
        argv += _virtio_mem_options(spec)
    if spec.disk is not None:
        argv += ["-drive", f"file={_escape(spec.disk)},if=virtio,format=raw,cache=none,aio=threads"]
    hostfwd = "".join(
        f",hostfwd=tcp:{f.address}:{f.host_port}-:{f.guest_port}" for f in spec.forwards
    )
    # User networking needs no privileges or host bridge; the guest is 10.0.2.15 behind QEMU's NAT.
    argv += ["-netdev", f"user,id=net0{hostfwd}", "-device", "virtio-net-pci,netdev=net0"]
    # Two QMP monitors: a QMP socket serves one client at a time, and the autoscaler agent may hold
    # the shared one open for as long as it likes. The runner's own (private) one is for shutdown.
    monitors = [("qmp", spec.qmp_socket), ("control", spec.control_socket)]
    if spec.migration_socket is not None:
        monitors.append(("migration", spec.migration_socket))
    for chardev_id, path in monitors:
        argv += ["-chardev", _socket_chardev(chardev_id, path)]
        argv += ["-mon", f"chardev={chardev_id},mode=control"]
    if spec.migration_port is not None:
        tcp = f"socket,id=migration-tcp,host=0.0.0.0,port={spec.migration_port},server=on,wait=off"
        argv += ["-chardev", tcp, "-mon", "chardev=migration-tcp,mode=control"]
    argv += _serial_port_options(spec)
    if spec.serial_socket is not None:
        argv += ["-chardev", _socket_chardev("serial0", spec.serial_socket)]
    else:
        # signal=off: a ^C on the runner's terminal must reach the runner (clean powerdown), not
        # kill QEMU through its stdio.
        argv += ["-chardev", "stdio,id=serial0,signal=off"]
    argv += ["-serial", "chardev:serial0"]
    # A guest reboot or panic ends QEMU, the runner and the pod: restarting is Kubernetes' job.
    argv += ["-no-reboot"]
    if spec.incoming_port is not None:
        # The guest does not boot: QEMU waits for a source to send its state, then runs it.
        argv += ["-incoming", f"tcp:0:{spec.incoming_port}"]
    return argv
