"""The ``full`` variant: a Debian root with PostgreSQL (pgbench initialised) as a raw disk image.

Shell, root only: ``debootstrap`` into a scratch directory, finish it in a chroot with
``guest/full-setup.sh``, then ``mkfs.ext4 -d`` turns the directory into a disk image without
loop mounts. Outputs in ``<out>/full/``: ``disk.img``, ``vmlinuz``, ``initrd.img`` (the kernel
and initramfs-tools initrd from inside the root, so the runner can boot with ``-kernel``) and
``manifest.txt`` (every installed package and version).

Unlike ``minimal`` this is *not* byte-reproducible: dpkg, initramfs-tools and PostgreSQL's
``initdb`` write timestamps and random identifiers. Too slow for CI; see ``vm_image/README.md``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from vm_image import debs, manifest

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SOURCES = (
    (MIRROR, SUITE),
    (MIRROR, f"{SUITE}-updates"),
    ("http://deb.debian.org/debian-security", f"{SUITE}-security"),
)
DISK_SIZE = "3G"
HOST_TOOLS = {"debootstrap": "debootstrap", "mkfs.ext4": "e2fsprogs"}
# A fixed file-system UUID so a rebuilt disk still matches anything that recorded the old one.
ROOT_UUID = "6b1a3f8e-3c59-4e4b-9a51-0d7a0e2f5a10"
_GUEST_DIR = Path(__file__).parent / "guest"


def _run(args: list[str]) -> str:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise debs.AptError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result.stdout


def _install_host_tools() -> None:
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None})
    if missing:
        _run(["apt-get", "update", "-qq"])
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing])


def _mount_pseudo_filesystems(root: Path) -> list[Path]:
    # PostgreSQL's initdb and the kernel's postinst need /proc, /sys and /dev in the chroot.
    mounted = []
    for source, fstype, target in (("proc", "proc", "proc"), ("sysfs", "sysfs", "sys")):
        _run(["mount", "-t", fstype, source, str(root / target)])
        mounted.append(root / target)
    _run(["mount", "--bind", "/dev", str(root / "dev")])
    mounted.append(root / "dev")
    return mounted


def build(*, out_root: Path, cache_dir: Path, source_date_epoch: int) -> Path:
    """Build the full image from scratch (always; it is not cached); returns the directory."""
    _install_host_tools()
    out_dir = out_root / "full"
    root = out_root / ".work-full"
    shutil.rmtree(root, ignore_errors=True)
    archives = cache_dir / "debootstrap"
    archives.mkdir(parents=True, exist_ok=True)
    _run([
        "debootstrap", "--variant=minbase", f"--cache-dir={archives.resolve()}",
        SUITE, str(root), MIRROR,
    ])  # fmt: skip
    # debootstrap configures only the release suite; add the security and updates suites so the
    # kernel and packages match what the minimal image (built from the host's lists) gets.
    (root / "etc/apt/sources.list").write_text(
        "".join(f"deb {mirror} {suite} main\n" for mirror, suite in SOURCES)
    )
    for name in ("cpu-onliner", "memory-onliner"):
        onliner = root / "usr/local/sbin" / name
        shutil.copy(_GUEST_DIR / name, onliner)
        onliner.chmod(0o755)  # do not depend on the checkout's file modes
        shutil.copy(_GUEST_DIR / f"{name}.service", root / "etc/systemd/system/")
    (root / "etc/systemd/network").mkdir(parents=True, exist_ok=True)
    shutil.copy(_GUEST_DIR / "10-eth.network", root / "etc/systemd/network/")
    shutil.copy(_GUEST_DIR / "full-setup.sh", root / "full-setup.sh")
    mounted = _mount_pseudo_filesystems(root)
    try:
        _run(["chroot", str(root), "apt-get", "update", "-qq"])
        _run(["chroot", str(root), "sh", "/full-setup.sh"])
        packages = _run(["chroot", str(root), "dpkg-query", "-W", "-f", "${Package}=${Version}\n"])
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "-l", str(path)], check=False)
    (root / "full-setup.sh").unlink()

    out_dir.mkdir(parents=True, exist_ok=True)
    (kernel,) = sorted((root / "boot").glob("vmlinuz-*"))
    (initrd,) = sorted((root / "boot").glob("initrd.img-*"))
    shutil.copyfile(kernel, out_dir / "vmlinuz")
    shutil.copyfile(initrd, out_dir / "initrd.img")
    disk = out_dir / "disk.img"
    disk.unlink(missing_ok=True)
    _run([
        "mkfs.ext4", "-q", "-L", "root", "-U", ROOT_UUID, "-E", "root_owner=0:0",
        "-d", str(root), str(disk), DISK_SIZE,
    ])  # fmt: skip
    inputs = (
        "variant full",
        f"recipe {manifest.recipe_digest(Path(__file__).parent)}",
        f"source_date_epoch {source_date_epoch}",
        *(f"package {line}" for line in sorted(packages.splitlines()) if line),
    )
    manifest.write(out_dir, inputs, ["disk.img", "initrd.img", "vmlinuz"])
    shutil.rmtree(root)
    return out_dir
