"""Every script and command answers ``--help`` with exit 0, runs nothing, and explains every
option it takes.

Shell scripts: the options their ``case`` arms accept must appear in the help. Python commands,
run in this process as ``python`` runs them (``runpy``, as ``__main__``): the test watches the
argparse parsers the command builds (a spy on ``parse_known_args``) and requires help text on
every argument and option that is not deliberately hidden; the help must name every option.
The console scripts' own processes answer --help in test_operator_mistakes.py.
"""

from __future__ import annotations

import argparse
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.manifests import ROOT

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
    "vm-simulator": ["-m:simulator"],
    "python -m simulator": ["-m:simulator"],
    "autoscaler-agent": ["-m:autoscaler_agent"],
    "vm-controller": ["-m:vm_controller"],
    "python -m vm_runner": ["-m:vm_runner"],
    "vm_image/build.sh": ["-m:vm_image"],
    "scripts/run-bench.sh --local": ["scripts/local_bench.py"],
    "scripts/watch-vcpus": ["scripts/watch-vcpus"],
    "scripts/cluster_bench.py": ["scripts/cluster_bench.py"],
    # Every benchmark (their shape: testkit/bench.py).
    **{
        f"scripts/{bench.name}": [f"scripts/{bench.name}"]
        for bench in sorted((ROOT / "scripts").glob("bench_*.py"))
    },
    "scripts/monitoring.py": ["scripts/monitoring.py"],
}


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


def _run_as_main(target: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """Run ``target`` (``-m:module`` or a script's path) as ``__main__`` with ``argv``, as
    ``python`` would, in this process; its exit code. The ``__main__`` module is run afresh
    (runpy warns about one already imported); sys.modules and sys.path are put back after."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        if target.startswith("-m:"):
            module = target[3:]
            monkeypatch.delitem(sys.modules, module + ".__main__", raising=False)
            monkeypatch.setattr(sys, "argv", [module, *argv])
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            monkeypatch.setattr(sys, "argv", [target, *argv])
            runpy.run_path(str(ROOT / target), run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _parser_actions(parser: argparse.ArgumentParser) -> dict[str, object]:
    actions = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        hidden = a.help == argparse.SUPPRESS
        actions.append(
            {
                "options": a.option_strings,
                "dest": a.dest,
                "help": None if hidden else a.help,
                "hidden": hidden,
            }
        )
    return {"prog": parser.prog, "actions": actions}


@pytest.mark.parametrize("name", PYTHON)
def test_python_command_help(name, monkeypatch, capsys):
    target, *rest = PYTHON[name]
    parsers: list[dict[str, object]] = []
    original = argparse.ArgumentParser.parse_known_args

    def spy(self, args=None, namespace=None):
        parsers.append(_parser_actions(self))
        return original(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", spy)
    code = _run_as_main(target, [*rest, "--help"], monkeypatch)
    out = capsys.readouterr()
    assert code == 0, out.err
    shown = parsers[-1]  # the parser that printed the help
    assert shown["prog"] in out.out
    for parser in parsers:
        for action in parser["actions"]:
            if action["hidden"]:
                continue
            label = "/".join(action["options"]) or action["dest"]
            assert action["help"], f"{parser['prog']}: {label} has no help text"
    for action in shown["actions"]:
        for option in action["options"]:
            if not action["hidden"]:
                assert option in out.out, f"{name} --help does not mention {option}"
    if name.startswith("scripts/bench_"):
        assert "Exit status" in out.out, f"{name} --help does not end with its exit statuses"


def test_python_simulator_names_itself(monkeypatch, capsys):
    assert _run_as_main("-m:simulator", ["--help"], monkeypatch) == 0
    assert capsys.readouterr().out.startswith("usage: python -m simulator")


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
