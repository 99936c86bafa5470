"""Our pods that filter found no room for, and the moment room for them appears.

Pure: no I/O, no clock. kube-scheduler parks a pod that every node rejected until a cluster
event its informers hear of (a pod deleted or finished, a node added) might help it, or its
five-minute flush. The extender hears of the same events through its own watch, milliseconds
to seconds later; a retry that arrives before the extender's watch has caught up is rejected
again, and kube-scheduler, having spent its event, parks the pod for those five minutes while
the ledger shows the room free. The same holds for room kube-scheduler cannot see at all: a
VM that shrinks (a permit notice), a bind that fails and gives its hold back.

So the extender remembers the pods it rejected everywhere (``park``), with the nodes the
rejection was about, and after every change to one of those nodes asks whether the pod now
fits it (``fitting``); the shell then prompts kube-scheduler to retry exactly those pods. A pod
that still does not fit anywhere it was offered is never prompted. One prompt per parking: a
prompted pod is forgotten, and parks again if the retry finds no room after all.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Iterable
from typing import NamedTuple

from scheduler_extender.core.ledger import Ledger
from scheduler_extender.core.podinfo import Demand

__all__ = ["ParkedPod", "ParkedPods"]


class ParkedPod(NamedTuple):
    uid: str
    namespace: str
    name: str
    demand: Demand
    # The nodes kube-scheduler offered when every one of them was rejected: room elsewhere
    # (a node the pod's own selector excludes) would not help it.
    nodes: frozenset[str]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class ParkedPods:
    """Parked pods by uid, and the nodes changed since ``fitting`` last looked.

    ``on_change`` is called (no arguments) when a change arrives while pods are parked, so
    the shell knows to call ``fitting``; changes while nothing is parked are not recorded,
    which keeps the ledger's every-mutation listener to one dict check.
    """

    def __init__(self, ledger: Ledger, *, on_change: Callable[[], None] | None = None) -> None:
        self._ledger = ledger
        self._pods: dict[str, ParkedPod] = {}
        self._dirty: set[str] = set()
        self._on_change = on_change
        # Pods rejected from the same node list share one frozenset: a list of 5,000 node
        # names per parked pod would make a thousand parked pods cost real memory.
        self._node_sets: weakref.WeakValueDictionary[frozenset[str], frozenset[str]] = (
            weakref.WeakValueDictionary()
        )
        ledger.subscribe(self._changed)

    def _changed(self, node: str) -> None:
        if not self._pods:
            return
        if not self._dirty and self._on_change is not None:
            self._on_change()
        self._dirty.add(node)

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: str) -> bool:
        return uid in self._pods

    def park(
        self, *, uid: str, namespace: str, name: str, demand: Demand, nodes: Iterable[str]
    ) -> None:
        """Filter rejected every node in ``nodes`` for this pod (a later rejection replaces an
        earlier one: the pod's size or the offered nodes may have changed)."""
        names = frozenset(nodes)
        shared = self._node_sets.setdefault(names, names)
        self._pods[uid] = ParkedPod(uid, namespace, name, demand, shared)

    def unpark(self, uid: str) -> None:
        """It found room, was bound, finished or is gone."""
        self._pods.pop(uid, None)
        if not self._pods:
            self._dirty.clear()

    def retain(self, uids: Collection[str]) -> None:
        """Forget every parked pod not in ``uids`` (a relist of the pods that still wait)."""
        for uid in [u for u in self._pods if u not in uids]:
            self.unpark(uid)

    @property
    def has_changes(self) -> bool:
        return bool(self._dirty) and bool(self._pods)

    def fitting(self) -> list[ParkedPod]:
        """The parked pods that now fit one of their nodes that changed since the last call,
        oldest parking first; they are unparked. Everything else stays parked."""
        if not self._dirty:
            return []
        nodes = self._ledger.nodes
        changed = [(name, nodes[name]) for name in self._dirty if name in nodes]
        self._dirty.clear()
        found: list[ParkedPod] = []
        for pod in self._pods.values():
            for name, state in changed:
                if name in pod.nodes and state.fits(pod.demand):
                    found.append(pod)
                    break
        for pod in found:
            del self._pods[pod.uid]
        return found
