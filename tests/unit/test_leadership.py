"""The extender's Lease elector, step by step (``core/leadership.py``), and what a take-over
does to the ledger (``Ledger.forget_agents``)."""

from __future__ import annotations

import msgspec
import pytest

from protocol import annotations as ann
from protocol.permits import PodRef, ResourceRequest, Resources
from scheduler_extender.core.leadership import Elector, LeaseRecord, Step, Write
from scheduler_extender.core.ledger import Ledger
from scheduler_extender.core.permits import decide
from scheduler_extender.core.podinfo import Demand, PodInfo

D = 15.0
DRIFT = 0.05
T0 = 1000.0
GI = 2**30


def elector(name: str = "a") -> Elector:
    e = Elector(name, duration_seconds=D, renew_seconds=2, retry_seconds=2, drift=DRIFT)
    e.candidacy_changed(T0, is_candidate=True)
    return e


def held_by(holder: str, version: str, transitions: int = 0) -> LeaseRecord:
    return LeaseRecord(holder=holder, duration_seconds=D, transitions=transitions, version=version)


def test_a_candidate_creates_the_missing_lease_and_decides_until_its_deadline():
    e = elector()
    assert e.step(T0) == Step(read=True)
    e.read(T0, None)
    mine = LeaseRecord(holder="a", duration_seconds=D, transitions=0)
    assert e.step(T0) == Step(write=Write(mine, ""))
    e.wrote(T0, msgspec.structs.replace(mine, version="7"))
    deadline = T0 + D / (1 + DRIFT) ** 2
    assert e.leads_until == pytest.approx(deadline)
    assert e.is_leading(deadline - 0.001)
    assert not e.is_leading(deadline)
    # Renewal is due two seconds after the write was sent, under the new resourceVersion.
    assert e.step(T0 + 1) == Step(wait_seconds=pytest.approx(1))
    assert e.step(T0 + 2) == Step(write=Write(mine, "7"))


def test_a_replica_may_write_only_while_it_leads_in_the_term_it_began_writing_in():
    e = elector()
    e.read(T0, held_by("", "1", transitions=3))
    assert not e.may_write(T0, None)
    e.wrote(T0, held_by("a", "2", transitions=4))
    assert e.may_write(T0, 4)
    assert not e.may_write(T0, 3)  # begun in an earlier term: another held the Lease since
    assert not e.may_write(T0, None)  # not begun at all (the gain not yet handled)
    deadline = T0 + D / (1 + DRIFT) ** 2
    assert e.may_write(deadline - 0.001, 4)
    assert not e.may_write(deadline, 4)  # the hold lapsed, though nothing was told yet
    e.read(deadline, held_by("b", "3", transitions=5))
    assert not e.may_write(deadline, 4)


def test_a_candidate_takes_a_held_lease_only_after_it_stood_still_for_its_duration():
    e = elector()
    e.read(T0, held_by("b", "5", transitions=3))
    assert e.step(T0) == Step(wait_seconds=2)
    # The holder renews: the record changes, and the wait starts again from that moment.
    e.read(T0 + 2, held_by("b", "6", transitions=3))
    for t in (T0 + 4, T0 + 6, T0 + 8, T0 + 10, T0 + 12, T0 + 14, T0 + 16):
        e.read(t, held_by("b", "6", transitions=3))
        assert e.step(t) == Step(wait_seconds=2)
    e.read(T0 + 17, held_by("b", "6", transitions=3))
    mine = LeaseRecord(holder="a", duration_seconds=D, transitions=4)
    assert e.step(T0 + 17) == Step(write=Write(mine, "6"))


def test_a_released_lease_is_taken_at_once():
    e = elector()
    e.read(T0, LeaseRecord(holder="", duration_seconds=1, transitions=3, version="9"))
    mine = LeaseRecord(holder="a", duration_seconds=D, transitions=4)
    assert e.step(T0) == Step(write=Write(mine, "9"))


def test_with_the_worst_clock_rates_the_holder_stops_before_anyone_may_take_over():
    """The holder's clock runs slow by ``drift``, the candidate's fast, and the candidate sees
    the holder's write the instant it lands: the holder's last moment of deciding is still no
    later, in real time, than the candidate's first write."""
    a, b = elector("a"), elector("b")
    slow, fast = 1 / (1 + DRIFT), 1 + DRIFT
    sent_real = 100.0
    a.wrote(sent_real * slow, held_by("a", "1"))
    b.read(sent_real * fast, held_by("a", "1"))
    assert a.leads_until is not None
    holder_stops_real = a.leads_until / slow
    t = sent_real
    while not b.expired(t * fast):
        t += 0.001
    assert holder_stops_real <= t + 1e-6


def test_resigning_stops_deciding_before_the_release_is_sent():
    e = elector()
    e.read(T0, None)
    e.wrote(T0, held_by("a", "1"))
    e.candidacy_changed(T0 + 1, is_candidate=False)
    assert not e.is_leading(T0 + 1)
    released = LeaseRecord(holder="", duration_seconds=1, transitions=0)
    assert e.step(T0 + 1) == Step(write=Write(released, "1"))
    # Not a candidate: it only watches from now on.
    e.wrote(T0 + 1, msgspec.structs.replace(released, version="2"))
    assert e.step(T0 + 1) == Step(wait_seconds=pytest.approx(2))


def test_a_conflict_stops_the_holder_at_once():
    e = elector()
    e.read(T0, None)
    e.wrote(T0, held_by("a", "1"))
    e.write_conflicted(T0 + 2)
    assert not e.is_leading(T0 + 2)
    assert e.step(T0 + 2) == Step(read=True)
    e.read(T0 + 2, held_by("b", "3", transitions=1))
    assert not e.is_leading(T0 + 2)


def test_unanswered_renewals_keep_the_hold_only_until_its_deadline():
    e = elector()
    e.read(T0, None)
    e.wrote(T0, held_by("a", "1"))
    for t in (T0 + 2, T0 + 4, T0 + 6, T0 + 8, T0 + 10, T0 + 12):
        assert e.step(t).write is not None
        e.failed(t)
        assert e.is_leading(t)
        # It wakes for the retry or at its deadline, whichever comes first.
        assert e.step(t).wait_seconds == pytest.approx(min(2, T0 + D / (1 + DRIFT) ** 2 - t))
    assert not e.is_leading(T0 + 14)


def test_a_leader_cut_off_while_its_scheduler_leads_is_stalled_a_retry_after_its_deadline():
    """Only the extender lost the API server: its hold runs out unrenewed while its
    kube-scheduler still leads, so nobody decides until the pair steps down (``stalled``)."""
    e = elector()
    e.read(T0, None)
    e.wrote(T0, LeaseRecord(holder="a", duration_seconds=D, transitions=0, version="1"))
    deadline = T0 + D / (1 + DRIFT) ** 2
    for t in (T0 + 2, T0 + 4, deadline - 0.001):
        e.failed(t)  # renewals unanswered
        assert not e.stalled(t)
    assert not e.is_leading(deadline)
    assert not e.stalled(deadline + 2 - 0.001)
    assert e.stalled(deadline + 2)
    # An answer ends it: the renewal gets through, and it leads again.
    e.read(deadline + 3, LeaseRecord(holder="a", duration_seconds=D, transitions=0, version="1"))
    e.wrote(deadline + 3, LeaseRecord(holder="a", duration_seconds=D, transitions=0, version="2"))
    assert e.is_leading(deadline + 3) and not e.stalled(deadline + 3)


@pytest.mark.parametrize(
    ("event", "stalled_after"),
    [
        pytest.param("resigned", None, id="its-scheduler-lost-the-lead"),
        pytest.param("conflicted", D + 4, id="another-wrote-the-lease"),
    ],
)
def test_a_hold_ended_by_an_answer_is_not_a_stall_until_a_takeover_would_be_overdue(
    event: str, stalled_after: float | None
):
    e = elector()
    e.read(T0, None)
    e.wrote(T0, LeaseRecord(holder="a", duration_seconds=D, transitions=0, version="1"))
    if event == "resigned":
        e.candidacy_changed(T0 + 1, is_candidate=False)
    else:
        e.write_conflicted(T0 + 1)
    for t in (T0 + 1, T0 + 1 + D):
        assert not e.stalled(t)
    assert e.stalled(T0 + 1 + D + 4) is (stalled_after is not None)


def test_a_new_candidate_waiting_out_the_old_holder_is_not_stalled():
    """The standby pair's take-over: the old record must stand still for a duration first."""
    e = Elector("b", duration_seconds=D, renew_seconds=2, retry_seconds=2, drift=DRIFT)
    e.read(T0, held_by("a", "5"))
    assert not e.stalled(T0 + 100)  # not a candidate: nothing of ours to decide
    e.candidacy_changed(T0 + 1, is_candidate=True)
    for t in range(2, 17, 2):
        e.read(T0 + t, held_by("a", "5"))
        assert not e.stalled(T0 + t)
    assert e.step(T0 + 16) == Step(write=Write(held_by("b", "", transitions=1), "5"))
    assert not e.stalled(T0 + 1 + D + 4 - 0.001)
    assert e.stalled(T0 + 1 + D + 4)  # its write never answered: overdue


def test_a_renew_interval_outside_the_lease_is_refused():
    with pytest.raises(ValueError, match="renew_seconds"):
        Elector("a", duration_seconds=2, renew_seconds=2, retry_seconds=1)


# -- the ledger at a take-over ------------------------------------------------------------------


def vm(uid: str, permitted: int | None) -> PodInfo:
    spec = ann.VmSpec(
        min_vcpus=1, max_vcpus=4, scaling_unit=1, min_memory_bytes=GI, max_memory_bytes=GI
    )
    return PodInfo(
        uid=uid,
        namespace="ns",
        name=uid,
        node_name="n1",
        scheduler_name="vm-scheduler",
        requests=Demand(1000, GI),
        priority=0,
        is_ours=True,
        is_vm=True,
        is_static=False,
        is_terminated=False,
        vm=spec,
        permitted_vcpus=permitted,
        permitted_memory_bytes=GI if permitted is not None else None,
    )


def test_forget_agents_leaves_the_ledger_as_a_rebuild_would_find_it():
    led = Ledger()
    led.replace_nodes([("n1", Demand(8000, 64 * GI), {})])
    led.replace_pods([vm("a", 2), vm("b", None)], at=0)
    for uid, current in (("a", 2), ("b", 1)):
        d = decide(
            led,
            ResourceRequest(
                pod=PodRef(namespace="ns", name=uid, uid=uid),
                node="n1",
                current=Resources(vcpus=current, memory_bytes=GI),
                requested=Resources(vcpus=current, memory_bytes=GI),
            ),
        )
        assert d.permit.error is None
    assert led.nodes["n1"].uncertain_total == Demand(0, 0)
    before = led.generation

    led.forget_agents()

    rebuilt = Ledger()
    rebuilt.replace_nodes([("n1", Demand(8000, 64 * GI), {})])
    rebuilt.replace_pods([vm("a", 2), vm("b", 1)], at=0)
    assert (
        led.nodes["n1"].uncertain_total
        == rebuilt.nodes["n1"].uncertain_total
        == Demand((4 - 2) * 1000 + (4 - 1) * 1000, 0)
    )
    assert led.nodes["n1"].free == rebuilt.nodes["n1"].free
    assert not any(e.has_agent for e in led.pods.values())
    assert led.generation > before  # the fit index re-reads the node
    led.check_invariants()
