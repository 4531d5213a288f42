"""Models autoremat never saw while it was written: does the promise hold on them?  (issue 14)

The real-scale suite's tables (`realscale.py`: no remat, each JAX policy written by hand around
every layer, the half-and-half mixes of neighbouring policies, then `autoremat`'s planner at
each of those compiled peaks) for model families the other benchmarks lack (`_unseen.py`): a
mixture-of-experts decoder, a U-Net with skip connections, an encoder-decoder with cross
attention, a ViT in flax nnx, a decoder alternating local and global attention, penzai's
Gemma-like decoder on named axes, unrolled and in penzai's `LayerStack`, scans over layers
as flax nnx and equinox code writes them, a Mamba-2-style state-space decoder whose every
layer holds a scan, unrolled and as a scan over layers, a decoder whose attention is a
`custom_vjp`, one whose author already checkpoints the attention core, and decoders trained in
mixed precision (float32 weights cast to bfloat16 in each layer), with dropout and with
stochastic depth (a `lax.cond` per layer), fine-tuned with LoRA (frozen base weights), and with
one layer's weights shared by every layer (ALBERT's way), a stacked LSTM whose layers are scans over time,
unrolled and as a scan over layers, a MeshGraphNet-style graph network (gathers onto the edges,
scatter-adds onto the nodes), and a Griffin-style hybrid of recurrent blocks (an RG-LRU by
`lax.associative_scan`) and local attention, two of the one to one of the other, a
decoder whose loss is its author's checkpointed scan over chunks of the sequence (the
vocabulary's logits never whole; unrolled and as a scan over layers), and one whose layers
run in a `lax.fori_loop` over stacked weights; compile-only, a few GiB to tens of GiB each.  Each model's table says how many layers
`graph.find_layers` found against the number the model's author wrote.

    .venv/bin/python benchmarks/unseen.py                 # all 33 (~60 min on 2 cores)
    .venv/bin/python benchmarks/unseen.py --models encdec
"""

from __future__ import annotations

import os
import subprocess
import sys


def _root(argv: list) -> str | None:
    """`--root DIR` taken out of `argv`: the checkout whose autoremat plans (put first on the path
    before anything imports it)."""
    if "--root" not in argv:
        return None
    i = argv.index("--root")
    root = argv[i + 1]
    del argv[i:i + 2]
    return os.path.abspath(root)


ROOT = _root(sys.argv)
sys.path[:0] = ([ROOT] if ROOT else []) + [os.path.dirname(os.path.abspath(__file__))]

import realscale  # noqa: E402  (sets XLA:CPU's flags before JAX starts)
from _common import models_run, write_results  # noqa: E402
from _unseen import BUILDERS  # noqa: E402

from autoremat.graph._graph import graph_from_traced  # noqa: E402
from autoremat.graph._layers import find_layers  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402


def layers_found(name: str) -> str:
    fn, args, _, written = BUILDERS[name]()
    traced = trace(fn, args, {}, argnums=(0,), static_argnums=(), has_aux=False, skip_integer_leaves=False)
    found = find_layers(graph_from_traced(traced))
    return (f"Layers: {written} written, {len(found)} found by `graph.find_layers` "
            f"({len({la.key for la in found})} distinct).")


def main(argv=None) -> int:
    a, say, t0 = models_run(__doc__.split("\n")[0], BUILDERS, "unseen.md", argv)
    script = "unseen.py"
    if ROOT:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        script += f" --root {ROOT}"
        say(f"planning with the autoremat of {ROOT} ({commit})")
    body: list[str] = []
    about = ("Columns as in realscale.md: compiled peak = argument + output + temp - alias of the compiled "
             "`value_and_grad` step; +TFLOP = the step's jaxpr FLOPs over no remat; 'vs hand': whether autoremat "
             "at that hand-written plan's compiled peak fits and recomputes no more matmul FLOPs; 'compiles': the "
             "whole-step compiles the planner made for that budget; 'expected': the peak the search expected "
             "before compiling its plan." + (f" The planner: the checkout at {ROOT} ({commit})." if ROOT else ""))
    for name in a.models:
        lines: list[str] = []
        realscale.run_model(name, say, lines)
        lines.insert(3, layers_found(name) + "\n")
        body += lines
        write_results(a, say, t0, script, BUILDERS, "Models autoremat never saw (issue 14)", about, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
