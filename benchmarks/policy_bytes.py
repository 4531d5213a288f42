"""At a JAX policy's own bytes per layer, what does the region solver's saved set recompute, and
where does it compile?

autoremat's per-layer saved sets (`autoremat/_layer_options.py`) are the exact region solver's
(CP-SAT, least recompute time under a byte cap) at fixed caps, fractions of each layer's
residual bytes (`solver._region_options.DEFAULT_CAPS`).  A hand-written policy per layer saves
some bytes per layer too.  This solves each distinct layer of the unrolled realscale.py models
once more with the cap at each policy's own bytes (the outputs the policy saves in the layer,
`autoremat._layer_options.policy_saves`), copies the set onto every layer of its kind, and compiles it per
layer beside the policy per layer: if the set fits where the policy does and recomputes less,
a cap there is an option the planner lacks.

Columns: bytes saved per layer (the first layer of each kind, summed over kinds for unlike
layers; the policy's are all the outputs it saves, the set's the values it names); the region
problem's matmul FLOPs recomputed over the stack (`recompute_closure`, the model's count); the
compiled peak and the extra matmul FLOPs of the compiled step's jaxpr over the un-optimized
one's (`CompiledStats.matmul_flops`).  Writes results/policy_bytes.md (~4 min on 2 cores):

    .venv/bin/python benchmarks/policy_bytes.py
    .venv/bin/python benchmarks/policy_bytes.py --models gpt --out /tmp/p.md
"""

from __future__ import annotations

import math
import os
import sys

import autoremat

autoremat.configure_cpu_flags()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realscale  # noqa: E402
from _common import models_run, write_results  # noqa: E402

from autoremat._hand import layer_plan  # noqa: E402
from autoremat._layer_options import _layer_problem, _shift, policy_saves  # noqa: E402
from autoremat._optimize import _graph  # noqa: E402
from autoremat.graph._profiles import detect_profile  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402
from autoremat.runtime import apply  # noqa: E402
from autoremat.runtime._validate import compiled_stats, stage_step  # noqa: E402
from autoremat.solver._region import recompute_closure  # noqa: E402
from autoremat.solver._region_options import _solve_block_options  # noqa: E402

GiB, MiB = 2**30, 2**20
MODELS = ("llama", "gpt", "equinox", "resnet_flax")
POLICIES = ("dots_with_no_batch_dims_saveable", "dots_saveable")


def solve_at_policy_bytes(g, layer_ops, policy: str, fraction: float = 1.0):
    """(policy's bytes, set's bytes, set, model's matmul FLOPs: policy, set) of one layer; the
    region solver capped at `fraction` of the bytes of the outputs `policy` saves in it.  None if
    it saves none."""
    produced, residuals, problem = _layer_problem(g, layer_ops)
    res_bytes = sum(g.values[v].nbytes for v in residuals if v in produced)
    policy_set = frozenset(v for op in layer_ops for v in op.outputs if policy_saves(policy, op, v))
    policy_bytes = sum(g.values[v].nbytes for v in policy_set)
    if not policy_bytes or not res_bytes:
        return None
    cap = min(1.0, fraction * policy_bytes / res_bytes)
    _, saved = _solve_block_options(g, layer_ops, produced, residuals, (cap,), "cpsat", 10.0)[-1]

    def matmul(s):
        return math.fsum(g.ops[o].matmul_flops for o in recompute_closure(problem, s))

    return policy_bytes, sum(g.values[v].nbytes for v in saved), saved, matmul(policy_set), matmul(saved)


def model_rows(name: str, say) -> tuple[str, list]:
    fn, args, desc, n = realscale.make_model(name)
    traced = trace(fn, args, {}, skip_integer_leaves=False)
    g, layers = _graph(traced, detect_profile(), say)
    ops = list(g.ops.values())
    none_matmul = stage_step(fn, *args).matmul_flops
    rows = []
    for pol in POLICIES:
        solved, first = {}, {}
        for la in layers:
            if la.key not in solved:
                solved[la.key], first[la.key] = solve_at_policy_bytes(g, ops[la.start:la.stop], pol), la.start
        if any(s is None for s in solved.values()):
            say(f"{name} {pol}: saves nothing in some layer kind: skipped")
            continue
        sets = [_shift(g, solved[la.key][2], la.start - first[la.key]) for la in layers]
        model = [sum(solved[la.key][k] for la in layers) for k in (3, 4)]
        per_layer = [sum(s[k] for s in solved.values()) for k in (0, 1)]
        got = {}
        for label, plan in (("policy", layer_plan(g, layers, [pol] * n)), ("set", layer_plan(g, layers, sets))):
            st = compiled_stats(apply(fn, plan), *args)
            got[label] = (st.peak_bytes, st.matmul_flops - none_matmul)
            say(f"{name} {pol} {label}: {st.peak_bytes / GiB:.3f} GiB, +{got[label][1] / 1e12:.3f} TFLOP matmul")
        rows.append((pol, per_layer, model, got))
    return desc, rows


def table(name: str, desc: str, rows: list) -> list[str]:
    out = [f"### {name}", "", desc, "",
           "| policy per layer | bytes per layer MiB: policy / set | model +TFLOP: policy / set "
           "| compiled GiB: policy / set | compiled +TFLOP matmul: policy / set |",
           "|---|---|---|---|---|"]
    for pol, (pb, sb), (pm, sm), got in rows:
        (pp, pf), (sp, sf) = got["policy"], got["set"]
        out.append(f"| {pol} | {pb / MiB:.1f} / {sb / MiB:.1f} | {pm / 1e12:.3f} / {sm / 1e12:.3f} | "
                   f"{pp / GiB:.3f} / {sp / GiB:.3f} | {pf / 1e12:.3f} / {sf / 1e12:.3f} |")
    return out + [""]


def main(argv=None) -> int:
    a, say, t0 = models_run(__doc__.split("\n")[0], MODELS, "policy_bytes.md", argv)
    sections = []
    for name in a.models:
        desc, rows = model_rows(name, say)
        sections += table(name, desc, rows)
    write_results(a, say, t0, "policy_bytes.py", MODELS, "The region solver's set at a JAX policy's own bytes per layer",
                  "Per layer, the region solver (CP-SAT, least recompute time) capped at the bytes of the outputs the "
                  "policy saves in the layer, against the policy; both applied per layer (`autoremat._hand.layer_plan`) "
                  "and compiled (`value_and_grad`, abstract arguments). Compiled peak = argument + output + temp - "
                  "alias; +TFLOP = matmul FLOPs of the step's jaxpr over the un-optimized step's; model = the region "
                  "problem's count of the matmuls each set recomputes, summed over the layers.", sections)
    return 0


if __name__ == "__main__":
    sys.exit(main())
