"""CUDA's legitimate uses of nvidia-uvm and of released memory, each repeated past a memory
limit: what a fix for the nvidia-uvm hole (uvm_hole.py) must keep working. Run it natively
and under LD_PRELOAD=preload/libgpuslice.so GPUSLICE_MEM_LIMIT=4G; every case must pass
in both (with a working release of charges every cycle fits under the limit).

  uvm_legit.py [--cases managed,vmm,async_cupy,async_torch,malloc_torch] [--scale F]

Cases (each in its own process, one JSON line each:
{"case", "ok", "cycles", "error", ...}):
  managed       cudaMallocManaged (cupy.cuda.malloc_managed) of 384 MiB, prefetched to the
                GPU, written by two kernels (fill, add), checked, freed; 12 times
  vmm           cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess, cuMemsetD8,
                check, cuMemUnmap, cuMemRelease, cuMemAddressFree of 1024 MiB; 16 times
                (16 GiB in all, 4x a 4 GiB limit). CUDA maps each through
                UVM_MAP_EXTERNAL_ALLOCATION, the call the hole abuses
  async_cupy    cudaMallocAsync pool (cupy.cuda.MemoryAsyncPool): 4 x 512 MiB arrays
                written, summed, dropped, then the pool trimmed (free_all_blocks,
                cudaMemPoolTrimTo 0); 8 times
  async_torch   the same with PyTorch, PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync,
                torch.cuda.empty_cache() as the trim; 8 times
  malloc_torch  plain cudaMalloc/cudaFree (PyTorch's native allocator): 2 x 1024 MiB
                tensors, del, torch.cuda.empty_cache(); 8 times
--scale multiplies the number of cycles. A case whose framework is missing says so
("skipped"). Exit status 0 when every case that ran is ok. NVML's used memory (when
pynvml is there) is sampled after each cycle's allocation and after the last release.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
CASES = ("managed", "vmm", "async_cupy", "async_torch", "malloc_torch")


class Used:
    """NVML's used memory of GPU 0, or None without pynvml."""

    def __init__(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001
            self.h = None
        self.peak: float | None = None

    def __call__(self) -> float | None:
        if self.h is None:
            return None
        v = self.nv.nvmlDeviceGetMemoryInfo(self.h).used / MIB
        self.peak = v if self.peak is None else max(self.peak, v)
        return v


def run_cycles(out: dict, want: int, body) -> None:
    """body(i) runs cycle i; out gets cycles done, ok and the first error."""
    used = Used()
    out["used_before_mib"] = used()
    t0 = time.monotonic()
    out["cycles"] = 0
    try:
        for i in range(want):
            body(i, used)
            out["cycles"] = i + 1
    except Exception as e:  # noqa: BLE001
        out["error"] = f"cycle {out['cycles']}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    out["seconds"] = round(time.monotonic() - t0, 2)
    out["used_peak_mib"] = used.peak
    out["used_after_mib"] = used()
    out["ok"] = out["error"] is None and out["cycles"] == want


def case_managed(out: dict, cycles: int) -> None:
    import cupy

    size = 384 * MIB
    out.update(chunk_mib=384, want_cycles=cycles, total_mib=384 * cycles)
    cupy.zeros(1)  # the context
    cupy.cuda.runtime.deviceSynchronize()

    def body(i: int, used) -> None:
        m = cupy.cuda.malloc_managed(size)
        a = cupy.ndarray((size // 4,), dtype=cupy.float32, memptr=m)
        cupy.cuda.runtime.memPrefetchAsync(m.ptr, size, 0, 0)
        a.fill(float(i))
        a += 1.0
        cupy.cuda.runtime.deviceSynchronize()
        used()
        sample = a[:: 1 << 16]
        if not bool((sample == float(i + 1)).all()):
            raise RuntimeError("managed data wrong")
        del a, sample, m
        cupy.cuda.runtime.deviceSynchronize()

    run_cycles(out, cycles, body)


def case_vmm(out: dict, cycles: int) -> None:
    sys.path.insert(0, str(HERE))
    from wl_vmm_share import Cuda

    mib = 1024
    size = mib * MIB
    out.update(chunk_mib=mib, want_cycles=cycles, total_mib=mib * cycles)
    cu = Cuda()
    cu.prop.requestedHandleTypes = 0  # plain, not exportable

    def body(i: int, used) -> None:
        h = cu.create(size)
        try:
            p = cu.map(h, size)  # reserve, map, set access
        except RuntimeError:
            cu.call("cuMemRelease", ctypes.c_ulonglong(h))
            raise
        val = (i * 7 + 1) & 0xFF
        cu.fill(p, val, size)
        used()
        ok = cu.check(p, val, MIB)
        cu.call("cuMemUnmap", ctypes.c_ulonglong(p), ctypes.c_size_t(size))
        cu.call("cuMemRelease", ctypes.c_ulonglong(h))
        cu.call("cuMemAddressFree", ctypes.c_ulonglong(p), ctypes.c_size_t(size))
        if not ok:
            raise RuntimeError("vmm data wrong")

    run_cycles(out, cycles, body)


def case_async_cupy(out: dict, cycles: int) -> None:
    import cupy

    mib, per = 512, 4
    out.update(chunk_mib=mib, per_cycle=per, want_cycles=cycles, total_mib=mib * per * cycles)
    pool = cupy.cuda.MemoryAsyncPool()
    cupy.cuda.set_allocator(pool.malloc)
    n = mib * MIB // 4

    def body(i: int, used) -> None:
        arrs = []
        for j in range(per):
            a = cupy.empty((n,), dtype=cupy.float32)
            a.fill(float(j + 1))
            arrs.append(a)
        s = sum(float(a[:: 1 << 16].sum()) for a in arrs)
        want = sum((j + 1) * len(range(0, n, 1 << 16)) for j in range(per))
        used()
        del arrs, a
        cupy.cuda.get_current_stream().synchronize()
        pool.free_all_blocks()  # cudaMemPoolTrimTo(pool, 0)
        try:
            rt = cupy.cuda.runtime
            rt.memPoolTrimTo(rt.deviceGetMemPool(0), 0)
        except Exception as e:  # noqa: BLE001  (free_all_blocks trimmed already)
            out.setdefault("trim_error", f"{type(e).__name__}: {e}")
        if s != want:
            raise RuntimeError(f"async pool data wrong: {s} != {want}")

    out["allocator"] = "cupy.cuda.MemoryAsyncPool"
    run_cycles(out, cycles, body)


def _torch_cycles(out: dict, cycles: int, mib: int, per: int) -> None:
    import torch

    out.update(chunk_mib=mib, per_cycle=per, want_cycles=cycles, total_mib=mib * per * cycles,
               alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    torch.empty(1, device="cuda")
    try:
        out["allocator"] = torch.cuda.get_allocator_backend()
    except AttributeError:
        out["allocator"] = None

    def body(i: int, used) -> None:
        ts = []
        for j in range(per):
            t = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda")
            t.fill_(j + 1)
            ts.append(t)
        torch.cuda.synchronize()
        used()
        ok = all(int(t[:: 1 << 20].sum().item()) == (j + 1) * len(range(0, mib * MIB, 1 << 20))
                 for j, t in enumerate(ts))
        del ts, t
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if not ok:
            raise RuntimeError("torch data wrong")

    run_cycles(out, cycles, body)
    out["reserved_after"] = torch.cuda.memory_reserved()


def case_async_torch(out: dict, cycles: int) -> None:
    _torch_cycles(out, cycles, 512, 4)
    if out.get("allocator") not in (None, "cudaMallocAsync"):
        out["ok"] = False
        out["error"] = out["error"] or f"allocator is {out['allocator']}, not cudaMallocAsync"


def case_malloc_torch(out: dict, cycles: int) -> None:
    _torch_cycles(out, cycles, 1024, 2)


DEFAULT_CYCLES = {"managed": 12, "vmm": 16, "async_cupy": 8, "async_torch": 8, "malloc_torch": 8}
FUNCS = {"managed": case_managed, "vmm": case_vmm, "async_cupy": case_async_cupy,
         "async_torch": case_async_torch, "malloc_torch": case_malloc_torch}
MODULE = {"managed": "cupy", "async_cupy": "cupy", "async_torch": "torch", "malloc_torch": "torch"}


def one(case: str, cycles: int) -> dict:
    out: dict = {"case": case, "ok": False, "cycles": 0, "error": None,
                 "limit": os.environ.get("GPUSLICE_MEM_LIMIT"), "preload": bool(os.environ.get("LD_PRELOAD"))}
    mod = MODULE.get(case)
    if mod:
        try:
            __import__(mod)
        except Exception as e:  # noqa: BLE001
            out.update(skipped=True, error=f"{mod} not usable: {type(e).__name__}: {e}")
            return out
    try:
        FUNCS[case](out, cycles)
    except Exception as e:  # noqa: BLE001
        out["error"] = out.get("error") or f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        out["ok"] = False
    return out


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--one"]:
        print(json.dumps(one(argv[1], int(argv[2]))), flush=True)
        return 0
    cases, scale = list(CASES), 1.0
    i = 0
    while i < len(argv):
        if argv[i] == "--cases":
            cases = argv[i + 1].split(",")
            i += 2
        elif argv[i] == "--scale":
            scale = float(argv[i + 1])
            i += 2
        else:
            print("usage: uvm_legit.py [--cases " + ",".join(CASES) + "] [--scale F]", file=sys.stderr)
            return 64
    if not os.path.exists("/dev/nvidiactl"):
        print("uvm_legit: no GPU: /dev/nvidiactl does not exist", file=sys.stderr)
        print(json.dumps({"case": "all", "ok": False, "cycles": 0, "error": "no GPU"}), flush=True)
        return 2
    bad = 0
    for case in cases:
        if case not in FUNCS:
            print(f"uvm_legit: unknown case {case}", file=sys.stderr)
            return 64
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if case == "async_torch":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
        cycles = max(1, round(DEFAULT_CYCLES[case] * scale))
        try:
            p = subprocess.run([sys.executable, __file__, "--one", case, str(cycles)], env=env,
                               capture_output=True, text=True, timeout=120)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            res = json.loads(lines[-1]) if lines else {
                "case": case, "ok": False, "cycles": 0,
                "error": f"no result (rc {p.returncode}): {p.stderr.strip()[-400:]}"}
            if p.returncode and not lines:
                res["rc"] = p.returncode
        except subprocess.TimeoutExpired:
            res = {"case": case, "ok": False, "cycles": 0, "error": "timed out after 120 s"}
        print(json.dumps(res), flush=True)
        bad += not res["ok"] and not res.get("skipped")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
