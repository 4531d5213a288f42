"""Does the line through the policies' compiled peaks predict the chain solver's plans?

At 1B the solver's first round mostly compiles over the budget (its chain model under-predicts:
benchmarks/results/realscale.md), a whole-step compile for nothing.  `HandSearch` predicts the
region solver's saved sets per layer by a line through JAX's policies' compiled peaks against
the bytes they store (`_layer_options.fit_peak_line`); could that line screen the solver's plans
too?  Per model, this compiles each policy per layer, fits peak = a + b x stored on them, where
stored = the bytes of the values made inside the layers that the plan keeps for the backward
pass (what a region saves, plus its inputs; outside regions, every residual), then asks the
chain solver (`solver.solve`, the planner's chain model calibrated on the un-optimized step)
for plans at a few targets, compiles each, and sets the line and the model against it.

    .venv/bin/python benchmarks/solver_line.py          # writes results/solver_line.md (~5 min)
"""

from __future__ import annotations

import os
import sys

import autoremat

autoremat.configure_cpu_flags()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realscale  # noqa: E402
from _common import models_run, planner_model, write_results  # noqa: E402

from autoremat._bridge import to_plan  # noqa: E402
from autoremat._hand import layer_plan  # noqa: E402
from autoremat._layer_options import fit_peak_line, policy_keeps  # noqa: E402
from autoremat.runtime import apply  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402
from autoremat.solver import solve  # noqa: E402

GiB = 2**30
MODELS = ("gpt", "equinox", "resnet_flax")
# Targets as fractions of the leanest policy's compiled peak: about where realscale.py's solver
# rounds aimed between nothing_saveable and dots_with_no_batch_dims_saveable.
TARGETS = (0.75, 0.85, 0.95, 1.1)


def stored(g, layers, plan) -> int:
    """Bytes of the values made inside `layers` that `plan` keeps for the backward pass."""
    ops = list(g.ops.values())
    inside = {i for la in layers for i in range(la.start, la.stop)}
    covered, keep = set(), set()
    for r in plan.regions:
        rops = ops[r.start:r.stop]
        covered |= set(range(r.start, r.stop))
        made = {v for op in rops for v in op.outputs}
        keep |= {v for op in rops for v in op.inputs if v not in made}
        keep |= set(policy_keeps(g, rops, r.policy)) if r.policy else set(r.saved)
    for op in ops:
        if op.index not in covered:
            keep |= set(op.residual_inputs) | set(op.residual_outputs)
    made_inside = {v for i in inside for v in ops[i].outputs}
    return sum(g.values[v].nbytes for v in keep & made_inside)


def model_rows(name: str, say) -> tuple[str, list]:
    fn, args, desc, n = realscale.make_model(name)
    g, layers, _, model = planner_model(fn, args, say)
    points, rows = [], []
    for pol in realscale.POLICIES:
        hand_fn, hand_args, _, _ = realscale.make_model(name, [pol] * n)
        got = compiled_stats(hand_fn, *hand_args).peak_bytes
        points.append((stored(g, layers, layer_plan(g, layers, [pol] * len(layers))), got))
        rows.append((f"{pol} per layer", None, points[-1][0], None, got))
    a, b = fit_peak_line(points)
    lean = min(p for _, p in points)
    for frac in TARGETS:
        res = solve(model.problem, int(frac * lean))
        plan = to_plan(model, res.segments)
        s = stored(g, layers, plan)
        got = compiled_stats(apply(fn, plan), *args).peak_bytes
        rows.append((f"solver plan for {frac:.2f} x {lean / GiB:.2f} GiB", res.peak_bytes, s, a + b * s, got))
        say(f"{name} {rows[-1][0]}: model {res.peak_bytes / GiB:.3f}, line {(a + b * s) / GiB:.3f}, "
            f"compiled {got / GiB:.3f} GiB")
    return desc + f"; line: {a / GiB:.3f} GiB + {b:.3f} x stored", rows


def _err(v, got: int) -> str:
    return "" if v is None else f"{v / GiB:.3f} ({(v - got) / got:+.1%})"


def main(argv=None) -> int:
    a, say, t0 = models_run(__doc__.split("\n")[0], MODELS, "solver_line.md", argv)
    body = []
    for name in a.models:
        desc, rows = model_rows(name, say)
        body += [f"### {name}", "", desc, "",
                 "| plan | stored GiB | compiled GiB | model GiB (error) | line GiB (error) |", "|---|---|---|---|---|"]
        body += [f"| {label} | {s / GiB:.3f} | {got / GiB:.3f} | {_err(m, got)} | {_err(line, got)} |"
                 for label, m, s, line, got in rows] + [""]
    write_results(a, say, t0, "solver_line.py", MODELS, "The policies' peak line against the chain solver's plans",
                  "Compiled peak = argument + output + temp - alias of the compiled `value_and_grad` step; stored = "
                  "bytes of the values made inside the layers that the plan keeps for the backward pass; line = a + b "
                  "x stored, least squares through the three policies per layer; model = the chain model's peak of "
                  "the solver's plan (calibrated on the un-optimized step, not corrected by the twins). Error = "
                  "(predicted - compiled) / compiled.", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
