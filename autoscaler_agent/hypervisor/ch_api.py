"""cloud-hypervisor's API contract: wire types for ``vm.info`` / ``vm.resize`` and status mapping.

Pure: no I/O. Shared by the HTTP client (``cloud_hypervisor``) and the CLI client
(``ch_remote``) so that both map an answer to exactly the same error. The structs follow the
OpenAPI schemas ``VmInfo``, ``VmConfig``, ``CpusConfig`` and ``VmResize``
(``shared/reference/cloud-hypervisor/``), keep only the fields we read, and ignore the rest:
a tolerant reader survives new cloud-hypervisor versions.

Facts from cloud-hypervisor's source (SOURCE.md) that the spec does not state:
``PUT /vm.resize`` answers 204, 404 (no VM created), 429 (a vCPU removal is still pending),
400 (bad body) or 500 (anything else, e.g. above ``max_vcpus``). Error bodies are a JSON array
of strings, outermost error first, since v47, and plain text before.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

import msgspec

from autoscaler_agent.hypervisor.base import MemoryState, VcpuState
from autoscaler_agent.hypervisor.errors import (
    HypervisorError,
    ResizeInProgress,
    ResizeRejected,
    UnexpectedResponse,
    VmNotFound,
)

AtLeastOne = Annotated[int, msgspec.Meta(ge=1)]
# cloud-hypervisor's own default (``DEFAULT_VCPUS``) when a config has no ``cpus`` section.
DEFAULT_VCPUS: Final = 1


class CpusConfig(msgspec.Struct, frozen=True, kw_only=True):
    boot_vcpus: AtLeastOne
    max_vcpus: AtLeastOne


class MemoryConfig(msgspec.Struct, frozen=True, kw_only=True):
    # ``size``: boot memory; ``hotplug_size``: the hot-plug region (virtio-mem or ACPI) above
    # it; ``hotplugged_size``: what vm.resize last plugged there (cloud-hypervisor updates it
    # on every memory resize; absent or null when nothing is plugged).
    size: Annotated[int, msgspec.Meta(ge=0)]
    hotplug_size: int | None = None
    hotplugged_size: int | None = None
    hotplug_method: str = "Acpi"


class PayloadConfig(msgspec.Struct, frozen=True, kw_only=True):
    kernel: str | None = None
    firmware: str | None = None


class VmConfig(msgspec.Struct, frozen=True, kw_only=True):
    # The spec makes ``payload`` required and ``cpus`` optional; we follow it.
    payload: PayloadConfig
    cpus: CpusConfig = CpusConfig(boot_vcpus=DEFAULT_VCPUS, max_vcpus=DEFAULT_VCPUS)
    # Optional in the spec, with cloud-hypervisor's default of 512 MiB.
    memory: MemoryConfig = MemoryConfig(size=512 * 2**20)


VmStateName = Literal["Created", "Running", "Shutdown", "Paused", "BreakPoint"]


class VmInfo(msgspec.Struct, frozen=True, kw_only=True):
    config: VmConfig
    # A str rather than ``VmStateName``: a state added by a later version must not break reads.
    state: str

    @property
    def vcpus(self) -> VcpuState:
        return VcpuState(current=self.config.cpus.boot_vcpus, max=self.config.cpus.max_vcpus)

    @property
    def memory(self) -> MemoryState:
        """Boot memory plus what is hot-plugged, as cloud-hypervisor's config records it.

        ``memory_actual_size`` is not used: it is the size minus the balloon, and says nothing
        about virtio-mem. Nor does vm.info tell the guest's plugged size apart from the
        requested one, so for cloud-hypervisor a shrink the guest cannot complete is only seen
        from inside the guest (MemTotal), not here.
        """
        m = self.config.memory
        plugged = m.hotplugged_size or 0
        room = m.hotplug_size or 0
        # virtio-mem plugs in 2 MiB blocks; ACPI hot-plug in 128 MiB DIMMs.
        block = (2 if m.hotplug_method == "VirtioMem" else 128) * 2**20 if room else 0
        return MemoryState(current=m.size + plugged, min=m.size, max=m.size + room, block=block)


class VmResize(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    desired_vcpus: AtLeastOne | None = None
    # The VM's whole memory in bytes (boot plus hot-plugged), not the hot-plugged part.
    desired_ram: Annotated[int, msgspec.Meta(ge=0)] | None = None


def check_memory_target(state: MemoryState, memory_bytes: int) -> None:
    """Raise ``ResizeRejected`` unless ``memory_bytes`` is min plus whole blocks, <= max."""
    if not state.min <= memory_bytes <= state.max:
        raise ResizeRejected(
            f"cannot resize memory to {memory_bytes} bytes: outside {state.min}..{state.max}"
        )
    if state.block and (memory_bytes - state.min) % state.block:
        raise ResizeRejected(
            f"cannot resize memory to {memory_bytes} bytes: not the boot memory plus whole "
            f"{state.block}-byte blocks"
        )


VM_INFO_DECODER: Final = msgspec.json.Decoder(VmInfo)
ENCODER: Final = msgspec.json.Encoder()
_STRINGS_DECODER: Final = msgspec.json.Decoder(list[str])


def decode_vm_info(body: bytes | str) -> VmInfo:
    try:
        return VM_INFO_DECODER.decode(body)
    except msgspec.DecodeError as e:
        raise UnexpectedResponse(
            "cloud-hypervisor vm.info answer is not a VmInfo", detail=str(e)
        ) from e


def error_text(body: bytes | str) -> str:
    """The hypervisor's error text: a v47+ JSON array joined outermost first, or plain text."""
    raw = body.encode() if isinstance(body, str) else body
    try:
        parts = _STRINGS_DECODER.decode(raw)
    except msgspec.DecodeError:
        return raw.decode("utf-8", errors="replace").strip() or "(empty body)"
    return ": ".join(p.strip() for p in parts if p.strip()) or "(empty body)"


def error_for_status(status: int, body: bytes | str, *, operation: str) -> HypervisorError:
    """Map a non-2xx answer to ``operation`` (``vm.resize``, ``vm.info``) to our error tree."""
    detail = error_text(body)
    where = f"cloud-hypervisor {operation} answered {status}"
    if status == 404:
        return VmNotFound(f"{where} (no VM created)", detail=detail)
    if status == 429:
        return ResizeInProgress(f"{where} (a vCPU removal is still pending)", detail=detail)
    if status in (400, 500) and operation == "vm.resize":
        return ResizeRejected(where, detail=detail)
    return UnexpectedResponse(where, detail=detail)


# ch-remote prints ``Server responded with error <status>: <body>`` (SOURCE.md). Its api_client
# formats both with Rust's ``{:?}``, so the status may be a name (``TooManyRequests``) and the
# body ``Some("...")`` or ``None``; older builds said "with an error:". Accept all of them.
_SERVER_RESPONSE: Final = re.compile(
    r"Server responded with (?:an )?error:? (?P<status>\w+)(?:: (?P<body>.*))?\s*\Z", re.DOTALL
)
_STATUS_NAMES: Final = {
    "BadRequest": 400,
    "NotFound": 404,
    "TooManyRequests": 429,
    "InternalServerError": 500,
    "NotImplemented": 501,
}
_RUST_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", '"': '"', "'": "'", "\\": "\\"}
_RUST_ESCAPE: Final = re.compile(r"\\(u\{[0-9a-fA-F]+\}|.)")


def _rust_unescape(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        if code.startswith("u{"):
            return chr(int(code[2:-1], 16))
        return _RUST_ESCAPES.get(code, code)

    return _RUST_ESCAPE.sub(one, text)


def parse_server_response(stderr: str) -> tuple[int, str] | None:
    """``(status, body)`` from ch-remote's stderr, or None if it did not get an HTTP answer."""
    m = _SERVER_RESPONSE.search(stderr)
    if m is None:
        return None
    raw_status = m.group("status")
    if raw_status.isdigit():
        status = int(raw_status)
    elif raw_status in _STATUS_NAMES:
        status = _STATUS_NAMES[raw_status]
    else:
        return None
    body = (m.group("body") or "").strip()
    if body == "None":
        body = ""
    elif body.startswith('Some("') and body.endswith('")'):
        body = _rust_unescape(body[len('Some("') : -len('")')])
    return status, body
