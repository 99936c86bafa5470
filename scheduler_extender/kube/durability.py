"""Recording permits on the pods, off the request path, so that a restart rebuilds them.

Shell. Every permit that changes a VM's size is written to its pod:

* the annotations ``vm-autoscaling.io/permitted-vcpus`` / ``permitted-memory`` (a JSON merge
  patch): what a restarted extender reads back through ``podinfo.pod_info``;
* where the cluster supports in-place resize, the VM container's CPU request and limit through
  the ``pods/resize`` subresource, so that the kubelet and kube-scheduler see the VM's real size.
  The first ``NotSupported`` switches that off for the life of the process. For a VM whose
  memory scales (``max-memory`` above ``min-memory``), the container's memory request and limit
  follow the permitted memory in the same patch, plus the container's own overhead: its memory
  above ``min-memory`` as written, QEMU's room (recorded as ``memory-overhead`` with the first
  permit, before any resize, so a restart reads it back; the ledger holds the same).
  Requests and limits move together, so a Guaranteed pod stays
  Guaranteed; decreasing a memory limit in place needs Kubernetes v1.35+ and the container's
  memory ``resizePolicy`` ``NotRequired`` (the default). A VM whose memory does not scale keeps
  its container's memory as written.

The permit handler only calls ``record`` (a dict store); worker tasks do the PATCHes. Writes are
coalesced per pod: only the latest permit of a pod is ever written, and one pod is never written
by two workers at once (so an older value cannot land after a newer one). Retryable failures
back off exponentially per pod; a newer permit replaces the one waiting to be retried.

Losing a pending write (a crash) is safe: the agent's ``lastPermit`` covers the gap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import NamedTuple, Protocol

import structlog

from kube_io.errors import KubeError, NotFound, NotSupported
from protocol import annotations as ann
from protocol.kube import Pod
from protocol.quantity import format_memory
from scheduler_extender.config import DurabilityConfig
from scheduler_extender.kube.link import Deposed
from scheduler_extender.metrics import Metrics

log = structlog.get_logger(__name__)


class PodWriter(Protocol):
    """The two ``KubeClient`` calls this module needs."""

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> Pod: ...

    async def resize_pod_cpu(
        self, namespace: str, name: str, *, container: str, cpu: str, memory: str | None = None
    ) -> Pod: ...


class PermitWrite(NamedTuple):
    namespace: str
    name: str
    # The VM's container, resized in place; None: resize nothing (annotations only).
    container: str | None
    vcpus: int
    memory_bytes: int
    # Resize the container's memory too (the VM's memory scales), to the guest's memory plus
    # this (QEMU's own, kept from the container as written; recorded as ``memory-overhead``).
    resize_memory: bool = False
    memory_overhead_bytes: int = 0


class PermitRecorder:
    def __init__(self, api: PodWriter, config: DurabilityConfig, metrics: Metrics) -> None:
        self._api = api
        self._config = config
        self._metrics = metrics
        self._is_resize_supported = config.resize_pods
        # Latest unwritten permit per pod uid.
        self._pending: dict[str, PermitWrite] = {}
        # What the API server is known to hold (written by us, or read back by the watch).
        self._written: dict[str, tuple[int, int]] = {}
        self._writing: set[str] = set()
        self._queued: set[str] = set()
        # Waiting out a retry backoff: not enqueued again until it ends, whatever arrives.
        self._backing_off: set[str] = set()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._failures: dict[str, int] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    # -- called from the request path and the watch: no awaits, O(1) ---------------------

    def record(self, uid: str, write: PermitWrite) -> None:
        size = (write.vcpus, write.memory_bytes)
        if uid not in self._pending and uid not in self._writing and self._written.get(uid) == size:
            return
        self._pending[uid] = write
        self._enqueue(uid)

    def observed(self, uid: str, vcpus: int | None, memory_bytes: int | None) -> None:
        """The watch showed the pod's annotations: that is what a restart would read."""
        if vcpus is not None and memory_bytes is not None:
            self._written[uid] = (vcpus, memory_bytes)

    def forget(self, uid: str) -> None:
        """The pod is gone: nothing left to write."""
        self._pending.pop(uid, None)
        self._written.pop(uid, None)
        self._failures.pop(uid, None)
        self._backing_off.discard(uid)
        self._update_gauge()

    def stand_down(self) -> None:
        """Leadership is lost: nothing queued goes out (the new leader holds every VM
        unverified until its agent reports, and an agent's ``lastPermit`` covers the gap); a
        write on its way is refused by the gate (``kube/link.py``)."""
        self._pending.clear()
        self._failures.clear()
        self._update_gauge()

    @property
    def pending_count(self) -> int:
        return len(self._pending) + len(self._writing)

    async def wait_idle(self) -> None:
        """Until nothing is pending or being written (tests, graceful shutdown)."""
        await self._idle.wait()

    def _enqueue(self, uid: str) -> None:
        self._update_gauge()
        if (
            uid in self._pending
            and uid not in self._writing
            and uid not in self._queued
            and uid not in self._backing_off
        ):
            self._queued.add(uid)
            self._queue.put_nowait(uid)

    def _backoff_ended(self, uid: str) -> None:
        self._backing_off.discard(uid)
        self._enqueue(uid)

    def _update_gauge(self) -> None:
        count = self.pending_count
        self._metrics.durable_pending.set(count)
        if count:
            self._idle.clear()
        else:
            self._idle.set()

    # -- the workers -----------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for _ in range(self._config.concurrency):
                group.create_task(self._worker())

    async def _worker(self) -> None:
        while True:
            uid = await self._queue.get()
            self._queued.discard(uid)
            write = self._pending.pop(uid, None)
            if write is None:
                continue
            self._writing.add(uid)
            try:
                await self._write_one(uid, write)
            finally:
                self._writing.discard(uid)
                self._enqueue(uid)  # a newer permit that arrived meanwhile
                self._update_gauge()

    async def _write_one(self, uid: str, write: PermitWrite) -> None:
        log_ = log.bind(
            pod=f"{write.namespace}/{write.name}",
            uid=uid,
            vcpus=write.vcpus,
            memory_bytes=write.memory_bytes,
        )
        try:
            await self._write(write)
        except NotFound as e:
            log_.info("permit_write_skipped", reason="pod is gone", error=e.message)
            self.forget(uid)
        except Deposed as e:
            log_.info("permit_write_dropped", reason=e.message)
        except KubeError as e:
            if not e.is_retryable:
                log_.error("permit_write_failed", error=e.message, status=e.status)
                return
            attempt = self._failures[uid] = self._failures.get(uid, 0) + 1
            delay = e.retry_after_seconds or min(
                self._config.retry_max_seconds,
                self._config.retry_initial_seconds * 2 ** (attempt - 1),
            )
            log_.warning("permit_write_retry", error=e.message, attempt=attempt, delay=delay)
            # A newer permit recorded meanwhile wins over this one.
            self._pending.setdefault(uid, write)
            self._backing_off.add(uid)
            asyncio.get_running_loop().call_later(delay, self._backoff_ended, uid)
        except Exception:
            # Task boundary: a bug here must not kill the writer for every other pod.
            log_.exception("permit_write_crashed")
        else:
            self._failures.pop(uid, None)
            self._written[uid] = (write.vcpus, write.memory_bytes)
            log_.debug("permit_written")

    async def _write(self, write: PermitWrite) -> None:
        if self._config.write_annotations:
            await self._api.patch_pod_annotations(
                write.namespace,
                write.name,
                {
                    ann.PERMITTED_VCPUS: str(write.vcpus),
                    ann.PERMITTED_MEMORY: format_memory(write.memory_bytes),
                    **(
                        {ann.MEMORY_OVERHEAD: format_memory(write.memory_overhead_bytes)}
                        if write.resize_memory
                        else {}
                    ),
                },
            )
            self._metrics.durable_writes.labels("annotations", "ok").inc()
        if self._is_resize_supported and write.container is not None:
            try:
                await self._api.resize_pod_cpu(
                    write.namespace,
                    write.name,
                    container=write.container,
                    cpu=str(write.vcpus),
                    memory=format_memory(write.memory_bytes + write.memory_overhead_bytes)
                    if write.resize_memory
                    else None,
                )
            except NotSupported as e:
                self._is_resize_supported = False
                self._metrics.durable_writes.labels("resize", "unsupported").inc()
                log.warning("pod_resize_unsupported", error=e.message)
                return
            self._metrics.durable_writes.labels("resize", "ok").inc()
