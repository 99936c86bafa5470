"""What the ledger state machines share: a restart's rebuild, and every pod going away."""

from collections.abc import Iterable

from scheduler_extender.core.ledger import Ledger
from scheduler_extender.core.podinfo import Demand, PodInfo


def rebuilt(old: Ledger, nodes: dict[str, Demand], pods: Iterable[PodInfo], *, at: float) -> Ledger:
    """A restarted extender's ledger: the API server's nodes and pods, listed afresh."""
    ledger = Ledger(reserve=old.reserve)
    ledger.replace_nodes((n, d, {}) for n, d in nodes.items())
    ledger.replace_pods(pods, at=at)
    return ledger


def forget_everything(ledger: Ledger, api_pods: dict[str, PodInfo]) -> None:
    """Every pod is deleted: nothing may stay held (the leak the design this follows had)."""
    for uid in list(api_pods):
        ledger.forget_pod(uid)
    api_pods.clear()
    assert ledger.totals() == Demand(0, 0)
    assert not ledger.pods
    assert all(s.uncertain_total == Demand(0, 0) for s in ledger.nodes.values())
