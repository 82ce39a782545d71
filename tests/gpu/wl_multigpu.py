"""Multi-GPU workloads for tests/gpu/bench_multigpu.py (issue 15); each prints one JSON line.

  wl_multigpu.py ddp RANK WORLD PORT [MIB...]  NCCL all-reduce: checks the sum, then times
                                              all-reduces of each size (MiB): busbw GB/s
  wl_multigpu.py oom GPU                      256 MiB blocks on cuda:GPU until OutOfMemoryError
  wl_multigpu.py mp                           model-parallel matmul, layer 1 on cuda:0, layer 2
                                              on cuda:1, against a float64 CPU reference
  wl_multigpu.py ipc NAME                     exports a cuda:0 tensor by CUDA IPC (torch's
                                              reduce_tensor) to a child started with
                                              GPUSLICE_INSTANCE=NAME, which reads it
  wl_multigpu.py ipc-child FILE               (the child)
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import subprocess
import sys
import time

import torch

MIB = 1 << 20


def ddp(rank: int, world: int, port: int, sizes: list[int]) -> dict:
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=90))
    t = torch.full((1 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    want = world * (world + 1) / 2
    ok = bool(torch.all(t == want).item())
    bw = {}
    for mib in sizes:
        x = torch.ones(mib * MIB // 4, device="cuda")
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        n = 20
        t0 = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / n
        bw[str(mib)] = round(2 * (world - 1) / world * mib * MIB / dt / 1e9, 2)
    dist.destroy_process_group()
    return {"rank": rank, "sum_ok": ok, "busbw_gbs": bw}


def oom(gpu: int) -> dict:
    blocks = []
    err = None
    try:
        while len(blocks) < 4096:
            blocks.append(torch.empty(256 * MIB, dtype=torch.uint8, device=f"cuda:{gpu}"))
    except torch.cuda.OutOfMemoryError as e:
        err = str(e).splitlines()[0][:300]
    free, total = torch.cuda.mem_get_info(gpu)
    return {"gpu": gpu, "allocated": len(blocks) * 256 * MIB, "oom": err is not None, "message": err,
            "mem_get_info_total": total, "mem_get_info_free": free}


def mp() -> dict:
    torch.manual_seed(0)
    x = torch.randn(2048, 4096, dtype=torch.float32)
    w1 = torch.randn(4096, 4096) / 64
    w2 = torch.randn(4096, 1024) / 64
    ref = (x.double() @ w1.double()).relu() @ w2.double()
    peer = torch.cuda.can_device_access_peer(0, 1)
    y = (x.to("cuda:0") @ w1.to("cuda:0")).relu()
    out = y.to("cuda:1") @ w2.to("cuda:1")
    err = float((out.double().cpu() - ref).abs().max() / ref.abs().max())
    t0 = time.perf_counter()
    for _ in range(20):
        out = (x.to("cuda:0") @ w1.to("cuda:0")).relu().to("cuda:1") @ w2.to("cuda:1")
    torch.cuda.synchronize(1)
    return {"peer_access": peer, "rel_err": err, "ok": err < 1e-3, "iter_ms": (time.perf_counter() - t0) / 20 * 1e3}


def ipc(name: str) -> dict:
    from torch.multiprocessing.reductions import reduce_tensor

    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
    fn, args = reduce_tensor(t)
    path = f"/tmp/gs-ipc-{os.getpid()}.pkl"
    with open(path, "wb") as f:
        pickle.dump((fn, args), f)
    env = {**os.environ, "GPUSLICE_INSTANCE": name}
    p = subprocess.run([sys.executable, __file__, "ipc-child", path], env=env, capture_output=True, text=True,
                       timeout=120)
    os.unlink(path)
    child = {}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            child = json.loads(line)
            break
    refusals = [x for x in p.stderr.splitlines() if "gpuslice: refused" in x][:5]
    return {"exporter_instance": os.environ.get("GPUSLICE_INSTANCE"), "importer_instance": name,
            "child_rc": p.returncode, "child": child, "want_sum": float(t.sum().item()),
            "child_refusals": refusals, "child_error": p.stderr.strip().splitlines()[-1:] if p.returncode else []}


def ipc_child(path: str) -> dict:
    with open(path, "rb") as f:
        fn, args = pickle.load(f)
    try:
        t = fn(*args)
        return {"opened": True, "sum": float(t.sum().item())}
    except Exception as e:  # noqa: BLE001 - the refusal is the result
        return {"opened": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}


def main() -> None:
    what = sys.argv[1]
    if what == "ddp":
        out = ddp(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), [int(s) for s in sys.argv[5:]])
    elif what == "oom":
        out = oom(int(sys.argv[2]))
    elif what == "mp":
        out = mp()
    elif what == "ipc":
        out = ipc(sys.argv[2])
    elif what == "ipc-child":
        out = ipc_child(sys.argv[2])
    else:
        raise SystemExit(f"unknown workload {what!r}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
