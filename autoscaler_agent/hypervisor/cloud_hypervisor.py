"""A ``Hypervisor`` that talks to cloud-hypervisor's HTTP API over the VM's unix socket.

Shell: one ``GET /vm.info`` or ``PUT /vm.resize`` per call, translated to typed errors through
``ch_api``. It keeps no view of the VM between calls (the answer to ``vm.info`` is the only
truth) and makes no decisions: it does not retry, back off or pick a size.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import aiohttp
import structlog

from autoscaler_agent.hypervisor import ch_api
from autoscaler_agent.hypervisor.base import MemoryState, VcpuState
from autoscaler_agent.hypervisor.errors import (
    HypervisorUnavailable,
    MemoryResizeIncomplete,
    ResizeRejected,
)

BASE_URL: Final = "http://localhost/api/v1"
DEFAULT_TIMEOUT_SECONDS: Final = 5.0

log = structlog.get_logger()


async def resize_memory_with(
    read: Callable[[], Awaitable[MemoryState]],
    resize: Callable[[], Awaitable[None]],
    memory_bytes: int,
    *,
    hypervisor: str,
) -> MemoryState:
    """cloud-hypervisor's memory resize, whichever way it is reached (API socket or ch-remote):
    read, check the target, resize, read again; the size in effect is what vm.info says."""
    before = await read()
    if memory_bytes == before.current:
        return before
    ch_api.check_memory_target(before, memory_bytes)
    await resize()
    after = await read()
    log.info(
        "memory_resized",
        hypervisor=hypervisor,
        before=before.current,
        requested=memory_bytes,
        after=after.current,
    )
    if after.current != memory_bytes:
        raise MemoryResizeIncomplete(
            f"resizing memory to {memory_bytes} bytes left {after.current} in effect",
            state=after,
        )
    return after


class CloudHypervisorClient:
    """cloud-hypervisor's API on ``socket_path``.

    ``timeout_seconds`` bounds each HTTP request as a whole (connect, send, answer). A resize
    that adds vCPUs returns as soon as the VMM has plugged them, well under a second.
    """

    def __init__(
        self, socket_path: Path, *, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    ) -> None:
        self.socket_path = socket_path
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use: aiohttp wants a running loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(self.socket_path)),
                timeout=self._timeout,
            )
        return self._session

    async def _request(self, method: str, endpoint: str, body: bytes | None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else None
        try:
            async with self._client().request(
                method, f"{BASE_URL}/{endpoint}", data=body, headers=headers
            ) as resp:
                return resp.status, await resp.read()
        except TimeoutError as e:
            raise HypervisorUnavailable(
                f"cloud-hypervisor {endpoint} on {self.socket_path} did not answer within "
                f"{self._timeout.total} s"
            ) from e
        except aiohttp.ClientError as e:
            raise HypervisorUnavailable(
                f"cloud-hypervisor {endpoint} on {self.socket_path} is unreachable",
                detail=str(e) or type(e).__name__,
            ) from e

    async def vm_info(self) -> ch_api.VmInfo:
        status, body = await self._request("GET", "vm.info", None)
        if status != 200:
            raise ch_api.error_for_status(status, body, operation="vm.info")
        return ch_api.decode_vm_info(body)

    async def vcpus(self) -> VcpuState:
        return (await self.vm_info()).vcpus

    async def resize(self, vcpus: int) -> VcpuState:
        if vcpus < 1:
            raise ResizeRejected(f"cannot resize to {vcpus} vCPUs: at least 1 is required")
        before = await self.vcpus()
        if vcpus > before.max:
            raise ResizeRejected(
                f"cannot resize to {vcpus} vCPUs: the VM was booted with max_vcpus={before.max}"
            )
        if vcpus == before.current:
            return before
        request = ch_api.ENCODER.encode(ch_api.VmResize(desired_vcpus=vcpus))
        status, body = await self._request("PUT", "vm.resize", request)
        if status != 204:
            raise ch_api.error_for_status(status, body, operation="vm.resize")
        after = await self.vcpus()
        log.info(
            "vcpus_resized",
            hypervisor="cloud-hypervisor",
            before=before.current,
            requested=vcpus,
            after=after.current,
        )
        return after

    async def memory(self) -> MemoryState:
        return (await self.vm_info()).memory

    async def resize_memory(self, memory_bytes: int) -> MemoryState:
        async def put() -> None:
            request = ch_api.ENCODER.encode(ch_api.VmResize(desired_ram=memory_bytes))
            status, body = await self._request("PUT", "vm.resize", request)
            if status != 204:
                raise ch_api.error_for_status(status, body, operation="vm.resize")

        return await resize_memory_with(
            self.memory, put, memory_bytes, hypervisor="cloud-hypervisor"
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
