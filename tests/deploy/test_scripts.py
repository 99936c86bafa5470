"""The shell scripts parse, pass shellcheck (scripts/setup installs it), and fail clearly."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from testkit.manifests import ROOT

SHELL_SCRIPTS = [
    ROOT / "kind" / "up.sh",
    ROOT / "kind" / "down.sh",
    ROOT / "scripts" / "run-bench.sh",
    ROOT / "scripts" / "kube-bin",
]
IDS = [str(p.relative_to(ROOT)) for p in SHELL_SCRIPTS]
_SKIP_DIRS = {".git", ".venv", "out", "build", "node_modules", ".mypy_cache", ".ruff_cache"}


def _shell_scripts() -> list:
    """Every file of the repository whose first line names sh or bash, wherever it lives."""
    found = []
    stack = [ROOT]
    while stack:
        for path in sorted(stack.pop().iterdir()):
            if path.is_dir():
                if path.name not in _SKIP_DIRS and not path.is_symlink():
                    stack.append(path)
                continue
            try:
                with path.open("rb") as f:
                    first = f.readline(100)
            except OSError:
                continue
            if first.startswith(b"#!") and (b"bash" in first or first.rstrip().endswith(b"/sh")):
                found.append(path)
    return sorted(found)


ALL_SHELL = _shell_scripts()


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


def test_every_shell_script_is_found():
    """The discovery below is what shellcheck sees: it must include the known scripts."""
    names = {str(p.relative_to(ROOT)) for p in ALL_SHELL}
    assert set(IDS) | {"scripts/setup", "scripts/test", "vm_image/guest/rc.sysinit"} <= names


@pytest.mark.parametrize("script", ALL_SHELL, ids=[str(p.relative_to(ROOT)) for p in ALL_SHELL])
def test_shellcheck(script):
    # Not optional: scripts/setup installs Debian's `shellcheck`, so CI lints every script.
    shellcheck = shutil.which("shellcheck")
    assert shellcheck is not None, "shellcheck is not installed: run scripts/setup"
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


def _recording_path(tmp_path):
    """A PATH whose dpkg-query, apt-get and sudo only record that they were called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("dpkg-query", "apt-get", "sudo"):
        fake = bin_dir / tool
        # dpkg-query reports every package installed, so a full setup installs nothing.
        fake.write_text(
            f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n'
            + ('printf "install ok installed"\n' if tool == "dpkg-query" else "exit 1\n")
        )
        fake.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}", log


def test_run_installs_no_debian_packages(tmp_path):
    """A simulation needs no QEMU, PostgreSQL or node_exporter: scripts/run asks apt nothing."""
    path, log = _recording_path(tmp_path)
    result = subprocess.run(
        [str(ROOT / "scripts" / "run"), "simulate", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PATH": path},
    )
    assert result.returncode == 0, result.stderr
    assert not log.exists(), log.read_text()


def test_setup_checks_every_package_the_tests_use(tmp_path):
    """scripts/setup (what scripts/test runs) still looks for every Debian package."""
    path, log = _recording_path(tmp_path)
    result = subprocess.run(
        [str(ROOT / "scripts" / "setup")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": path},
    )
    assert result.returncode == 0, result.stderr
    asked = log.read_text()
    for package in ("qemu-system-x86", "prometheus-node-exporter", "postgresql", "shellcheck"):
        assert f" {package}\n" in asked, asked
    assert "apt-get" not in asked
