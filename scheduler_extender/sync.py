"""Keeping the ledger in step with the API server: list-then-watch of Nodes and Pods (and,
with relief on, VirtualMachineMigrations).

Shell: the I/O is ``kube_io.watch_objects``; every object goes straight into ``Extender``'s
synchronous methods, so no ledger update ever spans an ``await``. A ``Listed`` item *replaces*
the view (that is how deletes missed during a disconnect get reconciled); the first one of each
kind flips the extender's synced flags, which the verbs and the permit port wait for.

Pods of all namespaces are watched, not only ours: foreign pods occupy capacity too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import structlog

from kube_io.client import KubeClient
from kube_io.watch import Listed, WatchItem, WatchSettings, watch_objects
from protocol.kube import Node, Pod
from protocol.virtualmachine import VirtualMachineMigration
from scheduler_extender.service import Extender

log = structlog.get_logger(__name__)

Watched = TypeVar("Watched", Pod, Node, VirtualMachineMigration)


async def follow(
    items: AsyncIterator[WatchItem[Watched]],
    listed: Callable[[list[Watched]], None],
    changed: Callable[[str, Watched], None],
    event: str,
) -> None:
    """One kind's list-then-watch into the extender: a list replaces its view, each change
    is applied as it comes."""
    async for item in items:
        if isinstance(item, Listed):
            listed(item.objects)
            log.info(event, count=len(item.objects))
        else:
            changed(item.type, item.object)


async def follow_cluster(client: KubeClient, extender: Extender) -> None:
    """The watches until cancelled. A non-retryable watch failure (RBAC, a decoding bug) ends
    the task with the error logged: the readiness probe then stays false and a human looks."""
    settings = WatchSettings(stream_timeout_seconds=extender.config.kube.watch_timeout_seconds)
    try:
        async with asyncio.TaskGroup() as group:
            nodes = watch_objects(client, "nodes", settings=settings)
            group.create_task(
                follow(nodes, extender.nodes_listed, extender.node_changed, "nodes_listed")
            )
            pods = watch_objects(client, "pods", settings=settings)
            group.create_task(
                follow(pods, extender.pods_listed, extender.pod_changed, "pods_listed")
            )
            if extender.config.relief.enabled:
                # Relief's moves: every VirtualMachineMigration, whoever made it, is in
                # relief's book (moves in flight, cool-downs, failure backoffs).
                migrations = watch_objects(client, "virtualmachinemigrations", settings=settings)
                group.create_task(
                    follow(
                        migrations,
                        extender.migrations_listed,
                        extender.migration_changed,
                        "migrations_listed",
                    )
                )
    except* Exception as errors:
        # Task boundary: log why the view of the cluster stopped, then let the app decide.
        for error in errors.exceptions:
            log.error("cluster_watch_failed", error=repr(error))
        extender.has_nodes = extender.has_pods = extender.has_migrations = False
        extender.metrics.synced.set(0)
        raise
