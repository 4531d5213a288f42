"""A sharded training step: FSDP x tensor parallel over a (4, 2) device mesh, `optimize` inside
`jax.jit`, per-device budget (README "Sharded training").  A test runs it.

On a CPU the mesh is 8 host devices (`--xla_force_host_platform_device_count=8`, set below
before JAX starts); on 8 accelerators the same code runs on them.

Run: `.venv/bin/python examples/train_sharded.py` (about a minute on a 2-core CPU).
"""

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import autoremat  # noqa: E402

autoremat.configure_cpu_flags()  # before JAX starts (matters on the CPU only)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

D, F, LAYERS, BATCH = 128, 512, 4, 2048


def loss(params, x):
    for p in params:  # a residual MLP stack
        h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)
        x = x + jax.nn.gelu(h @ p["up"]) @ p["down"]
    return jnp.mean(x ** 2)


def main():
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    # FSDP over "data" (every weight split over it too), Megatron-style TP over "model".
    layer = {"up": NamedSharding(mesh, P("data", "model")), "down": NamedSharding(mesh, P("model", "data"))}
    shardings = ([layer] * LAYERS, NamedSharding(mesh, P("data", None)))
    keys = jax.random.split(jax.random.key(0), 2 * LAYERS + 1)
    params = [{"up": jax.random.normal(keys[2 * i], (D, F)) / D ** 0.5,
               "down": jax.random.normal(keys[2 * i + 1], (F, D)) / F ** 0.5} for i in range(LAYERS)]
    x = jax.random.normal(keys[-1], (BATCH, D))
    params, x = jax.device_put((params, x), shardings)

    # A fraction is of the un-optimized step's compiled peak per device; inside jit the
    # mesh's axes are Auto, so the shardings are given as for jax.jit.
    opt_loss = autoremat.optimize(loss, budget=0.6, in_shardings=shardings, verbose=True)

    @jax.jit
    def train_step(params, x):
        value, grads = jax.value_and_grad(opt_loss)(params, x)
        return value, jax.tree.map(lambda p, g: p - 1e-2 * g, params, grads), grads

    ref_grads = jax.jit(jax.grad(loss))(params, x)  # the function as written
    for step in range(3):
        value, new_params, grads = train_step(params, x)
        if step == 0:
            err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(grads),
                                                                      jax.tree.leaves(ref_grads)))
            print(f"largest gradient difference from the un-optimized step: {err:.3g}")
        params = new_params
        print(f"step {step}: loss {float(value):.5f}")
    print(opt_loss.validate(params, x))  # the per-device compiled peak vs the budget, from XLA
    return err


if __name__ == "__main__":
    main()
