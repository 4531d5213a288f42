"""Tests for the per-equation cost model (autoremat/graph/_costs.py)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.extend.core import Primitive

from autoremat.graph._costs import (
    OpCost,
    aval_bytes,
    aval_size,
    conservatively_costed,
    eqn_cost,
    jaxpr_cost,
    register_cost_rule,
)


def cost_of(f, *args) -> OpCost:
    return jaxpr_cost(jax.make_jaxpr(f)(*args))


def xla_cost(f, *args) -> dict:
    """XLA's cost_analysis as a dict (older JAX returned a one-element list)."""
    analysis = jax.jit(f).lower(*args).compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0]
    return dict(analysis)


def only_eqn(f, *args):
    eqns = jax.make_jaxpr(f)(*args).jaxpr.eqns
    assert len(eqns) == 1, [e.primitive.name for e in eqns]
    return eqns[0]


# ----------------------------------------------------------------------------- OpCost


def test_opcost_arithmetic():
    a = OpCost(flops=1, transcendentals=2, bytes_read=3, bytes_written=4)
    b = OpCost(flops=10, transcendentals=20, bytes_read=30, bytes_written=40, unknown_trip_count=True)
    assert a + b == OpCost(11, 22, 33, 44, True)
    assert a.scale(3) == OpCost(3, 6, 9, 12)
    assert sum([a, a, a]) == a.scale(3)
    assert a.max(OpCost(flops=5)) == OpCost(5, 2, 3, 4)
    assert a.bytes_accessed == 7
    assert isinstance(OpCost(flops=1).flops, float)
    with pytest.raises(TypeError):
        a + 1


# ----------------------------------------------------------------------------- sizes


def test_aval_bytes_and_size():
    assert aval_bytes(jax.ShapeDtypeStruct((3, 4), jnp.float32)) == 48
    assert aval_bytes(jax.ShapeDtypeStruct((3, 4), jnp.bfloat16)) == 24
    assert aval_bytes(jax.ShapeDtypeStruct((), jnp.int8)) == 1
    assert aval_size(jax.ShapeDtypeStruct((2, 0, 5), jnp.float32)) == 0
    assert aval_bytes(jnp.ones((5,), jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)) > 0


def test_aval_bytes_prng_keys_and_tokens():
    keys = jax.random.split(jax.random.key(0), 3)
    assert aval_bytes(keys) == 3 * 8  # threefry key data: 2 x uint32
    split = only_eqn(lambda k: jax.random.split(k, 4), jax.random.key(0))
    cost = eqn_cost(split)
    assert cost.bytes_read == 8 and cost.bytes_written == 4 * 8
    # Tokens and other non-arrays have no bytes.
    assert aval_bytes(object()) == 0
    assert aval_bytes(jax.extend.core.AbstractToken()) == 0


def test_literals_count_as_bytes_read():
    eqn = only_eqn(lambda x: x * 2.0, jnp.ones((4,), jnp.float32))
    assert eqn_cost(eqn) == OpCost(flops=4, bytes_read=16 + 4, bytes_written=16)


# ----------------------------------------------------------------------------- exact FLOPs


@pytest.mark.parametrize("m,k,n", [(2, 3, 4), (16, 32, 8), (1, 7, 1)])
def test_matmul_is_2mnk(m, k, n):
    eqn = only_eqn(lax.dot, jnp.ones((m, k)), jnp.ones((k, n)))
    cost = eqn_cost(eqn)
    assert cost.flops == 2 * m * n * k
    assert cost.transcendentals == 0
    assert cost.bytes_read == 4 * (m * k + k * n)
    assert cost.bytes_written == 4 * m * n


def test_batched_einsum():
    b, h, q, kv, d = 2, 3, 5, 7, 4
    f = lambda x, y: jnp.einsum("bhqd,bhkd->bhqk", x, y)
    cost = cost_of(f, jnp.ones((b, h, q, d)), jnp.ones((b, h, kv, d)))
    assert cost.flops == 2 * (b * h) * q * kv * d


def test_dot_general_several_contracting_and_free_dims():
    lhs, rhs = jnp.ones((2, 3, 4, 5)), jnp.ones((2, 4, 5, 6, 7))
    # batch dim 0, contract (2, 3) with (1, 2); lhs free: 3; rhs free: 6 * 7.
    f = lambda a, b: lax.dot_general(a, b, (((2, 3), (1, 2)), ((0,), (0,))))
    assert eqn_cost(only_eqn(f, lhs, rhs)).flops == 2 * 2 * 3 * (6 * 7) * (4 * 5)


@pytest.mark.parametrize(
    "fgc,bgc,lhs_shape,rhs_shape",
    [
        (1, 1, (2, 8, 12, 12), (4, 8, 3, 3)),
        (2, 1, (2, 8, 12, 12), (4, 4, 3, 3)),  # grouped: kernel has C / 2 input features
        (8, 1, (2, 8, 12, 12), (8, 1, 3, 3)),  # depthwise
        (1, 2, (2, 8, 12, 12), (4, 8, 3, 3)),  # batch groups (weight gradients use these)
    ],
)
def test_conv_flops_match_formula_and_xla(fgc, bgc, lhs_shape, rhs_shape):
    f = lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "VALID", feature_group_count=fgc, batch_group_count=bgc
    )
    x, w = jnp.ones(lhs_shape), jnp.ones(rhs_shape)
    eqn = only_eqn(f, x, w)
    out = eqn.outvars[0].aval
    expected = 2 * math.prod(out.shape) * (rhs_shape[1] * 3 * 3)
    assert eqn_cost(eqn).flops == expected
    # With VALID padding every tap is real, so XLA counts exactly the same.
    assert xla_cost(f, x, w)["flops"] == pytest.approx(expected)


def test_conv_hand_count():
    # N=1, C=3, 8x8 input, O=5, 3x3 kernel, VALID -> 6x6 output.
    f = lambda x, w: lax.conv(x, w, (1, 1), "VALID")
    cost = eqn_cost(only_eqn(f, jnp.ones((1, 3, 8, 8)), jnp.ones((5, 3, 3, 3))))
    assert cost.flops == 2 * (1 * 5 * 6 * 6) * (3 * 3 * 3)


def test_elementwise_one_flop_per_output():
    x = jnp.ones((6, 7))
    assert cost_of(lambda a: a + a, x).flops == 42
    assert cost_of(lambda a: a * 2.0 + 1.0, x).flops == 2 * 42
    assert cost_of(lambda a: jnp.maximum(a, 0.0), x).flops == 42
    assert cost_of(lambda a: jnp.where(a > 0, a, 0.0), x).flops == 2 * 42  # gt + select_n


def test_integer_pow_counts_multiplications():
    x = jnp.ones((10,))
    assert cost_of(lambda a: a**2, x).flops == 10
    assert cost_of(lambda a: a**3, x).flops == 20
    assert cost_of(lambda a: a**8, x).flops == 30  # three squarings


@pytest.mark.parametrize("fn", [jnp.tanh, jnp.exp, jnp.log, jnp.sin, jax.nn.sigmoid, lax.rsqrt])
def test_transcendentals(fn):
    cost = cost_of(fn, jnp.ones((5, 4)))
    assert cost.transcendentals == 20
    assert cost.flops == 0


def test_tanh_transcendentals_match_xla():
    x = jnp.ones((64, 32))
    assert xla_cost(jnp.tanh, x)["transcendentals"] == cost_of(jnp.tanh, x).transcendentals


def test_reductions_count_input_elements():
    x = jnp.ones((8, 16))
    assert cost_of(lambda a: a.sum(), x).flops == 128
    assert cost_of(lambda a: a.max(axis=1), x).flops == 128
    assert eqn_cost(only_eqn(lambda a: lax.argmax(a, 1, jnp.int32), x)).flops == 128
    assert eqn_cost(only_eqn(lambda a: lax.cumsum(a, 0), x)).flops == 128


def test_data_movement_costs_bytes_not_flops():
    x = jnp.ones((4, 6), jnp.float32)
    for f in (
        lambda a: a.reshape(6, 4),
        lambda a: a.T,
        lambda a: lax.slice(a, (0, 0), (2, 6)),
        lambda a: a.astype(jnp.bfloat16),
        lambda a: jnp.broadcast_to(a, (3, 4, 6)),
    ):
        eqn = only_eqn(f, x)
        cost = eqn_cost(eqn)
        assert cost.flops == 0, eqn.primitive.name
        assert cost.bytes_read == 96
        assert cost.bytes_written == aval_bytes(eqn.outvars[0].aval) > 0


def test_checkpoint_name_is_free():
    eqn = only_eqn(lambda a: checkpoint_name(a, "h"), jnp.ones((3,)))
    assert eqn.primitive.name == "name"
    assert eqn_cost(eqn) == OpCost()


def test_scatter_add_counts_updates():
    x, idx, upd = jnp.zeros((10, 4)), jnp.array([1, 3, 5]), jnp.ones((3, 4))
    jaxpr = jax.make_jaxpr(lambda a, i, u: a.at[i].add(u))(x, idx, upd)
    scatters = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scatter-add"]
    assert len(scatters) == 1
    assert eqn_cost(scatters[0]).flops == 12


# ----------------------------------------------------------------------------- registry


def _unknown_primitive(name):
    prim = Primitive(name)
    prim.def_abstract_eval(lambda x: x)
    return prim


def test_unknown_primitive_is_conservative_and_recorded():
    prim = _unknown_primitive("autoremat_test_unknown_op")
    eqn = only_eqn(prim.bind, jnp.ones((3, 5)))
    assert "autoremat_test_unknown_op" not in conservatively_costed()
    assert eqn_cost(eqn) == OpCost(flops=15, bytes_read=60, bytes_written=60)
    assert "autoremat_test_unknown_op" in conservatively_costed()
    # Known primitives are not recorded.
    eqn_cost(only_eqn(lambda a: a + a, jnp.ones(2)))
    assert "add" not in conservatively_costed()


def test_register_cost_rule():
    prim = _unknown_primitive("autoremat_test_ruled_op")
    eqn = only_eqn(prim.bind, jnp.ones((3,)))
    register_cost_rule("autoremat_test_ruled_op", lambda e: OpCost(flops=99))
    assert eqn_cost(eqn).flops == 99
    assert "autoremat_test_ruled_op" not in conservatively_costed()


def test_register_cost_rule_errors():
    with pytest.raises(TypeError, match="must be callable"):
        register_cost_rule("autoremat_test_bad", 3)
    with pytest.raises(TypeError, match="must be a str"):
        register_cost_rule(42, lambda e: OpCost())


def test_jaxpr_cost_rejects_non_jaxprs():
    with pytest.raises(TypeError, match="expects a Jaxpr or ClosedJaxpr, got int"):
        jaxpr_cost(3)


# ----------------------------------------------------------------------------- higher-order


def _mlp_layer(x, w):
    return jnp.tanh(x @ w)


def test_nested_jit_is_costed_through():
    x, w = jnp.ones((8, 16)), jnp.ones((16, 16))
    flat = cost_of(_mlp_layer, x, w)
    nested = jax.jit(lambda x, w: jax.jit(_mlp_layer)(x, w) * 1.0)
    jaxpr = jax.make_jaxpr(nested)(x, w)
    assert jaxpr.jaxpr.eqns[0].primitive.name in ("jit", "pjit")
    assert jaxpr_cost(jaxpr) == flat + OpCost(flops=128, bytes_read=512 + 4, bytes_written=512)
    assert flat.flops == 2 * 8 * 16 * 16


def test_custom_vjp_and_custom_jvp_are_costed_through():
    @jax.custom_vjp
    def f(x, w):
        return _mlp_layer(x, w)

    f.defvjp(lambda x, w: (f(x, w), (x, w)), lambda r, g: (g @ r[1].T, r[0].T @ g))

    @jax.custom_jvp
    def g(x, w):
        return _mlp_layer(x, w)

    g.defjvp(lambda p, t: (g(*p), t[0]))

    x, w = jnp.ones((8, 16)), jnp.ones((16, 16))
    flat = cost_of(_mlp_layer, x, w)
    for fn, prim in ((f, "custom_vjp_call"), (g, "custom_jvp_call")):
        jaxpr = jax.make_jaxpr(fn)(x, w)
        assert [e.primitive.name for e in jaxpr.jaxpr.eqns] == [prim]
        assert jaxpr_cost(jaxpr) == flat


def test_checkpoint_is_costed_through():
    x, w = jnp.ones((8, 16)), jnp.ones((16, 16))
    flat = cost_of(_mlp_layer, x, w)
    assert cost_of(jax.checkpoint(_mlp_layer), x, w) == flat
    previous = jax.config.jax_remat3
    try:
        jax.config.update("jax_remat3", True)
        jaxpr = jax.make_jaxpr(jax.checkpoint(_mlp_layer))(x, w)
        assert jaxpr_cost(jaxpr) == flat
    finally:
        jax.config.update("jax_remat3", previous)


def test_scan_is_body_times_length():
    length = 6
    x, ws = jnp.ones((8, 16)), jnp.ones((length, 16, 16))
    f = lambda x, ws: lax.scan(lambda c, w: (_mlp_layer(c, w), None), x, ws)[0]
    body = cost_of(_mlp_layer, x, ws[0])
    cost = cost_of(f, x, ws)
    assert cost.flops == pytest.approx(length * body.flops)
    assert cost.transcendentals == length * 8 * 16


def test_xla_counts_scan_body_once():
    # docs/FACTS.md fact 6: cost_analysis counts a scan body once, not times its trip count.
    length = 4
    x, ws = jnp.ones((32, 64)), jnp.ones((length, 64, 64))
    f = lambda x, ws: lax.scan(lambda c, w: (_mlp_layer(c, w), None), x, ws)[0]
    ours = cost_of(f, x, ws)
    xla = xla_cost(f, x, ws)
    assert ours.flops / length == pytest.approx(xla["flops"], rel=0.1)
    assert ours.transcendentals / length == pytest.approx(xla["transcendentals"], rel=0.1)


def test_while_counted_once_and_flagged():
    x, w = jnp.ones((8, 16)), jnp.ones((16, 16))
    f = lambda x, w, n: lax.fori_loop(0, n, lambda i, c: _mlp_layer(c, w), x)
    jaxpr = jax.make_jaxpr(f)(x, w, 3)
    assert any(e.primitive.name == "while" for e in jaxpr.jaxpr.eqns)
    cost = jaxpr_cost(jaxpr)
    assert cost.unknown_trip_count
    body = cost_of(_mlp_layer, x, w)
    assert body.flops < cost.flops < 2 * body.flops
    assert not body.unknown_trip_count


def test_cond_is_max_over_branches():
    x, w = jnp.ones((8, 16)), jnp.ones((16, 16))
    f = lambda p, x, w: lax.cond(p, lambda: x @ w, lambda: x + 1.0)
    jaxpr = jax.make_jaxpr(f)(True, x, w)
    conds = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "cond"]
    assert len(conds) == 1
    assert eqn_cost(conds[0]).flops == 2 * 8 * 16 * 16


# ----------------------------------------------------------------------------- against XLA


def _mlp(params, x):
    for w, b in params:
        x = jnp.tanh(x @ w + b[None, :])
    return jnp.sum(x**2)


def _mlp_args(layers=4, width=64, batch=32):
    keys = jax.random.split(jax.random.key(0), layers)
    params = [(jax.random.normal(k, (width, width)) * 0.1, jnp.zeros(width)) for k in keys]
    return params, jnp.ones((batch, width))


def _attention(q, k, v, wo):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1]).astype(np.float32)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    return jnp.einsum("bqhd,hde->bqe", o, wo)


def _convnet(kernels, x):
    for w in kernels:
        dnums = ("NHWC", "HWIO", "NHWC")
        x = jax.nn.relu(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dnums))
    return jnp.mean(x)


@pytest.mark.parametrize(
    "name,fn,args",
    [
        ("mlp", _mlp, _mlp_args()),
        ("mlp_value_and_grad", jax.value_and_grad(_mlp), _mlp_args()),
        ("attention", _attention, (jnp.ones((2, 64, 4, 32)),) * 3 + (jnp.ones((4, 32, 128)),)),
        ("convnet", _convnet, ([jnp.full((3, 3, 8, 8), 0.01)] * 3, jnp.ones((2, 32, 32, 8)))),
        ("convnet_grad", jax.grad(_convnet), ([jnp.full((3, 3, 8, 8), 0.01)] * 3, jnp.ones((2, 32, 32, 8)))),
    ],
)
def test_flops_match_xla_cost_analysis(name, fn, args):
    ours = cost_of(fn, *args)
    xla = xla_cost(fn, *args)
    assert ours.flops == pytest.approx(xla["flops"], rel=0.1), name
    assert ours.transcendentals == pytest.approx(xla.get("transcendentals", 0.0), rel=0.1, abs=2), name
