"""Remat shows in compiled memory with `jax_remat3` off and on, under the flags autoremat sets.

benchmarks/results/cpu_flags.md has the measurement: with remat3 on, XLA:CPU runs a hand-written
`jax.checkpoint`'s recomputation early and it saves nothing; autoremat's regions
(`autoremat.runtime._checkpoint.checkpoint`) tie it to the backward pass.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
from autoremat.runtime._checkpoint import checkpoint, remat3_enabled
from autoremat.runtime._validate import compiled_stats
from _helpers import remat3_flag

NOTHING = jax.checkpoint_policies.nothing_saveable


def _block(x, w1, w2):
    return x + jnp.tanh(x @ w1) @ w2


def _mlp(wrap=None):
    def loss(ws, x):
        for w1, w2 in ws:
            x = (wrap(_block) if wrap else _block)(x, w1, w2)
        return jnp.mean(x**2)
    return loss


def _args():
    k = jax.random.split(jax.random.key(0), 13)
    ws = [(jax.random.normal(k[2 * i], (128, 512)) / 12, jax.random.normal(k[2 * i + 1], (512, 128)) / 24)
          for i in range(6)]
    return ws, jax.random.normal(k[12], (1024, 128))


def _assert_same_gradients(g, args):
    """Equal to the unmodified function's gradients up to twice the difference between two
    compiles of it (eager vs jit): recomputation changes XLA's float32 fusion the same way."""
    ref, alt = jax.jit(jax.grad(_mlp()))(*args), jax.grad(_mlp())(*args)
    for a, b, c in zip(jax.tree.leaves(g), jax.tree.leaves(ref), jax.tree.leaves(alt)):
        noise = float(jnp.max(jnp.abs(c - b)))
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=2 * noise + 1e-7 * float(jnp.max(jnp.abs(b))))


def _peak(fn, args):
    return compiled_stats(fn, *args).peak_bytes


def test_hand_checkpoint_lowers_the_peak_with_remat3_off():
    """The flags configure_cpu_flags sets (conftest) let JAX's own per-block remat show."""
    args = _args()
    with remat3_flag(False):
        hand = _mlp(lambda f: jax.checkpoint(f, policy=NOTHING))
        assert _peak(hand, args) < 0.8 * _peak(_mlp(), args)


@pytest.mark.parametrize("on", [False, True], ids=["remat3-off", "remat3-on"])
def test_autoremat_regions_lower_the_peak(on):
    args = _args()
    with remat3_flag(on):
        assert remat3_enabled() is on
        tied = _mlp(lambda f: checkpoint(f, policy=NOTHING, prevent_cse=True))
        none = _peak(_mlp(), args)
        assert _peak(tied, args) < 0.8 * none
        _assert_same_gradients(jax.jit(jax.grad(tied))(*args), args)


@pytest.mark.parametrize("on", [False, True], ids=["remat3-off", "remat3-on"])
def test_optimize_fits_and_keeps_gradients(on):
    args = _args()
    with remat3_flag(on):
        opt = autoremat.optimize(_mlp(), budget=0.7)
        report = opt.validate(*args)
        assert report.fits, str(report)
        _assert_same_gradients(jax.grad(opt)(*args), args)


def test_the_runtime_ties_the_replay_exactly_where_jax_does_not():
    """`barrier_holds_cotangent` asks JAX by tracing; it is true exactly where JAX's own
    checkpoint lowers the peak under remat3 (jax 0.11.2; not 0.10.2), and there `checkpoint`
    is `jax.checkpoint` itself (no custom_vjp, so forward mode works too)."""
    from autoremat.runtime._remat3 import barrier_holds_cotangent
    args = _args()
    with remat3_flag(True):
        hand = _mlp(lambda f: jax.checkpoint(f, policy=NOTHING))
        assert barrier_holds_cotangent() == (_peak(hand, args) < 0.8 * _peak(_mlp(), args))
        step = str(jax.make_jaxpr(checkpoint(jnp.sin, policy=NOTHING, prevent_cse=True))(1.0))
        assert ("custom_vjp" in step) != barrier_holds_cotangent()


def test_tied_checkpoint_with_integer_outputs_and_vmap():
    """float0 cotangents skip the barrier; vmap goes through the custom_vjp."""
    def f(x, n):
        return jnp.sin(x) * n, n + 1

    with remat3_flag(True):
        g = checkpoint(f, policy=NOTHING, prevent_cse=True)
        grad = jax.grad(lambda x: g(x, 3)[0].sum())(jnp.ones(4))
        np.testing.assert_allclose(grad, 3 * jnp.cos(jnp.ones(4)), rtol=1e-6)
        batched = jax.vmap(jax.grad(lambda x: g(x, 2)[0]))(jnp.arange(3.0))
        np.testing.assert_allclose(batched, 2 * jnp.cos(jnp.arange(3.0)), rtol=1e-6)


def test_tied_checkpoint_inside_a_shard_map_keeps_each_value_its_type():
    """Inside a shard_map the residuals and cotangents differ in type: here a region ending in
    the `pmean` of the loss has an invariant cotangent and residuals varying over the batch.
    One barrier over them all cast the cotangent to varying, and the backward pass rejected it
    ("unexpected JAX type ... for argument to VJP function"); one barrier per type keeps each
    as it was.  Gradients: the same operations in the same order (tolerance as above)."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((4,), ("data",))

    def region(w, x):
        return jax.lax.pmean(jnp.mean(jnp.tanh(x @ w) ** 2), "data")

    def loss(wrap):
        body = lambda w, x: wrap(region)(jax.lax.pcast(w, "data", to="varying"), x)  # noqa: E731
        return lambda w, x: jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())(w, x)

    k = jax.random.split(jax.random.key(2))
    w = jax.device_put(jax.random.normal(k[0], (64, 128)) / 8, NamedSharding(mesh, P()))
    x = jax.device_put(jax.random.normal(k[1], (512, 64)), NamedSharding(mesh, P("data")))
    with remat3_flag(True), jax.set_mesh(mesh):
        got = jax.jit(jax.grad(loss(lambda f: checkpoint(f, policy=NOTHING, prevent_cse=True))))(w, x)
        want = jax.jit(jax.grad(loss(lambda f: f)))(w, x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7 * float(jnp.max(jnp.abs(want))))
