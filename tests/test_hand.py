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
    compile(code, "exported.py", "exec")
    assert "import autoremat" not in code and "autoremat.apply" not in code and "checkpoint_name" not in code
    assert code.count("policy=cp.nothing_saveable") == 2 and code.count("policy=cp.dots_saveable") == len(layers) - 2


def test_the_summary_says_what_the_plan_beat():
    """`plan.summary()` lists the hand-written plans compiled beside the chosen one (issue 17)."""
    from autoremat._optimize import plan_for

    ex = examples.get_example("mlp_chain")
    none = compiled_stats(ex.fn, *ex.args).peak_bytes
    text = plan_for(ex.fn, int(0.8 * none), ex.args).plan.summary()
    assert "found by:" in text and "hand-written plans compiled for comparison" in text
    assert "nothing_saveable per layer:" in text and "dots_saveable per layer:" in text
