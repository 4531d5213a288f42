"""Tests of plans as files and as code: JSON round trip, mismatch and format errors,
`Plan.to_python()` checked against hand-written checkpoints, and `Plan.summary()`."""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals  # jax.ad_checkpoint only exports print_saved_residuals
from jax.ad_checkpoint import checkpoint_name

from autoremat import _hand, examples
from autoremat._units import format_bytes
from autoremat.graph._layers import find_layers
from autoremat.runtime._by_layer import layer_rows
from autoremat._errors import PlanFormatError, PlanMismatchError
from autoremat.graph._graph import graph_from_traced
from autoremat.graph._interpret import INLINE_PRIMITIVES, inner_jaxpr
from autoremat.graph._trace import describe_eqn, trace
from autoremat.runtime import SCHEMA_VERSION, Plan, Region, ScanPlan, ValueRecord, apply, compiled_stats, validate
from autoremat.runtime._export import export_names

CP = jax.checkpoint_policies
DOTS = frozenset({"dot_general", "conv_general_dilated"})
MLP = dict(n_layers=4, width=128, batch=64)
TRANSFORMER = dict(n_layers=2, d_model=32, n_heads=2, seq=16, batch=2, vocab=32)


# ---------------------------------------------------------------------------
# Helpers: blocks, plans and residuals
# ---------------------------------------------------------------------------


def _n_flat(eqn) -> int:
    if eqn.primitive.name in INLINE_PRIMITIVES:
        return sum(_n_flat(e) for e in inner_jaxpr(eqn)[0].eqns)
    return 1


def block_ranges(name, **kw) -> list[tuple[int, int]]:
    """Flat-jaxpr equation range of each block (from the factory's per-block checkpoints)."""
    ex = examples.get_example(name, policy=CP.nothing_saveable, **kw)
    ranges, pos = [], 0
    for eqn in trace(ex.fn, ex.args, inline=False).jaxpr.eqns:
        if eqn.primitive.name in ("checkpoint", "remat2"):
            ranges.append((pos, pos + _n_flat(eqn)))
        pos += _n_flat(eqn)
    return ranges


def produced(t, start, stop, primitives=None) -> frozenset[str]:
    return frozenset(f"e{i}:{j}" for i in range(start, stop) for j, _ in enumerate(t.jaxpr.eqns[i].outvars)
                     if primitives is None or t.jaxpr.eqns[i].primitive.name in primitives)


def value_records(t, regions) -> dict[str, ValueRecord]:
    """Decisions as the solver records them: each residual a region produces, and each value
    it saves or offloads."""
    g = graph_from_traced(t)
    residuals, out = set(g.residual_values()), {}

    def walk(rs):
        for r in rs:
            yield r
            yield from walk(r.children)

    for r in regions:
        saved = frozenset().union(*(c.saved for c in walk([r])))
        off = frozenset().union(*(c.offloaded for c in walk([r])))
        for i in range(r.start, r.stop):
            for vid in g.ops[f"e{i}"].outputs:
                if vid in residuals or vid in saved | off:
                    info, op = g.values[vid], g.ops[f"e{i}"]
                    decision = "offload" if vid in off else "save" if vid in saved else "recompute"
                    out[vid] = ValueRecord(vid, decision, info.type_str, info.nbytes, op.primitive, info.source,
                                           info.name, float(op.cost.flops), op.multiplicity)
    return out


def make_plan(t, regions, *, records=True, **kw) -> Plan:
    return Plan(t.fingerprint, len(t.jaxpr.eqns), regions=tuple(regions),
                values=value_records(t, regions) if records else {},
                structure=tuple(describe_eqn(e) for e in t.jaxpr.eqns), **kw)


def residual_types(f, params, batch) -> list[tuple]:
    """Multiset of (shape, dtype, memory space) of what `grad` w.r.t. params saves."""
    return sorted((tuple(a.shape), str(a.dtype), str(getattr(a, "memory_space", "")))
                  for a, _ in saved_residuals(lambda p: f(p, batch), params))


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@functools.cache
def mlp():
    """The MLP, its trace, and a plan using every feature: saved, offloaded, nested, budget."""
    ex = examples.get_example("mlp_chain", **MLP)
    t = trace(ex.fn, ex.args)
    (a0, b0), (a1, b1), (a2, b2), (a3, b3) = block_ranges("mlp_chain", **MLP)
    regions = [
        Region(a0, b0, saved=produced(t, a0, b0, DOTS), label="layer 0: dots saved"),
        Region(a1, b1, offloaded=produced(t, a1, b1, DOTS), label="layer 1: dots offloaded"),
        Region(a2, b3, children=(Region(a2, b2), Region(a3, b3, saved=frozenset({f"e{a3 + 2}:0"})))),
    ]
    plan = make_plan(t, regions, budget=3 * 2**20, predicted_peak=2_900_000, estimated_extra_time=1.5e-4,
                     meta={"function": "loss", "solver": "hand-written", "caps": [0.0, 0.5]})
    return ex, t, plan


# ---------------------------------------------------------------------------
# JSON round trip
# ---------------------------------------------------------------------------


def test_round_trip_gives_an_equal_plan(tmp_path):
    _, _, plan = mlp()
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded.regions == plan.regions
    assert loaded.scans == plan.scans
    assert dict(loaded.values) == dict(plan.values)
    assert loaded == plan
    assert json.loads(path.read_text())["version"] == SCHEMA_VERSION


def test_round_trip_keeps_gradients_and_compiled_peak(tmp_path):
    ex, _, plan = mlp()
    plan.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    expected = jax.jit(jax.value_and_grad(apply(ex.fn, plan)))(*ex.args)
    assert_trees_equal(jax.jit(jax.value_and_grad(apply(ex.fn, loaded)))(*ex.args), expected)
    peak = compiled_stats(apply(ex.fn, plan), *ex.args).peak_bytes
    assert compiled_stats(apply(ex.fn, loaded), *ex.args).peak_bytes == peak
    report = validate(ex.fn, loaded, *ex.args)
    assert report.compiled_peak == peak
    assert report.budget == plan.budget and report.fits == (peak <= plan.budget)


def test_round_trip_of_a_scan_plan(tmp_path):
    ex = examples.get_example("transformer_scan", **TRANSFORMER)
    t = trace(ex.fn, ex.args)
    (k,) = [i for i, e in enumerate(t.jaxpr.eqns) if e.primitive.name == "scan"]
    plan = Plan(t.fingerprint, len(t.jaxpr.eqns),
                scans=(ScanPlan(f"e{k}", saved=frozenset({f"e{k}/body/e16:0"}),
                                offloaded=frozenset({f"e{k}/body/e18:0"})),))
    plan.save(tmp_path / "scan.json")
    assert Plan.load(tmp_path / "scan.json") == plan
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))).to_json() == plan.to_json()


# ---------------------------------------------------------------------------
# A plan for another function
# ---------------------------------------------------------------------------


def test_one_more_layer_is_a_mismatch():
    _, _, plan = mlp()
    other = examples.get_example("mlp_chain", **{**MLP, "n_layers": 5})
    with pytest.raises(PlanMismatchError, match=r"made for a different function or other argument shapes") as e:
        apply(other.fn, plan)(*other.args)
    msg = str(e.value)
    assert "the plan has 48 top-level equations, loss now has 59" in msg
    assert re.search(r"first difference at equation 44: plan has `sub f32\[64,128\]", msg), msg
    assert plan.fingerprint in msg and "Re-run the search" in msg


def test_other_argument_shapes_are_a_mismatch():
    _, _, plan = mlp()
    other = examples.get_example("mlp_chain", **{**MLP, "batch": 32})
    with pytest.raises(PlanMismatchError, match=r"the plan has 48 top-level equations, loss now has 48; "
                                                 r"first difference at equation 0: plan has "
                                                 r"`dot_general f32\[64,128\],f32\[128,128\] -> f32\[64,128\]`, "
                                                 r"function has `dot_general f32\[32,128\]"):
        jax.grad(apply(other.fn, plan))(*other.args)


def test_mismatch_without_recorded_structure_names_the_shapes():
    _, t, plan = mlp()
    bare = Plan(t.fingerprint, plan.n_eqns, regions=plan.regions)
    other = examples.get_example("mlp_chain", **{**MLP, "batch": 32})
    with pytest.raises(PlanMismatchError, match=r"argument shapes now .*f32\[32,128\]"):
        apply(other.fn, bare)(*other.args)


# ---------------------------------------------------------------------------
# Corrupt files
# ---------------------------------------------------------------------------


def _good_json():
    return mlp()[2].to_json()


def _edit(**changes):
    def make():
        d = _good_json()
        for k, v in changes.items():
            if v is _DELETE:
                del d[k]
            else:
                d[k] = v
        return json.dumps(d)
    return make


_DELETE = object()


def _region_edit(region):
    def make():
        d = _good_json()
        d["regions"] = [region]
        return json.dumps(d)
    return make


def _value_edit(**changes):
    def make():
        d = _good_json()
        d["values"][0].update(changes)
        return json.dumps(d)
    return make


CORRUPT = {
    "not json": (lambda: "{this is not json", r"is not valid JSON"),
    "empty file": (lambda: "", r"is not valid JSON"),
    "a list": (lambda: "[1, 2, 3]", r'is not an autoremat plan \(missing "format": "autoremat-plan"\)'),
    "other format": (lambda: json.dumps({"format": "checkmate-schedule", "version": 1}),
                     r"is not an autoremat plan"),
    "wrong version": (_edit(version=99), r"has plan schema version 99; this autoremat reads version 1"),
    "no version": (_edit(version=_DELETE), r"has plan schema version None"),
    "missing fingerprint": (_edit(fingerprint=_DELETE), r"is a corrupt autoremat plan: KeyError: 'fingerprint'"),
    "missing n_eqns": (_edit(n_eqns=_DELETE), r"is a corrupt autoremat plan: KeyError: 'n_eqns'"),
    "n_eqns not a number": (_edit(n_eqns="many"), r"is a corrupt autoremat plan: ValueError"),
    "region without start": (_region_edit({"stop": 4}), r"is a corrupt autoremat plan: KeyError: 'start'"),
    "empty region": (_region_edit({"start": 4, "stop": 4}), r"region \[4, 4\) is empty or negative"),
    "region past the end": (_region_edit({"start": 40, "stop": 60}),
                            r"region \[40, 60\) goes past the function's 48 equations"),
    "unknown decision": (_value_edit(decision="maybe"), r"has unknown decision 'maybe'"),
    "unknown value field": (_value_edit(colour="red"), r"corrupt autoremat plan: TypeError: .*colour"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_file_raises_plan_format_error(tmp_path, case):
    text, message = CORRUPT[case]
    path = tmp_path / "plan.json"
    path.write_text(text())
    with pytest.raises(PlanFormatError, match=message) as e:
        Plan.load(path)
    assert str(path) in str(e.value)


def test_missing_file_raises_plan_format_error(tmp_path):
    with pytest.raises(PlanFormatError, match=r"plan file '.*nowhere.json' does not exist"):
        Plan.load(tmp_path / "nowhere.json")


def test_region_validation():
    with pytest.raises(PlanFormatError, match=r"regions overlap or are out of order at \[5, 15\)"):
        Plan("f", 48, regions=(Region(0, 11), Region(5, 15)))
    with pytest.raises(PlanFormatError, match=r"regions overlap or are out of order at \[0, 11\)"):
        Plan("f", 48, regions=(Region(11, 22), Region(0, 11)))
    with pytest.raises(PlanFormatError, match=r"region \[44, 50\) goes past the function's 48 equations"):
        Plan("f", 48, regions=(Region(0, 11), Region(44, 50)))
    with pytest.raises(PlanFormatError, match=r"region \[7, 3\) is empty or negative"):
        Region(7, 3)
    with pytest.raises(PlanFormatError, match=r"region \[-1, 3\) is empty or negative"):
        Region(-1, 3)
    with pytest.raises(PlanFormatError, match=r"child region \[0, 12\) is not inside \[0, 11\) in order"):
        Region(0, 11, children=(Region(0, 12),))
    with pytest.raises(PlanFormatError, match=r"child region \[0, 4\) is not inside \[0, 11\) in order"):
        Region(0, 11, children=(Region(4, 8), Region(0, 4)))
    with pytest.raises(PlanFormatError, match=r"values \['e2:0'\] are both saved and offloaded"):
        Region(0, 11, saved=frozenset({"e2:0"}), offloaded=frozenset({"e2:0", "e0:0"}))


# ---------------------------------------------------------------------------
# to_python(): the exported policy realizes the plan in hand-written code
# ---------------------------------------------------------------------------


def run_exported(code: str):
    """Executes the exported code; returns its `policy`."""
    namespace: dict = {}
    exec(compile(code, "<plan.to_python()>", "exec"), namespace)
    return namespace["policy"]


def test_to_python_with_user_names_matches_hand_written_transformer():
    """Saved values carry MaxText names: the export needs no tags and its policy, used per
    block, saves the same residuals as `apply`."""
    ex = examples.get_example("transformer", tags=True, **TRANSFORMER)
    t = trace(ex.fn, ex.args)
    keep = {"query_proj", "value_proj", "mlpwi"}
    regions = [Region(a, b, saved=frozenset(f"e{i}:0" for i in range(a, b) if t.jaxpr.eqns[i].primitive.name == "name"
                                            and t.jaxpr.eqns[i].params["name"] in keep))
               for a, b in block_ranges("transformer", **TRANSFORMER)]
    assert all(len(r.saved) == 3 for r in regions)
    plan = make_plan(t, regions)
    code = plan.to_python()
    assert "no tags to add" in code
    assert set(export_names(plan)[0].values()) == keep and export_names(plan)[1]
    policy = run_exported(code)
    hand = examples.get_example("transformer", policy=policy, tags=True, **TRANSFORMER)
    expected = residual_types(apply(ex.fn, plan), *ex.args)
    assert residual_types(hand.fn, *hand.args) == expected
    # ... and differs from saving nothing or everything named.
    nothing = examples.get_example("transformer", policy=CP.nothing_saveable, **TRANSFORMER)
    assert residual_types(nothing.fn, *nothing.args) != expected


def _mlp_layer_tagged(h, p, name):
    pre = h @ p["w"] + p["b"][None, :]  # examples._mlp_layer, with the pre-activation named
    return jax.nn.gelu(checkpoint_name(pre, name) if name else pre)


def _hand_written_mlp(policy, names):
    """The MLP with `names[k]` on layer k's pre-activation and one checkpoint per layer."""
    layers = [jax.checkpoint(functools.partial(_mlp_layer_tagged, name=n), policy=policy) for n in names]

    def loss(params, batch):
        h = batch["x"]
        for layer, p in zip(layers, params):
            h = layer(h, p)
        return jnp.mean((h - batch["y"]) ** 2)

    return loss


@pytest.mark.parametrize("offload", [False, True], ids=["save", "offload"])
@pytest.mark.parametrize("records", [True, False], ids=["with_values", "no_values"])
def test_to_python_without_user_names_matches_hand_written_mlp(offload, records):
    """Untagged model: the export lists a `checkpoint_name` tag per kept value; tagging a copy
    of the model that way and using the policy per layer saves the same residuals as `apply`."""
    ex = examples.get_example("mlp_chain", **MLP)
    t = trace(ex.fn, ex.args)
    blocks = block_ranges("mlp_chain", **MLP)
    kept = {0: f"e{blocks[0][0] + 2}:0", 2: f"e{blocks[2][0] + 2}:0"}  # pre-activations of layers 0 and 2
    assert all(t.jaxpr.eqns[int(v[1:-2])].primitive.name == "add" for v in kept.values())
    key = "offloaded" if offload else "saved"
    regions = [Region(a, b, **{key: frozenset({kept[k]} if k in kept else ())}) for k, (a, b) in enumerate(blocks)]
    plan = make_plan(t, regions, records=records)
    code = plan.to_python()
    names, all_user = export_names(plan)
    assert not all_user and set(names) == set(kept.values())
    for vid, name in names.items():
        assert f"checkpoint_name(x, {name!r})" in code, f"no tag line for {vid} in:\n{code}"
    assert ("save_and_offload_only_these_names" in code) == offload
    policy = run_exported(code)
    hand = _hand_written_mlp(policy, [names.get(kept.get(k)) for k in range(len(blocks))])
    expected = residual_types(apply(ex.fn, plan), *ex.args)
    assert residual_types(hand, *ex.args) == expected
    assert sum("host" in str(r[2]).lower() for r in expected) == (2 if offload else 0)
    assert_trees_equal(jax.grad(hand)(*ex.args), jax.grad(apply(ex.fn, plan))(*ex.args))


# ---------------------------------------------------------------------------
# summary()
# ---------------------------------------------------------------------------


def test_summary_has_totals_and_decisions():
    _, _, plan = mlp()
    text = plan.summary(verbose=True)
    print(text)
    totals = plan.totals()
    assert totals["save"] > 0 and totals["offload"] > 0 and totals["recompute"] > 0
    (line,) = [l for l in text.splitlines() if l.startswith("totals:")]
    for word in ("save", "offload", "recompute"):
        assert word in line
        assert re.search(rf"^e\d+:\d+\s+{word}\s", text, re.M), f"no {word} row"
    assert "regions: 3" in text and "budget 3" in text and "predicted peak" in text
    assert "checkpoint eqns [0, 11): 1 saved, 0 offloaded  (layer 0: dots saved)" in text
    assert plan.fingerprint in text
    short = plan.summary(max_rows=2, verbose=True)
    assert f"... {len(plan.values) - 2} more values" in short and "totals:" in short


def test_summary_speaks_per_layer():
    """The default summary is per layer (issue 17): each layer's code, and its bytes per
    decision adding up to the plan's totals; no internal value ids or equation ranges."""
    _, _, plan = mlp()
    ranges = block_ranges("mlp_chain", **MLP)
    plan = dataclasses.replace(plan, meta={**plan.meta, "layers": [[a, b, "mlp"] for a, b in ranges]})
    text = plan.summary()
    print(text)
    assert not re.search(r"\be\d+:\d+|checkpoint eqns", text)
    rows = layer_rows(plan)
    assert [r.layers for r in rows if r.first] == ["layer 1", "layer 2", "layer 3", "layer 4"]
    assert all("_mlp_layer (examples.py:" in r.code for r in rows if r.first)
    layer1, layer2 = rows[0], rows[1]
    assert layer1.bytes["save"] > 0 and layer1.bytes["offload"] == 0
    assert layer2.bytes["offload"] == layer1.bytes["save"] and layer2.bytes["save"] == 0
    for decision, total in plan.totals().items():
        assert sum(r.bytes[decision] for r in rows) == total
    for r in rows:
        assert r.layers in text and format_bytes(r.bytes["recompute"]) in text


def test_identical_layers_with_equal_decisions_are_one_row():
    """`layer_rows` merges neighbouring layers that are the same layer with the same
    decisions: a uniform policy on the 4-layer transformer is one row, 'layers 1-4'."""
    ex = examples.get_example("transformer", **TRANSFORMER)
    g = graph_from_traced(trace(ex.fn, ex.args))
    layers = find_layers(g)
    assert len(layers) == TRANSFORMER["n_layers"]
    plan = _hand.layer_plan(g, layers, ["dots_saveable"] * len(layers))
    (row,) = [r for r in layer_rows(plan) if r.first]
    assert row.layers == "layers 1-2" and "_transformer_block" in row.code
    mixed = _hand.layer_plan(g, layers, ["dots_saveable", "nothing_saveable"])
    assert [r.layers for r in layer_rows(mixed) if r.first] == ["layer 1", "layer 2"]


@pytest.mark.parametrize("name", ["transformer", "transformer_scan"])
def test_every_kept_value_has_a_record_with_its_source(name):
    """`to_plan` records each value a region or scan body keeps (the export tags it at its
    source line), and a `checkpoint_name` copy of a kept value is not counted twice."""
    from autoremat._bridge import baseline_segments, to_plan
    from autoremat.solver._chain_model import build_chain_model

    ex = examples.get_example(name, tags=True, **TRANSFORMER)
    model = build_chain_model(graph_from_traced(trace(ex.fn, ex.args)))
    segments, _ = baseline_segments(model, "save:dots")
    plan = to_plan(model, segments)
    kept = set().union(*(p.saved | p.offloaded for p in (*plan.regions, *plan.scans)))
    assert kept and kept <= set(plan.values)
    assert all(plan.values[v].source and plan.values[v].decision != "recompute" for v in kept)
    names = [r.name for r in plan.values.values() if r.name and r.decision == "save"]
    assert names and len(names) == len(set(names)) * (1 if name.endswith("scan") else TRANSFORMER["n_layers"])
    assert "autoremat_e" not in "".join(line for line in plan.to_python().splitlines() if "/body/" in line)


def test_a_linen_models_layers_are_named_by_module_path():
    """flax linen puts module paths on JAX's name stack: the per-layer view names each layer by
    it, and identical neighbours merge into one row spanning their paths (the first layer reads
    the function's input and the last feeds the loss: each differs from the middle ones)."""
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return x + nn.Dense(16)(jax.nn.gelu(nn.Dense(64)(x)))

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(4):
                x = Block()(x)
            return jnp.mean(x ** 2)

    net, x = Net(), jnp.ones((8, 16))
    params = net.init(jax.random.key(0), x)
    g = graph_from_traced(trace(lambda p, x: net.apply(p, x), (params, x)))
    layers = find_layers(g)
    assert len(layers) == 4
    rows = [r for r in layer_rows(_hand.layer_plan(g, layers, ["nothing_saveable"] * 4)) if r.first]
    assert [r.where.split(":")[0] for r in rows] == ["Net/Block_0", "Net/Block_1 .. Net/Block_2", "Net/Block_3"]
    assert [r.layers for r in rows] == ["layer 1", "layers 2-3", "layer 4"]
    mixed = _hand.layer_plan(g, layers, ["nothing_saveable", "dots_saveable", "nothing_saveable", None])
    assert [r.scope for r in layer_rows(mixed) if r.first][:3] == ["Net/Block_0", "Net/Block_1", "Net/Block_2"]
    assert re.search(r"# layer 2: Net/Block_1: \S*__call__ \(test_plan_io.py:\d+", mixed.to_python("flax-linen"))
