"""The image builder: the pure pieces (cpio writer, ELF reader, manifest) and, slow, that the
minimal build is cached and byte-for-byte reproducible."""

from __future__ import annotations

import gzip
import stat
from pathlib import Path
from typing import Any

import pytest

from testkit.local_stack import IMAGE_ROOT
from tests.support import require_binary
from tests.vm.conftest import MinimalImage, build_minimal
from vm_image import cpio, manifest
from vm_image.elf import read_dynamic_info
from vm_image.minimal import MODULES
from vm_image.postgres import INITTAB_LINE, PG_MAJOR, PGBENCH_SCALE


def read_newc(data: bytes) -> list[dict[str, Any]]:
    """An independent newc reader, so the writer is not checked against itself."""
    entries: list[dict[str, Any]] = []
    pos = 0
    while True:
        assert data[pos : pos + 6] == b"070701"
        fields = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        ino, mode, uid, gid, nlink, mtime, size, _, _, rmaj, rmin, namesize, _ = fields
        name_start = pos + 110
        name = data[name_start : name_start + namesize - 1].decode()
        pos = name_start + namesize
        pos += -pos % 4
        body = data[pos : pos + size]
        pos += size
        pos += -pos % 4
        if name == "TRAILER!!!":
            assert pos == len(data)
            return entries
        entries.append(
            {"name": name, "ino": ino, "mode": mode, "uid": uid, "gid": gid, "nlink": nlink,
             "mtime": mtime, "data": body, "rdev": (rmaj, rmin)}
        )  # fmt: skip


def test_newc_entries_are_sorted_and_normalised():
    archive = cpio.write_newc(
        [
            cpio.regular("b/file", b"hello", 0o600),
            cpio.directory("b"),
            cpio.symlink("a", "b/file"),
            cpio.char_device("dev/console", 5, 1),
        ],
        mtime=1234,
    )
    entries = read_newc(archive)
    assert [e["name"] for e in entries] == ["a", "b", "b/file", "dev/console"]
    assert [e["ino"] for e in entries] == [1, 2, 3, 4]
    assert {(e["uid"], e["gid"], e["mtime"]) for e in entries} == {(0, 0, 1234)}
    by_name = {e["name"]: e for e in entries}
    assert by_name["b/file"]["data"] == b"hello"
    assert by_name["b/file"]["mode"] == stat.S_IFREG | 0o600
    assert by_name["a"]["data"] == b"b/file"
    assert stat.S_ISLNK(by_name["a"]["mode"])
    assert by_name["b"]["nlink"] == 2
    assert by_name["dev/console"]["rdev"] == (5, 1)


def test_newc_is_independent_of_input_order():
    entries = [cpio.regular(f"f{i}", bytes([i]) * i) for i in range(7)]
    assert cpio.write_newc(entries, mtime=0) == cpio.write_newc(entries[::-1], mtime=0)


def test_newc_rejects_duplicate_paths():
    with pytest.raises(ValueError, match="duplicate cpio paths: \\['x'\\]"):
        cpio.write_newc([cpio.regular("x", b"1"), cpio.regular("x", b"2")], mtime=0)


def test_elf_reader_finds_interpreter_and_needed_libraries():
    # /bin/sh (dash) is a dynamically linked amd64 binary on every Debian CI machine.
    info = read_dynamic_info(Path("/bin/sh").resolve().read_bytes())
    assert info.interpreter == "/lib64/ld-linux-x86-64.so.2"
    assert "libc.so.6" in info.needed


def test_elf_reader_rejects_other_files():
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        read_dynamic_info(b"#!/bin/sh\n")


def test_manifest_round_trips():
    original = manifest.Manifest(
        inputs=("variant minimal", "package libc6=2.36-9"),
        outputs=(("initramfs.cpio.gz", "ab" * 32), ("vmlinuz", "cd" * 32)),
    )
    assert manifest.parse(original.render()) == original


@pytest.mark.slow
def test_minimal_image_contents(minimal_image: MinimalImage):
    entries = read_newc(gzip.decompress(minimal_image.initrd.read_bytes()))
    names = [e["name"] for e in entries]
    assert names == sorted(names)
    assert {e["mtime"] for e in entries} == {0}
    by_name = {e["name"]: e for e in entries}
    for needed in ("init", "bin/busybox", "usr/bin/node_exporter", "usr/sbin/cpu-onliner",
                   "lib/x86_64-linux-gnu/libc.so.6", "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                   "etc/inittab", "etc/acpi/PWRF/00000080", "usr/sbin/qemu-ga",
                   "usr/sbin/qga-start"):  # fmt: skip
        assert needed in by_name
    # qemu-ga starts only if every library the loader looks for is in the image.
    pending, seen = ["usr/sbin/qemu-ga"], set()
    while pending:
        for lib in read_dynamic_info(by_name[pending.pop()]["data"]).needed:
            path = next(p for d in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu")
                        if (p := f"{d}/{lib}") in by_name)  # fmt: skip
            if path not in seen:
                seen.add(path)
                target = by_name[path]
                while stat.S_ISLNK(target["mode"]):
                    path = f"{path.rsplit('/', 1)[0]}/{target['data'].decode()}"
                    target = by_name[path]
                pending.append(path)
    assert "usr/lib/x86_64-linux-gnu/libglib-2.0.so.0" in seen
    assert b"/usr/sbin/qga-start" in by_name["etc/inittab"]["data"]
    assert by_name["lib64/ld-linux-x86-64.so.2"]["data"] == (
        b"/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    )
    order = by_name["etc/modules.order"]["data"].decode().split()
    assert [line.split("/", 1)[1] for line in order] == list(MODULES)
    assert all(line in by_name for line in (f"lib/modules/{m}" for m in order))
    text = minimal_image.manifest.read_text()
    for package in (
        "busybox-static=",
        "libc6=",
        "prometheus-node-exporter=",
        "linux-image-",
        "qemu-guest-agent=",
    ):
        assert f"package {package}" in text


@pytest.mark.slow
def test_minimal_build_is_cached_and_reproducible(minimal_image: MinimalImage, tmp_path):
    """A second build with the same versions gives the same bytes; an unchanged one is reused.

    The second build is the session's (``minimal_image``, built from the same versions, in
    this session or an earlier one): a build of its own here would cost one more for nothing
    (``test_postgres_build_is_reproducible`` does the same)."""
    require_binary("apt-get")
    debs = IMAGE_ROOT / "debs"  # shared with the session fixture: no new downloads
    first = build_minimal(tmp_path / "one", debs)
    first_mtime = (first / "initramfs.cpio.gz").stat().st_mtime_ns
    assert build_minimal(tmp_path / "one", debs) == first
    assert (first / "initramfs.cpio.gz").stat().st_mtime_ns == first_mtime  # reused, not rebuilt

    for name in ("initramfs.cpio.gz", "vmlinuz", "manifest.txt"):
        theirs = minimal_image.initrd.with_name(name).read_bytes()
        assert (first / name).read_bytes() == theirs, name


@pytest.mark.slow
def test_postgres_image_is_the_minimal_guest_plus_postgresql(
    minimal_image: MinimalImage, postgres_image: MinimalImage
):
    """Same kernel and boot pieces as minimal (so changes there carry over), plus PostgreSQL
    with every library its binaries name, and one more service in the inittab."""
    base = {e["name"]: e for e in read_newc(gzip.decompress(minimal_image.initrd.read_bytes()))}
    entries = read_newc(gzip.decompress(postgres_image.initrd.read_bytes()))
    by_name = {e["name"]: e for e in entries}
    assert postgres_image.kernel.read_bytes() == minimal_image.kernel.read_bytes()
    for name in ("init", "etc/rc.sysinit", "etc/modules.order", "usr/sbin/cpu-onliner",
                 "usr/bin/node_exporter"):  # fmt: skip
        assert by_name[name]["data"] == base[name]["data"], name
    assert by_name["etc/inittab"]["data"] == base["etc/inittab"]["data"] + INITTAB_LINE
    pg_bin = f"usr/lib/postgresql/{PG_MAJOR}/bin"
    for program in ("postgres", "initdb", "pg_ctl", "pgbench"):
        elf = by_name[f"{pg_bin}/{program}"]
        assert elf["mode"] & 0o111
        # Every library the loader will look for is in the image (by name, in a lib dir).
        for needed in read_dynamic_info(elf["data"]).needed:
            assert any(
                f"{lib_dir}/{needed}" in by_name
                for lib_dir in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu")
            ), (program, needed)
    assert f"usr/share/postgresql/{PG_MAJOR}/postgres.bki" in by_name
    assert f"usr/lib/postgresql/{PG_MAJOR}/lib/plpgsql.so" in by_name
    assert b"postgres:x:" in by_name["etc/passwd"]["data"]
    assert by_name["etc/pgbench-scale"]["data"] == f"{PGBENCH_SCALE}\n".encode()
    assert by_name["usr/sbin/postgres-guest"]["mode"] & 0o111
    assert f"package postgresql-{PG_MAJOR}=" in postgres_image.manifest.read_text()


@pytest.mark.slow
def test_postgres_build_is_reproducible(postgres_image: MinimalImage, tmp_path):
    require_binary("apt-get")
    again = build_minimal(tmp_path, IMAGE_ROOT / "debs", "postgres")
    for name in ("initramfs.cpio.gz", "vmlinuz", "manifest.txt"):
        assert (again / name).read_bytes() == postgres_image.initrd.with_name(name).read_bytes()
