"""Compatibility workload: jax_default.py's work with XLA_PYTHON_CLIENT_PREALLOCATE=false
(XLA allocates as it goes).

  jax_noprealloc.py [--oom]   result: as jax_default.py
  --oom: afterwards, 1 GiB arrays until XLA's RESOURCE_EXHAUSTED (XlaRuntimeError)
"""

from __future__ import annotations

import os

import compat_common as C
from jax_default import jax_work


def is_oom(e: BaseException) -> bool:
    msg = str(e)
    return type(e).__name__ in ("XlaRuntimeError", "JaxRuntimeError") and (
        "RESOURCE_EXHAUSTED" in msg or "out of memory" in msg.lower())


def jax_oom() -> dict:
    import jax
    import jax.numpy as jnp

    def after() -> bool:
        x = jnp.ones((1024, 1024), jnp.float32)
        return float(jax.jit(lambda a: (a @ a).sum())(x)) == 1024.0**3

    out = C.oom_probe(lambda: jnp.zeros((C.GiB // 4,), jnp.float32).block_until_ready(), is_oom,
                      lambda: None, after)
    out["memory"] = C.jax_memory(jax)
    return out


def work(argv: list[str]) -> dict:
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # before jax is imported
    out = jax_work()
    if C.want_oom(argv):
        out["oom"] = jax_oom()
    return out


if __name__ == "__main__":
    C.main(work)
