"""The subset of Kubernetes API objects this project reads, as msgspec structs.

Pure. A tolerant reader: unknown fields are ignored (new Kubernetes versions add fields all the
time), and every optional field accepts ``null`` because the API server and kube-scheduler both
send it (a watch BOOKMARK carries ``"containers": null``). Keys are the API's camelCase.

Only what some component needs is declared; decoding skips the rest cheaply, which matters on
the extender's hot path where kube-scheduler sends a whole Pod on every call.
"""

from __future__ import annotations

import msgspec

from protocol.bounds import Int32, Int64

StrMap = dict[str, str]


class _Obj(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """Base for API objects: camelCase keys, keyword construction, defaults not written."""


class OwnerReference(_Obj):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class ObjectMeta(_Obj):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: Int64 | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: StrMap | None = None
    annotations: StrMap | None = None
    owner_references: list[OwnerReference] | None = None


class ResourceRequirements(_Obj):
    requests: StrMap | None = None
    limits: StrMap | None = None


class Container(_Obj):
    name: str = ""
    resources: ResourceRequirements | None = None
    # Only meaningful for init containers: "Always" makes it a sidecar that runs beside the
    # main containers, which changes how the pod's requests add up.
    restart_policy: str | None = None


class Toleration(_Obj):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: Int64 | None = None


class NodeSelectorRequirement(_Obj):
    key: str
    operator: str
    values: list[str] | None = None


class NodeSelectorTerm(_Obj):
    match_expressions: list[NodeSelectorRequirement] | None = None
    match_fields: list[NodeSelectorRequirement] | None = None


class NodeSelector(_Obj):
    node_selector_terms: list[NodeSelectorTerm] | None = None


class NodeAffinity(_Obj):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None


class Affinity(_Obj):
    node_affinity: NodeAffinity | None = None


class EmptyDirVolumeSource(_Obj):
    medium: str | None = None
    size_limit: str | None = None


class Volume(_Obj):
    """A pod's volume: only whether it is an ``emptyDir`` is read (a drain's rule)."""

    name: str = ""
    empty_dir: EmptyDirVolumeSource | None = None


class PodSpec(_Obj):
    node_name: str | None = None
    # Pod-level resources (KEP-2837): requests for the pod as a whole, beside or instead of the
    # containers' own.
    resources: ResourceRequirements | None = None
    service_account_name: str | None = None
    scheduler_name: str | None = None
    containers: list[Container] | None = None
    init_containers: list[Container] | None = None
    overhead: StrMap | None = None
    priority: Int32 | None = None
    priority_class_name: str | None = None
    node_selector: StrMap | None = None
    affinity: Affinity | None = None
    tolerations: list[Toleration] | None = None
    volumes: list[Volume] | None = None


class ContainerStatus(_Obj):
    name: str = ""
    # "<runtime>://<id>" (containerd://..., cri-o://...): names the container's cgroup.
    container_id: str | None = msgspec.field(default=None, name="containerID")
    # In-place resize (KEP-1287): what the kubelet has admitted, and what it has actuated (its
    # ``requests`` read back from the container's cgroup); either may differ from the spec.
    allocated_resources: StrMap | None = None
    resources: ResourceRequirements | None = None


class PodCondition(_Obj):
    type: str = ""
    status: str = ""
    reason: str | None = None


class PodStatus(_Obj):
    phase: str | None = None
    pod_ip: str | None = msgspec.field(default=None, name="podIP")
    qos_class: str | None = None  # Guaranteed, Burstable, BestEffort: the cgroup's parent
    conditions: list[PodCondition] | None = None
    container_statuses: list[ContainerStatus] | None = None
    init_container_statuses: list[ContainerStatus] | None = None
    # In-place resize of pod-level resources (KEP-5419): what the kubelet admitted for the pod
    # as a whole, and what it actuated (read back from the pod's cgroup).
    allocated_resources: StrMap | None = None
    resources: ResourceRequirements | None = None


class Pod(_Obj):
    api_version: str | None = None
    kind: str | None = None
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class Taint(_Obj):
    key: str
    value: str | None = None
    effect: str = ""


class NodeSpec(_Obj):
    unschedulable: bool | None = None
    taints: list[Taint] | None = None


class NodeCondition(_Obj):
    type: str
    status: str


class NodeStatus(_Obj):
    allocatable: StrMap | None = None
    capacity: StrMap | None = None
    conditions: list[NodeCondition] | None = None


class Node(_Obj):
    api_version: str | None = None
    kind: str | None = None
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


class ServiceSpec(_Obj):
    selector: dict[str, str] | None = None


class Service(_Obj):
    """Who a Service is, who owns it, and which pods it selects: the vm-controller makes each
    VM's Service from its VirtualMachine, and sets the selector of one it owns back to the
    VM's if it differs (a Service made by an older controller)."""

    api_version: str | None = None
    kind: str | None = None
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ServiceSpec = msgspec.field(default_factory=ServiceSpec)


class ListMeta(_Obj):
    resource_version: str = ""
    # ``continue`` is a Python keyword.
    continue_: str | None = msgspec.field(default=None, name="continue")


class PodList(_Obj):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Pod] | None = None


class NodeList(_Obj):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Node] | None = None


class ServiceList(_Obj):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Service] | None = None


class Status(_Obj):
    """``meta/v1 Status``: the body of API errors, of Binding's 201, and of watch ERROR events."""

    kind: str | None = None
    api_version: str | None = None
    status: str | None = None
    message: str | None = None
    reason: str | None = None
    code: int | None = None


class WatchEvent(msgspec.Struct, kw_only=True):
    """One line of a watch stream. ``object`` stays raw until the type says what it is."""

    type: str
    object: msgspec.Raw
