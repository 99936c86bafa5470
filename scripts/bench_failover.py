"""Benchmark (not a test): how long VMs wait when the scheduler pod dies, with a hot standby
and with one replica restarted, in the same run.

Real etcd, kube-apiserver and kube-scheduler v1.36 (``$VMA_KUBE_BIN``, or unpacked from
``../shared/kube-bin``), the real ``scheduler-extender`` under the manifests' ServiceAccount
and configs (``testkit/pairs.py``). Each round, per mode, with the same load: VMs
bound and growing (agents ask for permits without pause), new VMs created every round of
asks (up to 40, so some are always pending); then
the pod whose extender leads is SIGKILLed (both containers), and the clock starts.

* ``standby``: two pods with leader election (kube-scheduler's Lease, then the extender's
  own), timed as deployed (``--lease-seconds``, default 15; renew deadline and retry scaled
  as kube-scheduler's 15/10/2). Nothing is restarted: the standby takes over.
* ``restart``: one pod, no leader election, started again at once: the best case of a
  single replica (a kubelet restarting the containers in place, with no back-off; a lost
  node would add the new pod's scheduling, image pull and start).
* ``inplace``: two pods, but only the leader's extender dies and is restarted in place (a
  crash the kubelet restarts): it finds its own pod's name on the Lease and leads again at
  once, without waiting for the standby.

Per round: ``leads_s`` (the standby's ``/readyz`` says it decides; for ``restart``, ready
again), ``first_bind_s`` (the first VM bound after the kill, seen on the API),
``bind_after_lead_s`` (the two apart: what the new leader's first bind costs beyond taking
over), ``first_grant_s`` (the first permit that grows a VM, answered after the kill) and
``binds_409`` (the extenders' own Bindings refused with 409 Conflict in the round, from their
logs: each one costs its pod kube-scheduler's back-off). Prints one JSON object with every
round, the medians and the ranges (min, max).

    .venv/bin/python scripts/bench_failover.py [--rounds 3] [--lease-seconds 15]
        [--modes standby,inplace,restart]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testkit import controlplane  # noqa: E402
from testkit.cluster import Names  # noqa: E402
from testkit.controlplane import (  # noqa: E402
    RBAC_KINDS,
    ControlPlane,
    extender_identity,
    pod_path,
    wait_for,
)
from testkit.manifests import MANIFESTS, render  # noqa: E402
from testkit.pairs import (  # noqa: E402
    Agents,
    Leases,
    SchedulerPod,
    iter_bound,
    scheduler_pod,
    wait_leader,
)


def find_binaries() -> Path:
    return controlplane.find_binaries("bench_failover")


def one_round(
    cp: ControlPlane, kubeconfig: Path, work: Path, *, mode: str, leases: Leases, tag: str
) -> dict[str, float]:
    api = cp.admin()
    namespace = f"bench-{tag}"
    api.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    names = Names(api, namespace, group=namespace)
    pods: list[SchedulerPod] = []
    stop = threading.Event()
    try:
        if mode in ("standby", "inplace"):
            for suffix in ("a", "b"):
                pod = scheduler_pod(
                    cp, kubeconfig, work, f"{tag}-{suffix}", leases=leases, quick_backoff=False
                )
                pods.append(pod)
                pod.start()
                wait_leader(pods[:1], timeout_seconds=4 * leases.duration_seconds + 30)
        else:
            pods.append(
                scheduler_pod(cp, kubeconfig, work, f"{tag}-a", leases=None, quick_backoff=False)
            )
            pods[0].start()
        for suffix in ("a", "b"):
            names.node(suffix, cpu="64")
        for i in range(6):
            names.vm(f"vm-{i}", max_vcpus=4)
        for i in range(6):
            names.wait_bound(f"vm-{i}")
        agents = Agents(names)
        for node in names.nodes:
            agents.token(node)
        rng = random.Random(31)
        killed_at = float("inf")

        def load() -> None:
            mine = Names(cp.admin(), namespace, namespace)
            i = 6
            while not stop.is_set():
                if i < 40:
                    mine.vm(f"vm-{i}", max_vcpus=4)
                    i += 1
                for vm in list(iter_bound(names, mine.api)):
                    agents.ask(pods, vm, requested=rng.randint(1, 2), tries=1)
                time.sleep(0.2)
            mine.api.close()

        loader = threading.Thread(target=load)
        loader.start()
        time.sleep(3)
        leader = wait_leader(pods)
        bound_before = {p["metadata"]["name"] for p in iter_bound(names)}
        killed_at = time.monotonic()
        # An answer of the dead leader may still arrive after this; it carries its epoch.
        old_epochs = {g.epoch for g in agents.grants}
        if mode == "inplace":
            leader.extender.stop(sig=signal.SIGKILL)
            leader.extender.start(wait_ready=False)
        else:
            leader.kill()
        if mode == "restart":
            leader.start()
        wait_leader(pods, timeout_seconds=4 * leases.duration_seconds + 60)
        leads = time.monotonic() - killed_at

        def first_bind() -> float | None:
            for pod in api.get(pod_path(namespace))["items"]:
                name = pod["metadata"]["name"]
                if pod["spec"].get("nodeName") and name not in bound_before:
                    return time.monotonic()
            return None

        bind_at: float = wait_for(first_bind, timeout_seconds=120, what="a bind after the kill")

        def first_grant() -> float | None:
            # The new leader's (or the restarted process's) answers carry a new epoch.
            after = [
                g.at
                for g in agents.grants
                if g.at > killed_at and g.grew and g.epoch not in old_epochs
            ]
            return min(after) if after else None

        grant_at: float = wait_for(first_grant, timeout_seconds=120, what="a grant after the kill")
        stop.set()
        loader.join()
        return {
            "leads_s": round(leads, 3),
            "first_bind_s": round(bind_at - killed_at, 3),
            "bind_after_lead_s": round(bind_at - killed_at - leads, 3),
            "first_grant_s": round(grant_at - killed_at, 3),
            "binds_409": sum(conflicted_binds(p) for p in pods),
        }
    finally:
        stop.set()
        for pod in pods:
            pod.stop()
        for pod in api.get(pod_path(namespace))["items"]:
            api.delete(pod_path(namespace, pod["metadata"]["name"]))
        for node in names.nodes:
            api.delete(f"/api/v1/nodes/{node}")
        api.close()


def conflicted_binds(pod: SchedulerPod) -> int:
    """The Bindings ``pod``'s extender sent that the API server refused with 409, from its
    log (JSON lines; every process of the pod appends to the same file)."""
    process = pod.extender.process
    if process is None:
        return 0
    found = 0
    for line in process.log_path.read_text(errors="replace").splitlines():
        if '"bind_failed"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        found += event.get("event") == "bind_failed" and event.get("status") == 409
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each mode (default 3)")
    parser.add_argument(
        "--lease-seconds",
        type=int,
        default=15,
        help="kube-scheduler's and the extender's lease duration (default 15, as deployed;"
        " renew deadline and retry period scale with it)",
    )
    parser.add_argument(
        "--modes",
        default="standby,inplace,restart",
        help="which modes to run, comma-separated (default standby,inplace,restart)",
    )
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = set(modes) - {"standby", "inplace", "restart"}
    if unknown:
        print(f"bench_failover: unknown mode(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    leases = Leases(
        args.lease_seconds, args.lease_seconds * 10 / 15, max(0.2, args.lease_seconds * 2 / 15)
    )
    bin_dir = find_binaries()
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        cp = ControlPlane(bin_dir, Path(tmp) / "cp")
        cp.start()
        try:
            docs = [d for d in render(MANIFESTS) if d["kind"] in RBAC_KINDS]
            kubeconfig = extender_identity(cp, docs)
            for r in range(args.rounds):
                for mode, rounds in results.items():
                    tag = f"r{r}{mode[0]}"
                    work = Path(tmp)
                    found = one_round(cp, kubeconfig, work, mode=mode, leases=leases, tag=tag)
                    print(json.dumps({"mode": mode, **found}), file=sys.stderr)
                    rounds.append(found)
        finally:
            cp.stop()
    out: dict[str, Any] = {
        "lease_seconds": leases.duration_seconds,
        "renew_deadline_seconds": leases.renew_deadline_seconds,
        "retry_seconds": leases.retry_seconds,
        "rounds": args.rounds,
    }
    keys = ("leads_s", "first_bind_s", "bind_after_lead_s", "first_grant_s", "binds_409")
    for mode, rounds in results.items():
        out[mode] = {
            "rounds": rounds,
            "median": {key: statistics.median(r[key] for r in rounds) for key in keys},
            "range": {
                key: [min(r[key] for r in rounds), max(r[key] for r in rounds)] for key in keys
            },
        }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
