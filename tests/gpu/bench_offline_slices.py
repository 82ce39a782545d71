"""What a short hardware timeslice costs offline tenants that share a GPU with each other.

  python3 tests/gpu/bench_offline_slices.py [--seconds 8] [--slices ,250,50]

Two trainers (4096^2 fp32 matmuls, three in flight) run at once with no daemon, each under
LD_PRELOAD=preload/libgpuslice.so with GPUSLICE_TIMESLICE_US set to each value in turn
('' = RM's default), so the runlist switches between them at every slice; one trainer
alone first. Prints matmuls/s per trainer and their sum against the one alone: how much
of the GPU the switching costs (planner.OFFLINE_TIMESLICE_US is what offline TSGs get).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

LIB = Path(__file__).resolve().parent.parent.parent / "preload" / "libgpuslice.so"
LOOP = """
import sys, time, torch
a = torch.randn(4096, 4096, device="cuda")
for _ in range(5): a @ a
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
t0, n = time.monotonic(), 0
ev = []
while time.monotonic() - t0 < float(sys.argv[1]):
    a @ a
    e = torch.cuda.Event(); e.record(); ev.append(e)
    if len(ev) > 3: ev.pop(0).synchronize()
    n += 1
torch.cuda.synchronize()
print(n / (time.monotonic() - t0), flush=True)
"""


def run(n: int, slice_us: str, seconds: float) -> list[float]:
    env = {**os.environ, "LD_PRELOAD": str(LIB), "GPUSLICE_SOCKET": "/nonexistent/gs.sock",
           "GPUSLICE_TIMESLICE_US": slice_us}
    ps = [subprocess.Popen([sys.executable, "-c", LOOP, str(seconds)], env={**env, "GPUSLICE_INSTANCE": f"t{i}"},
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(n)]
    for p in ps:
        assert p.stdout.readline().strip() == "ready"
    for p in ps:  # all start together
        p.stdin.write("go\n")
        p.stdin.flush()
    rates = [float(p.stdout.readline()) for p in ps]
    for p in ps:
        p.wait(timeout=60)
    return rates


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--slices", default=",250,50")
    args = ap.parse_args()
    alone = run(1, "", args.seconds)[0]
    print(f"one trainer alone (RM's slice): {alone:.1f} matmuls/s", flush=True)
    for s in args.slices.split(","):
        rates = run(2, s, args.seconds)
        print(f"two trainers, slice {s or 'RM default':>10s} us: {rates[0]:.1f} + {rates[1]:.1f} = "
              f"{sum(rates):.1f} matmuls/s, {sum(rates) / alone:.1%} of one alone", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
