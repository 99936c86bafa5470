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

import structlog

from kube_io.client import KubeClient
from kube_io.watch import Listed, WatchSettings, watch_objects
from scheduler_extender.service import Extender

log = structlog.get_logger(__name__)


async def follow_nodes(client: KubeClient, extender: Extender, settings: WatchSettings) -> None:
    async for item in watch_objects(client, "nodes", settings=settings):
        if isinstance(item, Listed):
            extender.nodes_listed(item.objects)
            log.info("nodes_listed", count=len(item.objects))
        else:
            extender.node_changed(item.type, item.object)


async def follow_pods(client: KubeClient, extender: Extender, settings: WatchSettings) -> None:
    async for item in watch_objects(client, "pods", settings=settings):
        if isinstance(item, Listed):
            extender.pods_listed(item.objects)
            log.info("pods_listed", count=len(item.objects))
        else:
            extender.pod_changed(item.type, item.object)


async def follow_migrations(
    client: KubeClient, extender: Extender, settings: WatchSettings
) -> None:
    """Relief's moves (``relief.enabled`` only): every VirtualMachineMigration, whoever made
    it, is in relief's book (moves in flight, cool-downs, failure backoffs)."""
    async for item in watch_objects(client, "virtualmachinemigrations", settings=settings):
        if isinstance(item, Listed):
            extender.migrations_listed(item.objects)
            log.info("migrations_listed", count=len(item.objects))
        else:
            extender.migration_changed(item.type, item.object)


async def follow_cluster(client: KubeClient, extender: Extender) -> None:
    """The watches until cancelled. A non-retryable watch failure (RBAC, a decoding bug) ends
    the task with the error logged: the readiness probe then stays false and a human looks."""
    settings = WatchSettings(stream_timeout_seconds=extender.config.kube.watch_timeout_seconds)
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(follow_nodes(client, extender, settings))
            group.create_task(follow_pods(client, extender, settings))
            if extender.config.relief.enabled:
                group.create_task(follow_migrations(client, extender, settings))
    except* Exception as errors:
        # Task boundary: log why the view of the cluster stopped, then let the app decide.
        for error in errors.exceptions:
            log.error("cluster_watch_failed", error=repr(error))
        extender.has_nodes = extender.has_pods = extender.has_migrations = False
        extender.metrics.synced.set(0)
        raise
