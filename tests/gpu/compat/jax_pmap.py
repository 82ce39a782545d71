"""Compatibility workload (two GPUs): jax.pmap over 2 devices, a psum of per-device values and
of per-device matmuls (JAX default settings: preallocation on each GPU).

  jax_pmap.py               result: [the psum rows..., the matmul psum]
"""

from __future__ import annotations

import compat_common as C


def work(argv: list[str]) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_default_matmul_precision", "highest")
    devices = [str(d) for d in jax.devices()]
    print("jax.devices():", devices, flush=True)
    C.jax_backend_check(jax)
    skip = C.needs_two(jax.device_count())
    if skip:
        return skip | {"devices": devices}
    two = jax.devices()[:2]
    x = np.arange(2 * 8, dtype=np.float32).reshape(2, 8)
    summed = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i", devices=two)(x)
    m = jax.random.normal(jax.random.PRNGKey(C.SEED), (2, 128, 128), jnp.float32)
    mm = jax.pmap(lambda a: jax.lax.psum((a @ a.T).sum(), "i"), axis_name="i", devices=two)(m)
    rows = np.asarray(summed)
    ok = bool(np.array_equal(rows[0], x.sum(axis=0)) and np.array_equal(rows[0], rows[1])
              and float(mm[0]) == float(mm[1]))
    return {"ok": ok, "result": [rows[0].tolist(), float(mm[0])], "tol": 1e-5, "devices": devices,
            "jax": jax.__version__, "memory": C.jax_memory(jax)}


if __name__ == "__main__":
    C.main(work)
