"""Replay a recorded NVIDIA ioctl trace (gpuslice.trace.records) against a driver: the
stand-in (tests/standin), the real one, or gpuslice instance nodes (--dev-prefix).

Each recorded RM call and init escape is re-issued in call order with its recorded
argument block (`in`) and parameter block (`pin`), after remapping what only made
sense in the recording process:

- handles: client handles returned by root allocations (and any handle the driver
  chose) are mapped recorded -> replayed in every later argument/parameter block;
- file descriptors: each recorded (pid, fd) gets one of our own open files; fds named
  inside argument blocks (REGISTER_FD, ALLOC_OS_EVENT, RM_MAP_MEMORY) are translated;
- pointers: pAllocParms / params point at our own buffers; RM_ALLOC_MEMORY's pMemory
  at our own anonymous mapping; UPDATE_DEVICE_MAPPING_INFO's old address is mapped
  from the address our RM_MAP_MEMORY returned.

A call matches when the ioctl succeeds/fails as recorded and the RM status inside
the argument block is the recorded one (zero or not). nvidia-uvm calls carry no
arguments in the traces, so they are listed as not replayable.

    python -m gpuslice.trace.replay TRACE [--dev-prefix /dev/] [--dry-run] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import json
import mmap
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from gpuslice import abi
from gpuslice.trace import records as t

IMPLEMENTED_PATH = Path("/proc/nvstub/implemented")
ROOT_CLASSES = frozenset({abi.NV01_ROOT, abi.NV01_ROOT_NON_PRIV, abi.NV01_ROOT_CLIENT})
# Memory mapped through a GPU node (BAR); other memory is mapped through nvidiactl
# (kernel-open/nvidia/nv-mmap.c: system memory mappings are made on the control node).
BAR_MEMORY_CLASSES = frozenset({abi.NV01_MEMORY_LOCAL_USER, abi.NV01_MEMORY_LOCAL_PHYSICAL,
                                abi.HOPPER_USERMODE_A})
PARAMS_BUFFER_MIN = 4096  # RM_ALLOC parameter blocks were recorded as a 256-byte window
CHANNEL_CLASSES = frozenset(v for k, v in vars(abi).items() if "_CHANNEL_GPFIFO_" in k and isinstance(v, int))

Category = Literal["match", "mismatch", "unimplemented", "dependent", "not_replayable", "planned"]


# ---- what the driver says it implements ------------------------------------------


@dataclass(frozen=True)
class Implemented:
    escapes: frozenset[int]
    classes: frozenset[int]
    controls: frozenset[int]
    uvm: frozenset[int]

    @staticmethod
    def parse(text: str) -> Implemented:
        """Parse /proc/nvstub/implemented: one "KIND 0xHEX" a line."""
        sets: dict[str, set[int]] = {"esc": set(), "class": set(), "ctrl": set(), "uvm": set()}
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            kind, _, value = line.strip().partition(" ")
            if kind not in sets:
                raise ValueError(f"implemented line {n}: unknown kind {kind!r}")
            sets[kind].add(int(value, 16))
        return Implemented(frozenset(sets["esc"]), frozenset(sets["class"]),
                           frozenset(sets["ctrl"]), frozenset(sets["uvm"]))

    def missing(self, call: t.TraceCall) -> str | None:
        """Why this call is not implemented (a short label), or None when it is."""
        if call.kind == "uvm":
            return None if call.nr in self.uvm else f"uvm {call.nr:#x}"
        if call.nr not in self.escapes:
            return f"esc {call.nr:#x}"
        assert call.arg_in is not None
        if call.nr == abi.NV_ESC_RM_ALLOC:
            cls = t.decode_alloc(call.arg_in).h_class
            if cls in ROOT_CLASSES:
                cls = abi.NV01_ROOT_CLIENT  # RM allocates every root class as 0x41
            return None if cls in self.classes else f"class {cls:#x}"
        if call.nr == abi.NV_ESC_RM_CONTROL:
            cmd = t.decode_control(call.arg_in).cmd
            return None if cmd in self.controls else f"ctrl {cmd:#x}"
        return None


# ---- pure block rewriting -------------------------------------------------------


def remap_words(block: bytes, mapping: dict[int, int]) -> bytes:
    """Replace every 4-byte-aligned little-endian word found in mapping."""
    if not mapping or not block:
        return block
    out = bytearray(block)
    for off in range(0, len(out) - 3, 4):
        w = int.from_bytes(out[off:off + 4], "little")
        if w in mapping:
            out[off:off + 4] = mapping[w].to_bytes(4, "little")
    return bytes(out)


def put_u64(block: bytes, off: int, value: int) -> bytes:
    return block[:off] + value.to_bytes(8, "little") + block[off + 8:]


def put_i32(block: bytes, off: int, value: int) -> bytes:
    return block[:off] + value.to_bytes(4, "little", signed=True) + block[off + 4:]


def get_i32(block: bytes, off: int) -> int:
    return int.from_bytes(block[off:off + 4], "little", signed=True)


def get_u64(block: bytes, off: int) -> int:
    return int.from_bytes(block[off:off + 8], "little")


# Field offsets inside argument blocks, from the abi layouts.
OFF_ALLOC_PARAMS = 16  # NVOS64.pAllocParms
OFF_CONTROL_PARAMS = 16  # NVOS54.params
OFF_MAP_FD = 48  # NVOS33_WITH_FD.fd
OFF_MAP_LINEAR = 32  # NVOS33.pLinearAddress
OFF_ALLOCMEM_PMEMORY = 24  # NVOS02.pMemory
OFF_ALLOCMEM_LIMIT = 32  # NVOS02.limit
OFF_ALLOCMEM_FD = 48  # NVOS02_WITH_FD.fd
OFF_OS_EVENT_FD = 8  # nv_ioctl_alloc_os_event.fd
OFF_UPDATE_OLD = 16  # NVOS56.pOldCpuAddress
OFF_REGISTER_FD = 0  # nv_ioctl_register_fd.ctl_fd
OFF_VERSION_REPLY = 4  # nv_ioctl_rm_api_version.reply


def outcome(call_nr: int, ret: int, block: bytes | None) -> tuple[bool, int | None, int | None]:
    """(ioctl succeeded, RM status, escape-specific reply) of one call."""
    extra: int | None = None
    if block is not None and ret == 0:
        if call_nr == abi.NV_ESC_CHECK_VERSION_STR and len(block) == abi.RM_API_VERSION.size:
            extra = int.from_bytes(block[OFF_VERSION_REPLY:OFF_VERSION_REPLY + 4], "little")
        elif call_nr == abi.NV_ESC_WAIT_OPEN_COMPLETE and len(block) == abi.WAIT_OPEN_COMPLETE.size:
            rc, adapter = abi.WAIT_OPEN_COMPLETE.unpack(block)
            extra = (rc & 0xFFFFFFFF) | (adapter << 32)
    return ret == 0, t.rm_status(call_nr, block) if ret == 0 else None, extra


# ---- the plan (pure) --------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    index: int
    name: str
    category: Category | None  # decided before running for UVM / unimplemented calls
    reason: str = ""


def plan(calls: Sequence[t.TraceCall], impl: Implemented | None) -> list[Step]:
    """Which calls are replayed, and which are known unimplemented / not replayable.
    Calls that act on an object created by an unimplemented allocation are 'dependent'."""
    steps: list[Step] = []
    tainted: set[int] = set()  # recorded handles made by unimplemented allocs
    for c in calls:
        if c.kind == "uvm":
            steps.append(Step(c.index, c.name, "not_replayable", "nvidia-uvm: no arguments recorded"))
            continue
        miss = impl.missing(c) if impl is not None else None
        if miss is not None:
            if c.nr == abi.NV_ESC_RM_ALLOC and c.arg_in is not None:
                tainted.add(t.decode_alloc(c.arg_in).h_new)
            steps.append(Step(c.index, c.name, "unimplemented", miss))
            continue
        dep = _target_handles(c) & tainted
        if dep:
            if c.nr == abi.NV_ESC_RM_ALLOC and c.arg_in is not None:
                tainted.add(t.decode_alloc(c.arg_in).h_new)
            steps.append(Step(c.index, c.name, "dependent",
                              "acts on " + ",".join(f"{h:#x}" for h in sorted(dep))))
            continue
        steps.append(Step(c.index, c.name, None))
    return steps


def _target_handles(c: t.TraceCall) -> set[int]:
    if c.arg_in is None:
        return set()
    if c.nr == abi.NV_ESC_RM_ALLOC:
        return {t.decode_alloc(c.arg_in).h_parent}
    if c.nr == abi.NV_ESC_RM_CONTROL:
        return {t.decode_control(c.arg_in).h_object}
    if c.nr == abi.NV_ESC_RM_FREE:
        return {t.decode_free(c.arg_in).h_object}
    if c.nr in (abi.NV_ESC_RM_MAP_MEMORY, abi.NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO, abi.NV_ESC_RM_UNMAP_MEMORY):
        return {int.from_bytes(c.arg_in[4:8], "little"), int.from_bytes(c.arg_in[8:12], "little")}
    return set()


# ---- results ------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    index: int
    name: str
    category: Category
    expected: str = ""
    got: str = ""
    reason: str = ""


@dataclass
class Report:
    trace: str
    results: list[Result] = field(default_factory=list)

    def by(self, cat: Category) -> list[Result]:
        return [r for r in self.results if r.category == cat]

    def summary(self) -> dict[str, int]:
        cats: tuple[Category, ...] = ("match", "mismatch", "unimplemented", "dependent", "not_replayable",
                                      "planned")
        return {c: len(self.by(c)) for c in cats if c != "planned" or self.by(c)}

    def unimplemented_names(self) -> dict[str, int]:
        """Unimplemented calls grouped by what is missing ('class 0x..', 'ctrl 0x..')."""
        out: dict[str, int] = {}
        for r in self.by("unimplemented"):
            # "ctrl 0x20801303 RM_CONTROL(NV2080_...)", or just "ctrl 0x2080012f" when unnamed
            key = r.reason if "(CTRL_0x" in r.name or "(CLASS_0x" in r.name else f"{r.reason} {r.name}"
            out[key] = out.get(key, 0) + 1
        return out

    def to_json(self) -> dict[str, object]:
        return {"trace": self.trace, "summary": self.summary(),
                "unimplemented": self.unimplemented_names(),
                "results": [asdict(r) for r in self.results]}


def fmt_outcome(o: tuple[bool, int | None, int | None]) -> str:
    ok, st, extra = o
    s = "ok" if ok else "ioctl-error"
    if st is not None:
        s += f" status={st:#x}({t.status_name(st)})"
    if extra is not None:
        s += f" reply={extra:#x}"
    return s


# ---- the executor -------------------------------------------------------------------


class Replayer:
    """Issues the calls. State: our files, handle and address maps, live buffers."""

    def __init__(self, dev_prefix: str = "/dev/") -> None:
        self.prefix = dev_prefix if dev_prefix.endswith("/") else dev_prefix + "/"
        self.files: dict[tuple[int, int], int] = {}  # (pid, recorded fd) -> our fd
        self.all_fds: list[int] = []
        self.handles: dict[int, int] = {}  # recorded -> replayed, where they differ
        self.mem_class: dict[int, int] = {}  # recorded memory handle -> class
        self.linear: dict[int, int] = {}  # recorded pLinearAddress -> replayed
        self.keep: list[object] = []  # buffers the driver may still point at
        self.last_gpu: dict[int, str] = {}  # pid -> last /dev/nvidiaN path seen
        self.channels: list[int] = []  # recorded channel handles, in allocation order

    # -- files
    def node(self, recorded_path: str) -> str:
        return self.prefix + os.path.basename(recorded_path)

    def open_fresh(self, pid: int, fd: int, recorded_path: str) -> int:
        ours = os.open(self.node(recorded_path), os.O_RDWR | os.O_CLOEXEC)
        self.all_fds.append(ours)  # closed at the end: closing early may free clients
        self.files[(pid, fd)] = ours
        return ours

    def file_for(self, c: t.TraceCall) -> int:
        # REGISTER_FD is the first call on a newly opened GPU file: the recorded fd
        # number may have been closed and reused since we last saw it.
        if c.nr == abi.NV_ESC_REGISTER_FD or (c.pid, c.fd) not in self.files:
            return self.open_fresh(c.pid, c.fd, c.path)
        return self.files[(c.pid, c.fd)]

    def ours(self, pid: int, fd: int) -> int:
        if fd < 0:
            return fd
        return self.files.get((pid, fd), fd)

    def close(self) -> None:
        for fd in reversed(self.all_fds):
            try:
                os.close(fd)
            except OSError:
                pass
        self.all_fds.clear()
        self.files.clear()

    # -- buffers
    def buffer(self, data: bytes, size: int) -> int:
        buf = ctypes.create_string_buffer(max(size, len(data), 1))
        ctypes.memmove(buf, data, len(data))
        self.keep.append(buf)
        return ctypes.addressof(buf)

    # -- one call
    def run_call(self, c: t.TraceCall) -> tuple[tuple[bool, int | None, int | None], str]:
        """Issue one recorded nv call; returns (outcome, note)."""
        assert c.arg_in is not None
        # Handles first (whole block, aligned words), then pointers and fds by field.
        block = remap_words(c.arg_in, self.handles)
        note = ""
        fd = self.file_for(c)

        if c.nr == abi.NV_ESC_RM_ALLOC:
            a = t.decode_alloc(c.arg_in)
            if a.p_alloc_parms:
                pin = remap_words(c.pin or b"", self.handles)
                addr = self.buffer(pin, PARAMS_BUFFER_MIN)
                block = put_u64(block, OFF_ALLOC_PARAMS, addr)
            if a.h_class in t.MEMORY_CLASSES or a.h_class in BAR_MEMORY_CLASSES:
                self.mem_class[a.h_new] = a.h_class
            if a.h_class in CHANNEL_CLASSES:
                self.channels.append(a.h_new)
        elif c.nr == abi.NV_ESC_RM_CONTROL:
            ctl = t.decode_control(c.arg_in)
            if ctl.params:
                pin = remap_words(c.pin or b"", self.handles)
                if len(pin) < ctl.params_size:
                    note = f"params truncated in trace ({len(pin)} of {ctl.params_size} bytes), zero-padded"
                if ctl.cmd == abi.NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST:
                    pin, note = self.channellist_params(pin)
                addr = self.buffer(pin, ctl.params_size)
                block = put_u64(block, OFF_CONTROL_PARAMS, addr)
        elif c.nr == abi.NV_ESC_REGISTER_FD:
            block = put_i32(block, OFF_REGISTER_FD, self.ours(c.pid, get_i32(c.arg_in, OFF_REGISTER_FD)))
        elif c.nr in (abi.NV_ESC_ALLOC_OS_EVENT, abi.NV_ESC_FREE_OS_EVENT):
            block = put_i32(block, OFF_OS_EVENT_FD, self.ours(c.pid, get_i32(c.arg_in, OFF_OS_EVENT_FD)))
        elif c.nr == abi.NV_ESC_RM_MAP_MEMORY:
            # The target fd is a file the process opened just for this mapping (and
            # closed after mmap): a GPU node for BAR memory, nvidiactl otherwise.
            h_mem = int.from_bytes(c.arg_in[8:12], "little")
            cls = self.mem_class.get(h_mem)
            tfd = get_i32(c.arg_in, OFF_MAP_FD)
            gpu = self.last_gpu.get(c.pid, "/dev/nvidia0")
            path = gpu if cls in BAR_MEMORY_CLASSES else "/dev/nvidiactl"
            block = put_i32(block, OFF_MAP_FD, self.open_fresh(c.pid, tfd, path))
        elif c.nr == abi.NV_ESC_RM_ALLOC_MEMORY:
            limit = get_u64(c.arg_in, OFF_ALLOCMEM_LIMIT)
            if get_u64(c.arg_in, OFF_ALLOCMEM_PMEMORY) and limit < (1 << 32):
                m = mmap.mmap(-1, (limit + 1 + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE)
                self.keep.append(m)
                addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
                block = put_u64(block, OFF_ALLOCMEM_PMEMORY, addr)
            block = put_i32(block, OFF_ALLOCMEM_FD, self.ours(c.pid, get_i32(c.arg_in, OFF_ALLOCMEM_FD)))
            h_new = int.from_bytes(c.arg_in[8:12], "little")
            self.mem_class[h_new] = int.from_bytes(c.arg_in[12:16], "little")
        elif c.nr == abi.NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO:
            old = get_u64(c.arg_in, OFF_UPDATE_OLD)
            block = put_u64(block, OFF_UPDATE_OLD, self.linear.get(old, old))

        if c.path.startswith("/dev/nvidia") and c.path[len("/dev/nvidia"):].isdigit():
            self.last_gpu[c.pid] = c.path

        buf = bytearray(block)
        try:
            fcntl.ioctl(fd, c.req, buf, True)
            ret = 0
        except OSError as e:
            ret = -(e.errno or errno.EIO)
        got = outcome(c.nr, ret, bytes(buf))
        self.learn(c, bytes(buf), ret)
        return got, note

    def channellist_params(self, pin: bytes) -> tuple[bytes, str]:
        """NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST points at a list of channel handles (in)
        and a list of channel ids (out), neither recorded. CUDA asks right after
        allocating each channel, so the list is rebuilt from the channels allocated last."""
        if len(pin) < abi.FIFO_GET_CHANNELLIST.size:
            return pin, ""
        n, p_handles, p_ids = abi.FIFO_GET_CHANNELLIST.unpack(pin[:abi.FIFO_GET_CHANNELLIST.size])
        if not (0 < n <= len(self.channels)) or not p_handles or not p_ids:
            return pin, ""
        recorded = self.channels[-n:]
        handles = b"".join(self.handles.get(h, h).to_bytes(4, "little") for h in recorded)
        head = abi.FIFO_GET_CHANNELLIST.pack(n, self.buffer(handles, len(handles)), self.buffer(b"", 4 * n))
        note = "handle list inferred: " + ",".join(f"{h:#x}" for h in recorded)
        return head + pin[abi.FIFO_GET_CHANNELLIST.size:], note

    def learn(self, c: t.TraceCall, out: bytes, ret: int) -> None:
        """Record handles and addresses the driver chose, to translate later calls."""
        if ret != 0 or c.arg_out is None:
            return
        if c.nr == abi.NV_ESC_RM_ALLOC:
            rec, got = t.decode_alloc(c.arg_out), t.decode_alloc(out)
            if rec.status == abi.NV_OK and got.status == abi.NV_OK and rec.h_new != got.h_new:
                self.handles[rec.h_new] = got.h_new
        elif c.nr == abi.NV_ESC_RM_MAP_MEMORY:
            rec_lin, got_lin = get_u64(c.arg_out, OFF_MAP_LINEAR), get_u64(out, OFF_MAP_LINEAR)
            if rec_lin:
                self.linear[rec_lin] = got_lin


def replay(calls: Sequence[t.TraceCall], impl: Implemented | None, dev_prefix: str = "/dev/",
           trace_name: str = "", dry_run: bool = False) -> Report:
    """Replay calls in order; with dry_run only plan. Unimplemented calls are still
    issued (later calls may depend on what they do), but are not judged. A call that
    fails differently from the trace on an object whose allocation already failed in
    the replay is 'dependent', so that mismatches name root causes."""
    report = Report(trace_name)
    steps = plan(calls, impl)
    r = None if dry_run else Replayer(dev_prefix)
    broken: dict[int, int] = {}  # recorded handle -> index of the alloc that failed in replay
    try:
        for c, s in zip(calls, steps):
            if c.kind == "uvm":
                report.results.append(Result(c.index, s.name, "not_replayable", reason=s.reason))
                continue
            expected = outcome(c.nr, 0 if c.ret == 0 else -1, c.arg_out)
            exp_s = fmt_outcome(expected)
            if r is None:
                report.results.append(Result(c.index, s.name, s.category or "planned", exp_s, "", s.reason))
                continue
            got, note = r.run_call(c)
            if s.category is not None:
                report.results.append(Result(c.index, s.name, s.category, exp_s, fmt_outcome(got), s.reason))
                continue
            dep = _target_handles(c) & set(broken)
            cat: Category = "match" if got == expected else "mismatch"
            if cat == "mismatch" and dep:
                # only the first failure is reported as a mismatch, not its consequences
                cat = "dependent"
                note = "acts on " + ", ".join(f"{h:#x} (failed at [{broken[h]}])" for h in sorted(dep))
            if cat != "match" and c.nr == abi.NV_ESC_RM_ALLOC and c.arg_in is not None and expected[1] == abi.NV_OK:
                broken.setdefault(t.decode_alloc(c.arg_in).h_new, c.index)
            report.results.append(Result(c.index, s.name, cat, exp_s, fmt_outcome(got), note))
    finally:
        if r is not None:
            r.close()
    return report


def read_implemented(path: Path = IMPLEMENTED_PATH) -> Implemented | None:
    try:
        return Implemented.parse(path.read_text())
    except FileNotFoundError:
        return None


def format_report(rep: Report, verbose: bool = False) -> str:
    lines = [f"trace {rep.trace}: " + " ".join(f"{k}={v}" for k, v in rep.summary().items())]
    for r in rep.results:
        if r.category == "mismatch" or (verbose and r.category != "not_replayable"):
            lines.append(f"  [{r.index}] {r.category} {r.name}: expected {r.expected}, got {r.got}"
                         + (f" ({r.reason})" if r.reason else ""))
    unimpl = rep.unimplemented_names()
    if unimpl:
        lines.append("  unimplemented:")
        lines += [f"    {n}x {k}" for k, n in sorted(unimpl.items())]
    dep = rep.by("dependent")
    if dep:
        lines.append(f"  dependent on unimplemented objects: {len(dep)} calls: "
                     + ", ".join(sorted({d.name for d in dep})))
    nr = rep.by("not_replayable")
    if nr:
        lines.append(f"  not replayable (nvidia-uvm): {len(nr)} calls: " + ", ".join(sorted({d.name for d in nr})))
    return "\n".join(lines)


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpuslice-replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--dev-prefix", default="/dev/", help="where the device nodes are (default /dev/)")
    ap.add_argument("--implemented", type=Path, default=IMPLEMENTED_PATH,
                    help="list of implemented escapes/classes/controls (default /proc/nvstub/implemented)")
    ap.add_argument("--dry-run", action="store_true", help="decode and plan only; issue nothing")
    ap.add_argument("--json", action="store_true", help="print the full report as JSON")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(list(argv) if argv is not None else None)
    calls = t.read_trace(args.trace)
    impl = read_implemented(args.implemented)
    rep = replay(calls, impl, args.dev_prefix, args.trace.name, args.dry_run)
    if args.json:
        json.dump(rep.to_json(), sys.stdout, indent=1)
        print()
    else:
        print(format_report(rep, args.verbose))
    return 1 if rep.by("mismatch") else 0


if __name__ == "__main__":
    sys.exit(main())
