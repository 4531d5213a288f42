"""Hand-written plans (`autoremat._hand`): what a person writes, as plans autoremat compiles."""

from __future__ import annotations

import json

import jax
import pytest

from autoremat import _hand, examples
from autoremat._errors import PlanFormatError
from autoremat.graph._graph import graph_from_traced
from autoremat.graph._layers import find_layers
from autoremat.graph._trace import trace
from autoremat.runtime import Plan, Region, ScanPlan, apply, compiled_stats
from _helpers import assert_trees_close

CP = jax.checkpoint_policies


def _layers(ex):
    g = graph_from_traced(trace(ex.fn, ex.args))
    return g, find_layers(g)


@pytest.mark.parametrize("name", ["transformer", "transformer_scan"])
@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_layer_plan_is_the_hand_written_policy(name, policy):
    """A policy per found layer compiles to what `jax.checkpoint(layer, policy=...)` written in
    the model compiles to (the scan body: as the example writes it, prevent_cse=False), and
    gives the original gradients."""
    ex = examples.get_example(name)
    g, layers = _layers(ex)
    plan = _hand.layer_plan(g, layers, [policy] * len(layers), prevent_cse=False)
    hand = examples.get_example(name, policy=getattr(CP, policy))
    assert compiled_stats(apply(ex.fn, plan), *ex.args).peak_bytes == compiled_stats(hand.fn, *hand.args).peak_bytes
    saved = {r.decision for r in plan.values.values()}
    assert saved == ({"recompute"} if policy == "nothing_saveable" else {"save", "recompute"})
    expected = jax.jit(jax.value_and_grad(ex.fn))(*ex.args)
    assert_trees_close(jax.jit(jax.value_and_grad(apply(ex.fn, plan)))(*ex.args), expected)


def test_policies_survive_json_and_unknown_ones_are_refused():
    plan = Plan("f", 10, regions=(Region(0, 4, policy="dots_saveable"),),
                scans=(ScanPlan("e5", policy="nothing_saveable", prevent_cse=True),))
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan and again.regions[0].policy == "dots_saveable" and again.scans[0].prevent_cse
    with pytest.raises(PlanFormatError, match="unknown JAX policy 'save_everything'"):
        Region(0, 4, policy="save_everything")
    # A plan written before policies existed still loads (the keys are optional).
    d = plan.to_json()
    del d["regions"][0]["policy"], d["scans"][0]["policy"], d["scans"][0]["prevent_cse"]
    old = Plan.from_json(d)
    assert old.regions[0].policy == "" and not old.scans[0].prevent_cse


def test_a_policy_plan_exports_as_plain_checkpoint_calls():
    ex = examples.get_example("transformer")
    g, layers = _layers(ex)
    pols = ["nothing_saveable"] * 2 + ["dots_saveable"] * (len(layers) - 2)
    code = _hand.layer_plan(g, layers, pols).to_python()
    assert "import autoremat" not in code and "autoremat.apply" not in code and "checkpoint_name" not in code
    namespace: dict = {}
    exec(compile(code, "exported.py", "exec"), namespace)
    assert namespace["LAYER_POLICIES"] == [getattr(CP, p) for p in pols]
    assert "layer 1: _transformer_block (examples.py:" in code


def test_the_summary_says_what_the_plan_beat():
    """`plan.summary()` lists the hand-written plans compiled beside the chosen one (issue 17);
    here dots_saveable per layer fits, so the leaner policies are not compiled."""
    from autoremat._optimize import plan_for

    ex = examples.get_example("mlp_chain")
    none = compiled_stats(ex.fn, *ex.args).peak_bytes
    text = plan_for(ex.fn, int(0.8 * none), ex.args).plan.summary()
    assert "found by:" in text and "hand-written plans compiled for comparison" in text
    assert "dots_saveable per layer:" in text and "nothing_saveable per layer:" not in text
    assert "leaner than one that fits are not compiled" in text


def test_the_solver_sets_per_layer_are_plans_with_the_original_gradients():
    """`_layer_options.ilp_options`: one saved set per layer for each cap, fewer recomputed
    matmul FLOPs as the cap grows; applied per layer, the original gradients."""
    from autoremat._layer_options import ilp_options

    ex = examples.get_example("transformer")
    g, layers = _layers(ex)
    options = ilp_options(g, layers)
    assert len(options) >= 3 and all(len(o.saved) == len(layers) for o in options)
    flops = [o.matmul_flops for o in options]
    assert flops == sorted(flops, reverse=True) and flops[0] > flops[-1]
    middle = options[len(options) // 2]
    plan = _hand.layer_plan(g, layers, list(middle.saved))
    assert sum(r.nbytes for r in plan.values.values() if r.decision == "save") == middle.saved_bytes
    expected = jax.jit(jax.value_and_grad(ex.fn))(*ex.args)
    # float32: a value recomputed inside another fusion than its first computation rounds
    # differently; measured 1.14e-6 on layer 0's wk gradient here (about 10 ulps).
    assert_trees_close(jax.jit(jax.value_and_grad(apply(ex.fn, plan)))(*ex.args), expected, rtol=4e-6)


@pytest.mark.parametrize("remat3", [False, True])
def test_policy_plans_work_under_remat3(remat3):
    """A JAX policy per layer goes through autoremat's checkpoint (the remat3 tie): about the
    same compiled peak with jax_remat3 on and off, and the original gradients."""
    from _helpers import remat3_flag

    ex = examples.get_example("mlp_chain")
    g, layers = _layers(ex)
    plan = _hand.layer_plan(g, layers, ["nothing_saveable"] * len(layers))
    off = compiled_stats(apply(ex.fn, plan), *ex.args).peak_bytes
    with remat3_flag(remat3):
        # Within 0.1%: measured 448 B apart on this 18.5 MiB step (the tie's small buffers);
        # a hand-written jax.checkpoint under remat3 loses its whole saving on XLA:CPU (README).
        assert abs(compiled_stats(apply(ex.fn, plan), *ex.args).peak_bytes - off) <= 0.001 * off
        expected = jax.jit(jax.value_and_grad(ex.fn))(*ex.args)
        assert_trees_close(jax.jit(jax.value_and_grad(apply(ex.fn, plan)))(*ex.args), expected)


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_with_no_batch_dims_saveable"])
def test_recompute_flops_per_layer_match_the_compiled_step(policy):
    """`with_recompute_costs` (the per-layer GFLOP of `plan.summary()`): for a policy per layer
    of the 4-layer transformer, equal in every layer and adding up to the compiled step's extra
    FLOPs within 2% (measured: 2.4481 vs 2.4465 GFLOP, 0.3006 vs 0.3032)."""
    from autoremat._bridge import with_recompute_costs

    ex = examples.get_example("transformer")
    g, layers = _layers(ex)
    plan = with_recompute_costs(g, _hand.layer_plan(g, layers, [policy] * len(layers)))
    per_eqn = plan.meta["recompute_flops"]
    per_layer = [sum(per_eqn.get(str(i), 0.0) for i in range(l.start, l.stop)) for l in layers]
    assert per_layer[0] > 0 and all(f == pytest.approx(per_layer[0]) for f in per_layer)
    none = compiled_stats(ex.fn, *ex.args).jaxpr_flops
    extra = compiled_stats(apply(ex.fn, plan), *ex.args).jaxpr_flops - none
    assert sum(per_eqn.values()) == pytest.approx(extra, rel=0.02)


def test_a_mix_starts_from_the_faster_peak_less_what_each_leaner_layer_stores_less():
    """The first layer count of a mix (before any mix is compiled): the faster option's peak
    less, per leaner layer, its extra saved bytes per layer (the chain formula).  The numbers
    are the 18-layer 1B decoder's (benchmarks/realscale.py): nothing_saveable 9.47 GiB,
    dots_with_no_batch_dims_saveable 13.39 GiB saving 0.33 GiB per layer, where 9 layers of
    the latter fit 10.72 GiB; the line through the two peaks said 5.  Without saved bytes for
    an option (no remat), that line."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    gib = 2**30
    layers = [Layer(i, i + 1, "k") for i in range(18)]
    hand = _hand.HandSearch(SimpleNamespace(traced=None), layers, None, None, lambda m: None)
    hand.points = {"lean": SimpleNamespace(peak=int(9.47 * gib)), "fast": SimpleNamespace(peak=int(13.39 * gib)),
                   None: SimpleNamespace(peak=int(20 * gib))}
    hand.saved_bytes = {"lean": 0, "fast": int(18 * 0.33 * gib)}
    assert hand._first_count("lean", "fast", int(10.72 * gib)) == 9
    assert hand._first_count("lean", "fast", int(13.0 * gib)) == 16
    assert hand._first_count("lean", None, int(10.72 * gib)) == int((10.72 - 9.47) / (20 - 9.47) * 18)
