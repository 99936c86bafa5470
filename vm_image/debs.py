"""Fetching guest parts from the Debian archive: resolve versions, download once, extract.

Shell: runs ``apt-cache``, ``apt-get download`` and ``dpkg-deb``. Packages are never installed on
the build machine; they are unpacked into a scratch tree and we pick files out of it.

Downloads are cached by exact ``name_version_arch.deb`` file name, so a second build with the same
versions touches the network only to resolve versions (``apt-cache`` reads local lists).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

_ARCHES = ("amd64", "all")  # the guest's architecture, and architecture-independent data


class AptError(RuntimeError):
    """apt could not resolve or fetch a package; rerunning after ``apt-get update`` may help."""


@dataclass(frozen=True, kw_only=True)
class Package:
    name: str
    version: str

    def pin(self) -> str:
        return f"{self.name}={self.version}"


def _run(args: list[str], *, cwd: Path | None = None) -> str:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AptError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _candidates(names: list[str]) -> dict[str, str | None]:
    # One apt-cache call for all names: each call re-reads the package lists (~0.5 s).
    out = _run(["apt-cache", "policy", *names])
    found = dict(re.findall(r"^(\S+):\n\s+Installed:.*\n\s+Candidate:\s*(\S+)", out, re.MULTILINE))
    return {n: found[n] if found.get(n, "(none)") != "(none)" else None for n in names}


def resolve(names: list[str]) -> list[Package]:
    """Candidate versions for ``names``; refreshes the package lists once if any is unknown.

    A fresh machine (or container) has empty lists, hence the single ``apt-get update``.
    """
    versions = _candidates(names)
    if any(v is None for v in versions.values()):
        _run(["apt-get", "update", "-qq"])
        versions = _candidates(names)
    missing = sorted(name for name, v in versions.items() if v is None)
    if missing:
        raise AptError(f"no installable candidate for {missing}")
    return [Package(name=name, version=str(versions[name])) for name in names]


def depends(package: Package) -> list[str]:
    """The plain package names in ``Depends`` (used to follow a kernel meta-package)."""
    out = _run(["apt-cache", "show", "--no-all-versions", package.pin()])
    match = re.search(r"^Depends:\s*(.+)$", out, re.MULTILINE)
    if match is None:
        return []
    return [part.split()[0] for part in match.group(1).split(",")]


def deb_filenames(package: Package) -> list[str]:
    """The names ``apt-get download`` may give the package, one per architecture it may have."""
    # apt-get download writes an epoch's colon as "%3a"; match it so the cache hits.
    version = package.version.replace(":", "%3a")
    return [f"{package.name}_{version}_{arch}.deb" for arch in _ARCHES]


def fetch(package: Package, cache_dir: Path) -> Path:
    """The cached .deb for ``package``, downloading it first if needed."""
    cache_dir.mkdir(parents=True, exist_ok=True)

    def cached() -> Path | None:
        return next((p for n in deb_filenames(package) if (p := cache_dir / n).exists()), None)

    path = cached()
    if path is None:
        _run(["apt-get", "download", "-q", package.pin()], cwd=cache_dir)
        path = cached()
        if path is None:
            found = sorted(p.name for p in cache_dir.glob(f"{package.name}_*.deb"))
            raise AptError(f"apt-get download of {package.pin()} left {found}, not one of"
                           f" {deb_filenames(package)}")  # fmt: skip
    return path


def extract(deb: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    _run(["dpkg-deb", "-x", str(deb), str(dest)])
