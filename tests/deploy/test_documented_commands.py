"""Every command README.md and docs/*.md show works as written, with their example files.

The test reads the documents, finds every command in them (code blocks and inline code that
starts like a command) and looks each up in ``COMMANDS``, which says how it is checked:

- ``RUN``: run here, as written, from a scratch directory holding ``scripts/`` and ``examples/``
  (so outputs land there, and the command is proven to work outside the repository); exit 0.
- ``SERVE``: a server: started as written, probed on ``/readyz`` until ready, then stopped with
  SIGTERM; exit 0. The one change: the example config's listen ports are swapped for free ones,
  so parallel test runs on one machine do not collide.
- ``PARSE``: needs what a test machine lacks (a cluster, root, a built guest image): its flags
  are parsed by the command's own parser, and the files it names must exist.
- ``ELSEWHERE``: run end to end by another test, named here, which must exist.
- ``MENTION``: a tool or module named in prose, not a command line to type; the reason is noted.

A command in the documents that is not in ``COMMANDS`` fails the test (say how to check it);
an entry no document shows any more fails too. So a document cannot drift from the code.
"""

from __future__ import annotations

import enum
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from testkit.manifests import ROOT
from testkit.ports import free_port

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# How a command starts; anything in backticks that starts otherwise is prose.
_STARTS = (
    "scripts/",
    "kind/",
    ".venv/bin/",
    "python -m",
    "scheduler-extender ",
    "autoscaler-agent ",
    "kubectl ",
    "VM_NAME=",
    "vm_image/build.sh",
    "curl ",
)


class How(enum.Enum):
    RUN = "run"
    SERVE = "serve"
    PARSE = "parse"
    ELSEWHERE = "elsewhere"
    MENTION = "mention"


def _parse_extender(argv: list[str]) -> None:
    from scheduler_extender.__main__ import parse_args

    parse_args(argv)


def _parse_run(argv: list[str]) -> None:
    """``scripts/run ARGS`` is ``vm-simulator`` (without any, or ``simulate ARGS``), else
    ``scheduler-extender ARGS``."""
    if not argv or argv[0] == "simulate":
        from simulator.cli import build_parser

        build_parser().parse_args(argv[1:])
    else:
        _parse_extender(argv)


def _parse_agent(argv: list[str]) -> None:
    from autoscaler_agent.__main__ import build_parser

    build_parser().parse_args(argv)


def _parse_local_bench(argv: list[str]) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("local_bench", ROOT / "scripts/local_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["local_bench"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["local_bench"]
    module.parse_args(argv)


def _parse_vm_runner(argv: list[str]) -> None:
    from vm_runner.cli import make_parser

    make_parser().parse_args(argv)


def _parse_watch_vcpus(argv: list[str]) -> None:
    result = subprocess.run(
        [str(ROOT / "scripts/watch-vcpus"), *argv, "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def _script_exists(argv: list[str]) -> None:
    """Shell scripts for a cluster: they parse; their own tests are in test_scripts.py."""


# command as documented -> (how, detail): for PARSE the parser and the argv after the program;
# for ELSEWHERE the test that runs it; for RUN/SERVE nothing.
COMMANDS: dict[str, tuple[How, object]] = {
    "scripts/run": (How.RUN, None),
    "scripts/run simulate examples/scenarios/burst.yaml": (How.RUN, None),
    "scripts/run --config examples/standalone-config.yaml --standalone "
    "examples/standalone-cluster.yaml": (How.SERVE, None),
    "scripts/run --kubeconfig PATH --config FILE": (How.PARSE, _parse_run),
    "scripts/test": (How.ELSEWHERE, ".ci/run"),
    "scripts/test --bench -n 0": (How.ELSEWHERE, ".ci/run"),
    "scripts/test --node -n 0": (How.ELSEWHERE, ".ci/run"),
    "scripts/kube-bin ../shared/kube-bin": (How.ELSEWHERE, "scripts/test"),
    "scripts/setup": (How.RUN, None),
    "scripts/run-bench.sh --local --help": (How.RUN, None),
    "scripts/run-bench.sh --local": (How.ELSEWHERE, "tests/e2e/test_local_bench.py"),
    "VM_NAME=pg-vm-1 scripts/run-bench.sh --local --duration 120 --clients 16": (
        How.PARSE,
        _parse_local_bench,
    ),
    "VM_NAME=pg-vm scripts/run-bench.sh": (How.ELSEWHERE, "tests/node/test_deploy.py"),
    "scripts/run-bench.sh": (How.ELSEWHERE, "tests/node/test_deploy.py"),
    "vm_image/build.sh minimal": (How.ELSEWHERE, "tests/vm/test_image.py"),
    "vm_image/build.sh postgres": (How.ELSEWHERE, "tests/vm/test_image.py"),
    "vm_image/build.sh full": (How.PARSE, None),
    ".venv/bin/python -m vm_runner --kernel vm_image/build/minimal/vmlinuz --initrd "
    "vm_image/build/minimal/initramfs.cpio.gz --min-vcpus 1 --max-vcpus 4 --memory 512Mi "
    "--accel auto --qmp-socket /tmp/vm/qmp.sock --forward 19100:9100": (
        How.PARSE,
        _parse_vm_runner,
    ),
    "curl -s 127.0.0.1:19100/metrics | grep -c 'node_cpu_seconds_total{cpu=.*mode=\"idle\"'": (
        How.ELSEWHERE,
        "tests/vm/test_boot.py",
    ),
    ".venv/bin/pytest tests/e2e -s": (How.ELSEWHERE, "tests/e2e/test_guest_scaling.py"),
    "python -m vm_runner": (How.PARSE, None),
    "kind/up.sh": (How.PARSE, _script_exists),
    "kind/down.sh": (How.PARSE, _script_exists),
    "kubectl apply -k manifests/": (How.ELSEWHERE, "tests/deploy/test_kustomize.py"),
    "kubectl apply -k manifests/examples": (How.ELSEWHERE, "tests/deploy/test_kustomize.py"),
    "kubectl apply -k manifests/examples/": (How.ELSEWHERE, "tests/deploy/test_kustomize.py"),
    "kubectl apply -k manifests/examples/double/": (
        How.ELSEWHERE,
        "tests/deploy/test_kustomize.py",
    ),
    "kubectl get vm": (How.ELSEWHERE, "tests/node/test_deploy.py"),
    # The migration's status fields its printer columns show (phase, nodes, times).
    "kubectl get vmm": (How.ELSEWHERE, "tests/controlplane/test_virtualmachines.py"),
    "kubectl -n vm-autoscaling port-forward pod/LEADER 10298:10298": (
        How.ELSEWHERE,
        "tests/deploy/test_manifests.py",
    ),
    "kubectl -n vm-autoscaling get pods,lease": (
        How.MENTION,
        "an alert's runbook: what to look at",
    ),
    "kubectl taint node NODE vm-autoscaling.io/draining=manual:NoSchedule": (
        How.ELSEWHERE,
        "tests/node/test_drain.py",
    ),
    "kubectl taint node NODE vm-autoscaling.io/draining-": (
        How.ELSEWHERE,
        "tests/node/test_drain.py",
    ),
    "kubectl describe node": (How.MENTION, "an alert's runbook: which pods hold a node"),
    "scripts/monitoring.py": (How.ELSEWHERE, "tests/deploy/test_monitoring.py"),
    "kubectl -n vm-autoscaling get pod -l vm-autoscaling.io/extender-role=leader": (
        How.ELSEWHERE,
        "tests/controlplane/test_failover.py",
    ),
    # The same binding, made through the real API server: a ServiceAccount bound to the
    # ClusterRole reads /metrics, another gets 403.
    "kubectl create clusterrolebinding prometheus-vm-autoscaling-metrics"
    " --clusterrole=vm-autoscaling-metrics-reader --serviceaccount=monitoring:prometheus": (
        How.ELSEWHERE,
        "tests/controlplane/test_api.py",
    ),
    "scripts/watch-vcpus": (How.PARSE, _parse_watch_vcpus),
    "scripts/watch-vcpus --once": (How.PARSE, _parse_watch_vcpus),
    "scripts/watch-vcpus --url http://127.0.0.1:10298/state": (How.PARSE, _parse_watch_vcpus),
    "scripts/run --help": (How.RUN, None),
    "scripts/test --help": (How.RUN, None),
    "autoscaler-agent --help": (How.PARSE, _parse_agent),
    ".venv/bin/autoscaler-agent --config AGENT.yaml --standalone VMS.yaml": (
        How.PARSE,
        _parse_agent,
    ),
    "scheduler-extender serve --standalone": (How.ELSEWHERE, "tests/e2e/test_local_bench.py"),
    "autoscaler-agent --standalone": (How.ELSEWHERE, "tests/e2e/test_local_bench.py"),
    "scripts/bench_memory.py": (
        How.MENTION,
        "a benchmark that boots a guest (minutes); test_help.py checks its --help",
    ),
    "scripts/bench_memory_online.py": (
        How.MENTION,
        "a benchmark that boots a guest per policy (minutes); test_help.py checks its --help",
    ),
    "kubectl describe": (How.MENTION, "where Events show up"),
    "kubectl port-forward": (How.MENTION, "how the loopback verbs port is reached"),
    "kubectl kustomize": (How.MENTION, "what test_kustomize.py also runs when installed"),
    "scheduler-extender recommend SNAPSHOT": (How.PARSE, _parse_extender),
    "scheduler-extender recommend examples/snapshots/basic.yaml --diagnostics summary": (
        How.RUN,
        None,
    ),
    "scheduler-extender recommend examples/snapshots/basic.yaml": (How.RUN, None),
    "scheduler-extender recommend SNAPSHOT --scale-down [--config FILE]": (
        How.ELSEWHERE,
        "tests/recommender/test_cli.py",
    ),
    "scheduler-extender recommend SNAPSHOT [--config FILE] [--diagnostics full\\|summary]": (
        How.ELSEWHERE,
        "tests/recommender/test_cli.py",
    ),
    "scheduler-extender recommend cluster.yaml --config extender.yaml --diagnostics full": (
        How.PARSE,
        _parse_extender,
    ),
    "scheduler-extender recommend snapshot.yaml --config config.yaml": (
        How.ELSEWHERE,
        "tests/recommender/test_doc.py",
    ),
    "kubectl exec": (How.MENTION, "how the loopback verbs port is reached"),
    "scripts/kube-bin": (How.ELSEWHERE, "tests/deploy/test_scripts.py"),
    "scripts/bench_attacks.py": (How.ELSEWHERE, "tests/bench/test_benchmarks_run.py"),
    "scripts/bench_scheduling.py": (How.ELSEWHERE, "tests/bench/test_benchmarks_run.py"),
    "scripts/bench_recommend_hotpath.py": (How.ELSEWHERE, "tests/bench/test_benchmarks_run.py"),
    "scripts/bench_failover.py": (
        How.MENTION,
        "a benchmark of minutes through the control plane; test_help.py checks its --help",
    ),
    "scripts/floor_extender/main.go": (
        How.MENTION,
        "the floor extender's source; bench_scheduling.py --floor builds and runs it",
    ),
    "scripts/floor_extender/floor.py": (
        How.ELSEWHERE,
        "tests/bench/test_benchmarks_run.py",  # bench_scheduling.py --python-floor runs it
    ),
    "curl -s -H 'Content-Type: application/yaml' --data-binary @cluster.yaml "
    "http://127.0.0.1:10298/v1/recommend": (How.ELSEWHERE, "tests/recommender/test_http.py"),
}

# Commands documented with a body too long to repeat here: matched by how they start.
PREFIXES: dict[str, tuple[How, object]] = {
    "curl -s -XPOST 127.0.0.1:10298/filter ": (How.ELSEWHERE, "tests/deploy/test_api_doc.py"),
    "curl -s -XPOST 127.0.0.1:10299/v1/permits ": (
        How.ELSEWHERE,
        "tests/deploy/test_api_doc.py",
    ),
    "curl -s -XPOST 127.0.0.1:10299/v1/moves ": (How.ELSEWHERE, "tests/extender/test_moves.py"),
    "curl -s -XPOST --data-binary @examples/snapshots/basic.yaml ": (
        How.ELSEWHERE,
        "tests/recommender/test_scale_down.py",
    ),
    "curl -s -XPOST '127.0.0.1:10298/v1/recommend?": (
        How.ELSEWHERE,
        "tests/deploy/test_api_doc.py",
    ),
}


def _commands_in(text: str) -> list[str]:
    found: list[str] = []
    for block in re.finditer(r"```(\w*)\n(.*?)```", text, re.S):
        if block[1] not in ("sh", "bash"):
            continue  # diagrams and sample output
        joined = block[2].replace("\\\n", " ")
        pending = ""
        for raw in joined.splitlines():
            pending = f"{pending} {raw}" if pending else raw
            try:
                shlex.split(pending)
            except ValueError:
                continue  # a quoted argument goes on over the next line
            line = re.sub(r"\s+#[^'\"]*$", "", pending).strip()
            pending = ""
            if line.startswith(_STARTS) or line in ("scripts/run", "scripts/test"):
                found.append(" ".join(line.split()))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for code in re.findall(r"`([^`\n]+)`", prose):
        span = " ".join(code.split())
        if (span.startswith(_STARTS) or span in ("scripts/run", "scripts/test")) and not (
            span.endswith("/") and " " not in span
        ):
            found.append(span)
    return found


def _documented() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for doc in DOCUMENTS:
        for command in _commands_in(doc.read_text()):
            out.setdefault(command, []).append(str(doc.relative_to(ROOT)))
    return out


DOCUMENTED = _documented()


def _by_prefix(command: str) -> str | None:
    return next((p for p in PREFIXES if command.startswith(p)), None)


def test_every_documented_command_is_checked():
    unchecked = sorted(c for c in set(DOCUMENTED) - set(COMMANDS) if _by_prefix(c) is None)
    assert not unchecked, (
        "commands in the docs that no test checks (add them to COMMANDS): "
        + "; ".join(f"{c!r} in {DOCUMENTED[c]}" for c in unchecked)
    )


def test_every_checked_command_is_still_documented():
    stale = sorted(set(COMMANDS) - set(DOCUMENTED))
    assert not stale, f"COMMANDS entries no document shows any more: {stale}"
    unused = sorted(p for p in PREFIXES if not any(c.startswith(p) for c in DOCUMENTED))
    assert not unused, f"PREFIXES no document shows any more: {unused}"


def _workspace(tmp_path: Path) -> Path:
    """A directory outside the repository with scripts/ and examples/ as a user's clone has."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "scripts").symlink_to(ROOT / "scripts")
    shutil.copytree(ROOT / "examples", work / "examples")
    return work


def _argv(command: str) -> tuple[list[str], dict[str, str]]:
    words = shlex.split(command)
    env = dict(os.environ)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return words, env


def _ids(how: How) -> list[str]:
    return [c for c, (h, _) in COMMANDS.items() if h is how]


@pytest.mark.parametrize("command", _ids(How.RUN))
def test_runs_as_written(command, tmp_path):
    work = _workspace(tmp_path)
    argv, env = _argv(command)
    # As after scripts/setup with the virtualenv active: its commands are on PATH.
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, check=False, cwd=work, env=env
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for written in re.findall(r"^(?:report|plot):\s+(\S+)$", result.stdout, re.M):
        assert (work / written).is_file(), f"{written} printed but not written under {work}"


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.parametrize("command", _ids(How.SERVE))
def test_serves_as_written(command, tmp_path):
    work = _workspace(tmp_path)
    argv, env = _argv(command)
    config_path = work / argv[argv.index("--config") + 1]
    config = yaml.safe_load(config_path.read_text())
    verbs = free_port()
    for name, port in (("verbs", verbs), ("permits", free_port())):
        config["listen"][name]["port"] = port  # the only change to the example
    config_path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120  # generous: a busy 2-core machine, a fresh .venv
        while not _ready(f"http://127.0.0.1:{verbs}/readyz"):
            assert process.poll() is None, process.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-2000:]


@pytest.mark.parametrize("command", _ids(How.PARSE))
def test_parses_and_names_existing_files(command):
    argv, _ = _argv(command)
    program = argv[0]
    if program.startswith(("scripts/", "kind/", "vm_image/")):
        assert (ROOT / program).is_file(), program
        assert os.access(ROOT / program, os.X_OK), program
    for word in argv[1:]:
        if word.startswith(("examples/", "manifests/")):
            assert (ROOT / word).exists(), word
    parse: Callable[[list[str]], None] | None = COMMANDS[command][1]  # type: ignore[assignment]
    if parse is None:
        return
    rest = argv[1:]
    if program == ".venv/bin/python":
        rest = rest[2:]  # -m vm_runner
    if program == "scripts/run-bench.sh":
        rest = rest[1:]  # --local
    try:
        parse(rest)
    except SystemExit as e:  # --help exits 0 once printed; a bad flag exits 2
        assert e.code == 0, f"{command!r}: the parser refused it"


@pytest.mark.parametrize("command", _ids(How.MENTION))
def test_mentions_name_what_exists(command):
    program = shlex.split(command)[0]
    if "/" in program:
        assert (ROOT / program).is_file(), program
    assert COMMANDS[command][1], f"{command!r}: say why it is only a mention"


@pytest.mark.parametrize("command", [*_ids(How.ELSEWHERE), *PREFIXES])
def test_checked_elsewhere(command):
    where = (COMMANDS.get(command) or PREFIXES[command])[1]
    assert isinstance(where, str)
    assert (ROOT / where).is_file(), f"{command!r} is said to be checked by {where}, missing"


def test_run_simulate_from_outside_the_repository(tmp_path):
    """``scripts/run simulate mine.yaml`` from the user's own directory, no repo around it."""
    mine = tmp_path / "mine.yaml"
    mine.write_text((ROOT / "examples/scenarios/steady.yaml").read_text())
    result = subprocess.run(
        [str(ROOT / "scripts/run"), "simulate", "mine.yaml", "--no-plot"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "report: out/simulate/steady.json" in result.stdout
    assert (tmp_path / "out/simulate/steady.json").is_file()
