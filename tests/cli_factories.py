"""Tiny model factories for the command-line tests (`autoremat search tests/cli_factories.py:tiny_mlp`).

Activations (batch x width floats per layer) dominate the parameters, so rematerialization
has something to save, and every model compiles in well under a second.
"""

import jax
import jax.numpy as jnp

from autoremat.examples import get_example


def tiny_mlp(n_layers: int = 8, width: int = 64, batch: int = 512):
    """`(loss, (weights, x))`: a chain of tanh layers."""
    keys = jax.random.split(jax.random.key(0), n_layers + 1)
    ws = [jax.random.normal(k, (width, width), jnp.float32) / width**0.5 for k in keys[:-1]]
    x = jax.random.normal(keys[-1], (batch, width), jnp.float32)

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w) * 1.5
        return jnp.mean(x**2)

    return loss, (ws, x)


def tiny_example():
    """An `autoremat.examples.Example` (an object with `.fn` and `.args`)."""
    return get_example("mlp_chain", n_layers=4, width=64, batch=256)


def tiny_scan(n_layers: int = 6, width: int = 64, batch: int = 512):
    """`(loss, (stacked weights, x))`: the same chain as a `jax.lax.scan` over layers."""
    keys = jax.random.split(jax.random.key(1), 2)
    ws = jax.random.normal(keys[0], (n_layers, width, width), jnp.float32) / width**0.5
    x = jax.random.normal(keys[1], (batch, width), jnp.float32)

    def loss(ws, x):
        def body(h, w):
            return jnp.tanh(h @ w) * 1.5, None

        h, _ = jax.lax.scan(body, x, ws)
        return jnp.mean(h**2)

    return loss, (ws, x)


NOT_CALLABLE = 3


def returns_garbage():
    """A broken factory: returns neither (fn, args) nor an object with .fn and .args."""
    return 42
