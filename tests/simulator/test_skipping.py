"""Skipping settled VMs changes no decision, also where only a fleet shows it.

The library scenarios (test_library) are too small for two things that a fleet has: VMs on a
full node whose requests for the room another VM gives back meet in one permit batch at the
same instant, and many VMs drawing backoff jitter at the same instant. Which of one instant's
events runs first depends on when each was queued, and skipping changes that; before the fix
the batch order and the jitter values followed it (4 of 400 VMs, 7 of 400 here, decided
differently; 14 of 200 with failures).
"""

from __future__ import annotations

import msgspec
import pytest

from simulator import scenario as sc
from simulator.engine import Simulation
from simulator.fleet import fleet


def with_failures(scenario: sc.Scenario) -> sc.Scenario:
    """An extender restart (permits time out, then every VM reports) and hypervisor failures
    on every third node (reads and resizes back off): both draw jitter for many VMs at once."""
    events: list[sc.Event] = [sc.ExtenderRestart(at_seconds=600, down_seconds=40)]
    events.extend(
        sc.HypervisorFail(at_seconds=900 + i, node=node.name, for_seconds=90)
        for i, node in enumerate(scenario.nodes)
        if i % 3 == 0
    )
    return msgspec.structs.replace(scenario, events=events)


@pytest.mark.parametrize(
    ("nodes", "vms", "is_failing"),
    [(20, 400, False), (10, 200, True)],
    ids=["contended-nodes", "failures"],
)
def test_a_fleet_decides_the_same_with_and_without_skipping(nodes, vms, is_failing):
    scenario = fleet(nodes, vms, 1800, 1)
    if is_failing:
        scenario = with_failures(scenario)
    fast = Simulation(scenario).run()
    slow = Simulation(scenario, skip_settled=False).run()
    assert fast.is_ok and slow.is_ok, (fast.violation, slow.violation)
    assert [a.name for a, b in zip(fast.vms, slow.vms, strict=True) if a != b] == []
    assert fast.nodes == slow.nodes
    assert fast.recommendations == slow.recommendations
    assert fast.pending_at_end == slow.pending_at_end
    # What is compared is worth comparing: VMs were denied, and skipped scrapes.
    assert sum(v.denials for v in fast.vms) > 0
    assert fast.counters.scrapes < slow.counters.scrapes
