"""The node's images, built from the project's own Dockerfiles with buildah, no registry.

What ``docker build`` makes for a user is what the node runs: ``Dockerfile.extender``,
``Dockerfile.agent`` and ``vm_runner/Dockerfile`` go through ``buildah bud`` as written. Only
their base images cannot come from a registry here, so they are made locally and tagged with the
names the Dockerfiles pull:

- ``debian:bookworm-slim``: ``mmdebstrap --variant=minbase bookworm`` (what the slim image is:
  Debian's required packages, no recommends);
- ``python:3.11-slim-bookworm``: the same plus Debian's python3 (3.11), python3-venv and
  python-is-python3, so ``python -m venv`` and ``pip install .`` run as in the upstream image
  (which puts its own CPython 3.11 in /usr/local instead).

Beside them, what the node needs from a registry: the sandbox image (``pause``), the
kube-scheduler image ``manifests/extender.yaml`` names (the ``$VMA_KUBE_BIN`` binary, as the
upstream image is), and an image with pgbench for ``scripts/run-bench.sh`` (``PGBENCH_IMAGE``).

Each image is cached by the hash of everything its build reads (Dockerfile, the build context
its ``.dockerignore`` leaves, the base image's key), as a docker-archive in the cache, and
imported into containerd's ``k8s.io`` namespace only when containerd lacks it: a rerun with
nothing changed costs seconds. ``RUN`` steps see the host's pip configuration (``pip config
list``) and the local paths it names, so a machine with a PyPI mirror or a private CA builds
as it installs packages itself.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
CACHE: Final = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / (
    "vm-autoscaling/node-images"
)
DEBIAN_MIRROR: Final = "http://deb.debian.org/debian"
SUITE: Final = "bookworm"
KUBE_VERSION: Final = "v1.36.2"
PAUSE_IMAGE: Final = "registry.k8s.io/pause:3.10"
PGBENCH_IMAGE: Final = "localhost/vma-test/pgbench:15"


@dataclass(frozen=True)
class Base:
    """A base image made with mmdebstrap: ``ref`` is the name Dockerfiles pull."""

    ref: str
    packages: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return _digest([SUITE, DEBIAN_MIRROR, *self.packages])


DEBIAN = Base("docker.io/library/debian:bookworm-slim")
PYTHON = Base(
    "docker.io/library/python:3.11-slim-bookworm",
    ("python3", "python3-venv", "python-is-python3", "ca-certificates"),
)


@dataclass(frozen=True)
class Image:
    """An image ``buildah bud`` builds: ``dockerfile`` (a path in ``context``, or its text)."""

    ref: str
    context: Path
    dockerfile: str
    bases: tuple[Base, ...]
    inline: bool = False
    extra_key: tuple[str, ...] = field(default=())

    def dockerfile_text(self) -> str:
        return self.dockerfile if self.inline else (self.context / self.dockerfile).read_text()

    @property
    def key(self) -> str:
        return _digest(
            [
                self.ref,
                self.dockerfile_text(),
                *(b.key for b in self.bases),
                *self.extra_key,
                *(f"{p}:{_file_digest(self.context / p)}" for p in self.inputs()),
            ]
        )

    def inputs(self) -> list[str]:
        """The context files the Dockerfile's COPY/ADD read (``.`` reads them all)."""
        sources: list[str] = []
        for line in self.dockerfile_text().replace("\\\n", " ").splitlines():
            words = line.split()
            if words and words[0].upper() in ("COPY", "ADD"):
                args = [w for w in words[1:] if not w.startswith("--")]
                if any(w.startswith("--from") for w in words[1:]):
                    continue
                sources += [a.strip("/") for a in args[:-1]]
        files = list(context_files(self.context))
        if "." in sources or "" in sources:
            return files
        return [f for f in files if any(f == s or f.startswith(s + "/") for s in sources)]

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9.-]+", "_", self.ref)


def _digest(parts: list[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _file_digest(path: Path) -> str:
    if path.is_symlink():
        return f"link:{path.readlink()}"
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return f"{h.hexdigest()}:{path.stat().st_mode & 0o777:o}"


def _ignore_patterns(context: Path) -> list[str]:
    path = context / ".dockerignore"
    if not path.exists():
        return []
    return [
        line.strip().rstrip("/")
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule, as far as this repository's .dockerignore uses it: a pattern excludes the
    path or any directory above it; ``**/`` matches any depth (``!`` exceptions are unused)."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        alternatives = [pattern]
        if pattern.startswith("**/"):
            alternatives.append(pattern[3:])
        for alt in alternatives:
            for prefix in prefixes:
                if fnmatch.fnmatchcase(prefix, alt) or (
                    alt != pattern and fnmatch.fnmatchcase(prefix.rsplit("/", 1)[-1], alt)
                ):
                    return True
    return False


def context_files(context: Path) -> Iterator[str]:
    """The files of a build context that its .dockerignore leaves, sorted."""
    patterns = _ignore_patterns(context)
    for dirpath, dirnames, filenames in os.walk(context):
        rel_dir = os.path.relpath(dirpath, context)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if not _ignored(rel_dir + d, patterns))
        for name in sorted(filenames):
            rel = rel_dir + name
            if not _ignored(rel, patterns):
                yield rel


def project_images() -> list[Image]:
    """The three images a user builds with ``docker build`` from the repository root."""
    return [
        Image(
            "docker.io/vm-autoscaling/scheduler-extender:dev",
            ROOT,
            "Dockerfile.extender",
            (PYTHON,),
        ),
        Image("docker.io/vm-autoscaling/autoscaler-agent:dev", ROOT, "Dockerfile.agent", (PYTHON,)),
        Image("docker.io/vm-autoscaling/vm-runner:dev", ROOT, "vm_runner/Dockerfile", (DEBIAN,)),
    ]


def support_images(kube_bin: Path, work: Path) -> list[Image]:
    """What a registry would give a cluster: pause, kube-scheduler, pgbench."""
    sched = work / "kube-scheduler-context"
    sched.mkdir(parents=True, exist_ok=True)
    shutil.copy2(kube_bin / "kube-scheduler", sched / "kube-scheduler")
    empty = work / "empty-context"
    empty.mkdir(exist_ok=True)
    return [
        # The sandbox only has to sleep; the runtime kills it with SIGKILL.
        Image(
            PAUSE_IMAGE,
            empty,
            'FROM debian:bookworm-slim\nENTRYPOINT ["sleep", "infinity"]\n',
            (DEBIAN,),
            inline=True,
        ),
        Image(
            f"registry.k8s.io/kube-scheduler:{KUBE_VERSION}",
            sched,
            "FROM scratch\nCOPY kube-scheduler /usr/local/bin/kube-scheduler\n"
            'ENTRYPOINT ["/usr/local/bin/kube-scheduler"]\n',
            (),
            inline=True,
        ),
        # pg_isready (client) and pgbench (Debian ships it with the server package).
        Image(
            PGBENCH_IMAGE,
            empty,
            "FROM debian:bookworm-slim\nRUN apt-get update && apt-get install -y "
            "--no-install-recommends postgresql-client-15 postgresql-15 "
            "&& rm -rf /var/lib/apt/lists/*\nENV PATH=/usr/lib/postgresql/15/bin:$PATH\n",
            (DEBIAN,),
            inline=True,
        ),
    ]


def _run(args: list[str], *, log: Path, cwd: Path | None = None) -> str:
    with log.open("a") as out:
        out.write(f"$ {' '.join(args)}\n")
        out.flush()
        result = subprocess.run(
            args, cwd=cwd, stdout=subprocess.PIPE, stderr=out, text=True, check=False
        )
    if result.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"{args[0]} {args[1]} failed ({result.returncode}):\n{tail}")
    return result.stdout


def _buildah_has(ref: str, key: str) -> bool:
    result = subprocess.run(
        [
            "buildah",
            "inspect",
            "--type",
            "image",
            "--format",
            '{{index .ImageAnnotations "io.vm-autoscaling.key"}}',
            ref,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0 and result.stdout.strip() == key


def _make_base(base: Base, log: Path) -> None:
    if _buildah_has(base.ref, base.key):
        return
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        tar = Path(tmp) / "rootfs.tar"
        include = [f"--include={','.join(base.packages)}"] if base.packages else []
        _run(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--mode=root",
                "--format=tar",
                '--aptopt=APT::Install-Recommends "false"',
                *include,
                '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin',
                SUITE,
                str(tar),
                f"deb {DEBIAN_MIRROR} {SUITE} main",
            ],
            log=log,
        )
        container = _run(["buildah", "from", "scratch"], log=log).strip()
        try:
            _run(["buildah", "add", container, str(tar), "/"], log=log)
            _run(
                [
                    "buildah",
                    "config",
                    "--cmd",
                    '["bash"]',
                    "--annotation",
                    f"io.vm-autoscaling.key={base.key}",
                    container,
                ],
                log=log,
            )
            _run(["buildah", "commit", "-q", container, base.ref], log=log)
        finally:
            _run(["buildah", "rm", container], log=log)


def _pip_mounts() -> list[str]:
    """``-v`` options giving RUN steps the host's pip configuration and what it names."""
    result = subprocess.run(["pip", "config", "list"], capture_output=True, text=True, check=False)
    paths = {Path("/etc/pip.conf"), Path("/etc/xdg/pip")}
    for line in result.stdout.splitlines():
        for word in re.split(r"[\s'=]+", line):
            token = word.removeprefix("file://")
            if token.startswith("/"):
                paths.add(Path(token))
    return [opt for path in sorted(paths) if path.exists() for opt in ("-v", f"{path}:{path}:ro")]


def _build(image: Image, log: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dockerfile = image.context / image.dockerfile
        if image.inline:
            dockerfile = Path(tmp) / "Dockerfile"
            dockerfile.write_text(image.dockerfile)
        # Only where pip runs: mounted read-only, the CA bundle would break a RUN step that
        # installs Debian's ca-certificates (its postinst rewrites that file).
        pip = _pip_mounts() if "pip install" in image.dockerfile_text() else []
        _run(
            [
                "buildah",
                "bud",
                "--isolation",
                "chroot",
                "--network",
                "host",
                "--layers",
                *pip,
                "--annotation",
                f"io.vm-autoscaling.key={image.key}",
                "-f",
                str(dockerfile),
                "-t",
                image.ref,
                str(image.context),
            ],
            log=log,
        )


def _prune(log: Path) -> None:
    """Remove the images no tag names any more: a build that moves a tag leaves the image it
    replaced behind (about 0.7 GB for a changed agent and extender), and 150 of them once held
    14 GB here. The build cache is kept: a layer under a tagged image is not dangling. Best
    effort: an image a stray working container still uses stays (buildah exits 125)."""
    with log.open("a") as out:
        out.write("$ buildah rmi --prune\n")
        out.flush()
        subprocess.run(["buildah", "rmi", "--prune"], stdout=out, stderr=out, check=False)


def _containerd_digest(ctr: list[str], ref: str) -> str | None:
    out = subprocess.run(
        [*ctr, "images", "ls", f"name=={ref}"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    for line in out[1:]:
        fields = line.split()
        if fields and fields[0] == ref:
            return fields[2]
    return None


def ensure_images(images: list[Image], log: Path, ctr: list[str], node: str = "") -> dict[str, str]:
    """Build what changed, import into containerd (``ctr``: its command, namespace included)
    what it lacks; returns ref -> what was done. ``node``: whose containerd it is, for every
    node but the first (each containerd keeps its own image store, and its own stamp here)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    done: dict[str, str] = {}
    for image in images:
        key = image.key
        archive = CACHE / f"{image.slug}-{key}.tar"
        stamp = CACHE / f"{image.slug}{'.' + node if node else ''}.imported"
        if not archive.exists():
            for base in image.bases:
                _make_base(base, log)
            if not _buildah_has(image.ref, key):
                _build(image, log)
                _prune(log)
            for old in CACHE.glob(f"{image.slug}-*.tar"):
                old.unlink()
            partial = archive.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            _run(["buildah", "push", image.ref, f"docker-archive:{partial}:{image.ref}"], log=log)
            partial.rename(archive)
            done[image.ref] = "built"
        digest = _containerd_digest(ctr, image.ref)
        if digest is None or not stamp.exists() or stamp.read_text() != f"{key} {digest}":
            _run([*ctr, "images", "import", str(archive)], log=log)
            stamp.write_text(f"{key} {_containerd_digest(ctr, image.ref)}")
            done.setdefault(image.ref, "imported")
        else:
            done.setdefault(image.ref, "cached")
    return done
