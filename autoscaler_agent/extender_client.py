"""The agent's side of the permit protocol: one batched ``POST /v1/permits`` per tick.

Shell: HTTP only, no policy. ``ExtenderClient.post_batch`` sends one ``ResourceRequestBatch``
and returns each VM's ``Permit``; ``PermitBatcher`` lets every VM loop ask for its own permit
while the node still pays one round trip per tick, by gathering the requests that arrive within
a few milliseconds of each other.

Errors (callers catch the class, never look at a status)::

    ExtenderError
    ├── ExtenderUnavailable     connection refused/reset, timeout, 5xx, 429: retry with backoff
    ├── ExtenderRejected        4xx on the whole batch (401 token, 403 node, 400 malformed or
    │                           version mismatch); ``status`` and the body's message
    ├── ExtenderProtocolError   an answer we cannot read, or one that misses our VM
    └── PermitItemError         the batch worked, but this VM's item carries an ``error``
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp
import msgspec
import structlog

from protocol.codec import ProtocolError, decode, encode
from protocol.permits import (
    MAX_BATCH,
    ErrorBody,
    ItemError,
    Permit,
    PermitBatch,
    ResourceRequest,
    ResourceRequestBatch,
)
from protocol.versions import SUPPORTED

log = structlog.get_logger(__name__)

PERMITS_PATH = "/v1/permits"
# VMs whose last seq is remembered (a node has at most MAX_BATCH; the rest is churn).
_MAX_SEQS = 4 * MAX_BATCH
# Distinct errors an outage's epoch checks warn of; the rest are debug lines.
_MAX_CAUSES = 4


class ExtenderError(Exception):
    """Base class. Every extender error is worth retrying later (with backoff): tokens rotate,
    extenders restart and resync; none of them disables growth for good."""

    kind = "error"


class ExtenderUnavailable(ExtenderError):
    kind = "unavailable"


class ExtenderRejected(ExtenderError):
    kind = "rejected"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class ExtenderProtocolError(ExtenderError):
    kind = "protocol"


class PermitItemError(ExtenderError):
    kind = "item"

    def __init__(self, item: ItemError) -> None:
        super().__init__(f"{item.status} {item.reason}: {item.message}")
        self.item = item


class TokenFile:
    """A bearer token read from a file, re-read whenever the file changes.

    The kubelet rotates projected ServiceAccount tokens by swapping a symlink, so the file's
    (inode, mtime) changes; a stat per batch is far cheaper than the HTTP call it guards.
    """

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._stamp: tuple[int, int] | None = None
        self._token: str | None = None

    def token(self) -> str | None:
        if self._path is None:
            return None
        try:
            st = self._path.stat()
        except OSError as e:
            raise ExtenderRejected(401, f"cannot read token file {self._path}: {e}") from e
        stamp = (st.st_ino, st.st_mtime_ns)
        if stamp != self._stamp:
            self._token = self._path.read_text(encoding="utf-8").strip()
            self._stamp = stamp
        return self._token


class EpochWatch:
    """The extender's epoch as this agent last saw it, and who to tell when it changes.

    Every permit answer carries the extender's epoch, new after each of its restarts. A
    rebuilt ledger keeps each VM it has not heard from at up to its maximum, out of everyone's
    reach, until that VM reports; so when the epoch changes (the first one this agent sees
    counts: the extender may have found these VMs already running), every VM loop is told.
    """

    def __init__(self) -> None:
        self.epoch: str | None = None
        self.last_answer_at = -math.inf
        self._listeners: set[Callable[[], None]] = set()

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` on every change; returns the function that unsubscribes."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def seen(self, epoch: str, *, now: float) -> bool:
        """An answer carried ``epoch``; True (and listeners told) when it is new."""
        self.last_answer_at = now
        if not epoch or epoch == self.epoch:
            return False
        previous, self.epoch = self.epoch, epoch
        log.info("extender_epoch_changed", epoch=epoch, previous=previous)
        for listener in list(self._listeners):
            listener()
        return True


class ExtenderClient:
    """POSTs batches to one extender for one node."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        base_url: str,
        node: str,
        token: TokenFile,
        timeout_seconds: float,
        epochs: EpochWatch | None = None,
        wall_clock_us: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        self._session = session
        self._wall_clock_us = wall_clock_us
        # The last seq sent per VM (protocol v2).
        self._seqs: dict[str, int] = {}
        self._url = base_url.rstrip("/") + PERMITS_PATH
        self._node = node
        self._token = token
        self._timeout = timeout_seconds
        self.epochs = epochs or EpochWatch()

    @property
    def node(self) -> str:
        return self._node

    def _next_seq(self, uid: str) -> int:
        """Above every seq sent for this VM. Wall-clock microseconds are the floor, so the
        numbers keep growing across this agent's restarts; the extender's ``StaleSequence``
        answer (after a clock step back) raises the floor to what it last applied."""
        seq = max(self._seqs.get(uid, 0) + 1, self._wall_clock_us())
        if len(self._seqs) > _MAX_SEQS and uid not in self._seqs:
            # Safe to forget: the wall clock alone keeps a forgotten VM's numbers growing.
            self._seqs.clear()
        self._seqs[uid] = seq
        return seq

    async def post_batch(self, requests: Sequence[ResourceRequest]) -> dict[str, Permit]:
        """Send one batch; the answers keyed by pod UID. Raises ExtenderError for the batch.

        Each request gets its VM's next ``seq`` here (v2; an extender that speaks only v1
        ignores it), so a request that is retried is a new request, never a replay."""
        numbered = [msgspec.structs.replace(r, seq=self._next_seq(r.pod.uid)) for r in requests]
        body = encode(ResourceRequestBatch(protocol=SUPPORTED, node=self._node, requests=numbered))
        headers = {"Content-Type": "application/json"}
        token = self._token.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with asyncio.timeout(self._timeout):
                async with self._session.post(self._url, data=body, headers=headers) as resp:
                    status = resp.status
                    data = await resp.read()
        except TimeoutError as e:
            raise ExtenderUnavailable(f"POST {self._url}: no answer in {self._timeout}s") from e
        except aiohttp.ClientError as e:
            raise ExtenderUnavailable(f"POST {self._url}: {e}") from e
        if status >= 500 or status == 429:
            # 429: this agent's own request budget; like an outage, it passes with time.
            raise ExtenderUnavailable(f"POST {self._url}: HTTP {status}: {_message(data)}")
        if status != 200:
            raise ExtenderRejected(status, _message(data))
        try:
            batch = decode(PermitBatch, data)
        except ProtocolError as e:
            raise ExtenderProtocolError(f"POST {self._url}: {e}") from e
        if not SUPPORTED.min <= batch.protocol <= SUPPORTED.max:
            raise ExtenderProtocolError(
                f"answer in protocol v{batch.protocol}, we speak {SUPPORTED}"
            )
        self.epochs.seen(batch.epoch, now=asyncio.get_running_loop().time())
        for p in batch.permits:
            if p.error is not None and p.error.reason == "StaleSequence" and p.seq is not None:
                uid = p.pod.uid
                self._seqs[uid] = max(self._seqs.get(uid, 0), p.seq)
        return {p.pod.uid: p for p in batch.permits}

    async def keep_epoch_fresh(
        self, *, interval_seconds: float, failed: Callable[[ExtenderError], object]
    ) -> None:
        """Send an empty batch whenever no answer came for ``interval_seconds``, so that a
        node whose VMs have nothing to ask still learns of an extender restart that soon.

        Failures are expected while the extender is down or fails over: the first one is a
        warning naming the error (``extender_unreachable``); so is each later one that says
        something new (up to ``_MAX_CAUSES`` an outage: a failover that begins with a timeout
        may go on as a refusal, and that refusal is what an operator must read), the repeats
        are debug lines; and the first answer after them says how long they lasted
        (``extender_reachable``), so a node's log shows why its VMs did not report to a new
        extender. Each one is also given
        to ``failed`` (the agent counts it with the VMs' failed calls, so that a node of steady
        VMs that cannot reach the extender shows in its metrics too). Nothing but its
        cancellation ends this loop: it is how a node of steady VMs learns of a new extender."""
        loop = asyncio.get_running_loop()
        failing_since: float | None = None
        causes: set[str] = set()  # what this outage's warnings said
        while True:
            quiet = loop.time() - self.epochs.last_answer_at
            if quiet < interval_seconds:
                await asyncio.sleep(interval_seconds - quiet)
                continue
            try:
                await self.post_batch([])
            except ExtenderError as e:
                failed(e)
                now = loop.time()
                if failing_since is None:
                    failing_since = now
                    causes.clear()
                cause = f"{e.kind}: {e}"
                if cause not in causes and len(causes) < _MAX_CAUSES:
                    causes.add(cause)
                    log.warning(
                        "extender_unreachable",
                        error=str(e),
                        kind=e.kind,
                        failing_seconds=round(now - failing_since, 3),
                    )
                else:
                    log.debug("epoch_check_failed", error=str(e), kind=e.kind)
                await asyncio.sleep(interval_seconds)
                continue
            except Exception:  # task boundary: a bug is logged, and the checks go on
                log.exception("epoch_check_error")
                await asyncio.sleep(interval_seconds)
                continue
            if failing_since is not None:
                log.info(
                    "extender_reachable",
                    epoch=self.epochs.epoch,
                    after_seconds=round(loop.time() - failing_since, 3),
                )
                failing_since = None


def _message(data: bytes) -> str:
    try:
        body = decode(ErrorBody, data)
    except ProtocolError:
        return data[:200].decode("utf-8", "replace") or "(empty body)"
    return f"{body.error} ({body.reason}): {body.message}"


class PermitBatcher:
    """Coalesces the VM loops' requests into one batch per window.

    The first request to arrive opens a window of ``window_seconds``; everything that arrives
    before it closes goes in the same POST. VM loops on a node tick on the same interval, so
    after their first ticks their requests line up and one POST serves them all.
    """

    def __init__(self, client: ExtenderClient, *, window_seconds: float) -> None:
        self._client = client
        self._window = window_seconds
        self._pending: list[tuple[ResourceRequest, asyncio.Future[Permit]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches_sent = 0

    async def request(self, request: ResourceRequest) -> Permit:
        """This VM's permit; raises ExtenderError (including PermitItemError for its item)."""
        fut: asyncio.Future[Permit] = asyncio.get_running_loop().create_future()
        self._pending.append((request, fut))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_later(), name="permit-batch")
        # shield: one VM loop being cancelled must not cancel the batch the others wait on.
        return await asyncio.shield(fut)

    async def close(self) -> None:
        task, self._flusher = self._flusher, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                # Only re-raise if *we* are being cancelled, not the task we just cancelled.
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
        for _, fut in self._pending:
            if not fut.done():
                fut.set_exception(ExtenderUnavailable("agent shutting down"))
                fut.exception()  # mark retrieved: nobody may be left waiting on it
        self._pending.clear()

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._window)
        self._flusher = None
        pending, self._pending = self._pending, []
        # Only the latest request per VM counts; an older one was superseded while waiting.
        latest: dict[str, ResourceRequest] = {}
        for req, _ in pending:
            latest[req.pod.uid] = req
        reqs = list(latest.values())
        results: dict[str, Permit] = {}
        error: ExtenderError | None = None
        for start in range(0, len(reqs), MAX_BATCH):
            try:
                results.update(await self._client.post_batch(reqs[start : start + MAX_BATCH]))
            except ExtenderError as e:
                error = e
        self.batches_sent += 1
        for req, fut in pending:
            if fut.done():
                continue
            permit = results.get(req.pod.uid)
            if permit is not None and permit.error is not None:
                fut.set_exception(PermitItemError(permit.error))
            elif permit is not None and permit.permit is not None:
                fut.set_result(permit)
            elif error is not None:
                fut.set_exception(error)
            else:
                fut.set_exception(
                    ExtenderProtocolError(f"answer has no permit for {req.pod.key} ({req.pod.uid})")
                )


def permit_vcpus(permit: Permit) -> int:
    """The granted vCPUs of an answer that carries a permit (checked by the batcher)."""
    assert permit.permit is not None
    return permit.permit.vcpus


def permit_memory_bytes(permit: Permit) -> int:
    """The granted memory of an answer that carries a permit (checked by the batcher)."""
    assert permit.permit is not None
    return permit.permit.memory_bytes


__all__ = [
    "EpochWatch",
    "ExtenderClient",
    "ExtenderError",
    "ExtenderProtocolError",
    "ExtenderRejected",
    "ExtenderUnavailable",
    "PermitBatcher",
    "PermitItemError",
    "TokenFile",
    "permit_memory_bytes",
    "permit_vcpus",
]
