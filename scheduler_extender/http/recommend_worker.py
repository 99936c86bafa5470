"""Recommendations off the event loop: a snapshot handed to a worker process.

Shell. A recommendation takes longer the more pods are pending (``scripts/bench_recommender.py``
prints how long); on the event loop it delayed every filter, bind and permit call for that
long. Threads would not help: the simulation is pure Python and holds the GIL, so the loop
would get it back only every switch interval (``sys.getswitchinterval()``) and filter latency
would still grow. Cutting the simulation into chunks would spread the pure core's state over
awaits. So the snapshot travels as bytes to one worker process, which decodes, checks,
simulates and encodes the answer; the loop only awaits a future. What stays on the loop:
reading a live snapshot of the ledger (it must be one consistent view) and encoding it, and
decoding the worker's small reply.

``RecommendWorker.run(job)`` is the one entry point. ``recommender.worker: inline`` runs the
same ``compute`` on the loop instead (one process, e.g. for debugging); the answer bytes are the
same either way. The pool is created on first use, with the ``forkserver`` start method (never
``fork``: this process has threads, and the child would inherit their locks) and this module
preloaded, so a new worker is a cheap fork of a process that has already imported the
recommender. A worker that dies (killed, out of memory) fails only the request that was
running; the next one gets a new pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Final, Literal

import msgspec
import structlog

from scheduler_extender.config import RecommendWorkerMode as WorkerMode
from scheduler_extender.recommender import (
    FieldError,
    Recommendation,
    RecommenderConfig,
    ScaleDownConfig,
    SnapshotError,
    encode_recommendation,
    encode_scale_down,
    load_snapshot,
    recommend,
    recommend_scale_down,
)

__all__ = ["Job", "JobResult", "RecommendWorker", "WorkerMode", "compute"]

log = structlog.get_logger(__name__)


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """A recommendation to compute: the snapshot bytes as received (or a live snapshot,
    encoded), its format, the settings, and notes to add to the answer."""

    snapshot: bytes
    fmt: Literal["json", "yaml"]
    config: RecommenderConfig
    notes: list[str] = []
    # Which question: the scale-up (``recommend``) or the scale-down check with these settings.
    scale_down: ScaleDownConfig | None = None
    # Send the Recommendation back too (auto-publish reads it); else only the answer bytes.
    is_kept: bool = False


class JobResult(msgspec.Struct, frozen=True, kw_only=True):
    # The answer JSON (with ``runTimeMillis``), or the snapshot's errors.
    answer: bytes = b""
    errors: list[FieldError] = []
    message: str = ""
    new_nodes: int = 0
    unscheduled: int = 0
    run_time_millis: int = 0
    recommendation: Recommendation | None = None


# How much lower the worker's scheduling priority is (``nice``): on a node with few cores the
# worker and the event loop compete, and the loop must win.
WORKER_NICENESS: Final = 10

_JOB_ENCODER: Final = msgspec.msgpack.Encoder()
_JOB_DECODER: Final = msgspec.msgpack.Decoder(Job)
_RESULT_DECODER: Final = msgspec.msgpack.Decoder(JobResult)


def compute(job: Job) -> JobResult:
    """Decode, check, simulate, encode: the whole recommendation, wherever it runs."""
    start = time.perf_counter()
    try:
        prepared = load_snapshot(
            job.snapshot, fmt=job.fmt, scheduler_name=job.config.scheduler_name
        )
        if job.scale_down is not None:
            down = recommend_scale_down(prepared, config=job.config, scale_down=job.scale_down)
            return JobResult(
                answer=encode_scale_down(down),
                run_time_millis=round((time.perf_counter() - start) * 1000),
            )
        rec = recommend(prepared, config=job.config)
    except SnapshotError as e:
        return JobResult(errors=e.errors, message=str(e))
    if job.notes:
        # Said in the answer, not only logged: auto-publish recomputes every interval.
        rec = msgspec.structs.replace(
            rec,
            diagnostics=msgspec.structs.replace(
                rec.diagnostics, notes=[*rec.diagnostics.notes, *job.notes]
            ),
        )
    millis = round((time.perf_counter() - start) * 1000)
    return JobResult(
        answer=encode_recommendation(rec, run_time_millis=millis),
        new_nodes=sum(s.increment_by for s in rec.scale_up),
        unscheduled=len(rec.unscheduled_pods),
        run_time_millis=millis,
        recommendation=rec if job.is_kept else None,
    )


def _compute_bytes(job: bytes) -> bytes:
    """``compute`` between bytes: what crosses the process boundary (msgpack, not pickle:
    the types are Structs, and the reply is decoded against ``JobResult``)."""
    return _JOB_ENCODER.encode(compute(_JOB_DECODER.decode(job)))


def _lower_priority() -> None:
    """In the worker: yield the CPU to the extender's own process when they compete for it.
    A recommendation is background work; filter, bind and permit calls are not."""
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICENESS)


class RecommendWorker:
    """One worker process, created on first use; see the module docstring."""

    def __init__(self, mode: WorkerMode) -> None:
        self.mode = mode
        self._pool: ProcessPoolExecutor | None = None

    async def run(self, job: Job) -> JobResult:
        if self.mode is WorkerMode.INLINE:
            return compute(job)
        data = _JOB_ENCODER.encode(job)
        pool = self._pool
        if pool is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([__name__])
            pool = self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=context, initializer=_lower_priority
            )
        try:
            reply = await asyncio.get_running_loop().run_in_executor(pool, _compute_bytes, data)
        except BrokenProcessPool:
            # The worker died: drop the pool, so that the next request starts a new one.
            log.warning("recommend_worker_lost")
            self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        return _RESULT_DECODER.decode(reply)

    def close(self) -> None:
        """Stop the worker; a recommendation still running finishes in it and is dropped."""
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                pool.shutdown(wait=False, cancel_futures=True)
