"""Planning inside a shard_map (`graph.shard_map_body`): a step written per device, as
data-parallel code writes it, is planned on its body's layers, and the plan runs inside the
same shard_map."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import autoremat
from autoremat.graph._shard_map import shard_map_body
from autoremat.graph._trace import trace
from autoremat.runtime._validate import compiled_stats
from _helpers import remat3_flag


def _per_device_stack(policy: str | None = None):
    """(loss, (ws, x), mesh): four residual MLP layers in a shard_map over 4 devices, the batch
    split, the weights replicated, the loss averaged by `pmean`; `policy`: a JAX policy written
    around each layer inside the body, as a person would.  Each layer scales its input by a
    weight (as a norm does) and by a table of positions the body makes once over a timescale the
    layer makes (as rotary embeddings do); the body casts both to varying where they meet the
    input, after a broadcast (`runtime._varying`)."""
    mesh = jax.make_mesh((4,), ("data",))

    def layer(x, w1, w2, g, pos):
        angle = jnp.cos(pos / 100.0 ** (jnp.arange(64.0) / 64))
        return x + jnp.tanh((x * (g * angle)[None]) @ w1) @ w2

    if policy is not None:
        layer = jax.checkpoint(layer, policy=getattr(jax.checkpoint_policies, policy))

    def body(ws, x):
        pos = jnp.arange(64.0)
        for w1, w2, g in ws:
            x = layer(x, w1, w2, g, pos)
        return jax.lax.pmean(jnp.mean(x**2), "data")

    def loss(ws, x):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())(ws, x)

    k = jax.random.split(jax.random.key(0), 9)
    ws = [(jax.random.normal(k[2 * i], (64, 256)) / 8, jax.random.normal(k[2 * i + 1], (256, 64)) / 16,
           1 + jnp.arange(64.0) / 64) for i in range(4)]
    ws = jax.device_put(ws, NamedSharding(mesh, P()))
    x = jax.device_put(jax.random.normal(k[8], (2048, 64)), NamedSharding(mesh, P("data")))
    return loss, (ws, x), mesh


def _max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_the_body_of_the_shard_map_holding_every_matmul_is_what_is_planned():
    loss, args, mesh = _per_device_stack()
    with jax.set_mesh(mesh):
        t = trace(loss, args)
    body = shard_map_body(t)
    assert len(t.jaxpr.eqns) == 1 and body is not None and body.outer is t and body.inside == 0
    assert len(body.jaxpr.eqns) > 20  # the four layers' equations, inlined
    assert body.in_avals[-1].shape == (512, 64)  # per device: the batch split 4 ways
    assert body.diff_mask == (True,) * 12 + (False,)  # the weights, not the batch (argnums=0)
    x2 = jax.device_put(jnp.ones((1024, 64)), NamedSharding(mesh, P("data")))
    with jax.set_mesh(mesh):
        assert body.signature != shard_map_body(trace(loss, (args[0], x2))).signature


def test_a_per_device_step_fits_where_the_policy_written_in_its_body_does():
    """At the compiled peak of `nothing_saveable` written around each layer inside the body,
    autoremat's plan (made inside the shard_map) fits and recomputes no more matmul FLOPs; its
    gradients equal the function's.  Tolerance: float32, the same operations recomputed in the
    same order (measured 3.7e-9, gradients up to 0.3); a plan that computed something else would
    be off by their size.  (Under jax_remat3, jax 0.10's own checkpoint around these layers
    fails inside the shard_map, so there is no hand-written plan to compare with there; the
    plans run under it: the next test.)"""
    loss, args, mesh = _per_device_stack()
    hand, _, _ = _per_device_stack("nothing_saveable")
    with jax.set_mesh(mesh):
        by_hand = compiled_stats(hand, *args)
        opt = autoremat.optimize(loss, budget=by_hand.peak_bytes)
        plan = opt.plan(*args)
        got = compiled_stats(opt, *args)
        grads, want = jax.grad(opt)(*args), jax.grad(loss)(*args)
    assert plan.meta["inside_shard_map"] == 0 and len(plan.meta["layers"]) == 4
    assert plan.regions and not plan.as_written
    assert got.peak_bytes <= by_hand.peak_bytes < compiled_stats(loss, *args).peak_bytes
    assert got.matmul_flops <= by_hand.matmul_flops
    assert _max_diff(grads, want) < 1e-6
    assert "planned inside the shard_map of loss" in plan.summary()


@pytest.mark.parametrize("remat3", [False, True])
def test_a_plan_made_inside_a_shard_map_is_saved_loaded_and_run_under_jit(tmp_path, remat3):
    """At 70% of the un-optimized peak, with jax_remat3 off and on (its checkpoint inside a
    shard_map needs the layer's weights cast to varying outside it: `runtime._apply`)."""
    loss, args, mesh = _per_device_stack()
    with remat3_flag(remat3), jax.set_mesh(mesh):
        budget = int(0.7 * compiled_stats(loss, *args).peak_bytes)
        opt = autoremat.optimize(loss, budget=budget)
        plan = opt.plan(*args)
        assert "planned inside the shard_map" in plan.to_python()
        plan.save(tmp_path / "plan.json")
        again = autoremat.apply(loss, autoremat.Plan.load(tmp_path / "plan.json"))
        assert compiled_stats(again, *args).peak_bytes <= budget
        want = jax.grad(loss)(*args)
        _, grads = jax.jit(jax.value_and_grad(autoremat.optimize(loss, budget=budget)))(*args)
        loaded = jax.grad(again)(*args)
    np.testing.assert_array_less(_max_diff(grads, want), 1e-6)
    np.testing.assert_array_less(_max_diff(loaded, want), 1e-6)


def _per_device_scan(d_in: int, d_ff: int, batch: int, policy: str | None = None):
    """(loss, (ws, x), mesh): six residual MLP layers stacked and run by `lax.scan` inside a
    shard_map over 4 devices (weights replicated, batch split); `policy`: written around the
    scan's body, as a person would.  Each layer's norm scale and positions as above."""
    mesh = jax.make_mesh((4,), ("data",))

    def step(x, w, pos):
        angle = jnp.cos(pos / 100.0 ** (jnp.arange(d_in, dtype=jnp.float32) / d_in))
        return x + jnp.tanh((x * (w[2] * angle)[None]) @ w[0]) @ w[1], None

    if policy is not None:
        step = jax.checkpoint(step, policy=getattr(jax.checkpoint_policies, policy))

    def body(ws, x):
        pos = jnp.arange(d_in, dtype=jnp.float32)
        return jax.lax.pmean(jnp.mean(jax.lax.scan(lambda x, w: step(x, w, pos), x, ws)[0] ** 2), "data")

    def loss(ws, x):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())(ws, x)

    k = jax.random.split(jax.random.key(1), 3)
    ws = (jax.random.normal(k[0], (6, d_in, d_ff)) / 8, jax.random.normal(k[1], (6, d_ff, d_in)) / 16,
          1 + jnp.arange(6 * d_in, dtype=jnp.float32).reshape(6, d_in) / (6 * d_in))
    ws = jax.device_put(ws, NamedSharding(mesh, P()))
    x = jax.device_put(jax.random.normal(k[2], (batch, d_in)), NamedSharding(mesh, P("data")))
    return loss, (ws, x), mesh


def test_a_scan_over_layers_inside_a_shard_map_is_planned_under_either_remat():
    """The layers stacked and run by `lax.scan` inside the shard_map: the scan's residuals are
    linearized with the mesh's axes bound (`graph._residuals.linearized_in`), so the model sees
    its stacks, and at 70% of the un-optimized peak the plan fits with the function's gradients
    (tolerance as above).  Remat3 off, then on, in one process and for one function: what was
    compiled under one setting is not taken for the other's (`Traced.signature` holds it; it
    did not, and under remat3 the plan found under remat2 compiled to 7930332 bytes over a
    7432076-byte budget)."""
    loss, (ws, x), mesh = _per_device_scan(64, 256, 2048)
    for remat3 in (False, True):
        with remat3_flag(remat3), jax.set_mesh(mesh):
            budget = int(0.7 * compiled_stats(loss, ws, x).peak_bytes)
            opt = autoremat.optimize(loss, budget=budget)
            plan = opt.plan(ws, x)
            assert compiled_stats(opt, ws, x).peak_bytes <= budget, remat3
            grads, want = jax.grad(opt)(ws, x), jax.grad(loss)(ws, x)
        assert plan.scans and plan.meta["inside_shard_map"] == 0
        assert _max_diff(grads, want) < 1e-6


def test_the_stacked_weights_of_a_scan_in_a_shard_map_are_not_copied():
    """Replicated stacked weights that dwarf the activations (as an 8B scan at one example a
    device): at the peak of `nothing_saveable` written around the scan's body, under remat2, the
    plan fits and recomputes no more.  Casting the stack to varying before the scan (needed only
    under remat3, `runtime._apply._cast_varying`) had cost a copy of it: 92.79 against 77.40 GiB
    on the 8B scan (FINDINGS)."""
    loss, args, mesh = _per_device_scan(256, 1024, 64)
    hand, _, _ = _per_device_scan(256, 1024, 64, "nothing_saveable")
    with remat3_flag(False), jax.set_mesh(mesh):
        want = compiled_stats(hand, *args)
        opt = autoremat.optimize(loss, budget=want.peak_bytes)
        got = compiled_stats(opt, *args)
    assert got.peak_bytes <= want.peak_bytes
    assert got.matmul_flops <= want.matmul_flops


@pytest.mark.parametrize("remat3", [False, True])
def test_a_region_whose_invariant_result_is_used_after_it(remat3):
    """A region cut through the body's invariant work: the rotary-style table `t` is made in the
    region, cast to varying in it (so under remat3 its inputs are cast before the checkpoint,
    `runtime._varying`), and used after it, invariant, in a term that reaches the output without
    a `psum`.  The region's `t` would vary; the one used after it is made outside the checkpoint
    from the inputs as they were.  Gradients: the same operations (measured equal)."""
    from autoremat.runtime._plan import Plan, Region
    mesh = jax.make_mesh((4,), ("data",))

    def body(w, x):
        pos = jnp.arange(64.0)
        t = jnp.cos(pos / 100.0 ** (jnp.arange(64.0) / 64))
        y = jnp.tanh((x * t[None]) @ w)
        return jax.lax.pmean(jnp.mean(y**2), "data") + jnp.sum(t * t)

    def loss(w, x):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())(w, x)

    k = jax.random.split(jax.random.key(3))
    w = jax.device_put(jax.random.normal(k[0], (64, 128)) / 8, NamedSharding(mesh, P()))
    x = jax.device_put(jax.random.normal(k[1], (512, 64)), NamedSharding(mesh, P("data")))
    with jax.set_mesh(mesh):
        t = shard_map_body(trace(loss, (w, x)))
    names = [e.primitive.name for e in t.jaxpr.eqns]
    start, stop = names.index("cos"), names.index("tanh") + 1  # the table's last step to the layer's
    plan = Plan(t.fingerprint, len(names), regions=(Region(start, stop, policy="nothing_saveable"),))
    with remat3_flag(remat3), jax.set_mesh(mesh):
        got = jax.jit(jax.grad(autoremat.apply(loss, plan), argnums=(0, 1)))(w, x)
        want = jax.jit(jax.grad(loss, argnums=(0, 1)))(w, x)
    assert _max_diff(got, want) < 1e-6


def _tensor_parallel_stack():
    """(loss, (ws, x), mesh): four residual MLP layers written per device over a (2, 2) mesh,
    Megatron-style: the batch split over "data", each layer's first weight split by columns and
    its second by rows over "model", the layer's output summed over "model"."""
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    spec = [(P(None, "model"), P("model", None), P())] * 4

    def body(ws, x):
        for w1, w2, g in ws:
            x = x + jax.lax.psum(jnp.tanh((x * g[None]) @ w1) @ w2, "model")
        return jax.lax.pmean(jnp.mean(x**2), "data")

    def loss(ws, x):
        return jax.shard_map(body, mesh=mesh, in_specs=(spec, P("data")), out_specs=P())(ws, x)

    k = jax.random.split(jax.random.key(4), 9)
    ws = [(jax.random.normal(k[2 * i], (64, 256)) / 8, jax.random.normal(k[2 * i + 1], (256, 64)) / 16,
           1 + jnp.arange(64.0) / 64) for i in range(4)]
    ws = [tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(w, sp)) for w, sp in zip(ws, spec)]
    return loss, (ws, jax.device_put(jax.random.normal(k[8], (2048, 64)), NamedSharding(mesh, P("data")))), mesh


@pytest.mark.parametrize("remat3", [False, True])
def test_tensor_parallel_layers_written_per_device(remat3):
    """Under remat2 the plan at 70% of the un-optimized peak fits, with the function's gradients.
    Under remat3 a layer's inputs vary over fewer of the mesh's axes than its cast weights (the
    activations over "data" only), which jax 0.10.2's checkpoint replay casts
    (`runtime._varying`): `nothing_saveable` per layer raised there, and now gives the
    function's gradients; its compiled peak there is the un-optimized one (measured; not
    asserted: the cast layer is evaluated outside its checkpoint).  Where JAX replays each input
    as its own type (0.11.2) nothing is cast, and the layers' checkpoints lower the peak."""
    from autoremat.runtime._remat3 import replay_casts_inputs
    from autoremat._hand import layer_plan
    from autoremat.graph._graph import graph_from_traced
    from autoremat.graph._layers import find_layers
    loss, args, mesh = _tensor_parallel_stack()
    with remat3_flag(remat3), jax.set_mesh(mesh):
        want = jax.grad(loss)(*args)
        if remat3:
            g = graph_from_traced(shard_map_body(trace(loss, args)))
            layers = find_layers(g)
            opt = autoremat.apply(loss, layer_plan(g, layers, ["nothing_saveable"] * len(layers)))
            if not replay_casts_inputs():
                assert compiled_stats(opt, *args).peak_bytes < 0.8 * compiled_stats(loss, *args).peak_bytes
        else:
            opt = autoremat.optimize(loss, budget=int(0.7 * compiled_stats(loss, *args).peak_bytes))
            assert compiled_stats(opt, *args).peak_bytes <= opt.budget
        grads = jax.jit(jax.grad(opt))(*args)
    assert _max_diff(grads, want) < 1e-6


def test_the_runtime_casts_for_the_replay_exactly_where_jax_replays_inputs_cast():
    """`replay_casts_inputs` asks JAX by tracing a one-axis probe; it is true exactly where a
    hand-written `jax.checkpoint` per layer of the tensor-parallel stack raises under remat3
    (jax 0.10.2: "pvary is a invariant->variant collective"; 0.11.2 compiles it)."""
    from autoremat.runtime._remat3 import replay_casts_inputs
    _, (ws, x), mesh = _tensor_parallel_stack()

    def body(ws, x):
        layer = jax.checkpoint(lambda x, w1, w2, g: x + jax.lax.psum(jnp.tanh((x * g[None]) @ w1) @ w2, "model"),
                               policy=jax.checkpoint_policies.nothing_saveable)  # made under the flag
        for w in ws:
            x = layer(x, *w)
        return jax.lax.pmean(jnp.mean(x**2), "data")

    spec = [(P(None, "model"), P("model", None), P())] * len(ws)
    with remat3_flag(True), jax.set_mesh(mesh):
        step = jax.grad(lambda ws, x: jax.shard_map(body, mesh=mesh, in_specs=(spec, P("data")), out_specs=P())(ws, x))
        try:
            jax.make_jaxpr(step)(ws, x)
            raised = False
        except ValueError as e:
            raised = "invariant->variant" in str(e)
        assert raised == replay_casts_inputs()  # asked under remat3, as the runtime asks it


def test_a_step_whose_peak_remat_does_not_move_is_answered_without_the_rounds():
    """Data parallel written per device with weights that dwarf each device's activations: JAX's
    policies per layer and no remat all compile to one peak (within bytes), though
    dots_with_no_batch_dims_saveable stores 192 KiB more than nothing_saveable.  Below it the
    search compiled 40-odd plans, all over (1B decoder, one example a device: 46 in 240 s); now
    the half-and-half mix and the plan of lowest predicted peak, no lower, then the answer, with
    the reason (`HandSearch.peak_fixed`, `PlanSearch.peak_moves`)."""
    from autoremat._errors import InfeasibleBudgetError
    from autoremat._optimize import plan_for
    mesh = jax.make_mesh((4,), ("data",))

    def body(ws, x):
        for w1, w2 in ws:
            x = x + jnp.tanh(x @ w1) @ w2
        return jax.lax.pmean(jnp.mean(x**2), "data")

    def loss(ws, x):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())(ws, x)

    k = jax.random.split(jax.random.key(5), 13)
    ws = jax.device_put([(jax.random.normal(k[2 * i], (256, 1024)) / 8, jax.random.normal(k[2 * i + 1], (1024, 256)) / 16)
                         for i in range(6)], NamedSharding(mesh, P()))
    x = jax.device_put(jax.random.normal(k[12], (32, 256)), NamedSharding(mesh, P("data")))
    said = []
    with jax.set_mesh(mesh):
        none = compiled_stats(loss, ws, x).peak_bytes
        with pytest.raises(InfeasibleBudgetError, match="set by what remat does not touch") as e:
            plan_for(loss, none - 4096, (ws, x), progress=said.append)
    assert e.value.lowest > none - 4096
    assert not any(m.lstrip().startswith(("trying", "round")) for m in said), said
    assert sum(m.startswith("hand-written") for m in said) == 4  # three policies and the mix
    assert any(m.lstrip().startswith("lowest predicted peak") and m.endswith("no lower") for m in said), said
