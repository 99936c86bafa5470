"""A ``Hypervisor`` that drives cloud-hypervisor through its ``ch-remote`` CLI.

Shell: runs ``ch-remote --api-socket PATH info`` / ``... resize --cpus N`` and maps the exit
status and stderr (``Server responded with error <status>: <body>``) to the same errors as the
HTTP client, through ``ch_api``. For hosts where only the CLI may touch the socket. It must not
interpret the VM's state beyond what ``vm.info`` says, nor retry.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Final

import structlog

from autoscaler_agent.hypervisor import ch_api
from autoscaler_agent.hypervisor.base import MemoryState, VcpuState
from autoscaler_agent.hypervisor.cloud_hypervisor import resize_memory_with
from autoscaler_agent.hypervisor.errors import HypervisorUnavailable, ResizeRejected

DEFAULT_BINARY: Final = "ch-remote"
DEFAULT_TIMEOUT_SECONDS: Final = 5.0

log = structlog.get_logger()


class ChRemoteClient:
    """cloud-hypervisor via ``binary`` (a path or a name on PATH) against ``socket_path``.

    ``timeout_seconds`` bounds each CLI run; on expiry the process is killed.
    """

    def __init__(
        self,
        socket_path: Path,
        *,
        binary: str = DEFAULT_BINARY,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.socket_path = socket_path
        self.binary = binary
        self.timeout_seconds = timeout_seconds

    async def _run(self, *args: str) -> tuple[int, str, str]:
        argv = [self.binary, "--api-socket", str(self.socket_path), *args]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as e:
            raise HypervisorUnavailable(f"cannot run {self.binary}", detail=str(e)) from e
        try:
            async with asyncio.timeout(self.timeout_seconds):
                stdout, stderr = await proc.communicate()
        except TimeoutError as e:
            await self._kill(proc)
            raise HypervisorUnavailable(
                f"{self.binary} {args[0]} did not finish within {self.timeout_seconds} s"
            ) from e
        except asyncio.CancelledError:
            await self._kill(proc)
            raise
        assert proc.returncode is not None  # communicate() waits for exit
        return proc.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")

    @staticmethod
    async def _kill(proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()

    async def _call(self, operation: str, *args: str) -> str:
        code, stdout, stderr = await self._run(*args)
        if code == 0:
            return stdout
        parsed = ch_api.parse_server_response(stderr)
        if parsed is None:
            # No HTTP answer at all: the socket is missing, refused or the VMM died mid-call.
            raise HypervisorUnavailable(
                f"{self.binary} {args[0]} exited {code} without an answer from {self.socket_path}",
                detail=stderr.strip() or None,
            )
        status, body = parsed
        raise ch_api.error_for_status(status, body, operation=operation)

    async def vcpus(self) -> VcpuState:
        return ch_api.decode_vm_info(await self._call("vm.info", "info")).vcpus

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
        await self._call("vm.resize", "resize", "--cpus", str(vcpus))
        after = await self.vcpus()
        log.info(
            "vcpus_resized",
            hypervisor="ch-remote",
            before=before.current,
            requested=vcpus,
            after=after.current,
        )
        return after

    async def memory(self) -> MemoryState:
        return (ch_api.decode_vm_info(await self._call("vm.info", "info"))).memory

    async def resize_memory(self, memory_bytes: int) -> MemoryState:
        async def run() -> None:
            await self._call("vm.resize", "resize", "--memory", f"{memory_bytes}")

        return await resize_memory_with(self.memory, run, memory_bytes, hypervisor="ch-remote")

    async def close(self) -> None:
        """Nothing to release: each call is its own process."""
