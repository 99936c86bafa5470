"""The tier's overlay of ``manifests/`` changes only what ``tests/node/overlay.py`` says (fast,
no node): the configs it writes load with the components' own parsers, and differ from the
manifests' only in the keys it names."""

from __future__ import annotations

from pathlib import Path

import yaml

from autoscaler_agent.config import parse_config
from scheduler_extender.config import load_config as load_extender_config
from tests.node.overlay import (
    DRAIN_BELOW_SHARE,
    HYPERVISOR_TIMEOUT_SECONDS,
    LEASE_SECONDS,
    RELIEF_INTERVAL_SECONDS,
    RENEW_DEADLINE_SECONDS,
    ROOT,
    SHRINK_AFTER_SECONDS,
    tier_overlay,
)


def test_the_agent_config_differs_only_in_its_shrink_windows_and_call_bound(
    tmp_path: Path,
) -> None:
    directory = tier_overlay(tmp_path / "overlay")
    ours = yaml.safe_load((directory / "agent.yaml").read_text())
    theirs = yaml.safe_load((ROOT / "manifests" / "config" / "agent.yaml").read_text())
    config = parse_config((directory / "agent.yaml").read_text())
    assert config.policy.shrink_after_seconds == SHRINK_AFTER_SECONDS
    assert config.memory.shrink_after_seconds == SHRINK_AFTER_SECONDS
    assert config.hypervisor.timeout_seconds == HYPERVISOR_TIMEOUT_SECONDS
    del ours["policy"]["shrink_after_seconds"], ours["memory"]["shrink_after_seconds"]
    del ours["hypervisor"]["timeout_seconds"]
    assert {k: v for k, v in ours.items() if v} == theirs


def test_the_extender_config_differs_only_in_its_reserve_lease_and_relief(tmp_path: Path) -> None:
    directory = tier_overlay(tmp_path / "overlay")
    config = load_extender_config(directory / "extender.yaml")
    assert config.system_reserve.cpu_fraction == 0
    assert config.leader_election is not None
    assert config.leader_election.lease_duration_seconds == LEASE_SECONDS
    relief = config.relief
    assert (relief.enabled, relief.interval_seconds, relief.watermark) == (
        True,
        RELIEF_INTERVAL_SECONDS,
        None,
    )
    assert (relief.drain.enabled, relief.drain.below_share) == (
        True,
        DRAIN_BELOW_SHARE,
    )
    assert "relief" not in yaml.safe_load(
        (ROOT / "manifests" / "config" / "extender.yaml").read_text()
    )
    assert (
        load_extender_config(ROOT / "manifests" / "config" / "extender.yaml").relief.enabled
        is False
    )
    ours = yaml.safe_load((directory / "extender.yaml").read_text())
    theirs = yaml.safe_load((ROOT / "manifests" / "config" / "extender.yaml").read_text())
    ours["system_reserve"]["cpu_fraction"] = theirs["system_reserve"]["cpu_fraction"]
    lease = "lease_duration_seconds"
    ours["leader_election"][lease] = theirs["leader_election"][lease]
    del ours["relief"]
    assert ours == theirs


def test_the_scheduler_config_differs_only_in_its_lease(tmp_path: Path) -> None:
    """kube-scheduler checks its own config (renewDeadline below leaseDuration) only when it
    starts in the cluster; what can be checked here is that nothing else changed."""
    directory = tier_overlay(tmp_path / "overlay")
    ours = yaml.safe_load((directory / "kube-scheduler.yaml").read_text())
    theirs = yaml.safe_load((ROOT / "manifests" / "config" / "kube-scheduler.yaml").read_text())
    election = ours["leaderElection"]
    assert (election["leaseDuration"], election["renewDeadline"]) == (
        f"{LEASE_SECONDS}s",
        f"{RENEW_DEADLINE_SECONDS}s",
    )
    assert RENEW_DEADLINE_SECONDS < LEASE_SECONDS
    election.update({k: theirs["leaderElection"][k] for k in ("leaseDuration", "renewDeadline")})
    assert ours == theirs
