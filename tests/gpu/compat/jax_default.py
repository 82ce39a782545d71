"""Compatibility workload: JAX with its default settings (preallocation on: XLA takes 75% of
the memory the GPU reports, which under the library is the limit). A matmul, a jitted
function, its gradient and a few jitted gradient steps.

  jax_default.py            result: [sum of the matmul, f(x, w), sum of grad, loss after 5 steps]
jax_noprealloc.py runs the same work with XLA_PYTHON_CLIENT_PREALLOCATE=false.
"""

from __future__ import annotations

import os

import compat_common as C


def jax_work() -> dict:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_default_matmul_precision", "highest")
    devices = [str(d) for d in jax.devices()]
    print("jax.devices():", devices, flush=True)
    C.jax_backend_check(jax)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(C.SEED), 3)
    a = jax.random.normal(k1, (512, 512), jnp.float32)
    b = jax.random.normal(k2, (512, 512), jnp.float32)
    x = jax.random.normal(k3, (256, 512), jnp.float32)
    mm = float((a @ b).sum())

    @jax.jit
    def f(x, w):  # noqa: ANN001, ANN202
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    fx = float(f(x, a / 32))
    grad = jax.jit(jax.grad(f, argnums=1))
    gw = grad(x, a / 32)
    gsum, gabs = float(gw.sum()), float(jnp.abs(gw).sum())
    w = a / 32
    for _ in range(5):
        w = w - 0.5 * grad(x, w)
    loss = float(f(x, w))
    return {"ok": loss < fx, "result": [mm, fx, gsum, gabs, loss], "tol": 1e-4, "devices": devices,
            "jax": jax.__version__, "memory": C.jax_memory(jax),
            "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "(default)")}


def work(argv: list[str]) -> dict:
    return jax_work()


if __name__ == "__main__":
    C.main(work)
