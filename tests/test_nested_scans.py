"""A scan inside a scan's body (an LSTM's scan over time in a scan over layers): plans that keep
the inner body's values, or checkpoint the inner scan inside the outer one, give the original
gradients under remat2 and remat3, and move the compiled peak the way benchmarks/_unseen.py's
`lstm_scan` does at 4 GiB-scale (`solver/_scan_options.py` `_nested_options`); the chain model
offers both, with the FLOPs the compiled step recomputes; the planner reaches below the outer
body's leanest policy."""

from __future__ import annotations

import functools
from dataclasses import replace

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import autoremat
from autoremat._bridge import plan_segments, to_plan
from autoremat._optimize import plan_for
from autoremat.graph._graph import graph_from_traced
from autoremat.graph._trace import describe_eqn, trace
from autoremat.runtime import Plan, ScanPlan, apply, compiled_stats
from autoremat.runtime._export import plan_to_python
from autoremat.solver._chain_model import build_chain_model
from _helpers import assert_trees_close, lstm_cell, remat3_flag

L, B, S, D = 3, 8, 48, 32  # the inner scan's stacked values dominate the step, as at scale


def _layer(h, p):
    xs = (jnp.tanh(h) @ p["w"]).swapaxes(0, 1)
    init = (jnp.zeros_like(h[:, 0]), jnp.zeros_like(h[:, 0]))  # varying like h inside a shard_map
    _, ys = jax.lax.scan(functools.partial(lstm_cell, u=p["u"]), init, xs)
    return h + ys.swapaxes(0, 1)


def loss(params, x, body_policy=None):
    body = lambda h, p: (_layer(h, p), None)  # noqa: E731
    if body_policy is not None:
        body = jax.checkpoint(body, policy=body_policy, prevent_cse=False)
    h, _ = jax.lax.scan(body, x, params)
    return jnp.mean(h ** 2)


def _args():
    kw, ku, kx = jax.random.split(jax.random.key(0), 3)
    params = {"w": jax.random.normal(kw, (L, D, 4 * D)) / D ** 0.5,
              "u": jax.random.normal(ku, (L, D, 4 * D)) / D ** 0.5}
    return params, jax.random.normal(kx, (B, S, D))


@functools.cache
def _traced():
    t = trace(loss, _args())
    g = graph_from_traced(t)
    (outer,) = [o for o in g.ops.values() if o.primitive == "scan"]
    (inner,) = [o for o in outer.bodies[0].ops.values() if o.primitive == "scan"]
    # the pre-activations x + h @ u and the cell state: what the backward needs beyond the carry
    gates = frozenset(o.outputs[0] for o in inner.bodies[0].ops.values() if o.primitive == "add")
    return t, g, outer.id, inner.id, gates


def _plan(scans) -> Plan:
    t = _traced()[0]
    return Plan(t.fingerprint, len(t.jaxpr.eqns), scans=tuple(scans),
                structure=tuple(describe_eqn(e) for e in t.jaxpr.eqns))


def _plans() -> dict[str, Plan]:
    _, _, outer, inner, gates = _traced()
    return {"outer keeps the inner gates": _plan([ScanPlan(outer, saved=gates)]),
            "inner checkpointed inside": _plan([ScanPlan(outer), ScanPlan(inner, saved=gates)]),
            "inner alone": _plan([ScanPlan(inner, policy="nothing_saveable")])}


@pytest.mark.parametrize("remat3", [False, True])
@pytest.mark.parametrize("kind", ["outer keeps the inner gates", "inner checkpointed inside", "inner alone"])
def test_nested_scan_plans_give_the_original_gradients(remat3, kind):
    """f32 throughout: the plans re-run the same equations in another order at most, so the
    gradients agree to rounding (1e-6 relative, as tests/test_runtime.py's plans)."""
    args = _args()
    expected = jax.jit(jax.value_and_grad(loss))(*args)
    with remat3_flag(remat3):
        got = jax.jit(jax.value_and_grad(apply(loss, _plans()[kind])))(*args)
    assert_trees_close(got, expected)


def test_nested_scan_plans_move_the_peak():
    """As on `lstm_scan` at scale: the outer body keeping the inner gates stores less than
    `dots_saveable` on the outer body; nothing outside and the gates inside peak below
    `nothing_saveable` on the outer body, recomputing the same FLOPs."""
    args = _args()
    peak = {k: compiled_stats(apply(loss, p), *args) for k, p in _plans().items()}
    cp = jax.checkpoint_policies
    nothing = compiled_stats(functools.partial(loss, body_policy=cp.nothing_saveable), *args)
    dots = compiled_stats(functools.partial(loss, body_policy=cp.dots_saveable), *args)
    print({k: s.peak_bytes for k, s in peak.items()}, nothing.peak_bytes, dots.peak_bytes)
    assert peak["outer keeps the inner gates"].peak_bytes < dots.peak_bytes
    assert peak["inner checkpointed inside"].peak_bytes < nothing.peak_bytes
    assert peak["inner checkpointed inside"].matmul_flops == nothing.matmul_flops


def test_the_chain_model_offers_nested_options_at_their_compiled_flops():
    """Both families are options of the outer scan's block, and a plan made of one recomputes
    the FLOPs the model says (the jaxpr's, as the benchmarks count them)."""
    t, g, outer, inner, _ = _traced()
    m = build_chain_model(g)
    (i,) = [b.index for b in m.blocks if b.kind == "scan"]
    opts = {o.name: o for o in m.raw_problem.options[(i, i + 1)]}
    base = compiled_stats(loss, *_args()).jaxpr_flops
    for name in ("scan:in:ilp50%", "scan:nest:ilp50%", "scan:inner:ilp50%"):
        o = opts[name]
        segs = tuple(s if s.start != i else replace(s, option=o) for s in m.uniform("none", 1))
        plan = to_plan(m, segs)
        back = plan_segments(m, plan)[i].option  # the inverse: an option of the same family and sets
        assert back.name.rsplit(":", 1)[0] == name.rsplit(":", 1)[0] and back.payload == o.payload
        if "nest" in name:
            assert {s.op for s in plan.scans} == {outer, inner}
        if "inner" in name:  # the outer body left alone
            assert {s.op for s in plan.scans} == {inner}
        extra = compiled_stats(apply(loss, plan), *_args()).jaxpr_flops - base
        assert extra == pytest.approx(o.recompute_flops, rel=0.02, abs=1e6), name


def test_the_planner_reaches_below_the_outer_bodys_leanest_policy():
    """Guarantee (c) of issue 14 and more: `nothing_saveable` on the scan over layers' body is
    the leanest plan a person writes there; a nested plan compiles under it."""
    args = _args()
    nothing = compiled_stats(functools.partial(loss, body_policy=jax.checkpoint_policies.nothing_saveable), *args)
    planned = plan_for(loss, nothing.peak_bytes - 1, args)
    got = compiled_stats(apply(loss, planned.plan), *args)
    assert got.peak_bytes < nothing.peak_bytes
    assert_trees_close(jax.jit(jax.value_and_grad(apply(loss, planned.plan)))(*args),
                       jax.jit(jax.value_and_grad(loss))(*args))


def test_a_nested_plan_exports_one_policy_per_scan_body():
    """An outer policy naming the inner body's values would keep them in the outer body too."""
    plan = _plans()["inner checkpointed inside"]
    text = plan_to_python(plan)
    assert "inside the body of the scan over" in text
    assert "save_only_these_names()" in text  # the outer body keeps nothing of its own
    assert text.count("save_only_these_names(") >= 3  # the shared policy, the outer's, the inner's
    autoremat.Plan.from_json(plan.to_json())  # and it round-trips


@pytest.mark.parametrize("remat3", [False, True])
def test_a_nested_plan_inside_a_shard_map_under_jit(remat3):
    """The same model written per device (the batch split over 4 devices, the loss averaged by
    `pmean`), planned inside the shard_map at a budget under `nothing_saveable` on its outer
    body and run under `jax.jit` with sharded inputs: it fits, with the function's gradients."""
    mesh = jax.make_mesh((4,), ("data",))

    def per_device(body_policy=None):
        def step(params, x):
            return jax.lax.pmean(loss(params, x, body_policy), "data")
        return lambda params, x: jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())(params, x)

    params, x = _args()
    args = (jax.device_put(params, NamedSharding(mesh, P())), jax.device_put(x, NamedSharding(mesh, P("data"))))
    with remat3_flag(False), jax.set_mesh(mesh):  # jax 0.10.2's remat3 cannot replay this policy here
        hand = compiled_stats(per_device(jax.checkpoint_policies.nothing_saveable), *args)
    with remat3_flag(remat3), jax.set_mesh(mesh):
        opt = autoremat.optimize(per_device(), budget=hand.peak_bytes - 1)
        assert compiled_stats(opt, *args).peak_bytes < hand.peak_bytes
        got = jax.jit(jax.value_and_grad(opt))(*args)
        want = jax.jit(jax.value_and_grad(per_device()))(*args)
    assert opt.plan(*args).scans
    assert_trees_close(got, want)
