"""Compatibility workload: training steps under torch.autocast(bfloat16), no GradScaler.

  torch_amp.py              result: the loss of each of 20 steps
"""

from __future__ import annotations

import compat_common as C


def work(argv: list[str]) -> dict:
    torch = C.torch_setup()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 256, generator=g).cuda()
    y = torch.randint(0, 10, (1024,), generator=g).cuda()
    torch.manual_seed(C.SEED)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                                torch.nn.GELU(), torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    torch.cuda.synchronize()
    return {"ok": logits.dtype == torch.bfloat16 and losses[-1] < losses[0], "result": losses, "tol": 1e-3,
            "weights": C.torch_weights(model), **C.torch_info(torch)}


if __name__ == "__main__":
    C.main(work)
