"""NODE_ALLOC: telling humans when a pod gets or loses its place on a node.

Shell. For each ledger ``AllocEvent`` of kind add/remove: one structured log line
``node_alloc`` (foreign pods included, marked ``foreign=true``), and, for this scheduler's own
pods only, a Kubernetes Event with reason ``NODE_ALLOC`` on the pod (``kubectl describe pod``).
A bind through the bind verb has its line already: the request's own (``http.middleware``),
which names the pod, the node and the outcome, carries the allocation's ``uid``,
``cpu_millis`` and ``memory_bytes`` too; a second line for the same bind said nothing more and
cost each bind another render and write on the loop that answers kube-scheduler.

The initial list is not reported pod by pod: on a large cluster that would be thousands of
Events at every start (a flood the API server does not need); one summary line is logged
instead. Resizes (permits) are not reported here: the permit request's own log line says it, and
there can be tens of thousands a second. Nor is a bind through the bind verb given an Event of
its own: kube-scheduler's ``Scheduled`` Event already says where the pod went, and one more
write per pod cost the API server a third of its work at full scheduling speed.

Events are posted by a background task from a bounded queue; when the API is slow, Events are
dropped (counted), never the decisions that caused them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Final, Literal, Protocol

import structlog

from kube_io.errors import KubeError
from kube_io.objects import ObjectReference
from scheduler_extender.core.ledger import AllocAction, AllocEvent
from scheduler_extender.metrics import Metrics

log = structlog.get_logger(__name__)

REASON: Final = "NODE_ALLOC"
COMPONENT: Final = "vm-scheduler-extender"
_QUEUE_SIZE: Final = 1000


class EventPoster(Protocol):
    async def create_event(
        self,
        involved: ObjectReference,
        *,
        reason: str,
        message: str,
        type: Literal["Normal", "Warning"] = "Normal",
        component: str,
        host: str | None = None,
    ) -> None: ...


class NodeAllocReporter:
    def __init__(self, metrics: Metrics, poster: EventPoster | None) -> None:
        self._metrics = metrics
        self._poster = poster
        # True on the standby of two replicas: the leader tells humans; two would say it twice.
        self.is_quiet: Callable[[], bool] = _never
        self._queue: asyncio.Queue[tuple[ObjectReference, str, str]] = asyncio.Queue(_QUEUE_SIZE)

    def report(
        self,
        events: Iterable[AllocEvent],
        *,
        is_initial: bool = False,
        is_announced: bool = False,
    ) -> None:
        """``is_announced``: a bind through the bind verb, inside its request. The pods' Events
        are someone else's to post (kube-scheduler posts ``Scheduled`` naming the node for
        every pod it binds, and a second Event per pod would double the API server's writes
        for each bind), and the allocation goes on the request's log line (module docstring)."""
        count = 0
        for event in events:
            if event.action is AllocAction.RESIZE:
                continue
            count += 1
            if is_initial:
                continue
            held = event.held if event.action is AllocAction.ADD else event.previous
            if is_announced:
                structlog.contextvars.bind_contextvars(
                    uid=event.uid, cpu_millis=held.cpu_millis, memory_bytes=held.memory_bytes
                )
                continue
            log.info(
                "node_alloc",
                action=event.action.value,
                node=event.node,
                pod=event.pod,
                uid=event.uid,
                foreign=event.is_foreign,
                cpu_millis=held.cpu_millis,
                memory_bytes=held.memory_bytes,
            )
            if not event.is_foreign and self._poster is not None:
                self._enqueue(event, held.cpu_millis, held.memory_bytes)
        if is_initial and count:
            log.info("node_alloc_initial", allocations=count)

    def _enqueue(self, event: AllocEvent, cpu_millis: int, memory_bytes: int) -> None:
        namespace, _, name = event.pod.partition("/")
        verb = "allocated on" if event.action is AllocAction.ADD else "released from"
        message = f"{cpu_millis}m cpu, {memory_bytes} bytes memory {verb} node {event.node}"
        involved = ObjectReference(
            api_version="v1", kind="Pod", name=name, namespace=namespace, uid=event.uid
        )
        self.post(involved, reason=REASON, message=message)

    def post(self, involved: ObjectReference, *, reason: str, message: str) -> None:
        """Queue one Event (any reason: ``ScaleUpRecommended`` shares this path); dropped and
        counted when the queue is full, never blocking the caller."""
        if self._poster is None or self.is_quiet():
            return
        try:
            self._queue.put_nowait((involved, reason, message))
        except asyncio.QueueFull:
            self._metrics.events_dropped.inc()

    async def run(self) -> None:
        """Post queued Events one by one, forever (a ``cleanup_ctx`` task)."""
        if self._poster is None:
            return
        while True:
            involved, reason, message = await self._queue.get()
            if self.is_quiet():
                continue  # queued while leading; a replica that no longer leads posts nothing
            try:
                await self._poster.create_event(
                    involved, reason=reason, message=message, component=COMPONENT
                )
            except KubeError as e:
                # An Event is a courtesy to humans; the allocation itself is already done.
                self._metrics.events_dropped.inc()
                log.warning("node_alloc_event_failed", error=e.message, pod=involved.name)


def _never() -> bool:
    return False
