"""vCPUs through qemu-guest-agent (QGA), memory through QMP: the ``Hypervisor`` for VMs that
``vm_runner --vcpu-mode online`` starts.

Shell. In that mode QEMU creates every vCPU at boot and the guest kernel brings up only the
minimum (``maxcpus=``); a resize asks the guest to online or offline vCPUs it already has, with
QGA's ``guest-set-vcpus`` (what ``virsh setvcpus --guest`` does). QEMU's CPU objects never
change, which is the point: on QEMU 7.2 under TCG, plugging a vCPU again after any unplug kills
QEMU, while onlining and offlining survive any number of cycles (measured: 100 cycles of
1 -> 4 -> 1 vCPUs in 33 s, vm_image/README.md).

The wire: QEMU listens on a unix socket that is the host end of the guest's virtio-serial port
``org.qemu.guest_agent.0``; qemu-ga in the guest reads one JSON command per line and writes one
JSON answer per line. Unlike QMP there is no greeting and no event, and the host cannot tell
whether anyone is listening: a command to a guest that has not booted yet, or whose agent died,
just gets no answer. And a connection may hold a stale answer (to a command whose caller timed
out, even on an earlier connection: the guest's end of the port outlives ours). So:

* after every connect, ``guest-sync-delimited`` with a random id: the guest answers with a
  0xFF byte and then ``{"return": id}``; everything before that is stale and discarded. (The
  0xFF we send first also makes a guest agent that was in the middle of parsing garbage drop it.)
* one command at a time, each bounded by a timeout; a timeout, garbage or a closed socket drops
  the connection, so the next call reconnects and resynchronises.

What the guest says is the guest's word: ``VcpuState.current`` is the number of vCPUs it has
online, ``max`` the number it has (QEMU created ``max_vcpus``; all are present in the guest).
A guest root can online every vCPU by itself whatever the agent asks; what bounds the VM's CPU
use then is the pod's CPU limit (cgroup), which the extender resizes to the permit
(docs/DEPLOY.md, "vCPU modes").
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from pathlib import Path
from typing import Final

import msgspec
import structlog

from autoscaler_agent.hypervisor.base import MemoryState, VcpuState
from autoscaler_agent.hypervisor.errors import (
    HypervisorUnavailable,
    QgaCommandFailed,
    ResizeRejected,
    UnexpectedResponse,
    VcpuResizeIncomplete,
)
from autoscaler_agent.hypervisor.qmp import QmpClient
from autoscaler_agent.hypervisor.unix import open_unix_stream

DEFAULT_COMMAND_TIMEOUT_SECONDS: Final = 5.0
# guest-set-vcpus returns once the guest kernel has brought the CPUs up or down: 0.1-0.7 s for
# three under TCG here, more on a busy host; the factory passes the agent's unplug timeout.
DEFAULT_SET_VCPUS_TIMEOUT_SECONDS: Final = 10.0
SYNC_DELIMITER: Final = b"\xff"
# An answer for a few hundred vCPUs is well under this; anything longer is not qemu-ga.
MAX_LINE_BYTES: Final = 1 * 2**20

log = structlog.get_logger()


class GuestLogicalProcessor(msgspec.Struct, frozen=True, rename="kebab"):
    logical_id: int
    online: bool
    can_offline: bool = False


class QgaErrorBody(msgspec.Struct, frozen=True):
    error_class: str = msgspec.field(name="class")
    desc: str = ""


class QgaReply(msgspec.Struct, frozen=True):
    return_: msgspec.Raw | msgspec.UnsetType = msgspec.field(name="return", default=msgspec.UNSET)
    error: QgaErrorBody | None = None


_ENCODER: Final = msgspec.json.Encoder()
_REPLY_DECODER: Final = msgspec.json.Decoder(QgaReply)
_VCPUS_DECODER: Final = msgspec.json.Decoder(list[GuestLogicalProcessor])


def vcpu_state(processors: list[GuestLogicalProcessor]) -> VcpuState:
    return VcpuState(current=sum(p.online for p in processors), max=len(processors))


def plan_online(processors: list[GuestLogicalProcessor], vcpus: int) -> list[tuple[int, bool]]:
    """The ``(logical id, online)`` changes that leave ``vcpus`` online: onlining the lowest
    offline ids first, offlining the highest online ones that the guest can offline. Shorter
    than needed when the guest cannot offline enough (cpu0 usually cannot be)."""
    ordered = sorted(processors, key=lambda p: p.logical_id)
    online = sum(p.online for p in ordered)
    if vcpus > online:
        return [(p.logical_id, True) for p in ordered if not p.online][: vcpus - online]
    removable = [p for p in reversed(ordered) if p.online and p.can_offline]
    return [(p.logical_id, False) for p in removable[: online - vcpus]]


class QgaClient:
    """qemu-guest-agent behind the unix socket ``socket_path``: guest-get-vcpus and
    guest-set-vcpus, one command at a time.

    ``command_timeout_seconds`` bounds connecting, resynchronising and each read;
    ``set_vcpus_timeout_seconds`` bounds a guest-set-vcpus (the guest brings CPUs up or down
    before answering). QEMU serves one client per chardev socket: share one instance per VM.
    """

    def __init__(
        self,
        socket_path: Path,
        *,
        command_timeout_seconds: float = DEFAULT_COMMAND_TIMEOUT_SECONDS,
        set_vcpus_timeout_seconds: float = DEFAULT_SET_VCPUS_TIMEOUT_SECONDS,
    ) -> None:
        self.socket_path = socket_path
        self.command_timeout_seconds = command_timeout_seconds
        self.set_vcpus_timeout_seconds = set_vcpus_timeout_seconds
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        # One command in flight: answers carry no id, so they are matched by order.
        self._lock = asyncio.Lock()

    # -- connection --------------------------------------------------------------------------

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is not None and self._writer is not None:
            return self._reader, self._writer
        reader, writer = await open_unix_stream(
            self.socket_path,
            protocol="QGA",
            timeout_seconds=self.command_timeout_seconds,
            limit=MAX_LINE_BYTES,
        )
        self._reader, self._writer = reader, writer
        is_synced = False
        try:
            await self._sync(reader, writer)
            is_synced = True
        finally:
            # Also on cancellation: an unsynchronised connection must not be reused.
            if not is_synced:
                await self._disconnect()
        log.debug("qga_connected", socket=str(self.socket_path))
        return reader, writer

    async def _sync(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """guest-sync-delimited: skip to the guest's 0xFF, then to the answer with our id."""
        token = secrets.randbelow(2**31 - 1) + 1
        request = {"execute": "guest-sync-delimited", "arguments": {"id": token}}
        try:
            async with asyncio.timeout(self.command_timeout_seconds):
                writer.write(SYNC_DELIMITER + _ENCODER.encode(request) + b"\n")
                await writer.drain()
                while True:
                    await reader.readuntil(SYNC_DELIMITER)
                    line = await reader.readline()
                    with contextlib.suppress(msgspec.DecodeError):
                        reply = _REPLY_DECODER.decode(line)
                        answer = None if reply.return_ is msgspec.UNSET else reply.return_
                        if answer is not None and msgspec.json.decode(answer) == token:
                            return
        except TimeoutError as e:
            raise HypervisorUnavailable(
                f"QGA on {self.socket_path} did not answer guest-sync-delimited within "
                f"{self.command_timeout_seconds} s (guest still booting, or no qemu-ga in it)"
            ) from e
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            raise HypervisorUnavailable(
                f"QGA on {self.socket_path} broke while resynchronising", detail=str(e)
            ) from e

    async def _disconnect(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def close(self) -> None:
        async with self._lock:
            await self._disconnect()

    # -- commands ----------------------------------------------------------------------------

    async def execute(
        self, command: str, arguments: object = None, *, timeout_seconds: float | None = None
    ) -> bytes:
        """Run one QGA command; its raw ``return`` JSON. ``QgaCommandFailed`` if the guest
        answers with an error; ``HypervisorUnavailable`` (and a fresh connection next time) if
        it does not answer in time or the stream breaks; ``UnexpectedResponse`` for garbage."""
        timeout = self.command_timeout_seconds if timeout_seconds is None else timeout_seconds
        async with self._lock:
            reader, writer = await self._connect()
            request: dict[str, object] = {"execute": command}
            if arguments is not None:
                request["arguments"] = arguments
            is_done = False
            try:
                async with asyncio.timeout(timeout):
                    writer.write(_ENCODER.encode(request) + b"\n")
                    await writer.drain()
                    line = b""
                    while not line.strip():  # qemu-ga may send blank lines; skip them
                        line = await reader.readline()
                        if not line:
                            raise HypervisorUnavailable(f"QGA closed the connection on {command}")
                reply = _REPLY_DECODER.decode(line)
                is_done = True
            except TimeoutError as e:
                raise HypervisorUnavailable(
                    f"QGA {command} got no answer within {timeout} s"
                ) from e
            except (OSError, ValueError) as e:
                # ValueError: an over-long line (LimitOverrunError is not one, readline
                # converts it) or not JSON at all (msgspec.DecodeError).
                if isinstance(e, msgspec.DecodeError):
                    raise UnexpectedResponse(
                        f"QGA {command} answered something that is not a QGA reply",
                        detail=line[:200].decode(errors="replace"),
                    ) from e
                raise HypervisorUnavailable(f"QGA {command} failed", detail=str(e)) from e
            finally:
                if not is_done:
                    # The answer may still come: only a new, resynchronised connection is safe.
                    await self._disconnect()
        if reply.error is not None:
            raise QgaCommandFailed(
                command, error_class=reply.error.error_class, desc=reply.error.desc
            )
        if isinstance(reply.return_, msgspec.UnsetType):
            raise UnexpectedResponse(f"QGA {command} reply has neither return nor error")
        return bytes(reply.return_)

    async def processors(self) -> list[GuestLogicalProcessor]:
        raw = await self.execute("guest-get-vcpus")
        try:
            processors = _VCPUS_DECODER.decode(raw)
        except msgspec.ValidationError as e:
            raise UnexpectedResponse(
                "QGA guest-get-vcpus returned an unexpected shape", detail=str(e)
            ) from e
        if not processors or len({p.logical_id for p in processors}) != len(processors):
            raise UnexpectedResponse(
                "QGA guest-get-vcpus listed no vCPU or one twice", detail=raw[:200].decode()
            )
        return processors

    async def set_online(self, changes: list[tuple[int, bool]]) -> int:
        """guest-set-vcpus; how many of ``changes`` the guest made (it stops at the first it
        cannot make, and fails outright only if that is the first)."""
        if not changes:
            return 0
        raw = await self.execute(
            "guest-set-vcpus",
            {"vcpus": [{"logical-id": i, "online": online} for i, online in changes]},
            timeout_seconds=self.set_vcpus_timeout_seconds,
        )
        try:
            return msgspec.json.decode(raw, type=int)
        except msgspec.ValidationError as e:
            raise UnexpectedResponse(
                "QGA guest-set-vcpus returned an unexpected shape", detail=str(e)
            ) from e


class QgaVcpuHypervisor:
    """The VM's vCPUs through ``qga``, its memory through ``qmp`` (virtio-mem, as ever)."""

    def __init__(self, qga: QgaClient, qmp: QmpClient) -> None:
        self.qga = qga
        self.qmp = qmp
        self._resize_lock = asyncio.Lock()

    async def vcpus(self) -> VcpuState:
        return vcpu_state(await self.qga.processors())

    async def resize(self, vcpus: int) -> VcpuState:
        if vcpus < 1:
            raise ResizeRejected(f"cannot resize to {vcpus} vCPUs: at least 1 is required")
        async with self._resize_lock:
            processors = await self.qga.processors()
            before = vcpu_state(processors)
            if vcpus > before.max:
                raise ResizeRejected(f"cannot resize to {vcpus} vCPUs: the guest has {before.max}")
            if vcpus == before.current:
                return before
            changes = plan_online(processors, vcpus)
            refused: QgaCommandFailed | None = None
            try:
                done = await self.qga.set_online(changes)
            except QgaCommandFailed as e:
                refused, done = e, 0
            after = await self.vcpus()
            log.info(
                "vcpus_resized",
                hypervisor="qga",
                before=before.current,
                requested=vcpus,
                after=after.current,
            )
            if after.current == vcpus:
                return after
            verb = "onlining" if vcpus > before.current else "offlining"
            why = (
                f"the guest refused ({refused.desc})"
                if refused is not None
                else f"the guest changed {done} of {len(changes)} vCPUs"
            )
            raise VcpuResizeIncomplete(
                f"{verb} vCPUs to {vcpus} did not complete: {why}; "
                f"{after.current} vCPUs are online",
                state=after,
            )

    async def memory(self) -> MemoryState:
        return await self.qmp.memory()

    async def resize_memory(self, memory_bytes: int) -> MemoryState:
        return await self.qmp.resize_memory(memory_bytes)

    async def close(self) -> None:
        # Both, even if the first fails (it never raises today, but a leak would be silent).
        try:
            await self.qga.close()
        finally:
            await self.qmp.close()
