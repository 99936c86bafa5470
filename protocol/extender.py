"""kube-scheduler extender v1 messages (``k8s.io/kube-scheduler/extender/v1``).

Pure. The Go structs carry no json tags, so the wire keys are the Go field names in
PascalCase. ``PodUID`` and ``UID`` are named explicitly: msgspec's "pascal" renaming would
produce ``PodUid``, and msgspec matches keys case-sensitively.

Which field carries the nodes depends on ``nodeCacheCapable`` in the scheduler's extender
config: when true kube-scheduler sends ``NodeNames`` (and ``Nodes: null``) and reads the answer
from ``NodeNames``; when false it sends full Node objects in ``Nodes`` and reads ``Nodes``.
Answering in the other field filters out every node, so handlers answer in the field the
request used.
"""

from __future__ import annotations

import msgspec

from protocol.bounds import Int64
from protocol.kube import ListMeta, Node, Pod


class _Msg(msgspec.Struct, rename="pascal", kw_only=True):
    pass


class ExtenderNodeList(msgspec.Struct, kw_only=True):
    """``v1.NodeList`` as kube-scheduler sends it: ``{"metadata": {}, "items": [...]}``."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Node] = msgspec.field(default_factory=list)


class ExtenderArgs(_Msg):
    """Body of filter and prioritize."""

    pod: Pod
    nodes: ExtenderNodeList | None = None
    node_names: list[str] | None = None


class ExtenderFilterResult(_Msg):
    """Answer to filter. Exactly one of ``nodes``/``node_names`` is set, as in the request."""

    nodes: ExtenderNodeList | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] = msgspec.field(default_factory=dict)
    failed_and_unresolvable_nodes: dict[str, str] = msgspec.field(default_factory=dict)
    error: str = ""


class HostPriority(_Msg):
    host: str
    score: int


class ExtenderBindingArgs(_Msg):
    pod_name: str
    pod_namespace: str
    pod_uid: str = msgspec.field(name="PodUID")
    node: str


class ExtenderBindingResult(_Msg):
    error: str = ""


class MetaPod(msgspec.Struct, kw_only=True):
    uid: str = msgspec.field(name="UID")


class MetaVictims(_Msg):
    pods: list[MetaPod] | None = None
    num_pdb_violations: Int64 = msgspec.field(default=0, name="NumPDBViolations")


class Victims(_Msg):
    pods: list[Pod] | None = None
    num_pdb_violations: Int64 = msgspec.field(default=0, name="NumPDBViolations")


class ExtenderPreemptionArgs(_Msg):
    """Body of preempt. nodeCacheCapable true sends ``NodeNameToMetaVictims`` (UIDs only);
    false sends ``NodeNameToVictims`` with whole Pods. The answer is always the Meta form."""

    pod: Pod
    node_name_to_victims: dict[str, Victims] | None = None
    node_name_to_meta_victims: dict[str, MetaVictims] | None = None


class ExtenderPreemptionResult(_Msg):
    node_name_to_meta_victims: dict[str, MetaVictims] = msgspec.field(default_factory=dict)
