"""A matmul loop for the scheduler benchmark (tests/gpu/bench_sched.py, test_sched.py).

  wl_sched.py SIZE CTLFILE OUTFILE

Allocates two SIZE x SIZE fp32 matrices, warms up, prints {"ready": pid}, then loops:
reads CTLFILE ("run", "pause" or "exit"; re-read before every matmul), and while
"run" launches one matmul at a time, keeping DEPTH (3) of them queued, and records each
one's completion time (CLOCK_MONOTONIC, seconds, the clock the harness and the daemon
use) when its CUDA event is seen done. Paused: the queue is drained, nothing launched. The times are
appended to OUTFILE as native doubles every 0.25 s and at exit, so a killed run still
leaves its data.

WL_WAIT=sleep: wait for each completion by polling the event (cudaEventQuery) with a
0.5 ms sleep between polls instead of spin-waiting in synchronize: a process that is off
the CPU while it waits (issue 12, item 1), as runtimes that sleep-poll are.

GPUSLICE_FAKE_WORKLOAD=1 replaces the GPU by a sleep of about the H100's time per
matmul (local dry runs of the harness only; never used for reported figures).
"""

from __future__ import annotations

import json
import os
import sys
import time
from array import array

DEPTH = 3


def main() -> None:
    size, ctl, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    fake = os.environ.get("GPUSLICE_FAKE_WORKLOAD") == "1"
    ts = array("d")
    if fake:
        dt = 2.66e-3 * (size / 4096) ** 3

        def step() -> None:
            time.sleep(dt)
            ts.append(time.monotonic())

        def drain() -> None:
            pass
    else:
        from collections import deque

        import torch

        a = torch.randn(size, size, device="cuda")
        b = torch.randn(size, size, device="cuda")
        for _ in range(5):
            a @ b
        torch.cuda.synchronize()
        inflight: deque = deque()
        sleepy = os.environ.get("WL_WAIT") == "sleep"

        def wait(e) -> None:
            if not sleepy:
                e.synchronize()
                return
            while not e.query():
                time.sleep(0.0005)

        # DEPTH matmuls stay queued, so the GPU never waits for this process's next
        # launch; each completion is timed when its event is seen (spin-wait)
        def step() -> None:
            a @ b
            e = torch.cuda.Event()
            e.record()
            inflight.append(e)
            if len(inflight) >= DEPTH:
                wait(inflight.popleft())
                ts.append(time.monotonic())

        def drain() -> None:
            while inflight:
                wait(inflight.popleft())
                ts.append(time.monotonic())

    print(json.dumps({"ready": os.getpid(), "size": size}), flush=True)
    serve(ctl, out, ts, step, drain)


def serve(ctl: str, out: str, ts: array, step, drain) -> None:  # type: ignore[no-untyped-def]
    """The harness's protocol, for this program and wl_mix.py: CTLFILE re-read before
    every step ("run": one step; "pause": nothing, the queue drained once; "exit"), and
    the completion times in ``ts`` appended to OUTFILE every 0.25 s, at a pause and at exit."""
    last_flush = time.monotonic()
    f = open(out, "ab")
    mode = "pause"
    cfd = os.open(ctl, os.O_RDONLY)
    try:
        while True:
            raw = os.pread(cfd, 16, 0)
            prev, mode = mode, raw.decode(errors="replace").strip() or mode
            if mode != "run" and prev == "run":
                drain()
                last_flush = 0.0  # flush now: the harness reads the times after a pause
            if mode == "exit":
                break
            if mode == "run":
                step()
            else:
                time.sleep(0.002)
            now = time.monotonic()
            if now - last_flush >= 0.25 and ts:
                ts.tofile(f)
                f.flush()
                del ts[:]
                last_flush = now
    finally:
        drain()
        ts.tofile(f)
        f.close()
        os.close(cfd)

if __name__ == "__main__":
    main()
