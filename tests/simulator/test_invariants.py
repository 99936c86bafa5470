"""A broken invariant stops the run with a report of what broke, when, and what came before."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_extender.core.podinfo import Demand
from simulator.engine import Simulation
from simulator.fleet import fleet
from simulator.report import format_table
from tests.simulator.helpers import library


def corrupt_ledger_at(seconds: float):
    def hook(sim: Simulation, t: float) -> None:
        if t >= seconds and sim.extender is not None:
            state = sim.extender.ledger.nodes["node-1"]
            state.own_total = state.own_total + Demand(1000, 0)  # a hold nobody owns

    return hook


def test_a_corrupted_ledger_stops_the_run_with_a_report():
    report = Simulation(library("burst"), after_step=corrupt_ledger_at(300)).run()
    assert not report.is_ok
    v = report.violation
    assert v is not None
    assert v.invariant == "ledger"
    assert "node-1: totals" in v.message
    assert 300 <= v.at_seconds < 302  # checked as soon as the instant's events are done
    assert report.ended_at_seconds == v.at_seconds < report.duration_seconds
    assert v.recent and v.recent[-1].at_seconds <= v.at_seconds
    table = format_table(report)
    assert "INVARIANT VIOLATED at" in table and "what happened just before:" in table


def test_a_leaked_reservation_is_reported():
    def keep_deleted(sim: Simulation, t: float) -> None:
        doomed = sim.vm_by_name["doomed"]
        if (
            doomed.is_deleted
            and sim.extender is not None
            and doomed.uid not in sim.extender.ledger.pods
        ):
            # As if the extender missed the DELETED event: the pod comes back into the ledger.
            sim.extender.ledger.observe_pod(doomed.info(node="node-1", permitted=None), at=t)

    report = Simulation(library("restart"), after_step=keep_deleted).run()
    assert report.violation is not None
    assert report.violation.invariant == "leaked reservation"
    assert "uid-default-doomed" in report.violation.message
    assert report.violation.at_seconds == 630  # deleted while the extender was down


def test_a_vm_above_its_permit_is_reported():
    def overgrow(sim: Simulation, t: float) -> None:
        db = sim.vm_by_name["db"]
        if t >= 60 and db.vcpus == db.granted:
            db.vcpus += 1  # the hypervisor runs more than the extender permitted

    report = Simulation(library("burst"), after_step=overgrow).run()
    assert report.violation is not None
    assert report.violation.invariant == "permit exceeded"
    assert report.violation.message == "db runs 2 > permit 1"


_FLEET = fleet(2, 40, 240, 3)  # full checks every 60 s (timing.check_interval_seconds)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    index=st.integers(0, len(_FLEET.vms) - 1),
    after=st.integers(1, 200),
    kind=st.sampled_from(["overgrow", "lost pod"]),
)
def test_a_fleet_run_stops_at_the_instant_a_vm_breaks_an_invariant(index, after, kind):
    # Between two full checks, a VM whose agent just ran breaks an invariant: the run stops at
    # that instant (the VMs an instant touched are checked as time moves on), not at the next
    # full check.
    assert _FLEET.timing.check_interval_seconds == 60
    broken_at: list[float] = []

    def corrupt(sim: Simulation, t: float) -> None:
        vm = sim.vms[index]
        if broken_at or t < after or vm.last_scrape_at != t or sim.extender is None:
            return
        broken_at.append(t)
        if kind == "overgrow":
            vm.vcpus = vm.granted + 1  # the hypervisor runs more than permitted
        else:
            sim.extender.ledger.forget_pod(vm.uid)  # the ledger lost a running pod

    # Every VM scraped every interval (none skipped as settled), so that each one is touched.
    report = Simulation(_FLEET, after_step=corrupt, skip_settled=False).run()
    assert broken_at, "the VM was never scraped after the chosen time"
    v = report.violation
    assert v is not None
    assert v.at_seconds == broken_at[0]
    if kind == "overgrow":
        # Above its permit, and above what the ledger holds for it: whichever is checked first.
        assert v.invariant in ("permit exceeded", "ledger behind reality")
        assert f"{_FLEET.vms[index].name} runs" in v.message
    else:
        assert v.invariant == "lost pod"
