"""Do per-layer measurements compose into the whole step's compiled peak?  (issue 14's premise)

For each model: find its repeated layers (`ChainModel.period`), measure each per-layer option
(no remat, JAX's `nothing_saveable`, `dots_with_no_batch_dims_saveable`, `dots_saveable`, as
the chain model's option kinds) by compiling one layer alone and two consecutive layers
(`autoremat.runtime._measure.measure_layer`: `b` = the layer's backward, `s` = the layer and
the next one, left alone, less that one alone), then compose the chain formula of `solver/_chain.py` over the layers:

    peak = base + max(sum of s, max_k (sum_{j<k} s_j + b_k))

with `base` (parameters, gradients, embedding, head, ...) taken from ONE compile of the whole
step (per-layer `nothing_saveable`), and compare with the compiled whole step for every
per-layer policy and two half-and-half mixes.  The non-layer blocks are left alone in every
plan.  Compile-only (abstract shapes), so the 1B decoder runs on this CPU.

Run: `.venv/bin/python benchmarks/layer_measure.py [--models transformer mlp_chain llama1b]`
(writes benchmarks/results/layer_measure.md).
"""

import argparse
import datetime
import os
import platform
import sys
import time

import autoremat

autoremat.configure_cpu_flags()

import jax  # noqa: E402

from autoremat._bridge import to_plan  # noqa: E402
from autoremat._shardings import abstract_arguments  # noqa: E402
from autoremat.examples import get_example  # noqa: E402
from autoremat.graph import build_graph  # noqa: E402
from autoremat.runtime import apply  # noqa: E402
from autoremat.runtime._measure import measure_layer, measure_segment  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402
from autoremat.solver._chain import Segment  # noqa: E402
from autoremat.solver._chain_model import build_chain_model  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measured import chain_formula  # noqa: E402

KINDS = {"none": "no remat", "ckpt:recompute": "nothing_saveable",
         "ckpt:save:dots_no_batch": "dots_with_no_batch_dims_saveable", "ckpt:save:dots": "dots_saveable"}
GiB = 2**30


def llama1b():
    """A ~1B Llama-style decoder (docs/FACTS.md fact 11's shapes): `realscale.py`'s, with 16 layers
    (bf16, RMSNorm, rotary positions, SwiGLU, causal attention; d_model 2048, 16 heads, d_ff
    5632, vocab 32000, seq 2048, batch 4).  Abstract arguments: nothing is allocated."""
    from realscale import make_model

    loss, args, _, _ = make_model("llama", n_layers=16)
    return loss, args, "Llama-style decoder, 16 layers, d_model 2048, d_ff 5632, seq 2048, batch 4, bf16"


def _model(name):
    if name == "llama1b":
        return llama1b()
    ex = get_example(name)
    args, _ = abstract_arguments(ex.args, {}, (), None)
    return ex.fn, args, ex.description


def _layers(m):
    """(first block of each repeated layer..., block after the last), from ChainModel.period."""
    per = m.period()
    if per is None:
        return None
    offset, p = per
    sig = [b.signature for b in m.blocks]
    starts = [offset]
    while starts[-1] + 2 * p <= len(sig) and sig[starts[-1] + p:starts[-1] + 2 * p] == sig[offset:offset + p]:
        starts.append(starts[-1] + p)
    return starts + [starts[-1] + p]


def _option(m, i, j, kind):
    return next(o for o in m.raw_options[(i, j)] if o.name == kind)


def _plan_segments(m, bounds, kinds):
    """Segments: layer k gets kinds[k]; every other block is left alone."""
    segs, i = [], 0
    layer_of = {s: k for k, s in enumerate(bounds[:-1])}
    while i < m.problem.n_blocks:
        if i in layer_of:
            k = layer_of[i]
            segs.append(Segment(i, bounds[k + 1], _option(m, i, bounds[k + 1], kinds[k])))
            i = bounds[k + 1]
        else:
            segs.append(Segment(i, i + 1, _option(m, i, i + 1, "none")))
            i += 1
    return tuple(segs)


def run_model(name, out):
    first = len(out)
    fn, args, desc = _model(name)
    t0 = time.perf_counter()
    g = build_graph(fn, *args)
    m = build_chain_model(g, offload=False)
    bounds = _layers(m)
    t_model = time.perf_counter() - t0
    out.append(f"\n## {name}\n\n{desc}.\n")
    if bounds is None or len(bounds) < 3:
        out.append("No repeated layers found (ChainModel.period): nothing to compose.\n")
        return
    n = len(bounds) - 1
    eq = [m.blocks[b].start for b in bounds[:-1]] + [m.blocks[bounds[-1] - 1].stop]
    meas, t_meas = {}, time.perf_counter()
    none_plan = to_plan(m, _plan_segments(m, bounds, ["none"] * n))
    next_alone = measure_segment(g.traced, none_plan, eq[1], eq[2])
    for kind in KINDS:
        one = to_plan(m, _plan_segments(m, bounds, [kind] + ["none"] * (n - 1)))
        meas[kind] = measure_layer(g.traced, one, eq[0], eq[1], eq[2], next_alone)
    post = measure_segment(g.traced, none_plan, eq[-1], len(g.traced.jaxpr.eqns)).backward_bytes
    t_meas = time.perf_counter() - t_meas
    unit = "GiB" if g.traced.in_avals and sum(a.size * a.dtype.itemsize for a in g.traced.in_avals) > GiB else "MiB"
    div = GiB if unit == "GiB" else 2**20
    half = n // 2
    cases = [(KINDS[k], [k] * n) for k in KINDS]
    cases.append((f"{half} nothing + {n - half} dots_no_batch", ["ckpt:recompute"] * half
                   + ["ckpt:save:dots_no_batch"] * (n - half)))
    cases.append((f"{half} dots_no_batch + {n - half} nothing", ["ckpt:save:dots_no_batch"] * half
                   + ["ckpt:recompute"] * (n - half)))
    compiled = {}
    t_comp = time.perf_counter()
    for label, kinds in cases:
        plan = to_plan(m, _plan_segments(m, bounds, kinds))
        compiled[label] = compiled_stats(apply(fn, plan), *args).peak_bytes
    t_comp = time.perf_counter() - t_comp
    base = compiled["nothing_saveable"] - chain_formula([meas["ckpt:recompute"]] * n, post)
    out.append(f"{n} repeated layers of {bounds[1] - bounds[0]} chain blocks; chain model built in {t_model:.1f} s; "
               f"{2 * len(KINDS) + 2} layer compiles in {t_meas:.1f} s (the blocks after the layers: b = {post / div:.3f} {unit}); {len(cases)} whole-step compiles in {t_comp:.1f} s. "
               f"`base` = 'nothing_saveable' compiled less its composition: {base / div:.3f} {unit}.\n")
    out.append(f"| per-layer option | s (stored) {unit} | b (backward) {unit} |\n|---|---:|---:|")
    for kind, lab in KINDS.items():
        out.append(f"| {lab} | {meas[kind].stored_bytes / div:.3f} | {meas[kind].backward_bytes / div:.3f} |")
    out.append(f"\n| plan (per layer) | composed {unit} | compiled {unit} | error |\n|---|---:|---:|---:|")
    for label, kinds in cases:
        pred = base + chain_formula([meas[k] for k in kinds], post)
        c = compiled[label]
        out.append(f"| {label} | {pred / div:.3f} | {c / div:.3f} | {100 * (pred - c) / c:+.1f}% |")
    print("\n".join(out[first:]), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["transformer", "mlp_chain", "llama1b"])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "layer_measure.md"))
    opts = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = [f"# Per-layer measurements, composed (`python benchmarks/layer_measure.py {' '.join(sys.argv[1:])}`)",
           "", f"{platform.platform()}, {os.cpu_count()} CPUs, jax {jax.__version__}, backend {jax.default_backend()}, "
           f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, {datetime.date.today()}. Compiled peak = argument + "
           "output + temp - alias of `jax.value_and_grad`, abstract shapes."]
    for name in opts.models:
        run_model(name, out)
    out.append(f"\nTotal {time.perf_counter() - t0:.0f} s.")
    with open(opts.out, "w") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
