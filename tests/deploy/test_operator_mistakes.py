"""Every operator mistake ends both services with one line on stderr and its own exit code.

In process, through each service's ``main(argv)`` (what the console scripts call), with real
files and real sockets: a port we hold, a loopback port nobody listens on. One real process
per service (``python -m ...``) checks the wiring: its ``--help`` and a mistake, one line, no
traceback. The codes are ``observability.exits.ExitCode``; each ``--help`` lists them.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import structlog

from autoscaler_agent.__main__ import main as agent_main
from observability.exits import ExitCode
from scheduler_extender.__main__ import main as extender_main
from testkit.manifests import ROOT
from testkit.ports import free_port

SERVICES = {"extender": "scheduler_extender", "agent": "autoscaler_agent"}
MAINS: dict[str, Callable[[list[str]], int]] = {"extender": extender_main, "agent": agent_main}


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.pop("KUBECONFIG", None)
    env["NODE_NAME"] = "node-a"
    return env


@pytest.fixture
def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., Result]:
    """``run(service, *argv)``: the service's ``main`` in this process, in the environment a
    process would get from ``_env``, from the repository's root; its exit code and output."""
    for key in list(os.environ):
        if key.startswith("KUBERNETES_"):
            monkeypatch.delenv(key)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("NODE_NAME", "node-a")
    monkeypatch.chdir(ROOT)

    def run(service: str, *argv: str) -> Result:
        capsys.readouterr()
        try:
            code = MAINS[service](list(argv))
        except SystemExit as e:  # argparse: --help, a bad flag
            code = e.code if isinstance(e.code, int) else 1
        finally:
            structlog.contextvars.clear_contextvars()  # main binds the node
        out = capsys.readouterr()
        return Result(returncode=code, stdout=out.out, stderr=out.err)

    return run


def _process(service: str, *argv: str) -> Result:
    done = subprocess.run(
        [sys.executable, "-m", SERVICES[service], *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=_env(),
    )
    return Result(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)


def _one_line(result: Result, code: ExitCode, *needles: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another process (this test) is listening on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def agent_config(tmp_path: Path) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"http: {{host: 127.0.0.1, port: {free_port()}}}\n")
    return path


def _args(service: str, agent_config: Path) -> list[str]:
    """The flags each service needs besides the one under test."""
    return ["--config", str(agent_config)] if service == "agent" else []


def _kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    return path


@pytest.mark.parametrize("service", SERVICES)
def test_missing_kubeconfig(run, service, tmp_path, agent_config):
    missing = tmp_path / "nope"
    result = run(service, *_args(service, agent_config), "--kubeconfig", str(missing))
    _one_line(result, ExitCode.KUBECONFIG, str(missing), "cannot read")


@pytest.mark.parametrize(
    ("text", "needle"),
    [("{}\n", "current-context"), ("clusters: [\n", "not a valid kubeconfig")],
    ids=["no-context", "bad-yaml"],
)
@pytest.mark.parametrize("service", SERVICES)
def test_invalid_kubeconfig(run, service, tmp_path, agent_config, text, needle):  # noqa: PLR0917
    bad = tmp_path / "kubeconfig"
    bad.write_text(text)
    result = run(service, *_args(service, agent_config), "--kubeconfig", str(bad))
    _one_line(result, ExitCode.KUBECONFIG, str(bad), needle)


@pytest.mark.parametrize("service", SERVICES)
def test_outside_a_cluster_without_kubeconfig(run, service, agent_config):
    result = run(service, *_args(service, agent_config))
    _one_line(result, ExitCode.NOT_IN_CLUSTER, "--kubeconfig")


@pytest.mark.parametrize("service", SERVICES)
def test_unreachable_api_server(run, service, tmp_path, agent_config):
    port = free_port()  # nothing listens there: connection refused
    kubeconfig = _kubeconfig(tmp_path, f"https://127.0.0.1:{port}")
    result = run(service, *_args(service, agent_config), "--kubeconfig", str(kubeconfig))
    _one_line(result, ExitCode.API_UNREACHABLE, f"127.0.0.1:{port}")


class _Refuses(http.server.BaseHTTPRequestHandler):
    """An API server that refuses every credential, as a real one does a wrong token."""

    def do_GET(self) -> None:
        body = b'{"kind":"Status","status":"Failure","reason":"Unauthorized","code":401}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_api_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("service", SERVICES)
def test_credentials_refused(run, service, tmp_path, agent_config, refusing_api_server):
    kubeconfig = _kubeconfig(tmp_path, refusing_api_server)
    result = run(service, *_args(service, agent_config), "--kubeconfig", str(kubeconfig))
    _one_line(result, ExitCode.KUBECONFIG, "refused the credentials", str(kubeconfig))


def _serve_extender(run, tmp_path, verbs_host, verbs_port, permits_port):
    """``serve --standalone`` with the listeners given; its result and config file."""
    config = tmp_path / "extender.yaml"
    config.write_text(
        "auth: {mode: static, static_token: t}\n"
        f"listen: {{verbs: {{host: {verbs_host}, port: {verbs_port}}},"
        f" permits: {{host: 127.0.0.1, port: {permits_port}}}}}\n"
    )
    cluster = ROOT / "examples" / "standalone-cluster.yaml"
    result = run(
        "extender", "--config", str(config), "--standalone", str(cluster), "--log-level", "error"
    )
    return result, config


@pytest.mark.parametrize("held", ["verbs", "permits"])
def test_extender_port_in_use(run, tmp_path, held_port, held):
    # The main process binds the permit port too, before it starts the permit front.
    ports = {"verbs": free_port(), "permits": free_port(), held: held_port}
    result, config = _serve_extender(run, tmp_path, "127.0.0.1", ports["verbs"], ports["permits"])
    _one_line(result, ExitCode.PORT_IN_USE, f"127.0.0.1:{held_port}", f"listen.{held}", str(config))


def test_extender_host_that_does_not_resolve(run, tmp_path):
    result, config = _serve_extender(
        run, tmp_path, "no-such-host.invalid", free_port(), free_port()
    )
    _one_line(result, ExitCode.PORT_IN_USE, "no-such-host.invalid", "listen.verbs", str(config))


def test_agent_port_in_use(run, tmp_path, held_port):
    config = tmp_path / "agent.yaml"
    config.write_text(f"http: {{host: 127.0.0.1, port: {held_port}}}\nlog: {{level: error}}\n")
    vms = tmp_path / "vms.yaml"
    vms.write_text("vms: []\n")
    result = run("agent", "--config", str(config), "--standalone", str(vms))
    _one_line(result, ExitCode.PORT_IN_USE, f"127.0.0.1:{held_port}", str(config))


def test_agent_checks_its_kubeconfig_before_binding_its_port(run, tmp_path, held_port):
    """With its port taken and a bad kubeconfig the agent names the kubeconfig: it never
    reached the bind (it would have said 'cannot listen', exit 7)."""
    config = tmp_path / "agent.yaml"
    config.write_text(f"http: {{host: 127.0.0.1, port: {held_port}}}\n")
    result = run("agent", "--config", str(config), "--kubeconfig", str(tmp_path / "nope"))
    _one_line(result, ExitCode.KUBECONFIG, "kubeconfig")


@pytest.mark.parametrize("service", SERVICES)
def test_missing_config_file(run, service, tmp_path):
    missing = tmp_path / "missing.yaml"
    result = run(service, "--config", str(missing))
    _one_line(result, ExitCode.CONFIG, str(missing))


@pytest.mark.parametrize("service", SERVICES)
def test_bad_yaml_names_the_real_file(run, service, tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("listen: {verbs: [\n")
    line = _one_line(run(service, "--config", str(bad)), ExitCode.CONFIG, str(bad), "line 2")
    assert "<unicode string>" not in line and "<byte string>" not in line


@pytest.mark.parametrize("service", SERVICES)
def test_invalid_config_names_the_path(run, service, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("nonsense_key: 1\n")
    _one_line(run(service, "--config", str(bad)), ExitCode.CONFIG, str(bad), "nonsense_key")


@pytest.mark.parametrize("service", SERVICES)
def test_bad_flag(run, service, agent_config):
    result = run(service, *_args(service, agent_config), "--no-such-flag")
    _one_line(result, ExitCode.USAGE, "--no-such-flag", "--help")


def test_standalone_extender_with_tokenreview_auth(run, tmp_path):
    """The mistake the README's old command made: standalone needs auth.mode static."""
    config = tmp_path / "extender.yaml"
    config.write_text(f"listen: {{verbs: {{host: 127.0.0.1, port: {free_port()}}}}}\n")
    cluster = ROOT / "examples" / "standalone-cluster.yaml"
    result = run("extender", "--config", str(config), "--standalone", str(cluster))
    _one_line(result, ExitCode.CONFIG, "auth.mode static")


@pytest.mark.parametrize("service", SERVICES)
def test_help_lists_the_exit_codes(run, service):
    result = run(service, "--help")
    assert result.returncode == 0, result.stderr
    for code in ExitCode:
        assert f"\n  {int(code)}  " in result.stdout, code


@pytest.mark.parametrize("service", SERVICES)
def test_a_real_process_answers_help_and_a_mistake_in_one_line(service, tmp_path):
    """The console script's wiring, once per service: ``python -m`` exits with ``main``'s code,
    and a mistake is one line with no traceback from the process itself."""
    shown = _process(service, "--help")
    assert shown.returncode == 0, shown.stderr
    assert f"\n  {int(ExitCode.CONFIG)}  " in shown.stdout
    missing = tmp_path / "missing.yaml"
    _one_line(_process(service, "--config", str(missing)), ExitCode.CONFIG, str(missing))
