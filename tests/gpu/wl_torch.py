"""PyTorch workloads for the real-GPU tests; each prints one JSON line on stdout.

  wl_torch.py limit [chunk_mib]   mem_get_info, then allocate until OutOfMemoryError
  wl_torch.py matmul SECONDS      4096x4096 fp32 matmuls per second
  wl_torch.py victim SECONDS      matmul loop; prints per-0.5 s counts (for gating tests)
  wl_torch.py fork                CUDA, then DataLoader workers (fork) and a fork+exec
"""

from __future__ import annotations

import json
import os
import sys
import time


def limit(chunk_mib: int) -> dict:
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context exists from here on
    free0, total0 = torch.cuda.mem_get_info()
    chunks = []
    oom = None
    while True:
        try:
            chunks.append(torch.empty(chunk_mib << 20, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError as e:
            oom = str(e).splitlines()[0][:200]
            break
        if len(chunks) > 100000:
            break
    allocated = len(chunks) * (chunk_mib << 20)
    free1, total1 = torch.cuda.mem_get_info()
    # the process goes on after the error: a second try fails the same way, small ones work
    second = "none"
    try:
        torch.empty(chunk_mib << 20, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        second = "OutOfMemoryError"
    del chunks
    torch.cuda.empty_cache()
    free2, total2 = torch.cuda.mem_get_info()
    x = torch.ones(1024, device="cuda")
    ok_after = float(x.sum().item()) == 1024.0
    return {
        "total0": total0, "free0": free0, "allocated": allocated, "oom": oom,
        "total1": total1, "free1": free1, "second": second, "total2": total2, "free2": free2,
        "ok_after": ok_after, "reserved_by_torch": torch.cuda.memory_reserved(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }


def matmul(seconds: float) -> dict:
    import torch

    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        n += 10
    dt = time.perf_counter() - t0
    return {"matmuls": n, "seconds": dt, "per_s": n / dt, "tflops": n * 2 * 4096**3 / dt / 1e12}


def victim(seconds: float) -> dict:
    import torch

    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    counts = []
    t0 = time.perf_counter()
    win = t0
    n = 0
    while time.perf_counter() - t0 < seconds:
        a @ b
        torch.cuda.synchronize()
        n += 1
        now = time.perf_counter()
        if now - win >= 0.5:
            counts.append(n)
            n = 0
            win = now
    return {"windows": counts}


def fork() -> dict:
    """CUDA in the parent, then forked DataLoader workers and a fork+exec."""
    import subprocess

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    x = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    y = torch.ones(1024, device="cuda")
    free0, total0 = torch.cuda.mem_get_info()
    ds = TensorDataset(torch.arange(4096, dtype=torch.float32))
    total = 0.0
    for (b,) in DataLoader(ds, batch_size=256, num_workers=2):
        total += float(b.sum())
    rc = subprocess.run(["true"]).returncode
    y = y * 2 - 1
    free1, total1 = torch.cuda.mem_get_info()
    return {"sum": total, "true_rc": rc, "gpu_ok": float(y.sum().item()) == 1024.0 and int(x[0]) == 1,
            "free0": free0, "free1": free1, "total0": total0, "total1": total1}


def main() -> None:
    mode = sys.argv[1]
    if mode == "limit":
        out = limit(int(sys.argv[2]) if len(sys.argv) > 2 else 256)
    elif mode == "matmul":
        out = matmul(float(sys.argv[2]))
    elif mode == "fork":
        out = fork()
    elif mode == "victim":
        out = victim(float(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
