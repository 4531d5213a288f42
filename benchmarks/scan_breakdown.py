"""Where the scan model's prediction goes wrong: per body option, predicted vs compiled.

    python benchmarks/scan_breakdown.py

On the built-in scan transformer (small size, offload off): for a few of the scan body's
options applied to the scan alone, the increase of the predicted and of the compiled peak
over the nothing-saved body, the saved bytes per iteration, and which saved values are in
JAX's residual list (with `checkpoint_name` aliases) or the fusion-aware one.  Then, per body
option, three live-body rules in MiB of scan stored + live body (without gradients and
cotangents): the one used before 4767492, one tried and not kept (recomputed residuals
reachable from saved values through fusible equations alone are not counted), and the
model's (`stored_residuals` with the saved set), next to the compiled peak.  Prints to stdout (docs/FINDINGS.md).
"""
from autoremat._xla import configure_cpu_flags

configure_cpu_flags()

import jax  # noqa: E402

from autoremat.examples import get_example  # noqa: E402
from autoremat.graph._graph import graph_from_traced  # noqa: E402
from autoremat.graph._profiles import detect_profile  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402
from autoremat.runtime._apply import apply  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402
from autoremat.solver import _chain_model, _peak_model, _recompute, _scan_options  # noqa: E402
from autoremat.solver._chain import evaluate  # noqa: E402
from autoremat._bridge import to_plan  # noqa: E402

MiB = 2**20
ex = get_example("transformer_scan")
abstract = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), ex.args)
g = graph_from_traced(trace(ex.fn, abstract, {}), profile=detect_profile())
m = _chain_model.build_chain_model(g, offload=False)
si = next(i for i, b in enumerate(m.blocks) if b.kind == "scan")
op = g.ops[m.blocks[si].ops[0]]
body = op.bodies[0]
body_ops = list(body.ops.values())
raw = {v for o in body_ops for v in o.residual_inputs + o.residual_outputs if body.values[v].producer is not None}
res, _ = _peak_model.stored_residuals(body, body_ops)
nb = lambda vs: sum(body.values[v].nbytes for v in vs)  # noqa: E731

print("option: predicted / compiled increase over nothing saved (MiB) | saved per iteration, of it in JAX's list "
      "(aliases included), in the fusion-aware list")
base = None
for o in m.raw_options[(si, si + 1)]:
    if o.name in ("scan:recompute", "scan:ilp20%", "scan:ilp30%", "scan:ilp40%", "scan:save:dots",
                  "scan:save:dots_no_batch"):
        segs = m.uniform(o.name, scans_only=True)
        pred = evaluate(m.raw_problem, segs)[0]
        comp = compiled_stats(apply(ex.fn, to_plan(m, segs)), *abstract).peak_bytes
        saved = o.payload["saved"]
        base = base or (pred, comp)
        print(f"{o.name}: {(pred - base[0]) / MiB:+.1f} / {(comp - base[1]) / MiB:+.1f} | {nb(saved) / MiB:.2f}, "
              f"{nb(_scan_options._with_name_aliases(body_ops, saved) & raw) / MiB:.2f}, {nb(saved & res) / MiB:.2f}",
              flush=True)


def anchored_live(saved):
    """The rule not kept: only recomputed residuals that need a non-fusible equation count."""
    al = _scan_options._with_name_aliases(body_ops, saved)
    anch = {}
    for o in body_ops:
        a = any(anch.get(v, False) for v in o.inputs if body.values[v].producer is not None)
        for v in o.outputs:
            anch[v] = False if v in al else (a if _recompute._fusible(o) or o.primitive == "name" else True)
    return nb(v for v in raw - al if anch.get(v, False))


length = int(op.params["length"])
ncar, nconst = int(op.params.get("num_carry", 0)), int(op.params.get("num_consts", 0))
per_iter_in = nb(body.inputs[nconst:nconst + ncar])
print("\noption: scan stored + live body (MiB): JAX's full list less the saved values (the rule before "
      "4767492) / anchored rule (not kept) / re-run chains kept whole (the model's rule); compiled peak")
for o in m.raw_options[(si, si + 1)]:
    if o.name.startswith("scan:") and "offload" not in o.name:
        saved = o.payload["saved"]
        kept = _scan_options._with_name_aliases(body_ops, saved)
        stored = length * (per_iter_in + nb(saved))
        full = stored + nb(raw) - nb(kept & raw)
        rerun, rerun_extra = _peak_model.stored_residuals(body, body_ops, kept)
        current = stored + nb(rerun - kept) + rerun_extra
        comp = compiled_stats(apply(ex.fn, to_plan(m, m.uniform(o.name, scans_only=True))), *abstract).peak_bytes
        print(f"{o.name}: {full / MiB:.1f} / {(stored + anchored_live(saved)) / MiB:.1f} / {current / MiB:.1f}; "
              f"{comp / MiB:.1f}", flush=True)

print("\noption (the user's checkpoint_name tags): predicted / compiled peak (MiB), estimated extra ms, model GFLOP")
for o in m.raw_options[(si, si + 1)]:
    if o.name.startswith(("scan:save:name:", "scan:save:dots_no_batch+")):
        segs = m.uniform(o.name, scans_only=True)
        pred, extra = evaluate(m.raw_problem, segs)
        comp = compiled_stats(apply(ex.fn, to_plan(m, segs)), *abstract).peak_bytes
        flops = sum(sg.option.recompute_flops for sg in segs)
        print(f"{o.name}: {pred / MiB:.1f} / {comp / MiB:.1f}, {extra * 1e3:.2f}, {flops / 1e9:.2f}", flush=True)
