"""``scripts/run-bench.sh --local`` end to end, judged from its JSON output and exit status.

It runs exactly as a person would run it (the shell entry point, VM_NAME in the environment):
the postgres guest image (built here, cached after), PostgreSQL filled at boot inside the guest,
pgbench on this machine against the forwarded port, the agent scaling the VM from the guest's
node_exporter only. The load is the guest's own work (every transaction runs in the guest's
PostgreSQL), so what the test asserts is caused by the system's inputs, not by this machine's
load: 8 clients saturate a 1-vCPU guest, which then asks for more vCPUs than the node has room
for; once pgbench stops the guest is idle and returns to its minimum.

One burst, of 12 s: the VM grows a few seconds into the load (the test config's 2 s grow
window, then the permit and the onlining), so 12 s sustain it well past that. What a second
burst showed is shown elsewhere, cheaper: growing the same guest again after a shrink, through
the agent in the runner's online vCPU mode, is ``tests/e2e/test_guest_scaling.py``'s first test
(twice) and its last (30 cycles); the bench's judging of several bursts (one that did not
shrink, a QEMU dying in the second) is ``tests/bench/test_local_bench_verdict.py``'s, from
samples. The bench's default stays 2 bursts for people.

No timing is asserted: the bounds are the bench's own (``--cooldown`` is how long it waits for
the shrink, far beyond the agent's 4 s ``shrink_after_seconds``), and the test's timeout only
catches a hang. A test agent config shortens examples/local/agent.yaml's timings (grow after
2 s, shrink after 4 s, permit retry after 1 s).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from testkit.local_stack import REPO
from tests.support import require_binary

pytestmark = [
    pytest.mark.bench,
    pytest.mark.postgres,
    pytest.mark.qemu,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

AGENT_CONFIG = {
    **yaml.safe_load((REPO / "examples/local/agent.yaml").read_text()),
    "policy": {
        "target_load_per_vcpu": 0.9,
        "shrink_load_per_vcpu": 0.6,
        "grow_after_seconds": 2.0,
        "shrink_after_seconds": 4.0,
    },
    "extender": {"permit_retry_seconds": 1.0},
}


def test_pgbench_in_the_guest_grows_the_vm_then_it_shrinks_back(tmp_path: Path):
    require_binary("qemu-system-x86_64")
    require_binary("pgbench")
    require_binary("pg_isready")
    require_binary("apt-get")  # the image build extracts Debian packages
    require_binary("dpkg-deb")
    agent_config = tmp_path / "agent.yaml"
    agent_config.write_text(yaml.safe_dump(AGENT_CONFIG))
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", str(REPO / "scripts/run-bench.sh"), "--local", "--duration", "12",
         "--bursts", "1", "--clients", "8", "--warmup", "2", "--cooldown", "150",
         "--boot-timeout", "400",
         "--agent-config", str(agent_config), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=880, check=False,
        env={**os.environ, "VM_NAME": "pg-vm-0"},
    )  # fmt: skip
    # 0: grew and shrank back (3 would be the bench's own "did not grow / did not shrink").
    assert result.returncode == 0, f"{result.stderr[-3000:]}\n{result.stdout[-3000:]}"
    report = json.loads((out / "bench.json").read_text())
    samples = report["samples"]
    verdict = report["verdict"]
    assert report["vm"] == "default/pg-vm-0"
    assert report["vcpu_mode"] == "online"
    assert all(burst["tps"] > 0 for burst in report["pgbench"]["bursts"])

    # The live table and the verdict line went to the terminal.
    assert "online" in result.stdout and "node free" in result.stdout
    assert verdict["line"] in result.stderr
    assert "cycles survived 1/1" in verdict["line"]
    assert verdict["cycles_survived"] == 1 and verdict["is_vm_alive"]

    before = [s for s in samples if s["phase"] == "idle"]
    assert before
    assert {s["vcpus"] for s in before} == {1}
    for burst, judged in enumerate(verdict["bursts"], 1):
        during = [s for s in samples if s["phase"] == "load" and s["burst"] == burst]
        after = [s for s in samples if s["phase"] == "cool" and s["burst"] == burst]
        assert during and after, burst
        # Grew under the load, within what the node had room for (4 CPUs, 1 foreign: 3) ...
        peak = max(s["vcpus"] for s in during if s["vcpus"] is not None)
        assert 1 < peak <= 3, burst
        assert judged["grew_to"] == peak, burst
        # ... and came back to the minimum after the load, the permit with it.
        assert after[-1]["vcpus"] == 1, burst
        assert after[-1]["reserved_after"] == 1, burst
        assert judged["shrink_seconds"] is not None, burst
    # The guest onlined what it was given, and the agent timed it (its histogram).
    assert max(s["online"] or 0 for s in samples) >= 2
    assert verdict["latency_count"] >= 1
    assert verdict["latency_p50"] is not None

    # Always within the permit: each vCPU reading is bracketed by two ledger readings (a grow
    # raises the reservation before onlining, a shrink lowers it after offlining).
    beyond = [
        s
        for s in samples
        if s["vcpus"] is not None
        and s["vcpus"] > max(s["reserved_before"] or 0, s["reserved_after"] or 0)
    ]
    assert not beyond, beyond

    plot = Path(report["plot"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(verdict["line"])
