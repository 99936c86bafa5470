"""Just enough ELF reading to find a binary's interpreter and the shared libraries it needs.

Pure: parses bytes. It replaces ``ldd``/``readelf`` so that a bare build machine needs no
binutils, and so that we read the guest's binaries without running them on the host.
Only 64-bit little-endian ELF is supported, which is all an amd64 guest contains.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_PT_DYNAMIC = 2
_PT_INTERP = 3
_DT_NULL = 0
_DT_NEEDED = 1
_DT_STRTAB = 5
_PT_LOAD = 1


@dataclass(frozen=True, kw_only=True)
class DynamicInfo:
    interpreter: str | None
    needed: tuple[str, ...]


def _vaddr_to_offset(loads: list[tuple[int, int, int]], vaddr: int) -> int:
    for offset, start, size in loads:
        if start <= vaddr < start + size:
            return offset + (vaddr - start)
    raise ValueError(f"address {vaddr:#x} is in no PT_LOAD segment")


def read_dynamic_info(data: bytes) -> DynamicInfo:
    """The PT_INTERP path and the DT_NEEDED names, in file order; static binaries give neither."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    interpreter: str | None = None
    dynamic: tuple[int, int] | None = None
    loads: list[tuple[int, int, int]] = []
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == _PT_INTERP:
            interpreter = data[p_offset : p_offset + p_filesz].rstrip(b"\0").decode()
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
        elif p_type == _PT_LOAD:
            loads.append((p_offset, p_vaddr, p_filesz))
    if dynamic is None:
        return DynamicInfo(interpreter=interpreter, needed=())
    needed_offsets: list[int] = []
    strtab_vaddr: int | None = None
    offset, size = dynamic
    for pos in range(offset, offset + size, 16):
        tag, value = struct.unpack_from("<qQ", data, pos)
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            needed_offsets.append(value)
        elif tag == _DT_STRTAB:
            strtab_vaddr = value
    if strtab_vaddr is None:
        raise ValueError("dynamic section has no DT_STRTAB")
    strtab = _vaddr_to_offset(loads, strtab_vaddr)
    names = []
    for name_offset in needed_offsets:
        start = strtab + name_offset
        names.append(data[start : data.index(b"\0", start)].decode())
    return DynamicInfo(interpreter=interpreter, needed=tuple(names))
