"""Fixtures for the VM tests: the minimal guest image, built once per session and cached on disk.

The build itself caches (under ``testkit.local_stack.IMAGE_ROOT``, keyed by the manifest), so a
second session only resolves package versions and checks hashes: a few seconds.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.local_stack import IMAGE_ROOT
from tests.support import require_binary

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class MinimalImage:
    kernel: Path
    initrd: Path
    manifest: Path


def build_minimal(out: Path, cache: Path, variant: str = "minimal") -> Path:
    result = subprocess.run(
        [sys.executable, "-m", "vm_image", variant, "--out", str(out), "--cache", str(cache)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip())


@pytest.fixture(scope="session")
def minimal_image() -> MinimalImage:
    require_binary("apt-get")
    require_binary("dpkg-deb")
    out = build_minimal(IMAGE_ROOT, IMAGE_ROOT / "debs")
    return MinimalImage(
        kernel=out / "vmlinuz", initrd=out / "initramfs.cpio.gz", manifest=out / "manifest.txt"
    )


@pytest.fixture(scope="session")
def postgres_image() -> MinimalImage:
    """The postgres variant (minimal plus PostgreSQL 15); ~25 s to build, then cached."""
    require_binary("apt-get")
    require_binary("dpkg-deb")
    out = build_minimal(IMAGE_ROOT, IMAGE_ROOT / "debs", "postgres")
    return MinimalImage(
        kernel=out / "vmlinuz", initrd=out / "initramfs.cpio.gz", manifest=out / "manifest.txt"
    )
