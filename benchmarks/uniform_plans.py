"""Predicted vs compiled peak of uniform plans, next to JAX's policies, on any backend.

    python benchmarks/uniform_plans.py transformer,mlp_chain

For each example (small size): the compiled peak of no remat and of per-block
`nothing_saveable` / `dots_saveable`; then, for the chain model with blocks merged "next"
and "prev" (offload off), every-block-the-same plans (`model.uniform`) with the model's
predicted peak and XLA's compiled peak for abstract and for concrete arguments, and the
model's lowest-peak plan.  Prints to stdout (results/gpu-h100-uniform.log is an H100 run).
"""
import os, sys
from autoremat._xla import configure_cpu_flags
configure_cpu_flags()
import jax
from autoremat.examples import get_example
from autoremat.graph._trace import trace
from autoremat.graph._graph import graph_from_traced
from autoremat.graph._profiles import detect_profile
from autoremat.solver._chain_model import build_chain_model
from autoremat.solver._chain import evaluate, lowest_peak_segments
from autoremat.runtime._apply import apply
from autoremat.runtime._validate import compiled_stats
from autoremat._bridge import to_plan

MiB = 2**20
cp = jax.checkpoint_policies
print("backend", jax.default_backend(), jax.__version__, "XLA_FLAGS", os.environ.get("XLA_FLAGS"), flush=True)
models = sys.argv[1].split(",") if len(sys.argv) > 1 else ["transformer"]
def fmt(s):
    return f"peak {s.peak_bytes/MiB:.1f} (arg {s.argument_bytes/MiB:.1f} out {s.output_bytes/MiB:.1f} temp {s.temp_bytes/MiB:.1f} alias {s.alias_bytes/MiB:.1f} host {s.host_bytes/MiB:.1f}) flops {s.flops/1e9:.2f}G"
for name in models:
    ex = get_example(name)
    print(f"== {name}", flush=True)
    print("no remat:", fmt(compiled_stats(ex.fn, *ex.args)), flush=True)
    for pol in ("nothing_saveable", "dots_saveable"):
        e2 = get_example(name, policy=getattr(cp, pol))
        print(f"{pol}:", fmt(compiled_stats(e2.fn, *e2.args)), flush=True)
    absargs = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), ex.args)
    tr = trace(ex.fn, absargs, {})
    g = graph_from_traced(tr, profile=detect_profile())
    for merge in ("next", "prev"):
        m = build_chain_model(g, offload=False, merge=merge)
        print(f"-- merge {merge}: {len(m.blocks)} blocks, base {m.base_bytes/MiB:.1f}", flush=True)
        cands = [(k, s) for k in ("none", "ckpt:recompute") for s in ((1,) if k == "none" else (1, 2, 4))]
        cands += [("ckpt:save:dots", 1)]
        for kind, size in cands:
            segs = m.uniform(kind, size)
            if segs is None:
                continue
            pred = evaluate(m.raw_problem, segs)[0]
            plan = to_plan(m, segs)
            f = apply(ex.fn, plan)
            s1 = compiled_stats(f, *absargs)
            s2 = compiled_stats(f, *ex.args)
            print(f"{kind} x{size}: pred {pred/MiB:.1f} | abstract {fmt(s1)} | concrete peak {s2.peak_bytes/MiB:.1f}", flush=True)
        low = lowest_peak_segments(m.problem)
        pred = evaluate(m.raw_problem, low)[0]
        s1 = compiled_stats(apply(ex.fn, to_plan(m, low)), *absargs)
        print(f"lowest: pred {pred/MiB:.1f} | {fmt(s1)} | {[sg.option.name for sg in low]}", flush=True)
