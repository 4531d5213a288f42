"""Do autoremat's hand-written candidates compile to the program a person writes, on a model
whose author already checkpoints inside each layer?

`_unseen.inner_checkpoint`: the author wrapped the attention core in `jax.checkpoint`.  A person
who puts a JAX policy around each layer keeps that checkpoint inside it.  autoremat traces the
function with the user's checkpoints inlined, and its candidates (`_hand.layer_plan`, run by
`runtime.apply`) keep the ones a person keeps (`Plan.user_checkpoints`).  Per plan, this
compiles (compile-only, abstract arguments):

* hand-written: the model with the policies written in (`inner_checkpoint(policies=...)`);
* autoremat's candidate: `layer_plan` of those policies, applied;
* inlined: the same plan with no user checkpoint kept (what every plan was before 673c8b2).

    .venv/bin/python benchmarks/user_checkpoints.py     # writes results/user_checkpoints.md (~30 s)
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realscale  # noqa: E402  (sets XLA:CPU's flags before JAX starts)
from _common import write_table  # noqa: E402
from _unseen import inner_checkpoint  # noqa: E402

from autoremat._hand import layer_plan  # noqa: E402
from autoremat.graph._graph import graph_from_traced  # noqa: E402
from autoremat.graph._layers import find_layers  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402
from autoremat.runtime import apply, compiled_stats  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "user_checkpoints.md")


def _cell(st) -> str:
    return f"{st.peak_bytes} ({st.peak_bytes / realscale.GiB:.2f} GiB) / {st.matmul_flops / 1e12:.4f}"


def main() -> int:
    t0 = time.perf_counter()
    fn, args, desc, n = inner_checkpoint()
    g = graph_from_traced(trace(fn, args))
    layers = find_layers(g)
    half = n // 2
    plans = {"nothing_saveable per layer": ["nothing_saveable"] * n,
             "dots_with_no_batch_dims_saveable per layer": ["dots_with_no_batch_dims_saveable"] * n,
             "dots_saveable per layer": ["dots_saveable"] * n,
             f"mix: {half} nothing_saveable + {n - half} dots_with_no_batch_dims_saveable":
                 ["nothing_saveable"] * half + ["dots_with_no_batch_dims_saveable"] * (n - half)}
    rows = ["| plan | hand-written bytes / matmul TFLOP | autoremat's candidate | inlined | candidate = hand |",
            "|---|---|---|---|---|"]
    for label, pols in plans.items():
        plan = layer_plan(g, layers, pols)
        hand = compiled_stats(inner_checkpoint(policies=pols)[0], *args)
        ours = compiled_stats(apply(fn, plan), *args)
        inlined = compiled_stats(apply(fn, replace(plan, user_checkpoints=())), *args)
        same = (ours.peak_bytes, ours.matmul_flops) == (hand.peak_bytes, hand.matmul_flops)
        rows.append(f"| {label} | {_cell(hand)} | {_cell(ours)} | {_cell(inlined)} | {'yes' if same else '**no**'} |")
        print(rows[-1], flush=True)
    write_table(OUT, "# The author's own checkpoint inside each layer: hand-written against autoremat's candidates",
                  "python benchmarks/user_checkpoints.py", t0, rows,
                  f"{desc}; {len(layers)} layers found. Compiled peak (argument + output + temp - alias of the "
                  "`value_and_grad` step, bytes) and matmul TFLOP.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
