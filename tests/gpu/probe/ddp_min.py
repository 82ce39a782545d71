"""Two-rank DDP over NCCL and one all_reduce of 256 MiB (probe)."""
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, port, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    torch.manual_seed(0)
    m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256).cuda(), device_ids=[rank])
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for _ in range(5):
        opt.zero_grad()
        loss = m(torch.ones(64, 256, device="cuda")).square().mean()
        loss.backward()
        opt.step()
    t = torch.ones(64 << 20, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / 10
    x = torch.empty(1 << 28, device="cuda")  # an allocation after the steps
    if rank == 0:
        q.put({"loss": float(loss), "busbw_gbs": (256 << 20) / dt / 1e9, "after": x.numel()})
    dist.destroy_process_group()


if __name__ == "__main__":
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(port, q), nprocs=2)
    print(json.dumps({"ok": True, "result": q.get()}))
