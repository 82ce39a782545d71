"""Overhead of libgpuslice.so on the real driver: prints figures, asserts nothing.

  python3 tests/gpu/bench_overhead.py [RUNS] [MATMUL_SECONDS]

CUDA context creation (cuInit to a usable primary context, in-process timer, and the
whole process's wall time) and 4096x4096 fp32 matmul throughput, each with and
without the preload (4 GiB limit), runs interleaved.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_common as g  # noqa: E402


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    secs = sys.argv[2] if len(sys.argv) > 2 else "5"
    g.build()
    ctx = {"without": [], "with": []}
    wall = {"without": [], "with": []}
    for i in range(runs):
        for mode, limit in (("without", None), ("with", "4GiB")):
            out, err, _ = g.run([str(g.HERE / "wl_cuda.py"), "ctxtime"], limit, f"ctxtime {mode} #{i}")
            ctx[mode].append(out["ctx_seconds"])
            wall[mode].append(out["_wall"])
    mm = {"without": [], "with": []}
    for i in range(2):
        for mode, limit in (("without", None), ("with", "4GiB")):
            out, err, _ = g.run([str(g.HERE / "wl_torch.py"), "matmul", secs], limit, f"matmul {mode} #{i}")
            mm[mode].append(out["per_s"])
    print(f"context creation, {runs} runs each (seconds, median [min..max]):")
    for mode in ("without", "with"):
        v = ctx[mode]
        print(f"  {mode:8s} preload: cuInit..ctx {statistics.median(v):.4f} [{min(v):.4f}..{max(v):.4f}]"
              f"  process wall {statistics.median(wall[mode]):.3f}")
    print(f"  ratio with/without (median ctx): {statistics.median(ctx['with']) / statistics.median(ctx['without']):.3f}")
    print(f"matmul 4096^2 fp32, {secs} s runs (matmuls/s):")
    for mode in ("without", "with"):
        print(f"  {mode:8s} preload: " + ", ".join(f"{x:.1f}" for x in mm[mode]))
    print(f"  ratio with/without (mean): {statistics.mean(mm['with']) / statistics.mean(mm['without']):.4f}")


if __name__ == "__main__":
    main()
