"""Compatibility workload (two GPUs): FullyShardedDataParallel over NCCL, 2 ranks started by
torch.multiprocessing.spawn on this host, 5 training steps.

  fsdp_nccl.py              result: rank 0's loss at each step
"""

from __future__ import annotations

import compat_common as C


def worker(rank: int, world: int, port: int, path: str) -> None:
    torch, dist = C.dist_init(rank, world, port)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    try:
        g = torch.Generator().manual_seed(1000 + rank)
        x = torch.randn(256, 512, generator=g).cuda()
        y = torch.randn(256, 64, generator=g).cuda()
        torch.manual_seed(C.SEED)
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                    torch.nn.ReLU(), torch.nn.Linear(1024, 64)).cuda()
        fsdp = FSDP(model, device_id=torch.cuda.current_device())
        opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-3)
        losses = []
        for _ in range(5):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(fsdp(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        torch.cuda.synchronize()
        if rank == 0:
            C.write_rank0(path, {"ok": losses[-1] < losses[0], "result": losses, "tol": 1e-4, "world": world,
                                 **C.torch_info(torch)})
    finally:
        dist.destroy_process_group()


def work(argv: list[str]) -> dict:
    import torch

    skip = C.needs_two(torch.cuda.device_count())
    return skip or C.spawn_ranks(worker, 2)


if __name__ == "__main__":
    C.main(work)
