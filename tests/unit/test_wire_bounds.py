"""Every number any wire or config carries has an upper and a lower bound (``protocol.bounds``).

The paths come from the types themselves (``msgspec.inspect``), so a field added without a bound
fails here by name. ``tests/extender/test_wire_numbers.py`` sends numbers past those bounds at
every path of the HTTP wires.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest

from autoscaler_agent import config as agent_config
from autoscaler_agent import discovery
from protocol import extender, permits
from scheduler_extender import config as extender_config
from scheduler_extender.admission import quota
from scheduler_extender.http import verbs
from scheduler_extender.kube import standalone
from scheduler_extender.recommender import snapshot
from simulator import scenario

ROOTS: dict[str, Any] = {
    "permit-request": permits.ResourceRequestBatch,
    "permit-answer": permits.PermitBatch,
    "filter": verbs.FilterArgs,
    "prioritize": extender.ExtenderArgs,
    "preempt": extender.ExtenderPreemptionArgs,
    "snapshot": snapshot.ClusterSnapshot,
    "extender-config": extender_config.Config,
    "quota-file": quota.QuotaConfig,
    "standalone-cluster": standalone.StandaloneCluster,
    "agent-config": agent_config.Config,
    "agent-standalone": discovery.StandaloneFile,
    "scenario": scenario.Scenario,
}

Path = tuple[str | int, ...]


def numbers(
    t: mi.Type, path: Path = (), seen: frozenset[type] = frozenset()
) -> Iterator[tuple[Path, mi.Type]]:
    """Every integer and float a document of type ``t`` can hold, with its JSON path (``0`` for
    a list's items, ``"*"`` for a dict's values)."""
    if isinstance(t, (mi.IntType, mi.FloatType)):
        yield path, t
    elif isinstance(t, (mi.StructType, mi.DataclassType)):
        if t.cls in seen:
            return
        for f in t.fields:
            yield from numbers(f.type, (*path, f.encode_name), seen | {t.cls})
    elif isinstance(t, mi.UnionType):
        for member in t.types:
            yield from numbers(member, path, seen)
    elif isinstance(t, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        yield from numbers(t.item_type, (*path, 0), seen)
    elif isinstance(t, mi.TupleType):
        for i, item in enumerate(t.item_types):
            yield from numbers(item, (*path, i), seen)
    elif isinstance(t, mi.DictType):
        yield from numbers(t.value_type, (*path, "*"), seen)


def unbounded(t: mi.Type) -> bool:
    assert isinstance(t, (mi.IntType, mi.FloatType))
    return (t.ge is None and t.gt is None) or (t.le is None and t.lt is None)


@pytest.mark.parametrize("root", ROOTS.values(), ids=list(ROOTS))
def test_every_number_has_both_bounds(root: Any) -> None:
    found = list(numbers(mi.type_info(root)))
    assert found, "no numbers found: the walk is broken"
    missing = ["$." + ".".join(map(str, p)) for p, t in found if unbounded(t)]
    assert missing == []


def test_the_walk_finds_an_unbounded_number() -> None:
    class Loose(msgspec.Struct):
        items: list[dict[str, int]]

    assert [(p, unbounded(t)) for p, t in numbers(mi.type_info(Loose))] == [
        (("items", 0, "*"), True)
    ]
