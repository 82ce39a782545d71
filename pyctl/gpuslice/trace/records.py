"""Decoder for the recorded NVIDIA ioctl traces (tests/traces/*.log.gz, recorded on an H100).

One line per ioctl on a /dev/nvidia* file (see tests/traces/README.md):

    PID FD PATH req=REQ ret=RET us=MICROSECONDS in=HEX out=HEX [pin=HEX pout=HEX]

Everything here is a pure function of the text: `parse_line` turns a line into a
`TraceCall`, and the `decode_*` helpers turn a call's argument block into named fields
with the layouts of `gpuslice.abi` (the one Python place for NVIDIA's ABI).
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpuslice import abi

Kind = Literal["nv", "uvm"]

UVM_SUFFIX = "nvidia-uvm"
# The recorder read at most this many bytes of a parameter block (pin/pout): larger
# control parameters (some nvidia-smi queries) are truncated in the trace.
MAX_RECORDED_PARAMS = 8192


@dataclass(frozen=True)
class TraceCall:
    """One recorded ioctl. `arg_in`/`arg_out` are the argument block (None for UVM),
    `pin`/`pout` the parameter block of RM_ALLOC / RM_CONTROL (None otherwise)."""

    index: int
    pid: int
    fd: int
    path: str
    req: int
    ret: int
    us: float
    arg_in: bytes | None
    arg_out: bytes | None
    pin: bytes | None
    pout: bytes | None

    @property
    def kind(self) -> Kind:
        return "uvm" if self.path.endswith(UVM_SUFFIX) else "nv"

    @property
    def nr(self) -> int:
        """The escape number (nv) or the bare UVM command."""
        return self.req if self.kind == "uvm" else abi.ioc_nr(self.req)

    @property
    def size(self) -> int:
        return 0 if self.kind == "uvm" else abi.ioc_size(self.req)

    @property
    def name(self) -> str:
        return call_name(self)


class TraceFormatError(ValueError):
    pass


def _hex(value: str, field: str, lineno: int) -> bytes:
    try:
        return bytes.fromhex(value)
    except ValueError as e:
        raise TraceFormatError(f"line {lineno}: bad hex in {field}") from e


def parse_line(line: str, index: int = 0) -> TraceCall:
    """Parse one trace line. Raises TraceFormatError on anything malformed."""
    parts = line.split()
    if len(parts) < 6:
        raise TraceFormatError(f"line {index}: too few fields: {line[:80]!r}")
    try:
        pid, fd = int(parts[0]), int(parts[1])
    except ValueError as e:
        raise TraceFormatError(f"line {index}: bad pid/fd") from e
    path = parts[2]
    kv: dict[str, str] = {}
    for tok in parts[3:]:
        key, sep, value = tok.partition("=")
        if not sep or key in kv:
            raise TraceFormatError(f"line {index}: bad token {tok[:40]!r}")
        kv[key] = value
    for need in ("req", "ret", "us"):
        if need not in kv:
            raise TraceFormatError(f"line {index}: missing {need}=")
    try:
        req, ret, us = int(kv["req"], 16), int(kv["ret"]), float(kv["us"])
    except ValueError as e:
        raise TraceFormatError(f"line {index}: bad req/ret/us") from e

    def opt(key: str) -> bytes | None:
        return _hex(kv[key], key, index) if key in kv else None

    call = TraceCall(index, pid, fd, path, req, ret, us, opt("in"), opt("out"), opt("pin"), opt("pout"))
    if call.kind == "nv":
        for blk in ("arg_in", "arg_out"):
            b = getattr(call, blk)
            if b is not None and len(b) != call.size:
                raise TraceFormatError(f"line {index}: {blk} is {len(b)} bytes, req says {call.size}")
    return call


def parse_lines(lines: Iterable[str]) -> list[TraceCall]:
    return [parse_line(ln, i) for i, ln in enumerate(ln for ln in lines if ln.strip())]


def read_trace(path: str | Path) -> list[TraceCall]:
    """Read a trace file (gzip or plain)."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="ascii") as f:  # type: ignore[operator]
        return parse_lines(f)


# ---- names -------------------------------------------------------------------

UVM_NAMES = {v: k for k, v in vars(abi).items() if k.startswith("UVM_") and isinstance(v, int)
             and k not in ("UVM_INIT_FLAGS_MASK", "UVM_MAX_GPUS", "UVM_GPU_MAPPING_ATTRIBUTES_SIZE")}


def escape_name(nr: int) -> str:
    return abi.ESCAPE_NAMES.get(nr, f"ESC_{nr:#x}")


def class_name(cls: int) -> str:
    return abi.CLASS_NAMES.get(cls, f"CLASS_{cls:#x}")


def control_name(cmd: int) -> str:
    return abi.CONTROL_NAMES.get(cmd, f"CTRL_{cmd:#010x}")


def status_name(status: int) -> str:
    return abi.STATUS_NAMES.get(status, f"{status:#x}")


def uvm_name(cmd: int) -> str:
    return UVM_NAMES.get(cmd, f"UVM_{cmd:#x}")


def call_name(call: TraceCall) -> str:
    """A readable name: the escape, plus the class of an alloc or the cmd of a control."""
    if call.kind == "uvm":
        return uvm_name(call.nr)
    base = escape_name(call.nr)
    if call.nr == abi.NV_ESC_RM_ALLOC and call.arg_in is not None:
        return f"{base}({class_name(decode_alloc(call.arg_in).h_class)})"
    if call.nr == abi.NV_ESC_RM_CONTROL and call.arg_in is not None:
        return f"{base}({control_name(decode_control(call.arg_in).cmd)})"
    return base


# ---- argument blocks ----------------------------------------------------------


@dataclass(frozen=True)
class RmAlloc:
    h_root: int
    h_parent: int
    h_new: int
    h_class: int
    p_alloc_parms: int
    p_rights: int
    params_size: int
    flags: int
    status: int


@dataclass(frozen=True)
class RmControl:
    h_client: int
    h_object: int
    cmd: int
    flags: int
    params: int
    params_size: int
    status: int


@dataclass(frozen=True)
class RmFree:
    h_root: int
    h_parent: int
    h_object: int
    status: int


def decode_alloc(block: bytes) -> RmAlloc:
    return RmAlloc(*abi.NVOS64.unpack(block))


def decode_control(block: bytes) -> RmControl:
    return RmControl(*abi.NVOS54.unpack(block))


def decode_free(block: bytes) -> RmFree:
    return RmFree(*abi.NVOS00.unpack(block))


# escape -> (layout, index of the RM status field in the unpacked tuple)
_STATUS_FIELD: dict[int, tuple[struct.Struct, int]] = {
    abi.NV_ESC_RM_FREE: (abi.NVOS00, 3),
    abi.NV_ESC_RM_ALLOC: (abi.NVOS64, 8),
    abi.NV_ESC_RM_CONTROL: (abi.NVOS54, 6),
    abi.NV_ESC_RM_DUP_OBJECT: (abi.NVOS55, 6),
    abi.NV_ESC_RM_MAP_MEMORY: (abi.NVOS33_WITH_FD, 6),
    abi.NV_ESC_RM_UNMAP_MEMORY: (abi.NVOS34, 4),
    abi.NV_ESC_RM_ALLOC_MEMORY: (abi.NVOS02_WITH_FD, 7),
    abi.NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO: (abi.NVOS56, 5),
    abi.NV_ESC_ALLOC_OS_EVENT: (abi.ALLOC_OS_EVENT, 3),
    abi.NV_ESC_FREE_OS_EVENT: (abi.FREE_OS_EVENT, 3),
}


def rm_status(nr: int, block: bytes | None) -> int | None:
    """The RM status (NV_STATUS) inside an escape's argument block, or None when the
    escape carries none (or the block is absent or has another size)."""
    spec = _STATUS_FIELD.get(nr)
    if spec is None or block is None or len(block) != spec[0].size:
        return None
    return int(spec[0].unpack(block)[spec[1]])


def call_status(call: TraceCall) -> int | None:
    """The RM status the driver returned for this call (from `out`), if it has one."""
    return None if call.kind == "uvm" else rm_status(call.nr, call.arg_out)


# ---- parameter blocks ----------------------------------------------------------

MEMORY_CLASSES = frozenset({abi.NV01_MEMORY_SYSTEM, abi.NV01_MEMORY_LOCAL_USER})


def memory_size(params: bytes) -> int:
    """`NvU64 size` of NV_MEMORY_ALLOCATION_PARAMS (class 0x3e / 0x40)."""
    off = abi.MEMORY_ALLOCATION_SIZE_OFFSET
    if len(params) < off + 8:
        raise ValueError("parameter block too short for NV_MEMORY_ALLOCATION_PARAMS")
    return int.from_bytes(params[off:off + 8], "little")


@dataclass(frozen=True)
class MemAlloc:
    """An RM_ALLOC of memory: requested size (pin) and the size RM granted (pout)."""

    index: int
    h_class: int
    h_new: int
    requested: int
    granted: int | None
    status: int
    ret: int


def memory_allocs(calls: Iterable[TraceCall]) -> Iterator[MemAlloc]:
    for c in calls:
        if c.kind != "nv" or c.nr != abi.NV_ESC_RM_ALLOC or c.arg_in is None or c.arg_out is None:
            continue
        a_in, a_out = decode_alloc(c.arg_in), decode_alloc(c.arg_out)
        if a_in.h_class not in MEMORY_CLASSES or c.pin is None:
            continue
        granted = memory_size(c.pout) if c.pout is not None else None
        yield MemAlloc(c.index, a_in.h_class, a_out.h_new, memory_size(c.pin), granted, a_out.status, c.ret)


def allocs_by_class(calls: Iterable[TraceCall]) -> dict[int, int]:
    """Count of RM_ALLOC calls per class (successful or not)."""
    out: dict[int, int] = {}
    for c in calls:
        if c.kind == "nv" and c.nr == abi.NV_ESC_RM_ALLOC and c.arg_in is not None:
            cls = decode_alloc(c.arg_in).h_class
            out[cls] = out.get(cls, 0) + 1
    return out


def controls_by_cmd(calls: Iterable[TraceCall]) -> dict[int, int]:
    out: dict[int, int] = {}
    for c in calls:
        if c.kind == "nv" and c.nr == abi.NV_ESC_RM_CONTROL and c.arg_in is not None:
            cmd = decode_control(c.arg_in).cmd
            out[cmd] = out.get(cmd, 0) + 1
    return out


def root_clients(calls: Iterable[TraceCall]) -> list[int]:
    """Client handles returned by root allocations (class 0x41 / 0x0 / 0x1), in order."""
    roots = {abi.NV01_ROOT, abi.NV01_ROOT_NON_PRIV, abi.NV01_ROOT_CLIENT}
    out: list[int] = []
    for c in calls:
        if c.kind == "nv" and c.nr == abi.NV_ESC_RM_ALLOC and c.arg_out is not None:
            a = decode_alloc(c.arg_out)
            if a.h_class in roots and a.status == abi.NV_OK:
                out.append(a.h_new)
    return out
