"""Docstrings that say what the code is: the error tree draws every error class, the ``http``
package lists every module, and no docstring carries a timing (figures go stale in prose;
the benchmarks print them). Reads source files only: milliseconds.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import scheduler_extender.http
from scheduler_extender import errors

ROOT = Path(__file__).resolve().parents[2]
# The agent's packages are left out while they are being rewritten (but for the files named in
# FILES); add them after.
PACKAGES = (
    "scheduler_extender",
    "protocol",
    "kube_io",
    "observability",
    "vm_runner",
    "vm_image",
    "simulator",
)
FILES = ("autoscaler_agent/policy.py", "autoscaler_agent/hypervisor/qmp.py")
TIMING = re.compile(r"\d[\d.,]*\s*(?:µs|us|ms|microseconds?|milliseconds?)\b")


def _error_classes() -> list[type[errors.ExtenderError]]:
    return [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, errors.ExtenderError)
    ]


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_the_error_tree_draws_every_class_with_its_status(cls: type) -> None:
    assert errors.__doc__ is not None
    assert re.search(rf"\b{cls.__name__}\s+{cls.status}\b", errors.__doc__), cls.__name__


def test_the_http_package_lists_every_module() -> None:
    doc = scheduler_extender.http.__doc__ or ""
    package = Path(scheduler_extender.http.__file__).parent
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    assert [m for m in modules if f"``{m}``" not in doc] == []


def _docstrings(path: Path) -> list[tuple[str, str]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((getattr(node, "name", "module"), doc))
    return found


def test_no_docstring_carries_a_timing() -> None:
    timings = [
        f"{path.relative_to(ROOT)}:{name}: {match.group()}"
        for path in [
            *(p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))),
            *(ROOT / f for f in FILES),
        ]
        for name, doc in _docstrings(path)
        for match in TIMING.finditer(doc)
    ]
    assert timings == []


def test_the_permit_path_drawing_names_the_code_that_runs_it() -> None:
    """Every name at the end of a line of the drawing resolves, in the order the path runs."""
    import importlib

    import scheduler_extender

    doc = scheduler_extender.__doc__ or ""
    drawing = doc.split("The permit path, as it runs")[1].split("\n\n", 2)[1]
    names = [line.split()[-1] for line in drawing.splitlines() if line.strip()]
    assert names[0] == "http.front.run_front" and len(names) == 9, names
    for name in names:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module(
                    "scheduler_extender." + ".".join(parts[:cut])
                )
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                found = getattr(found, attr)
            break
        else:
            raise AssertionError(f"{name} names nothing")
