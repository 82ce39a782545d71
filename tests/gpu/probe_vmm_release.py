"""Probe (a reviewer's finding, session 17): memory that nvidia-uvm keeps alive after its
RM handle is freed. cuMemMap has UVM duplicate the physical allocation into UVM's own RM
client (580 kernel-open/nvidia-uvm/uvm_map_external.c, nvUvmInterfaceDupMemory), and
cuMemRelease before cuMemUnmap is legal: RM_FREE of the tenant's handle succeeds, the
core uncharges it, and the memory lives on under UVM's client.

  probe_vmm_release.py CHUNK_MIB N   N times: cuMemCreate, cuMemMap, fill, cuMemRelease;
                                     then check every range still holds its bytes.
Prints one JSON line: how many chunks were mapped, whether their bytes survived, and
this process's video memory as NVML (RM's per-process count) shows it, after each step.
Run it under LD_PRELOAD=preload/libgpuslice.so GPUSLICE_MEM_LIMIT=...: a chunk count
times the chunk size above the limit is the gap.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wl_vmm_share import MIB, Cuda  # noqa: E402


def rm_count_mib() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid():
                return (p.usedGpuMemory or 0) // MIB
        return 0
    except Exception:  # noqa: BLE001
        return None


def main() -> None:
    mib, n = int(sys.argv[1]), int(sys.argv[2])
    cu = Cuda()
    size = mib * MIB
    ptrs, steps, error = [], [], None
    for i in range(n):
        try:
            h = cu.create(size)
            p = cu.map(h, size)
            cu.fill(p, (i + 1) & 0xFF, size)
            cu.call("cuMemRelease", __import__("ctypes").c_ulonglong(h))
        except RuntimeError as e:
            error = f"chunk {i}: {e}"
            break
        ptrs.append(p)
        steps.append({"chunk": i, "rm_mib": rm_count_mib()})
    intact = all(cu.check(p, (i + 1) & 0xFF, 1 << 20) for i, p in enumerate(ptrs))
    print(json.dumps({"chunk_mib": mib, "mapped": len(ptrs), "mapped_mib": len(ptrs) * mib,
                      "limit": os.environ.get("GPUSLICE_MEM_LIMIT"), "intact": intact, "error": error,
                      "steps": steps}), flush=True)


if __name__ == "__main__":
    main()
