"""List-then-watch of pods, nodes, Services or VirtualMachines as an endless stream of
``Listed`` and ``Changed`` items.

Shell: I/O through ``KubeClient`` only, and no interpretation of the objects. It must not keep
a copy of the objects (the consumer owns its view) nor decide anything about them.

The shape follows kopf's ``watching.py``:

1. List, and yield ``Listed(objects, resource_version)``: the complete current state. The
   consumer *replaces* its view with it, which is how anything missed (a delete during a
   disconnect, a compacted history) gets reconciled: there is no other repair path.
2. Watch from that resourceVersion with bookmarks, advancing the version on every event,
   including ``BOOKMARK`` (never yielded: it only says "you are up to date until here").
3. When the stream ends (the server's ``timeoutSeconds``, a dropped connection), watch again
   from the last version. A 410 (an ``ERROR`` event in a 200 stream, or an HTTP 410) means
   that version is compacted away: go back to 1.

Retryable failures (``ServerError``, ``Unavailable``) wait a capped exponential backoff with
jitter; the others (``Forbidden``, ``BadResponse``...) are raised: repeating the same request
cannot fix RBAC or a decoding bug, and the owner of the task should crash loudly.
All waits use the event loop's clock, so tests run them in virtual time (looptime).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Generic, Literal, Protocol, TypeAlias, TypeVar, overload

import msgspec
import structlog

from kube_io.client import KubeClient, ResourceKind
from kube_io.errors import (
    Gone,
    KubeError,
    ServerError,
    StatusBody,
    error_from_status,
)
from protocol.codec import ProtocolError, decode
from protocol.kube import Node, Pod, Service, WatchEvent
from protocol.virtualmachine import VirtualMachine, VirtualMachineMigration

__all__ = [
    "Backoff",
    "ChangeType",
    "Changed",
    "Listed",
    "WatchItem",
    "WatchSettings",
    "interpret_event",
    "watch_objects",
]

log = structlog.get_logger(__name__)

T = TypeVar("T", Pod, Node, VirtualMachine, VirtualMachineMigration, Service)
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]


class Listed(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    """Every object that exists now. Replace your whole view with it."""

    objects: list[T]
    resource_version: str


class Changed(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    """One object was added, modified or deleted (``object`` is its last state)."""

    type: ChangeType
    object: T


WatchItem: TypeAlias = Listed[T] | Changed[T]


class Bookmark(msgspec.Struct, frozen=True, kw_only=True):
    """Internal: the stream is complete up to ``resource_version``; nothing changed."""

    resource_version: str


class WatchSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How long streams last and how failures back off. All durations in seconds."""

    # The server ends each stream after this; a fresh stream re-checks auth and rebalances
    # across API server replicas. kube's own reflectors use 5-10 minutes.
    stream_timeout_seconds: int = 300
    # Backoff after the n-th consecutive failure: min(max, initial * factor**(n-1)), minus up
    # to ``jitter_ratio`` of it so that many agents restarted together do not retry in step.
    backoff_initial_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    backoff_factor: float = 2.0
    jitter_ratio: float = 0.2


_DEFAULT_SETTINGS = WatchSettings()


class Backoff:
    """Capped exponential delays; ``reset`` after any progress."""

    def __init__(self, settings: WatchSettings, rng: random.Random) -> None:
        self._settings = settings
        self._rng = rng
        self.failures = 0

    def next_delay(self) -> float:
        s = self._settings
        delay = min(
            s.backoff_max_seconds, s.backoff_initial_seconds * s.backoff_factor**self.failures
        )
        self.failures += 1
        # Jitter only downwards, so the cap is a real upper bound.
        return delay * (1.0 - s.jitter_ratio * self._rng.random())

    def reset(self) -> None:
        self.failures = 0


class _BookmarkMeta(msgspec.Struct, kw_only=True, rename="camel"):
    resource_version: str = ""


class _BookmarkObject(msgspec.Struct, kw_only=True):
    # A bookmark's object is a skeleton (``"spec":{"containers":null}``): read only the version.
    metadata: _BookmarkMeta = msgspec.field(default_factory=_BookmarkMeta)


_CHANGE_TYPES: dict[str, ChangeType] = {
    "ADDED": "ADDED",
    "MODIFIED": "MODIFIED",
    "DELETED": "DELETED",
}


def interpret_event(event: WatchEvent, object_type: type[T]) -> Changed[T] | Bookmark:
    """One decoded stream line: a change, a bookmark, or (``ERROR``) a raised ``KubeError``.

    An ``ERROR`` event arrives inside an HTTP 200 stream; its Status's ``code`` (410 for a
    compacted version) is what classifies it.
    """
    try:
        if event.type == "BOOKMARK":
            meta = decode(_BookmarkObject, event.object).metadata
            return Bookmark(resource_version=meta.resource_version)
        change_type = _CHANGE_TYPES.get(event.type)
        if change_type is not None:
            return Changed(type=change_type, object=decode(object_type, event.object))
        if event.type == "ERROR":
            status = decode(StatusBody, event.object)
        else:
            raise ServerError(f"unknown watch event type {event.type!r}")
    except ProtocolError as e:
        raise ServerError(f"undecodable {event.type} watch event: {e}") from e
    if status.code is None or status.code < 400:
        # Not a classifiable failure; treat it as the server's problem and retry.
        raise ServerError(status.message or "watch ERROR event without a code", status=500)
    raise error_from_status(status, http_status=200)


class _Cursor:
    """Where the next step starts: None means list first."""

    def __init__(self) -> None:
        self.resource_version: str | None = None
        self.has_progressed = False


@overload
def watch_objects(
    client: KubeClient,
    kind: Literal["pods"],
    *,
    field_selector: str | None = None,
    label_selector: str | None = None,
    settings: WatchSettings = ...,
    rng: random.Random | None = None,
) -> AsyncIterator[WatchItem[Pod]]: ...


@overload
def watch_objects(
    client: KubeClient,
    kind: Literal["nodes"],
    *,
    field_selector: str | None = None,
    label_selector: str | None = None,
    settings: WatchSettings = ...,
    rng: random.Random | None = None,
) -> AsyncIterator[WatchItem[Node]]: ...


@overload
def watch_objects(
    client: KubeClient,
    kind: Literal["virtualmachines"],
    *,
    field_selector: str | None = None,
    label_selector: str | None = None,
    settings: WatchSettings = ...,
    rng: random.Random | None = None,
) -> AsyncIterator[WatchItem[VirtualMachine]]: ...


@overload
def watch_objects(
    client: KubeClient,
    kind: Literal["virtualmachinemigrations"],
    *,
    field_selector: str | None = None,
    label_selector: str | None = None,
    settings: WatchSettings = ...,
    rng: random.Random | None = None,
) -> AsyncIterator[WatchItem[VirtualMachineMigration]]: ...


@overload
def watch_objects(
    client: KubeClient,
    kind: Literal["services"],
    *,
    field_selector: str | None = None,
    label_selector: str | None = None,
    settings: WatchSettings = ...,
    rng: random.Random | None = None,
) -> AsyncIterator[WatchItem[Service]]: ...


async def watch_objects(
    client: KubeClient,
    kind: ResourceKind,
    *,
    field_selector: str | None = None,
    label_selector: str | None = None,
    settings: WatchSettings = _DEFAULT_SETTINGS,
    rng: random.Random | None = None,
) -> AsyncIterator[
    WatchItem[Pod]
    | WatchItem[Node]
    | WatchItem[VirtualMachine]
    | WatchItem[VirtualMachineMigration]
    | WatchItem[Service]
]:
    """Listed first, then Changed items, forever; Listed again whenever a relist was needed.

    ``rng`` drives the backoff jitter (pass a seeded one in tests). Raises only non-retryable
    ``KubeError``s; close the iterator (``contextlib.aclosing``) to stop watching.
    """
    selectors = _Selectors(field_selector=field_selector, label_selector=label_selector)
    # One watcher per kind, each built with its own object type and lister so that it stays
    # fully typed; the loop below serves them all.
    watcher: (
        _Watcher[Pod]
        | _Watcher[Node]
        | _Watcher[VirtualMachine]
        | _Watcher[VirtualMachineMigration]
        | _Watcher[Service]
    )
    if kind == "pods":
        watcher = _Watcher(
            client, kind, object_type=Pod, lister=client.list_pods,
            selectors=selectors, settings=settings, rng=rng,
        )  # fmt: skip
    elif kind == "virtualmachines":
        watcher = _Watcher(
            client, kind, object_type=VirtualMachine, lister=client.list_virtual_machines,
            selectors=selectors, settings=settings, rng=rng,
        )  # fmt: skip
    elif kind == "virtualmachinemigrations":
        watcher = _Watcher(
            client, kind, object_type=VirtualMachineMigration,
            lister=client.list_virtual_machine_migrations,
            selectors=selectors, settings=settings, rng=rng,
        )  # fmt: skip
    elif kind == "services":
        watcher = _Watcher(
            client, kind, object_type=Service, lister=client.list_services,
            selectors=selectors, settings=settings, rng=rng,
        )  # fmt: skip
    else:
        watcher = _Watcher(
            client, kind, object_type=Node, lister=client.list_nodes,
            selectors=selectors, settings=settings, rng=rng,
        )  # fmt: skip
    async with contextlib.aclosing(watcher.run()) as items:
        async for item in items:
            yield item


class _Selectors(msgspec.Struct, frozen=True, kw_only=True):
    field_selector: str | None
    label_selector: str | None


class _Lister(Protocol[T]):
    def __call__(
        self, *, field_selector: str | None = ..., label_selector: str | None = ...
    ) -> Awaitable[tuple[list[T], str]]: ...


class _Watcher(Generic[T]):
    def __init__(
        self,
        client: KubeClient,
        kind: ResourceKind,
        *,
        object_type: type[T],
        lister: _Lister[T],
        selectors: _Selectors,
        settings: WatchSettings,
        rng: random.Random | None,
    ) -> None:
        self.client = client
        self.kind: ResourceKind = kind
        self.object_type: type[T] = object_type
        self.lister: _Lister[T] = lister
        self.selectors = selectors
        self.settings = settings
        self.cursor = _Cursor()
        self.backoff = Backoff(settings, rng or random.Random())
        # Passed on every call rather than bound once: a logger bound here would keep the
        # processors configured at this moment (and miss structlog.testing.capture_logs).
        self.log_fields = {
            "kind": kind,
            "field_selector": selectors.field_selector,
            "label_selector": selectors.label_selector,
        }

    async def run(self) -> AsyncGenerator[WatchItem[T], None]:
        # Kept trivial on purpose (as in kopf): an endless loop cannot be tested to its end, so
        # every decision lives in ``step``, which returns after one list or one stream.
        while True:
            async with contextlib.aclosing(self.step()) as items:
                async for item in items:
                    yield item

    async def step(self) -> AsyncGenerator[WatchItem[T], None]:
        """One list or one watch stream, then whatever wait the outcome calls for."""
        try:
            if self.cursor.resource_version is None:
                yield await self.list()
            else:
                async with contextlib.aclosing(
                    self.stream(self.cursor.resource_version)
                ) as changes:
                    async for change in changes:
                        yield change
                await self.stream_ended()
        except Gone as e:
            await self.relist_needed(e)
        except KubeError as e:
            if not e.is_retryable:
                raise
            await self.wait_after_failure(e)

    async def list(self) -> Listed[T]:
        objects, rv = await self.lister(
            field_selector=self.selectors.field_selector,
            label_selector=self.selectors.label_selector,
        )
        self.cursor.resource_version = rv
        # No backoff reset here: a list that works while every watch fails is no progress.
        self.cursor.has_progressed = False
        log.info("watch_listed", **self.log_fields, count=len(objects), resource_version=rv)
        return Listed(objects=objects, resource_version=rv)

    async def stream(self, resource_version: str) -> AsyncGenerator[Changed[T], None]:
        """The changes of one watch stream; the cursor advances *before* each yield, so a
        consumer that stops right after an item resumes after it, not before."""
        events = self.client.watch_events(
            self.kind,
            resource_version=resource_version,
            field_selector=self.selectors.field_selector,
            label_selector=self.selectors.label_selector,
            timeout_seconds=self.settings.stream_timeout_seconds,
        )
        async with contextlib.aclosing(events):
            async for event in events:
                item = interpret_event(event, self.object_type)
                if isinstance(item, Bookmark):
                    new_rv = item.resource_version
                else:
                    new_rv = item.object.metadata.resource_version
                if new_rv:
                    self.cursor.resource_version = new_rv
                if not self.cursor.has_progressed:
                    self.cursor.has_progressed = True
                    self.backoff.reset()
                if isinstance(item, Changed):
                    yield item

    async def stream_ended(self) -> None:
        rv = self.cursor.resource_version
        if self.cursor.has_progressed:
            log.debug("watch_resumed", **self.log_fields, resource_version=rv)
            self.cursor.has_progressed = False
            return
        # A stream that ended without a single event (not even a bookmark) may be a server
        # closing streams at once; back off so that it cannot become a hot loop.
        delay = self.backoff.next_delay()
        log.debug("watch_resumed", **self.log_fields, resource_version=rv, delay_seconds=delay)
        await asyncio.sleep(delay)

    async def relist_needed(self, error: Gone) -> None:
        rv = self.cursor.resource_version
        self.cursor.resource_version = None
        # A 410 before this stream delivered anything: if that repeats, the server compacts
        # faster than we can list and watch; wait rather than relist in a tight loop.
        delay = 0.0 if self.cursor.has_progressed else self.backoff.next_delay()
        self.cursor.has_progressed = False
        log.info(
            "watch_relisted",
            **self.log_fields,
            resource_version=rv,
            error=error.message,
            delay_seconds=delay,
        )
        if delay:
            await asyncio.sleep(delay)

    async def wait_after_failure(self, error: KubeError) -> None:
        delay = self.backoff.next_delay()
        if error.retry_after_seconds is not None:
            delay = max(delay, error.retry_after_seconds)
        log.warning(
            "watch_failed",
            **self.log_fields,
            resource_version=self.cursor.resource_version,
            error=repr(error),
            delay_seconds=delay,
        )
        await asyncio.sleep(delay)
