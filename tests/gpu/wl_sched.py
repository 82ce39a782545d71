"""A matmul loop for the scheduler benchmark (tests/gpu/bench_sched.py, test_sched.py).

  wl_sched.py SIZE CTLFILE OUTFILE

Allocates two SIZE x SIZE fp32 matrices, warms up, prints {"ready": pid}, then loops:
reads CTLFILE ("run", "pause" or "exit"; re-read before every matmul), and while
"run" does one matmul + torch.cuda.synchronize() and records the completion time
(CLOCK_MONOTONIC, seconds, the clock the harness and the daemon use). The times are
appended to OUTFILE as native doubles every 0.25 s and at exit, so a killed run still
leaves its data.

GPUSLICE_FAKE_WORKLOAD=1 replaces the GPU by a sleep of about the H100's time per
matmul (local dry runs of the harness only; never used for reported figures).
"""

from __future__ import annotations

import json
import os
import sys
import time
from array import array


def main() -> None:
    size, ctl, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    fake = os.environ.get("GPUSLICE_FAKE_WORKLOAD") == "1"
    if fake:
        dt = 2.66e-3 * (size / 4096) ** 3

        def step() -> None:
            time.sleep(dt)
    else:
        import torch

        a = torch.randn(size, size, device="cuda")
        b = torch.randn(size, size, device="cuda")
        for _ in range(5):
            a @ b
        torch.cuda.synchronize()

        def step() -> None:
            a @ b
            torch.cuda.synchronize()

    print(json.dumps({"ready": os.getpid(), "size": size}), flush=True)
    ts = array("d")
    last_flush = time.monotonic()
    f = open(out, "ab")
    mode = "pause"
    cfd = os.open(ctl, os.O_RDONLY)
    try:
        while True:
            raw = os.pread(cfd, 16, 0)
            mode = raw.decode(errors="replace").strip() or mode
            if mode == "exit":
                break
            if mode == "run":
                step()
                ts.append(time.monotonic())
            else:
                time.sleep(0.002)
            now = time.monotonic()
            if now - last_flush >= 0.25 and ts:
                ts.tofile(f)
                f.flush()
                ts = array("d")
                last_flush = now
    finally:
        ts.tofile(f)
        f.close()
        os.close(cfd)


if __name__ == "__main__":
    main()
