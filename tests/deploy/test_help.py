"""Every script and command answers ``--help`` with exit 0, runs nothing, and explains every
option it takes.

Shell scripts: the options their ``case`` arms accept must appear in the help. Python commands:
the test watches the argparse parsers the command builds (a spy on ``parse_known_args``) and
requires help text on every argument and option that is not deliberately hidden; the help must
name every option.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.render import ROOT

SHELL = {
    "scripts/setup": ["scripts/setup"],
    "scripts/run": ["scripts/run"],
    "scripts/test": ["scripts/test"],
    "scripts/check": ["scripts/check"],
    "scripts/run-bench.sh": ["scripts/run-bench.sh"],
    "kind/up.sh": ["kind/up.sh"],
    "kind/down.sh": ["kind/down.sh"],
}

PYTHON = {
    "scheduler-extender": ["-m:scheduler_extender"],
    "scheduler-extender serve": ["-m:scheduler_extender", "serve"],
    "scheduler-extender recommend": ["-m:scheduler_extender", "recommend"],
    "scheduler-extender simulate": ["-m:scheduler_extender", "simulate"],
    "python -m simulator": ["-m:simulator"],
    "autoscaler-agent": ["-m:autoscaler_agent"],
    "python -m vm_runner": ["-m:vm_runner"],
    "vm_image/build.sh": ["-m:vm_image"],
    "scripts/run-bench.sh --local": ["scripts/local_bench.py"],
    "scripts/watch-vcpus": ["scripts/watch-vcpus"],
    "scripts/bench_simulator.py": ["scripts/bench_simulator.py"],
    "scripts/bench_extender.py": ["scripts/bench_extender.py"],
    "scripts/bench_agent.py": ["scripts/bench_agent.py"],
    "scripts/bench_memory.py": ["scripts/bench_memory.py"],
    "scripts/bench_recommender.py": ["scripts/bench_recommender.py"],
    "scripts/bench_failover.py": ["scripts/bench_failover.py"],
}

# Runs the target as __main__ with a spy on argparse that records every parser it parses with.
_SPY = """
import argparse, json, os, runpy, sys
seen = []
original = argparse.ArgumentParser.parse_known_args
def spy(self, args=None, namespace=None):
    actions = []
    for a in self._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        hidden = a.help == argparse.SUPPRESS
        actions.append({"options": a.option_strings, "dest": a.dest,
                        "help": None if hidden else a.help, "hidden": hidden})
    seen.append({"prog": self.prog, "actions": actions})
    with open(os.environ["HELP_SPY"], "w") as f:
        json.dump(seen, f)
    return original(self, args, namespace)
argparse.ArgumentParser.parse_known_args = spy
target, *rest = sys.argv[1:]
if target.startswith("-m:"):
    sys.argv = [target[3:], *rest]
    runpy.run_module(target[3:], run_name="__main__", alter_sys=True)
else:
    sys.argv = [target, *rest]
    runpy.run_path(target, run_name="__main__")
"""


def _shell_options(script: Path) -> set[str]:
    """The options a script's ``case`` arms accept, e.g. ``-h | --help)``."""
    options: set[str] = set()
    for line in script.read_text().splitlines():
        arm = re.match(r"\s*((?:-{1,2}[\w-]+\s*\|?\s*)+)\)", line)
        if arm:
            options.update(re.findall(r"-{1,2}[\w-]+", arm[1]))
    return options


@pytest.mark.parametrize("name", SHELL)
def test_shell_script_help(name, tmp_path):
    script = ROOT / SHELL[name][0]
    # An empty PATH but bash's own directory: --help must not need docker, kind or apt.
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(
        [str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr  # nothing was run, not even a set-up step
    assert "usage" in result.stdout.lower() or name in result.stdout
    for option in _shell_options(script):
        assert option in result.stdout, f"{name} --help does not mention {option}"


@pytest.mark.parametrize("name", PYTHON)
def test_python_command_help(name, tmp_path):
    target, *rest = PYTHON[name]
    spy_file = tmp_path / "parsers.json"
    env = {**os.environ, "HELP_SPY": str(spy_file), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", _SPY, target, *rest, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    parsers = json.loads(spy_file.read_text())
    shown = parsers[-1]  # the parser that printed the help
    assert shown["prog"] in result.stdout
    for parser in parsers:
        for action in parser["actions"]:
            if action["hidden"]:
                continue
            label = "/".join(action["options"]) or action["dest"]
            assert action["help"], f"{parser['prog']}: {label} has no help text"
    for action in shown["actions"]:
        for option in action["options"]:
            if not action["hidden"]:
                assert option in result.stdout, f"{name} --help does not mention {option}"


def test_python_simulator_names_itself():
    result = subprocess.run(
        [sys.executable, "-m", "simulator", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0
    assert result.stdout.startswith("usage: python -m simulator")


def test_scripts_test_help_runs_no_checks(tmp_path):
    """``scripts/test --help`` used to run every static check before pytest saw --help."""
    result = subprocess.run(
        [str(ROOT / "scripts" / "test"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    assert "check:" not in result.stdout + result.stderr
