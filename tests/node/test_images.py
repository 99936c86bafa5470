"""The node tier builds the Dockerfiles users build, from bases it can make (fast, no node).

buildah builds each Dockerfile as written, so the images cannot drift from them; what can drift
is a base image: a ``FROM`` the tier does not make locally would send buildah to a registry,
which this machine cannot reach. And the image cache must be keyed by what a build reads.
"""

from __future__ import annotations

import re

from tests.node.images import DEBIAN, PYTHON, ROOT, context_files, project_images


def _bases(dockerfile: str) -> set[str]:
    text = dockerfile.replace("\\\n", " ")
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, flags=re.M))
    stages: set[str] = set()
    bases = set()
    for match in re.finditer(r"^FROM (\S+)(?:\s+AS\s+(\S+))?", text, flags=re.M | re.I):
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], match[1])
        if image not in stages and image != "scratch":
            bases.add(image if "/" in image else f"docker.io/library/{image}")
        if match[2]:
            stages.add(match[2])
    return bases


def test_every_base_image_of_the_project_is_one_the_tier_makes() -> None:
    made = {DEBIAN.ref, PYTHON.ref}
    for image in project_images():
        assert _bases(image.dockerfile_text()) <= made, image.dockerfile


def test_the_build_context_is_what_dockerignore_leaves() -> None:
    files = set(context_files(ROOT))
    assert "pyproject.toml" in files and "vm_runner/cli.py" in files
    assert not any(f.startswith((".git/", ".venv/", "tests/", "docs/")) for f in files)
    assert not any("__pycache__" in f for f in files)


def test_an_image_is_keyed_by_the_files_its_copies_read() -> None:
    extender, _, runner = project_images()
    assert "pyproject.toml" in extender.inputs()  # COPY . .
    runner_inputs = runner.inputs()  # COPY vm_image/ and vm_runner/ only
    assert "pyproject.toml" not in runner_inputs
    assert {f.split("/")[0] for f in runner_inputs} == {"vm_image", "vm_runner"}
