"""JAX with its defaults: a matmul, a jit and a grad (probe)."""
import json
import jax
import jax.numpy as jnp

x = jnp.arange(1024 * 1024, dtype=jnp.float32).reshape(1024, 1024) / 1e6
f = jax.jit(lambda a: jnp.tanh(a @ a.T).sum())
g = jax.grad(lambda a: (a ** 2).sum())(x[:4, :4])
print(json.dumps({"ok": True, "devices": [str(d) for d in jax.devices()],
                  "result": [float(f(x)), float(g.sum())]}))
