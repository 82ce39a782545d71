"""Compatibility workload: a small conv net (Conv2d / BatchNorm2d / ReLU, cuDNN), 10 training
steps on random images, cuDNN deterministic and not benchmarking.

  cudnn_conv.py             result: the loss of each step and the weights' sums
"""

from __future__ import annotations

import compat_common as C


def work(argv: list[str]) -> dict:
    torch = C.torch_setup()
    nn = torch.nn
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 3, 32, 32, generator=g).cuda()
    y = torch.randint(0, 10, (64,), generator=g).cuda()
    torch.manual_seed(C.SEED)
    feats = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU()).cuda()
    head = nn.Linear(64, 10).cuda()
    params = [*feats.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    losses = []
    for _ in range(10):
        opt.zero_grad(set_to_none=True)
        logits = head(feats(x).mean(dim=(2, 3)))  # mean, not AdaptiveAvgPool2d: its backward is not deterministic
        loss = nn.functional.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    torch.cuda.synchronize()
    model = nn.ModuleList([feats, head])
    return {"ok": losses[-1] < losses[0], "result": [*losses, *C.torch_weights(model)], "tol": 1e-4,
            "cudnn": torch.backends.cudnn.version(), **C.torch_info(torch)}


if __name__ == "__main__":
    C.main(work)
