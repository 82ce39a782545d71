"""Measures what managed memory does on the real driver (issue 10, nvidia-uvm): whether a
CUDA context or cudaMallocManaged maps /dev/nvidia-uvm, and whether managed memory moved to
the GPU shows in RM's per-process count (GPU_GET_PID_INFO, what `gpuctl guard` reads) and in
the GPU's used memory (NVML); and whether another process's cudaMalloc still gets memory
that managed pages occupy (RM evicts them to system memory, uvm_pmm_gpu.c). Prints one JSON
object. Needs CuPy, PyTorch and a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "pyctl"))


def uvm_maps() -> tuple[int, int]:
    n = size = 0
    for line in open("/proc/self/maps"):
        if "nvidia-uvm" in line:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            n += 1
            size += hi - lo
    return n, size


def main() -> None:
    import cupy
    import pynvml

    from gpuslice.sched.rm import RmClient

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    rm = RmClient().open()
    out: dict = {"before_ctx_uvm_maps": uvm_maps()}
    cupy.zeros(1)
    cupy.cuda.runtime.deviceSynchronize()
    out["after_ctx_uvm_maps"] = uvm_maps()
    out["after_ctx_rm_bytes"] = rm.pid_vidmem(0).get(os.getpid(), 0)
    used0 = pynvml.nvmlDeviceGetMemoryInfo(h).used
    size = 2 << 30
    m = cupy.cuda.malloc_managed(size)
    out["after_managed_uvm_maps"] = uvm_maps()
    a = cupy.ndarray((size // 4,), dtype=cupy.float32, memptr=m)
    cupy.cuda.runtime.memPrefetchAsync(m.ptr, size, 0, 0)
    a.fill(1.0)
    cupy.cuda.runtime.deviceSynchronize()
    out["managed_bytes"] = size
    out["after_managed_on_gpu_rm_bytes"] = rm.pid_vidmem(0).get(os.getpid(), 0)
    out["after_managed_on_gpu_nvml_used_delta"] = pynvml.nvmlDeviceGetMemoryInfo(h).used - used0
    # HMM: GPU access to any malloc'd memory, without a managed mapping
    out["pageable_memory_access"] = cupy.cuda.runtime.deviceGetAttribute(88, 0)
    a = None
    m = None
    # managed memory filling most of the GPU, then another process asks for the rest
    total = pynvml.nvmlDeviceGetMemoryInfo(h).total
    big = int(total * 0.6) // (2 << 20) * (2 << 20)
    m = cupy.cuda.malloc_managed(big)
    cupy.cuda.runtime.memPrefetchAsync(m.ptr, big, 0, 0)
    arr = cupy.ndarray((big // 4,), dtype=cupy.float32, memptr=m)
    arr.fill(2.0)
    cupy.cuda.runtime.deviceSynchronize()
    out["managed_big"] = big
    out["nvml_used_with_managed_big"] = pynvml.nvmlDeviceGetMemoryInfo(h).used
    want = int(total * 0.6) // (2 << 20) * (2 << 20)
    code = (f"import torch; x = torch.empty({want}, dtype=torch.uint8, device='cuda'); x.fill_(1); "
            "torch.cuda.synchronize(); print('ok', torch.cuda.memory_allocated())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    out["other_process_alloc"] = {"bytes": want, "rc": p.returncode, "out": p.stdout.strip()[-200:],
                                  "err": p.stderr.strip()[-300:]}
    out["managed_still_correct"] = bool(float(arr[::1 << 20].sum()) == 2.0 * len(arr[::1 << 20]))
    rm.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
