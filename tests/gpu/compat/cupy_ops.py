"""Compatibility workload: CuPy array ops: a matmul, an FFT, reductions and a RawKernel
(compiled by NVRTC into an empty cache), each checked against NumPy.

  cupy_ops.py [--oom]       result: [matmul sum, |FFT| sum, sum, max, std, RawKernel sum]
  --oom: afterwards, 1 GiB arrays until cupy.cuda.memory.OutOfMemoryError
"""

from __future__ import annotations

import compat_common as C

SAXPY = r"""
extern "C" __global__ void saxpy(const float a, const float *x, float *y, const int n)
{
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i];
}
"""


def close(a: float, b: float, rel: float = 1e-4) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def cupy_oom() -> dict:
    import cupy as cp

    def after() -> bool:
        return int(cp.arange(1024, dtype=cp.int64).sum()) == 1024 * 1023 // 2

    return C.oom_probe(lambda: cp.empty(C.GiB, dtype=cp.uint8),
                       lambda e: isinstance(e, cp.cuda.memory.OutOfMemoryError),
                       cp.get_default_memory_pool().free_all_blocks, after)


def work(argv: list[str]) -> dict:
    C.fresh_cache("CUPY_CACHE_DIR")
    import cupy as cp
    import numpy as np

    if cp.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("CuPy sees no GPU")
    rng = np.random.default_rng(C.SEED)
    a_h = rng.standard_normal((512, 512), dtype=np.float32)
    b_h = rng.standard_normal((512, 512), dtype=np.float32)
    s_h = rng.standard_normal(1 << 16).astype(np.complex64)
    v_h = rng.standard_normal(1 << 20, dtype=np.float32)
    a, b, s, v = (cp.asarray(t) for t in (a_h, b_h, s_h, v_h))

    mm = float((a @ b).sum(dtype=cp.float64))
    ff = float(cp.abs(cp.fft.fft(s)).sum(dtype=cp.float64))
    red = [float(v.sum(dtype=cp.float64)), float(v.max()), float(v.std(dtype=cp.float64))]
    kern = cp.RawKernel(SAXPY, "saxpy")
    y = cp.ones_like(v)
    n = v.size
    kern(((n + 255) // 256,), (256,), (cp.float32(2.0), v, y, cp.int32(n)))
    kr = float(y.sum(dtype=cp.float64))
    cp.cuda.Device().synchronize()

    want = [float((a_h.astype(np.float64) @ b_h).sum()), float(np.abs(np.fft.fft(s_h)).sum()),
            float(v_h.sum(dtype=np.float64)), float(v_h.max()), float(v_h.std(dtype=np.float64)),
            float((2.0 * v_h.astype(np.float64) + 1.0).sum())]
    got = [mm, ff, *red, kr]
    free, total = cp.cuda.runtime.memGetInfo()
    out = {"ok": all(close(g, w, 1e-3) for g, w in zip(got, want)), "result": got, "tol": 1e-5,
           "numpy": want, "cupy": cp.__version__, "mem_get_info": [free, total]}
    if C.want_oom(argv):
        out["oom"] = cupy_oom()
    return out


if __name__ == "__main__":
    C.main(work)
