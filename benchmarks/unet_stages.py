"""Do the stages `graph.find_layers` finds in a U-Net make the per-stage plans a person writes?

Nothing in a U-Net repeats (its stages differ in width) and its skips cross every cut on the
residual stream, so until 54fe2a7 it got no layers, and no policy per stage was a candidate: the
smoke run's tiny U-Net (`run.py --quick`) found nothing under per-stage `nothing_saveable`'s
380044 bytes.  Now a stage ends where a skip is made or taken (`graph._layers._stages`).  Per
U-Net and JAX policy, this compiles (compile-only for the real-scale one):

* hand-written: the model with the policy written around each stage, as its author does
  (`examples.convnet(policy=...)`, `_unseen.unet(policies=...)`: the real-scale one leaves the
  pooling between its stages);
* autoremat's candidate: `layer_plan` of that policy on every stage found, applied.

    .venv/bin/python benchmarks/unet_stages.py     # writes results/unet_stages.md (~20 s)
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realscale  # noqa: E402  (sets XLA:CPU's flags before JAX starts)
from _common import write_table  # noqa: E402
from _unseen import unet  # noqa: E402

import jax  # noqa: E402

from autoremat._hand import HAND_POLICIES, layer_plan  # noqa: E402
from autoremat.examples import get_example  # noqa: E402
from autoremat.graph._graph import graph_from_traced  # noqa: E402
from autoremat.graph._layers import find_layers  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402
from autoremat.runtime import apply, compiled_stats  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "unet_stages.md")
QUICK = dict(depth=2, channels=8, image=16, batch=2)  # benchmarks/run.py --quick's


def _models():
    """(label, fn, args, written(policy) -> (fn, args), stages written)."""
    for label, kw in (("examples.convnet, run.py --quick's size", QUICK), ("examples.convnet (small)", {})):
        ex = get_example("convnet", **kw)
        yield label, ex.fn, ex.args, lambda pol, kw=kw: _example(pol, kw), ex.n_blocks
    fn, args, desc, n = unet()
    yield f"_unseen.unet: {desc}", fn, args, lambda pol, n=n: unet(policies=[pol] * n)[:2], n


def _example(pol, kw):
    ex = get_example("convnet", policy=getattr(jax.checkpoint_policies, pol), **kw)
    return ex.fn, ex.args


def _cell(st, base) -> str:
    return f"{st.peak_bytes} ({st.peak_bytes / realscale.GiB:.3f} GiB) / {(st.matmul_flops - base) / 1e9:.3f}"


def main() -> int:
    t0 = time.perf_counter()
    rows = ["| model | stages written / found | policy per stage | hand-written bytes / +matmul GFLOP | "
            "autoremat's candidate | candidate's peak - hand's |", "|---|---|---|---|---|---|"]
    for label, fn, args, written, n in _models():
        g = graph_from_traced(trace(fn, args))
        layers = find_layers(g)
        base = compiled_stats(fn, *args).matmul_flops
        for pol in HAND_POLICIES:
            hand_fn, hand_args = written(pol)
            hand = compiled_stats(hand_fn, *hand_args)
            ours = compiled_stats(apply(fn, layer_plan(g, layers, [pol] * len(layers))), *args)
            rows.append(f"| {label} | {n} / {len(layers)} | {pol} | {_cell(hand, base)} | {_cell(ours, base)} | "
                        f"{ours.peak_bytes - hand.peak_bytes:+d} |")
            print(rows[-1], flush=True)
    write_table(OUT, "# A U-Net's stages: autoremat's per-stage candidates against the hand-written ones",
                  "python benchmarks/unet_stages.py", t0, rows,
                  "Peak = argument + output + temp - alias of the compiled `value_and_grad` step (bytes); "
                  "+matmul GFLOP = its matmul and convolution FLOPs over the step as written, no remat.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
