"""Standalone mode: nodes and pods from one YAML file instead of an API server.

Shell (reads one file at start). For local runs, the run-bench and end-to-end tests on one
machine: the extender answers the verbs and the permit port exactly as in a cluster, but
``bind`` only records (there is nothing to POST to) and permits are not written anywhere.
The file's objects become ``protocol.kube`` Nodes and Pods, so they take the same path
(``pod_info``, the ledger) as objects from a watch. See ``examples/standalone-cluster.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import yaml

from protocol.bounds import Int32
from protocol.kube import (
    Container,
    Node,
    NodeStatus,
    ObjectMeta,
    Pod,
    PodSpec,
    PodStatus,
    ResourceRequirements,
)
from protocol.strict_yaml import describe_yaml_error
from scheduler_extender.config import ConfigError

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class StandaloneNode(_Section, frozen=True):
    name: NonEmpty
    cpu: NonEmpty  # allocatable, a Kubernetes quantity ("16", "15500m")
    memory: NonEmpty  # allocatable ("64Gi")
    labels: dict[str, str] = {}


class StandalonePod(_Section, frozen=True):
    name: NonEmpty
    uid: NonEmpty
    namespace: NonEmpty = "default"
    # Already running there; absent: waits for kube-scheduler (or a test) to bind it.
    node: str | None = None
    # Absent: the extender's own scheduler_name (the pod is "ours").
    scheduler_name: str | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    requests: dict[str, str] = {}
    priority: Int32 = 0
    phase: str = "Running"


class StandaloneCluster(_Section, frozen=True):
    nodes: list[StandaloneNode] = []
    pods: list[StandalonePod] = []

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        uids = [p.uid for p in self.pods]
        if len(set(uids)) != len(uids):
            raise ValueError("pod uids must be unique")

    def node_objects(self) -> list[Node]:
        return [
            Node(
                metadata=ObjectMeta(name=n.name, uid=f"standalone-{n.name}", labels=n.labels),
                status=NodeStatus(
                    allocatable={"cpu": n.cpu, "memory": n.memory},
                    capacity={"cpu": n.cpu, "memory": n.memory},
                ),
            )
            for n in self.nodes
        ]

    def pod_objects(self, *, scheduler_name: str) -> list[Pod]:
        return [
            Pod(
                metadata=ObjectMeta(
                    name=p.name,
                    namespace=p.namespace,
                    uid=p.uid,
                    labels=p.labels or None,
                    annotations=p.annotations or None,
                ),
                spec=PodSpec(
                    node_name=p.node,
                    scheduler_name=p.scheduler_name or scheduler_name,
                    containers=[
                        Container(
                            name="vm",
                            resources=ResourceRequirements(
                                requests=dict(p.requests), limits=dict(p.requests)
                            ),
                        )
                    ],
                    priority=p.priority,
                ),
                status=PodStatus(phase=p.phase if p.node else "Pending"),
            )
            for p in self.pods
        ]


def load_cluster(path: Path) -> StandaloneCluster:
    """Read the standalone cluster file; ConfigError (exit 3) naming ``$.path`` otherwise."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {describe_yaml_error(e)}") from e
    try:
        return msgspec.convert(data or {}, StandaloneCluster)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{path}: {e}") from e
