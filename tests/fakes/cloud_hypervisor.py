"""An emulator of cloud-hypervisor's HTTP API, served on a unix socket (``web.UnixSite``).

Covers ``GET /vmm.ping``, ``GET /vm.info`` and ``PUT /vm.resize`` as the OpenAPI spec and
SOURCE.md describe them: 204 on success (and ``config.cpus.boot_vcpus`` follows), 404 when no
VM was created, 429 while a vCPU removal is still pending (here: the next
``busy_resizes_after_shrink`` resizes after a shrink), 400 for a body that is not a VmResize,
500 for ``desired_vcpus`` above ``max_vcpus``. ``desired_ram`` (the whole memory, in bytes)
sets ``config.memory.hotplugged_size`` to what it asks above ``size`` (null at ``size``), and is
a 500 below ``size`` or above ``size + hotplug_size``. Error bodies are a JSON array of strings
(``error_format="v47"``, outermost first) or plain text (``"text"``, before v47).

It is a test double: no real VM, no policy, and it must not be imported by production code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from aiohttp import web


@dataclass
class CloudHypervisorEmulator:
    boot_vcpus: int = 1
    max_vcpus: int = 4
    is_created: bool = True
    error_format: Literal["v47", "text"] = "v47"
    busy_resizes_after_shrink: int = 0
    # The ceiling vm.resize enforces, when it differs from what vm.info reports: lets a test
    # reach the 500 path, which a correct client never triggers on its own.
    resize_max_vcpus: int | None = None
    memory_size: int = 512 * 2**20
    hotplug_size: int | None = 1024 * 2**20
    hotplugged_size: int | None = None
    # Like resize_max_vcpus: the hot-plug room vm.resize enforces, when it differs from vm.info.
    resize_hotplug_size: int | None = None
    # Seconds to sit on every request before answering (to exercise client timeouts).
    delay_seconds: float = 0.0
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    _busy_left: int = 0

    def vm_info(self) -> dict[str, object]:
        return {
            "config": {
                "cpus": {
                    "boot_vcpus": self.boot_vcpus,
                    "max_vcpus": self.max_vcpus,
                    "topology": {
                        "threads_per_core": 1,
                        "cores_per_die": self.max_vcpus,
                        "dies_per_package": 1,
                        "packages": 1,
                    },
                    "kvm_hyperv": False,
                    "max_phys_bits": 46,
                },
                "memory": {
                    "size": self.memory_size,
                    "hotplug_size": self.hotplug_size,
                    "hotplugged_size": self.hotplugged_size,
                    "hotplug_method": "VirtioMem",
                    "shared": False,
                    "hugepages": False,
                },
                "payload": {"kernel": "/var/lib/vm/vmlinux", "cmdline": "console=ttyS0"},
                "iommu": False,
                "watchdog": False,
            },
            "state": "Running",
            "memory_actual_size": self.memory_size + (self.hotplugged_size or 0),
            "device_tree": {},
        }

    def _error(self, status: int, chain: list[str]) -> web.Response:
        if self.error_format == "v47":
            return web.Response(
                status=status, text=json.dumps(chain), content_type="application/json"
            )
        return web.Response(status=status, text=": ".join(chain), content_type="text/plain")

    async def _record(self, request: web.Request) -> None:
        self.requests.append((request.method, request.path, await request.read()))
        if self.delay_seconds:
            await asyncio.sleep(self.delay_seconds)

    async def ping(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response(
            {"build_version": "emulator", "version": "v47.0", "pid": os.getpid(), "features": []}
        )

    async def info(self, request: web.Request) -> web.Response:
        await self._record(request)
        if not self.is_created:
            return self._error(404, ["Error from API", "The VM is not created"])
        return web.json_response(self.vm_info())

    async def resize(self, request: web.Request) -> web.Response:
        await self._record(request)
        try:
            raw = await request.read()
            desired = _desired_vcpus(raw)
            desired_ram = _desired_ram(raw)
        except ValueError as e:
            return self._error(400, ["Error from API", f"Failed to parse request body: {e}"])
        if not self.is_created:
            return self._error(
                404, ["Error from API", "The VM could not be resized", "The VM is not created"]
            )
        if desired_ram is not None:
            room = self.hotplug_size or 0
            if self.resize_hotplug_size is not None:
                room = self.resize_hotplug_size
            if not self.memory_size <= desired_ram <= self.memory_size + room:
                return self._error(
                    500,
                    [
                        "Error from API",
                        "The VM could not be resized",
                        "Error resizing VM: Memory manager error",
                        f"Invalid amount of memory {desired_ram}",
                    ],
                )
            plugged = desired_ram - self.memory_size
            self.hotplugged_size = plugged or None
        if desired is None or desired == self.boot_vcpus:
            return web.Response(status=204)
        if self._busy_left > 0:
            self._busy_left -= 1
            return self._error(
                429,
                [
                    "Error from API",
                    "The VM could not be resized",
                    "Error resizing VM: CPU manager error",
                    "Removal of vCPU is still pending",
                ],
            )
        limit = self.max_vcpus if self.resize_max_vcpus is None else self.resize_max_vcpus
        if desired > limit or desired < 1:
            return self._error(
                500,
                [
                    "Error from API",
                    "The VM could not be resized",
                    "Error resizing VM: CPU manager error",
                    f"Desired vCPUs {desired} is outside 1..{limit}",
                ],
            )
        if desired < self.boot_vcpus:
            self._busy_left = self.busy_resizes_after_shrink
        self.boot_vcpus = desired
        return web.Response(status=204)

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/vmm.ping", self.ping)
        app.router.add_get("/api/v1/vm.info", self.info)
        app.router.add_put("/api/v1/vm.resize", self.resize)
        return app

    @contextlib.asynccontextmanager
    async def serve(self, socket_path: Path) -> AsyncIterator[Path]:
        runner = web.AppRunner(self.make_app(), handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        try:
            await web.UnixSite(runner, str(socket_path)).start()
            yield socket_path
        finally:
            await runner.cleanup()


def _desired_vcpus(raw: bytes) -> int | None:
    """VmResize's ``desired_vcpus`` (u32 in cloud-hypervisor), or ValueError like serde's."""
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("expected a VmResize object")
    desired = body.get("desired_vcpus")
    if desired is not None and (type(desired) is not int or desired < 0):
        raise ValueError(f"invalid value for desired_vcpus: {desired!r}, expected u32")
    return desired


def _desired_ram(raw: bytes) -> int | None:
    """VmResize's ``desired_ram`` (u64), or ValueError like serde's."""
    desired = json.loads(raw).get("desired_ram")
    if desired is not None and (type(desired) is not int or desired < 0):
        raise ValueError(f"invalid value for desired_ram: {desired!r}, expected u64")
    return desired
