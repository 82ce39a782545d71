"""Compatibility workload: CUDA graph capture (torch.cuda.CUDAGraph) of a few ops, replayed
10 times on new inputs, each replay checked against the same ops run eagerly.

  torch_graphs.py           result: the checksum of the output of each replay
"""

from __future__ import annotations

import compat_common as C


def work(argv: list[str]) -> dict:
    torch = C.torch_setup()
    g = torch.Generator().manual_seed(1)
    w = torch.randn(512, 512, generator=g).cuda() / 16
    inputs = [torch.randn(256, 512, generator=g).cuda() for _ in range(10)]
    static_x = torch.zeros(256, 512, device="cuda")

    def ops(x):  # noqa: ANN001, ANN202
        h = torch.relu(x @ w) + 1.0
        return (h * h).sum(dim=1).sqrt()

    side = torch.cuda.Stream()  # warm-up on a side stream before the capture, as the docs ask
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            ops(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = ops(static_x)
    sums, worst = [], 0.0
    for x in inputs:
        static_x.copy_(x)
        graph.replay()
        ref = ops(x)
        worst = max(worst, float(((static_out - ref).abs().max() / ref.abs().max())))
        sums.append(float(static_out.double().sum()))
    torch.cuda.synchronize()
    return {"ok": worst <= 1e-5, "result": sums, "tol": 1e-5, "graph_vs_eager_rel": worst, **C.torch_info(torch)}


if __name__ == "__main__":
    C.main(work)
