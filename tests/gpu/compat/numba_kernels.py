"""Compatibility workload: Numba's CUDA target (numba-cuda: its own driver-API context
use and NVVM compilation), a reduction and a shared-memory matrix multiply.

  numba_kernels.py          result: [sum of a*x+y, sum of the matmul]
"""

from __future__ import annotations

import compat_common as C


def work(argv: list[str]) -> dict:
    import numpy as np
    from numba import cuda, float32

    n = 1 << 20
    rng = np.random.default_rng(3)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)

    @cuda.jit
    def axpy(a, xs, ys, out):  # noqa: ANN001
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * xs[i] + ys[i]

    tile = 16

    @cuda.jit
    def matmul(a, b, c):  # noqa: ANN001
        sa = cuda.shared.array((tile, tile), float32)
        sb = cuda.shared.array((tile, tile), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        row, col = cuda.grid(2)
        acc = float32(0.0)
        for k in range(a.shape[1] // tile):
            sa[ty, tx] = a[row, k * tile + tx]
            sb[ty, tx] = b[k * tile + ty, col]
            cuda.syncthreads()
            for j in range(tile):
                acc += sa[ty, j] * sb[j, tx]
            cuda.syncthreads()
        c[row, col] = acc

    dx, dy = cuda.to_device(x), cuda.to_device(y)
    dout = cuda.device_array_like(dx)
    axpy[(n + 255) // 256, 256](np.float32(2.0), dx, dy, dout)
    out = dout.copy_to_host()
    axpy_ok = bool(np.allclose(out, 2.0 * x + y))

    m = 256
    a = rng.standard_normal((m, m)).astype(np.float32)
    b = rng.standard_normal((m, m)).astype(np.float32)
    dc = cuda.device_array((m, m), dtype=np.float32)
    matmul[(m // tile, m // tile), (tile, tile)](cuda.to_device(a), cuda.to_device(b), dc)
    c = dc.copy_to_host()
    mm_ok = bool(np.allclose(c, a @ b, rtol=1e-3, atol=1e-3))
    _free, total = cuda.current_context().get_memory_info()
    name = cuda.get_current_device().name
    return {"ok": axpy_ok and mm_ok, "result": [float(out.astype(np.float64).sum()), float(c.astype(np.float64).sum())],
            "tol": 1e-5, "mem_total": total, "device": name.decode() if isinstance(name, bytes) else str(name)}


if __name__ == "__main__":
    C.main(work)
