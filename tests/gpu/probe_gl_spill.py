"""Where OpenGL's textures go past an instance's limit: runs tests/gpu/compat/egl_render.py
--spill N under LD_PRELOAD=preload/libgpuslice.so with GPUSLICE_MEM_LIMIT, samples the GPU's
used memory (NVML) every 0.2 s, and prints one JSON line: the GPU memory the run added at
its peak against the limit, the library's own figures (GPUSLICE_STATS) and the workload's
(each texture's GL error and time, and whether GL still renders after).

  python3 tests/gpu/probe_gl_spill.py [--limit 4G] [--chunks 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIB = HERE.parent.parent / "preload" / "libgpuslice.so"


def main() -> None:
    import pynvml

    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", default="4G")
    ap.add_argument("--chunks", type=int, default=8)
    a = ap.parse_args()
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    base = pynvml.nvmlDeviceGetMemoryInfo(h).used
    stats = tempfile.mktemp(prefix="gs-spill-stats-")
    env = dict(os.environ, LD_PRELOAD=str(LIB), GPUSLICE_MEM_LIMIT=a.limit, GPUSLICE_INSTANCE="spill",
               GPUSLICE_STATS=stats)
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, str(HERE / "compat" / "egl_render.py"), "--spill", str(a.chunks)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = 0
    while p.poll() is None and time.monotonic() - t0 < 300:
        peak = max(peak, pynvml.nvmlDeviceGetMemoryInfo(h).used - base)
        time.sleep(0.2)
    if p.poll() is None:
        p.kill()
    out = (p.stdout.read() if p.stdout else "").strip().splitlines()
    lib = []
    if os.path.exists(stats):
        lib = [json.loads(x) for x in open(stats) if x.strip().startswith("{")]
    print(json.dumps({"limit": a.limit, "chunks": a.chunks, "rc": p.returncode,
                      "seconds": round(time.monotonic() - t0, 1), "gpu_used_added_peak": peak,
                      "library": lib, "workload": json.loads(out[-1]) if out else None}))


if __name__ == "__main__":
    main()
