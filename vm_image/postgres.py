"""The ``postgres`` variant: the minimal guest plus PostgreSQL 15 server, initialised at boot.

Shell: the same build as ``minimal`` (``minimal.build_variant``: Debian ``.deb``s unpacked with
``dpkg-deb``, the project's cpio writer, no root), with PostgreSQL's binaries, the shared
libraries their ELF headers name, its share directory and a few loadable modules added to the
initramfs. Same kernel, modules and boot scripts as ``minimal``; the inittab gains one service,
``guest/postgres-guest``, which initialises a cluster in RAM on first start (role ``bench``,
password ``bench``, database ``pgbench`` filled by ``pgbench -i -s PGBENCH_SCALE``) and then
runs the postmaster on :5432.

Nothing is initialised at build time: ``initdb`` writes a random system identifier and
timestamps, so doing it here would break "same packages, same bytes". Outputs in
``<out>/postgres/``: ``vmlinuz``, ``initramfs.cpio.gz``, ``manifest.txt``.
"""

from __future__ import annotations

from pathlib import Path

from vm_image import cpio
from vm_image.minimal import _GUEST_DIR, Variant, _Tree, build_variant

PG_MAJOR = 15
PGBENCH_SCALE = 5  # rows: 100 000 per unit; 5 fills in ~20 s under TCG, ~75 MB of the guest's RAM
_BIN = f"usr/lib/postgresql/{PG_MAJOR}/bin"
_LIB = f"usr/lib/postgresql/{PG_MAJOR}/lib"
_SHARE = f"usr/share/postgresql/{PG_MAJOR}"
# initdb loads plpgsql and the snowball dictionaries; pg_stat_statements is there to look at
# what pgbench does. The other contrib modules (and llvmjit, 30 MB with LLVM) stay out.
_MODULES = ("plpgsql.so", "dict_snowball.so", "pg_stat_statements.so")
_PROGRAMS = ("postgres", "initdb", "pg_ctl", "pgbench")

# The libraries PostgreSQL's binaries name (DT_NEEDED, transitively), by Debian package. The
# build fails with the missing soname if a Debian update adds one (``_Tree.find_library``).
PACKAGES = (
    f"postgresql-{PG_MAJOR}", "tzdata",
    "libaudit1", "libcap-ng0", "libcap2", "libcom-err2", "libffi8", "libgcc-s1", "libgcrypt20",
    "libgmp10", "libgnutls30", "libgpg-error0", "libgssapi-krb5-2", "libhogweed6", "libicu72",
    "libidn2-0", "libk5crypto3", "libkeyutils1", "libkrb5-3", "libkrb5support0",
    "libldap-2.5-0", "liblz4-1", "liblzma5", "libnettle8", "libp11-kit0", "libpam0g", "libpq5",
    "libsasl2-2", "libssl3", "libstdc++6", "libsystemd0", "libtasn1-6", "libunistring2",
    "libxml2", "libzstd1", "zlib1g",
)  # fmt: skip

POSTGRES_UID = 101
INITTAB_LINE = b"::respawn:/usr/sbin/postgres-guest >>/var/log/postgres.log 2>&1\n"


def _copy_tree(tree: _Tree, top: str, *, skip: tuple[str, ...] = ()) -> None:
    for path in sorted((tree.root / top).rglob("*")):
        rel = path.relative_to(tree.root).as_posix()
        if any(rel.startswith(f"{top}/{s}") for s in skip):
            continue
        if path.is_symlink() or path.is_file():
            tree.copy(rel)


def _extend(tree: _Tree) -> None:
    for program in _PROGRAMS:
        tree.copy_with_libraries(f"{_BIN}/{program}", f"{_BIN}/{program}")
    for module in _MODULES:
        tree.copy_with_libraries(f"{_LIB}/{module}", f"{_LIB}/{module}")
    _copy_tree(tree, _SHARE, skip=("man",))
    tree.copy("usr/share/zoneinfo/Etc/UTC")
    tree.add(cpio.symlink("usr/share/zoneinfo/UTC", "Etc/UTC"))
    tree.add(cpio.symlink("etc/localtime", "/usr/share/zoneinfo/Etc/UTC"))
    tree.add(cpio.directory("var/lib/postgresql"))
    uid = POSTGRES_UID
    tree.replace(
        cpio.regular(
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\n"
            + f"postgres:x:{uid}:{uid}:PostgreSQL:/var/lib/postgresql:/bin/sh\n".encode(),
        )
    )
    tree.replace(cpio.regular("etc/group", f"root:x:0:\npostgres:x:{uid}:\n".encode()))
    # The minimal guest's inittab plus one service: a shared base, so its changes carry over.
    inittab = (_GUEST_DIR / "inittab").read_bytes()
    tree.replace(cpio.regular("etc/inittab", inittab + INITTAB_LINE))
    script = (_GUEST_DIR / "postgres-guest").read_bytes()
    tree.add(cpio.regular("usr/sbin/postgres-guest", script, 0o755))
    tree.add(cpio.regular("etc/pgbench-scale", f"{PGBENCH_SCALE}\n".encode()))


POSTGRES = Variant(name="postgres", packages=PACKAGES, extend=_extend)


def build(*, out_root: Path, cache_dir: Path, source_date_epoch: int) -> Path:
    """Build (or reuse) the PostgreSQL image; returns the output directory."""
    return build_variant(
        POSTGRES, out_root=out_root, cache_dir=cache_dir, source_date_epoch=source_date_epoch
    )
