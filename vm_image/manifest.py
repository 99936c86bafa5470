"""The manifest written next to every image: what went in, and the sha256 of what came out.

Format (plain text, one fact per line, so ``grep`` and ``sha256sum -c`` style tools work)::

    variant minimal
    recipe <sha256 of the vm_image sources that shape the output>
    source_date_epoch 0
    package busybox-static=1:1.35.0-4+deb12u1+b1
    sha256 <hex>  initramfs.cpio.gz

The "inputs" are every line but the ``sha256`` ones. A build whose inputs equal an existing
manifest's, and whose outputs still hash to the recorded values, is skipped: that is the cache.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Manifest:
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, str], ...]  # (file name, sha256 hex), sorted by name

    def render(self) -> str:
        lines = [*self.inputs, *(f"sha256 {digest}  {name}" for name, digest in self.outputs)]
        return "\n".join(lines) + "\n"


def parse(text: str) -> Manifest:
    inputs: list[str] = []
    outputs: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line.startswith("sha256 "):
            digest, name = line.removeprefix("sha256 ").split("  ", 1)
            outputs.append((name, digest))
        elif line:
            inputs.append(line)
    return Manifest(inputs=tuple(inputs), outputs=tuple(sorted(outputs)))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def recipe_digest(root: Path) -> str:
    """Hash of the files under ``root`` that decide the image's bytes (code and guest files).

    A change to the init script must invalidate the cache even though no package version moved.
    """
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if "build" in path.relative_to(root).parts or "__pycache__" in path.parts:
            continue
        if path.is_file() and path.suffix != ".md":  # docs do not change the image
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def is_current(out_dir: Path, inputs: tuple[str, ...]) -> bool:
    """True if ``out_dir`` holds a build of exactly ``inputs`` whose outputs are intact."""
    path = out_dir / "manifest.txt"
    if not path.exists():
        return False
    existing = parse(path.read_text())
    if existing.inputs != inputs or not existing.outputs:
        return False
    return all(
        (out_dir / name).exists() and sha256_file(out_dir / name) == digest
        for name, digest in existing.outputs
    )


def write(out_dir: Path, inputs: tuple[str, ...], names: list[str]) -> Manifest:
    manifest = Manifest(
        inputs=inputs,
        outputs=tuple(sorted((name, sha256_file(out_dir / name)) for name in names)),
    )
    (out_dir / "manifest.txt").write_text(manifest.render())
    return manifest
