"""Compatibility workload: torch.compile (default mode: Inductor, Triton kernels) of a small
model, 5 forward/backward steps. Compiler caches start empty, so each run compiles.

  torch_compile.py          result: the loss of each step
"""

from __future__ import annotations

import time
import traceback

import compat_common as C


def work(argv: list[str]) -> dict:
    C.fresh_cache("TORCHINDUCTOR_CACHE_DIR")
    C.fresh_cache("TRITON_CACHE_DIR")
    torch = C.torch_setup(deterministic=False)  # Inductor has its own rules; seeds and cuDNN still fixed
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 128, generator=g).cuda()
    y = torch.randn(512, 1, generator=g).cuda()
    torch.manual_seed(C.SEED)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.LayerNorm(256), torch.nn.GELU(),
                                torch.nn.Linear(256, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        opt.step()
        return float(loss)

    t0 = time.perf_counter()
    try:
        losses = [step()]  # the compile happens here
    except Exception as e:  # noqa: BLE001 - Inductor or Triton could not compile
        return {"ok": False, "result": None, "tol": 1e-4, "error": f"compile: {type(e).__name__}: {e}"[:3000],
                "traceback": traceback.format_exc()[-4000:], **C.torch_info(torch)}
    compile_s = time.perf_counter() - t0
    losses += [step() for _ in range(4)]
    torch.cuda.synchronize()
    return {"ok": losses[-1] < losses[0], "result": losses, "tol": 1e-4, "compile_s": round(compile_s, 3),
            **C.torch_info(torch)}


if __name__ == "__main__":
    C.main(work)
