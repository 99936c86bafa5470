"""Command line: ``python -m vm_image {minimal,postgres,full} [--out DIR] [--cache DIR]``.

Prints the output directory on stdout (and nothing else there), so scripts can capture it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from vm_image import debs, full, minimal, postgres

_HERE = Path(__file__).parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vm_image",
        description="Build a guest image from Debian packages (see vm_image/README.md).",
    )
    parser.add_argument(
        "variant",
        choices=["minimal", "postgres", "full"],
        help="minimal: kernel + busybox initramfs with node_exporter (seconds to build); "
        "postgres: minimal plus PostgreSQL 15, initialised in RAM at boot (no root); "
        "full: debootstrapped Debian disk with PostgreSQL (minutes, needs root)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=_HERE / "build",
        help="output root; the image goes to OUT/<variant>/ (default: vm_image/build, git-ignored)",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="where downloaded .debs are kept between builds (default: OUT/debs)",
    )
    args = parser.parse_args(argv)
    # SOURCE_DATE_EPOCH is the reproducible-builds convention for "the one timestamp to use".
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    cache = args.cache or args.out / "debs"
    started = time.monotonic()
    try:
        if args.variant == "minimal":
            out = minimal.build(out_root=args.out, cache_dir=cache, source_date_epoch=epoch)
        elif args.variant == "postgres":
            out = postgres.build(out_root=args.out, cache_dir=cache, source_date_epoch=epoch)
        else:
            out = full.build(out_root=args.out, cache_dir=cache, source_date_epoch=epoch)
    except debs.AptError as e:
        print(f"vm_image: {e}", file=sys.stderr)
        return 1
    print(f"vm_image: {args.variant} ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
