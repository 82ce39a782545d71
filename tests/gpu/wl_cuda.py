"""CUDA driver API workloads (ctypes on libcuda.so.1); each prints one JSON line.

  wl_cuda.py alloc CHUNK_MIB     cuMemGetInfo, cuMemAlloc until CUDA_ERROR_OUT_OF_MEMORY
  wl_cuda.py vmm CHUNK_MIB       the same with cuMemCreate (the VMM API)
  wl_cuda.py managed MIB         cuMemAllocManaged + cuMemsetD8: is it counted?
  wl_cuda.py ctxtime             seconds from cuInit to a usable primary context
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

CUDA_ERROR_OUT_OF_MEMORY = 2
cu = ctypes.CDLL("libcuda.so.1")
u64 = ctypes.c_uint64


def check(r: int, what: str) -> None:
    if r != 0:
        raise RuntimeError(f"{what} failed: {r}")


def context() -> float:
    t0 = time.perf_counter()
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    p = u64()
    check(cu.cuMemAlloc_v2(ctypes.byref(p), 1), "cuMemAlloc")  # forces full initialisation
    check(cu.cuMemFree_v2(p), "cuMemFree")
    return time.perf_counter() - t0


def meminfo() -> tuple[int, int]:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    return free.value, total.value


def alloc(chunk_mib: int) -> dict:
    context()
    free0, total0 = meminfo()
    ptrs, err = [], 0
    while len(ptrs) < 100000:
        p = u64()
        err = cu.cuMemAlloc_v2(ctypes.byref(p), chunk_mib << 20)
        if err:
            break
        ptrs.append(p)
    free1, total1 = meminfo()
    for p in ptrs:
        check(cu.cuMemFree_v2(p), "cuMemFree")
    free2, total2 = meminfo()
    return {"total0": total0, "free0": free0, "allocated": len(ptrs) * (chunk_mib << 20), "error": err,
            "total1": total1, "free1": free1, "total2": total2, "free2": free2}


class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class Flags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Loc),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", Flags)]


def vmm(chunk_mib: int) -> dict:
    context()
    prop = Prop()
    prop.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = 1  # CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    gran = ctypes.c_size_t()
    check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
    size = max(chunk_mib << 20, gran.value)
    size = (size + gran.value - 1) // gran.value * gran.value
    free0, total0 = meminfo()
    hs, err = [], 0
    while len(hs) < 100000:
        h = u64()
        err = cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), u64(0))
        if err:
            break
        hs.append(h)
    free1, total1 = meminfo()
    for h in hs:
        check(cu.cuMemRelease(h), "cuMemRelease")
    free2, _ = meminfo()
    return {"granularity": gran.value, "total0": total0, "free0": free0, "allocated": len(hs) * size,
            "error": err, "total1": total1, "free1": free1, "free2": free2}


def managed(mib: int) -> dict:
    context()
    free0, total0 = meminfo()
    p = u64()
    err = cu.cuMemAllocManaged(ctypes.byref(p), ctypes.c_size_t(mib << 20), 1)
    out = {"total0": total0, "free0": free0, "alloc_error": err}
    if err == 0:
        check(cu.cuMemsetD8_v2(p, 1, ctypes.c_size_t(mib << 20)), "cuMemsetD8")
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        out["free_touched"], out["total_touched"] = meminfo()
        check(cu.cuMemFree_v2(p), "cuMemFree")
    out["free_after"], _ = meminfo()
    return out


def main() -> None:
    mode = sys.argv[1]
    if mode == "alloc":
        out = alloc(int(sys.argv[2]))
    elif mode == "vmm":
        out = vmm(int(sys.argv[2]))
    elif mode == "managed":
        out = managed(int(sys.argv[2]))
    elif mode == "ctxtime":
        out = {"ctx_seconds": context()}
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
