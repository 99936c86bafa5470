"""A permit batch answered again from ``RepeatedBatches`` gets what ``permit_batch`` would give.

A VM on a full node asks for more every few seconds and is denied every time; the simulator
answers such a batch again, without deciding it again, while its node's ledger stands still
(``simulator.scheduling.RepeatedBatches``). These runs compare it with the unskipped path,
where every batch goes through ``permit_batch``: the same report, byte for byte but for the
count of batches answered again, and the same life for every VM (its size, permit, denials
and jitter draws after every event).
"""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import scenario as sc
from simulator.builtin import default_scenario
from simulator.engine import Simulation
from simulator.fleet import fleet
from simulator.report import encode_report
from simulator.scheduling import RepeatedBatches
from tests.simulator.helpers import library

Life = list[tuple[float, str, int, int, int, int]]


def lives(scenario: sc.Scenario, *, repeat_answers: bool) -> tuple[bytes, Life, int]:
    """The report's bytes, every VM's changes of (size, permit, denials, jitter draws) with
    their times, and how many batches were answered again."""
    seen: dict[int, tuple[int, int, int, int]] = {}
    life: Life = []

    def record(sim: Simulation, t: float) -> None:
        for vm in sim.vms:
            now = (vm.vcpus, vm.granted, vm.denials, vm.jitter_draws)
            if seen.get(vm.index) != now:
                seen[vm.index] = now
                life.append((t, vm.spec.name, *now))

    report = Simulation(scenario, after_step=record, repeat_answers=repeat_answers).run()
    assert report.is_ok, report.violation
    repeated = report.counters.permit_batches_repeated
    counters = msgspec.structs.replace(report.counters, permit_batches_repeated=0)
    return encode_report(msgspec.structs.replace(report, counters=counters)), life, repeated


def assert_same(scenario: sc.Scenario) -> int:
    fast, fast_life, repeated = lives(scenario, repeat_answers=True)
    slow, slow_life, none = lives(scenario, repeat_answers=False)
    assert none == 0
    assert fast_life == slow_life
    assert fast == slow
    return repeated


def contended(nodes: int, vms: int, seconds: float, seed: int, cpu: int) -> sc.Scenario:
    """A small fleet on small nodes: its VMs meet full nodes, alone and in one batch."""
    scenario = fleet(nodes, vms, seconds, seed)
    return msgspec.structs.replace(
        scenario, nodes=[msgspec.structs.replace(n, cpu=cpu) for n in scenario.nodes]
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.integers(1, 3),
    vms=st.integers(2, 12),
    seed=st.integers(0, 2**16),
    cpu=st.integers(4, 16),
    failures=st.sampled_from(["none", "extender-restart", "hypervisor"]),
)
def test_answering_again_changes_nothing_in_small_worlds(nodes, vms, seed, cpu, failures):
    scenario = contended(nodes, vms, 900, seed, cpu)
    events: list[sc.Event] = []
    if failures == "extender-restart":
        events.append(sc.ExtenderRestart(at_seconds=300, down_seconds=20))
    elif failures == "hypervisor":
        events.append(
            sc.HypervisorFail(at_seconds=200, node=scenario.nodes[0].name, for_seconds=60)
        )
    scenario = msgspec.structs.replace(scenario, events=events)
    assert_same(scenario)


def test_a_contended_fleet_is_answered_again_and_decides_the_same():
    # 40 VMs on 4 nodes of 16 CPUs: several VMs of a node denied at once, in one batch too.
    repeated = assert_same(contended(4, 40, 1200, 7, 16))
    assert repeated > 100  # what is compared is worth comparing


def test_the_library_decides_the_same():
    for scenario in (
        default_scenario(),
        library("contention"),
        library("restart"),
        library("memory"),
        library("burst"),
    ):
        assert_same(scenario)


def test_a_node_change_forgets_what_was_answered_there():
    repeats = RepeatedBatches()
    repeats._by_node["node-1"] = {(): []}
    repeats._by_node["node-2"] = {(): []}
    repeats.node_changed("node-1")
    assert repeats.answer("node-1", (), {}) is None
    assert repeats.answer("node-2", (), {}) == []
    repeats.clear()
    assert repeats.answer("node-2", (), {}) is None
