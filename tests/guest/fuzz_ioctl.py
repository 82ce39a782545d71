"""ioctl fuzzer for gpuslice's fake nodes (issue 11), for the QEMU guest.

One run (`run(FuzzConfig)`) creates two instances: A, which is fuzzed, and B, the
victim, with one process that holds a TSG, a channel and video memory and keeps
using them. Worker processes in A run several threads each; every thread has its own
RM session through A's nodes (/dev/gpuslice/<A>/{nvidiactl,nvidia0,nvidia-uvm}) and
an arena of pages (read-write, a PROT_NONE guard right after them, a read-only page,
an unmapped hole), and issues ioctls drawn from these categories:

  valid    well-formed calls (video memory, TSG/channel, dup, controls, UVM init)
  trace    argument and parameter blocks of the recorded H100 traces
           (tests/traces) with the handles replaced by the thread's, mutated
  random   random request words (direction, type, number, size) and bytes
  size     a valid block with a wrong size in the request word
  pointer  the argument block or the nested parameter pointer unmapped, PROT_NONE,
           read-only, straddling the end of the mapping, kernel or non-canonical
  foreign  B's client and object handles, and B's export file (a shareable handle),
           from A (oracle: never NV_OK)
  uvm      nvidia-uvm commands with random and mutated blocks and fds, and valid
           external mappings of the thread's video memory (registration, range,
           UVM_MAP_EXTERNAL_ALLOCATION), the memory sometimes freed while mapped
  mmap     mmap/read/poll on the nodes, mmap after RM_MAP_MEMORY
  fork     fork with inherited fds: parent and child both call, the child is
           sometimes SIGKILLed mid-call, or execs while its threads are in the driver

Two modes:
  accounting  no thread closes or protects another's fds or pages (REGISTER_FD may
              name another thread's nvidiactl). Every `sample_calls` calls the
              parent parks every thread between two calls (its fork children are
              stopped and reaped first), pauses B's victim, and compares the
              stand-in's pool (/proc/nvstub/pool, bytes; B's share from
              /proc/nvstub/clients) with what the instances are charged:
                one-sided: the stand-in's bytes for A <= A.used (a call the core
                  cannot prove harmless keeps a charge until the client goes:
                  refused NV_MEMORY_FABRIC / NV_SEMAPHORE_SURFACE /
                  NV_MEMORY_MAPPER, dups, UVM external mappings, REGISTER_FD
                  naming another session's nvidiactl, allocations whose nested
                  parameters RM cannot read or write back);
                exact: then each thread whose session made such a call closes
                  it, and the stand-in's bytes for A must equal A.used;
                exact: the stand-in's bytes for B equal B.used and what its
                  process holds.
              A.used <= A's limit is checked every 0.5 s without pausing. After
              the run: the same samples, then A.used = 0 and the pool holds only
              B.used once A's processes are gone, then nothing.
  chaos       also a closer thread (close / dup2 over other threads' fds mid-call) and
              a protector thread (mprotect other threads' blocks to read-only or
              PROT_NONE mid-call); REGISTER_FD and mappings unrestricted. Only the end
              state is checked: used 0 and the pool back where it was once the
              processes are gone (issue 10 items 1-3 make the mid-run numbers differ).

Every run checks: no call hangs (a call in flight for `hang_s` is a hang: the kernel
stacks of the process are printed), no call naming B's client returns NV_OK, B's
process saw only the answers it expected and its objects are still there, its
channel is not disabled, and the counts above. The seed and the number of calls per
category and per escape are in the report.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import json
import multiprocessing as mp
import os
import random
import select
import signal
import struct
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from pathlib import Path

from gpuslice import abi
from gpuslice.trace import records as tr

import nvstub

PAGE = 4096
MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "tests" / "traces"

# ---- libc ----------------------------------------------------------------------------

libc = ctypes.CDLL(None, use_errno=True)
_ioctl = libc.ioctl
_ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_ioctl.restype = ctypes.c_int
_mmap = libc.mmap
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_mmap.restype = ctypes.c_void_p
_munmap = libc.munmap
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_mprotect = libc.mprotect
_mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PROT_NONE, PROT_READ, PROT_WRITE = 0, 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_ANON, MAP_32BIT = 0x01, 0x02, 0x20, 0x40
MAP_FAILED = ctypes.c_void_p(-1).value

NVC36F_GET_WORK_SUBMIT_TOKEN = 0xC36F0108
KERNEL_PTR = 0xFFFF888000000000
NONCANON_PTR = 0x8000000000000000


def _compat_ioctl_fn():
    """ioctl through the 32-bit system call entry (int $0x80) of a 64-bit process:
    in_compat_syscall() is true, so the kernel takes the files' compat_ioctl path."""
    code = bytes([
        0x53,                          # push rbx
        0x89, 0xFB,                    # mov ebx, edi   (fd)
        0x89, 0xF1,                    # mov ecx, esi   (request)
        # edx: the argument, already in place
        0xB8, 0x36, 0x00, 0x00, 0x00,  # mov eax, 54    (__NR_ioctl on i386)
        0xCD, 0x80,                    # int 0x80
        0x5B,                          # pop rbx
        0xC3,                          # ret
    ])
    page = mmap_anon(1, PROT_READ | PROT_WRITE)
    ctypes.memmove(page, code, len(code))
    _mprotect(page, PAGE, PROT_READ | 4)  # PROT_EXEC
    return ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_uint, ctypes.c_uint)(page)


_compat = None


def compat_ioctl(fd: int, req: int, ptr: int) -> int:
    """0.. or -errno, like raw_ioctl; ptr must be below 4 GiB."""
    global _compat
    if _compat is None:
        _compat = _compat_ioctl_fn()
    return _compat(fd, req & 0xFFFFFFFF, ptr & 0xFFFFFFFF)


def raw_ioctl(fd: int, req: int, ptr: int) -> int:
    """ioctl(fd, req, ptr) with a raw pointer; 0.. or -errno."""
    r = _ioctl(fd, req & 0xFFFFFFFF, ptr or None)
    return -ctypes.get_errno() if r < 0 else r


_syscall = libc.syscall
_syscall.restype = ctypes.c_long
SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 434, 438  # x86-64


def pidfd_getfd(pid: int, fd: int) -> int:
    """A duplicate of process pid's file fd in this process (pidfd_getfd(2)), or -errno."""
    pfd = _syscall(ctypes.c_long(SYS_PIDFD_OPEN), ctypes.c_long(pid), ctypes.c_long(0))
    if pfd < 0:
        return -ctypes.get_errno()
    try:
        r = _syscall(ctypes.c_long(SYS_PIDFD_GETFD), ctypes.c_long(pfd), ctypes.c_long(fd), ctypes.c_long(0))
        return r if r >= 0 else -ctypes.get_errno()
    finally:
        os.close(pfd)


def mmap_anon(npages: int, prot: int = PROT_READ | PROT_WRITE, flags: int = 0) -> int:
    a = _mmap(None, npages * PAGE, prot, MAP_PRIVATE | MAP_ANON | flags, -1, 0)
    if a in (None, MAP_FAILED):
        raise OSError(ctypes.get_errno(), "mmap")
    return a


def iowr(nr: int, size: int) -> int:
    return abi.ioc(abi.IOC_READ | abi.IOC_WRITE, abi.NV_IOCTL_MAGIC, nr, size)


# ---- shared counters -------------------------------------------------------------------

CATS = ("valid", "trace", "random", "size", "pointer", "foreign", "uvm", "mmap", "fork", "compat", "fdtable")
CAT = {c: i for i, c in enumerate(CATS)}
# slots of one row (one thread; two extra rows per process: chaos threads, fork children)
S_UVM = 256          # 256 + (cmd & 0x7f); INITIALIZE/DEINITIALIZE at 256+126/127
S_OTHER_TYPE = 384   # requests whose type is not 'F' on nvidiactl / nvidia0
S_CAT = 400          # calls per category
S_CAT_OK = 416       # ... of which ioctl 0 and, where there is one, status NV_OK
S_VIOL = 440         # foreign handle calls that returned NV_OK
S_HEART = 441
S_SLOW = 442         # calls that took longer than slow_s
S_MAXMS = 443
S_FORKS = 444
S_PYERR = 445        # Python exceptions in an op (bugs of the fuzzer, or EBADF chaos)
S_CURCAT = 446
S_CURREQ = 447
S_CURT0 = 448        # monotonic ms at which the call in flight began, 0 if none
S_SESS = 449
S_MMAPS = 450
S_CLOSES = 451
S_DUP2S = 452
S_PROTECTS = 453
S_KILLS = 454
S_EXECS = 455
S_PROCREADS = 456    # /proc/<pid>/task/<tid>/fd entries the proc reader resolved
S_PROCREAL = 457     # ... that resolved to a real NVIDIA device file (issue 11 item 3's window)
S_TSSETS = 458       # INSTANCE_SET timeslice_us on A by the parent (lazy SET_TIMESLICE in each file)
S_ERRNO = 460        # 460 + errno (< 140)
S_ASYM = 600         # the thread's session made a call after which the charge may exceed the pool
S_PARKED = 601       # the thread is parked for a sample: 1, 2 once its one-sided session is closed
S_ASYMCALLS = 602    # calls that set S_ASYM (for the report)
S_CTLFD = 603        # the fd number of the thread's nvidiactl (for other processes' REGISTER_FD)
S_PID = 604          # in a process's first row: its pid
S_REGOTHER = 605     # REGISTER_FD naming another process's nvidiactl (pidfd_getfd) or B's
NSLOT = 608


def now_ms() -> int:
    return int(time.monotonic() * 1000)


# ---- corpus from the traces ----------------------------------------------------------


@dataclass
class Corpus:
    controls: list = field(default_factory=list)  # (cmd, params bytes, params_size)
    allocs: list = field(default_factory=list)  # (class, params bytes)
    others: list = field(default_factory=list)  # (req, arg_in) of the other escapes
    memblock: int = 0  # SYS_PARAMS value as traced (never mutated: host-wide, issue 11 item 6)


def load_corpus(tdir: Path = TRACES) -> Corpus:
    c = Corpus()
    for f in sorted(glob.glob(str(tdir / "*.log.gz"))):
        for call in tr.read_trace(f):
            if call.kind != "nv" or call.arg_in is None:
                continue
            if call.nr == abi.NV_ESC_RM_CONTROL:
                d = tr.decode_control(call.arg_in)
                c.controls.append((d.cmd, call.pin or b"", d.params_size))
            elif call.nr == abi.NV_ESC_RM_ALLOC:
                d = tr.decode_alloc(call.arg_in)
                c.allocs.append((d.h_class, call.pin or b""))
            else:
                if call.nr == abi.NV_ESC_SYS_PARAMS:
                    c.memblock = struct.unpack("<Q", call.arg_in)[0]
                c.others.append((call.req, call.arg_in))
    return c


# ---- per-thread memory -----------------------------------------------------------------


class Arena:
    """pages 0-3 read-write, 4 PROT_NONE (guard), 5 read-only, 6 unmapped.

    Python touches the pages only under `lock`, which the chaos protector holds while
    it has a page protected (a write to it would kill the worker)."""

    RW_PAGES = 4

    def __init__(self) -> None:
        self.base = mmap_anon(7, flags=MAP_32BIT)  # below 4 GiB: usable by 32-bit (compat) calls too
        _mprotect(self.base + 4 * PAGE, PAGE, PROT_NONE)
        _mprotect(self.base + 5 * PAGE, PAGE, PROT_READ)
        _munmap(self.base + 6 * PAGE, PAGE)
        self.lock = threading.Lock()
        self.arg = self.base               # argument blocks (up to 16 KiB: pages 0-3)
        self.sub = self.base + PAGE        # buffers that parameters point to
        self.params = self.base + 2 * PAGE  # nested parameter blocks (up to 8 KiB)
        self.end = self.base + 4 * PAGE    # first byte after the read-write pages
        self.ro = self.base + 5 * PAGE
        self.hole = self.base + 6 * PAGE

    def write(self, addr: int, data: bytes) -> None:
        with self.lock:
            ctypes.memmove(addr, data, len(data))

    def read(self, addr: int, n: int) -> bytes:
        with self.lock:
            return ctypes.string_at(addr, n)

    def write_ro(self, off: int, data: bytes) -> int:
        """Puts data on the read-only page at off; returns its address."""
        data = data[: PAGE - off]
        with self.lock:
            _mprotect(self.ro, PAGE, PROT_READ | PROT_WRITE)
            ctypes.memmove(self.ro + off, data, len(data))
            _mprotect(self.ro, PAGE, PROT_READ)
        return self.ro + off

    def bad_ptr(self, rng: random.Random, size: int) -> tuple[str, int]:
        """A pointer for a block of `size` bytes that the kernel cannot fully use."""
        kind = rng.choice(("null", "hole", "guard", "straddle", "kernel", "noncanon", "low", "ro"))
        if kind == "null":
            return kind, 0
        if kind == "hole":
            return kind, self.hole + rng.randrange(0, PAGE - 8)
        if kind == "guard":
            return kind, self.end + rng.randrange(0, 64)
        if kind == "straddle":
            return kind, self.end - max(1, rng.randrange(1, max(2, size)))
        if kind == "kernel":
            return kind, KERNEL_PTR + rng.randrange(0, 1 << 20) * 8
        if kind == "noncanon":
            return kind, NONCANON_PTR | rng.getrandbits(40)
        if kind == "low":
            return kind, rng.randrange(1, 0x10000)
        return kind, self.ro + rng.randrange(0, 64)

    def close(self) -> None:
        _munmap(self.base, 6 * PAGE)


# ---- mutation ---------------------------------------------------------------------------

INTERESTING32 = (0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)


def mutate(rng: random.Random, data: bytes, handles: list[int], n: int | None = None) -> bytes:
    b = bytearray(data)
    if not b:
        return bytes(b)
    for _ in range(n if n is not None else rng.choice((1, 1, 2, 3, 8))):
        op = rng.randrange(6)
        i = rng.randrange(len(b))
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.randrange(256)
        elif op in (2, 3) and len(b) >= 4:
            j = rng.randrange(0, len(b) - 3) & ~3
            v = rng.choice(handles) if op == 3 and handles else rng.choice(INTERESTING32)
            struct.pack_into("<I", b, j, v & 0xFFFFFFFF)
        elif op == 4 and len(b) >= 8:
            j = rng.randrange(0, len(b) - 7) & ~7
            struct.pack_into("<Q", b, j, rng.choice((0, 1 << 63, (1 << 64) - 1, 1 << 40, rng.getrandbits(64))))
        else:
            j = rng.randrange(len(b))
            b[j:j + 8] = bytes(rng.randrange(256) for _ in range(min(8, len(b) - j)))
    return bytes(b)


# ---- configuration / report --------------------------------------------------------------


@dataclass
class FuzzConfig:
    seed: int
    seconds: float
    mode: str = "accounting"   # or "chaos"
    procs: int = 2
    threads: int = 3
    limit_a: int = 64 * MIB
    limit_b: int = 32 * MIB
    hang_s: float = 60.0       # a call in flight this long is a hang
    slow_s: float = 5.0
    races: bool = False        # chaos: also rewrite other threads' blocks mid-call
    sample_calls: int = 2000   # accounting: compare the pools every this many calls (0: at the end only)
    log: object = print

    def weights(self) -> dict[str, int]:
        w = {"valid": 20, "trace": 25, "random": 15, "size": 8, "pointer": 12, "foreign": 10,
             "uvm": 8, "mmap": 3, "fork": 1, "compat": 6, "fdtable": 2}
        return w


# ---- one fuzzing thread -----------------------------------------------------------------


class Registry:
    """The fds that fuzz threads opened, for the chaos closer. fd -> owner."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fds: dict[int, int] = {}

    def add(self, fd: int, owner: int) -> None:
        with self.lock:
            self.fds[fd] = owner

    def close_own(self, fd: int, owner: int) -> None:
        with self.lock:
            if self.fds.get(fd) == owner:
                del self.fds[fd]
                try:
                    os.close(fd)
                except OSError:
                    pass


@dataclass
class Session:
    ctl: int
    dev: int
    uvm: int
    client: int
    device: int
    subdevice: int
    objs: dict = field(default_factory=dict)  # handle -> class (tracked loosely)
    mems: list = field(default_factory=list)
    tsgs: list = field(default_factory=list)
    chans: list = field(default_factory=list)
    maps: list = field(default_factory=list)  # (addr, length)
    uvm_ready: bool = False
    uvm_registered: bool = False
    uvm_ranges: list = field(default_factory=list)  # (base, length) of external ranges made


class Fuzzer:
    def __init__(self, ctx: "ProcCtx", tid: int, row: int, rng: random.Random) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.tid = tid
        self.row = row * NSLOT
        self.sess_row = self.row  # the row whose S_ASYM speaks for this thread's session (kept in fork children)
        self.st = ctx.stats
        self.rng = rng
        self.arena = Arena()
        self.sess: Session | None = None
        self.next_h = 0x5D000000 + (ctx.proc_idx << 20) + (tid << 16)
        self.bad_streak = 0
        self.children: list[int] = []
        self.in_child = False
        self.compat = False
        # touches of device mappings go through the kernel (a pipe), never through a
        # Python store: a racing dup2 can leave a mapping without pages (SIGBUS)
        self.pipe_r, self.pipe_w = os.pipe()
        os.set_blocking(self.pipe_r, False)
        cats = list(self.cfg.weights().items())
        self.cat_names = [c for c, _ in cats]
        self.cat_w = [w for _, w in cats]

    # -- bookkeeping
    def handle(self) -> int:
        self.next_h += 1
        return self.next_h

    def bump(self, slot: int, n: int = 1) -> None:
        self.st[self.row + slot] += n

    def call(self, cat: str, fd: int, req: int, ptr: int, uvm: bool = False) -> int:
        r = self.row
        if self.compat:
            cat = "compat"
        self.st[r + S_CURCAT] = CAT[cat]
        self.st[r + S_CURREQ] = req & 0xFFFFFFFF
        t0 = now_ms()
        if not self.in_child:  # a SIGKILLed child would leave its mark: children are reaped with a timeout
            self.st[r + S_CURT0] = t0
        ret = compat_ioctl(fd, req, ptr) if self.compat else raw_ioctl(fd, req, ptr)
        dt = now_ms() - t0
        self.st[r + S_CURT0] = 0
        self.st[r + S_HEART] += 1
        if uvm:
            key = S_UVM + (126 if req == abi.UVM_INITIALIZE else 127 if req == abi.UVM_DEINITIALIZE else req & 0x7F)
        elif (req >> 8) & 0xFF == abi.NV_IOCTL_MAGIC:
            key = req & 0xFF
        else:
            key = S_OTHER_TYPE
        self.st[r + key] += 1
        self.st[r + S_CAT + CAT[cat]] += 1
        if ret < 0 and -ret < 140:
            self.st[r + S_ERRNO - ret] += 1
        if dt > self.st[r + S_MAXMS]:
            self.st[r + S_MAXMS] = dt
        if dt > self.cfg.slow_s * 1000:
            self.st[r + S_SLOW] += 1
        return ret

    def ok(self, cat: str) -> None:
        self.st[self.row + S_CAT_OK + CAT["compat" if self.compat else cat]] += 1

    MEMORY_HOLDING = frozenset({abi.NV01_MEMORY_LOCAL_USER, abi.NV_MEMORY_FABRIC, abi.NV_SEMAPHORE_SURFACE,
                                abi.NV_MEMORY_MAPPER})

    def _dup_source(self, src: int) -> None:
        """A dup of src: one-sided when src holds memory (or is not one we know)."""
        s = self.sess
        if s is None or s.objs.get(src, abi.NV01_MEMORY_LOCAL_USER) in self.MEMORY_HOLDING:
            self.one_sided()

    def one_sided(self) -> None:
        """The session made a call after which the core may charge more than the stand-in
        holds until the client goes (a refused holder, a dup, a UVM mapping, REGISTER_FD
        naming another session's nvidiactl, nested allocation parameters RM cannot use):
        the accounting's exact sample closes it first."""
        self.st[self.sess_row + S_ASYM] = 1
        self.st[self.row + S_ASYMCALLS] += 1

    # -- session
    def open_session(self) -> None:
        ctx = self.ctx
        ctl = os.open(ctx.paths["ctl"], os.O_RDWR | os.O_CLOEXEC)
        ctx.reg.add(ctl, self.tid)
        dev = os.open(ctx.paths["dev"], os.O_RDWR | os.O_CLOEXEC)
        ctx.reg.add(dev, self.tid)
        uvm = os.open(ctx.paths["uvm"], os.O_RDWR | os.O_CLOEXEC)
        ctx.reg.add(uvm, self.tid)
        s = Session(ctl, dev, uvm, 0, 0, 0)
        self.sess = s
        self.bump(S_SESS)
        if nvstub.register_fd(dev, ctl) != 0:
            raise OSError(errno.EINVAL, "REGISTER_FD")
        st, s.client = nvstub.rm_alloc(ctl, 0, 0, 0, abi.NV01_ROOT_CLIENT)
        if st:
            raise OSError(errno.EIO, f"client {st:#x}")
        s.device, s.subdevice = self.handle(), self.handle()
        dp = ctypes.create_string_buffer(abi.DEVICE_ALLOC_PARAMS.pack(0, 0, 0, 0, 0, 0, 0, 0, 0),
                                         abi.DEVICE_ALLOC_PARAMS.size)
        if nvstub.rm_alloc(ctl, s.client, s.client, s.device, abi.NV01_DEVICE_0, dp)[0]:
            raise OSError(errno.EIO, "device")
        sp = ctypes.create_string_buffer(abi.SUBDEVICE_ALLOC_PARAMS.pack(0), abi.SUBDEVICE_ALLOC_PARAMS.size)
        if nvstub.rm_alloc(ctl, s.client, s.device, s.subdevice, abi.NV20_SUBDEVICE_0, sp)[0]:
            raise OSError(errno.EIO, "subdevice")
        s.objs = {s.client: abi.NV01_ROOT_CLIENT, s.device: abi.NV01_DEVICE_0,
                  s.subdevice: abi.NV20_SUBDEVICE_0}
        if not self.in_child:
            self.st[self.row + S_CTLFD] = ctl

    def close_session(self) -> None:
        s, self.sess = self.sess, None
        if s is None:
            return
        for addr, length in s.maps:
            _munmap(addr, length)
        for fd in (s.dev, s.uvm, s.ctl):
            self.ctx.reg.close_own(fd, self.tid)
        if not self.in_child:
            self.st[self.sess_row + S_ASYM] = 0

    def ensure_session(self) -> Session:
        if self.sess is None or self.bad_streak > 6:
            self.close_session()
            self.bad_streak = 0
            try:
                self.open_session()
            except OSError:
                self.close_session()
                raise
        assert self.sess is not None
        return self.sess

    def note(self, ret: int, status: int | None) -> None:
        """A valid call on the session failed in a way that says the session is gone."""
        if ret in (-errno.EBADF, -errno.ENOTTY, -errno.ENODEV) or status in (
                abi.NV_ERR_INVALID_CLIENT, abi.NV_ERR_INVALID_OBJECT_PARENT):
            self.bad_streak += 1
        elif ret == 0:
            self.bad_streak = 0

    def my_handles(self) -> list[int]:
        s = self.sess
        return list(s.objs) if s else []

    # -- block helpers
    def rm_call(self, cat: str, fd: int, nr: int, block: bytes, size: int | None = None,
                arg: int | None = None) -> tuple[int, bytes | None]:
        """Writes block at the arena's argument slot (or uses arg), issues nr with size."""
        size = len(block) if size is None else size
        a = self.arena
        if nr == abi.NV_ESC_RM_DUP_OBJECT and cat != "foreign" and len(block) >= 20:
            self._dup_source(struct.unpack_from("<I", block, 16)[0])
        if arg is None:
            a.write(a.arg, block)
            arg = a.arg
        ret = self.call(cat, fd, iowr(nr, size), arg)
        out = a.read(a.arg, len(block)) if arg == a.arg else None
        return ret, out

    def params_at(self, data: bytes) -> int:
        a = self.arena
        data = data[: 2 * PAGE]
        a.write(a.params, data)
        return a.params

    def control(self, cat: str, client: int, obj: int, cmd: int, params: bytes, size: int | None = None,
                pptr: int | None = None) -> tuple[int, int]:
        p = self.params_at(params) if pptr is None else pptr
        blk = abi.NVOS54.pack(client, obj, cmd, 0, p, len(params) if size is None else size, 0)
        ret, out = self.rm_call(cat, self.sess.ctl, abi.NV_ESC_RM_CONTROL, blk)
        return ret, abi.NVOS54.unpack(out)[6] if ret == 0 and out else -1

    def alloc(self, cat: str, root: int, parent: int, new: int, cls: int, params: bytes | None,
              pptr: int | None = None) -> tuple[int, int, int]:
        """Returns (ret, status, hNew)."""
        if pptr is None:
            pptr = self.params_at(params) if params else 0
        if cls in self.HOLDERS and cat != "foreign":
            self.one_sided()
        blk = abi.NVOS64.pack(root, parent, new, cls, pptr, 0, 0, 0, 0)
        ret, out = self.rm_call(cat, self.sess.ctl, abi.NV_ESC_RM_ALLOC, blk)
        if ret == 0 and out:
            f = abi.NVOS64.unpack(out)
            return ret, f[8], f[2]
        return ret, -1, 0

    def free(self, cat: str, root: int, parent: int, obj: int) -> tuple[int, int]:
        ret, out = self.rm_call(cat, self.sess.ctl, abi.NV_ESC_RM_FREE, abi.NVOS00.pack(root, parent, obj, 0))
        return ret, abi.NVOS00.unpack(out)[3] if ret == 0 and out else -1

    def forget(self, h: int) -> None:
        s = self.sess
        if h == s.client:
            s.objs.clear()
            s.mems.clear()
            s.tsgs.clear()
            s.chans.clear()
            self.bad_streak = 99  # rebuild: the client is gone
            return
        s.objs.pop(h, None)
        for lst in (s.mems, s.tsgs, s.chans):
            if h in lst:
                lst.remove(h)

    def track(self, cls: int, h: int) -> None:
        s = self.sess
        s.objs[h] = cls
        if cls == abi.NV01_MEMORY_LOCAL_USER:
            s.mems.append(h)
        elif cls == abi.KEPLER_CHANNEL_GROUP_A:
            s.tsgs.append(h)
        elif cls == abi.HOPPER_CHANNEL_GPFIFO_A:
            s.chans.append(h)

    # -- categories
    def op_valid(self) -> None:
        s = self.ensure_session()
        rng = self.rng
        k = rng.randrange(10)
        if k <= 2:
            size = rng.choice((4096, MIB, 2 * MIB, 3 * MIB, 8 * MIB, 16 * MIB, self.cfg.limit_a, self.cfg.limit_a + 1))
            h = self.handle()
            ret, st, _ = self.alloc("valid", s.client, rng.choice((s.device, s.device, s.subdevice)), h,
                                    abi.NV01_MEMORY_LOCAL_USER, bytes(nvstub.mem_params(size)))
            self.note(ret, st)
            if ret == 0 and st == abi.NV_OK:
                self.track(abi.NV01_MEMORY_LOCAL_USER, h)
                self.ok("valid")
        elif k <= 4 and len(s.objs) > 3:
            h = rng.choice(s.mems) if s.mems and rng.random() < 0.7 else rng.choice(list(s.objs))
            if h == s.client and rng.random() < 0.8:
                return
            ret, st = self.free("valid", s.client, s.device, h)
            self.note(ret, st)
            if ret == 0 and st == abi.NV_OK:
                self.forget(h)
                self.ok("valid")
        elif k == 5:
            st, info = self._fb_info(s)
            if st == abi.NV_OK:
                self.ok("valid")
        elif k == 6 and len(s.tsgs) < 3:
            tsg, ch, gr = self.handle(), self.handle(), self.handle()
            for cls, parent, h in ((abi.KEPLER_CHANNEL_GROUP_A, s.device, tsg),
                                   (abi.HOPPER_CHANNEL_GPFIFO_A, tsg, ch),
                                   (abi.HOPPER_COMPUTE_A, ch, gr)):
                ret, st, _ = self.alloc("valid", s.client, parent, h, cls, None)
                self.note(ret, st)
                if ret or st:
                    return
                self.track(cls, h)
            self.ok("valid")
            self.control("valid", s.client, tsg, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
                         abi.GPFIFO_SCHEDULE.pack(1, 0, 0) + b"\0")
        elif k == 7:
            # a dup: of memory (RM shares the memdesc: the pages stay until the last handle
            # goes) or of another object
            cands = [h for h, c in s.objs.items() if c not in (abi.NV01_DEVICE_0, abi.NV01_ROOT_CLIENT,
                                                             abi.KEPLER_CHANNEL_GROUP_A,
                                                             abi.HOPPER_CHANNEL_GPFIFO_A)
                     and (c != abi.NV01_MEMORY_LOCAL_USER or rng.random() < 0.1)]
            if not cands:
                h = self.handle()
                ret, st, _ = self.alloc("valid", s.client, s.device, h, abi.FERMI_VASPACE_A, None)
                if ret == 0 and st == 0:
                    self.track(abi.FERMI_VASPACE_A, h)
                return
            src, new = rng.choice(cands), self.handle()
            ret, out = self.rm_call("valid", s.ctl, abi.NV_ESC_RM_DUP_OBJECT,
                                    abi.NVOS55.pack(s.client, s.device, new, s.client, src, 0, 0))
            if ret == 0 and out and abi.NVOS55.unpack(out)[6] == 0:
                self.track(s.objs.get(src, 0), new)
                self.ok("valid")
        elif k == 8 and s.chans:
            self.control("valid", s.client, rng.choice(s.chans), NVC36F_GET_WORK_SUBMIT_TOKEN, bytes(4))
        elif k == 9 and rng.random() < 0.15:
            self._register_other(s)
        else:
            self._uvm_init(s)

    def _register_other(self, s: Session) -> None:
        """REGISTER_FD on our nvidia0 naming another process's nvidiactl: another worker's,
        taken with pidfd_getfd(2), or B's export file (opened by the parent). Our file then
        keeps that file alive in RM."""
        rng, cfg = self.rng, self.cfg
        others = [p for p in range(cfg.procs) if p != self.ctx.proc_idx]
        tmp = -1
        if others and rng.random() < 0.7:
            p = rng.choice(others)
            first = p * (cfg.threads + 2)
            pid = self.st[first * NSLOT + S_PID]
            ofd = self.st[(first + rng.randrange(cfg.threads)) * NSLOT + S_CTLFD]
            if not pid or not ofd:
                return
            tmp = pidfd_getfd(pid, ofd)
            if tmp < 0:
                return
            fd = tmp
        else:
            fd = self.ctx.foreign["export_fd"]
        try:
            self.one_sided()
            self.bump(S_REGOTHER)
            a = self.arena
            a.write(a.arg, abi.REGISTER_FD.pack(fd))
            if self.call("valid", s.dev, abi.IOCTL_REGISTER_FD, a.arg) == 0:
                self.ok("valid")
        finally:
            if tmp >= 0:
                os.close(tmp)  # the registration holds its own reference

    def _fb_info(self, s: Session) -> tuple[int, dict]:
        p = bytearray(abi.FB_GET_INFO_V2_SIZE)
        idx = [abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE, abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE]
        struct.pack_into("<I", p, 0, len(idx))
        for i, x in enumerate(idx):
            abi.FB_INFO.pack_into(p, 4 + 8 * i, x, 0)
        ret, st = self.control("valid", s.client, s.subdevice, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, bytes(p))
        self.note(ret, st)
        return st, {}

    def _uvm_init(self, s: Session) -> None:
        if s.uvm_ready:
            return
        a = self.arena
        a.write(a.arg, struct.pack("<QI4x", 0, 0))
        ret = self.call("valid", s.uvm, abi.UVM_INITIALIZE, a.arg, uvm=True)
        if ret == 0:
            s.uvm_ready = True
            self.ok("valid")

    def _hobj_for_cmd(self, cmd: int) -> int:
        s = self.sess
        cls = cmd >> 16
        rng = self.rng
        if cls == 0x0000:
            return s.client
        if cls == 0x0080:
            return s.device
        if cls in (0x2080, 0x2081):
            return s.subdevice
        if cls == 0xA06C and s.tsgs:
            return rng.choice(s.tsgs)
        if cls in (0xC36F, 0x906F, 0xC86F) and s.chans:
            return rng.choice(s.chans)
        return rng.choice(list(s.objs)) if s.objs else s.client

    def _parent_for_class(self, cls: int) -> int:
        s = self.sess
        rng = self.rng
        if cls in (abi.NV01_DEVICE_0, abi.NV_CONFIDENTIAL_COMPUTE, abi.AMPERE_SMC_CONFIG_SESSION,
                   abi.AMPERE_SMC_MONITOR_SESSION, abi.NV01_ROOT, abi.NV01_ROOT_CLIENT, abi.NV01_ROOT_NON_PRIV):
            return s.client
        if cls in (abi.HOPPER_CHANNEL_GPFIFO_A, abi.FERMI_CONTEXT_SHARE_A) and s.tsgs:
            return rng.choice(s.tsgs)
        if cls in (abi.HOPPER_COMPUTE_A, abi.HOPPER_DMA_COPY_A) and s.chans:
            return rng.choice(s.chans)
        if cls in (abi.NV2081_BINAPI, abi.NV50_THIRD_PARTY_P2P, abi.HOPPER_USERMODE_A, abi.RM_USER_SHARED_DATA,
                   abi.GF100_SUBDEVICE_MASTER, abi.GF100_SUBDEVICE_INFOROM):
            return s.subdevice
        return s.device

    def op_trace(self) -> None:
        s = self.ensure_session()
        rng = self.rng
        corp = self.ctx.corpus
        k = rng.random()
        mut = rng.random() < 0.6
        hs = self.my_handles()
        if k < 0.55 and corp.controls:
            cmd, pin, psize = rng.choice(corp.controls)
            params = pin[:psize] if psize <= len(pin) else pin + bytes(psize - len(pin))
            if mut:
                params = mutate(rng, params, hs) if params else params
                if rng.random() < 0.2:
                    psize = rng.choice((0, max(0, psize - 4), psize + 4, rng.randrange(0, 9000)))
            hobj = self._hobj_for_cmd(cmd)
            if mut and rng.random() < 0.1:
                cmd = rng.choice((cmd ^ (1 << rng.randrange(16)), cmd + 1, rng.getrandbits(32)))
            ret, st = self.control("trace", s.client, hobj, cmd, params, size=psize)
            self.note(ret, st)
            if ret == 0 and st == 0:
                self.ok("trace")
        elif k < 0.85 and corp.allocs:
            cls, pin = rng.choice(corp.allocs)
            params = pin[:256]
            if mut:
                params = mutate(rng, params, hs)
                if rng.random() < 0.1:
                    cls = rng.choice((cls ^ (1 << rng.randrange(16)), rng.choice(self.random_classes())))
            if cls == abi.NV01_MEMORY_LOCAL_USER and len(params) >= 72 and rng.random() < 0.7:
                # mostly sizes that can pass the quota (the traces allocate up to 1 GiB)
                b = bytearray(params)
                struct.pack_into("<Q", b, 64, rng.choice((4096, MIB, 2 * MIB, 6 * MIB, 3 * MIB + 1)))
                params = bytes(b)
            h = self.handle()
            ret, st, hnew = self.alloc("trace", s.client, self._parent_for_class(cls), h, cls, params)
            self.note(ret, st)
            if ret == 0 and st == 0:
                self.ok("trace")
                if cls in (abi.NV01_ROOT, abi.NV01_ROOT_CLIENT, abi.NV01_ROOT_NON_PRIV):
                    pass  # an extra client on this file: freed with it
                else:
                    self.track(cls, hnew or h)
        else:
            req, blk = rng.choice(corp.others)
            nr = req & 0xFF
            blk = self._fix_block(nr, bytearray(blk))
            if mut and nr != abi.NV_ESC_SYS_PARAMS:
                blk = mutate(rng, blk, hs)
                blk = self._fix_block(nr, bytearray(blk), after_mutation=True)
            fd = s.dev if nr in (abi.NV_ESC_REGISTER_FD, abi.NV_ESC_RM_ALLOC_MEMORY, abi.NV_ESC_NUMA_INFO) \
                and rng.random() < 0.8 else s.ctl
            ret, out = self.rm_call("trace", fd, nr, bytes(blk))
            if ret == 0:
                self.ok("trace")

    # Objects that keep the caller's memory alive in RM hold its charge even when their
    # allocation is answered with a failure (the reply can be forged: kmod/core/core.c
    # gs_post_holder()), so a refused one leaves the instance charged above what the
    # stand-in holds until the client goes: never too little. A session that tried one is
    # one-sided (Fuzzer.one_sided()) until it is closed.
    HOLDERS = frozenset({abi.NV_MEMORY_FABRIC, abi.NV_SEMAPHORE_SURFACE, abi.NV_MEMORY_MAPPER})

    def random_classes(self) -> list[int]:
        return list(abi.CLASS_NAMES)

    def _fix_block(self, nr: int, b: bytearray, after_mutation: bool = False) -> bytes:
        """Handles and fds of a recorded block replaced by the thread's own."""
        s = self.sess
        chaos = self.cfg.mode == "chaos"
        if nr == abi.NV_ESC_SYS_PARAMS:
            return abi.SYS_PARAMS.pack(self.ctx.corpus.memblock)
        if nr == abi.NV_ESC_REGISTER_FD:
            if not after_mutation:
                # this session's nvidiactl, or another thread's (its file then lives as long as ours)
                fds = list(self.ctx.reg.fds) if chaos else [
                    f for f, o in list(self.ctx.reg.fds.items()) if o != self.tid]
                if not chaos and self.rng.random() < 0.85:
                    fds = [s.ctl]
                struct.pack_into("<i", b, 0, self.rng.choice(fds or [s.ctl]))
            if len(b) >= 4 and struct.unpack_from("<i", b, 0)[0] != s.ctl:
                self.one_sided()
            return bytes(b)
        if after_mutation:
            return bytes(b)
        if len(b) >= 4 and nr in (abi.NV_ESC_RM_FREE, abi.NV_ESC_RM_MAP_MEMORY, abi.NV_ESC_RM_ALLOC_MEMORY,
                                  abi.NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO, abi.NV_ESC_ALLOC_OS_EVENT,
                                  abi.NV_ESC_FREE_OS_EVENT, abi.NV_ESC_RM_UNMAP_MEMORY):
            struct.pack_into("<I", b, 0, s.client)
            if len(b) >= 8:
                struct.pack_into("<I", b, 4, s.device)
        if nr == abi.NV_ESC_RM_MAP_MEMORY and len(b) == abi.NVOS33_WITH_FD.size:
            f = list(abi.NVOS33_WITH_FD.unpack(b))
            f[2] = self.rng.choice(self.sess.mems) if self.sess.mems else f[2]
            f[8] = self.rng.choice((s.dev, s.ctl))
            return abi.NVOS33_WITH_FD.pack(*f)
        if nr == abi.NV_ESC_RM_ALLOC_MEMORY and len(b) == abi.NVOS02_WITH_FD.size:
            f = list(abi.NVOS02_WITH_FD.unpack(b))
            f[2] = self.handle()
            f[5] = self.arena.sub  # pMemory: our own page
            f[6] = min(f[6], PAGE - 1)
            f[8] = s.dev
            return abi.NVOS02_WITH_FD.pack(*f)
        if nr in (abi.NV_ESC_ALLOC_OS_EVENT, abi.NV_ESC_FREE_OS_EVENT) and len(b) >= 12:
            struct.pack_into("<I", b, 8, s.ctl)
        return bytes(b)

    def op_random(self) -> None:
        s = self.ensure_session()
        rng = self.rng
        typ = abi.NV_IOCTL_MAGIC if rng.random() < 0.85 else rng.randrange(256)
        nr = rng.choice((rng.randrange(256), rng.randrange(0x27, 0x60), rng.randrange(200, 220)))
        size = rng.choice((0, 1, 4, 8, 16, 24, 32, 40, 48, 56, 72, 560, 2304, rng.randrange(0, 0x4000)))
        direction = rng.randrange(4)
        fd = rng.choice((s.ctl, s.ctl, s.dev, s.uvm))
        if typ == abi.NV_IOCTL_MAGIC and nr == abi.NV_ESC_SYS_PARAMS:
            nr = abi.NV_ESC_STATUS_CODE
        a = self.arena
        n = min(size, 4 * PAGE)
        data = bytearray(rng.randbytes(n))
        if typ == abi.NV_IOCTL_MAGIC and nr == abi.NV_ESC_REGISTER_FD and n >= 4 and rng.random() < 0.5:
            struct.pack_into("<i", data, 0, rng.choice(list(self.ctx.reg.fds) or [s.ctl]))
        if n >= 8 and rng.random() < 0.5:
            # handles where handles go: most RM blocks start with the client
            struct.pack_into("<II", data, 0, s.client, rng.choice(self.my_handles() or [0]))
        if typ == abi.NV_IOCTL_MAGIC and nr == abi.NV_ESC_REGISTER_FD and n >= 4 and \
                struct.unpack_from("<i", data, 0)[0] in self.ctx.reg.fds and struct.unpack_from("<i", data, 0)[0] != s.ctl:
            self.one_sided()  # another thread's nvidiactl
        if typ == abi.NV_IOCTL_MAGIC and nr == abi.NV_ESC_RM_DUP_OBJECT and n >= 20 and \
                s.objs.get(struct.unpack_from("<I", data, 16)[0]) in self.MEMORY_HOLDING:
            self.one_sided()  # a dup of our memory (random source handles name nothing)
        if rng.random() < 0.15:
            kind, ptr = a.bad_ptr(rng, max(size, 1))
        else:
            a.write(a.arg, bytes(data))
            ptr = a.arg
        req = abi.ioc(direction, typ, nr, size)
        ret = self.call("random", fd, req, ptr, uvm=(fd == s.uvm))
        if ret == 0:
            self.ok("random")

    def _valid_block(self) -> tuple[int, bytes]:
        """A well-formed block of a decoded escape (for the size and pointer categories)."""
        s = self.sess
        rng = self.rng
        k = rng.randrange(6)
        if k == 0:
            return abi.NV_ESC_RM_ALLOC, abi.NVOS64.pack(s.client, s.device, self.handle(), abi.NV01_MEMORY_LOCAL_USER,
                                                        self.params_at(bytes(nvstub.mem_params(2 * MIB))), 0, 0, 0, 0)
        if k == 1:
            p = bytearray(abi.FB_GET_INFO_V2_SIZE)
            struct.pack_into("<III", p, 0, 1, abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE, 0)
            return abi.NV_ESC_RM_CONTROL, abi.NVOS54.pack(s.client, s.subdevice, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2,
                                                          0, self.params_at(bytes(p)), len(p), 0)
        if k == 2:
            return abi.NV_ESC_RM_FREE, abi.NVOS00.pack(s.client, s.device, rng.choice(s.mems or [0x5F000000]), 0)
        if k == 3:
            src = rng.choice(list(s.objs))
            self._dup_source(src)
            return abi.NV_ESC_RM_DUP_OBJECT, abi.NVOS55.pack(s.client, s.device, self.handle(), s.client,
                                                             src, 0, 0)
        if k == 4:
            return abi.NV_ESC_RM_MAP_MEMORY, abi.NVOS33_WITH_FD.pack(s.client, s.device,
                                                                   rng.choice(s.mems or [0x5F000000]), 0, 2 * MIB,
                                                                   0, 0, 0, s.dev)
        return abi.NV_ESC_CHECK_VERSION_STR, abi.RM_API_VERSION.pack(abi.NV_RM_API_VERSION_CMD_QUERY, 0, b"")

    def op_size(self) -> None:
        s = self.ensure_session()
        rng = self.rng
        nr, blk = self._valid_block()
        n = len(blk)
        size = rng.choice((0, 1, 4, n - 1, n - 4, n + 1, n + 8, 2 * n, 0x3FFF, rng.randrange(0, 0x4000)))
        size = max(0, min(size, 0x3FFF))
        a = self.arena
        if size > 4 * PAGE - 64 or rng.random() < 0.3:
            # the block at the end of the mapping: the tail of the request runs into the guard
            ptr = a.end - n
            a.write(ptr, blk)
        else:
            a.write(a.arg, blk + bytes(max(0, size - n)))
            ptr = a.arg
        ret = self.call("size", s.ctl, iowr(nr, size), ptr)
        if ret == 0:
            self.ok("size")

    def op_pointer(self) -> None:
        s = self.ensure_session()
        rng = self.rng
        a = self.arena
        if rng.random() < 0.4:
            # the argument block itself
            nr, blk = self._valid_block()
            kind, ptr = a.bad_ptr(rng, len(blk))
            if nr == abi.NV_ESC_RM_ALLOC and kind == "ro":
                self.one_sided()  # RM allocates and cannot write the block back
            if kind == "ro":
                ptr = a.write_ro(ptr - a.ro, blk)
            elif kind == "straddle":
                ptr = a.end - rng.randrange(1, len(blk))
                a.write(ptr, blk[: a.end - ptr])
            ret = self.call("pointer", s.ctl, iowr(nr, len(blk)), ptr)
            if ret == 0:
                self.ok("pointer")
            return
        # the nested parameter block (RM_ALLOC pAllocParms / RM_CONTROL params) or a pointer in it
        k = rng.randrange(4)
        if k == 0:
            params = bytes(nvstub.mem_params(rng.choice((4096, 2 * MIB))))
            cls, h = abi.NV01_MEMORY_LOCAL_USER, self.handle()
            kind, ptr = a.bad_ptr(rng, len(params))
            # read-only parameters: RM allocates and cannot write them back (NV_ERR_INVALID_ADDRESS
            # with the object alive, charged by the core: test_repro_ro_alloc_params_escape_quota)
            if kind == "ro":
                self.one_sided()
            if kind == "ro":
                ptr = a.write_ro(ptr - a.ro, params)
            elif kind == "straddle":
                a.write(ptr, params[: a.end - ptr])
            ret, st, _ = self.alloc("pointer", s.client, s.device, h, cls, None, pptr=ptr)
            if ret == 0 and st == 0:
                self.track(cls, h)
                self.ok("pointer")
        elif k == 1:
            p = bytearray(abi.FB_GET_INFO_V2_SIZE)
            struct.pack_into("<III", p, 0, rng.choice((1, 2, 0x80, 0x81, 0xFFFFFFFF)),
                             abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE, 0)
            kind, ptr = a.bad_ptr(rng, len(p))
            if kind == "ro":
                ptr = a.write_ro(ptr - a.ro, bytes(p))
            elif kind == "straddle":
                a.write(ptr, bytes(p[: a.end - ptr]))
            ret, st = self.control("pointer", s.client, s.subdevice, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2,
                                   bytes(p), pptr=ptr)
        elif k == 2:
            # FIFO_GET_CHANNELLIST: two user pointers inside the parameters
            n = rng.choice((1, 2, 64, 0x10000, 0xFFFFFFFF))
            p1 = a.bad_ptr(rng, 4 * min(n, 64))[1] if rng.random() < 0.7 else a.sub
            p2 = a.bad_ptr(rng, 4 * min(n, 64))[1] if rng.random() < 0.7 else a.sub + 2048
            params = abi.FIFO_GET_CHANNELLIST.pack(n, p1, p2)
            ret, st = self.control("pointer", s.client, s.device, abi.NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST, params)
        else:
            # GET_PIDS / GET_PID_INFO: rewritten in gs_post from user memory (virt.c)
            cmd = rng.choice((0x2080018D, 0x2080018E))
            size = rng.choice((12, 16, 3812, 4016, 6416))
            params = bytearray(size)
            struct.pack_into("<III", params, 0, 0, os.getpid(), rng.choice((1, 2, 950, 951, 0xFFFFFFFF)))
            kind, ptr = a.bad_ptr(rng, size)
            if kind == "ro":
                ptr = a.write_ro(0, bytes(params))
            elif kind == "straddle":
                a.write(ptr, bytes(params[: a.end - ptr]))
            elif rng.random() < 0.5:
                ptr = None
            ret, st = self.control("pointer", s.client, s.subdevice, cmd, bytes(params[:2 * PAGE]), size=size,
                                   pptr=ptr)

    def op_foreign(self) -> None:
        s = self.ensure_session()
        rng = self.rng
        f = self.ctx.foreign
        fc = f["client"]
        objs = [f["device"], f["subdevice"], f["tsg"], f["channel"], *f["mems"]]
        k = rng.randrange(13)
        viol = False
        desc = ""
        if k == 0:
            cmd = rng.choice((abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
                              abi.NVA06C_CTRL_CMD_SET_TIMESLICE, abi.NVA06C_CTRL_CMD_GET_TIMESLICE,
                              *rng.sample(self.ctx.allowed_cmds, 2)))
            obj = {abi.NV2080_CTRL_CMD_FB_GET_INFO_V2: f["subdevice"]}.get(cmd, rng.choice(objs))
            size = {abi.NV2080_CTRL_CMD_FB_GET_INFO_V2: abi.FB_GET_INFO_V2_SIZE,
                    abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE: 3, abi.NVA06C_CTRL_CMD_SET_TIMESLICE: 8,
                    abi.NVA06C_CTRL_CMD_GET_TIMESLICE: 8}.get(cmd, rng.choice((4, 8, 16, 64)))
            params = bytearray(size)
            if cmd == abi.NVA06C_CTRL_CMD_SET_TIMESLICE:
                struct.pack_into("<Q", params, 0, 100000)
            ret, st = self.control("foreign", fc, obj, cmd, bytes(params))
            viol, desc = ret == 0 and st == abi.NV_OK, f"CONTROL {cmd:#x} on {fc:#x}/{obj:#x}"
        elif k == 1:
            obj = rng.choice([fc, *objs])
            ret, st = self.free("foreign", fc, rng.choice((fc, f["device"])), obj)
            viol, desc = ret == 0 and st == abi.NV_OK, f"FREE {fc:#x}/{obj:#x}"
        elif k == 2:
            cls = rng.choice((abi.NV01_MEMORY_LOCAL_USER, abi.KEPLER_CHANNEL_GROUP_A, abi.NV20_SUBDEVICE_0,
                              abi.HOPPER_CHANNEL_GPFIFO_A, abi.FERMI_VASPACE_A))
            parent = {abi.HOPPER_CHANNEL_GPFIFO_A: f["tsg"]}.get(cls, f["device"])
            params = bytes(nvstub.mem_params(2 * MIB)) if cls == abi.NV01_MEMORY_LOCAL_USER else None
            ret, st, _ = self.alloc("foreign", fc, parent, self.handle(), cls, params)
            viol, desc = ret == 0 and st == abi.NV_OK, f"ALLOC class {cls:#x} in {fc:#x}"
        elif k == 3:
            src = rng.choice(objs)
            cl = rng.choice((s.client, fc))
            ret, out = self.rm_call("foreign", s.ctl, abi.NV_ESC_RM_DUP_OBJECT,
                                    abi.NVOS55.pack(cl, s.device if cl == s.client else f["device"],
                                                    self.handle(), fc, src, 0, 0))
            st = abi.NVOS55.unpack(out)[6] if ret == 0 and out else -1
            viol, desc = ret == 0 and st == abi.NV_OK, f"DUP {fc:#x}/{src:#x} into {cl:#x}"
        elif k == 4:
            # gating other containers' channels: refused (a cross-process DoS: docs/h100-findings.md)
            pairs = [(fc, f["channel"])] + [(s.client, c) for c in s.chans[:1]]
            rng.shuffle(pairs)
            p = bytearray(abi.DISABLE_CHANNELS_SIZE)
            abi.DISABLE_CHANNELS_HEAD.pack_into(p, 0, 1, len(pairs), 0, 0, 0)
            base, n = abi.DISABLE_CHANNELS_HEAD.size, abi.NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES
            for i, (hc, hch) in enumerate(pairs):
                struct.pack_into("<I", p, base + 4 * i, hc)
                struct.pack_into("<I", p, base + 4 * n + 4 * i, hch)
            if rng.random() < 0.3:
                struct.pack_into("<I", p, 4, rng.choice((0, 65, 0xFFFFFFFF)))  # numChannels
            ret, st = self.control("foreign", s.client, s.subdevice, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
                                   bytes(p))
            viol, desc = ret == 0 and st == abi.NV_OK, "FIFO_DISABLE_CHANNELS naming B's channel"
        elif k == 5:
            h = rng.choice(f["mems"])
            blk = abi.NVOS33_WITH_FD.pack(fc, f["device"], h, 0, 2 * MIB, 0, 0, 0, s.dev)
            ret, out = self.rm_call("foreign", s.ctl, abi.NV_ESC_RM_MAP_MEMORY, blk)
            st = abi.NVOS33_WITH_FD.unpack(out)[6] if ret == 0 and out else -1
            viol, desc = ret == 0 and st == abi.NV_OK, f"MAP_MEMORY {fc:#x}/{h:#x}"
        elif k == 6:
            nr = rng.choice((abi.NV_ESC_RM_UNMAP_MEMORY, abi.NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO,
                             abi.NV_ESC_ALLOC_OS_EVENT, abi.NV_ESC_FREE_OS_EVENT))
            if nr == abi.NV_ESC_RM_UNMAP_MEMORY:
                blk, so = abi.NVOS34.pack(fc, f["device"], rng.choice(f["mems"]), 0, 0, 0), 6 * 4
            elif nr == abi.NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO:
                blk, so = abi.NVOS56.pack(fc, f["device"], rng.choice(f["mems"]), 0, 0, 0), 32
            else:
                blk, so = abi.ALLOC_OS_EVENT.pack(fc, f["device"], s.ctl, 0), 12
            ret, out = self.rm_call("foreign", s.ctl, nr, blk)
            st = struct.unpack_from("<I", out, so)[0] if ret == 0 and out else -1
            viol, desc = ret == 0 and st == abi.NV_OK, f"escape {nr:#x} on {fc:#x}"
        elif k == 7:
            # RM_ALLOC_MEMORY (on nvidia0) in B's client
            blk = abi.NVOS02_WITH_FD.pack(fc, f["device"], self.handle(), 0x71, 0, self.arena.sub, PAGE - 1, 0, s.dev)
            ret, out = self.rm_call("foreign", s.dev, abi.NV_ESC_RM_ALLOC_MEMORY, blk)
            st = abi.NVOS02_WITH_FD.unpack(out)[7] if ret == 0 and out else -1
            viol, desc = ret == 0 and st == abi.NV_OK, f"ALLOC_MEMORY in {fc:#x}"
        elif k == 8:
            # own client, B's object handles (and B's client where a handle is expected)
            obj = rng.choice([fc, *objs])
            ret, st = self.control("foreign", s.client, obj, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
                                   abi.GPFIFO_SCHEDULE.pack(0, 0, 0) + b"\0")
            viol = False  # names our own client: RM resolves the handle in it
        elif k == 9:
            # UVM registrations naming B's client through our nvidiactl
            cmd = rng.choice((abi.UVM_REGISTER_GPU_VASPACE, abi.UVM_REGISTER_CHANNEL, abi.UVM_REGISTER_GPU,
                              abi.UVM_MAP_EXTERNAL_ALLOCATION))
            size, so, fdo = nvstub.uvm_params(cmd)
            p = bytearray(size)
            struct.pack_into("<iII", p, fdo, s.ctl, fc, rng.choice(objs))
            self._uvm_init(s)
            self.arena.write(self.arena.arg, bytes(p))
            ret = self.call("foreign", s.uvm, cmd, self.arena.arg, uvm=True)
            st = struct.unpack_from("<I", self.arena.read(self.arena.arg + so, 4))[0] if ret == 0 else -1
            viol, desc = ret == 0 and st == abi.NV_OK, f"UVM {cmd} naming {fc:#x}"
        elif k == 11:
            # importing B's shareable handle, or reading its export file
            efd, rmo = f["export_fd"], abi.NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM
            if rng.random() < 0.5:
                cmd = abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD
                params = abi.IMPORT_OBJECT_FROM_FD.pack(efd, rmo, 0, s.device, self.handle())
            else:
                cmd = abi.NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO
                params = nvstub.export_info_params(efd)
            ret, st = self.control("foreign", s.client, s.client, cmd, params)
            viol, desc = ret == 0 and st == abi.NV_OK, f"control {cmd:#x} on B's export file (fd {efd})"
        elif k == 12 and s.mems:
            # making B's export file hold (and B's instance keep alive) our memory
            params = abi.EXPORT_OBJECT_TO_FD.pack(abi.NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM, s.device,
                                                  s.device, rng.choice(s.mems), f["export_fd"], 0)
            ret, st = self.control("foreign", s.client, s.client, abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD,
                                   params)
            viol, desc = ret == 0 and st == abi.NV_OK, "EXPORT_OBJECT_TO_FD into B's file"
        else:
            # a device allocation whose hClientShare names B's client (issue 11 item 5: recorded only)
            dp = abi.DEVICE_ALLOC_PARAMS.pack(0, fc, 0, 0, 0, 0, 0, 0, 0)
            h = self.handle()
            ret, st, _ = self.alloc("foreign", s.client, s.client, h, abi.NV01_DEVICE_0, dp)
            if ret == 0 and st == 0:
                self.track(abi.NV01_DEVICE_0, h)
        if viol:
            self.bump(S_VIOL)
            self.ctx.report_violation(desc)
        elif desc:
            self.ok("foreign")

    UVM_BASE = 0x7E0000000000  # 512 MiB aligned, as tests/guest/test_standin_uvm.py maps

    def _uvm_map(self, s: Session) -> None:
        """A valid external mapping of one of the session's memory handles (nvidia-uvm keeps
        a duplicate of the memory while it is mapped), then sometimes the memory freed while
        mapped, the range unmapped or freed."""
        rng = self.rng
        self._uvm_init(s)
        if not s.uvm_ready:
            return
        u = object.__new__(nvstub.Uvm)
        u.fd = s.uvm
        gpu0 = nvstub.standin_uuid(0)
        n = 0
        try:
            if not s.uvm_registered:
                ns = SimpleNamespace(gpu=0, ctl=s.ctl, client=s.client, device=s.device, handle=self.handle)
                s.uvm_registered = True
                n += 2
                u.register_gpu(ns)
                u.register_gpu_va_space(ns)
            k = rng.randrange(4)
            if k <= 1 and s.mems:
                self.one_sided()
                length = rng.choice((64 << 10, 2 * MIB, 4 * MIB))
                base = self.UVM_BASE + (len(s.uvm_ranges) % 64) * 512 * MIB
                n += 2
                if u.create_range(base, length) == abi.NV_OK:
                    s.uvm_ranges.append((base, length))
                if u.map(base, length, s.client, rng.choice(s.mems), [gpu0], rm_ctrl_fd=s.ctl) == abi.NV_OK:
                    self.ok("uvm")
            elif k == 2 and s.uvm_ranges and s.mems:
                # the memory freed while UVM maps it
                self.one_sided()
                h = rng.choice(s.mems)
                n += 1
                ret, st = self.free("uvm", s.client, s.device, h)
                if ret == 0 and st == abi.NV_OK:
                    self.forget(h)
            elif s.uvm_ranges:
                base, length = s.uvm_ranges.pop(rng.randrange(len(s.uvm_ranges)))
                n += 1
                if rng.random() < 0.5:
                    u.unmap(base, length, gpu0)
                else:
                    u.free(base, length)
        except OSError:
            pass
        self.st[self.row + S_CAT + CAT["uvm"]] += n

    def op_uvm(self) -> None:
        s = self.ensure_session()
        rng = self.rng
        if rng.random() < 0.1:
            self._uvm_map(s)
            return
        if rng.random() < 0.3:
            self._uvm_init(s)
        cmds = list(abi.UVM_PARAMS)
        cmd = rng.choice(cmds) if rng.random() < 0.8 else rng.choice(
            (rng.randrange(0, 100), rng.getrandbits(32), abi.UVM_DEINITIALIZE, iowr(rng.randrange(256), 16)))
        size = abi.UVM_PARAMS.get(cmd, (rng.choice((8, 16, 64, 4096)), 0, None))[0]
        fdo = abi.UVM_PARAMS.get(cmd, (0, 0, None))[2]
        data = bytearray(rng.randbytes(min(size, 4 * PAGE))) if rng.random() < 0.5 else bytearray(min(size, 4 * PAGE))
        if fdo is not None and fdo + 12 <= len(data):
            fd = s.uvm if cmd == abi.UVM_MM_INITIALIZE else rng.choice((s.ctl, s.ctl, s.dev, s.uvm, -1, 1000))
            struct.pack_into("<i", data, fdo, fd)
            if cmd != abi.UVM_MM_INITIALIZE:
                struct.pack_into("<II", data, fdo + 4, s.client, rng.choice(self.my_handles() or [0]))
        a = self.arena
        if rng.random() < 0.15:
            ptr = a.bad_ptr(rng, size)[1]
        elif size > 4 * PAGE:
            ptr = a.end - 4 * PAGE  # the tail of a large block runs into the guard
            a.write(ptr, bytes(data))
        else:
            a.write(a.arg, bytes(data))
            ptr = a.arg
        fd = s.uvm if rng.random() < 0.9 else s.ctl
        ret = self.call("uvm", fd, cmd, ptr, uvm=(fd == s.uvm))
        if ret == 0:
            self.ok("uvm")

    def op_mmap(self) -> None:
        s = self.ensure_session()
        rng = self.rng
        chaos = self.cfg.mode == "chaos"
        k = rng.randrange(4)
        if k == 0 and s.mems:
            h = rng.choice(s.mems)
            blk = abi.NVOS33_WITH_FD.pack(s.client, s.device, h, 0, rng.choice((4096, 2 * MIB)), 0, 0, 0,
                                          rng.choice((s.dev, s.dev, s.ctl)))
            ret, out = self.rm_call("mmap", s.ctl, abi.NV_ESC_RM_MAP_MEMORY, blk)
            if ret == 0 and out and abi.NVOS33_WITH_FD.unpack(out)[6] == 0:
                self.ok("mmap")
                length = abi.NVOS33_WITH_FD.unpack(out)[4]
                length = rng.choice((length, 2 * MIB, PAGE))
                self._mmap(s, s.dev, length, 0, keep=chaos and rng.random() < 0.5)
        elif k == 1:
            fd = rng.choice((s.ctl, s.dev, s.uvm))
            self._mmap(s, fd, rng.choice((PAGE, 2 * PAGE, 2 * MIB, 0)), rng.choice((0, PAGE, 1 << 40)),
                       keep=chaos and rng.random() < 0.3)
        elif k == 2:
            fd = rng.choice((s.ctl, s.dev, s.uvm))
            t0 = now_ms()
            try:
                os.read(fd, rng.choice((0, 1, 64)))
            except OSError:
                pass
            try:
                select.select([fd], [fd], [], 0)
            except (OSError, ValueError):
                pass
            self.st[self.row + S_CAT + CAT["mmap"]] += 1
            if now_ms() - t0 > self.cfg.slow_s * 1000:
                self.bump(S_SLOW)
        else:
            try:
                os.lseek(rng.choice((s.ctl, s.dev)), rng.randrange(-10, 10), rng.randrange(3))
            except OSError:
                pass
            self.st[self.row + S_CAT + CAT["mmap"]] += 1

    def _mmap(self, s: Session, fd: int, length: int, off: int, keep: bool) -> None:
        self.st[self.row + S_CAT + CAT["mmap"]] += 1
        if length <= 0:
            return
        addr = _mmap(None, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off)
        if addr in (None, MAP_FAILED):
            return
        self.bump(S_MMAPS)
        if fd == s.dev:
            # fault a page of the stand-in in, for writing and for reading, from the kernel
            os.write(self.pipe_w, b"fuzz")
            libc.read(self.pipe_r, ctypes.c_void_p(addr), 4)
            libc.write(self.pipe_w, ctypes.c_void_p(addr), 4)
            try:
                os.read(self.pipe_r, 64)
            except BlockingIOError:
                pass
        if keep:
            s.maps.append((addr, length))
        else:
            _munmap(addr, length)

    def op_compat(self) -> None:
        """A call of another category through the 32-bit entry (fops compat_ioctl)."""
        op = self.rng.choice((self.op_valid, self.op_trace, self.op_trace, self.op_random, self.op_size,
                              self.op_pointer, self.op_foreign, self.op_uvm))
        self.compat = True
        try:
            op()
        finally:
            self.compat = False

    def op_fdtable(self) -> None:
        """Calls through a high fd number: the private fd table of fdswap.c is then larger
        than NR_OPEN_DEFAULT and allocated like alloc_fdtable()."""
        s = self.ensure_session()
        rng = self.rng
        hi = rng.choice((64, 65, 127, 128, 1000, 4095, 20000))
        try:
            import fcntl
            fd = fcntl.fcntl(s.ctl, fcntl.F_DUPFD_CLOEXEC, hi)  # the lowest free fd >= hi: clobbers nothing
        except OSError:
            return
        self.ctx.reg.add(fd, self.tid)
        try:
            p = bytearray(abi.FB_GET_INFO_V2_SIZE)
            struct.pack_into("<III", p, 0, 1, abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE, 0)
            blk = abi.NVOS54.pack(s.client, s.subdevice, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, 0,
                                  self.params_at(bytes(p)), len(p), 0)
            ret, out = self.rm_call("fdtable", fd, abi.NV_ESC_RM_CONTROL, blk)
            if ret == 0 and out and abi.NVOS54.unpack(out)[6] == 0:
                self.ok("fdtable")
            # a device allocation scans the caller's whole table for its nvidia0 file
            h = self.handle()
            dp = abi.DEVICE_ALLOC_PARAMS.pack(0, 0, 0, 0, 0, 0, 0, 0, 0)
            ret, out = self.rm_call("fdtable", fd, abi.NV_ESC_RM_ALLOC, abi.NVOS64.pack(
                s.client, s.client, h, abi.NV01_DEVICE_0, self.params_at(dp), 0, 0, 0, 0))
            if ret == 0 and out and abi.NVOS64.unpack(out)[8] == 0:
                self.track(abi.NV01_DEVICE_0, h)
        finally:
            self.ctx.reg.close_own(fd, self.tid)

    def op_fork(self) -> None:
        s = self.ensure_session()
        rng = self.rng
        self.reap()
        if len(self.children) > 2:
            return
        how = rng.choice(("calls", "calls", "kill", "exec") if self.cfg.mode == "chaos" else ("calls", "kill"))
        seed = rng.getrandbits(32)
        self.bump(S_FORKS)
        self.st[self.row + S_CAT + CAT["fork"]] += 1
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                self._child(how, seed)
            except BaseException:
                code = 1
            os._exit(code)
        self.children.append(pid)
        if how == "kill":
            time.sleep(rng.random() * 0.05)
            try:
                os.kill(pid, signal.SIGKILL)
                self.bump(S_KILLS)
            except OSError:
                pass

    def _child(self, how: str, seed: int) -> None:
        """In a forked child: the parent's session fds, a fresh arena, a row of its own."""
        self.rng = random.Random(seed)
        self.arena = Arena()
        self.row = self.ctx.child_row * NSLOT
        self.children = []
        self.in_child = True
        # locks other threads of the parent may have held at the fork
        self.ctx.reg = Registry()
        self.ctx._vlock = threading.Lock()
        self.ctx.arenas = []
        if how == "exec":
            stop = [False]

            def hammer(seed: int) -> None:
                import copy

                f = copy.copy(self)  # each thread its own arena and generator (the fds are shared)
                f.arena = Arena()
                f.rng = random.Random(seed)
                while not stop[0]:
                    f._child_op()

            ts = [threading.Thread(target=hammer, args=(self.rng.getrandbits(32),), daemon=True) for _ in range(2)]
            for t in ts:
                t.start()
            time.sleep(self.rng.random() * 0.05)
            self.st[self.row + S_EXECS] += 1
            os.execv("/bin/true", ["/bin/true"])  # de_thread() kills the hammering threads
        for _ in range(self.rng.randrange(5, 40)):
            if self.ctx.stop.value or self.ctx.pause.value:
                break
            self._child_op()

    def _child_op(self) -> None:
        op = self.rng.choice((self.op_valid, self.op_trace, self.op_random, self.op_foreign, self.op_pointer))
        try:
            op()
        except OSError:
            pass

    def reap(self, block: bool = False, timeout: float = 0.0) -> list[int]:
        """Reaps children; returns the pids still running after `timeout` when block."""
        end = time.monotonic() + timeout
        while True:
            for pid in list(self.children):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    self.children.remove(pid)
            if not block or not self.children or time.monotonic() > end:
                return list(self.children)
            time.sleep(0.05)

    def park(self) -> None:
        """Between two calls, for the parent's accounting sample: the fork children stop
        (they check the pause) and are reaped, then S_PARKED = 1; in the sample's second
        phase a one-sided session is closed, then S_PARKED = 2; until the pause ends."""
        st, r = self.st, self.row
        pause, stop = self.ctx.pause, self.ctx.stop
        left = self.reap(block=True, timeout=self.cfg.hang_s)
        for pid in left:
            self.ctx.report_violation(f"fork child {pid} still running {self.cfg.hang_s}s after a pause")
            self.ctx.stuck_children.append(pid)
            self.children.remove(pid)
        st[r + S_PARKED] = 1
        while pause.value and not stop.value:
            if pause.value == 2 and st[r + S_PARKED] == 1:
                if st[r + S_ASYM]:
                    self.close_session()
                st[r + S_PARKED] = 2
            time.sleep(0.005)
        st[r + S_PARKED] = 0

    # -- main loop
    def run(self) -> None:
        rng = self.rng
        stop = self.ctx.stop
        ops, rebuild_at = 0, rng.randrange(500, 3000)
        while not stop.value:
            if self.ctx.pause.value:
                self.park()
                continue
            ops += 1
            if ops >= rebuild_at:
                # a fresh session now and then: the release path, and bounded state in long runs
                ops, rebuild_at = 0, rng.randrange(500, 3000)
                self.close_session()
            cat = rng.choices(self.cat_names, self.cat_w)[0]
            try:
                getattr(self, "op_" + cat)()
            except OSError as e:
                self.bump(S_PYERR)
                self.bad_streak += 1
                if self.cfg.mode != "chaos":
                    self.ctx.note(f"{cat}: {type(e).__name__}: {e}")
            except Exception as e:  # a bug of the fuzzer: keep going, report the first ones
                self.bump(S_PYERR)
                self.bad_streak += 1
                self.ctx.note(f"{cat}: {type(e).__name__}: {e}")
        left = self.reap(block=True, timeout=self.cfg.hang_s)
        for pid in left:
            self.ctx.report_violation(f"fork child {pid} still running {self.cfg.hang_s}s after the stop")
            self.ctx.stuck_children.append(pid)


# ---- chaos threads ---------------------------------------------------------------------------


def closer_loop(ctx: "ProcCtx", rng: random.Random, row: int) -> None:
    st = ctx.stats
    devnull = os.open("/dev/null", os.O_RDWR)
    r, w = os.pipe()
    os.set_blocking(r, False)  # dup2'ed over a thread's fd: its read() must not block
    while not ctx.stop.value:
        time.sleep(rng.random() * 0.08)
        with ctx.reg.lock:
            fds = list(ctx.reg.fds)
            if not fds:
                continue
            fd = rng.choice(fds)
            if rng.random() < 0.5:
                del ctx.reg.fds[fd]
                try:
                    os.close(fd)
                except OSError:
                    pass
                st[row + S_CLOSES] += 1
            else:
                src = rng.choice((devnull, r, rng.choice(fds)))
                try:
                    os.dup2(src, fd)
                except OSError:
                    pass
                st[row + S_DUP2S] += 1


def protector_loop(ctx: "ProcCtx", rng: random.Random, row: int) -> None:
    st = ctx.stats
    while not ctx.stop.value:
        time.sleep(rng.random() * 0.003)
        if not ctx.arenas:
            continue
        a = rng.choice(ctx.arenas)
        page = a.base + rng.randrange(Arena.RW_PAGES) * PAGE
        prot = rng.choice((PROT_READ, PROT_NONE))
        with a.lock:
            _mprotect(page, PAGE, prot)
            time.sleep(rng.random() * 0.002)
            _mprotect(page, PAGE, PROT_READ | PROT_WRITE)
        st[row + S_PROTECTS] += 1


def proc_reader_loop(ctx: "ProcCtx", rng: random.Random, row: int) -> None:
    """Reads the fd tables of the process's threads through /proc while they call: the
    calling thread's table is the private one during its call (fdswap.c)."""
    st = ctx.stats
    pid = os.getpid()
    while not ctx.stop.value:
        time.sleep(rng.random() * 0.01)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            d = f"/proc/{pid}/task/{tid}/fd"
            try:
                fds = os.listdir(d)
            except OSError:
                continue
            for fd in fds:
                try:
                    rdev = os.stat(f"{d}/{fd}").st_rdev
                    with open(f"/proc/{pid}/task/{tid}/fdinfo/{fd}") as f:
                        f.read()
                except OSError:
                    continue
                st[row + S_PROCREADS] += 1
                if rdev and os.major(rdev) in ctx.real_majors:
                    st[row + S_PROCREAL] += 1


def rewriter_loop(ctx: "ProcCtx", rng: random.Random, row: int) -> None:
    """--races: rewrites other threads' blocks while their calls run (known TOCTOU, issue 10/11)."""
    handles = [ctx.foreign["client"], ctx.foreign["channel"], 0, 0xFFFFFFFF]
    while not ctx.stop.value:
        time.sleep(rng.random() * 0.001)
        if not ctx.arenas:
            continue
        a = rng.choice(ctx.arenas)
        off = rng.randrange(0, Arena.RW_PAGES * PAGE - 8) & ~3
        v = rng.choice(handles) if rng.random() < 0.5 else rng.getrandbits(32)
        if a.lock.acquire(timeout=0.01):
            try:
                ctypes.memmove(a.base + off, struct.pack("<I", v), 4)
            finally:
                a.lock.release()


# ---- worker process ---------------------------------------------------------------------------


class ProcCtx:
    def __init__(self, cfg: FuzzConfig, proc_idx: int, shared: dict, corpus: Corpus) -> None:
        self.cfg = cfg
        self.proc_idx = proc_idx
        self.stats = shared["stats"]
        self.stop = shared["stop"]
        self.pause = shared["pause"]
        self.viol_buf = shared["viol"][proc_idx]
        self.paths = shared["paths"]
        self.foreign = shared["foreign"]
        self.corpus = corpus
        self.reg = Registry()
        self.arenas: list[Arena] = []
        self.allowed_cmds = sorted({c for c, _, _ in corpus.controls}) or [abi.NV2080_CTRL_CMD_FB_GET_INFO_V2]
        rows = cfg.threads + 2
        self.first_row = proc_idx * rows
        self.chaos_row = self.first_row + cfg.threads
        self.child_row = self.first_row + cfg.threads + 1
        self.stuck_children: list[int] = []
        self._vlock = threading.Lock()
        self.real_majors = {abi.NV_MAJOR_DEVICE_NUMBER, os.major(os.stat(nvstub.UVM_PATH).st_rdev)}
        self.notes: list[str] = []
        self.notes_buf = shared["notes"][proc_idx]

    def note(self, desc: str) -> None:
        if len(self.notes) < 5:
            import traceback
            self.notes.append(desc + " " + traceback.format_exc(limit=3).replace("\n", " | ")[-600:])
            self.notes_buf.value = "\n".join(self.notes).encode()[:4000]

    def report_violation(self, desc: str) -> None:
        with self._vlock:
            cur = self.viol_buf.value.decode(errors="replace")
            if len(cur) < 1500:
                self.viol_buf.value = (cur + desc[:200] + "\n").encode()[:2000]


def worker_main(cfg: FuzzConfig, proc_idx: int, shared: dict, corpus: Corpus, release, done) -> None:
    import resource

    ctx = ProcCtx(cfg, proc_idx, shared, corpus)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 16), hard))
    except (OSError, ValueError):
        pass
    base = random.Random(f"{cfg.seed}:{proc_idx}")
    ctx.stats[ctx.first_row * NSLOT + S_PID] = os.getpid()
    fuzzers = [Fuzzer(ctx, t, ctx.first_row + t, random.Random(base.getrandbits(64))) for t in range(cfg.threads)]
    ctx.arenas = [f.arena for f in fuzzers]
    threads = [threading.Thread(target=f.run, daemon=True) for f in fuzzers]
    if cfg.mode == "chaos":
        cr = ctx.chaos_row * NSLOT
        threads.append(threading.Thread(target=closer_loop, args=(ctx, random.Random(base.getrandbits(64)), cr),
                                        daemon=True))
        threads.append(threading.Thread(target=protector_loop, args=(ctx, random.Random(base.getrandbits(64)), cr),
                                        daemon=True))
    threads.append(threading.Thread(target=proc_reader_loop, args=(ctx, random.Random(base.getrandbits(64)),
                                                                   ctx.chaos_row * NSLOT), daemon=True))
    if cfg.mode == "chaos":
        if cfg.races:
            threads.append(threading.Thread(target=rewriter_loop, args=(ctx, random.Random(base.getrandbits(64)), cr),
                                            daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for pid in ctx.stuck_children:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    done.set()
    # hold every file open until the parent has compared the accounting
    release.wait(600)
    os._exit(0)


# ---- the victim, in instance B -----------------------------------------------------------------


def victim_main(ctl_path: str, dev_path: str, limit: int, conn, stop, export_fd: int, vlock) -> None:
    from gsinst import InstSession

    s = InstSession(ctl_path, dev_path)
    tsg, ch = s.tsg_channel()
    mems = []
    held = 0
    for size in (4 * MIB, 2 * MIB):
        st, h, got = s.alloc_vidmem(size)
        assert st == abi.NV_OK, st
        mems.append(h)
        held += got
    # a shareable handle of B's (export_fd: B's nvidiactl, inherited by the fuzzers too)
    assert s.export_fd(mems[0], export_fd) == abi.NV_OK
    conn.send({"client": s.client, "device": s.device, "subdevice": s.subdevice, "tsg": tsg, "channel": ch,
               "mems": mems, "pid": os.getpid(), "held": held, "export_fd": export_fd})
    errors: list[str] = []
    calls = 0
    max_ms = 0.0
    while not stop.value:
        # vlock: the parent's accounting samples read the pool between two of our rounds
        with vlock:
            t0 = time.monotonic()
            free = s.fb_free_kib()
            if free != (limit - held) >> 10:
                errors.append(f"HEAP_FREE {free} KiB, expected {(limit - held) >> 10}")
            st, h, got = s.alloc_vidmem(2 * MIB)
            if st != abi.NV_OK or s.free(h) != abi.NV_OK:
                errors.append(f"alloc/free status {st:#x}")
            if nvstub.schedule(s.ctl, s.client, tsg) != abi.NV_OK:
                errors.append("GPFIFO_SCHEDULE refused")
            calls += 4
            max_ms = max(max_ms, (time.monotonic() - t0) * 1000)
        time.sleep(0.05)
    conn.send({"calls": calls, "errors": errors[:10], "nerrors": len(errors), "max_ms": round(max_ms, 1)})
    # wait for the parent's accounting checks, then check that our objects still work
    cmd = conn.recv()
    post = []
    if nvstub.schedule(s.ctl, s.client, tsg) != abi.NV_OK:
        post.append("GPFIFO_SCHEDULE after the fuzz")
    for h in mems:
        if s.free(h) != abi.NV_OK:
            post.append(f"free {h:#x} after the fuzz")
    conn.send({"post": post})
    conn.recv()
    s.close()
    os._exit(0)


# ---- the run --------------------------------------------------------------------------------------


def _standin_bytes(pool0: int) -> int:
    """The stand-in's pool bytes in use beyond what was in use before the run (/proc/nvstub/pool:
    PMA pages as the stand-in takes them, exact, where FB_GET_INFO_V2 answers in KiB)."""
    return nvstub.pool_used() - pool0


def _stacks(pid: int) -> str:
    out = []
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            out.append(f"-- {t}: {Path(t, 'wchan').read_text()}\n{Path(t, 'stack').read_text()}")
        except OSError as e:
            out.append(f"-- {t}: {e}")
    return "\n".join(out)[-4000:]


def summarize(stats, nrows: int) -> dict:
    tot = [0] * NSLOT
    for r in range(nrows):
        for i in range(NSLOT):
            tot[i] += stats[r * NSLOT + i]
    esc = {}
    for nr in range(256):
        if tot[nr]:
            esc[tr.escape_name(nr)] = tot[nr]
    for k in range(128):
        if tot[S_UVM + k]:
            cmd = abi.UVM_INITIALIZE if k == 126 else abi.UVM_DEINITIALIZE if k == 127 else k
            esc["uvm " + abi.UVM_NAMES.get(cmd, f"{cmd:#x}")] = tot[S_UVM + k]
    if tot[S_OTHER_TYPE]:
        esc["type != 'F'"] = tot[S_OTHER_TYPE]
    maxms = max(stats[r * NSLOT + S_MAXMS] for r in range(nrows)) if nrows else 0
    return {
        "calls": sum(tot[i] for i in range(S_CAT, S_CAT + len(CATS))),
        "per_category": {c: tot[S_CAT + i] for i, c in enumerate(CATS)},
        "ok_per_category": {c: tot[S_CAT_OK + i] for i, c in enumerate(CATS)},
        "per_escape": dict(sorted(esc.items(), key=lambda kv: -kv[1])),
        "errno": {errno.errorcode.get(e, str(e)): tot[S_ERRNO + e] for e in range(140) if tot[S_ERRNO + e]},
        "foreign_ok": tot[S_VIOL], "slow_calls": tot[S_SLOW], "max_call_ms": maxms,
        "py_errors": tot[S_PYERR], "sessions": tot[S_SESS], "forks": tot[S_FORKS], "kills": tot[S_KILLS],
        "execs": tot[S_EXECS], "mmaps": tot[S_MMAPS], "closes": tot[S_CLOSES], "dup2s": tot[S_DUP2S],
        "protects": tot[S_PROTECTS], "proc_fd_reads": tot[S_PROCREADS], "proc_fd_real": tot[S_PROCREAL],
        "one_sided_calls": tot[S_ASYMCALLS], "register_fd_other_process": tot[S_REGOTHER],
    }


def run(cfg: FuzzConfig, nl=None) -> dict:
    """One fuzz run; returns the report. `problems` lists what failed (empty: passed)."""
    from gpuslice.netlink import GpusliceNetlink

    from gsinst import Instance

    log = cfg.log
    corpus = load_corpus()
    own_nl = nl is None
    nl = nl or GpusliceNetlink()
    problems: list[str] = []
    report: dict = {"seed": cfg.seed, "mode": cfg.mode, "seconds": cfg.seconds, "procs": cfg.procs,
                    "threads": cfg.threads, "races": cfg.races, "problems": problems}
    mctx = mp.get_context("fork")
    # The stand-in's pool, read in /proc/nvstub (no real device file is opened: the fuzzing
    # processes must not inherit one).
    pool0 = nvstub.pool_used()
    export_fd = -1
    t_start = time.monotonic()
    try:
        with Instance(nl, cfg.limit_a, timeslice_us=2000) as A, Instance(nl, cfg.limit_b) as B:
            # the victim
            vstop = mctx.RawValue(ctypes.c_int, 0)
            vlock = mctx.Lock()
            vconn, vchild = mctx.Pipe()
            export_fd = nvstub.open_node(B.path("nvidiactl"))
            os.set_inheritable(export_fd, True)
            victim = mctx.Process(target=victim_main, args=(B.path("nvidiactl"), B.path("nvidia0"), cfg.limit_b,
                                                            vchild, vstop, export_fd, vlock))
            victim.start()
            if not vconn.poll(120):
                raise RuntimeError("victim did not start")
            foreign = vconn.recv()
            foreign["timeslice_us"] = next((c.timeslice_us for c in nvstub.read_engine()
                                            if c.client == foreign["client"] and c.channel == foreign["channel"]), -1)
            # the fuzzers
            nrows = cfg.procs * (cfg.threads + 2)
            shared = {
                "stats": mctx.RawArray(ctypes.c_uint64, nrows * NSLOT),
                "stop": mctx.RawValue(ctypes.c_int, 0),
                "pause": mctx.RawValue(ctypes.c_int, 0),
                "viol": [mctx.RawArray(ctypes.c_char, 2048) for _ in range(cfg.procs)],
                "notes": [mctx.RawArray(ctypes.c_char, 4096) for _ in range(cfg.procs)],
                "paths": {"ctl": A.path("nvidiactl"), "dev": A.path("nvidia0"), "uvm": A.path("nvidia-uvm")},
                "foreign": foreign,
            }
            release = mctx.Event()
            dones = [mctx.Event() for _ in range(cfg.procs)]
            workers = [mctx.Process(target=worker_main, args=(cfg, i, shared, corpus, release, dones[i]))
                       for i in range(cfg.procs)]
            for w in workers:
                w.start()
            log(f"fuzz[{cfg.mode}] seed={cfg.seed} A={A.name} B={B.name} procs={cfg.procs} "
                f"threads={cfg.threads} for {cfg.seconds:.0f}s")
            stats = shared["stats"]
            pause = shared["pause"]
            thread_rows = [p * (cfg.threads + 2) + t for p in range(cfg.procs) for t in range(cfg.threads)]
            over_limit: list[str] = []
            sampling = {"samples": 0, "one_sided_sessions_closed": 0, "max_charge_over_standin": 0,
                        "failed": 0, "last": None}
            seen_kinds: set[str] = set()

            def calls_so_far() -> int:
                return sum(stats[r * NSLOT + S_CAT + i] for r in range(nrows) for i in range(len(CATS)))

            def check_limit(where: str) -> int:
                a_used = A.get()["mem_used"]
                if a_used > cfg.limit_a and len(over_limit) < 5:
                    over_limit.append(f"A's used {a_used} is over its limit {cfg.limit_a} ({where})")
                return a_used

            def fail(kind: str, msg: str) -> None:
                sampling["failed"] += 1
                if kind not in seen_kinds:
                    seen_kinds.add(kind)
                    problems.append(msg)

            def wait_rows(ok, timeout: float) -> list[int]:
                """Waits until ok(S_PARKED) for every fuzzing thread; returns the rows that are not."""
                deadline = time.monotonic() + timeout
                while True:
                    bad = [r for r in thread_rows if not ok(stats[r * NSLOT + S_PARKED])]
                    if not bad or time.monotonic() > deadline or not all(w.is_alive() for w in workers):
                        return bad
                    time.sleep(0.01)

            def measure() -> dict:
                with vlock:  # B's victim between two rounds
                    a_used, b_used = A.get()["mem_used"], B.get()["mem_used"]
                    pool = _standin_bytes(pool0)
                    b_standin = sum(c["vidmem"] for c in nvstub.clients() if c["pid"] == foreign["pid"])
                return {"calls": calls_so_far(), "a_used": a_used, "b_used": b_used, "standin": pool,
                        "standin_a": pool - b_standin, "standin_b": b_standin}

            def check_b(m: dict, label: str) -> None:
                if not m["standin_b"] == m["b_used"] == foreign["held"]:
                    fail("b", f"sample {label}: the stand-in holds {m['standin_b']} bytes for B's process, "
                              f"B.used is {m['b_used']}, the process holds {foreign['held']}")

            def sample(label: str) -> bool:
                """Parks every fuzzing thread between two calls and compares (module docstring)."""
                bad = wait_rows(lambda v: v == 0, cfg.hang_s)
                if not bad:
                    pause.value = 1
                    bad = wait_rows(lambda v: v >= 1, cfg.hang_s + 10)
                if bad:
                    r = bad[0]
                    proc = workers[r // (cfg.threads + 2)]
                    problems.append(f"sample {label}: threads (rows {bad}) did not park within {cfg.hang_s + 10}s; "
                                    f"row {r}'s call in flight since {stats[r * NSLOT + S_CURT0]} ms, req "
                                    f"{stats[r * NSLOT + S_CURREQ]:#x}, in pid {proc.pid}:\n{_stacks(proc.pid)}")
                    return False
                asym = [r for r in thread_rows if stats[r * NSLOT + S_ASYM]]
                m1 = measure()
                check_limit(f"sample {label}")
                check_b(m1, label)
                if m1["a_used"] > cfg.limit_a:
                    fail("limit", f"sample {label} at {m1['calls']} calls: A.used {m1['a_used']} > limit {cfg.limit_a}")
                if m1["standin_a"] > m1["a_used"]:
                    fail("one-sided", f"sample {label} at {m1['calls']} calls: the stand-in holds {m1['standin_a']} "
                                      f"bytes for A, above A.used {m1['a_used']} (by {m1['standin_a'] - m1['a_used']}; "
                                      f"{len(asym)} one-sided sessions open)")
                sampling["max_charge_over_standin"] = max(sampling["max_charge_over_standin"],
                                                          m1["a_used"] - m1["standin_a"])
                pause.value = 2
                bad = wait_rows(lambda v: v >= 2, cfg.hang_s + 10)
                if bad:
                    problems.append(f"sample {label}: threads (rows {bad}) did not close their one-sided sessions")
                    return False
                m2 = measure()
                check_b(m2, label)
                if m2["standin_a"] != m2["a_used"]:
                    fail("exact", f"sample {label} at {m2['calls']} calls: with no one-sided session open the "
                                  f"stand-in holds {m2['standin_a']} bytes for A, A.used is {m2['a_used']} "
                                  f"(stand-in - used = {m2['standin_a'] - m2['a_used']}; {len(asym)} sessions "
                                  f"were closed first; before: {m1})")
                sampling["samples"] += 1
                sampling["one_sided_sessions_closed"] += len(asym)
                sampling["last"] = m2
                return True

            end = time.monotonic() + cfg.seconds
            hung = None
            last_log = last_ts = time.monotonic()
            ts_rng = random.Random(cfg.seed ^ 0x7153)
            ts_sets = 0
            next_sample = cfg.sample_calls
            while time.monotonic() < end and hung is None:
                time.sleep(0.5)
                check_limit("during the run")
                if cfg.mode == "accounting" and cfg.sample_calls and calls_so_far() >= next_sample:
                    if not sample(f"#{sampling['samples'] + 1}"):
                        hung = -1
                        break
                    pause.value = 0
                    next_sample = calls_so_far() + cfg.sample_calls
                if time.monotonic() - last_ts > 3:
                    # each file of A applies the new value to its TSGs at its next call (ioctl.c)
                    last_ts = time.monotonic()
                    nl.instance_set(A.name, timeslice_us=ts_rng.choice((0, 1000, 2000, 5000)))
                    ts_sets += 1
                t = now_ms()
                for r in range(nrows):
                    t0 = stats[r * NSLOT + S_CURT0]
                    if t0 and t - t0 > cfg.hang_s * 1000:
                        hung = r
                for w in workers:
                    if not w.is_alive():
                        problems.append(f"worker {w.pid} exited early (code {w.exitcode})")
                        hung = -1
                if time.monotonic() - last_log > 30:
                    last_log = time.monotonic()
                    log(f"fuzz[{cfg.mode}] {summarize(stats, nrows)['calls']} calls so far")
            if cfg.mode == "accounting" and hung is None:
                sample("end")  # with every process holding its files, each thread parked
            shared["stop"].value = 1
            pause.value = 0
            if hung is not None and hung >= 0:
                proc = workers[hung // (cfg.threads + 2)]
                req = stats[hung * NSLOT + S_CURREQ]
                problems.append(f"hang: a call (req {req:#x}, category "
                                f"{CATS[stats[hung * NSLOT + S_CURCAT]]}) in flight for over {cfg.hang_s}s "
                                f"in pid {proc.pid}:\n{_stacks(proc.pid)}")
            # stop: every worker finishes its call and its children
            stop_deadline = time.monotonic() + cfg.hang_s + 30
            for i, w in enumerate(workers):
                if not dones[i].wait(max(1.0, stop_deadline - time.monotonic())):
                    problems.append(f"worker {w.pid} did not stop within {cfg.hang_s + 30}s:\n{_stacks(w.pid)}")
            vstop.value = 1
            vres = vconn.recv() if vconn.poll(60) else {"errors": ["victim did not answer"], "nerrors": 1}
            summ = summarize(stats, nrows)
            summ["timeslice_sets"] = ts_sets
            report.update(summ)
            report["victim"] = vres
            report["wall_s"] = round(time.monotonic() - t_start, 1)
            viol = "".join(v.value.decode(errors="replace") for v in shared["viol"])
            report["fuzzer_notes"] = [n.value.decode(errors="replace") for n in shared["notes"] if n.value]
            if summ["foreign_ok"] or viol:
                problems.append(f"calls naming B's handles passed ({summ['foreign_ok']}):\n{viol[:1500]}")
            if vres.get("nerrors"):
                problems.append(f"the victim in B saw errors: {vres['errors']}")

            # B untouched: its objects are listed and its channel is not disabled
            objs = {(o["client"], o["handle"]) for o in nl.objects(B.name)}
            for h in (foreign["tsg"], foreign["channel"]):
                if (foreign["client"], h) not in objs:
                    problems.append(f"B's object {h:#x} is gone from the registry")
            eng = [c for c in nvstub.read_engine() if c.client == foreign["client"] and c.channel == foreign["channel"]]
            if eng and eng[0].timeslice_us != foreign["timeslice_us"]:
                problems.append(f"B's timeslice changed: {foreign['timeslice_us']} -> {eng[0].timeslice_us} us")
            if not eng:
                problems.append("B's channel is gone from the stand-in")
            elif eng[0].disabled:
                problems.append("B's channel was disabled")

            # the accounting, with every process still holding its files (the samples above
            # compared it while the threads were parked)
            a_used, b_used = check_limit("after the stop"), B.get()["mem_used"]
            report["held_during"] = {"a_used": a_used, "b_used": b_used, "standin": _standin_bytes(pool0)}
            report["samples"] = {k: v for k, v in sampling.items() if k != "last"}
            report["samples"]["last"] = sampling["last"]
            if b_used != foreign["held"]:
                problems.append(f"B's used is {b_used}, its process holds {foreign['held']}")
            problems.extend(over_limit)
            release.set()
            for w in workers:
                w.join(60)
                if w.is_alive():
                    problems.append(f"worker {w.pid} did not exit:\n{_stacks(w.pid)}")
                    w.kill()
                    w.join(10)
            d = A.get()
            report["after_a_exit"] = {"a_used": d["mem_used"], "pids": d.get("pids", []),
                                      "standin": _standin_bytes(pool0)}
            if d["mem_used"] or d.get("pids"):
                problems.append(f"A after its processes are gone: used {d['mem_used']}, pids {d.get('pids')}")
            if _standin_bytes(pool0) != B.get()["mem_used"]:
                problems.append(f"after A's processes: the stand-in holds {_standin_bytes(pool0)} bytes, "
                                f"B.used {B.get()['mem_used']}")
            vconn.send("check")
            post = vconn.recv() if vconn.poll(60) else {"post": ["victim did not answer"]}
            if post["post"]:
                problems.append(f"B's objects after the fuzz: {post['post']}")
            vconn.send("exit")
            victim.join(60)
            os.close(export_fd)  # the last holder of B's export file: what it held goes
            export_fd = -1
            if B.get()["mem_used"] or _standin_bytes(pool0):
                problems.append(f"after all: B.used {B.get()['mem_used']}, stand-in {_standin_bytes(pool0)} bytes")
        # Instance.__exit__ deleted both: EBUSY there (a leaked open file) raises
    finally:
        if export_fd >= 0:
            os.close(export_fd)
        if own_nl:
            nl.close()
    report["wall_s"] = round(time.monotonic() - t_start, 1)
    return report


def format_report(rep: dict) -> str:
    lines = [f"ioctl fuzz [{rep['mode']}{' +races' if rep.get('races') else ''}] seed={rep['seed']} "
             f"calls={rep.get('calls', 0)} in {rep.get('seconds')}s "
             f"({rep.get('procs')} procs x {rep.get('threads')} threads, wall {rep.get('wall_s')}s)"]
    if "per_category" in rep:
        lines.append("  per category: " + ", ".join(f"{k}={v} (ok {rep['ok_per_category'][k]})"
                                                    for k, v in rep["per_category"].items()))
        named = {k: v for k, v in rep["per_escape"].items() if not k.startswith(("ESC_0x", "uvm 0x"))}
        unnamed = [v for k, v in rep["per_escape"].items() if k.startswith(("ESC_0x", "uvm 0x"))]
        lines.append("  per escape: " + ", ".join(f"{k}={v}" for k, v in named.items())
                     + f", unknown escapes and UVM commands={sum(unnamed)} ({len(unnamed)} distinct)")
        lines.append("  errno: " + ", ".join(f"{k}={v}" for k, v in rep["errno"].items()))
        lines.append(f"  sessions={rep['sessions']} forks={rep['forks']} kills={rep['kills']} execs={rep['execs']} "
                     f"mmaps={rep['mmaps']} closes={rep['closes']} dup2s={rep['dup2s']} protects={rep['protects']} "
                     f"max_call_ms={rep['max_call_ms']} slow={rep['slow_calls']} py_errors={rep['py_errors']} "
                     f"timeslice_sets={rep.get('timeslice_sets')} one_sided_calls={rep.get('one_sided_calls')} "
                     f"register_fd_other_process={rep.get('register_fd_other_process')} "
                     f"proc_fd_reads={rep['proc_fd_reads']} "
                     f"(real device files seen through /proc: {rep['proc_fd_real']})")
        lines.append(f"  victim: {rep.get('victim')}")
        lines.append(f"  accounting while held: {rep.get('held_during')}; after A exited: {rep.get('after_a_exit')}")
        if rep.get("samples"):
            lines.append(f"  accounting samples: {rep['samples']}")
    for n in rep.get("fuzzer_notes", [])[:2]:
        lines.append("  fuzzer note: " + n[:600])
    for p in rep.get("problems", []):
        lines.append("  PROBLEM: " + p)
    return "\n".join(lines)


def _kernel_bugs(since_lines: int) -> tuple[int, list[str]]:
    """(lines in the kernel log now, the first report in it after since_lines)."""
    import re
    import subprocess

    bad = re.compile(r"BUG:|Oops|WARNING:|general protection|KASAN|list_del corruption|list_add corruption|"
                     r"usercopy:|Poison overwritten|Redzone|Freepointer corrupt|INFO: task .* blocked|soft lockup")
    lines = subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()
    hits = [i for i, ln in enumerate(lines) if i >= since_lines and bad.search(ln)]
    return len(lines), lines[hits[0]:hits[0] + 30] if hits else []


def run_seeds(first: int, n: int, seconds: float, sample_calls: int, jsonl: str | None) -> int:
    """The accounting mode for seeds first .. first + n - 1, one after the other in this
    guest (scripts/fuzz-seeds.sh); prints each seed's report and `seeds passed: K/N`."""
    failing: list[tuple[int, str]] = []
    logn, _ = _kernel_bugs(0)
    for seed in range(first, first + n):
        try:
            rep = run(FuzzConfig(seed=seed, seconds=seconds, mode="accounting", sample_calls=sample_calls,
                                 log=lambda m: print("  " + m, flush=True)))
        except Exception as e:  # noqa: BLE001 - a broken run is a failing seed, the next one runs
            import traceback

            rep = {"seed": seed, "mode": "accounting", "problems": [f"the run raised {type(e).__name__}: {e}\n"
                                                                   + traceback.format_exc(limit=4)]}
        logn, bug = _kernel_bugs(logn)
        if bug:
            rep["problems"].append("the kernel logged a bug during the run:\n" + "\n".join(bug))
        print(format_report(rep), flush=True)
        if jsonl:
            with open(jsonl, "a") as f:
                f.write(json.dumps({"test": "ioctl_accounting_seed", **rep}, default=str) + "\n")
        if rep["problems"]:
            failing.append((seed, rep["problems"][0].splitlines()[0][:300]))
        print(f"SEED {seed} {'FAIL' if rep['problems'] else 'pass'} calls={rep.get('calls', 0)} "
              f"samples={rep.get('samples', {}).get('samples')}", flush=True)
    print(f"seeds passed: {n - len(failing)}/{n}")
    for seed, why in failing:
        print(f"failing seed {seed}: {why}")
    return 1 if failing else 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--mode", choices=("accounting", "chaos"), default="accounting")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--races", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sample-calls", type=int, default=FuzzConfig.sample_calls,
                    help="accounting: compare the pools every this many calls (0: at the end only)")
    ap.add_argument("--seeds", type=int, default=0,
                    help="accounting mode for this many consecutive seeds from --seed (default 1); "
                         "prints 'seeds passed: K/N' (scripts/fuzz-seeds.sh)")
    ap.add_argument("--jsonl", default=None, help="with --seeds: append each seed's report here")
    a = ap.parse_args()
    if a.seeds:
        raise SystemExit(run_seeds(a.seed if a.seed is not None else 1, a.seeds, a.seconds, a.sample_calls,
                                   a.jsonl))
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    rep = run(FuzzConfig(seed=seed, seconds=a.seconds, mode=a.mode, procs=a.procs, threads=a.threads,
                         races=a.races, sample_calls=a.sample_calls))
    print(format_report(rep), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rep, indent=1, default=str))
    raise SystemExit(1 if rep["problems"] else 0)
