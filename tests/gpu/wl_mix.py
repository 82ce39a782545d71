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
  egl         OpenGL through EGL (moderngl): one heavy fragment-shader frame (SIZE x SIZE), glFinish;
              GS_EGL_FRAME_MS=T raises the shader's rounds until a frame takes about T ms
  vulkan      Vulkan through wgpu: one compute dispatch (integer rounds over 4 MiB), waited for
  nvdec       NVDEC (PyNvVideoCodec): one decoded 1080p H.264 frame, the clip looped
  nvjpg       NVJPG (nvJPEG hardware backend): one batch of 4 JPEGs decoded, synchronized
The last four reuse tests/gpu/compat/'s workloads (their wheels and loaders, see there).
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
                "torch-sleep": 4096, "jax": 2048, "fake": 0,
                "egl": 1024, "vulkan": 0, "nvdec": 0, "nvjpg": 0}
COMPAT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compat")


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
    if kind in ("egl", "vulkan", "nvdec", "nvjpg"):
        return make_gfx(kind, size, done)
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


def make_gfx(kind: str, size: int, done: Callable[[], None]) -> tuple[Callable[[], None], Callable[[], None]]:
    """The graphics and video kinds, built from the compat workloads (imported lazily)."""
    if COMPAT not in sys.path:
        sys.path.insert(0, COMPAT)
    if kind == "egl":
        import egl_render

        sc = egl_render.Scene(size, size)
        frame = [0]
        want_ms = float(os.environ.get("GS_EGL_FRAME_MS", "0"))
        if want_ms > 0:  # long frames: raise the shader's rounds until one frame takes want_ms
            iters = egl_render.ITERS
            while True:
                sc.prog["iters"].value = iters
                t0 = time.perf_counter()
                for _ in range(3):
                    frame[0] += 1
                    sc.render(frame[0], read=False)
                ms = (time.perf_counter() - t0) * 1e3 / 3
                if ms >= want_ms or iters >= 1 << 20:
                    break
                iters = max(iters + 1, int(iters * min(4.0, want_ms / max(ms, 0.05))))
            print(json.dumps({"egl_iters": iters, "frame_ms": round(ms, 2)}), file=sys.stderr)

        def step() -> None:
            frame[0] += 1
            sc.render(frame[0], read=False)  # ends in glFinish
            done()
        return step, sc.ctx.finish
    if kind == "vulkan":
        import vulkan_wgpu

        _, dev = vulkan_wgpu.adapter_and_device()
        comp = vulkan_wgpu.Compute(dev)

        def step() -> None:
            comp.run(read=False)  # waits for the dispatch
            done()
        return step, lambda: None
    if kind == "nvdec":
        import nvdec_decode

        def frames():  # type: ignore[no-untyped-def]
            while True:
                dmx, dec = nvdec_decode.open_decoder()
                for pkt in dmx:
                    yield from dec.Decode(pkt)

        gen = frames()

        def step() -> None:
            next(gen)  # the frame is in device memory once Decode hands it out
            done()
        return step, lambda: None
    import nvjpg_decode  # nvjpg

    jpegs = nvjpg_decode.make_jpegs()
    dec = nvjpg_decode.HwDecoder(len(jpegs))

    def step() -> None:
        dec.decode(jpegs)  # synchronized
        done()
    return step, lambda: None


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
