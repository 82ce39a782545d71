"""Video memory that nvidia-uvm takes for page tables alone: UVM_MAP_DYNAMIC_PARALLELISM_REGION
(65) of a 4 KiB region every 2 MiB of address space makes UVM allocate a page table per
region, pinned (580 uvm_pmm_gpu.c, UVM_PMA_ALLOCATE_PINNED), with no memory behind it and
no RM object to count. The core caps such regions per instance (kmod/core/uvm.c,
GS_MAX_UVM_REGIONS).

  uvm_regions.py N       N regions on libcuda's nvidia-uvm fd, then UVM_FREE of each

Prints one JSON object: how many the driver (or the library) accepted, the first refusal,
and the GPU's used memory from nvidia-smi in a child without LD_PRELOAD (the device's
figure, also under the library) before, after and after the frees. Needs a GPU.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from uvm_hole import (  # noqa: E402
    MIB, UVM_FREE, NoGpu, cbuf, cuda_init, ioctl, result, sname, smi_used_mib, uvm_fds, uvm_range,
)

UVM_MAP_DYNAMIC_PARALLELISM_REGION = 65
DP = struct.Struct("<QQ16sI4x")  # base, length, gpuUuid, rmStatus (40)
PROT_NONE, MAP_NORESERVE = 0, 0x4000  # not in Python's mmap module everywhere
REGION = 4096
STRIDE = 2 * MIB


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    out: dict = {"n": n, "limit": os.environ.get("GPUSLICE_MEM_LIMIT"),
                 "preload": os.environ.get("LD_PRELOAD")}
    try:
        _cu, uuid, uuid_str = cuda_init()
    except NoGpu as e:
        print(json.dumps({"error": str(e)}))
        return 2
    fd = next((f["fd"] for f in uvm_fds() if f["ok"]), None)
    if fd is None:
        print(json.dumps({**out, "error": "no initialized nvidia-uvm fd"}))
        return 1
    # address space for the regions, reserved so that nothing else lands there
    span = (n + 1) * STRIDE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    addr = libc.mmap(None, span, PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        print(json.dumps({**out, "error": "mmap of the address space failed"}))
        return 1
    base0 = (addr + STRIDE - 1) // STRIDE * STRIDE
    out["before_smi_mib"] = smi_used_mib(uuid_str)
    made, first_refusal = [], None
    for i in range(n):
        base = base0 + i * STRIDE
        buf = cbuf(DP.pack(base, REGION, uuid, 0))
        r, e = ioctl(fd, UVM_MAP_DYNAMIC_PARALLELISM_REGION, buf)
        st = DP.unpack_from(buf.raw, 0)[3]
        if r != 0 or st != 0:
            first_refusal = {"i": i, **result(r, e, st)}
            break
        made.append(base)
    out["made"] = len(made)
    out["first_refusal"] = first_refusal
    out["after_smi_mib"] = smi_used_mib(uuid_str)
    freed = sum(1 for b in made if uvm_range(fd, UVM_FREE, b, REGION)["ok"])
    out["freed"] = freed
    out["after_free_smi_mib"] = smi_used_mib(uuid_str)
    if out["before_smi_mib"] is not None and out["after_smi_mib"] is not None:
        out["held_mib"] = out["after_smi_mib"] - out["before_smi_mib"]
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
