"""Parked pods: nudged once a node they were offered has room for them, and never before."""

from hypothesis import given
from hypothesis import strategies as st

from scheduler_extender.core.ledger import Ledger, SystemReserve
from scheduler_extender.core.parked import ParkedPods
from scheduler_extender.core.podinfo import Demand
from tests.unit.test_accounting import GI, info

ONE = Demand(1000, GI)


def ledger_with(*nodes: tuple[str, int]) -> Ledger:
    ledger = Ledger(reserve=SystemReserve(cpu_fraction=0.0))
    for name, cpu in nodes:
        ledger.upsert_node(name, allocatable=Demand(cpu, 16 * GI))
    return ledger


def test_a_pod_is_nudged_when_room_frees_on_a_node_it_was_offered():
    ledger = ledger_with(("a", 1000), ("b", 1000))
    ledger.observe_pod(info("x", node="a", cpu=1000), at=0)
    ledger.observe_pod(info("y", node="b", cpu=1000), at=0)
    changes: list[None] = []
    parked = ParkedPods(ledger, on_change=lambda: changes.append(None))
    parked.park(uid="p", namespace="ns", name="p", demand=ONE, nodes=["a"])
    ledger.forget_pod("y")  # room on b, which the pod was not offered (its selector)
    assert parked.fitting() == []
    assert "p" in parked
    ledger.forget_pod("x")
    (found,) = parked.fitting()
    assert (found.uid, found.key) == ("p", "ns/p")
    assert "p" not in parked  # one nudge per parking
    assert len(changes) == 2  # once per batch of changes, not once per change


def test_a_change_that_leaves_too_little_room_nudges_nobody():
    ledger = ledger_with(("a", 2000))
    ledger.observe_pod(info("x", node="a", cpu=1500), at=0)
    parked = ParkedPods(ledger)
    parked.park(uid="p", namespace="ns", name="p", demand=ONE, nodes=["a"])
    ledger.upsert_node("a", allocatable=Demand(2400, 16 * GI))  # grown, but 900m free
    assert parked.fitting() == []
    ledger.upsert_node("a", allocatable=Demand(2500, 16 * GI))
    assert [p.uid for p in parked.fitting()] == ["p"]


def test_a_node_becoming_known_is_room():
    ledger = ledger_with()
    parked = ParkedPods(ledger)
    parked.park(uid="p", namespace="ns", name="p", demand=ONE, nodes=["late"])
    ledger.upsert_node("late", allocatable=Demand(4000, 16 * GI))
    assert [p.uid for p in parked.fitting()] == ["p"]


def test_changes_while_nothing_is_parked_are_not_kept():
    ledger = ledger_with(("a", 1000))
    ledger.observe_pod(info("x", node="a", cpu=1000), at=0)
    parked = ParkedPods(ledger)
    ledger.forget_pod("x")  # room, but nobody waited for it yet
    parked.park(uid="p", namespace="ns", name="p", demand=ONE, nodes=["a"])
    assert not parked.has_changes
    assert parked.fitting() == []


def test_unpark_and_retain_forget_pods():
    ledger = ledger_with(("a", 1000))
    parked = ParkedPods(ledger)
    for uid in ("p", "q", "r"):
        parked.park(uid=uid, namespace="ns", name=uid, demand=ONE, nodes=["a"])
    parked.unpark("p")
    parked.retain({"q"})
    assert len(parked) == 1 and "q" in parked


def test_pods_offered_the_same_nodes_share_one_set():
    parked = ParkedPods(ledger_with())
    parked.park(uid="p", namespace="ns", name="p", demand=ONE, nodes=["a", "b"])
    parked.park(uid="q", namespace="ns", name="q", demand=ONE, nodes=["b", "a"])
    assert parked._pods["p"].nodes is parked._pods["q"].nodes


NODES = ["a", "b", "c"]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["hold", "free", "resize", "park"]),
            st.sampled_from(NODES),
            st.integers(0, 3000),
        ),
        max_size=40,
    )
)
def test_every_nudged_pod_fits_a_node_it_was_offered(steps):
    ledger = ledger_with(*((n, 2000) for n in NODES))
    parked = ParkedPods(ledger)
    for i, (op, node, amount) in enumerate(steps):
        if op == "hold":
            ledger.observe_pod(info(f"h{i}", node=node, cpu=amount), at=0)
        elif op == "free" and ledger.pods:
            ledger.forget_pod(sorted(ledger.pods)[amount % len(ledger.pods)])
        elif op == "resize":
            ledger.upsert_node(node, allocatable=Demand(amount, 16 * GI))
        elif op == "park":
            offered = NODES[: 1 + amount % len(NODES)]
            parked.park(
                uid=f"p{i}", namespace="ns", name=f"p{i}", demand=Demand(amount, GI), nodes=offered
            )
        for pod in parked.fitting():
            assert any(ledger.nodes[n].fits(pod.demand) for n in pod.nodes if n in ledger.nodes)
            assert pod.uid not in parked
