"""Property test over random layer stacks (issue 15): user checkpoints, scan over layers, skip
connections, sharded inputs on the 4-device host mesh (conftest), calls under `jax.jit`, random
budgets.  For every budget the plan compiles within it and keeps the gradients; a looser
budget never gets a plan estimated slower, and is never infeasible where a tighter one was not.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P

import autoremat
from autoremat.runtime._validate import compiled_stats


def _stack(n_layers, width, user_ckpt, scan, skip):
    def layer(h, w):
        return h + jnp.tanh(h @ w[0]) @ w[1]

    if user_ckpt:
        layer = jax.checkpoint(layer)

    def loss(ws, x):
        h = x
        if scan:
            h, _ = jax.lax.scan(lambda c, w: (layer(c, w), None), h, ws)
        else:
            for i in range(n_layers):
                h = layer(h, ws[i])
        if skip:
            h = h * jnp.tanh(x)  # the input is needed again at the end
        return jnp.mean(h**2)

    k = jax.random.split(jax.random.key(n_layers * width), 2)
    ws = jax.random.normal(k[0], (n_layers, 2, width, width)) / width
    return loss, ws, jax.random.normal(k[1], (512, width))


stacks = st.fixed_dictionaries({
    "n_layers": st.integers(2, 4), "width": st.sampled_from([32, 64]), "user_ckpt": st.booleans(),
    "scan": st.booleans(), "skip": st.booleans(), "jit": st.booleans(), "sharded": st.booleans(),
    "fractions": st.lists(st.floats(0.55, 1.0), min_size=2, max_size=2).map(sorted),
})


# No shrinking: each example compiles a dozen steps, and a failing case prints in full anyway.
@settings(max_examples=6, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(stacks)
def test_random_stacks_fit_keep_gradients_and_are_monotone(case):
    loss, ws, x = _stack(case["n_layers"], case["width"], case["user_ckpt"], case["scan"], case["skip"])
    context = contextlib.nullcontext()
    if case["sharded"]:  # a mesh with explicit axes (jax.make_mesh's default), as sharded training uses
        mesh = jax.make_mesh((4,), ("data",))
        x = jax.device_put(x, NamedSharding(mesh, P("data", None)))
        ws = jax.device_put(ws, NamedSharding(mesh, P()))
        context = jax.set_mesh(mesh)
    with context:
        _check_budgets(case, loss, ws, x)


def _check_budgets(case, loss, ws, x):
    base = compiled_stats(loss, ws, x).peak_bytes
    ref = jax.jit(jax.grad(loss))(ws, x)
    noise = float(jnp.max(jnp.abs(jax.grad(loss)(ws, x) - ref)))
    last_time, was_feasible = None, False
    for fraction in case["fractions"]:
        budget = int(fraction * base)
        opt = autoremat.optimize(loss, budget=budget)
        grad = jax.jit(jax.grad(opt)) if case["jit"] else jax.grad(opt)
        try:
            g = grad(ws, x)
        except autoremat.InfeasibleBudgetError as e:
            assert not was_feasible, f"{case}: {budget} B infeasible after a tighter budget fitted"
            assert e.lowest > budget
            continue
        was_feasible = True
        plan = opt.plan(ws, x)
        assert plan.meta["compiled_peak"] <= budget, case
        assert opt.validate(ws, x).compiled_peak <= budget, case
        np.testing.assert_allclose(g, ref, rtol=1e-6, atol=2 * noise + 1e-7 * float(jnp.max(jnp.abs(ref))))
        t = plan.estimated_extra_time or 0.0
        if last_time is not None:
            assert t <= last_time * (1 + 1e-9) + 1e-15, f"{case}: {t} s at {budget} B, {last_time} s when tighter"
        last_time = t
