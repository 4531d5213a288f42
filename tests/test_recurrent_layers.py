"""Unrolled layers that each hold a scan (a stacked RNN's layers, each a scan over time): a
checkpoint around the layer with the scan checkpointed inside it, as the chain model's regions
around a scan (`solver/_chain_model.py` `_Regions.around_scan`) and as a hand-written plan
(`_hand.Nested`: a JAX policy on the layer and on its cell).  JAX keeps the inner checkpoint's
residuals through the outer one, so such a plan compiles like the person's nested
`jax.checkpoint` calls; gradients equal the original's under remat2 and remat3; the export
writes the policy on the cells; the planner reaches below what a policy per layer alone does
(benchmarks/_unseen.py `lstm`: 8.63 GiB where `nothing_saveable` per layer compiles to 18.63)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from autoremat import _hand
from autoremat._bridge import plan_segments, to_plan
from autoremat._optimize import plan_for
from autoremat.graph._graph import graph_from_traced
from autoremat.graph._layers import find_layers
from autoremat.graph._trace import trace
from autoremat.runtime import apply, compiled_stats
from autoremat.runtime._export import plan_to_python
from autoremat.solver._chain_model import AROUND, build_chain_model
from _helpers import assert_trees_close, lstm_cell, remat3_flag

L, B, S, D = 3, 8, 48, 32  # the scans' stacked values dominate the step, as at scale
cp = jax.checkpoint_policies


def _layer(h, p, cell_policy=None):
    xs = (jnp.tanh(h) @ p["w"]).swapaxes(0, 1)
    cell = functools.partial(lstm_cell, u=p["u"])
    if cell_policy is not None:
        cell = jax.checkpoint(cell, policy=cell_policy)
    _, ys = jax.lax.scan(cell, (jnp.zeros_like(h[:, 0]), jnp.zeros_like(h[:, 0])), xs)
    return h + ys.swapaxes(0, 1)


def loss(params, x, policy=None, cell_policy=None):
    """An unrolled stack of LSTM layers; `policy` on each layer and `cell_policy` on each cell, by hand."""
    layer = functools.partial(_layer, cell_policy=cell_policy)
    if policy is not None:
        layer = jax.checkpoint(layer, policy=policy)
    for p in params:
        x = layer(x, p)
    return jnp.mean(x ** 2)


def _args():
    k = jax.random.split(jax.random.key(0), 2 * L + 1)
    params = [{"w": jax.random.normal(k[2 * i], (D, 4 * D)) / D ** 0.5,
               "u": jax.random.normal(k[2 * i + 1], (D, 4 * D)) / D ** 0.5} for i in range(L)]
    return params, jax.random.normal(k[-1], (B, S, D))


@functools.cache
def _model():
    g = graph_from_traced(trace(loss, _args()))
    return g, build_chain_model(g, offload=False), find_layers(g)


def _around(kind: str):
    """`kind` (AROUND + a scan option) on every layer, by the chain's period."""
    _, m, _ = _model()
    offset, size = m.period()
    return m.uniform(AROUND + kind, size, offset=offset)


def _peak(fn) -> int:
    return compiled_stats(fn, *_args()).peak_bytes


def test_regions_around_a_scan_compile_like_the_nested_checkpoints_a_person_writes():
    """The region around each layer with its cell under `nothing_saveable` (or `dots_saveable`)
    compiles within a few hundred bytes of the same nested `jax.checkpoint` calls written by
    hand (XLA places the two programs' buffers alike), well below a policy on the layers alone:
    the cells' residuals are kept through the layers' checkpoints, as the option counts them."""
    _, m, _ = _model()
    for kind, cell in (("scan:recompute", cp.nothing_saveable), ("scan:save:dots", cp.dots_saveable)):
        segs = _around(kind)
        assert segs is not None and all(s.option.name.startswith(AROUND) for s in segs if s.stop - s.start > 1)
        ours = _peak(apply(loss, to_plan(m, segs)))
        hand = _peak(functools.partial(loss, policy=cp.nothing_saveable, cell_policy=cell))
        assert abs(ours - hand) <= 1024, (kind, ours, hand)
    assert _peak(apply(loss, to_plan(m, _around("scan:recompute")))) < 0.8 * _peak(
        functools.partial(loss, policy=cp.nothing_saveable))
    stored = {kind: _around(kind)[1].option.stored_bytes for kind in ("scan:recompute", "scan:save:dots")}
    assert stored["scan:recompute"] < stored["scan:save:dots"]  # what the cell keeps is stored


@pytest.mark.parametrize("remat3", [False, True], ids=["remat2", "remat3"])
def test_regions_around_a_scan_keep_the_gradients(remat3):
    """Recomputation re-runs the same f32 ops: the default 1e-6 relative tolerance."""
    _, m, _ = _model()
    args = _args()
    with remat3_flag(remat3):
        want = jax.jit(jax.grad(loss))(*args)
        for kind in ("scan:recompute", "scan:save:dots"):
            got = jax.jit(jax.grad(apply(loss, to_plan(m, _around(kind)))))(*args)
            assert_trees_close(got, want)


def test_a_plan_around_a_scan_reads_back_into_its_segments_and_exports_its_cells_policy():
    _, m, _ = _model()
    segs = _around("scan:recompute")
    plan = to_plan(m, segs)
    assert plan_segments(m, plan) == segs
    code = plan_to_python(plan)
    assert "policy=jax.checkpoint_policies.save_only_these_names()" in code  # each names its own


def test_hand_written_policies_on_the_layers_and_their_cells():
    """`Nested`: among the hand-written plans where a layer holds a scan, compiled to the
    program of the nested `jax.checkpoint` calls, exported as plain JAX with the cells' policy."""
    g, _, layers = _model()
    labels = [label for _, label, _ in _hand.uniform_plans(g, layers)]
    assert "nothing_saveable per layer and on the scans in it" in labels
    plan = _hand.layer_plan(g, layers, [_hand.Nested("dots_saveable")] * len(layers))
    assert plan.scans_in_regions() and len(plan.scans) == L
    hand = _peak(functools.partial(loss, policy=cp.dots_saveable, cell_policy=cp.dots_saveable))
    assert abs(_peak(apply(loss, plan)) - hand) <= 1024
    code = plan_to_python(plan)
    assert "SCAN_BODY_POLICIES = [cp.dots_saveable, cp.dots_saveable, cp.dots_saveable]" in code
    assert "def remat_scan_body(i, body):" in code


def test_the_planner_reaches_the_nested_plan_below_the_layers_policies():
    """At the nested `nothing_saveable` plan's peak, which every policy on the layers alone or on
    the cells alone compiles above, `plan_for` fits and recomputes no more than it."""
    args = _args()
    nested = compiled_stats(functools.partial(loss, policy=cp.nothing_saveable, cell_policy=cp.nothing_saveable),
                            *args)
    for pol, cell in ((cp.nothing_saveable, None), (None, cp.nothing_saveable)):
        assert _peak(functools.partial(loss, policy=pol, cell_policy=cell)) > nested.peak_bytes
    planned = plan_for(loss, nested.peak_bytes, args)
    st = compiled_stats(apply(loss, planned.plan), *args)
    base = compiled_stats(loss, *args).matmul_flops
    assert st.peak_bytes <= nested.peak_bytes
    assert st.matmul_flops - base <= nested.matmul_flops - base
