"""The ``minimal`` variant: a Debian cloud kernel plus a busybox initramfs running node_exporter.

Shell: downloads and unpacks packages (``debs``), then assembles the archive with the pure
``cpio`` writer. Outputs in ``<out>/minimal/``: ``vmlinuz``, ``initramfs.cpio.gz``,
``manifest.txt``. What the guest does at boot is in ``vm_image/guest/`` (init, inittab,
rc.sysinit, cpu-onliner, memory-onliner, memory-watch, power-button).
"""

from __future__ import annotations

import fcntl
import gzip
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vm_image import cpio, debs, manifest
from vm_image.elf import read_dynamic_info

KERNEL_META_PACKAGE = "linux-image-cloud-amd64"
GUEST_PACKAGES = ("busybox-static", "prometheus-node-exporter", "libc6")
# qemu-guest-agent (the host sets the number of online vCPUs with its guest-set-vcpus, over a
# virtio-serial port) and the libraries its ELF headers name, transitively, by Debian package.
# The build fails with the missing soname if a Debian update adds one (``_Tree.find_library``).
QGA_PACKAGES = (
    "qemu-guest-agent", "libglib2.0-0", "libnuma1", "libudev1", "liburing2", "libffi8",
    "libmount1", "libblkid1", "libselinux1", "libpcre2-8-0", "zlib1g",
)  # fmt: skip

# Dependency order: each module's dependencies come before it (insmod does not resolve them).
# button and evdev make the ACPI power button visible to acpid, for a clean system_powerdown.
MODULES = (
    "kernel/drivers/virtio/virtio_ring.ko",
    "kernel/drivers/virtio/virtio.ko",
    "kernel/drivers/virtio/virtio_pci_legacy_dev.ko",
    "kernel/drivers/virtio/virtio_pci_modern_dev.ko",
    "kernel/drivers/virtio/virtio_pci.ko",
    # virtio-mem (memory hot-plug in small blocks): depends on virtio and virtio_ring only
    # (``depends=`` in its modinfo; the Debian package ships no modules.dep).
    "kernel/drivers/virtio/virtio_mem.ko",
    # virtio-serial ports (/dev/vportNpM), the channel qemu-ga talks to the host on.
    "kernel/drivers/char/virtio_console.ko",
    "kernel/net/core/failover.ko",
    "kernel/drivers/net/net_failover.ko",
    "kernel/drivers/net/virtio_net.ko",
    # virtio-blk (depends on virtio and virtio_ring only): an optional data disk (vm_runner
    # --disk), whose reads fill the guest's page cache: the memory benchmark's page-cache
    # workload (scripts/bench_memory_online.py). The minimal guest's root stays the initramfs.
    "kernel/drivers/block/virtio_blk.ko",
    "kernel/drivers/acpi/button.ko",
    "kernel/drivers/input/evdev.ko",
)

_GUEST_DIR = Path(__file__).parent / "guest"
_LIB_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu")
_DIRS = (
    "bin", "dev", "etc", "etc/acpi", "etc/acpi/PWRF", "lib", "lib/modules", "lib64", "proc",
    "root", "run", "sbin", "sys", "tmp", "usr", "usr/bin", "usr/sbin", "var", "var/log",
)  # fmt: skip
_GUEST_FILES = {  # guest/<name> -> (path in the image, permissions)
    "init": ("init", 0o755),
    "inittab": ("etc/inittab", 0o644),
    "rc.sysinit": ("etc/rc.sysinit", 0o755),
    "cpu-onliner": ("usr/sbin/cpu-onliner", 0o755),
    "memory-onliner": ("usr/sbin/memory-onliner", 0o755),
    "memory-watch": ("usr/sbin/memory-watch", 0o755),
    "workload-shell": ("usr/sbin/workload-shell", 0o755),
    "qga-start": ("usr/sbin/qga-start", 0o755),
    "power-button": ("etc/acpi/PWRF/00000080", 0o755),
}


class _Tree:
    """Collects archive entries from unpacked packages, following symlinks inside the tree."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.entries: dict[str, cpio.Entry] = {}

    def add(self, entry: cpio.Entry) -> None:
        """Add ``entry`` and its parent directories; an entry already at that path stays."""
        self.entries.setdefault(entry.path, entry)
        parent = Path(entry.path).parent
        while parent != Path():
            self.entries.setdefault(parent.as_posix(), cpio.directory(parent.as_posix()))
            parent = parent.parent

    def replace(self, entry: cpio.Entry) -> None:
        """Put ``entry`` at its path even if the base image already has one there."""
        self.entries.pop(entry.path, None)
        self.add(entry)

    def copy(self, src: str, dest: str | None = None) -> None:
        """Add ``src`` (relative to the unpacked tree) at ``dest``; symlinks bring their target."""
        path = self.root / src
        dest = dest or src
        if path.is_symlink():
            self.add(cpio.symlink(dest, str(path.readlink())))
            self.copy(self._link_target(src))
            return
        perms = stat.S_IMODE(path.stat().st_mode)
        self.add(cpio.regular(dest, path.read_bytes(), perms))

    def _link_target(self, src: str) -> str:
        # Absolute targets point into the guest's root, never the host's: resolve them by hand.
        target = (self.root / src).readlink()
        absolute = target if target.is_absolute() else Path("/", src).parent / target
        return os.path.normpath(absolute).lstrip("/")

    def real_path(self, src: str) -> str:
        while (self.root / src).is_symlink():
            src = self._link_target(src)
        return src

    def find_library(self, name: str) -> str:
        for lib_dir in _LIB_DIRS:
            if (self.root / lib_dir / name).exists():
                return f"{lib_dir}/{name}"
        raise FileNotFoundError(f"shared library {name} is in none of {_LIB_DIRS}")

    def copy_with_libraries(self, src: str, dest: str) -> None:
        """Add an ELF binary and, transitively, its interpreter and DT_NEEDED libraries."""
        self.copy(src, dest)
        pending = [src]
        seen: set[str] = set()
        while pending:
            info = read_dynamic_info((self.root / self.real_path(pending.pop())).read_bytes())
            wanted = [self.find_library(n) for n in info.needed]
            if info.interpreter:
                wanted.append(info.interpreter.lstrip("/"))
            for lib in wanted:
                if lib not in seen:
                    seen.add(lib)
                    self.copy(lib)
                    pending.append(lib)


def _kernel_version(tree: Path) -> str:
    (version,) = [p.name for p in (tree / "lib/modules").iterdir()]
    return version


@dataclass(frozen=True, kw_only=True)
class Variant:
    """An initramfs image: the minimal guest's parts plus ``packages`` and what ``extend`` adds.

    ``extend`` runs on the finished base tree (unpacked packages at ``tree.root``), so a variant
    keeps the same kernel, modules and boot scripts as ``minimal`` and only adds to them.
    """

    name: str
    packages: tuple[str, ...] = ()
    extend: Callable[[_Tree], None] | None = None


MINIMAL = Variant(name="minimal")


def build(*, out_root: Path, cache_dir: Path, source_date_epoch: int) -> Path:
    """Build (or reuse) the minimal image; returns the output directory."""
    return build_variant(
        MINIMAL, out_root=out_root, cache_dir=cache_dir, source_date_epoch=source_date_epoch
    )


def build_variant(
    variant: Variant, *, out_root: Path, cache_dir: Path, source_date_epoch: int
) -> Path:
    """Build (or reuse) an initramfs variant in ``out_root/<name>``; returns that directory.

    One build at a time per ``out_root`` (an exclusive ``flock``): two processes asking for
    the same image, e.g. two test workers, would otherwise share one work directory, and the
    second finds it is current once the first is done."""
    out_root.mkdir(parents=True, exist_ok=True)
    with (out_root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_variant(
            variant, out_root=out_root, cache_dir=cache_dir, source_date_epoch=source_date_epoch
        )


def _build_variant(
    variant: Variant, *, out_root: Path, cache_dir: Path, source_date_epoch: int
) -> Path:
    out_dir = out_root / variant.name
    (meta,) = debs.resolve([KERNEL_META_PACKAGE])
    kernel_names = [d for d in debs.depends(meta) if d.startswith("linux-image-")]
    packages = debs.resolve([*kernel_names, *GUEST_PACKAGES, *QGA_PACKAGES, *variant.packages])
    inputs = (
        f"variant {variant.name}",
        f"recipe {manifest.recipe_digest(Path(__file__).parent)}",
        f"source_date_epoch {source_date_epoch}",
        *(f"package {p.pin()}" for p in sorted(packages, key=lambda p: p.name)),
    )
    if manifest.is_current(out_dir, inputs):
        return out_dir

    work = out_root / f".work-{variant.name}"
    shutil.rmtree(work, ignore_errors=True)
    for package in packages:
        debs.extract(debs.fetch(package, cache_dir), work)
    kernel = _kernel_version(work)

    tree = _Tree(work)
    for d in _DIRS:
        tree.add(cpio.directory(d))
    tree.add(cpio.directory("root", 0o700))
    tree.add(cpio.directory("tmp", 0o1777))
    # The kernel opens /dev/console for init's stdio before our devtmpfs mount exists.
    tree.add(cpio.char_device("dev/console", 5, 1))
    for name, (dest, perms) in _GUEST_FILES.items():
        tree.add(cpio.regular(dest, (_GUEST_DIR / name).read_bytes(), perms))
    order = "".join(f"{kernel}/{m}\n" for m in MODULES)
    tree.add(cpio.regular("etc/modules.order", order.encode()))
    tree.add(cpio.regular("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"))
    tree.add(cpio.regular("etc/group", b"root:x:0:\n"))
    tree.copy("bin/busybox")
    tree.copy_with_libraries("usr/bin/prometheus-node-exporter", "usr/bin/node_exporter")
    tree.copy_with_libraries("usr/sbin/qemu-ga", "usr/sbin/qemu-ga")
    for module in MODULES:
        tree.copy(f"lib/modules/{kernel}/{module}")
    if variant.extend is not None:
        variant.extend(tree)

    out_dir.mkdir(parents=True, exist_ok=True)
    archive = cpio.write_newc(list(tree.entries.values()), mtime=source_date_epoch)
    # mtime=0 and no file name in the gzip header: the equivalent of `gzip -n`.
    (out_dir / "initramfs.cpio.gz").write_bytes(gzip.compress(archive, compresslevel=6, mtime=0))
    shutil.copyfile(work / f"boot/vmlinuz-{kernel}", out_dir / "vmlinuz")
    manifest.write(out_dir, inputs, ["initramfs.cpio.gz", "vmlinuz"])
    shutil.rmtree(work)
    return out_dir
