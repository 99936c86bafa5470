"""The tier's overlay of ``manifests/``: what a cluster of 2-CPU nodes needs, and shorter waits.

``manifests/`` stays what users apply (``test_the_system_comes_up_with_kubectl_apply`` applies
it as is); the tests that scale a VM re-apply it through this overlay, built the way an
operator would write one (kustomize patches and a replaced ConfigMap), so what it changes is
written down here and nowhere else:

- no CPU requests on the system pods and no extender reserve: the manifests' pods request 400m
  of a node (420m where the vm-controller runs) and the extender keeps 20% of it for the host,
  so a VM placed at 1 vCPU on a 2-CPU node has 200m to grow into and can never reach 2
  (docs/DEPLOY.md tells small-node operators). The price: at 0 the system pods' CPU weight is
  the minimum, so beside the VM under load they get what the host leaves (the pair on the
  VM's node may lose its Leases to the standby), which the manifests' requests prevent;
- the agent's shrink windows (``policy.shrink_after_seconds`` and
  ``memory.shrink_after_seconds``, 30 s in the agent's defaults) at ``SHRINK_AFTER_SECONDS``:
  a shrink is still decided the same way, on a window of scrapes that all ask for less, only
  sooner, which is what the tier's wall time pays for. Growing is untouched;
- relief on (``relief.enabled``; off in the manifests, so ``test_a_vm_held_at_its_quota_
  under_load_keeps_asking``, which runs on them before this overlay, sees a VM cut short that
  nothing moves), its pass every ``RELIEF_INTERVAL_SECONDS`` instead of 15 s (a pass is one
  pure walk over a two-node ledger; the move drill's wall time is what the interval adds to),
  and no watermark (``relief.watermark: null``): node 1 holds two CPUs and a VM grows to 2
  vCPUs on it, which a 0.9 watermark would forbid as a move's target and would drain by moves
  of its own in the drills that fill it (test_failures), where only a grow cut short may move
  a VM (test_migration);
- live scale-down on (``relief.drain.enabled``), its share ``relief.drain.below_share`` at
  ``DRAIN_BELOW_SHARE`` (the default: 0.3) so that no node is drained on relief's own choice
  (a drain only starts on a node with a VM, and the smallest VM here, 1 vCPU, is half a
  2-CPU node), where the tier's drills count on the nodes they fill; the drain drill
  (test_drain) starts its drain as an operator does, with the drain taint, which neither the
  share nor the hysteresis holds back;
- both Leases of the scheduler pair (kube-scheduler's ``leaderElection`` and the extender's
  ``leader_election``) at ``LEASE_SECONDS`` instead of 15 s, kube-scheduler's renew deadline
  below it as its defaults are: the failover drills wait out a dead holder's Lease (and read
  its duration from the Lease), so a shorter one is what they pay for; the election and its
  rules are the same;
- the agent's hypervisor calls bounded at ``HYPERVISOR_TIMEOUT_SECONDS`` instead of 5 s: a TCG
  guest under pgbench, on a host running the suite beside the tier, once took longer than 5 s
  to answer qemu-guest-agent while onlining a vCPU, and the agent gave up the grow it had a
  permit for (run-bench's load was over before it tried again). A call that answers in time
  is unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
# Several scrapes (one a second) of a guest that wants less: a shrink is a window's decision,
# not one sample's, as in the manifests, just shorter than their 30 s.
SHRINK_AFTER_SECONDS = 8.0
# Both Leases of the scheduler pair (manifests: 15 s, kube-scheduler's default), and
# kube-scheduler's renewDeadline (manifests: 10 s), which must stay below the Lease's.
LEASE_SECONDS = 10
RENEW_DEADLINE_SECONDS = 7
# relief.interval_seconds (the manifests' default: 15 s).
RELIEF_INTERVAL_SECONDS = 1.0
# relief.drain.below_share: far below what any node with a VM on it holds here.
DRAIN_BELOW_SHARE = 0.01
# The agent's hypervisor.timeout_seconds (its default: 5 s), per QMP or qemu-guest-agent call.
HYPERVISOR_TIMEOUT_SECONDS = 15.0


def tier_overlay(directory: Path) -> Path:
    """Writes the overlay into ``directory`` (kustomize wants its files beside it)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / "manifests" / "config" / "extender.yaml").read_text())
    config["system_reserve"]["cpu_fraction"] = 0
    config["leader_election"]["lease_duration_seconds"] = LEASE_SECONDS
    config["relief"] = {
        "enabled": True,
        "interval_seconds": RELIEF_INTERVAL_SECONDS,
        "watermark": None,
        "drain": {"enabled": True, "below_share": DRAIN_BELOW_SHARE},
    }
    (directory / "extender.yaml").write_text(yaml.safe_dump(config))
    scheduler = yaml.safe_load((ROOT / "manifests" / "config" / "kube-scheduler.yaml").read_text())
    scheduler["leaderElection"]["leaseDuration"] = f"{LEASE_SECONDS}s"
    scheduler["leaderElection"]["renewDeadline"] = f"{RENEW_DEADLINE_SECONDS}s"
    (directory / "kube-scheduler.yaml").write_text(yaml.safe_dump(scheduler))
    agent = yaml.safe_load((ROOT / "manifests" / "config" / "agent.yaml").read_text())
    agent.setdefault("policy", {})["shrink_after_seconds"] = SHRINK_AFTER_SECONDS
    agent.setdefault("memory", {})["shrink_after_seconds"] = SHRINK_AFTER_SECONDS
    agent.setdefault("hypervisor", {})["timeout_seconds"] = HYPERVISOR_TIMEOUT_SECONDS
    (directory / "agent.yaml").write_text(yaml.safe_dump(agent))

    def zero_cpu(kind: str, name: str, containers: int) -> dict[str, Any]:
        ops = [
            {
                "op": "replace",
                "value": "0",
                "path": f"/spec/template/spec/containers/{i}/resources/requests/cpu",
            }
            for i in range(containers)
        ]
        return {"target": {"kind": kind, "name": name}, "patch": yaml.safe_dump(ops)}

    def replaced(name: str, file: str) -> dict[str, Any]:
        return {"name": name, "namespace": "vm-autoscaling", "behavior": "replace",
                "files": [file]}  # fmt: skip

    (directory / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize refuses absolute paths to a base.
                "resources": [os.path.relpath(ROOT / "manifests", directory)],
                "configMapGenerator": [
                    replaced("vm-scheduler-config", "kube-scheduler.yaml"),
                    replaced("scheduler-extender-config", "extender.yaml"),
                    replaced("autoscaler-agent-config", "agent.yaml"),
                ],
                "patches": [
                    zero_cpu("Deployment", "scheduler-extender", 2),
                    zero_cpu("DaemonSet", "autoscaler-agent", 1),
                    zero_cpu("Deployment", "vm-controller", 1),
                ],
            }
        )
    )
    return directory
