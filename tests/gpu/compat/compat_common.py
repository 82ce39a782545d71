"""Shared by the compatibility workloads (tests/gpu/compat.py runs them): the JSON line
each prints last, the --oom probe and the deterministic PyTorch set-up.

Every workload prints, as its last stdout line, one JSON object:
  ok      bool: the workload ran and checked itself
  result  numbers (or nested lists of them) that must match between the run without and
          the run with libgpuslice.so
  tol     relative tolerance for floats in result (0: exact); ints always compare exactly
  oom     with --oom, {"raised", "type", "chunks", "after_ok", ...}; else null
  ...     anything else (timings, versions, what the process saw of memory)
A workload that needs what the machine lacks (two GPUs) says "skip": "<why>".
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

SEED = 0
GiB = 1 << 30
MAX_CHUNKS = 200


def emit(out: dict) -> None:
    print(json.dumps(out, default=str), flush=True)


def failure(e: BaseException) -> dict:
    return {"ok": False, "result": None, "tol": 0, "oom": None,
            "error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}


def main(work: Callable[[list[str]], dict]) -> None:
    """Run work(argv), print its JSON last; rc 0 when ok (or skipped), 1 otherwise."""
    t0 = time.perf_counter()
    try:
        out = work(sys.argv[1:])
    except Exception as e:  # noqa: BLE001 - the error is the result
        out = failure(e)
    out.setdefault("oom", None)
    out.setdefault("tol", 0)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    emit(out)
    sys.exit(0 if out.get("ok") or out.get("skip") else 1)


def want_oom(argv: list[str]) -> bool:
    return "--oom" in argv


def fresh_cache(var: str) -> None:
    """Point a compiler cache (Triton, Inductor, CuPy) at an empty folder, so each run
    compiles for itself rather than reusing the other run's kernels."""
    os.environ[var] = tempfile.mkdtemp(prefix=f"gs-compat-{var.lower()}-")


def first_line(e: BaseException, n: int = 300) -> str:
    s = str(e).strip()
    return (s.splitlines()[0] if s else "")[:n]


def oom_probe(alloc: Callable[[], Any], is_oom: Callable[[BaseException], bool],
              release: Callable[[], None], after: Callable[[], bool],
              max_chunks: int = MAX_CHUNKS) -> dict:
    """alloc() 1 GiB chunks until the framework's own out-of-memory error (at most
    max_chunks), free them all, then after() must still compute correctly."""
    chunks: list[Any] = []
    raised, etype, message = False, None, None
    try:
        while len(chunks) < max_chunks:
            chunks.append(alloc())
    except Exception as e:  # noqa: BLE001 - judged by is_oom
        raised, etype, message = is_oom(e), type(e).__name__, first_line(e)
    n = len(chunks)
    chunks.clear()
    gc.collect()
    release()
    after_error = None
    try:
        after_ok = bool(after())
    except Exception as e:  # noqa: BLE001
        after_ok, after_error = False, f"{type(e).__name__}: {first_line(e)}"
    return {"raised": raised, "type": etype, "chunks": n, "after_ok": after_ok,
            "message": message, "after_error": after_error}


def torch_setup(deterministic: bool = True) -> Any:
    """Import torch with fixed seeds and deterministic settings; CUDA must be there."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
    import torch

    torch.manual_seed(SEED)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("highest")
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    return torch


def torch_info(torch: Any) -> dict:
    free, total = torch.cuda.mem_get_info()
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "mem_get_info": [free, total]}


def torch_weights(model: Any) -> list[float]:
    """Sum and sum of absolute values of every parameter, in float64."""
    s = sum(float(p.detach().double().sum()) for p in model.parameters())
    a = sum(float(p.detach().double().abs().sum()) for p in model.parameters())
    return [s, a]


def torch_oom() -> dict:
    import torch

    def after() -> bool:
        x = torch.ones(1024, 1024, device="cuda")
        return float((x @ x).sum()) == 1024.0**3

    return oom_probe(lambda: torch.empty(GiB, dtype=torch.uint8, device="cuda"),
                     lambda e: isinstance(e, torch.cuda.OutOfMemoryError),
                     torch.cuda.empty_cache, after)


def jax_backend_check(jax: Any) -> None:
    """JAX falls back to the CPU when CUDA fails to start: that is a failure here."""
    if jax.default_backend() != "gpu":
        raise RuntimeError(f"JAX backend is {jax.default_backend()!r}, not gpu: {jax.devices()}")


def jax_memory(jax: Any) -> dict:
    try:
        st = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - some backends have none
        st = {}
    return {k: st[k] for k in ("bytes_limit", "bytes_in_use", "peak_bytes_in_use", "bytes_reserved") if k in st}


# ---- two GPUs: torch.distributed ranks on this host ----

def needs_two(count: int) -> dict | None:
    """The JSON of a skipped run when fewer than two GPUs are there; else None."""
    if count >= 2:
        return None
    return {"ok": False, "skip": "needs 2 GPUs", "gpus": count, "result": None, "tol": 0}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_ranks(fn: Callable[..., None], world: int) -> dict:
    """torch.multiprocessing.spawn fn(rank, world, port, path) on world ranks (each inherits
    this process's environment, LD_PRELOAD included); rank 0 writes its JSON to path."""
    import torch.multiprocessing as mp

    fd, path = tempfile.mkstemp(prefix="gs-compat-rank0-", suffix=".json")
    os.close(fd)
    try:
        mp.spawn(fn, args=(world, free_port(), path), nprocs=world, join=True)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def dist_init(rank: int, world: int, port: int) -> tuple[Any, Any]:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch = torch_setup()
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    return torch, dist


def write_rank0(path: str, out: dict) -> None:
    with open(path, "w") as f:
        json.dump(out, f, default=str)
