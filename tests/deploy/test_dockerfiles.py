"""The images agree with pyproject.toml and with the manifests that run them."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from testkit.manifests import ROOT, container, pod_spec
from tests.deploy.system import AGENT_CFG, AGENT_DS, EXTENDER_CFG, EXTENDER_POD

DOCKERFILES = ["Dockerfile.extender", "Dockerfile.agent", "vm_runner/Dockerfile"]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _instructions(name: str) -> list[tuple[str, str]]:
    text = (ROOT / name).read_text().replace("\\\n", " ")
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def _runtime_stage(name: str) -> list[tuple[str, str]]:
    ins = _instructions(name)
    last_from = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    return ins[last_from:]


CASES = [
    (
        "Dockerfile.extender",
        "scheduler-extender",
        EXTENDER_POD,
        "extender",
        EXTENDER_CFG.listen.permits.port,
    ),
    ("Dockerfile.agent", "autoscaler-agent", AGENT_DS, "agent", AGENT_CFG.http.port),
]


@pytest.mark.parametrize(
    ("dockerfile", "script", "workload", "cname", "health_port"), CASES, ids=[c[0] for c in CASES]
)
def test_image(dockerfile, script, workload, cname, health_port):
    stage = _runtime_stage(dockerfile)
    ops = dict(stage)
    # Slim Python of the project's version, built with the project's own metadata.
    assert re.search(r"python:3\.11-slim", (ROOT / dockerfile).read_text())
    # The dependencies pyproject.toml lists in a layer of their own, then the project itself.
    text = (ROOT / dockerfile).read_text()
    assert (
        text.index("COPY pyproject.toml .")
        < text.index("pip install -r")
        < text.index("COPY . .")
        < text.index("pip install --no-deps .")
    )
    # The runtime stage copies the built venv, not sources or build tools.
    assert ("COPY", "--from=build /opt/venv /opt/venv") in stage
    assert not any(op == "RUN" and "pip" in arg for op, arg in stage)
    # Non-root by number, so runAsNonRoot can verify it.
    uid, _, gid = ops["USER"].partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit()
    # The entry point is the console script pyproject.toml declares.
    assert json.loads(ops["ENTRYPOINT"]) == [script]
    assert script in PYPROJECT["project"]["scripts"]
    # The default config path is where the manifest mounts it.
    c = container(workload, cname)
    assert json.loads(ops["CMD"]) == c["args"]
    # HEALTHCHECK hits /healthz on the port that serves it.
    assert f"http://127.0.0.1:{health_port}/healthz" in ops["HEALTHCHECK"]
    assert "LABEL" in ops and "org.opencontainers.image.title" in ops["LABEL"]
    run_as = c.get("securityContext", {}).get("runAsUser") or pod_spec(workload)[
        "securityContext"
    ].get("runAsUser")
    assert run_as == int(uid)


def test_dockerignore_keeps_the_context_small_but_buildable():
    entries = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {
        ".venv",
        "vm_image/build",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".git",
    } <= entries
    # What `pip install .` needs, and the VM runner image's sources, must stay in the context.
    for needed in (
        "pyproject.toml",
        "README.md",
        "protocol",
        "kube_io",
        "scheduler_extender",
        "autoscaler_agent",
        "vm_runner",
        "vm_image",
    ):
        assert needed not in entries
        assert (ROOT / needed).exists()


# Groups every Debian root has: base-passwd (Essential) creates them. Others, `kvm` among them,
# come from packages (udev) that a minimal image does not install.
BASE_GROUPS = {
    line.split(":")[0]
    for line in Path("/usr/share/base-passwd/group.master").read_text().splitlines()
}


def _stages(name: str) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = [[]]  # ARGs before the first FROM
    for op, arg in _instructions(name):
        if op == "FROM":
            stages.append([])
        stages[-1].append((op, arg))
    return stages


def _commands(stage: list[tuple[str, str]]) -> list[list[str]]:
    return [
        shlex.split(part)
        for op, arg in stage
        if op == "RUN"
        for part in re.split(r"&&|;", arg)
        if part.strip()
    ]


def _groups_joined(argv: list[str]) -> list[str]:
    """The group names ``useradd`` is told to use (numeric IDs need no entry)."""
    out = []
    for flag, value in itertools.pairwise(argv):
        if flag in ("--gid", "-g", "--groups", "-G"):
            out += [g for g in value.split(",") if not g.isdigit()]
    return out


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_useradd_joins_only_groups_that_exist(dockerfile):
    """``useradd: group 'kvm' does not exist`` broke the runner image on a minimal Debian root."""
    for stage in _stages(dockerfile):
        created = set(BASE_GROUPS)
        for argv in _commands(stage):
            if argv[0] == "groupadd":
                created.add(argv[-1])
            elif argv[0] == "useradd":
                missing = set(_groups_joined(argv)) - created
                assert not missing, f"{dockerfile}: useradd joins {missing}, never created"


@pytest.mark.parametrize("dockerfile", ["Dockerfile.extender", "Dockerfile.agent"])
def test_the_images_hold_no_simulator(dockerfile):
    """The simulator is an offline tool with its own command: out of the build context, its
    console script removed, and the build fails if the package is importable anyway."""
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert "simulator" in ignored
    assert PYPROJECT["project"]["scripts"]["vm-simulator"] == "simulator.cli:main"
    build = " ".join(arg for op, arg in _instructions(dockerfile) if op == "RUN")
    assert "rm /opt/venv/bin/vm-simulator" in build
    assert "! /opt/venv/bin/python -c 'import simulator'" in build
