"""Assertions and settings shared by several test modules."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np


def assert_trees_close(actual, expected, rtol=1e-6):
    """Equal structure and, per leaf, `|a - e| <= rtol * |e|` (Frobenius norms)."""
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(expected)[0]]
    for path, a, e in zip(paths, jax.tree.leaves(actual), jax.tree.leaves(expected)):
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        assert a.shape == e.shape, f"{path}: shape {a.shape} != {e.shape}"
        err, scale = np.linalg.norm(a - e), np.linalg.norm(e)
        assert err <= rtol * scale + 1e-30, f"{path}: relative error {err / scale:.3g} > {rtol:g}"


@contextlib.contextmanager
def remat3_flag(value: bool):
    """`jax_remat3` set to `value` inside the block."""
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", value)
    try:
        yield
    finally:
        jax.config.update("jax_remat3", old)


def lstm_cell(carry, x, u):
    """One LSTM step on the carry (h, c) and the step's input projection `x` (the tests' RNNs)."""
    h, c = carry
    i, f, g, o = jnp.split(x + h @ u, 4, -1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h
