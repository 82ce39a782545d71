"""Video memory nvidia-uvm takes for the page tables of mappings: one allocation of CHUNK_MIB,
mapped N times into external ranges whose base is 4 KiB off a 2 MiB boundary, so that UVM
maps it with 4 KiB pages (580 uvm_map_external.c: the page size is the largest that base,
length, offset and the allocation's pages allow) and allocates 4 KiB of pinned page table
per 2 MiB per mapping, counted by no one. The core charges every mapping after an
allocation's first for its page tables (kmod/core/uvm.c).

  uvm_remap.py CHUNK_MIB N

Prints one JSON object: maps made, the first refusal, and the GPU's used memory from
nvidia-smi in a child without LD_PRELOAD (the device's figure) before, after the maps and
after the frees. Needs a GPU.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from uvm_hole import (  # noqa: E402
    MEM_BASE, MIB, UVM_CREATE_EXTERNAL_RANGE, UVM_FREE, NoGpu, Rm, cuda_init, reserve_va,
    smi_used_mib, uvm_fds, uvm_map, uvm_range,
)

OFF = 4096  # off a 2 MiB boundary: 4 KiB pages


def main() -> int:
    chunk, n = int(sys.argv[1]), int(sys.argv[2])
    size = chunk * MIB
    out: dict = {"chunk_mib": chunk, "n": n, "limit": os.environ.get("GPUSLICE_MEM_LIMIT"),
                 "preload": os.environ.get("LD_PRELOAD")}
    try:
        _cu, uuid, uuid_str = cuda_init()
    except NoGpu as e:
        print(json.dumps({**out, "error": str(e)}))
        return 2
    fd = next((f["fd"] for f in uvm_fds() if f["ok"]), None)
    rm = Rm()
    h = MEM_BASE
    out["alloc"] = rm.alloc_vidmem(h, size)
    out["before_smi_mib"] = smi_used_mib(uuid_str)
    made, refusal = [], None
    for i in range(n):
        base, _start, _span = reserve_va(size + OFF)
        r = uvm_range(fd, UVM_CREATE_EXTERNAL_RANGE, base, size + OFF)
        if not r["ok"]:
            refusal = {"i": i, "step": "create_external_range", **r}
            break
        m = uvm_map(fd, base + OFF, size, uuid, rm.ctl, rm.client, h)
        if not m["ok"]:
            refusal = {"i": i, "step": "map", **m}
            uvm_range(fd, UVM_FREE, base, size + OFF)
            break
        made.append(base)
    out["made"] = len(made)
    out["first_refusal"] = refusal
    out["after_smi_mib"] = smi_used_mib(uuid_str)
    out["freed"] = sum(1 for b in made if uvm_range(fd, UVM_FREE, b, size + OFF)["ok"])
    out["after_free_smi_mib"] = smi_used_mib(uuid_str)
    if out["before_smi_mib"] is not None and out["after_smi_mib"] is not None:
        out["page_tables_mib"] = out["after_smi_mib"] - out["before_smi_mib"]
    rm.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
