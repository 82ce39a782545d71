"""ctypes access to the decision core (kmod/core/*.c + tests/core/shim.c), a mock RM,
and a decoder/replayer for the recorded traces in tests/traces.

The core is compiled from the same sources the kernel module and the preload use.
"""

from __future__ import annotations

import ctypes
import gzip
import os
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
import sys  # noqa: E402

sys.path.insert(0, str(REPO / "pyctl"))
from gpuslice import abi  # noqa: E402
from gpuslice.netlink import LOCK_HIST_BUCKETS, MAX_GPUS  # noqa: E402

CORE_SRC = sorted((REPO / "kmod" / "core").glob("*.c"))
SHIM_SRC = REPO / "tests" / "core" / "shim.c"

GS_FILE_CTL, GS_FILE_GPU, GS_FILE_UVM = 0, 1, 2
GS_PASS, GS_REPLY, GS_FAIL = 0, 1, 2
(
    GS_REFUSE_NONE,
    GS_REFUSE_QUOTA,
    GS_REFUSE_FOREIGN,
    GS_REFUSE_GLOBAL,
    GS_REFUSE_CLASS,
    GS_REFUSE_ESCAPE,
    GS_REFUSE_MALFORMED,
    GS_REFUSE_UNLISTED,
    GS_REFUSE_LIMIT,
    GS_REFUSE_CAPS,
) = range(10)
GS_INST_ALLOW_TEST_ESCAPES = 1
# kmod/core/core.h GS_CAP_*: an instance's capability set
CAP_COMPUTE, CAP_UTILITY, CAP_GRAPHICS, CAP_VIDEO = 1, 2, 4, 8
CAPS_ALL = 15

# kmod/uapi/gpuslice.h
OBJ_CLIENT, OBJ_TSG, OBJ_CHANNEL, OBJ_MEMORY, OBJ_OTHER = range(5)
(
    EV_TSG_NEW,
    EV_TSG_DEL,
    EV_CHANNEL_NEW,
    EV_CHANNEL_DEL,
    EV_PROC_ATTACH,
    EV_PROC_DETACH,
    EV_ALLOC_REFUSED,
    EV_FILTER_REFUSED,
) = range(1, 9)

# the recorded H100 traces, in the repository
TRACES = REPO / "tests" / "traces"

MiB = 1 << 20
GiB = 1 << 30


def build(outdir: Path, cc: str | None = None, extra: list[str] | None = None) -> Path:
    cc = cc or os.environ.get("CC") or shutil.which("cc") or "gcc"
    so = outdir / "libgscore_test.so"
    cmd = [
        cc, "-std=gnu11", "-shared", "-fPIC", "-O1", "-g",
        "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror",
        f"-I{REPO / 'kmod' / 'core'}",
        *map(str, CORE_SRC), str(SHIM_SRC), "-o", str(so), "-lpthread",
        *(extra or []),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return so


@dataclass
class Result:
    verdict: int
    status: int
    err: int
    refusal: int


T_RUN_LOG = 16
DriverFn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint32)


class TRun(ctypes.Structure):
    """shim.c struct t_run: the test's glue for gs_call_run() and what it saw."""

    _fields_ = [
        ("driver", DriverFn),
        ("ret", ctypes.c_int32),
        ("unread", ctypes.c_int32),
        ("lost", ctypes.c_int32),
        ("nested", ctypes.c_int32),
        ("copy_ret", ctypes.c_int32),
        ("after_ret", ctypes.c_int64),
        ("copy_ret_seen", ctypes.c_int64),
        ("n", ctypes.c_int32),
        ("log", ctypes.c_char * (T_RUN_LOG + 1)),
        ("done", ctypes.c_int32),
        ("done_at", ctypes.c_int32),
    ]


@dataclass
class Run:
    """One call through gs_call_run(): its return, the glue's ops in the order they ran
    (D driver, A after, N nested_out, C copy_out, R answered) and the call's outcome."""

    ret: int
    log: str
    status: int
    err: int
    refusal: int
    after_ret: int
    copy_ret_seen: int
    done: int = 0  # times the done op ran (the module leaves the instance's gate there)
    done_at: int = 0  # how many of log's ops had run then

    @property
    def verdict(self) -> int:
        if "D" in self.log:
            return GS_PASS
        return GS_REPLY if self.ret == 0 else GS_FAIL


class Core:
    """One instance of the core, driven call by call."""

    def __init__(self, so: Path, limit: int):
        self.lib = lib = ctypes.CDLL(str(so))
        lib.t_new.restype = ctypes.c_void_p
        lib.t_new.argtypes = [ctypes.c_uint64]
        lib.t_free.argtypes = [ctypes.c_void_p]
        lib.t_set_limit.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        lib.t_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        lib.t_set_caps.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        lib.t_set_gpus.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        lib.t_set_gpu_limits.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.t_set_gpu_ids.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
        lib.t_gpu_mem.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.t_pre.restype = ctypes.c_void_p
        lib.t_pre.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p,
            ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int32),
        ]
        lib.t_post.restype = ctypes.c_uint32
        lib.t_post.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        lib.t_set_reply_lost.argtypes = [ctypes.c_void_p]
        lib.t_done.argtypes = [ctypes.c_void_p]
        lib.t_file_closed.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        lib.t_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.t_pids.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32), ctypes.c_int]
        lib.t_lock_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.t_lock_bucket.argtypes = [ctypes.c_uint64]
        lib.t_hold_lock.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.t_objects.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        lib.t_events.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        lib.t_set_bad.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
        lib.t_set_ns_pid.argtypes = [ctypes.c_uint32]
        lib.t_set_ns_pid(0)
        lib.t_set_reply_trusted.argtypes = [ctypes.c_uint8]
        lib.t_uvm_arg_size.restype = ctypes.c_uint32
        lib.t_uvm_arg_size.argtypes = [ctypes.c_uint32]
        lib.t_uvm_status_off.restype = ctypes.c_uint32
        lib.t_uvm_status_off.argtypes = [ctypes.c_uint32]
        lib.t_set_fd_file_id.argtypes = [ctypes.c_uint64, ctypes.c_uint8]
        lib.t_call_fd.restype = ctypes.c_int32
        lib.t_call_fd.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32]
        lib.t_run.restype = ctypes.c_int64
        lib.t_run.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p,
            ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32, ctypes.POINTER(TRun),
            ctypes.POINTER(ctypes.c_int32),
        ]
        lib.t_run_size.restype = ctypes.c_size_t
        assert lib.t_run_size() == ctypes.sizeof(TRun)
        for f in ("t_escape_name", "t_class_name", "t_refusal_name"):
            getattr(lib, f).restype = ctypes.c_char_p
        self.inst = lib.t_new(limit)
        self.events()  # drop what an earlier instance left

    def close(self):
        if self.inst:
            self.lib.t_free(self.inst)
            self.inst = None

    def set_limit(self, limit: int):
        self.lib.t_set_limit(self.inst, limit)

    def set_gpus(self, mask: int) -> None:
        """The instance's GPUs (RM device instances), as the module sets its GPU mask."""
        self.lib.t_set_gpus(self.inst, mask)

    def set_gpu_ids(self, ids: dict[int, int]) -> None:
        """RM gpuIds of the instance's GPUs (the module's, from CARD_INFO)."""
        arr = (ctypes.c_uint32 * MAX_GPUS)()
        for gpu, gid in ids.items():
            arr[gpu] = gid
        self.lib.t_set_gpu_ids(self.inst, arr)

    def set_gpu_limits(self, limits: dict[int, int] | None) -> None:
        """Per-GPU limits (uapi GPU_MEM_LIMIT); GPUs not named, or None: the instance's."""
        arr = (ctypes.c_uint64 * MAX_GPUS)()
        for gpu, lim in (limits or {}).items():
            arr[gpu] = lim
        self.lib.t_set_gpu_limits(self.inst, arr)

    def gpu_mem(self) -> list[dict]:
        """Per GPU: the limit in effect, used and peak."""
        n = MAX_GPUS
        out = (ctypes.c_uint64 * (3 * n))()
        self.lib.t_gpu_mem(self.inst, out)
        return [{"limit": out[i], "used": out[n + i], "peak": out[2 * n + i]} for i in range(n)]

    def set_flags(self, flags: int):
        self.lib.t_set_flags(self.inst, flags)

    def set_caps(self, caps: int):
        self.lib.t_set_caps(self.inst, caps)

    def call(self, req: int, arg: bytearray, driver=None, *, kind=GS_FILE_CTL, minor=0,
             file_id=1, pid=100, ret=0, arg_size=None, ns_pid=0, fd_file_id=0,
             fd_sibling=False, trusted=True) -> Result:
        """One call through gs_call_run(): gs_pre; if PASS, driver(arg) plays RM (mutates
        arg, returns ret), then gs_post.
        fd_file_id: what the glue resolved the fd a call names to (gs_call.fd_file_id);
        fd_sibling: the user-space glue found it another process's of the instance (and, for
        RM_DUP_OBJECT, hClientSrc: gs_call.src_sibling); trusted: the glue could read the
        driver's reply where the caller cannot write (gs_call.reply_trusted, nvidia-uvm)."""
        r = self.run(req, arg, driver, kind=kind, minor=minor, file_id=file_id, pid=pid, ret=ret,
                     arg_size=arg_size, ns_pid=ns_pid, fd_file_id=fd_file_id, fd_sibling=fd_sibling,
                     trusted=trusted)
        return Result(r.verdict, r.status, r.err, r.refusal)

    def run(self, req: int, arg: bytearray, driver=None, *, kind=GS_FILE_CTL, minor=0,
            file_id=1, pid=100, ret=0, arg_size=None, ns_pid=0, fd_file_id=0,
            fd_sibling=False, trusted=True, unread=False, lost=False, nested=None,
            copy_ret=0, decide=True) -> Run:
        """gs_call_run() with the test's glue (shim.c t_run): driver(arg) plays RM, or the
        driver returns ret; unread: the glue cannot read its reply back (lost: and sets
        gs_call.reply_lost); nested: None for no nested_out op, else what it returns;
        copy_ret: what copy_out returns; decide False: no instance (passthrough)."""
        self.lib.t_set_ns_pid(ns_pid)
        self.lib.t_set_reply_trusted(int(trusted))
        self.lib.t_set_fd_file_id(fd_file_id, int(fd_sibling))
        n = len(arg)
        buf = (ctypes.c_char * max(n, 1)).from_buffer(arg) if n else None
        out = (ctypes.c_int32 * 3)()
        size = n if arg_size is None else arg_size
        raised: list[BaseException] = []

        def drv(_p, _size):
            try:
                return driver(arg) or 0
            except BaseException as e:  # noqa: BLE001 (raised again below, not inside C)
                raised.append(e)
                return 0

        t = TRun()
        t.driver = DriverFn(drv) if driver is not None else DriverFn()
        t.ret = ret
        t.unread = int(unread)
        t.lost = int(lost)
        t.nested = 0 if nested is None else (1 if nested == 0 else nested)
        t.copy_ret = copy_ret
        rc = self.lib.t_run(self.inst if decide else None, kind, minor, req, buf, size, file_id, pid,
                            ctypes.byref(t), out)
        if raised:
            raise raised[0]
        return Run(rc, t.log.decode(), out[0] & 0xFFFFFFFF, out[1], out[2], t.after_ret,
                   t.copy_ret_seen, t.done, t.done_at)

    def call_fd(self, req: int, arg: bytearray) -> int | None:
        """The fd gs_call_fd() finds in a control block, or None."""
        buf = (ctypes.c_char * len(arg)).from_buffer(arg)
        fd = self.lib.t_call_fd(req, buf, len(arg))
        return None if fd == -1000 else fd

    def file_closed(self, file_id: int):
        self.lib.t_file_closed(self.inst, file_id)

    def stats(self) -> dict:
        out = (ctypes.c_uint64 * 8)()
        self.lib.t_stats(self.inst, out)
        keys = ("limit", "used", "peak", "ioctls", "refused_quota", "refused_filter", "objects", "max_chain")
        return dict(zip(keys, out))

    def lock_stats(self) -> dict:
        """The instance lock's figures (port.h struct gs_lock_stats), this read excluded."""
        nb = LOCK_HIST_BUCKETS
        out = (ctypes.c_uint64 * (6 + 2 * nb))()
        self.lib.t_lock_stats(self.inst, out)
        keys = ("acquired", "contended", "hold_ns", "wait_ns", "hold_max_ns", "wait_max_ns")
        d: dict = dict(zip(keys, out[:6]))
        d["hold_hist"] = list(out[6:6 + nb])
        d["wait_hist"] = list(out[6 + nb:])
        return d

    def lock_bucket(self, ns: int) -> int:
        return int(self.lib.t_lock_bucket(ns))

    def hold_lock(self, us: int) -> None:
        """Holds the instance lock for us microseconds (ctypes drops the GIL meanwhile)."""
        self.lib.t_hold_lock(self.inst, us)

    def holding(self) -> bool:
        return bool(ctypes.c_int.in_dll(self.lib, "t_holding").value)

    def pids(self) -> list[int]:
        out = (ctypes.c_uint32 * 256)()
        n = self.lib.t_pids(self.inst, out, 256)
        return sorted(out[: min(n, 256)])

    def objects(self) -> list[dict]:
        out = (ctypes.c_uint64 * (14 * 100000))()
        n = self.lib.t_objects(self.inst, out, 100000)
        keys = ("kind", "file_id", "pid", "gpu", "client", "handle", "parent", "klass", "engine", "size",
                "gateable", "userd_mem", "userd_off", "gp_entries")
        return [dict(zip(keys, out[14 * i: 14 * i + 14])) for i in range(n)]

    def events(self) -> list[dict]:
        out = (ctypes.c_uint64 * (12 * 4096))()
        n = self.lib.t_events(out, 4096)
        keys = ("type", "kind", "pid", "gpu", "client", "handle", "parent", "klass", "engine", "size",
                "status", "cmd")
        return [dict(zip(keys, out[12 * i: 12 * i + 12])) for i in range(n)]


def addr(buf) -> int:
    return ctypes.addressof(buf)


# ---- building argument blocks ----

def alloc_arg(h_root, h_parent, h_new, klass, params_addr=0) -> bytearray:
    return bytearray(abi.NVOS64.pack(h_root, h_parent, h_new, klass, params_addr, 0, 0, 0, 0))


def control_arg(h_client, h_object, cmd, params_addr=0, params_size=0) -> bytearray:
    return bytearray(abi.NVOS54.pack(h_client, h_object, cmd, 0, params_addr, params_size, 0))


def free_arg(h_root, h_parent, h_old) -> bytearray:
    return bytearray(abi.NVOS00.pack(h_root, h_parent, h_old, 0))


def dup_arg(h_client, h_parent, h_object, h_client_src, h_object_src) -> bytearray:
    return bytearray(abi.NVOS55.pack(h_client, h_parent, h_object, h_client_src, h_object_src, 0, 0))


def mem_params(size: int):
    b = ctypes.create_string_buffer(abi.MEMORY_ALLOCATION_PARAMS_SIZE)
    struct.pack_into("<Q", b, abi.MEMORY_ALLOCATION_SIZE_OFFSET, size)
    return b


def status_of(req: int, arg: bytes) -> int:
    off = {abi.NV_ESC_RM_ALLOC: 40, abi.NV_ESC_RM_CONTROL: 28, abi.NV_ESC_RM_FREE: 12,
           abi.NV_ESC_RM_DUP_OBJECT: 24}[abi.ioc_nr(req)]
    return struct.unpack_from("<I", arg, off)[0]


class MockRM:
    """Plays RM for synthetic calls: hands out client handles, answers OK, pads sizes."""

    def __init__(self, pad: int = 0, fb_kib: int = 80 * 1024 * 1024, fb_free_kib: int = 79 * 1024 * 1024):
        self.next_client = 0xC1D00001
        self.pad = pad
        self.fb_kib = fb_kib
        self.fb_free_kib = fb_free_kib
        self.fail_next = 0

    def alloc(self, arg: bytearray) -> int:
        h_root, h_parent, h_new, klass, p_params = struct.unpack_from("<IIIIQ", arg)
        if self.fail_next:
            struct.pack_into("<I", arg, 40, self.fail_next)
            self.fail_next = 0
            return 0
        if klass in (abi.NV01_ROOT, abi.NV01_ROOT_CLIENT, abi.NV01_ROOT_NON_PRIV) and h_new == 0:
            struct.pack_into("<I", arg, 8, self.next_client)
            self.next_client += 1
        if klass == abi.NV01_MEMORY_LOCAL_USER and self.pad:
            p = ctypes.c_uint64.from_address(p_params + abi.MEMORY_ALLOCATION_SIZE_OFFSET)
            p.value += self.pad
        struct.pack_into("<I", arg, 40, 0)
        return 0

    def ok(self, off: int):
        def drv(arg: bytearray) -> int:
            struct.pack_into("<I", arg, off, 0)
            return 0
        return drv

    def control(self, arg: bytearray) -> int:
        _, _, cmd, _, params, size, _ = abi.NVOS54.unpack_from(arg)
        if cmd == abi.NV2080_CTRL_CMD_FB_GET_INFO_V2:
            n = ctypes.c_uint32.from_address(params).value
            for i in range(n):
                idx = ctypes.c_uint32.from_address(params + 4 + 8 * i).value
                val = {abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE: self.fb_free_kib}.get(idx, self.fb_kib)
                ctypes.c_uint32.from_address(params + 8 + 8 * i).value = val
        struct.pack_into("<I", arg, 28, 0)
        return 0


# ---- traces ----

@dataclass
class TraceCall:
    line: int
    pid: int
    fd: int
    path: str
    req: int
    ret: int
    inb: bytes = b""
    outb: bytes = b""
    pin: bytes = b""
    pout: bytes = b""

    @property
    def nr(self) -> int:
        return abi.ioc_nr(self.req)

    @property
    def kind(self) -> int:
        if self.path.endswith("nvidiactl"):
            return GS_FILE_CTL
        if self.path.endswith("nvidia-uvm"):
            return GS_FILE_UVM
        return GS_FILE_GPU

    @property
    def minor(self) -> int:
        """The file's minor, as the glues pass it: 255 for nvidiactl, N for /dev/nvidiaN."""
        if self.kind == GS_FILE_CTL:
            return 255
        tail = self.path.rsplit("nvidia", 1)[-1]
        return int(tail) if tail.isdigit() else 0


def read_trace(name: str) -> list[TraceCall]:
    calls = []
    with gzip.open(TRACES / name, "rt") as f:
        for i, line in enumerate(f):
            p = line.split()
            kv = dict(x.split("=", 1) for x in p[3:])
            calls.append(TraceCall(
                i, int(p[0]), int(p[1]), p[2], int(kv["req"], 16), int(kv["ret"]),
                bytes.fromhex(kv.get("in", "")), bytes.fromhex(kv.get("out", "")),
                bytes.fromhex(kv.get("pin", "")), bytes.fromhex(kv.get("pout", "")),
            ))
    return calls


@dataclass
class Replayed:
    call: TraceCall
    result: Result
    params: bytes = b""  # the parameter block as the caller sees it after the call
    arg: bytes = b""


@dataclass
class Replayer:
    """Feeds recorded calls to the core; RM's recorded reply is written between pre and post."""

    core: Core
    keep: list = field(default_factory=list)

    def replay(self, tc: TraceCall) -> Replayed:
        arg = bytearray(tc.inb)
        pbuf = None
        if tc.pin and tc.nr in (abi.NV_ESC_RM_ALLOC, abi.NV_ESC_RM_CONTROL):
            pbuf = ctypes.create_string_buffer(tc.pin, max(len(tc.pin), 256))
            struct.pack_into("<Q", arg, 16, addr(pbuf))

        def driver(a: bytearray) -> int:
            if tc.outb:
                a[:] = tc.outb
                if pbuf is not None:
                    struct.pack_into("<Q", a, 16, addr(pbuf))
            if pbuf is not None and tc.pout:
                ctypes.memmove(pbuf, tc.pout, len(tc.pout))
            return tc.ret

        r = self.core.call(tc.req, arg, driver, kind=tc.kind, minor=tc.minor, file_id=tc.fd, pid=tc.pid)
        return Replayed(tc, r, bytes(pbuf.raw) if pbuf is not None else b"", bytes(arg))
