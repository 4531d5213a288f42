"""Hand-written plans (`autoremat._hand`): what a person writes, as plans autoremat compiles."""

from __future__ import annotations

import json
import math

import jax
import pytest
from hypothesis import assume, given, settings, strategies as st

from autoremat import _hand, _layer_options, examples
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


@pytest.mark.parametrize("name", ["transformer", "transformer_scan", "convnet"])
@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_layer_plan_is_the_hand_written_policy(name, policy):
    """A policy per found layer compiles to what `jax.checkpoint(layer, policy=...)` written in
    the model compiles to (the scan body: as the example writes it, prevent_cse=False; the
    U-Net: a checkpoint per stage, found from its skips), and gives the original gradients."""
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
    assert "(the search expected " in text  # the peak it compiled the chosen plan on


def test_a_policy_is_expected_at_the_policy_before_it_plus_the_models_difference():
    """The peak expected of a policy per layer before compiling it: the compiled peak of the
    leanest policy compiled so far plus the chain model's difference between the two (the model's
    own figure before any), and `_model_over` says whether that is over the limit."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    model = {"dots_saveable": 200.0, "dots_with_no_batch_dims_saveable": 150.0, "nothing_saveable": 100.0}
    hand = _hand.HandSearch(SimpleNamespace(traced=None), [Layer(i, i + 1, "k") for i in range(4)], None, None,
                            lambda m: None, curve=lambda lean, fast: [0.0, 0.0, 0.0, 0.0, model[fast]])
    assert hand._policy_expected("dots_saveable") == 200.0
    hand.points["dots_saveable"] = SimpleNamespace(peak=260)  # compiled 60 above the model
    assert hand._policy_expected("dots_with_no_batch_dims_saveable") == pytest.approx(210.0)
    assert hand._model_over("dots_with_no_batch_dims_saveable", 200) and not hand._model_over(
        "dots_with_no_batch_dims_saveable", 210)
    hand.points["dots_with_no_batch_dims_saveable"] = SimpleNamespace(peak=230)  # 80 above: the nearer one counts
    assert hand._policy_expected("nothing_saveable") == pytest.approx(180.0)


def test_the_solver_sets_per_layer_are_plans_with_the_original_gradients():
    """`_layer_options.ilp_options`: one saved set per layer for each cap, fewer recomputed
    matmul FLOPs as the fixed caps grow, none empty on every layer (that is `nothing_saveable`,
    a hand-written plan already), and at the bytes JAX's matmul policies may save per layer, sets
    within those bytes; applied per layer, the original gradients."""
    from autoremat._layer_options import POLICY_CAPS, _policy_bytes, ilp_options

    ex = examples.get_example("transformer")
    g, layers = _layers(ex)
    options = ilp_options(g, layers)
    assert len(options) >= 3 and all(len(o.saved) == len(layers) for o in options)
    assert all(any(o.saved) for o in options)
    flops = [o.matmul_flops for o in options if not o.label.startswith("ilp@")]
    assert flops == sorted(flops, reverse=True) and flops[0] > flops[-1]
    at_policy = {o.label[4:]: o for o in options if o.label.startswith("ilp@")}
    assert "dots_with_no_batch_dims_saveable" in at_policy and set(at_policy) <= set(POLICY_CAPS)
    ops = list(g.ops.values())
    for pol, o in at_policy.items():
        assert 0 < o.saved_bytes <= sum(_policy_bytes(g, ops[la.start:la.stop], pol) for la in layers)
    middle = options[len(options) // 2]
    plan = _hand.layer_plan(g, layers, list(middle.saved))
    assert sum(r.nbytes for r in plan.values.values() if r.decision == "save") == middle.saved_bytes
    expected = jax.jit(jax.value_and_grad(ex.fn))(*ex.args)
    # float32: a value recomputed inside another fusion than its first computation rounds
    # differently; measured 1.14e-6 on layer 0's wk gradient here (about 10 ulps).
    assert_trees_close(jax.jit(jax.value_and_grad(apply(ex.fn, plan)))(*ex.args), expected, rtol=4e-6)


def _ssd_stack(n_layers=3, B=2, S=64, D=64, E=128, H=4, N=16, T=16):
    """(loss, args) of a stack of small Mamba-2-style (SSD) mixers: within a chunk of T steps a
    decay-masked matmul, across chunks a `lax.scan` carrying a [B, H, E/H, N] state, so each
    layer holds a scan with a matmul inside (benchmarks/_unseen.py's `ssd`, small)."""
    import jax.numpy as jnp

    P, nc = E // H, S // T

    def layer(h, p):
        z, x, b, c, dt = jnp.split(h @ p["w_in"], [E, 2 * E, 2 * E + N, 2 * E + 2 * N], -1)
        cs = jnp.cumsum(-jax.nn.softplus(dt).reshape(B, nc, T, H), 2)
        xs, bc, cc = x.reshape(B, nc, T, H, P), b.reshape(B, nc, T, N), c.reshape(B, nc, T, N)
        i = jnp.arange(T)
        seg = jnp.where((i[:, None] >= i[None, :])[..., None], cs[:, :, :, None] - cs[:, :, None], -jnp.inf)
        y = jnp.einsum("bcijh,bcjhp->bcihp", jnp.einsum("bcin,bcjn->bcij", cc, bc)[..., None] * jnp.exp(seg), xs)
        states = jnp.einsum("bcjn,bcjh,bcjhp->bchpn", bc, jnp.exp(cs[:, :, -1:] - cs), xs)

        def step(s, inp):
            st, decay, cm, cum = inp
            return s * decay[:, :, None, None] + st, jnp.einsum("bin,bhpn->bihp", cm, s) * jnp.exp(cum)[..., None]
        _, y_off = jax.lax.scan(step, jnp.zeros((B, H, P, N)),
                                tuple(a.swapaxes(0, 1) for a in (states, jnp.exp(cs[:, :, -1]), cc, cs)))
        return h + ((y + y_off.swapaxes(0, 1)).reshape(B, S, E) * jax.nn.silu(z)) @ p["w_out"]

    def loss(ps, x):
        for p in ps:
            x = layer(x, p)
        return jnp.sum(x ** 2)
    keys = jax.random.split(jax.random.key(0), 2 * n_layers + 1)
    ps = [dict(w_in=0.1 * jax.random.normal(keys[2 * k], (D, 2 * E + 2 * N + H)),
               w_out=0.1 * jax.random.normal(keys[2 * k + 1], (E, D))) for k in range(n_layers)]
    return loss, (ps, jax.random.normal(keys[-1], (B, S, D)))


def _custom_vjp_attention_stack(n_layers=3, B=2, S=32, D=32, H=2):
    """(loss, args) of a stack of layers whose attention is a `jax.custom_vjp` keeping q, k, v
    and the output, its backward recomputing the probabilities (benchmarks/unseen.py's
    `vjp_attention`, small): the attention's matmuls are inside the custom_vjp call."""
    import jax.numpy as jnp

    def plain(q, k, v):
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), -1), v)

    @jax.custom_vjp
    def attend(q, k, v):
        return plain(q, k, v)

    def attend_fwd(q, k, v):
        o = plain(q, k, v)
        return o, (q, k, v, o)

    def attend_bwd(res, do):
        return jax.vjp(plain, *res[:3])[1](do)
    attend.defvjp(attend_fwd, attend_bwd)

    def layer(h, p):
        q, k, v = (a.reshape(B, S, H, D // H) for a in jnp.split(h @ p["wqkv"], 3, -1))
        h = h + attend(q, k, v).reshape(B, S, D) @ p["wo"]
        return h + jnp.tanh(h @ p["w1"]) @ p["w2"]

    def loss(ps, x):
        for p in ps:
            x = layer(x, p)
        return jnp.sum(x ** 2)
    keys = iter(jax.random.split(jax.random.key(1), 4 * n_layers + 1))
    shapes = dict(wqkv=(D, 3 * D), wo=(D, D), w1=(D, 2 * D), w2=(2 * D, D))
    ps = [{w: 0.1 * jax.random.normal(next(keys), s) for w, s in shapes.items()} for _ in range(n_layers)]
    return loss, (ps, jax.random.normal(next(keys), (B, S, D)))


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable"])
@pytest.mark.parametrize("stack", ["ssd", "custom_vjp"])
def test_the_matmul_flops_a_layer_recomputes_count_those_inside_its_scan(policy, stack):
    """`policy_layer_flops` (what the mix search and the solver's sets count a layer's
    recomputation by) counts the matmuls inside a scan or a custom_vjp call the layer
    recomputes, less those the policy saves inside it: equal to the compiled step's extra
    matmul FLOPs with the policy per layer (the same cost rules, so exactly).  Counting only the
    layer's own matmuls, it missed the scan's: on the SSD decoder of benchmarks/unseen.py the
    solver's ilp25% set counted 138.5 GFLOP where its compile recomputed 276, and ruled out the
    8 + 8 policies' mix that recomputes 208.8 (benchmarks/budget_log.py --model ssd --only
    '8 dots_saveable')."""
    fn, args = _ssd_stack() if stack == "ssd" else _custom_vjp_attention_stack()
    g = graph_from_traced(trace(fn, args))
    layers = find_layers(g)
    assert len(layers) == 3
    nested = next(op for op in g.ops.values() if op.primitive in ("scan", "custom_vjp_call"))
    assert nested.matmul_flops >= nested.batched_matmul_flops > 0
    if stack == "ssd":
        body_dots = sum(op.cost.flops for op in nested.bodies[0].ops.values() if op.primitive == "dot_general")
        assert nested.matmul_flops == nested.params["length"] * body_dots
    plan = _hand.layer_plan(g, layers, [policy] * len(layers))
    extra = compiled_stats(apply(fn, plan), *args).matmul_flops - compiled_stats(fn, *args).matmul_flops
    assert sum(_layer_options.policy_layer_flops(g, layers, policy)) == pytest.approx(extra, rel=1e-9, abs=1.0)


def test_the_solver_sets_per_layer_are_the_same_every_time():
    """The region solver's saved sets per layer (`ilp_options`) do not change from solve to
    solve: on the SSD layer several sets tie, and CP-SAT with two workers returned 2 different
    ones in 20 solves (the benchmark's 1B SSD decoder: three sets in three processes, compiling
    15.43-15.46 GiB around a 15.44 budget), so a plan depended on the run.  One worker: one."""
    fn, args = _ssd_stack()
    g = graph_from_traced(trace(fn, args))
    layers = find_layers(g)
    first = _layer_options.ilp_options(g, layers)
    assert first
    for _ in range(19):
        assert _layer_options.ilp_options(g, layers) == first


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
    FLOPs within 2% (measured: 2.4481 vs 2.4465 GFLOP, 0.3006 vs 0.3032); likewise the matmul
    FLOPs per layer that the mix search counts (`policy_layer_flops`)."""
    from autoremat._bridge import with_recompute_costs

    ex = examples.get_example("transformer")
    g, layers = _layers(ex)
    plan = with_recompute_costs(g, _hand.layer_plan(g, layers, [policy] * len(layers)))
    per_eqn = plan.meta["recompute_flops"]
    per_layer = [sum(per_eqn.get(str(i), 0.0) for i in range(l.start, l.stop)) for l in layers]
    assert per_layer[0] > 0 and all(f == pytest.approx(per_layer[0]) for f in per_layer)
    none = compiled_stats(ex.fn, *ex.args)
    got = compiled_stats(apply(ex.fn, plan), *ex.args)
    assert sum(per_eqn.values()) == pytest.approx(got.jaxpr_flops - none.jaxpr_flops, rel=0.02)
    # the matmul FLOPs each layer recomputes, as the mix search counts them (`_mix_flops`)
    per_layer = _layer_options.policy_layer_flops(g, layers, policy)
    assert per_layer[0] > 0 and all(f == per_layer[0] for f in per_layer)
    assert sum(per_layer) == pytest.approx(got.matmul_flops - none.matmul_flops, rel=0.02)


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


def _mix_search(ilp_flops: float):
    """A HandSearch over 18 identical layers whose compiles follow a line per pair of options:
    the H100 figures of the 1B decoder (gpu-h100-realscale.md; GiB, GFLOP), where the saved
    bytes under-estimate dots_with_no_batch_dims_saveable's step per layer (0.26 GiB against
    0.30 compiled), so the policies' mix starts at 7 layers, not the 9 that fit 9.22 GiB."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    gib, n = 2**30, 18
    layers = [Layer(i, i + 1, "k") for i in range(n)]
    hand = _hand.HandSearch(SimpleNamespace(traced=None), layers, None, None, lambda m: None)
    uniform = {"nothing_saveable": (6.54, 14225.0), "dots_with_no_batch_dims_saveable": (11.89, 2474.0),
               "ilp10%": (8.81, ilp_flops), None: (32.1, 0.0)}
    hand.points = {o: _hand.HandPlan(str(o), None, int(p * gib), f * 1e9) for o, (p, f) in uniform.items()}
    hand.choice = {o: (lambda k, o=o: o) for o in uniform}
    hand.saved_bytes = {"nothing_saveable": 0, "dots_with_no_batch_dims_saveable": int(n * 0.26 * gib),
                        "ilp10%": int(n * 0.07 * gib)}
    compiled = []

    def plan(options, label, ahead=(), expected=None):
        compiled.append(label)
        lean, fast = options[0], options[-1]
        k = sum(o == fast for o in options)
        (pa, fa), (pb, fb) = uniform[lean], uniform[fast]
        peak = int((pa + k / n * (pb - pa)) * gib)
        plan.expected[label] = (expected, peak)
        return _hand.HandPlan(label, None, peak, (fa + k / n * (fb - fa)) * 1e9)

    plan.expected = {}  # label -> (the peak the search expected of it, the peak it compiled to)
    hand.plan = plan
    # the chain model's peak of a mix with no remat on its last layers (the planner has one for
    # every pair of JAX's policies and no remat, `_search.mix_curve`): here the compiles' own line
    hand.curve = lambda lean, fast: (None if fast is not None or lean not in uniform else
                                     [int((uniform[lean][0] + k / n * (32.1 - uniform[lean][0])) * gib)
                                      for k in range(n + 1)])
    return hand, compiled, int(9.22 * gib)


def test_each_mix_count_is_compiled_with_the_peak_the_search_expected():
    """Every mix count is compiled with the peak the search expected of it (what its predictions
    are judged by in benchmarks/realscale.py): a pair's first count's from the faster option's
    compiled peak less the bytes step (0.19 and 0.26 GiB a layer here, where the compiles step by
    0.17 and 0.30: off by a few percent); until a count fits, from the count compiled over less
    that step a layer (within 1% here, one count away); after one fits, from the line through
    the compiled peaks either side (exact here, where the compiled peaks of a pair lie on a line)."""
    hand, compiled, limit = _mix_search(ilp_flops=9277.0)
    hand.mix(limit)
    pairs: dict[str, list] = {}
    for label in compiled:  # "<n - k> layers <lean>, <k> layers <fast>"
        pairs.setdefault(label.split(", ")[0].split(" ", 1)[1], []).append(hand.plan.expected[label])
    assert len(pairs) == 2 and all(len(seen) >= 2 for seen in pairs.values())
    for (first, first_peak), *rest in pairs.values():
        assert first != first_peak and abs(first - first_peak) < 0.05 * first_peak
        fitted = first_peak <= limit
        for expected, peak in rest:
            assert expected == pytest.approx(peak, rel=1e-6 if fitted else 0.01)
            fitted = fitted or peak <= limit


def test_the_policies_mix_is_tried_wherever_it_could_beat_a_solver_sets_mix():
    """On the H100 the solver's ilp10% set fitted the hand-written mix's 9.22 GiB and its mix
    was predicted best, so the policies' mix (9 + 9 layers, +8.35 TFLOP) was never compiled and
    autoremat returned +8.52.  The policies' pair is now tried from the count where it would
    recompute less than the best compiled so far (9 here: its first count, 7, cannot win); where
    that count is over, one compile says so."""
    hand, compiled, limit = _mix_search(ilp_flops=9277.0)
    assert hand._pairs(limit)[0][1] == "ilp10%"  # predicted best: the case that lost
    best = hand.mix(limit)
    assert best.label == "9 layers nothing_saveable, 9 layers dots_with_no_batch_dims_saveable"
    policy_mixes = [label for label in compiled if "nothing_saveable" in label]
    assert policy_mixes == [best.label, "8 layers nothing_saveable, 10 layers dots_with_no_batch_dims_saveable"]

    hand, compiled, limit = _mix_search(ilp_flops=7000.0)  # now the solver's pair wins
    best = hand.mix(limit)
    assert best.label.startswith("16 layers the solver's ilp10% set") and best.extra_flops < 8349.5e9
    # +6.50 TFLOP needs 12 layers of the faster policy: over the budget, so not one more compile
    assert [label for label in compiled if "nothing_saveable" in label] == [
        "6 layers nothing_saveable, 12 layers dots_with_no_batch_dims_saveable"]


def test_the_mixes_are_tried_again_where_a_solver_set_recomputes_more_than_counted():
    """The mix search prunes pairs by the fewest FLOPs of an option that fits, a solver's set
    among them at its counted FLOPs, before it is compiled.  Where the set compiled alone
    recomputes more than that (a Mamba-2-style decoder's ilp25% set: counted 138.5 GFLOP,
    compiled 276), the pairs it ruled out are tried again: here the policies' 9 + 9 mix, which
    could not beat the set's 5000 counted GFLOP and beats its 9277 compiled."""
    hand, compiled, limit = _mix_search(ilp_flops=9277.0)
    gib = 2**30
    hand.points["ilp10%"] = _hand.HandPlan("ilp10%", None, int(8.81 * gib), 5000e9, compiled=False)
    hand.compile = lambda plan, label, *a, **k: _hand.HandPlan(label, None, int(8.81 * gib), 9277e9)
    best = [hand.mix(limit)]
    assert not any("nothing_saveable, 9 layers" in label for label in compiled)
    while hand.sets_alone(limit):
        best.append(hand.mix(limit))
    assert hand.points["ilp10%"].compiled and hand.points["ilp10%"].extra_flops == 9277e9
    assert "9 layers nothing_saveable, 9 layers dots_with_no_batch_dims_saveable" in [
        b.label for b in best if b is not None]


def test_two_mix_pairs_are_settled_together_so_a_pair_compiling_over_gives_way():
    """GPT 1B at its 13.34 GiB mix budget (benchmarks/budget_log.py --model gpt): the policies'
    first count, 13 of 24 layers of dots_with_no_batch_dims_saveable by the bytes step (0.25 GiB
    a layer, where the compiles step by 0.22), compiled over; settling that pair first took one
    more compile (12 layers, +8.25 TFLOP), then the solver set's pair three more from its
    fewest winning count (5, 6 fitting, 7 over).  Settled together, the set's predicted 6 layers
    (+7.83) goes next, and its win leaves no count of the policies' pair that could beat it
    and is not known over: three compiles, the same answer, and it still beats every policy mix
    that fits.  The compiles here follow lines through GPT's compiled mixes (GiB, GFLOP)."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    gib, n = 2**30, 24
    layers = [Layer(i, i + 1, "k") for i in range(n)]
    hand = _hand.HandSearch(SimpleNamespace(traced=None), layers, None, None, lambda m: None)
    nothing, dbd = "nothing_saveable", "dots_with_no_batch_dims_saveable"
    uniform = {nothing: (10.71, 14843.0), dbd: (16.00, 1649.0), "ilp10%": (12.78, 9896.0)}
    hand.points = {o: _hand.HandPlan(o, None, int(p * gib), f * 1e9, compiled=o != "ilp10%")
                   for o, (p, f) in uniform.items()}
    hand.choice = {o: (lambda k, o=o: o) for o in uniform}
    hand.saved_bytes = {nothing: 0, dbd: int(n * 0.25 * gib), "ilp10%": int(n * (0.25 - 0.153) * gib)}
    lines = {nothing: (10.71, 0.2195), "ilp10%": (12.27, 0.1554)}  # the compiled mixes with dbd: GiB + GiB/layer
    compiled = []

    def plan(options, label, ahead=(), expected=None):
        lean, k = options[0], sum(o == dbd for o in options)
        compiled.append((lean, k))
        (p0, step), fa = lines[lean], uniform[lean][1]
        return _hand.HandPlan(label, None, int((p0 + k * step) * gib), (fa + k / n * (1649.0 - fa)) * 1e9)

    hand.plan = plan
    limit = int(13.35 * gib)
    best = hand.mix(limit)
    assert compiled == [(nothing, 13), ("ilp10%", 6), ("ilp10%", 7)]
    assert best.label == "18 layers the solver's ilp10% set, 6 layers dots_with_no_batch_dims_saveable"
    policy_mixes = [k for k in range(n + 1) if lines[nothing][0] + k * lines[nothing][1] <= 13.35]
    assert best.extra_flops < (14843.0 + max(policy_mixes) / n * (1649.0 - 14843.0)) * 1e9


@st.composite
def _mix_cases(draw):
    """Pairs over `n` alike layers: JAX's leanest policy with each of two faster ones (the
    fastest stores what the middle one stores and more), whose mixes compile on the chain
    formula's shape (the leaner policy's own peak, or the faster one's less what the leaner
    layers store less) and whose bytes step the search reads off by -1..+30% (at most +0.7%
    over-predicted in benchmarks/results/mix_counts.md), and a solver set's with each faster
    policy, whose mixes compile to any peaks that grow with the count."""
    n = draw(st.integers(2, 24))
    lean, total = draw(st.floats(4.0, 12.0)), draw(st.floats(0.5, 8.0))
    own = lean + total * draw(st.floats(0.0, 0.9))  # the mixes' floor: the leaner policy's own backward
    totals = (total, total * draw(st.floats(1.0, 3.0)))  # the middle policy's and the fastest one's
    policies = [[max(own, lean + t - (n - k) * t / n) for k in range(n + 1)] for t in totals]
    # the leaner policy alone below that floor, or at it (its mixes then compile to its own peak up
    # to some count, as the alternating decoder's under FSDP: sharded_unseen.md)
    alone = draw(st.sampled_from([lean, own]))
    for curve in policies:
        curve[0] = alone
    set_peak = draw(st.floats(lean, lean + total))
    rises = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    sets = [[set_peak + (lean + t - set_peak) * sum(rises[:k]) / max(sum(rises), 1e-9) for k in range(n + 1)]
            for t in totals]
    flops = (14000.0, draw(st.floats(500.0, 3000.0)))
    flops += (draw(st.floats(flops[1] + 1, flops[0] - 1)), draw(st.floats(0.0, flops[1])))
    # the budget: anywhere between the lean policy and the fastest, or a hand mix's own compiled
    # peak (as in benchmarks/realscale.py, where the counts either side are the ones to tell apart)
    mixes = policies[0][1:-1] + policies[1][1:-1]
    limit = draw(st.one_of(st.floats(lean, lean + totals[1]), st.sampled_from(mixes or [lean])))
    # the solver's first round, compiled among the mixes: none fitting, or one that fits and
    # recomputes anything from nothing to more than the lean policy
    solver = draw(st.one_of(st.just(math.inf), st.floats(0.0, 16000.0)))
    return (n, lean, policies, sets, flops, limit, draw(st.one_of(st.floats(-0.01, 0.01), st.floats(0.01, 0.3))),
            draw(st.floats(-0.08, 0.08)), solver)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_mix_cases())
def test_the_mix_search_never_loses_to_a_policy_mix_that_fits(case):
    """Guarantee (a) of issue 14 for the mix search (`HandSearch.mix`): whatever the order in
    which the pairs' counts are compiled, the plan returned fits and recomputes no more than any
    mix of two policies that compiles within the budget (nor than the leaner policy alone,
    compiled before the mixes), and no count is compiled twice.  A rival that fits (the solver's
    first round, compiled among the mixes: `_rival_first`) bounds them: the better of it and the
    mix returned recomputes no more than any such mix, and no mix compiled after it recomputes
    more."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    n, lean_gib, policies, sets, (fa, fb, fs, fc), limit_gib, step_err, set_err, solver = case
    totals = [curve[n] - lean_gib for curve in policies]
    gib, lean, fast, fastest = 2**30, "nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable"
    limit = int(limit_gib * gib)
    hand = _hand.HandSearch(SimpleNamespace(traced=None), [Layer(i, i + 1, "k") for i in range(n)], None, None,
                            lambda m: None,
                            best_fit=lambda lim: solver * 1e9 if ("rival",) in compiled else math.inf)
    hand.rival = (solver * 1e9, lambda: compiled.append(("rival",)) or True)
    set_pred = sets[0][0] * (1 + set_err)
    assume(int(set_pred * gib) > limit)  # predicted to fit alone, a set bounds the mixes (`sets_alone`'s case)
    hand.points = {lean: _hand.HandPlan(lean, None, int(policies[0][0] * gib), fa * 1e9),
                   fast: _hand.HandPlan(fast, None, int(policies[0][n] * gib), fb * 1e9),
                   fastest: _hand.HandPlan(fastest, None, int(policies[1][n] * gib), fc * 1e9),
                   "ilp10%": _hand.HandPlan("ilp10%", None, int(set_pred * gib), fs * 1e9, compiled=False)}
    hand.choice = {o: (lambda k, o=o: o) for o in hand.points}
    stored = [t * (1 + step_err) * gib for t in totals]  # what the faster policies store beyond the lean one
    hand.saved_bytes = {lean: 0, fast: int(stored[0]), fastest: int(stored[1]), "ilp10%": int(stored[0] * fb / fs)}
    between = [max(policies[0][n], policies[1][n] - (n - k) * (totals[1] - totals[0]) / n) for k in range(n + 1)]
    curves = {(lean, fast): policies[0], (lean, fastest): policies[1], (fast, fastest): between,
              ("ilp10%", fast): sets[0], ("ilp10%", fastest): sets[1],
              (lean, "ilp10%"): [policies[0][0] + (sets[0][0] - policies[0][0]) * k / n for k in range(n + 1)]}
    flops = {lean: fa, fast: fb, fastest: fc, "ilp10%": fs}
    compiled = []

    def plan(options, label, ahead=(), expected=None):
        first, last = options[0], options[-1]
        k = sum(o == last for o in options)
        compiled.append((first, last, k))
        f = flops[first] + k / n * (flops[last] - flops[first])
        return _hand.HandPlan(label, None, int(curves[(first, last)][k] * gib), f * 1e9)

    hand.plan = plan
    best = hand.mix(limit)
    assert best is None or best.peak <= limit
    got = min(best.extra_flops if best else math.inf, fa * 1e9 if policies[0][0] * gib <= limit else math.inf,
              fb * 1e9 if policies[0][n] * gib <= limit else math.inf, solver * 1e9)
    pairs = ((policies[0], fa, fb), (policies[1], fa, fc), (between, fb, fc))
    fitting = [(f0 + k / n * (f1 - f0)) * 1e9 for curve, f0, f1 in pairs for k in range(1, n)
               if int(curve[k] * gib) <= limit]
    assert got <= min(fitting, default=math.inf), (compiled, best and best.label)
    assert len(compiled) == len(set(compiled))
    if ("rival",) in compiled and solver < math.inf:  # it fitted: no mix after it recomputes more
        after = compiled[compiled.index(("rival",)) + 1:]
        assert all((flops[a] + k / n * (flops[b] - flops[a])) * 1e9 < solver * 1e9 for a, b, k in after), compiled


def test_a_mix_whose_peak_does_not_rise_at_first_is_bisected_not_stepped():
    """The alternating local/global decoder on 8 devices, FSDP (benchmarks/results/sharded_unseen.md):
    up to 6 of its 12 layers dots_with_no_batch_dims_saveable (the rest nothing_saveable) compile
    to nothing_saveable's own peak, to 64 bytes a layer, then the peak rises 80 MiB a layer.  At
    the 6 + 6 mix's own peak the line through the last count that fits and the first over never
    leaves room for another count, so the search stepped one count a compile and stopped at 5
    (MAX_MIX_STEPS: 43.98 TFLOP against the mix's 39.58); on the plateau it now bisects."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    n, lean, fast = 12, "nothing_saveable", "dots_with_no_batch_dims_saveable"
    peaks = [8017348532 + 64 * k if k <= 6 else 8017348916 + (k - 6) * 83886144 for k in range(n)] + [8956873396]
    layers = [Layer(i, i + 1, "local" if i % 2 == 0 else "global") for i in range(n)]
    hand = _hand.HandSearch(SimpleNamespace(traced=None), layers, None, None, lambda m: None)
    hand.points = {lean: _hand.HandPlan(lean, None, peaks[0], 65971e9), fast: _hand.HandPlan(fast, None, peaks[n], 13194e9)}
    hand.choice = {o: (lambda k, o=o: o) for o in hand.points}
    hand.saved_bytes = {lean: 0, fast: peaks[n] - peaks[0]}
    compiled = []

    def plan(options, label, ahead=(), expected=None):
        k = sum(o == fast for o in options)
        compiled.append(k)
        return _hand.HandPlan(label, None, peaks[k], (65971 + k / n * (13194 - 65971)) * 1e9)

    hand.plan = plan
    best = hand.mix(peaks[6])
    assert best.label == f"6 layers {lean}, 6 layers {fast}", compiled
    assert compiled == [1, 6, 9, 7]


def _resnet_h100_search(none_peak: float, keys, curves: dict):
    """A HandSearch over ResNet-50's 16 blocks at the H100's compiled figures (batch 1536; GiB,
    GFLOP: gpu-h100-realscale-fill.md), the budget its 8 dots_with_no_batch_dims_saveable + 8
    dots_saveable mix's 30.63 GiB.  The mixes of the two policies compile flat at the leaner one's
    peak up to 4 blocks of the faster one, to 30.63 at 8, to 54.03 at 16; the solver set's as on
    the H100 (26.70 GiB at 2 blocks of dots_saveable .. 30.88 at 7).  `curves`: the chain model's
    peak per count of some pairs (`HandSearch.curve`)."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    gib, n = 2**30, 16
    nothing, dbd, dots = "nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable"
    hand = _hand.HandSearch(SimpleNamespace(traced=None), [Layer(i, i + 1, key) for i, key in enumerate(keys)],
                            None, None, lambda m: None)
    uniform = {None: (none_peak, 0.0), nothing: (25.39, 12193.0), dbd: (25.39, 12193.0), dots: (54.03, 0.0),
               "ilp10%": (26.77, 10770.0)}
    hand.points = {o: _hand.HandPlan(str(o), None, int(p * gib), f * 1e9, compiled=o != "ilp10%")
                   for o, (p, f) in uniform.items()}
    hand.choice = {o: (lambda k, o=o: o) for o in uniform}
    hand.saved_bytes = {nothing: 0, dbd: 0, dots: int(n * 2.0 * gib), "ilp10%": int(n * 0.2 * gib)}
    hand.curve = lambda lean, fast: curves.get((lean, fast))
    peaks = {dbd: lambda k: 25.39 if k <= 4 else 25.39 + (k - 4) * 1.31 if k <= 8 else 30.63 + (k - 8) * 2.925,
             "ilp10%": lambda k: 25.02 + 0.84 * k, None: lambda k: 25.39 + 2.43 * k}
    compiled = []

    def plan(options, label, ahead=(), expected=None):
        lean, fast = options[0], options[-1]
        k = sum(o == fast for o in options)
        compiled.append((lean, fast, k))
        fa, fb = uniform[lean][1], uniform[fast][1]
        return _hand.HandPlan(label, None, int(peaks[lean](k) * gib), (fa + k / n * (fb - fa)) * 1e9)

    hand.plan = plan
    return hand, compiled, int(30.63 * gib)


def test_every_pair_of_policies_is_tried_not_only_the_one_predicted_best():
    """ResNet-50 on the H100 (batch 1536, gpu-h100-realscale-fill.md) at its 8
    dots_with_no_batch_dims_saveable + 8 dots_saveable mix's 30.63 GiB: of the pairs of policies
    only the one predicted to recompute least was tried, dots_with_no_batch_dims_saveable with no
    remat on the last layers; its fewest winning count was predicted well over, so it was
    dropped uncompiled, and the pair the person wrote was never tried: autoremat settled the
    solver set's mix at +6.63 TFLOP against the hand mix's +6.35.  Every pair of policies on
    the front of peak against FLOPs is now a candidate (nothing_saveable, which compiled to the
    same peak and FLOPs as dots_with_no_batch_dims_saveable, is not)."""
    gib, dbd, dots = 2**30, "dots_with_no_batch_dims_saveable", "dots_saveable"
    flat_then_rising = [0] * 7 + [int((k - 6) * 2 * gib) for k in range(7, 17)]  # the model's no-remat mix
    hand, compiled, limit = _resnet_h100_search(64.30, ["k"] * 16, {(dbd, None): flat_then_rising})
    assert hand._pairs(limit)[0][1:3] == (dbd, None)  # predicted best, and dropped uncompiled
    best = hand.mix(limit)
    assert best.peak <= limit and best.extra_flops <= 12193.0 * 8 / 16 * 1e9, compiled
    assert best.label == f"8 layers {dbd}, 8 layers {dots}", compiled
    assert not [c for c in compiled if c[0] == "nothing_saveable" or c[1] is None]


def test_a_pair_is_not_dropped_on_the_models_fall_where_the_compiled_peaks_say_it_may_fit():
    """ResNet-50 on the H100 again, with every pair of policies a candidate (GiB, GFLOP;
    benchmarks/results/gpu-h100-resnet-mix.log): the pair written by hand,
    dots_with_no_batch_dims_saveable with dots_saveable on the last blocks, needed 3 blocks of the
    latter to beat the solver set's predicted +10.77 TFLOP, and the model's fall from 16 such
    blocks to 3 (21.96 GiB, where the compiled peaks fall 28.64 from 16 to none) put that count
    at 32.07 GiB, over the 30.63 budget by more than FALL_SLACK: dropped uncompiled, and the set's
    10 + 6 returned again (+6.63 against +6.35).  The model's shape is flat over the small last
    blocks (as on the CPU, `test_a_mix_of_unlike_layers_is_found_on_the_models_peak_per_count`),
    so the line through the two policies' compiled peaks with that shape says 25.39 there: now a
    pair is dropped only where both say over."""
    gib, dbd, dots = 2**30, "dots_with_no_batch_dims_saveable", "dots_saveable"
    model = [0] * 9 + [int((k - 8) * 21.96 / 8 * gib) for k in range(9, 17)]  # flat over 8 last blocks
    hand, compiled, limit = _resnet_h100_search(72.92, [f"stage{i // 4}" for i in range(16)], {(dbd, dots): model})
    assert hand._fall(dbd, dots, 3) > limit * (1 + _hand.FALL_SLACK)  # the model's fall alone: over
    best = hand.mix(limit)
    assert best.label == f"8 layers {dbd}, 8 layers {dots}", compiled


def test_a_count_over_with_a_leaner_fast_policy_is_over_with_a_fuller_one():
    """Equinox 1B at nothing_saveable's own 6.90 GiB (benchmarks/budget_log.py --model equinox):
    11 + 1 layers of it and dots_with_no_batch_dims_saveable compiled to 7.02 GiB, over; the same
    count with dots_saveable, which stores what that policy stores and more, was compiled next
    (7.27 GiB), a whole-step compile whose answer was known.  No remat, matched in peak and
    FLOPs by dots_saveable, pairs with nothing."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    gib, n = 2**30, 12
    nothing, dbd, dots = "nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable"
    hand = _hand.HandSearch(SimpleNamespace(traced=None), [Layer(i, i + 1, "k") for i in range(n)], None, None,
                            lambda m: None)
    uniform = {None: (46.33, 0.0), nothing: (6.90, 7422.0), dbd: (9.52, 824.6), dots: (12.90, 0.0)}
    hand.points = {o: _hand.HandPlan(str(o), None, int(p * gib), f * 1e9) for o, (p, f) in uniform.items()}
    hand.choice = {o: (lambda k, o=o: o) for o in uniform}
    hand.saved_bytes = {nothing: 0, dbd: int(n * 0.24 * gib), dots: int(n * 0.53 * gib)}  # 1 + 11 expected to fit
    rise = {dbd: 0.12, dots: 0.37}  # GiB a layer of the faster policy
    compiled = []

    def plan(options, label, ahead=(), expected=None):
        fast = options[-1]
        k = sum(o == fast for o in options)
        compiled.append((fast, k))
        return _hand.HandPlan(label, None, int((6.90 + rise[fast] * k) * gib),
                              (7422.0 + k / n * (uniform[fast][1] - 7422.0)) * 1e9)

    hand.plan = plan
    limit = int(6.90 * gib)
    assert {p[1:3] for p in hand._pairs(limit)} >= {(nothing, dbd), (nothing, dots)}
    assert hand.mix(limit) is None
    assert compiled == [(dbd, 1)]


def test_a_pair_whose_fewest_winning_count_is_predicted_well_over_the_budget_is_not_compiled():
    """GPT 1B at its dots_with_no_batch_dims_saveable + dots_saveable mix budget (19.37 GiB): the
    policies' pair needed 15 of 24 layers of the faster policy to beat the solver set's mix, and
    that compile came out at 20.21 GiB, the faster policy's compiled peak less the model's fall
    to 15 layers (benchmarks/budget_log.py --model gpt --only mix).  So such a count is not
    compiled where that prediction is over by more than FALL_SLACK, and is where it is not."""
    gib, n = 2**30, 18
    pair = ("nothing_saveable", "dots_with_no_batch_dims_saveable")
    for step, expect_compiled in ((0.297, False), (0.41, True)):  # GiB per layer of the model's rise
        hand, compiled, limit = _mix_search(ilp_flops=7000.0)
        base = hand.curve
        hand.curve = lambda a, b, step=step, base=base: ([int(k * step * gib) for k in range(n + 1)] if (a, b) == pair
                                                         else base(a, b))
        predicted = hand.points[pair[1]].peak - (n - 12) * step * gib  # 12 layers: the fewest that win
        assert (predicted > limit * (1 + _hand.FALL_SLACK)) is not expect_compiled
        best = hand.mix(limit)
        assert best.label.startswith("16 layers the solver's ilp10% set")
        assert bool([label for label in compiled if "nothing_saveable" in label]) is expect_compiled


def test_a_mix_of_unlike_layers_is_found_on_the_models_peak_per_count():
    """ResNet-50 (benchmarks/realscale.py): its last 8 of 16 blocks under dots_saveable, the first
    8 under dots_with_no_batch_dims_saveable, compile to the latter's 2.38 GiB, since its late
    blocks are small; the average layer's saved bytes said no layer of dots_saveable fits, so the
    mix was never compiled and autoremat recomputed twice the hand mix.  The chain model's peak
    per count (flat over the small blocks, here as there), its shape put between the two
    compiled peaks, finds it where the layers are unlike, from the first count (the model's fall
    from the faster plan's peak said 12 blocks there, which compiled over); where they are alike,
    the saved bytes set the first count (their step predicted 47 compiled mixes of the 1B
    decoders within 0.90% on average, benchmarks/results/mix_counts.md)."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    mib, n = 2**20, 16
    lean, fast = "dots_with_no_batch_dims_saveable", "dots_saveable"
    model = [2195 + max(0, k - 8) * 112 for k in range(n + 1)]  # MiB: flat up to 8 blocks, then rising
    truth = [2378 + max(0, k - 8) * 80 for k in range(n + 1)]   # compiled: likewise
    unlike = [Layer(i, i + 1, "large" if i < 8 else "small") for i in range(n)]

    def search(curve, layers=unlike):
        hand = _hand.HandSearch(SimpleNamespace(traced=None), layers, None, None, lambda m: None, curve=curve)
        hand.points = {lean: _hand.HandPlan(lean, None, truth[0] * mib, 508e9),
                       fast: _hand.HandPlan(fast, None, truth[n] * mib, 0.0)}
        hand.choice = {o: (lambda k, o=o: o) for o in hand.points}
        hand.saved_bytes = {lean: 0, fast: (truth[n] - truth[0]) * mib}  # all the stack's extra saved bytes
        compiled = []

        def plan(options, label, ahead=(), expected=None):
            k = sum(o == fast for o in options)
            compiled.append(k)
            return _hand.HandPlan(label, None, truth[k] * mib, 508e9 * (n - k) / n)

        hand.plan = plan
        return hand.mix(truth[0] * mib), compiled

    best, compiled = search(lambda a, b: [m * mib for m in model] if (a, b) == (lean, fast) else None)
    assert best.label == f"8 layers {lean}, 8 layers {fast}"
    assert compiled == [8, 9]  # first count where the model's rise, scaled, meets the budget; 9 shown over
    # By the saved bytes alone (averaged over the blocks, as where the layers are alike) one
    # layer of dots_saveable is predicted at 2418 MiB, within FALL_SLACK of the budget: tried
    # from there, it fits, and the mixes climb from it (up to MAX_MIX_STEPS compiles).
    alike = [Layer(i, i + 1, "k") for i in range(n)]
    for best, compiled in (search(None), search(lambda a, b: [m * mib for m in model], alike)):
        assert compiled[0] == 1 and best.peak <= truth[0] * mib and best.extra_flops < 508e9


def _encdec_search(per_layer: bool):
    """A HandSearch over an encoder-decoder's 6 + 6 unlike layers (GiB, GFLOP; shaped like the
    probe in docs/FINDINGS.md: its decoder layers, with cross attention, recompute twice the
    encoder's under both policies), whose compiles give each count's peak from a table and its
    FLOPs from the layers' own; `per_layer`: whether the search knows the layers' FLOPs."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    gib, n = 2**30, 12
    lean, fast = "nothing_saveable", "dots_with_no_batch_dims_saveable"
    layers = [Layer(i, i + 1, "enc" if i < 6 else "dec") for i in range(n)]
    flops = {lean: (300.0,) * 6 + (600.0,) * 6, fast: (50.0,) * 6 + (100.0,) * 6}
    peaks = [7.04 + k * 0.1417 if k <= 6 else 7.89 + (k - 6) * 0.1817 for k in range(n + 1)]
    model = [p * (1.02 if k >= 6 else 1.0) for k, p in enumerate(peaks)]  # k = 6 predicted just over
    hand = _hand.HandSearch(SimpleNamespace(traced=None), layers, None, None, lambda m: None,
                            curve=lambda a, b: [int(m * gib) for m in model] if (a, b) == (lean, fast) else None)
    hand.points = {o: _hand.HandPlan(o, None, int(peaks[0 if o == lean else n] * gib), sum(flops[o]) * 1e9)
                   for o in (lean, fast)}
    hand.choice = {o: (lambda k, o=o: o) for o in hand.points}
    hand.saved_bytes = {lean: 0, fast: int((peaks[n] - peaks[0]) * gib)}
    if per_layer:
        hand.layer_flops.update(flops)
    compiled = []

    def plan(options, label, ahead=(), expected=None):
        k = sum(o == fast for o in options)
        compiled.append(k)
        return _hand.HandPlan(label, None, int(peaks[k] * gib), sum(flops[o][i] for i, o in enumerate(options)) * 1e9)

    hand.plan = plan
    return hand, compiled, int(peaks[6] * gib)


def test_a_mix_of_unlike_layers_counts_what_each_layer_recomputes():
    """An encoder-decoder (12 layers) at its hand-written mix's own peak, nothing_saveable on the
    encoder and dots_with_no_batch_dims_saveable on the decoder: with 5 decoder layers of the
    faster policy compiled within the budget, an equal share of FLOPs per layer said the sixth
    could not beat them (the decoder layers recompute more), so it was never compiled and
    autoremat recomputed more than the hand mix.  Counting each layer's own FLOPs, it is."""
    hand, compiled, limit = _encdec_search(per_layer=True)
    best = hand.mix(limit)
    assert best.label == "6 layers nothing_saveable, 6 layers dots_with_no_batch_dims_saveable"
    assert best.extra_flops == pytest.approx((6 * 300.0 + 6 * 100.0) * 1e9) and 6 in compiled
    hand, compiled, limit = _encdec_search(per_layer=False)  # an equal share per layer: the loss
    best = hand.mix(limit)
    assert compiled[0] == 5 and 6 not in compiled and best.extra_flops > (6 * 300.0 + 6 * 100.0) * 1e9


def test_the_solver_set_alone_is_compiled_only_where_none_of_its_mixes_fits(monkeypatch):
    """At the unrolled 1B decoders' mix budgets the solver's set per layer was compiled alone
    before its mixes (7-9 s each) and a mix of it with a faster policy won every time: such a mix
    recomputes less.  The set is now an option at the peak the policies' line predicts, compiled
    alone only where no compiled plan that fits recomputes less; and where it then compiles over
    the budget, the next set takes its place."""
    from types import SimpleNamespace

    from autoremat._layer_options import LayerOption

    gib, n = 2**30, 18
    monkeypatch.setattr(_hand, "layer_plan", lambda g, layers, policies, **kw: tuple(policies))
    said = []

    def search(true_peak, limit=None):
        hand, mixes, at = _mix_search(ilp_flops=7000.0)
        limit = limit or at
        del hand.points["ilp10%"], hand.saved_bytes["ilp10%"]  # the search learns of it from the solver
        hand.g, hand.say = SimpleNamespace(traced=None, device_share=lambda: 1.0), said.append
        alone = []

        def compile_alone(plan, label):
            alone.append(plan[0])
            return _hand.HandPlan(label, plan, int(true_peak[plan[0]] * gib), 7000e9 if plan[0] == "ilp10%" else 9000e9)

        hand.compile = compile_alone
        options = [LayerOption(o, (o,) * n, int(n * b * gib), f * 1e9)
                   for o, b, f in (("ilp10%", 0.07, 7000.0), ("ilp12%", 0.08, 9000.0))]
        hand.solver_sets(limit, options)
        return hand, mixes, limit, alone

    hand, mixes, limit, alone = search({"ilp10%": 8.81})
    assert not hand.points["ilp10%"].compiled and hand.points["ilp10%"].peak < 8.81 * gib  # predicted, not compiled
    best = hand.mix(limit)
    assert best.label.startswith("16 layers the solver's ilp10% set")
    assert not hand.sets_alone(limit) and alone == []  # its mix won: the set alone cannot

    # A budget just above the set's own peak: no mix of it with a faster layer fits, so it is compiled.
    hand, mixes, limit, alone = search({"ilp10%": 8.81}, int(8.85 * gib))
    best = hand.mix(limit)
    assert best is None or best.extra_flops > 7000e9
    assert not hand.sets_alone(limit) and alone == ["ilp10%"]
    assert hand.points["ilp10%"].compiled and hand.points["ilp10%"].peak == int(8.81 * gib)

    # Compiled over the budget: the next set is taken, and its mixes are to be tried.
    hand, mixes, limit, alone = search({"ilp10%": 9.5, "ilp12%": 8.9})
    hand.mixes.clear()
    assert hand.sets_alone(limit) and alone == ["ilp10%"] and "ilp12%" in hand.points
    assert not hand.points["ilp12%"].compiled


def test_a_set_over_the_budget_is_a_mix_partner_where_its_own_backward_fits(monkeypatch):
    """A saved set's own backward recomputes more than a faster policy's, so its mixes peak
    below its own peak less the bytes it stores beyond them: on FSDP x TP's 1B decoder the line
    put the ilp10% set at 4.355 GiB per device, over the hand mix's 4.33, where 17 set layers and
    1 `dots_with_no_batch_dims_saveable` compiled to 4.31 and recomputed less than the hand mix
    (16.05 TFLOP against 16.70).  Compiles here follow the larger of that layer's backward (the
    policy's peak less what it stores beyond the set on the set layers) and the first set
    layer's (the set's own peak less what its k faster layers' set would store)."""
    from types import SimpleNamespace

    from autoremat._layer_options import LayerOption
    from autoremat.graph._layers import Layer

    gib, n = 2**30, 18
    monkeypatch.setattr(_hand, "layer_plan", lambda g, layers, policies, **kw: tuple(policies))
    layers = [Layer(i, i + 1, "k") for i in range(n)]
    g = SimpleNamespace(traced=None, device_share=lambda: 1.0)
    hand = _hand.HandSearch(g, layers, None, _hand.HandPlan("no remat", None, int(20.4 * gib), 0.0), lambda m: None)
    peaks = {"nothing_saveable": 3.735, "dots_with_no_batch_dims_saveable": 5.071, "ilp10%": 4.36}
    stored = {"nothing_saveable": 0.0, "dots_with_no_batch_dims_saveable": 1.477, "ilp10%": 0.678}
    flops = {"nothing_saveable": 28450.0, "dots_with_no_batch_dims_saveable": 4948.0, "ilp10%": 12000.0}
    for pol in ("nothing_saveable", "dots_with_no_batch_dims_saveable"):
        hand.points[pol] = _hand.HandPlan(pol, None, int(peaks[pol] * gib), flops[pol] * 1e9)
        hand.choice[pol] = lambda k, pol=pol: pol
        hand.saved_bytes[pol] = int(stored[pol] * gib)
    compiled = []

    def plan(options, label, ahead=(), expected=None):
        compiled.append(label)
        lean, fast = options[0], options[-1]
        k = sum(o == fast for o in options)
        own = peaks[lean] - k * stored[lean] / n
        theirs = peaks[fast] - (n - k) * (stored[fast] - stored[lean]) / n
        return _hand.HandPlan(label, None, int(max(own, theirs) * gib),
                              (flops[lean] + k / n * (flops[fast] - flops[lean])) * 1e9)

    hand.plan = plan
    limit = int(4.33 * gib)
    hand.solver_sets(limit, [LayerOption("ilp10%", ("ilp10%",) * n, int(stored["ilp10%"] * gib), 12000e9)])
    assert hand.points["ilp10%"].peak > limit and not hand.points["ilp10%"].compiled  # predicted over, offered
    best = hand.mix(limit)
    assert best.label == "17 layers the solver's ilp10% set, 1 layers dots_with_no_batch_dims_saveable"
    assert "16 layers the solver's ilp10% set, 2 layers dots_with_no_batch_dims_saveable" in compiled  # shown over
    assert not hand.sets_alone(limit)  # predicted over: not compiled alone


@pytest.mark.parametrize("name", ["convnet", "transformer"])
def test_policy_saves_says_what_jax_policies_save(name):
    """`_layer_options.policy_saves` against JAX's own policy functions, on every matmul and
    convolution of the example's top level: `dots_saveable` keeps convolutions too (it once
    said not, so ResNet-50's and the U-Net's plans recorded their conv outputs as recomputed
    under it, and their saved bytes as none)."""
    from autoremat._layer_options import policy_saves
    from autoremat.runtime._plan import POLICY_NAMES

    ex = examples.get_example(name)
    g = graph_from_traced(trace(ex.fn, ex.args))
    checked = 0
    for op in g.ops.values():
        if op.primitive not in ("dot_general", "conv_general_dilated") or op.id not in {f"e{op.index}"}:
            continue
        eqn = g.traced.jaxpr.eqns[op.index]
        for pol in POLICY_NAMES:
            jax_says = getattr(CP, pol)(eqn.primitive, *(v.aval for v in eqn.invars), **eqn.params)
            assert policy_saves(pol, op, op.outputs[0]) == bool(jax_says), (pol, op.primitive)
            checked += 1
    assert checked >= len(POLICY_NAMES) * (4 if name == "convnet" else 8)


@pytest.mark.parametrize("name", ["transformer", "transformer_scan", "mlp_chain", "convnet"])
def test_policy_plans_record_what_jax_stores(name):
    """A policy per layer records as saved the bytes JAX stores for the backward pass: the
    residuals of `jax.vjp` of the planned step, less those with `nothing_saveable` per layer
    (scan bodies: per iteration, times the trip count: the records' multiplicity).  A matmul output the backward never
    reads (a layer's last, read only by the next layer) is saveable but not stored; counting
    it had put the transformer's dots_with_no_batch_dims_saveable at 18.9 MB where JAX stores
    16.8, and mlp_chain's at 3.7 MB where JAX stores none."""
    ex = examples.get_example(name)
    g, layers = _layers(ex)

    def stored(pol):
        plan = _hand.layer_plan(g, layers, [pol] * len(layers))
        _, vjp = jax.vjp(apply(ex.fn, plan), *ex.args)
        return plan, sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves(vjp))

    _, base = stored("nothing_saveable")
    for pol in ("dots_with_no_batch_dims_saveable", "dots_saveable"):
        plan, jax_bytes = stored(pol)
        recorded = sum(r.nbytes * r.multiplicity for r in plan.values.values() if r.decision == "save")
        assert recorded == jax_bytes - base, pol


def _unrolled_scan(unroll: int):
    """A 4-layer scan of GeGLU MLPs with `unroll`, and its abstract arguments."""
    import jax.numpy as jnp

    L, D, F = 4, 128, 512

    def body(h, p):
        x = h * jax.lax.rsqrt(jnp.mean(h ** 2, -1, keepdims=True) + 1e-6)
        return h + (jax.nn.gelu(x @ p["w1"]) * (x @ p["w3"])) @ p["w2"], None

    def loss(params, h):
        out, _ = jax.lax.scan(body, h, params, unroll=unroll)
        return jnp.mean(out ** 2)

    sd = jax.ShapeDtypeStruct
    params = {"w1": sd((L, D, F), jnp.float32), "w3": sd((L, D, F), jnp.float32), "w2": sd((L, F, D), jnp.float32)}
    return loss, (params, sd((8, 512, D), jnp.float32))


def test_an_unrolled_scan_body_keeps_its_barriers():
    """penzai's `LayerStack` scans with `unroll=True`: XLA then merges a body's recomputation
    without barriers into its forward pass (`OpInfo.unrolled`), so the hand-written policies are
    tried with barriers alone and the solver's scan plans get them: just under the saving
    policies' peak (116.3 MiB) its plan fits (104.3) and recomputes half of what nothing_saveable
    does (2.15 against 4.29 GFLOP matmul); without barriers its scan plans compiled over, near no
    remat's 198.4 (as every one of penzai's 1B decoder did, benchmarks/unseen.py), and
    nothing_saveable was the answer."""
    from autoremat._optimize import plan_for

    fn, args = _unrolled_scan(4)
    traced = trace(fn, args, {}, argnums=(0,), static_argnums=(), has_aux=False, skip_integer_leaves=False)
    g = graph_from_traced(traced)
    layers = find_layers(g)
    pass
    plans = _hand.uniform_plans(g, layers)
    plans = [p for p in plans if p[2].scans[0].prevent_cse]
    hand = {pol: compiled_stats(apply(fn, p), *args) for pol, _, p in plans}
    none = compiled_stats(fn, *args)
    lean, fast = hand["nothing_saveable"], hand["dots_with_no_batch_dims_saveable"]
    assert lean.peak_bytes < fast.peak_bytes == hand["dots_saveable"].peak_bytes < none.peak_bytes
    budget = fast.peak_bytes - 1
    got = plan_for(fn, budget, args).plan
    st = compiled_stats(apply(fn, got), *args)
    assert st.peak_bytes <= budget and st.matmul_flops - none.matmul_flops < 0.75 * (lean.matmul_flops - none.matmul_flops)
    assert all(sp.prevent_cse for sp in got.scans)
    keys = iter(jax.random.split(jax.random.key(0), 4))
    real = jax.tree.map(lambda s: (0.05 * jax.random.normal(next(keys), s.shape)).astype(s.dtype), args)
    assert_trees_close(jax.jit(jax.value_and_grad(apply(fn, got)))(*real), jax.jit(jax.value_and_grad(fn))(*real))


def test_a_rolled_scan_body_is_tried_both_ways_and_its_solver_plans_follow_the_lower():
    """Where the scan is not unrolled, the policies are compiled with barriers and without
    (`uniform_plans`), and the solver's scan plans take barriers only where those compiled
    lower and none higher (`_search._scan_barriers`)."""
    from autoremat import _search

    fn, args = _unrolled_scan(1)
    traced = trace(fn, args, {}, argnums=(0,), static_argnums=(), has_aux=False, skip_integer_leaves=False)
    g = graph_from_traced(traced)
    plans = _hand.uniform_plans(g, find_layers(g))
    assert sorted(p.scans[0].prevent_cse for _, _, p in plans) == [False] * 3 + [True] * 3

    def compiled(peaks):
        sig = object()
        for i, (_, _, p) in enumerate(plans[:2 * len(peaks)]):
            _search._COMPILED[(sig, ("hand", f"plan {i}"))] = _search._Compiled(
                peaks[i // 2][not p.scans[0].prevent_cse], 0.0, 0.0, p, 0.0, 0.0)
        return sig

    try:
        assert _search._scan_barriers(compiled([(10, 20)]))  # with barriers lower
        assert not _search._scan_barriers(compiled([(20, 10)]))
        assert not _search._scan_barriers(compiled([(10, 10)]))  # alike: without, as JAX's docs write it
        assert not _search._scan_barriers(compiled([(10, 20), (30, 20)]))  # the policies disagree
        assert not _search._scan_barriers(object())  # nothing compiled
    finally:
        for key in [k for k in _search._COMPILED if k[1][0] == "hand" and k[1][1].startswith("plan ")]:
            del _search._COMPILED[key]


# -- MaxText's presets as hand-written plans ----------------------------------------------------

def test_maxtext_presets_are_read_from_the_layers_tags():
    """`_layer_options.name_presets`: on layers tagged with MaxText's names, each preset as the
    values its names tag in each layer (the tagged matmul outputs, once each), those that save the
    same values listed once; nothing on untagged layers.  A scan layer's are its body's."""
    from autoremat._presets import SAVED_NAMES

    for name in ("transformer", "transformer_scan"):
        g, layers = _layers(examples.get_example(name))
        presets = dict(_layer_options.name_presets(g, layers))
        assert list(presets) == list(SAVED_NAMES)  # every tag is there: the seven save apart
        assert all(len(sets) == len(layers) for sets in presets.values())
        out_proj, minimal, with_context = (presets[k] for k in ("save_out_proj", "minimal", "minimal_with_context"))
        assert all(len(s) == 1 for s in out_proj)
        assert all(a < b for a, b in zip(minimal, with_context))  # `context` on top
        assert len({frozenset(sets) for sets in presets.values()}) == len(presets)
    g, layers = _layers(examples.get_example("transformer", tags=False))
    assert _layer_options.name_presets(g, layers) == []


@pytest.mark.parametrize("name", ["transformer", "transformer_scan"])
def test_a_preset_as_a_plan_compiles_like_the_hand_written_preset(name):
    """A preset's saved sets per layer (`uniform_plans`' "maxtext ..." plans) compile to the same
    peak and matmul FLOPs as `jax.checkpoint(layer, policy=save_only_these_names(...))` written by
    hand (on the small transformer, save_out_proj per layer compiles below nothing_saveable's
    peak, as on the tagged Llama 1B), with the original gradients."""
    ex = examples.get_example(name)
    g, layers = _layers(ex)
    presets = _hand.maxtext_presets(g, layers)
    plans = {pol: plan for pol, _, plan in _hand.uniform_plans(g, layers, presets=presets)}
    plan = plans["maxtext save_out_proj"]
    by_hand = compiled_stats(*_ex_args(examples.get_example(name, policy=examples.MAXTEXT_PRESETS["save_out_proj"])))
    nothing = compiled_stats(*_ex_args(examples.get_example(name, policy=CP.nothing_saveable)))
    got = compiled_stats(apply(ex.fn, plan), *ex.args)
    assert got.peak_bytes == by_hand.peak_bytes
    assert got.peak_bytes < nothing.peak_bytes or name == "transformer_scan"  # scanned: 53.80 against 53.29 MB
    assert got.matmul_flops == by_hand.matmul_flops
    expected = jax.jit(jax.value_and_grad(ex.fn))(*ex.args)
    # float32: a value recomputed inside another fusion than its first computation rounds
    # differently (the solver sets' test above: about 10 ulps)
    assert_trees_close(jax.jit(jax.value_and_grad(apply(ex.fn, plan)))(*ex.args), expected, rtol=4e-6)


def _ex_args(ex):
    return (ex.fn, *ex.args)


def test_the_next_policy_is_compiled_beside_one_the_model_puts_over():
    """Where the model puts a JAX policy over the budget, the next one is compiled beside it
    (`PlanSearch.start_beside`): the model under-predicts the policies at 1B, so that one is
    then compiled next all but surely.  Where it does not, none is: the policy may end the phase."""
    ex = examples.get_example("transformer")
    g, layers = _layers(ex)
    peaks = {"dots_saveable": 59550796, "dots_with_no_batch_dims_saveable": 55880764, "nothing_saveable": 49871700}
    compiled, beside = [], []

    def compile(plan, label, ahead=(), certain=()):
        pol = label.split(" per layer")[0]
        compiled.append(pol)
        beside.append([lab.split(" per layer")[0] for _, lab in certain][:1])
        return _hand.HandPlan(label, plan, peaks[pol], 0.0)

    none = _hand.HandPlan("no remat", None, 82_400_000, 0.0)
    hand = _hand.HandSearch(g, layers, compile, none, lambda m: None)
    hand._model_over = lambda pol, limit: pol == "dots_saveable"
    hand.uniform(_hand.uniform_plans(g, layers), 56_000_000)
    assert compiled == ["dots_saveable", "dots_with_no_batch_dims_saveable"]
    assert beside == [["dots_with_no_batch_dims_saveable"], []]


def test_presets_are_compiled_fewest_flops_first_up_to_the_first_policy_that_fits():
    """`HandSearch.uniform` with MaxText's presets: compiled in order of the FLOPs they recompute
    (JAX's policies keep theirs), a preset that fits does not end the phase (the leaner policies
    may make better mixes), the first of JAX's policies that fits does.  `_front` keeps
    nothing_saveable although save_out_proj beats it in peak and FLOPs: it stores less per layer,
    and at the tagged Llama 1B's 9 + 9 mix budget only its mixes fitted 9 layers of the faster
    policy (benchmarks/results/presets.md).  Peaks and FLOPs as the small transformer compiles them."""
    ex = examples.get_example("transformer")
    g, layers = _layers(ex)
    table = {"dots_saveable": (59550796, 10871.64), "maxtext minimal_with_context": (57977924, 11005.85),
             "dots_with_no_batch_dims_saveable": (55880764, 11140.07), "maxtext minimal": (55880764, 11140.07),
             "maxtext save_dot_with_context_except_mlp": (54834236, 12079.6),
             "maxtext save_dot_except_mlpwi": (52736884, 12213.81), "maxtext save_dot_except_mlp": (52736884, 12213.81),
             "maxtext save_qkv_proj": (51686252, 12482.25), "maxtext save_out_proj": (47504220, 13019.12),
             "nothing_saveable": (49871700, 13287.56)}
    compiled, beside = [], []

    def policy(label):
        return next(p for p in table if label.startswith(p.replace("maxtext ", "MaxText's ") + " per layer"))

    def compile(plan, label, ahead=(), certain=()):
        compiled.append(policy(label))
        beside.append([policy(lab) for _, lab in certain])
        return _hand.HandPlan(label, plan, table[policy(label)][0], table[policy(label)][1] * 1e6)

    none = _hand.HandPlan("no remat", None, 82_400_000, 0.0)
    hand = _hand.HandSearch(g, layers, compile, none, lambda m: None, presets=_hand.maxtext_presets(g, layers))
    plans = _hand.uniform_plans(g, layers, presets=hand.presets)
    hand.uniform(plans, 50_000_000)  # save_out_proj fits; nothing_saveable is the first policy that does
    assert compiled == sorted(compiled, key=lambda p: table[p][1]) and compiled[-1] == "nothing_saveable"
    assert compiled[:3] == ["dots_saveable", "maxtext minimal_with_context", "dots_with_no_batch_dims_saveable"]
    # The plans said certain while one compiles (compiled beside it: `PlanSearch.start_beside`) are
    # the ones compiled next: after a preset, up to the next policy; after a policy, none.
    assert all(later == compiled[i + 1:i + 1 + len(later)] for i, later in enumerate(beside))
    assert beside[compiled.index("maxtext save_dot_with_context_except_mlp")] == compiled[
        compiled.index("maxtext save_dot_with_context_except_mlp") + 1:]
    assert beside[compiled.index("dots_with_no_batch_dims_saveable")] == []
    front = hand._front()
    assert {"nothing_saveable", "maxtext save_out_proj", "dots_with_no_batch_dims_saveable"} <= front
    assert "maxtext minimal" not in front  # dots_with_no_batch_dims_saveable's peak and FLOPs, a policy
    compiled.clear()
    hand.uniform(plans, 56_000_000)  # dots_with_no_batch_dims_saveable fits: the rest recompute more
    assert compiled[-1] == "dots_with_no_batch_dims_saveable" and "nothing_saveable" not in compiled


def test_a_mix_search_past_its_step_cap_is_finished_by_bisection():
    """penzai's decoder written per device (benchmarks/results/sharded_dp_unseen.md): its half-and-half
    nothing_saveable / dots_with_no_batch_dims_saveable mix compiles to 9.69 GiB, as does 7 + 5; 1 and 2
    layers of the faster one compile to nothing_saveable's own 9.66 (a plateau), 4 to 9.67, 7 to 10.06.
    At the mix's own peak the search compiled 1, 2, 7, 4 and 5, reached MAX_MIX_STEPS and returned
    7 + 5 (6.598 against the mix's 5.773 TFLOP); past the cap the counts still open are bisected: 6."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    gib, n, lean, fast = 2**30, 12, "nothing_saveable", "dots_with_no_batch_dims_saveable"
    peaks = {k: int(v * gib) for k, v in {0: 9.66, 1: 9.66, 2: 9.66, 4: 9.67, 5: 9.69, 7: 10.06, 12: 11.94}.items()}
    hand = _hand.HandSearch(SimpleNamespace(traced=None), [Layer(i, i + 1, "block") for i in range(n)],
                            None, None, lambda m: None)
    hand.points = {lean: _hand.HandPlan(lean, None, peaks[0], 10721e9), fast: _hand.HandPlan(fast, None, peaks[n], 825e9)}
    m = _hand._Pair(lean, fast, floor=1, over=7, line=lambda k: peaks.get(k, peaks[5]), peaks=peaks, fit=5,
                    steps=_hand.MAX_MIX_STEPS)
    assert hand._next_of(m, bound=10721e9, limit=peaks[5], stop=7) == 6
    m.fit = 6
    assert hand._next_of(m, bound=10721e9, limit=peaks[5], stop=7) is None  # settled: 6 fits, 7 is over


def test_a_peak_the_two_leanest_policies_call_fixed_is_fixed_only_if_the_lowest_plan_agrees():
    """The mixture-of-experts decoder under FSDP (benchmarks/results/peak_sensitivity.md at
    1b06df9): nothing_saveable and dots_with_no_batch_dims_saveable per layer compile 24 MiB apart
    (4.76 and 4.74 GiB) while storing 513 MiB apart, a share under FIXED_PEAK_SHARE, yet the plan
    of lowest predicted peak compiled to 4.49 GiB and a uniform plan to 4.09: the peak moves.  On
    the 1B decoder written per device at one example a device nothing compiles lower."""
    from types import SimpleNamespace

    from autoremat.graph._layers import Layer

    gib, mib, lean, fast = 2**30, 2**20, "nothing_saveable", "dots_with_no_batch_dims_saveable"
    hand = _hand.HandSearch(SimpleNamespace(traced=None), [Layer(i, i + 1, "k") for i in range(8)], None, None,
                            lambda m: None)
    hand.points = {None: _hand.HandPlan("no remat", None, int(23.95 * gib), 0.0),
                   lean: _hand.HandPlan(lean, None, int(4.76 * gib), 35.19e12),
                   fast: _hand.HandPlan(fast, None, int(4.74 * gib), 30.79e12),
                   "dots_saveable": _hand.HandPlan("dots_saveable", None, int(7.63 * gib), 0.0)}
    hand.saved_bytes = {lean: 0, fast: 513 * mib, "dots_saveable": 2 * gib}
    assert hand.peak_fixed(int(4.6 * gib)) is not None  # the screen fires
    assert hand.peak_fixed(int(4.75 * gib)) is None  # one fits: nothing to settle
    hand.mixes.append(_hand.HandPlan("4 + 4", None, int(4.73 * gib), 33e12))
    assert hand.peak_moves(int(4.49 * gib))
    assert not hand.peak_moves(int(4.73 * gib) - 1 * mib)  # a MiB under the mix is XLA's placement
    hand.mixes.append(_hand.HandPlan("predicted", None, int(4.0 * gib), 33e12, compiled=False))
    assert hand.peak_moves(int(4.49 * gib))  # a peak only predicted is not a compiled one


def _chunked_loss_decoder(policy=None):
    """A small bf16 decoder whose layers are a scan (under `policy`, written by hand on its body)
    and whose loss is a second scan, over chunks of the sequence, each chunk under the author's
    own `jax.checkpoint` (so the B x S x V logits are never held at once; benchmarks/_unseen.py
    `chunked_scan` at 1B)."""
    import jax.numpy as jnp

    L, D, F, V, S, B, C = 4, 128, 512, 4096, 128, 4, 4
    bf = jnp.bfloat16

    def layer(h, p):
        a = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", h @ p["wq"], h @ p["wk"]) / D ** 0.5, -1)
        h = h + jnp.einsum("bqk,bkd->bqd", a, h @ p["wv"])
        return h + jax.nn.gelu(h @ p["w1"]) @ p["w2"], None

    body = layer if policy is None else jax.checkpoint(layer, policy=getattr(CP, policy))

    def loss(params, x, labels):
        h, _ = jax.lax.scan(body, x, params["layers"])

        @jax.checkpoint
        def chunk(total, xt):
            hc, t = xt
            logp = jax.nn.log_softmax((hc @ params["head"]).astype(jnp.float32))
            return total - jnp.sum(jnp.take_along_axis(logp, t[..., None], -1)), None
        hs, ts = h.reshape(B, C, S // C, D).swapaxes(0, 1), labels.reshape(B, C, S // C).swapaxes(0, 1)
        total, _ = jax.lax.scan(chunk, jnp.zeros((), jnp.float32), (hs, ts))
        return total / (B * S)

    k = iter(jax.random.split(jax.random.key(0), 8))
    shapes = {"wq": (D, D), "wk": (D, D), "wv": (D, D), "w1": (D, F), "w2": (F, D)}
    params = {"layers": {n: (0.05 * jax.random.normal(next(k), (L, *s))).astype(bf) for n, s in shapes.items()},
              "head": (0.05 * jax.random.normal(next(k), (D, V))).astype(bf)}
    return loss, (params, jax.random.normal(next(k), (B, S, D)).astype(bf), jax.random.randint(next(k), (B, S), 0, V))


def test_the_policies_are_tried_on_the_layers_alone_where_the_author_checkpointed_others():
    """A layer the user already checkpointed (the loss's scan over chunks) is left as written by
    a person putting a policy on the rest: each policy per layer is also a candidate on those
    alone, and the planner at that hand-written plan's peak fits and recomputes no more.  Before,
    the policy went on both scans, replacing the author's checkpoint on the loss (its chunks'
    logits saved), and at dots_with_no_batch_dims_saveable's peak the planner returned a plan
    recomputing 1.5x the policy's matmul FLOPs (0.201 against 0.134 GFLOP)."""
    from types import SimpleNamespace

    from autoremat._optimize import plan_for

    fn, args = _chunked_loss_decoder()
    g, layers = _layers(SimpleNamespace(fn=fn, args=args))
    assert len(layers) == 2 and _hand.authored_layers(g.traced, layers) == (False, True)
    plans = {label: plan for _, label, plan in _hand.uniform_plans(g, layers)}
    alone = plans["dots_with_no_batch_dims_saveable on the layers without your checkpoints"]
    assert len(alone.scans) == 1 and alone.leaves_alone(layers[1].start, layers[1].stop)
    assert len(plans["dots_with_no_batch_dims_saveable per layer"].scans) == 2
    hand_fn, _ = _chunked_loss_decoder("dots_with_no_batch_dims_saveable")
    hand, none = compiled_stats(hand_fn, *args), compiled_stats(fn, *args)
    assert compiled_stats(apply(fn, alone), *args).peak_bytes == hand.peak_bytes
    got = plan_for(fn, hand.peak_bytes, args).plan
    assert got.meta["compiled_peak"] <= hand.peak_bytes
    assert got.meta["extra_matmul_flops"] <= hand.matmul_flops - none.matmul_flops
    assert_trees_close(jax.jit(jax.grad(apply(fn, got)))(*args), jax.jit(jax.grad(fn))(*args))
