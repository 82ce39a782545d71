"""Compatibility workload: a small MLP, 20 SGD steps on fixed random data (PyTorch eager).

  torch_eager.py [--oom]    result: [final loss, sum of weights, sum of |weights|]
  --oom: afterwards, 1 GiB tensors until torch.cuda.OutOfMemoryError (compat_common.oom_probe)
"""

from __future__ import annotations

import compat_common as C


def work(argv: list[str]) -> dict:
    torch = C.torch_setup()
    g = torch.Generator().manual_seed(1)  # data from the CPU generator: the same on any device
    x = torch.randn(1024, 256, generator=g).cuda()
    y = torch.randint(0, 10, (1024,), generator=g).cuda()
    torch.manual_seed(C.SEED)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    torch.cuda.synchronize()
    out = {"ok": losses[-1] < losses[0], "result": [losses[-1], *C.torch_weights(model)], "tol": 1e-4,
           "losses": losses, **C.torch_info(torch)}
    if C.want_oom(argv):
        out["oom"] = C.torch_oom()
    return out


if __name__ == "__main__":
    C.main(work)
