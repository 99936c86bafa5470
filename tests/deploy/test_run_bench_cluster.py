"""``VM_NAME=... scripts/run-bench.sh`` (the cluster path) against a fake ``kubectl``.

There is no cluster here, so ``kubectl`` is a script on PATH that plays one: the VM pod exists
and runs, ``port-forward`` serves a ``/state`` whose VM size a file decides, and ``run`` (the
pgbench pod) grows the VM in that file, prints pgbench's summary and, if told to, shrinks it.
What is tested is the script's own logic: the defaults it passes to pgbench match the postgres
guest image, the verdict line, and the exit status (0 grew and shrank, 3 did not shrink, 1 when
PostgreSQL never became ready).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from testkit.manifests import ROOT
from testkit.ports import free_port

_STATE_SERVER = r"""
import http.server, json, sys
port, state_file = int(sys.argv[1]), sys.argv[2]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        vcpus = int(open(state_file).read())
        if self.path == "/metrics":  # the agent's, for the plot
            body = f'vmautoscale_agent_vm_current_vcpus{{vm="default/pg-vm-0"}} {vcpus}\n'.encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
            return
        body = json.dumps({"nodes": [{"name": "w1", "free": {"cpuMillis": (4 - vcpus) * 1000},
            "allocations": [{"pod": "default/pg-vm-0", "resources": {"cpuMillis": vcpus * 1000},
                             "vm": {"vcpus": vcpus, "minVcpus": 1, "maxVcpus": 4}}]}]}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

_KUBECTL = r"""#!/usr/bin/env bash
# A fake kubectl for scripts/run-bench.sh's cluster path (tests/deploy/test_run_bench_cluster.py).
echo "kubectl $*" >> "$FAKE_DIR/calls.log"
args=" $* "
case "$args" in
  *" port-forward "*)
    port="${args#* port-forward * }"; port="${port%%:*}"
    exec python3 "$FAKE_DIR/state_server.py" "$port" "$FAKE_DIR/vcpus" ;;
  *"vm-autoscaling\.io/vm"*) echo true ;;
  *"extender-role=leader"*) echo pod/scheduler-extender-0 ;;
  *" wait "*) ;;
  *"podIP"*) echo 10.1.2.3 ;;
  *"jsonpath={.spec.nodeName}"*) echo w1 ;;
  *"hypervisor}"*) echo "qmp+qga:///run/vm-autoscaling/default/pg-vm-0/qmp.sock" ;;
  *"autoscaler-agent"*"spec.nodeName=w1"*) echo pod/autoscaler-agent-x ;;
  *" run "*)
    for a in "$@"; do case "$a" in --env=*) echo "${a#--env=}" ;; esac; done > "$FAKE_DIR/pod.env"
    if [ "$FAKE_PG_READY" != 1 ]; then
      echo "run-bench: PostgreSQL in the VM did not accept connections within 300s" >&2
      exit 10
    fi
    echo 3 > "$FAKE_DIR/vcpus"
    echo "pgbench-starts"
    sleep 1.5   # the script's watch samples /state every WATCH_INTERVAL (1) s
    echo "tps = 123.4 (without initial connection time)"
    [ "$FAKE_SHRINK" = 1 ] && echo 1 > "$FAKE_DIR/vcpus"
    exit 0 ;;
  *" delete "*) ;;
  *) echo "fake kubectl: unexpected: $*" >&2; exit 99 ;;
esac
"""


def _run_bench(tmp_path: Path, *, pg_ready: bool, shrink: bool) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(_KUBECTL)
    kubectl.chmod(0o755)
    (tmp_path / "state_server.py").write_text(_STATE_SERVER)
    (tmp_path / "vcpus").write_text("1")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "FAKE_PG_READY": "1" if pg_ready else "0",
        "FAKE_SHRINK": "1" if shrink else "0",
        "VM_NAME": "pg-vm-0",
        "STATE_PORT": str(free_port()),
        "AGENT_PORT": str(free_port()),
        "OUT": str(tmp_path / "out"),
        "COOLDOWN": "3",
        "WATCH_INTERVAL": "1",
    }
    for name in ("PGUSER", "PGDATABASE", "PGPASSWORD", "SCALE", "BUILTIN"):
        env.pop(name, None)
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "run-bench.sh")],
        capture_output=True, text=True, timeout=60, check=False, env=env, cwd=ROOT,
    )  # fmt: skip


def test_grows_and_shrinks_gives_a_verdict_and_uses_the_image_credentials(tmp_path):
    result = _run_bench(tmp_path, pg_ready=True, shrink=True)
    assert result.returncode == 0, result.stderr
    verdict = result.stderr.strip().splitlines()[-1]
    assert "default/pg-vm-0: grew to 3 (permitted vCPUs), pgbench 123.4 tps" in verdict
    assert "shrank to 1 in" in verdict
    # The postgres guest's role, password and database; no re-initialisation by default.
    pod_env = (tmp_path / "pod.env").read_text().splitlines()
    assert "PGUSER=bench" in pod_env
    assert "PGPASSWORD=bench" in pod_env
    assert "PGDATABASE=pgbench" in pod_env
    assert "BUILTIN=select-only" in pod_env
    assert "SCALE=" in pod_env
    # The pgbench pod is removed on exit.
    assert " delete pod pgbench-pg-vm-0 " in (tmp_path / "calls.log").read_text()
    # The plot, as the local path draws it, from samples of the agent on the VM's node and of
    # the extender's ledger.
    assert f"==> plot {tmp_path / 'out' / 'bench.png'}" in result.stderr
    assert (tmp_path / "out" / "bench.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    samples = json.loads((tmp_path / "out" / "bench.json").read_text())["samples"]
    assert {s["phase"] for s in samples} >= {"load", "cool"}
    assert max(s["vcpus"] or 0 for s in samples) == 3
    assert max(s["reserved_after"] or 0 for s in samples) == 3
    assert " port-forward pod/autoscaler-agent-x " in (tmp_path / "calls.log").read_text()


def test_a_vm_that_does_not_shrink_back_exits_3(tmp_path):
    result = _run_bench(tmp_path, pg_ready=True, shrink=False)
    assert result.returncode == 3, result.stderr
    assert "grew to 3" in result.stderr
    assert "DID NOT SHRINK within 3s" in result.stderr


def test_postgresql_never_ready_is_one_clear_failure(tmp_path):
    result = _run_bench(tmp_path, pg_ready=False, shrink=True)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("run-bench: PostgreSQL in default/pg-vm-0 (10.1.2.3:5432) did not")
    assert "within 300s (PG_WAIT)" in last
    assert "postgres guest image" in last
