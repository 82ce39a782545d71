"""Compatibility workload: two Triton kernels (triton.jit, compiled into an empty cache): a
vector add and a small tiled matmul (fp16 in, fp32 accumulate), checked against PyTorch.

  triton_add.py             result: [sum of the add, sum of the matmul, sum of |matmul|]
"""

# no "from __future__ import annotations": Triton reads the constexpr annotations
import compat_common as C

C.fresh_cache("TRITON_CACHE_DIR")  # before Triton reads it
try:  # kernels are module-level functions: Triton resolves tl and friends in their globals
    import triton
    import triton.language as tl
except ImportError as e:  # reported as the result (native failed) rather than a traceback
    triton, IMPORT_ERROR = None, e
else:
    IMPORT_ERROR = None

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # noqa: ANN001, N803
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,  # noqa: ANN001, N803
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # noqa: N803
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            a = tl.load(a_ptr + rm[:, None] * sam + (k + rk)[None, :] * sak,
                        mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
            b = tl.load(b_ptr + (k + rk)[:, None] * sbk + rn[None, :] * sbn,
                        mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
        tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def work(argv: list[str]) -> dict:
    if IMPORT_ERROR is not None:
        raise IMPORT_ERROR
    torch = C.torch_setup()
    g = torch.Generator().manual_seed(1)
    n = 1 << 20
    x = torch.randn(n, generator=g).cuda()
    y = torch.randn(n, generator=g).cuda()
    z = torch.empty_like(x)
    add_kernel[(triton.cdiv(n, 1024),)](x, y, z, n, BLOCK=1024)
    add_ok = bool(torch.equal(z, x + y))

    M, N, K = 256, 192, 320
    a = torch.randn(M, K, generator=g).half().cuda()
    b = torch.randn(K, N, generator=g).half().cuda()
    c = torch.empty(M, N, device="cuda", dtype=torch.float32)
    BM, BN, BK = 64, 64, 32
    matmul_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BM=BM, BN=BN, BK=BK)
    ref = a.float() @ b.float()
    mm_err = float((c - ref).abs().max() / ref.abs().max())
    torch.cuda.synchronize()
    result = [float(z.double().sum()), float(c.double().sum()), float(c.double().abs().sum())]
    return {"ok": add_ok and mm_err < 1e-2, "result": result, "tol": 1e-5, "add_exact": add_ok,
            "matmul_rel_err": mm_err, "triton": triton.__version__, **C.torch_info(torch)}


if __name__ == "__main__":
    C.main(work)
