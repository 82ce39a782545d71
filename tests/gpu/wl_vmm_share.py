"""Shareable VMM handles (cuMemExportToShareableHandle with a POSIX fd), driver API through
ctypes; prints one JSON line (issue 15).

  wl_vmm_share.py same [MIB]       export a cuMemCreate allocation and import the fd in the
                                   same process; both mappings must see the same bytes
  wl_vmm_share.py fork [MIB]       export, then a child process (fd passed, same environment)
                                   imports it and reads what the parent wrote
  wl_vmm_share.py other [MIB]      the same with the child in another instance
                                   (GPUSLICE_INSTANCE + "-other")
  wl_vmm_share.py child FD MIB     (the child)

Run it plain and with LD_PRELOAD=preload/libgpuslice.so GPUSLICE_DEBUG=1: the library
refuses nothing it decides on in "same" and "fork" (the child's library finds the file
among its instance's exports, preload/siblings.c); in "other" the child's import is refused.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

MIB = 1 << 20
POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", Location), ("flags", ctypes.c_ulonglong)]


class Cuda:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.call("cuInit", 0)
        dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), 0)
        ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self.call("cuCtxSetCurrent", ctx)
        self.prop = Prop(type=1, requestedHandleTypes=POSIX_FD, location=Location(1, 0))

    def err(self, rc: int) -> str:
        s = ctypes.c_char_p()
        self.lib.cuGetErrorName(rc, ctypes.byref(s))
        return (s.value or b"?").decode()

    def call(self, name: str, *args) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc:
            raise RuntimeError(f"{name}: {self.err(rc)}")

    def create(self, size: int) -> int:
        h = ctypes.c_ulonglong()
        self.call("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(self.prop), 0)
        return h.value

    def map(self, h: int, size: int) -> int:
        ptr = ctypes.c_ulonglong()
        self.call("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                  ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
        self.call("cuMemMap", ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_ulonglong(h),
                  ctypes.c_ulonglong(0))
        desc = AccessDesc(Location(1, 0), 3)  # PROT_READWRITE
        self.call("cuMemSetAccess", ptr, ctypes.c_size_t(size), ctypes.byref(desc), ctypes.c_size_t(1))
        return ptr.value

    def export(self, h: int) -> int:
        fd = ctypes.c_int(-1)
        self.call("cuMemExportToShareableHandle", ctypes.byref(fd), ctypes.c_ulonglong(h), POSIX_FD,
                  ctypes.c_ulonglong(0))
        return fd.value

    def import_(self, fd: int) -> int:
        h = ctypes.c_ulonglong()
        self.call("cuMemImportFromShareableHandle", ctypes.byref(h), ctypes.c_void_p(fd), POSIX_FD)
        return h.value

    def fill(self, ptr: int, val: int, size: int) -> None:
        self.call("cuMemsetD8_v2", ctypes.c_ulonglong(ptr), ctypes.c_ubyte(val), ctypes.c_size_t(size))
        self.call("cuCtxSynchronize")

    def check(self, ptr: int, val: int, size: int) -> bool:
        buf = (ctypes.c_ubyte * size)()
        self.call("cuMemcpyDtoH_v2", buf, ctypes.c_ulonglong(ptr), ctypes.c_size_t(size))
        return bytes(buf) == bytes([val]) * size


def same(mib: int) -> dict:
    cu = Cuda()
    size = mib * MIB
    h = cu.create(size)
    p1 = cu.map(h, size)
    cu.fill(p1, 0x5A, size)
    fd = cu.export(h)
    h2 = cu.import_(fd)
    p2 = cu.map(h2, size)
    ok = cu.check(p2, 0x5A, size)
    cu.fill(p2, 0xA5, size)
    ok = ok and cu.check(p1, 0xA5, size)
    return {"mode": "same", "mib": mib, "ok": ok, "fd": fd}


def fork(mib: int, other: bool = False) -> dict:
    cu = Cuda()
    size = mib * MIB
    h = cu.create(size)
    p1 = cu.map(h, size)
    cu.fill(p1, 0x3C, size)
    fd = cu.export(h)
    env = dict(os.environ)
    if other:
        env["GPUSLICE_INSTANCE"] = env.get("GPUSLICE_INSTANCE", "default") + "-other"
    r = subprocess.run([sys.executable, __file__, "child", str(fd), str(mib)], pass_fds=(fd,),
                       capture_output=True, text=True, timeout=120, env=env)
    child = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"error": r.stderr[-400:]}
    return {"mode": "other" if other else "fork", "mib": mib, "child": child, "child_stderr": r.stderr.strip().splitlines()[-5:]}


def child(fd: int, mib: int) -> dict:
    cu = Cuda()
    size = mib * MIB
    try:
        h = cu.import_(fd)
    except RuntimeError as e:
        return {"imported": False, "error": str(e)}
    p = cu.map(h, size)
    return {"imported": True, "ok": cu.check(p, 0x3C, size)}


def main() -> None:
    mode = sys.argv[1]
    if mode == "child":
        out = child(int(sys.argv[2]), int(sys.argv[3]))
    else:
        mib = int(sys.argv[2]) if len(sys.argv) > 2 else 64
        try:
            out = same(mib) if mode == "same" else fork(mib, other=mode == "other")
        except RuntimeError as e:
            out = {"mode": mode, "error": str(e)}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
