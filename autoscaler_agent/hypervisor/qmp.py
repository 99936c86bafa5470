"""A ``Hypervisor`` for QEMU over QMP (the JSON machine protocol on a unix socket).

Shell. One connection per VM: read the greeting, negotiate ``qmp_capabilities``, then send
commands with ids. QEMU may write asynchronous events (``DEVICE_DELETED``, ``ACPI_DEVICE_OST``,
``RTC_CHANGE``, ...) between a command and its reply, so a single reader task owns the stream:
it resolves each reply's future by id and hands events to subscribers. If the socket closes,
pending commands fail with ``HypervisorUnavailable`` and the next call reconnects.

vCPU hot-plug, as QEMU 7.2 does it (``shared/reference/qemu-guest.md``):

* ``query-cpus-fast`` lists plugged vCPUs; ``query-hotpluggable-cpus`` lists every slot up to
  ``maxcpus``, with a ``qom-path`` only when the slot is occupied.
* Growing plugs free slots, lowest topology position first, with ``device_add``. The guest sees
  them offline and must online them itself; that is not this module's business.
* Shrinking unplugs the highest hot-plugged vCPUs with ``device_del``. The boot vCPUs (created
  by ``-smp``, under ``/machine/unattached``) are never touched. Unplug is a request to the guest:
  it completes with ``DEVICE_DELETED`` once the guest has ejected the CPU. Without a cooperating
  guest QEMU refuses it at once ("acpi: device unplug request for not supported device type").

Memory hot-plug, as QEMU 7.2 does it with a ``virtio-mem-pci`` device (``vm_runner.cmdline``):

* ``query-memory-size-summary`` gives the boot memory; ``query-memory-devices`` the virtio-mem
  device's ``size`` (plugged by the guest), ``requested-size``, ``max-size`` and ``block-size``.
* A resize sets the device's ``requested-size`` (``qom-set``); the *guest driver* then plugs or
  unplugs blocks until ``size`` matches. Nothing happens without a cooperating guest, and a
  guest cannot unplug memory in use, so every resize waits (polling ``qom-get size``) for as
  long as the size keeps moving, and stops once it has not moved for
  ``memory_stall_seconds`` or after ``memory_resize_timeout_seconds`` in all. If it stopped
  short, the device is asked for exactly the size reached (so the guest neither keeps
  migrating pages for an unplug that cannot finish, nor later moves away from what was
  reported) and ``MemoryResizeIncomplete`` says what is in effect. Measured on the minimal
  guest under TCG: 512 MiB plugged and online in ~0.1 s, 1 GiB of free memory unplugged in
  ~1 s; with 700 MiB pinned in a tmpfs, a shrink to 0 stopped at 384 MiB.

It must not decide sizes, retry, or hide a partial result: every failure re-reads what is in
effect and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final, TypeVar

import msgspec
import structlog

from autoscaler_agent.hypervisor.base import MemoryState, VcpuState
from autoscaler_agent.hypervisor.errors import (
    HypervisorUnavailable,
    MemoryResizeIncomplete,
    QmpCommandFailed,
    ResizeRejected,
    UnexpectedResponse,
    UnplugNotCompleted,
)
from autoscaler_agent.hypervisor.unix import open_unix_stream

DEFAULT_COMMAND_TIMEOUT_SECONDS: Final = 5.0
# Room for a running Linux guest to eject a vCPU under TCG (measured in qemu-guest.md).
DEFAULT_UNPLUG_TIMEOUT_SECONDS: Final = 5.0
# A memory resize ends when the plugged size has not moved for this long, or after the total.
DEFAULT_MEMORY_STALL_SECONDS: Final = 3.0
DEFAULT_MEMORY_RESIZE_TIMEOUT_SECONDS: Final = 60.0
MEMORY_POLL_SECONDS: Final = 0.05
# query-hotpluggable-cpus for a few hundred vCPUs is well above asyncio's 64 KiB line default.
MAX_LINE_BYTES: Final = 16 * 2**20
# Topology ids, outermost first: the order that makes "highest vCPU" mean the last one plugged.
# node-id is NUMA placement, not a position, so it is passed through but never ranked.
_POSITION_KEYS: Final = (
    ("drawer-id", "dr"),
    ("book-id", "b"),
    ("socket-id", "s"),
    ("die-id", "d"),
    ("cluster-id", "cl"),
    ("core-id", "c"),
    ("thread-id", "t"),
)
# Where QEMU puts devices created by device_add; boot vCPUs live under /machine/unattached.
_HOTPLUGGED_PREFIX: Final = "/machine/peripheral"

log = structlog.get_logger()
T = TypeVar("T")


class QmpErrorBody(msgspec.Struct, frozen=True):
    error_class: str = msgspec.field(name="class")
    desc: str = ""


class QmpMessage(msgspec.Struct, frozen=True):
    """Any line QEMU sends: greeting (``QMP``), reply (``return``/``error`` + ``id``) or event."""

    # Raw cannot sit in a union with None; UNSET marks "absent".
    QMP: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    return_: msgspec.Raw | msgspec.UnsetType = msgspec.field(name="return", default=msgspec.UNSET)
    error: QmpErrorBody | None = None
    id: str | int | None = None
    event: str | None = None
    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class QmpEvent(msgspec.Struct, frozen=True):
    name: str
    data: msgspec.Raw | None


class DeviceDeleted(msgspec.Struct, frozen=True):
    path: str
    device: str | None = None


class HotpluggableCpu(msgspec.Struct, frozen=True, rename="kebab"):
    type: str
    props: dict[str, int]
    vcpus_count: int = 1
    qom_path: str | None = None

    @property
    def position(self) -> tuple[int, ...]:
        return tuple(self.props.get(key, -1) for key, _ in _POSITION_KEYS)

    @property
    def device_id(self) -> str:
        """An id that says where the vCPU sits, e.g. ``vcpu-s0-c1-t0``."""
        parts = [f"{short}{self.props[key]}" for key, short in _POSITION_KEYS if key in self.props]
        return "-".join(["vcpu", *parts])

    @property
    def is_hotplugged(self) -> bool:
        return self.qom_path is not None and self.qom_path.startswith(_HOTPLUGGED_PREFIX)


class CpuInfoFast(msgspec.Struct, frozen=True, rename="kebab"):
    cpu_index: int
    qom_path: str


class MemorySizeSummary(msgspec.Struct, frozen=True, rename="kebab"):
    base_memory: int
    plugged_memory: int = 0


class VirtioMemInfo(msgspec.Struct, frozen=True, rename="kebab"):
    size: int
    max_size: int
    block_size: int
    requested_size: int
    id: str | None = None


class MemoryDevice(msgspec.Struct, frozen=True):
    """One entry of query-memory-devices; ``data`` is decoded only for virtio-mem."""

    type: str
    data: msgspec.Raw


class _Vmem(msgspec.Struct, frozen=True):
    base: int
    plugged: int  # every memory device's plugged memory, the virtio-mem device's included
    device: VirtioMemInfo | None

    @property
    def state(self) -> MemoryState:
        current = self.base + self.plugged
        if self.device is None:
            return MemoryState(current=current, min=current, max=current, block=0)
        floor = current - self.device.size
        return MemoryState(
            current=current,
            min=floor,
            max=floor + self.device.max_size,
            block=self.device.block_size,
        )


_ENCODER: Final = msgspec.json.Encoder()
_DEVICE_DELETED_DECODER: Final = msgspec.json.Decoder(DeviceDeleted)


def _deleted_path(data: msgspec.Raw) -> str | None:
    try:
        return _DEVICE_DELETED_DECODER.decode(data).path
    except msgspec.DecodeError:
        return None


_MESSAGE_DECODER: Final = msgspec.json.Decoder(QmpMessage)


class QmpClient:
    """QEMU's QMP monitor on ``socket_path``.

    ``command_timeout_seconds`` bounds connecting plus each command's reply;
    ``unplug_timeout_seconds`` is how long a shrink waits for the guest to release the vCPUs.
    QEMU serves one QMP client per socket at a time, so share one instance per VM.
    """

    def __init__(
        self,
        socket_path: Path,
        *,
        command_timeout_seconds: float = DEFAULT_COMMAND_TIMEOUT_SECONDS,
        unplug_timeout_seconds: float = DEFAULT_UNPLUG_TIMEOUT_SECONDS,
        memory_stall_seconds: float = DEFAULT_MEMORY_STALL_SECONDS,
        memory_resize_timeout_seconds: float = DEFAULT_MEMORY_RESIZE_TIMEOUT_SECONDS,
    ) -> None:
        self.socket_path = socket_path
        self.command_timeout_seconds = command_timeout_seconds
        self.unplug_timeout_seconds = unplug_timeout_seconds
        self.memory_stall_seconds = memory_stall_seconds
        self.memory_resize_timeout_seconds = memory_resize_timeout_seconds
        self._ids = itertools.count(1)
        self._pending: dict[str, asyncio.Future[QmpMessage]] = {}
        self._subscribers: set[asyncio.Queue[QmpEvent]] = set()
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connect_lock = asyncio.Lock()
        self._resize_lock = asyncio.Lock()

    # -- connection --------------------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        return self._reader_task is not None and not self._reader_task.done()

    async def _ensure_connected(self) -> None:
        async with self._connect_lock:
            if self.is_connected:
                return
            await self._disconnect()
            reader, writer = await open_unix_stream(
                self.socket_path,
                protocol="QMP",
                timeout_seconds=self.command_timeout_seconds,
                limit=MAX_LINE_BYTES,
            )
            self._writer = writer
            is_ready = False
            try:
                await self._handshake(reader)
                is_ready = True
            finally:
                # Also on cancellation: a half-open connection must not be reused.
                if not is_ready:
                    await self._disconnect()
        log.debug("qmp_connected", socket=str(self.socket_path))

    async def _handshake(self, reader: asyncio.StreamReader) -> None:
        try:
            async with asyncio.timeout(self.command_timeout_seconds):
                line = await reader.readline()
        except TimeoutError as e:
            raise HypervisorUnavailable(
                f"QMP on {self.socket_path} sent no greeting within "
                f"{self.command_timeout_seconds} s"
            ) from e
        except (OSError, ValueError) as e:
            raise HypervisorUnavailable(
                f"QMP on {self.socket_path} broke before its greeting", detail=str(e)
            ) from e
        try:
            greeting = _MESSAGE_DECODER.decode(line)
        except msgspec.DecodeError as e:
            raise UnexpectedResponse(
                f"{self.socket_path} did not greet like QMP",
                detail=line[:200].decode(errors="replace") or "(closed)",
            ) from e
        if isinstance(greeting.QMP, msgspec.UnsetType):
            raise UnexpectedResponse(
                f"{self.socket_path} did not greet like QMP",
                detail=line[:200].decode(errors="replace"),
            )
        self._reader_task = asyncio.create_task(self._read(reader), name="qmp-reader")
        await self._send("qmp_capabilities", None)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        reason = "QEMU closed the QMP connection"
        try:
            while line := await reader.readline():
                message = _MESSAGE_DECODER.decode(line)
                if message.event is not None:
                    data = None if isinstance(message.data, msgspec.UnsetType) else message.data
                    event = QmpEvent(name=message.event, data=data)
                    log.debug("qmp_event", qmp_event=event.name)
                    for queue in self._subscribers:
                        queue.put_nowait(event)
                    continue
                future = self._pending.pop(str(message.id), None)
                if future is None:
                    log.warning("qmp_unmatched_reply", id=message.id)
                elif not future.done():
                    future.set_result(message)
        except (OSError, ValueError) as e:
            # ValueError covers msgspec.DecodeError and an over-long line (LimitOverrunError).
            reason = f"QMP stream broke: {e}"
            log.warning("qmp_stream_broken", socket=str(self.socket_path), error=str(e))
        finally:
            self._fail_pending(reason)

    def _fail_pending(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(HypervisorUnavailable(reason))

    async def _disconnect(self) -> None:
        task, self._reader_task = self._reader_task, None
        writer, self._writer = self._writer, None
        if task is not None:
            task.cancel()
            # wait() rather than await: the reader's own cancellation is expected here, but a
            # cancellation of *our* caller must still propagate.
            await asyncio.wait([task])
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        self._fail_pending("QMP connection closed")

    async def close(self) -> None:
        async with self._connect_lock:
            await self._disconnect()

    # -- commands and events -----------------------------------------------------------------

    async def _send(self, command: str, arguments: Mapping[str, object] | None) -> msgspec.Raw:
        writer = self._writer
        if writer is None or not self.is_connected:
            raise HypervisorUnavailable(f"QMP connection to {self.socket_path} was lost")
        command_id = str(next(self._ids))
        future: asyncio.Future[QmpMessage] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        request: dict[str, object] = {"execute": command, "id": command_id}
        if arguments:
            request["arguments"] = arguments
        try:
            writer.write(_ENCODER.encode(request) + b"\n")
            async with asyncio.timeout(self.command_timeout_seconds):
                await writer.drain()
                reply = await future
        except TimeoutError as e:
            raise HypervisorUnavailable(
                f"QMP {command} got no reply within {self.command_timeout_seconds} s"
            ) from e
        except OSError as e:
            raise HypervisorUnavailable(f"QMP {command} could not be sent", detail=str(e)) from e
        finally:
            self._pending.pop(command_id, None)
        if reply.error is not None:
            raise QmpCommandFailed(
                command, error_class=reply.error.error_class, desc=reply.error.desc
            )
        if isinstance(reply.return_, msgspec.UnsetType):
            raise UnexpectedResponse(f"QMP {command} reply has neither return nor error")
        return reply.return_

    async def execute(self, command: str, arguments: Mapping[str, object] | None = None) -> bytes:
        """Run one QMP command, reconnecting first if needed; returns the raw ``return`` JSON.

        Raises ``QmpCommandFailed`` if QEMU answers with an error.
        """
        await self._ensure_connected()
        return bytes(await self._send(command, arguments))

    async def _query(
        self, command: str, type_: type[T], arguments: Mapping[str, object] | None = None
    ) -> T:
        raw = await self.execute(command, arguments)
        try:
            return msgspec.json.decode(raw, type=type_)
        except msgspec.ValidationError as e:
            raise UnexpectedResponse(
                f"QMP {command} returned an unexpected shape", detail=str(e)
            ) from e

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[asyncio.Queue[QmpEvent]]:
        """Receive every event that arrives while the block is open (subscribe *before* acting)."""
        queue: asyncio.Queue[QmpEvent] = asyncio.Queue()
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)

    # -- Hypervisor --------------------------------------------------------------------------

    async def _slots(self) -> list[HotpluggableCpu]:
        return await self._query("query-hotpluggable-cpus", list[HotpluggableCpu])

    async def vcpus(self) -> VcpuState:
        plugged = await self._query("query-cpus-fast", list[CpuInfoFast])
        slots = await self._slots()
        return VcpuState(current=len(plugged), max=sum(s.vcpus_count for s in slots))

    async def resize(self, vcpus: int) -> VcpuState:
        if vcpus < 1:
            raise ResizeRejected(f"cannot resize to {vcpus} vCPUs: at least 1 is required")
        async with self._resize_lock:
            before = await self.vcpus()
            if vcpus > before.max:
                raise ResizeRejected(
                    f"cannot resize to {vcpus} vCPUs: QEMU was started with maxcpus={before.max}"
                )
            if vcpus > before.current:
                after = await self._grow(before, vcpus)
            elif vcpus < before.current:
                after = await self._shrink(before, vcpus)
            else:
                return before
            log.info(
                "vcpus_resized",
                hypervisor="qemu",
                before=before.current,
                requested=vcpus,
                after=after.current,
            )
            return after

    async def _grow(self, before: VcpuState, vcpus: int) -> VcpuState:
        free = sorted(
            (s for s in await self._slots() if s.qom_path is None), key=lambda s: s.position
        )
        wanted = free[: vcpus - before.current]
        if any(s.vcpus_count != 1 for s in wanted):
            raise ResizeRejected("hot-plug slots holding more than one vCPU are not supported")
        for slot in wanted:
            try:
                await self.execute(
                    "device_add", {"driver": slot.type, "id": slot.device_id, **slot.props}
                )
            except QmpCommandFailed as e:
                now = await self.vcpus()
                raise ResizeRejected(
                    f"QEMU refused to plug vCPU {slot.device_id} "
                    f"({now.current} of {vcpus} vCPUs in effect)",
                    detail=e.desc,
                ) from e
        return await self.vcpus()

    async def _shrink(self, before: VcpuState, vcpus: int) -> VcpuState:
        removable = sorted(
            (s for s in await self._slots() if s.is_hotplugged),
            key=lambda s: s.position,
            reverse=True,
        )
        count = before.current - vcpus
        if len(removable) < count:
            raise ResizeRejected(
                f"cannot shrink to {vcpus} vCPUs: only {len(removable)} of {before.current} "
                "were hot-plugged, and boot vCPUs cannot be removed"
            )
        victims = [s.qom_path for s in removable[:count] if s.qom_path is not None]
        refused: QmpCommandFailed | None = None
        with self.subscribe() as events:
            requested: set[str] = set()
            for path in victims:
                try:
                    await self.execute("device_del", {"id": path})
                except QmpCommandFailed as e:
                    refused = e
                    break
                requested.add(path)
            try:
                async with asyncio.timeout(self.unplug_timeout_seconds):
                    while requested:
                        event = await events.get()
                        if event.name == "DEVICE_DELETED" and event.data is not None:
                            gone = msgspec.json.decode(event.data, type=DeviceDeleted).path
                            # QEMU 7.2 announces an ejected vCPU only through its child's path
                            # ("<vcpu path>/lapic", seen with the minimal guest); the child is
                            # deleted as part of the vCPU, so either path means it is gone.
                            requested = {
                                p for p in requested if gone != p and not gone.startswith(p + "/")
                            }
            except TimeoutError:
                pass  # reported below, with what is actually in effect
        after = await self.vcpus()
        if refused is None and not requested:
            return after
        if refused is not None:
            why = "QEMU refused the unplug request (a running guest must release the vCPU)"
            detail: str | None = refused.desc
        else:
            why = (
                f"the guest did not release {len(requested)} vCPU(s) within "
                f"{self.unplug_timeout_seconds} s"
            )
            detail = None
        raise UnplugNotCompleted(
            f"shrinking to {vcpus} vCPUs did not complete: {why}; "
            f"{after.current} vCPUs are in effect",
            state=after,
            detail=detail,
        )

    # -- memory (virtio-mem) -----------------------------------------------------------------

    async def _vmem(self) -> _Vmem:
        summary = await self._query("query-memory-size-summary", MemorySizeSummary)
        devices = await self._query("query-memory-devices", list[MemoryDevice])
        found = [d for d in devices if d.type == "virtio-mem"]
        if len(found) > 1:
            raise UnexpectedResponse("more than one virtio-mem device: which one to resize?")
        device = None
        if found:
            try:
                device = msgspec.json.decode(found[0].data, type=VirtioMemInfo)
            except msgspec.ValidationError as e:
                raise UnexpectedResponse(
                    "QMP query-memory-devices: a virtio-mem entry of unexpected shape",
                    detail=str(e),
                ) from e
        return _Vmem(base=summary.base_memory, plugged=summary.plugged_memory, device=device)

    async def memory(self) -> MemoryState:
        return (await self._vmem()).state

    async def _device_size(self, path: str) -> int:
        return await self._query("qom-get", int, {"path": path, "property": "size"})

    async def resize_memory(self, memory_bytes: int) -> MemoryState:
        async with self._resize_lock:
            vmem = await self._vmem()
            before = vmem.state
            device = vmem.device
            if memory_bytes == before.current and (
                device is None or device.requested_size == device.size
            ):
                return before
            if device is None or device.id is None:
                raise ResizeRejected(
                    f"cannot resize memory to {memory_bytes} bytes: the VM has no virtio-mem "
                    "device with an id (start it with max-memory above its memory)"
                )
            if not before.min <= memory_bytes <= before.max:
                raise ResizeRejected(
                    f"cannot resize memory to {memory_bytes} bytes: outside "
                    f"{before.min}..{before.max}"
                )
            requested = memory_bytes - before.min
            if requested % device.block_size:
                raise ResizeRejected(
                    f"cannot resize memory to {memory_bytes} bytes: not the boot memory plus "
                    f"whole {device.block_size}-byte blocks"
                )
            path = f"{_HOTPLUGGED_PREFIX}/{device.id}"
            await self._set_requested(path, requested)
            size = await self._wait_for_size(path, requested, device.size)
            if size != requested:
                # Stopped short: pin the device at what the guest reached (see the docstring).
                await self._set_requested(path, size)
            after = MemoryState(
                current=before.min + size, min=before.min, max=before.max, block=before.block
            )
            log.info(
                "memory_resized",
                hypervisor="qemu",
                before=before.current,
                requested=memory_bytes,
                after=after.current,
            )
            if size != requested:
                verb = "shrinking" if requested < device.size else "growing"
                raise MemoryResizeIncomplete(
                    f"{verb} memory to {memory_bytes} bytes stopped at {after.current} bytes: "
                    f"the guest {'unplugged' if verb == 'shrinking' else 'plugged'} no more "
                    f"within {self.memory_stall_seconds} s (memory in use, or no virtio-mem "
                    "driver in the guest)",
                    state=after,
                )
            return after

    async def _set_requested(self, path: str, requested: int) -> None:
        try:
            await self.execute(
                "qom-set", {"path": path, "property": "requested-size", "value": requested}
            )
        except QmpCommandFailed as e:
            raise ResizeRejected(
                f"QEMU refused requested-size {requested} for {path}", detail=e.desc
            ) from e

    async def _wait_for_size(self, path: str, requested: int, start: int) -> int:
        """Poll the plugged size until it reaches ``requested`` or stops moving; the last one."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.memory_resize_timeout_seconds
        size, moved_at = start, loop.time()
        while True:
            now_size = await self._device_size(path)
            now = loop.time()
            if now_size != size:
                size, moved_at = now_size, now
            if size == requested or now - moved_at >= self.memory_stall_seconds:
                return size
            if now >= give_up_at:
                return size
            await asyncio.sleep(MEMORY_POLL_SECONDS)
