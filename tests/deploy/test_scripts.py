"""The shell scripts parse, pass shellcheck when it is installed, and fail clearly."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.deploy.render import ROOT

SHELL_SCRIPTS = [
    ROOT / "kind" / "up.sh",
    ROOT / "kind" / "down.sh",
    ROOT / "scripts" / "run-bench.sh",
    ROOT / "scripts" / "kube-bin",
]
IDS = [str(p.relative_to(ROOT)) for p in SHELL_SCRIPTS]


def _run(argv, env=None):
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=30, check=False, env=env, cwd=ROOT
    )


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=IDS)
def test_parses(script):
    result = _run(["bash", "-n", str(script)])
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=IDS)
def test_is_strict_and_executable(script):
    assert "set -euo pipefail" in script.read_text()
    assert os.access(script, os.X_OK)


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=IDS)
def test_shellcheck(script):
    # Optional: scripts/setup does not install shellcheck (Debian's `shellcheck` package does).
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (optional: apt-get install shellcheck)")
    result = _run([shellcheck, "--severity=style", str(script)])
    assert result.returncode == 0, result.stdout


def test_run_bench_local_mode_documents_itself():
    """``--local`` hands over to scripts/local_bench.py (run end to end by tests/e2e)."""
    result = _run(["bash", str(ROOT / "scripts" / "run-bench.sh"), "--local", "--help"])
    assert result.returncode == 0, result.stderr
    assert "VM_NAME" in result.stdout
    assert "--duration" in result.stdout


def test_run_bench_needs_a_vm_name():
    env = {k: v for k, v in os.environ.items() if k != "VM_NAME"}
    result = _run(["bash", str(ROOT / "scripts" / "run-bench.sh")], env=env)
    assert result.returncode != 0
    assert "set VM_NAME" in result.stderr


def test_up_refuses_without_its_tools(tmp_path):
    """With an empty PATH (bash itself named absolutely) up.sh stops before doing anything."""
    result = _run(
        [shutil.which("bash") or "/bin/bash", str(ROOT / "kind" / "up.sh")],
        env={"PATH": str(tmp_path), "HOME": str(tmp_path)},
    )
    assert result.returncode == 1
    assert "docker is not installed" in result.stderr


def test_watch_vcpus_is_lint_clean():
    """`ruff check .` skips files without a .py suffix, so check the script explicitly."""
    ruff = shutil.which("ruff", path=str(ROOT / ".venv" / "bin")) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    script = str(ROOT / "scripts" / "watch-vcpus")
    for argv in (
        [ruff, "check", "--quiet", script],
        [ruff, "format", "--check", "--quiet", script],
    ):
        result = _run(argv)
        assert result.returncode == 0, result.stdout + result.stderr


def test_kube_bin_refuses_a_folder_without_checksums(tmp_path):
    (tmp_path / "etcd.xz").write_bytes(b"not xz")
    result = _run([str(ROOT / "scripts" / "kube-bin"), str(tmp_path)])
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no SHA256SUMS" in result.stderr


def test_kube_bin_refuses_binaries_whose_checksums_differ(tmp_path):
    (tmp_path / "etcd.xz").write_bytes(b"tampered")
    (tmp_path / "SHA256SUMS").write_text("0" * 64 + "  etcd.xz\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    result = _run([str(ROOT / "scripts" / "kube-bin"), str(tmp_path)], env=env)
    assert result.returncode == 2
    assert "checksums do not match" in result.stderr
    assert not (tmp_path / "cache").exists()
