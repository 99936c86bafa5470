"""Telling pods and humans about waits: Events, and nudges for pods that may now be placed.

Shell. Three things, all off the request path and all best effort (the decisions are already
made; a lost notice only costs time):

* **Waiting.** A pod that filter leaves waiting for its namespace's quota gets an Event
  ``WaitingForQuota`` with the reason (position included), at most once per
  ``WAITING_EVENT_INTERVAL_SECONDS`` per pod: kube-scheduler retries a parked pod every few
  seconds to minutes, and one Event per filter call would flood the API server.
* **Admitted.** A pod admitted *after* it was told to wait has been parked by kube-scheduler in
  its unschedulable queue, from which it only comes back after a back-off, a cluster event, or
  the five-minute flush. So it is nudged: an Event ``QuotaAdmitted``, and a merge patch that
  sets the annotation ``vm-autoscaling.io/admitted-at`` (wall-clock, RFC 3339). The patch is
  what matters: an update of the pod itself makes kube-scheduler's queue re-evaluate the pod
  (``SchedulingQueue.Update`` moves an updated unschedulable pod to the active or back-off
  queue), so it is retried within a scheduling cycle instead of after the back-off. Admission
  holds the quota only for ``admission_ttl_seconds``, so promptness is not cosmetic.

* **Room.** A pod that filter rejected on every node is parked by kube-scheduler just the
  same; ``core.parked`` says when one of its nodes has room for it again (a pod deleted or
  finished, a VM shrunk, a node added or grown, a failed bind's hold given back). It gets the
  same kind of touch, annotation ``vm-autoscaling.io/room-freed-at``, and no Event: the
  retry's own outcome is what a human needs to see. Without it a pod that kube-scheduler
  retried before the extender's watch saw the room waited for the five-minute flush.

Patches are coalesced per pod (a pod admitted twice before the writer runs is touched once)
and paced (``touches_per_second``), so a relist that frees room for a thousand pods spreads
its patches instead of bursting them at the API server.

**The fence.** Every Binding the extender sends carries the resourceVersion it decided on as
a precondition (upstream ``pkg/registry/core/pod/storage/storage.go``: ``BindingREST.Create``
passes the Binding's ``metadata.uid`` and ``metadata.resourceVersion`` to
``setPodNodeAndMetadata``, which makes both ``storage.Preconditions`` of its
``GuaranteedUpdate``; a mismatch is 409). That is what fences a deposed leader's Binding
(``Extender.fence``), so the touches must neither break the leader's own Bindings nor come
from a deposed leader:

* a touch is a write of our own, so its answer's resourceVersion is the pod's as far as our
  Bindings go (``version``) until the watch shows it (``seen``): a Binding decided right after
  the touch, before the watch caught up, carries the touched version instead of failing on it;
* a bind of a pod supersedes its queued touch (the bind is what the touch asks for), no touch
  starts while the pod's bind is in flight, and a touch already on its way is awaited by the
  bind (``before_bind``) so that the Binding follows it with its version;
* only the leader writes, decided when each patch is sent (the reporter's ``is_quiet``, which
  asks the Lease at that moment), and ``stand_down`` drops every queued touch and cancels the
  one in flight the moment leadership is lost. A patch already on the wire then may still
  land; it was sent while this replica held the Lease, so before the new leader's fence.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Final, Protocol

import structlog

from kube_io.errors import KubeError
from kube_io.objects import ObjectReference
from protocol.kube import Pod
from scheduler_extender.admission.queue import PodKey
from scheduler_extender.core.parked import ParkedPods
from scheduler_extender.kube.node_alloc import NodeAllocReporter

log = structlog.get_logger(__name__)

ADMITTED_AT_ANNOTATION: Final = "vm-autoscaling.io/admitted-at"
ROOM_FREED_AT_ANNOTATION: Final = "vm-autoscaling.io/room-freed-at"
WAITING_REASON: Final = "WaitingForQuota"
ADMITTED_REASON: Final = "QuotaAdmitted"
# Per pod: a user running ``kubectl describe`` sees the current reason within a minute, and a
# namespace with a thousand waiting pods costs the API server at most ~17 Events a second.
WAITING_EVENT_INTERVAL_SECONDS: Final = 60.0


class AnnotationPatcher(Protocol):
    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> Pod: ...


def _involved(key: PodKey) -> ObjectReference:
    return ObjectReference(
        api_version="v1", kind="Pod", name=key.name, namespace=key.namespace, uid=key.uid
    )


class QueueNotices:
    def __init__(
        self,
        reporter: NodeAllocReporter,
        patcher: AnnotationPatcher | None,
        *,
        wall_clock: Callable[[], float],
        touches_per_second: float = 50.0,
    ) -> None:
        self._reporter = reporter
        # None: standalone mode, no API server; there is no kube-scheduler to nudge either.
        self._patcher = patcher
        self._wall_clock = wall_clock
        self._touch_interval = 1.0 / touches_per_second
        self._last_waiting_event: dict[str, float] = {}
        # uid -> (pod, the annotation that says why it is touched)
        self._to_touch: dict[str, tuple[PodKey, str]] = {}
        self._parked: ParkedPods | None = None
        # Pods whose bind is in flight (``Extender.binds_in_flight``): not touched meanwhile.
        self._binding: Container[str] = ()
        # The touch on its way: (uid, its task); a bind of that pod awaits it.
        self._touching: tuple[str, asyncio.Task[None]] | None = None
        # uid -> the resourceVersion our own last write gave the pod, until the watch shows it.
        self._versions: dict[str, str] = {}
        # uid -> the versions the watch delivered while our write of the pod was on its way
        # (the watch may show the write before its answer comes back).
        self._watched: dict[str, set[str]] = {}
        self._wake = asyncio.Event()
        self.touched_total = 0
        self.room_nudged_total = 0

    def watch_room(self, parked: ParkedPods, *, binding: Container[str] = ()) -> None:
        """Nudge the parked pods that ``parked`` finds room for (call ``room_changed`` when it
        has changes: it is ``ParkedPods``' ``on_change``); never a pod in ``binding``."""
        self._parked = parked
        self._binding = binding

    # -- the fence (module docstring) ------------------------------------------------------

    async def patch(
        self,
        patcher: AnnotationPatcher,
        key: PodKey,
        annotations: Mapping[str, str | None],
    ) -> Pod:
        """Our own write of a pod (a touch, the fence): its answer's version is the pod's for
        our Bindings until the watch shows it (``version``)."""
        watched = self._watched[key.uid] = set()
        try:
            written = await patcher.patch_pod_annotations(key.namespace, key.name, annotations)
        finally:
            if self._watched.get(key.uid) is watched:
                del self._watched[key.uid]
        version = written.metadata.resource_version
        if version and version not in watched:
            self._versions[key.uid] = version
        return written

    def seen(self, uid: str, version: str | None) -> None:
        """The watch delivered ``version`` of the pod: once it is our own write's, the watch
        has caught up and its versions are the pod's again."""
        watched = self._watched.get(uid)
        if watched is not None and version:
            watched.add(version)
        if self._versions.get(uid) == version:
            del self._versions[uid]

    def relisted(self) -> None:
        """A new list replaced the watch's view: it is at least as new as our writes."""
        self._versions.clear()

    def version(self, uid: str) -> str | None:
        """The version our own last write gave the pod, while the watch has not shown it."""
        return self._versions.get(uid)

    def before_bind(self, uid: str) -> asyncio.Task[None] | None:
        """A bind of ``uid`` is being decided: drop its queued touch, and return the touch on
        its way, if any, for the bind to await (its Binding then carries the new version)."""
        self._to_touch.pop(uid, None)
        if self._touching is not None and self._touching[0] == uid:
            return self._touching[1]
        return None

    def stand_down(self) -> None:
        """Leadership is lost: nothing queued goes out, and the touch in flight is cancelled."""
        self._to_touch.clear()
        if self._touching is not None:
            self._touching[1].cancel()

    def room_changed(self) -> None:
        self._wake.set()

    def waiting(self, key: PodKey, reason: str, *, now: float) -> None:
        """Filter left ``key`` waiting; post the reason unless it was posted recently."""
        last = self._last_waiting_event.get(key.uid)
        if last is not None and now - last < WAITING_EVENT_INTERVAL_SECONDS:
            return
        self._last_waiting_event[key.uid] = now
        self._reporter.post(_involved(key), reason=WAITING_REASON, message=reason)

    def admitted(self, keys: Iterable[PodKey]) -> None:
        """Pods admitted after they waited: post an Event and queue the touch."""
        for key in keys:
            self._last_waiting_event.pop(key.uid, None)
            log.info("pod_admitted_nudged", pod=key.key, uid=key.uid)
            self._reporter.post(
                _involved(key),
                reason=ADMITTED_REASON,
                message=f"admitted within the quota of namespace {key.namespace}; scheduling"
                " resumes",
            )
            if self._patcher is not None and not self._reporter.is_quiet():
                self._to_touch[key.uid] = (key, ADMITTED_AT_ANNOTATION)
                self._wake.set()

    def forget(self, uid: str) -> None:
        """The pod is gone: no Event memory, no touch."""
        self._last_waiting_event.pop(uid, None)
        self._to_touch.pop(uid, None)
        self._versions.pop(uid, None)

    @property
    def pending_touches(self) -> int:
        return len(self._to_touch)

    @property
    def is_touching(self) -> bool:
        """A touch is on its way."""
        return self._touching is not None

    def _take_room(self) -> None:
        """Queue a touch for every parked pod that now fits a node it was offered."""
        if self._parked is None or self._patcher is None or self._reporter.is_quiet():
            return
        for pod in self._parked.fitting():
            key = PodKey(namespace=pod.namespace, name=pod.name, uid=pod.uid)
            log.info("pod_room_nudged", pod=key.key, uid=key.uid)
            self.room_nudged_total += 1
            self._to_touch[key.uid] = (key, ROOM_FREED_AT_ANNOTATION)

    async def run(self) -> None:
        """Touch pods one at a time, paced, forever (a ``cleanup_ctx`` task)."""
        if self._patcher is None:
            return
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._take_room()
            while self._to_touch:
                uid = next(iter(self._to_touch))
                key, annotation = self._to_touch.pop(uid)
                if uid in self._binding:
                    continue  # being bound: what the touch asks for is under way
                if self._reporter.is_quiet():
                    # Decided as it is sent: a replica that no longer leads writes nothing.
                    self._to_touch.clear()
                    break
                touch = asyncio.get_running_loop().create_task(
                    self._touch(self._patcher, key, annotation)
                )
                self._touching = (uid, touch)
                try:
                    # ``wait``: the touch's own cancellation (``stand_down``) ends it, not us.
                    await asyncio.wait([touch])
                finally:
                    self._touching = None
                    touch.cancel()
                # Room that freed while the patch was in flight: before the next pod, so that
                # a pod that found room again is not touched twice.
                self._take_room()
                if self._to_touch:
                    await asyncio.sleep(self._touch_interval)

    async def _touch(self, patcher: AnnotationPatcher, key: PodKey, annotation: str) -> None:
        stamp = datetime.datetime.fromtimestamp(self._wall_clock(), datetime.UTC)
        try:
            await self.patch(patcher, key, {annotation: stamp.isoformat(timespec="milliseconds")})
        except KubeError as e:
            # Best effort: kube-scheduler still retries after its back-off or flush; an
            # admitted pod keeps its quota until admission_ttl_seconds.
            log.warning(
                "pod_touch_failed",
                pod=key.key,
                annotation=annotation,
                error=e.message,
                status=e.status,
            )
            return
        self.touched_total += 1
