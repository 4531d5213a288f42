"""autoremat at one hand-written plan's compiled peak, for one realscale.py model, with the
planner's log: the quickest way to replay one budget (on a GPU, where the whole suite does not
fit the device time).  Compiles the hand-written plan (per-layer policies, last layers the
faster), plans at its peak and compiles autoremat's plan; prints both and whether autoremat
fits and recomputes no more matmul FLOPs.  Writes nothing.

    python benchmarks/one_budget.py --model resnet_flax --batch-scale 24 \\
        --policies 8:dots_with_no_batch_dims_saveable 8:dots_saveable --no-xla-remat

`--budget GIB` plans at that budget instead (the hand-written plan then the comparison where it
fits it), and `--model` takes `unseen.py`'s models too; `docs/FINDINGS.md` (twenty-third
session) replays the nnx scan between two policies' peaks:

    .venv/bin/python benchmarks/one_budget.py --model nnx_scan --policies 12:nothing_saveable --budget 12.74

`--no-xla-remat` turns XLA's own remat pass off (`jax_compiler_enable_remat_pass`): on the H100
it spent 174 s on ResNet-50's step without remat (x24), which the planner compiles first; at a
budget under the pass's limit (54-56 GiB there, gpu-h100-realscale-fill.md) it changes no plan's
peak.  `benchmarks/results/gpu-h100-resnet-mix.log` is the command above on the H100 at 905a5b2,
run by this script's first form (the same calls; its lines worded a little differently).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import autoremat

autoremat.configure_cpu_flags()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realscale  # noqa: E402

import jax  # noqa: E402

from autoremat._optimize import plan_for  # noqa: E402
from autoremat.runtime import apply  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402

GiB = 2**30


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama")
    ap.add_argument("--batch-scale", type=int, default=1)
    ap.add_argument("--policies", nargs="+", required=True, help="COUNT:POLICY, first layers first")
    ap.add_argument("--no-xla-remat", action="store_true", help="XLA's own remat pass off")
    ap.add_argument("--budget", type=float, default=None, help="GiB to plan at (default: the hand plan's peak)")
    a = ap.parse_args(argv)
    if a.no_xla_remat:
        jax.config.update("jax_compiler_enable_remat_pass", False)
    realscale.scale_batches(a.batch_scale)
    pols = [p.split(":", 1)[1] for p in a.policies for _ in range(int(p.split(":", 1)[0]))]
    fn, args, desc, _ = realscale.make_model(a.model)
    hand_fn, hand_args, _, _ = realscale.make_model(a.model, pols)
    t = time.time()
    hand = compiled_stats(hand_fn, *hand_args)
    print(f"{desc}\nhand-written {' + '.join(a.policies)}: {hand.peak_bytes / GiB:.2f} GiB, matmul "
          f"{hand.matmul_flops / 1e12:.3f} TFLOP ({time.time() - t:.0f}s)", flush=True)
    budget = hand.peak_bytes if a.budget is None else int(a.budget * GiB)
    t = time.time()
    planned = plan_for(fn, budget, args, progress=lambda m: print("  planner:", m, flush=True))
    got = compiled_stats(apply(fn, planned.plan), *args)
    ok = got.peak_bytes <= budget and (hand.peak_bytes > budget or got.matmul_flops <= hand.matmul_flops)
    print(f"autoremat: {got.peak_bytes / GiB:.2f} GiB, matmul {got.matmul_flops / 1e12:.3f} TFLOP, "
          f"{time.time() - t:.0f}s ({planned.plan.meta.get('compiles')} compiles), {planned.plan.meta.get('found_by')}: "
          f"{'no more' if ok else 'MORE'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
