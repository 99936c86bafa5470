"""``core.verbs``: the rules of filter, prioritize, bind and preempt that the server and the
simulator share, where the shared-answers test cannot tell them apart (both sides would move
together): the growth prioritize weighs, which version of a pod bind reserves for, and when
preempt drops a node."""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from protocol.annotations import VmSpec
from scheduler_extender.core import verbs
from scheduler_extender.core.ledger import Ledger
from scheduler_extender.core.placement import FilterResult, FitIndex
from scheduler_extender.core.podinfo import Demand, PodInfo
from scheduler_extender.core.verbs import BindOutcome
from tests.support import pod_info

GI = 2**30
VM = VmSpec(min_vcpus=2, max_vcpus=7, scaling_unit=2, min_memory_bytes=GI, max_memory_bytes=GI)


class _Admitted(NamedTuple):
    is_admitted: bool = True
    reason: str = "admitted"


def _ledger() -> Ledger:
    ledger = Ledger()
    ledger.upsert_node("node-a", allocatable=Demand(10_000, 16 * GI), labels={})
    return ledger


def _vm(uid: str = "u-1", *, node: str | None = None) -> PodInfo:
    return pod_info(uid, requests=Demand(2000, GI), vm=VM, node=node)


def test_growth_is_the_top_size_less_the_initial_size() -> None:
    # max 7 in steps of 2 from 2 tops out at 6; the pod starts at its permitted 4.
    vm = msgspec.structs.replace(_vm(), permitted_vcpus=4)
    assert verbs.growth_millis(vm) == 6000 - 4000
    assert verbs.growth_millis(_vm()) == 6000 - 2000
    assert verbs.growth_millis(pod_info("f", requests=Demand(500, GI))) == 0


def _bind(ledger: Ledger, **kw: object) -> verbs.BindDecision:
    args: dict[str, object] = {
        "key": "ns/u-1",
        "uid": "u-1",
        "node": "node-a",
        "known": None,
        "filtered": None,
        "is_in_flight": False,
        "admit": lambda _: _Admitted(),
        "at": 0.0,
    }
    args.update(kw)
    return verbs.bind_pod(ledger, **args)  # type: ignore[arg-type]


def test_bind_reserves_the_version_filter_saw_only_for_a_pod_still_waiting_for_a_node() -> None:
    ledger = _ledger()
    elsewhere = _bind(ledger, filtered=_vm(node="node-b"))
    assert elsewhere.outcome is BindOutcome.REFUSED
    assert "not known to the extender yet" in elsewhere.error
    assert "u-1" not in ledger.pods
    early = _bind(ledger, filtered=_vm())
    assert (early.outcome, early.is_before_watch) == (BindOutcome.RESERVED, True)
    assert ledger.pods["u-1"].node == "node-a"


def test_a_retried_bind_is_done_or_busy_and_reserves_nothing_more() -> None:
    ledger = _ledger()
    assert _bind(ledger, known=_vm()).outcome is BindOutcome.RESERVED
    held = ledger.nodes["node-a"].free
    busy = _bind(ledger, known=_vm(), is_in_flight=True)
    assert busy[:3] == (BindOutcome.BUSY, "pod ns/u-1 is already being bound to node node-a", None)
    assert _bind(ledger, known=_vm())[:3] == (BindOutcome.DONE, "", None)
    assert ledger.nodes["node-a"].free == held


def test_bind_asks_admission_again() -> None:
    ledger = _ledger()
    refused = _bind(ledger, known=_vm(), admit=lambda _: _Admitted(False, "quota is full"))
    assert refused[:2] == (BindOutcome.REFUSED, "cannot bind ns/u-1 to node-a: quota is full")
    assert "u-1" not in ledger.pods


def test_preempt_drops_a_node_whose_victims_would_not_free_enough() -> None:
    ledger = _ledger()
    ledger.upsert_node("node-b", allocatable=Demand(2500, 16 * GI), labels={})
    small = pod_info("small", requests=Demand(500, GI), node="node-a")
    other = pod_info("other", requests=Demand(1000, GI), node="node-b")
    ledger.observe_pod(small, at=0.0)
    ledger.observe_pod(other, at=0.0)
    big = pod_info("big", requests=Demand(7_800, GI), vm=VM)
    kept = verbs.preempt(ledger, big, {"node-a": (["small"], 0), "node-b": (["other"], 1)})
    assert list(kept) == ["node-a"]
    assert kept["node-a"].victims == ["small"]


def test_filter_says_whether_more_room_would_help() -> None:
    ledger = _ledger()
    index = FitIndex(ledger)
    big = pod_info("big", requests=Demand(9_000, GI), vm=VM)
    no_room = verbs.filter_pod(index, big, ["node-a"], _Admitted())
    assert (no_room.result.passed, no_room.has_room) == ([], False)
    assert no_room.reason == "0 of 1 nodes fit"
    waiting = verbs.filter_pod(index, _vm(), ["node-a"], _Admitted(False, "quota is full"))
    assert waiting == (FilterResult([], {"node-a": "quota is full"}, {}), "quota is full", True)
    fits = verbs.filter_pod(index, _vm(), ["node-a"], _Admitted())
    assert (fits.result.passed, fits.has_room, fits.reason) == (
        ["node-a"],
        True,
        "1 of 1 nodes fit",
    )
