"""Protocol-faithful fakes for the agent's outer edges: extender, metrics endpoint, hypervisor.

The extender and the metrics endpoint speak real HTTP (aiohttp apps); the hypervisor fake
implements the ``Hypervisor`` Protocol and raises its real error classes. Also used by
``scripts/bench_agent.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from autoscaler_agent.hypervisor import (
    HypervisorError,
    MemoryResizeIncomplete,
    MemoryState,
    VcpuState,
)
from protocol.codec import ProtocolError, decode, encode
from protocol.permits import (
    ErrorBody,
    ItemError,
    Permit,
    PermitBatch,
    PermitStatus,
    ResourceRequest,
    ResourceRequestBatch,
    Resources,
)
from protocol.versions import SUPPORTED


@contextlib.asynccontextmanager
async def serving(app: web.Application, port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` on loopback; yields its base URL (``http://127.0.0.1:PORT``).

    Used instead of pytest-aiohttp's ``aiohttp_server``: that fixture, after any sync test in
    the same session, leaves an event loop unclosed (a ResourceWarning, an error here).
    """
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        host, bound_port = runner.addresses[0][:2]
        yield f"http://{host}:{bound_port}"
    finally:
        await runner.cleanup()


def _error(status: int, error: str, reason: str, message: str) -> web.Response:
    body = encode(ErrorBody(error=error, reason=reason, message=message))
    return web.Response(status=status, body=body, content_type="application/json")


class FakeExtender:
    """``POST /v1/permits`` applying the rules of ``protocol/permits.py`` to one node.

    ``reserved`` is the ledger (pod UID -> vCPUs). Knobs for failure tests: ``fail_status``
    answers every batch with that status; ``delay_seconds`` delays answers; ``override`` answers
    a fixed permit for a UID (to test protocol-error permits); ``item_errors`` answers an error
    item for a UID.
    """

    def __init__(self, *, node: str, capacity_vcpus: int, token: str | None = None) -> None:
        self.node = node
        self.capacity_vcpus = capacity_vcpus
        self.token = token
        self.reserved: dict[str, int] = {}
        # Memory is always granted as asked (the real extender's memory rules are its own
        # tests'); this records what each VM was last permitted.
        self.reserved_memory: dict[str, int] = {}
        self.batches: list[ResourceRequestBatch] = []
        self.fail_status: int | None = None
        # How many answers ``fail_status`` has made: what a test counts the client's failures by.
        self.failed_answers = 0
        self.delay_seconds = 0.0
        self.override: dict[str, int] = {}
        self.item_errors: dict[str, ItemError] = {}
        # Changed by a test to play an extender restart.
        self.epoch = "epoch-1"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/permits", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        if self.delay_seconds:
            await asyncio.sleep(self.delay_seconds)
        if self.fail_status is not None:
            self.failed_answers += 1
            return _error(self.fail_status, "Injected", "injected", "injected failure")
        if self.token is not None and request.headers.get("Authorization") != (
            f"Bearer {self.token}"
        ):
            return _error(401, "Unauthorized", "bad_token", "no valid bearer token")
        try:
            batch = decode(ResourceRequestBatch, await request.read())
        except ProtocolError as e:
            return _error(400, "ProtocolError", "malformed", str(e))
        version = SUPPORTED.latest_shared(batch.protocol)
        if version is None:
            return _error(
                400, "UnsupportedVersion", "version", f"agent {batch.protocol}, us {SUPPORTED}"
            )
        if batch.node != self.node:
            return _error(403, "Forbidden", "other_node", f"token is for node {self.node}")
        self.batches.append(batch)
        permits = [self.decide(r) for r in batch.requests]
        body = encode(
            PermitBatch(protocol=int(version), node=batch.node, permits=permits, epoch=self.epoch)
        )
        return web.Response(body=body, content_type="application/json")

    def decide(self, req: ResourceRequest) -> Permit:
        uid = req.pod.uid
        if uid in self.item_errors:
            return Permit(pod=req.pod, error=self.item_errors[uid])
        held = self.reserved.get(uid)
        if held is None:  # a restarted extender rebuilds from lastPermit
            held = req.last_permit.vcpus if req.last_permit else req.current.vcpus
        current, wanted = req.current.vcpus, req.requested.vcpus
        others = sum(v for k, v in self.reserved.items() if k != uid)
        if wanted < current:
            new, status, reason = wanted, PermitStatus.RELEASED, "released"
        elif wanted == current:
            new, status, reason = held, PermitStatus.STEADY, "steady"
        else:
            free = self.capacity_vcpus - others
            new = max(current, min(wanted, free))
            if new == wanted:
                status, reason = PermitStatus.GRANTED, "granted"
            elif new == current:
                status, reason = PermitStatus.DENIED, f"node full ({free} free)"
            else:
                status, reason = PermitStatus.PARTIAL, f"node has {free} free"
        new = self.override.get(uid, new)
        self.reserved[uid] = new
        self.reserved_memory[uid] = req.requested.memory_bytes
        return Permit(
            pod=req.pod,
            permit=Resources(vcpus=new, memory_bytes=req.requested.memory_bytes),
            status=status,
            reason=reason,
        )


class SyntheticMetrics:
    """node_exporter look-alike: ``GET /vm/{name}/metrics`` serves ``loads[name]`` as load1.

    With ``online[name]`` set it also serves the guest's CPU counters as node_exporter does:
    ``node_cpu_seconds_total`` for CPUs 0..online-1 only (the guest lists only online CPUs in
    /proc/stat), integrated over loop time with ``loads[name]`` of them busy,
    or ``busy[name]`` when set (a guest throttled at its container's quota shows less busy
    time than its load). With ``runnable[name]`` set it serves node_procs_running (the
    exporter counted, as the kernel does).
    """

    def __init__(self) -> None:
        self.loads: dict[str, float] = {}
        self.online: dict[str, int] = {}
        self.busy: dict[str, float] = {}
        self.runnable: dict[str, int] = {}
        self.broken: set[str] = set()
        # Per VM, if set: () -> (MemTotal, MemAvailable) in bytes, read at every scrape.
        self.memory: dict[str, Callable[[], tuple[float, float]]] = {}
        self.scrapes = 0
        # Per VM: (loop time of the last scrape, busy seconds, idle seconds) summed over CPUs.
        self._counters: dict[str, tuple[float, float, float]] = {}

    def _cpu_lines(self, name: str, load: float) -> str:
        online = self.online.get(name)
        if online is None:
            return ""
        now = asyncio.get_running_loop().time()
        at, busy, idle = self._counters.get(name, (now, 1000.0, 1000.0))
        dt = max(0.0, now - at)
        used = min(float(online), self.busy.get(name, load))
        busy, idle = busy + used * dt, idle + (online - used) * dt
        self._counters[name] = (now, busy, idle)
        lines = ["# TYPE node_cpu_seconds_total counter"]
        for cpu in range(online):
            lines.append(f'node_cpu_seconds_total{{cpu="{cpu}",mode="user"}} {busy / online}')
            lines.append(f'node_cpu_seconds_total{{cpu="{cpu}",mode="idle"}} {idle / online}')
        return "\n".join(lines) + "\n"

    def url(self, base: str, name: str) -> str:
        return f"{base.rstrip('/')}/vm/{name}/metrics"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/vm/{name}/metrics", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        name = request.match_info["name"]
        if name in self.broken:
            return web.Response(text="node_load1{ garbage\n")
        load = self.loads.get(name, 0.0)
        total, available = self.memory[name]() if name in self.memory else (2.0**30, 2.0**29)
        text = (
            "# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\n"
            f"node_load1 {load}\n"
            f"# TYPE node_memory_MemTotal_bytes gauge\nnode_memory_MemTotal_bytes {total}\n"
            "# TYPE node_memory_MemAvailable_bytes gauge\n"
            f"node_memory_MemAvailable_bytes {available}\n"
        ) + self._cpu_lines(name, load)
        if name in self.runnable:
            text += f"node_procs_running {self.runnable[name] + 1}\n"
        return web.Response(text=text, content_type="text/plain")


class FakeHypervisor:
    """Implements ``autoscaler_agent.hypervisor.Hypervisor`` in memory.

    ``errors`` are raised by the next ``resize`` calls, in order; ``resize_seconds`` emulates
    the time a hot-plug takes. ``resized_at`` records (loop time, vcpus) of every success.
    """

    def __init__(
        self,
        *,
        current: int,
        max_vcpus: int,
        resize_seconds: float = 0.0,
        memory: int = 2**30,
        max_memory: int | None = None,
        block: int = 2 * 2**20,
    ) -> None:
        self.current = current
        self.max_vcpus = max_vcpus
        # Memory: boot size ``memory`` (also the floor), up to ``max_memory`` (None: no device).
        self.memory_min = memory
        self.memory_current = memory
        self.memory_max = max_memory if max_memory is not None else memory
        self.block = block
        # A guest holding memory: a shrink stops here (MemoryResizeIncomplete), like QEMU's.
        self.memory_in_use: int = 0
        self.memory_calls: list[int] = []
        self.resize_seconds = resize_seconds
        self.errors: list[HypervisorError] = []
        self.calls: list[int] = []
        self.resized_at: list[tuple[float, int]] = []
        self.closed = 0

    async def vcpus(self) -> VcpuState:
        return VcpuState(current=self.current, max=self.max_vcpus)

    async def resize(self, vcpus: int) -> VcpuState:
        self.calls.append(vcpus)
        if self.resize_seconds:
            await asyncio.sleep(self.resize_seconds)
        if self.errors:
            raise self.errors.pop(0)
        assert 1 <= vcpus <= self.max_vcpus, f"resize to {vcpus} outside 1..{self.max_vcpus}"
        self.current = vcpus
        self.resized_at.append((asyncio.get_running_loop().time(), vcpus))
        return VcpuState(current=self.current, max=self.max_vcpus)

    def _memory_state(self) -> MemoryState:
        return MemoryState(
            current=self.memory_current,
            min=self.memory_min,
            max=self.memory_max,
            block=self.block if self.memory_max > self.memory_min else 0,
        )

    async def memory(self) -> MemoryState:
        return self._memory_state()

    async def resize_memory(self, memory_bytes: int) -> MemoryState:
        self.memory_calls.append(memory_bytes)
        if self.resize_seconds:
            await asyncio.sleep(self.resize_seconds)
        if self.errors:
            raise self.errors.pop(0)
        assert self.memory_min <= memory_bytes <= self.memory_max, memory_bytes
        floor = max(self.memory_min, self.memory_in_use)
        self.memory_current = max(memory_bytes, floor)
        if self.memory_current != memory_bytes:
            raise MemoryResizeIncomplete(
                f"shrinking memory to {memory_bytes} stopped at {self.memory_current}",
                state=self._memory_state(),
            )
        return self._memory_state()

    async def close(self) -> None:
        self.closed += 1
