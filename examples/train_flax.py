"""An optimized training step of a small flax nnx model, end to end (README walkthrough).

Run: `.venv/bin/python examples/train_flax.py` (about a minute on a 2-core CPU).
"""

import autoremat

autoremat.configure_cpu_flags()  # before JAX starts (matters on the CPU only)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402


class Block(nnx.Module):
    def __init__(self, d, rngs):
        self.ln = nnx.LayerNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, 4 * d, rngs=rngs)
        self.down = nnx.Linear(4 * d, d, rngs=rngs)

    def __call__(self, x):
        return x + self.down(jax.nn.gelu(self.up(self.ln(x))))


class Net(nnx.Module):
    def __init__(self, d, n_blocks, rngs):
        self.blocks = nnx.List([Block(d, rngs) for _ in range(n_blocks)])
        self.head = nnx.Linear(d, 1, rngs=rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    graphdef, params = nnx.split(Net(64, 4, nnx.Rngs(0)))
    x = jax.random.normal(jax.random.key(1), (1024, 64))
    y = jnp.zeros((1024, 1))

    def loss(params, x, y):  # the parameters are the first argument: what jax.grad differentiates
        return jnp.mean((nnx.merge(graphdef, params)(x) - y) ** 2)

    opt_loss = autoremat.optimize(loss, budget=0.75, verbose=True)  # 75% of the un-optimized peak

    @jax.jit
    def train_step(params, x, y):
        value, grads = jax.value_and_grad(opt_loss)(params, x, y)
        return value, jax.tree.map(lambda p, g: p - 1e-2 * g, params, grads)

    for step in range(3):
        value, params = train_step(params, x, y)
        print(f"step {step}: loss {float(value):.5f}")
    print(opt_loss.validate(params, x, y))   # compiled peak vs budget, straight from XLA


if __name__ == "__main__":
    main()
