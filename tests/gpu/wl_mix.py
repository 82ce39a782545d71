"""One tenant of the mixed-framework scheduler benchmark (tests/gpu/bench_mix.py).

  wl_mix.py CTLFILE OUTFILE KIND [SIZE]

The protocol of wl_sched.py (its serve()): prints {"ready": pid} once warm, then re-reads CTLFILE
("run", "pause", "exit") before every step, and appends each step's completion time
(CLOCK_MONOTONIC seconds) to OUTFILE every 0.25 s. One step is one unit of work, waited
for the way the framework's users usually wait:

  cupy        CuPy fp32 matmul, Stream.synchronize() (spins in the driver)
  torch-block PyTorch fp32 matmul, waited on a blocking CUDA event (off the CPU)
  torch-spin  PyTorch fp32 matmul, three queued, spin-waits on the oldest
  torch-small PyTorch, ten small matmuls per step (steps well under 1 ms), synchronize
  torch-sleep PyTorch fp32 matmul, event polled with 0.5 ms sleeps
  jax         JAX jitted matmul chain, block_until_ready() (about 1 ms a step)
"""

from __future__ import annotations

import json
import os
import sys
import time
from array import array
from collections import deque
from typing import Callable

from wl_sched import serve  # the harness's protocol (this directory is the script's)

DEFAULT_SIZE = {"cupy": 4096, "torch-block": 4096, "torch-spin": 4096, "torch-small": 1024,
                "torch-sleep": 4096, "jax": 2048, "fake": 0}


def make(kind: str, size: int, ts: array) -> tuple[Callable[[], None], Callable[[], None]]:
    """(step, drain) for ``kind``."""
    done = lambda: ts.append(time.monotonic())  # noqa: E731
    if kind == "fake":  # the harness's own dry run, no GPU (never a reported figure)
        def step() -> None:
            time.sleep(0.002)
            done()
        return step, lambda: None
    if kind == "cupy":
        import cupy as cp

        a = cp.random.rand(size, size, dtype=cp.float32)
        b = cp.random.rand(size, size, dtype=cp.float32)
        s = cp.cuda.get_current_stream()

        def step() -> None:
            a @ b
            s.synchronize()
            done()
        return step, lambda: s.synchronize()
    if kind == "jax":
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import jax
        import jax.numpy as jnp

        x = jnp.ones((size, size), jnp.float32) / size

        @jax.jit
        def f(x):  # type: ignore[no-untyped-def]
            for _ in range(4):
                x = jnp.tanh(x @ x)
            return x

        f(x).block_until_ready()

        def step() -> None:
            f(x).block_until_ready()
            done()
        return step, lambda: None
    import torch

    a = torch.randn(size, size, device="cuda")
    b = torch.randn(size, size, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    if kind == "torch-block":
        def step() -> None:
            a @ b
            e = torch.cuda.Event(blocking=True)
            e.record()
            e.synchronize()
            done()
        return step, torch.cuda.synchronize
    if kind == "torch-small":
        def step() -> None:
            for _ in range(10):
                a @ b
            torch.cuda.synchronize()
            done()
        return step, torch.cuda.synchronize
    inflight: deque = deque()
    sleepy = kind == "torch-sleep"

    def wait(e) -> None:  # type: ignore[no-untyped-def]
        if not sleepy:
            e.synchronize()
            return
        while not e.query():
            time.sleep(0.0005)

    def step() -> None:
        a @ b
        e = torch.cuda.Event()
        e.record()
        inflight.append(e)
        if len(inflight) >= (3 if kind == "torch-spin" else 1):
            wait(inflight.popleft())
            done()

    def drain() -> None:
        while inflight:
            wait(inflight.popleft())
            done()
    return step, drain


def main() -> None:
    ctl, out, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    size = int(sys.argv[4]) if len(sys.argv) > 4 else DEFAULT_SIZE[kind]
    ts = array("d")
    step, drain = make(kind, size, ts)
    for _ in range(20):
        step()
    del ts[:]
    print(json.dumps({"ready": os.getpid(), "kind": kind, "size": size}), flush=True)
    serve(ctl, out, ts, step, drain)

if __name__ == "__main__":
    main()
