"""`autoremat.optimize` on models written with flax nnx, equinox, and a scan over layers.

Each model's loss takes its parameters as a pytree (flax: `nnx.split` / `nnx.merge`;
equinox: `eqx.partition` / `eqx.combine`), so they are what `jax.grad` differentiates.
For a budget between the un-optimized peak and the lowest reachable one, the optimized
function must give the original's gradients and its compiled step must fit the budget.

flax and equinox come with the `test` extra (`pip install -e .[test]`); these tests are
not skipped when they are missing.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import autoremat
from _helpers import assert_trees_close

BUDGET = 0.75  # of the un-optimized compiled peak; each model's remat reaches ~0.6-0.7


# -- models -----------------------------------------------------------------------------------

class _Block(nnx.Module):
    def __init__(self, d: int, rngs: nnx.Rngs):
        self.ln = nnx.LayerNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, 4 * d, rngs=rngs)
        self.down = nnx.Linear(4 * d, d, rngs=rngs)

    def __call__(self, x):
        return x + self.down(jax.nn.gelu(self.up(self.ln(x))))


class _Net(nnx.Module):
    def __init__(self, d: int, n_blocks: int, rngs: nnx.Rngs):
        self.blocks = nnx.List([_Block(d, rngs) for _ in range(n_blocks)])
        self.head = nnx.Linear(d, 1, rngs=rngs)

    def __call__(self, x, remat_layer=None):
        for i, block in enumerate(self.blocks):
            x = block(x) if remat_layer is None else remat_layer(i, _Block.__call__)(block, x)
        return self.head(x)


def flax_nnx_model(remat_layer=None):
    """A residual MLP stack (layernorm, up, gelu, down) in flax nnx; params = nnx.State.
    `remat_layer(i, fn)`: how layer i is called (an exported plan's helper)."""
    graphdef, state = nnx.split(_Net(64, 4, nnx.Rngs(0)))
    x = jax.random.normal(jax.random.key(1), (1024, 64), jnp.float32)

    def loss(state, x):
        model = nnx.merge(graphdef, state)
        return jnp.mean(model(x, remat_layer) ** 2)

    return loss, (state, x)


def equinox_model():
    """An equinox MLP (depth 8, width 256) vmapped over a batch; params = its array leaves."""
    mlp = eqx.nn.MLP(64, 1, 256, depth=8, activation=jax.nn.gelu, key=jax.random.key(0))
    params, static = eqx.partition(mlp, eqx.is_array)
    x = jax.random.normal(jax.random.key(1), (2048, 64), jnp.float32)

    def loss(params, x):
        model = eqx.combine(params, static)
        return jnp.mean(jax.vmap(model)(x) ** 2)

    return loss, (params, x)


def scan_model():
    """Scan over layers: stacked weights, a residual tanh MLP body under `jax.lax.scan`."""
    n_layers, width, batch = 4, 128, 1024
    ws = jax.random.normal(jax.random.key(0), (n_layers, 2, width, width), jnp.float32) / width**0.5
    x = jax.random.normal(jax.random.key(1), (batch, width), jnp.float32)

    def loss(ws, x):
        def body(h, w):
            return h + jnp.tanh(h @ w[0]) @ w[1], None

        h, _ = jax.lax.scan(body, x, ws)
        return jnp.mean(h**2)

    return loss, (ws, x)


MODELS = {"flax_nnx": flax_nnx_model, "equinox": equinox_model, "scan": scan_model}


def assert_same_gradients(g_opt, g_ref, g_alt):
    """`g_opt` equals `g_ref` up to twice the difference between two compiles of the unmodified
    function (`g_alt`: the same gradient, fused differently).

    Recomputation changes how XLA fuses the float32 arithmetic, as eager vs jit does: on the
    equinox MLP the unmodified function's eager and jit gradients differ by up to 1.8e-6 of the
    leaf's largest entry, and the optimized one's by 1.9e-6; a fixed rtol of 1e-6 failed there.
    """
    leaves_opt, tree_opt = jax.tree.flatten(g_opt)
    leaves_ref, tree_ref = jax.tree.flatten(g_ref)
    assert tree_opt == tree_ref
    for a, b, c in zip(leaves_opt, leaves_ref, jax.tree.leaves(g_alt)):
        a, b, c = np.asarray(a), np.asarray(b), np.asarray(c)
        noise = float(np.max(np.abs(c - b)))
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=2 * noise + 1e-7 * float(np.max(np.abs(b))))


# -- tests ------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=sorted(MODELS))
def optimized(request):
    fn, args = MODELS[request.param]()
    opt = autoremat.optimize(fn, budget=BUDGET, solver="dp")
    return request.param, fn, args, opt


def test_gradients_equal_the_original(optimized):
    _, fn, args, opt = optimized
    v_ref, g_ref = jax.value_and_grad(fn)(*args)
    v_opt, g_opt = jax.value_and_grad(opt)(*args)
    np.testing.assert_allclose(v_opt, v_ref, rtol=1e-6)
    assert_same_gradients(g_opt, g_ref, jax.jit(jax.grad(fn))(*args))


def test_gradients_under_jit(optimized):
    _, fn, args, opt = optimized
    g_ref = jax.jit(jax.grad(fn))(*args)
    assert_same_gradients(jax.jit(jax.grad(opt))(*args), g_ref, jax.grad(fn)(*args))


def test_plan_rematerializes_and_fits_the_budget(optimized):
    name, _, args, opt = optimized
    plan = opt.plan(*args)
    assert plan.regions or plan.scans, f"{name}: the plan checkpoints nothing"
    if name == "scan":
        assert plan.scans, "the scan body is where a scan-over-layers model saves memory"
    report = opt.validate(*args)
    assert report.fits is True, str(report)
    baseline = plan.meta["baseline_peak"]
    assert report.compiled_peak <= BUDGET * baseline + 1
    assert report.compiled_peak < baseline


def test_framework_versions_are_installed():
    """flax and equinox are in the test extra: their absence is a failure, not a skip."""
    import flax

    assert tuple(int(p) for p in flax.__version__.split(".")[:2]) >= (0, 12)
    assert tuple(int(p) for p in eqx.__version__.split(".")[:2]) >= (0, 13)


def test_an_exported_nnx_plan_compiles_to_the_plans_peak():
    """`plan.to_python("flax-nnx")` of a policy-per-layer plan is plain flax code: its
    `remat_layer` used in the model's loop compiles to the plan's own peak and gives the same
    gradients (issue 17: export that pastes)."""
    from autoremat import _hand
    from autoremat.graph._graph import graph_from_traced
    from autoremat.graph._layers import find_layers
    from autoremat.graph._trace import trace
    from autoremat.runtime import apply, compiled_stats

    loss, args = flax_nnx_model()
    g = graph_from_traced(trace(loss, args))
    layers = find_layers(g)
    assert len(layers) == 4
    plan = _hand.layer_plan(g, layers, ["nothing_saveable", "nothing_saveable", "dots_saveable", None])
    code = plan.to_python("flax-nnx")
    assert "import autoremat" not in code and "nnx.remat(fn, policy=policy" in code
    namespace: dict = {}
    exec(compile(code, "exported.py", "exec"), namespace)
    exported, _ = flax_nnx_model(namespace["remat_layer"])
    planned = compiled_stats(apply(loss, plan), *args)
    assert compiled_stats(exported, *args).peak_bytes == planned.peak_bytes
    assert planned.peak_bytes < compiled_stats(loss, *args).peak_bytes
    g_ref = jax.grad(loss)(*args)
    assert_trees_close(jax.grad(exported)(*args), g_ref)
