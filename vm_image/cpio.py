"""A reproducible writer for the ``newc`` cpio format, the one the Linux kernel unpacks.

Pure: takes entries, returns bytes. We write the format ourselves rather than call ``cpio`` so
that nothing about the host leaks into the archive: entries are sorted by path, every mtime is
the same fixed value, owners are root, and inode numbers are assigned in order. The same entries
therefore always give the same bytes (``cpio --reproducible`` gets most of the way, but still
depends on the host's cpio version and on how it walks the directory).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass

_MAGIC = b"070701"
_TRAILER = "TRAILER!!!"


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One archive member. ``path`` has no leading slash; a symlink's ``data`` is its target."""

    path: str
    mode: int  # full st_mode: file type bits plus permissions
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)  # (major, minor), device nodes only


def directory(path: str, perms: int = 0o755) -> Entry:
    return Entry(path=path, mode=stat.S_IFDIR | perms)


def regular(path: str, data: bytes, perms: int = 0o644) -> Entry:
    return Entry(path=path, mode=stat.S_IFREG | perms, data=data)


def symlink(path: str, target: str) -> Entry:
    return Entry(path=path, mode=stat.S_IFLNK | 0o777, data=target.encode())


def char_device(path: str, major: int, minor: int, perms: int = 0o600) -> Entry:
    return Entry(path=path, mode=stat.S_IFCHR | perms, rdev=(major, minor))


def _pad4(n: int) -> bytes:
    return b"\0" * (-n % 4)


def _header(
    *, ino: int, mode: int, nlink: int, mtime: int, size: int, rdev: tuple[int, int], name: bytes
) -> bytes:
    # ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize check
    fields = (ino, mode, 0, 0, nlink, mtime, size, 0, 0, *rdev, len(name) + 1, 0)
    return _MAGIC + b"".join(b"%08X" % f for f in fields)


def write_newc(entries: list[Entry], *, mtime: int) -> bytes:
    """Serialise ``entries`` sorted by path, each with ``mtime``; duplicates are a bug upstream."""
    paths = [e.path for e in entries]
    if len(set(paths)) != len(paths):
        duplicates = sorted({p for p in paths if paths.count(p) > 1})
        raise ValueError(f"duplicate cpio paths: {duplicates}")
    out = bytearray()
    for ino, entry in enumerate(sorted(entries, key=lambda e: e.path), start=1):
        name = entry.path.encode()
        nlink = 2 if stat.S_ISDIR(entry.mode) else 1
        head = _header(
            ino=ino,
            mode=entry.mode,
            nlink=nlink,
            mtime=mtime,
            size=len(entry.data),
            rdev=entry.rdev,
            name=name,
        )
        out += head + name + b"\0"
        out += _pad4(len(head) + len(name) + 1)
        out += entry.data + _pad4(len(entry.data))
    name = _TRAILER.encode()
    head = _header(ino=0, mode=0, nlink=1, mtime=0, size=0, rdev=(0, 0), name=name)
    out += head + name + b"\0" + _pad4(len(head) + len(name) + 1)
    return bytes(out)
