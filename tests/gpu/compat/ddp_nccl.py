"""Compatibility workload (two GPUs): DistributedDataParallel over NCCL, 2 ranks started by
torch.multiprocessing.spawn on this host (each inherits LD_PRELOAD and the limit): 10 training
steps, then all-reduce bus bandwidth at 64 MiB, 256 MiB and 1 GiB (float32; 5 warm-up, 20
timed; busbw = size * 2 (n-1)/n / time).

  ddp_nccl.py               result: rank 0's final loss; busbw_gbs: {"64MiB": GB/s, ...}
"""

from __future__ import annotations

import time

import compat_common as C

MiB = 1 << 20
SIZES = {"64MiB": 64 * MiB, "256MiB": 256 * MiB, "1GiB": 1024 * MiB}


def train(torch, rank: int) -> tuple[list[float], bool]:  # noqa: ANN001
    from torch.nn.parallel import DistributedDataParallel as DDP

    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of data
    x = torch.randn(512, 256, generator=g).cuda()
    y = torch.randint(0, 10, (512,), generator=g).cuda()
    torch.manual_seed(C.SEED)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    ddp = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(10):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses, in_sync(torch, C.torch_weights(model))


def in_sync(torch, values: list[float]) -> bool:  # noqa: ANN001
    """The same on every rank: the all-reduced max equals the all-reduced min."""
    import torch.distributed as dist

    hi = torch.tensor(values, dtype=torch.float64, device="cuda")
    lo = hi.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return bool(torch.equal(hi, lo))


def busbw(torch, dist, world: int) -> dict[str, float]:  # noqa: ANN001
    out = {}
    for name, size in SIZES.items():
        t = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        for _ in range(5):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        n = 20
        t0 = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / n
        out[name] = round(size * 2 * (world - 1) / world / dt / 1e9, 3)
        del t
    return out


def worker(rank: int, world: int, port: int, path: str) -> None:
    torch, dist = C.dist_init(rank, world, port)
    try:
        losses, synced = train(torch, rank)
        check = torch.full((1 << 20,), float(rank + 1), device="cuda")
        dist.all_reduce(check)
        sum_ok = bool(torch.all(check == world * (world + 1) / 2))
        bw = busbw(torch, dist, world)
        if rank == 0:
            C.write_rank0(path, {"ok": synced and sum_ok and losses[-1] < losses[0], "result": losses[-1],
                                 "tol": 1e-4, "losses": losses, "weights_in_sync": synced, "sum_ok": sum_ok,
                                 "busbw_gbs": bw, "world": world, "nccl": str(torch.cuda.nccl.version()),
                                 **C.torch_info(torch)})
    finally:
        dist.destroy_process_group()


def work(argv: list[str]) -> dict:
    import torch

    skip = C.needs_two(torch.cuda.device_count())
    return skip or C.spawn_ranks(worker, 2)


if __name__ == "__main__":
    C.main(work)
