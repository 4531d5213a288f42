"""Where the compiled step's peak sits, against where the chain model puts it (compile-only).

The chain model counts a gradient output only from the backward of the region that first uses
its parameter (`solver/_chain_model.py`, measured on the small MLP: XLA lets activations use a
gradient's memory until it is written), so on an unrolled stack it puts the peak in the first
layers' backward, where few layers' saved values are still held.  This checks that against
XLA.  Per model, JAX's policies written by hand around every layer, and `nothing_saveable` per
layer with one layer (the first, the middle, the last) switched to the next leaner policy that
compiles apart from it (`dots_with_no_batch_dims_saveable`, which keeps the layer's matmul
outputs; ResNet-50's `dots_saveable`): the compiled peak and
how much it moved, against the chain model's figure (the planner's: calibrated on the compiled
un-optimized step) and the same model with every gradient output counted from the step's start.
The small built-in examples (`autoremat.examples`) take one policy for every block: their rows
with one layer switched compile the plan's twin in the model's terms (`ChainModel.per_span`,
applied with `autoremat.apply`; on the 1B models the twins compile to the hand-written plans to
the byte, `results/twin_peaks.md`).

    .venv/bin/python benchmarks/peak_location.py            # -> benchmarks/results/peak_location.md, ~6 min
    .venv/bin/python benchmarks/peak_location.py --models llama --out /tmp/pl.md
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import autoremat  # noqa: E402

autoremat.configure_cpu_flags()

import jax  # noqa: E402

from _common import table_main  # noqa: E402
import realscale  # noqa: E402
from autoremat._bridge import to_plan  # noqa: E402
from autoremat._optimize import _calibrated  # noqa: E402
from autoremat._search import POLICY_KIND_OF  # noqa: E402
from autoremat.examples import get_example  # noqa: E402
from autoremat.graph import build_graph  # noqa: E402
from autoremat.graph._layers import find_layers  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402
from autoremat.solver._chain import evaluate  # noqa: E402
from autoremat.solver._chain_model import _gradient_bytes_from, build_chain_model  # noqa: E402

MODELS = ("mlp_chain", "transformer", "transformer_scan", "convnet", "llama", "gpt", "equinox", "resnet_flax", "dropout")
SMALL = ("mlp_chain", "transformer", "transformer_scan", "convnet")  # autoremat.examples
LEAN = "nothing_saveable"
MiB = 2**20


def _peaks(m, segs) -> tuple[int, int]:
    """The model's peak for `segs`, as planned and with every gradient counted from the start."""
    grads = _gradient_bytes_from(m.graph, m.blocks)
    prefix, top = 0, 0
    for s in segs:
        top = max(top, prefix + s.option.backward_bytes - grads[s.start])
        prefix += s.option.stored_bytes
    return evaluate(m.raw_problem, segs)[0], m.problem.base_bytes + grads[0] + max(prefix, top)


class _Model:
    """One model: its function, layers and chain model (calibrated as `optimize` does)."""

    def __init__(self, name: str):
        self.name, self.small = name, name in SMALL
        fn, args = self.hand(None)
        self.g = build_graph(fn, *args)
        self.spans = [(la.start, la.stop) for la in find_layers(self.g)]
        none_peak = compiled_stats(fn, *args).peak_bytes
        raw = build_chain_model(self.g, offload=False, block_cache={})
        self.m = _calibrated(fn, self.g, raw, (args, {}, {}), none_peak, False, {}, lambda _: None)

    def hand(self, pols):
        """(fn, args) with `pols` (one policy name per layer; small examples: the first, on every block)."""
        if self.small:
            kw = {} if pols is None else {"policy": getattr(jax.checkpoint_policies, pols[0])}
            e = get_example(self.name, **kw)
            return e.fn, e.args
        fn, args, _, _ = realscale.make_model(self.name, pols)
        return fn, args

    def row(self, label: str, pols, base=None) -> tuple[str, tuple]:
        """A table row for the hand-written `pols` and its figures (compiled, model, model from start)."""
        segs = self.m.per_span([POLICY_KIND_OF[p] for p in pols], self.spans)
        if self.small and len(set(pols)) > 1:  # the examples take one policy: the twin (the same plan)
            fn, args = self.hand(None)
            fn = autoremat.apply(fn, to_plan(self.m, segs))
        else:
            fn, args = self.hand(pols)
        got = (compiled_stats(fn, *args).peak_bytes, *_peaks(self.m, segs))
        if base is None:
            cells = [f"{x / MiB:,.1f}" for x in got] + [f"{(x - got[0]) / got[0]:+.1%}" for x in got[1:]]
        else:
            cells = [f"{(x - b) / MiB:+,.1f}" for x, b in zip(got, base)] + ["", ""]
        return f"| {self.name} | {len(self.spans)} | {label} | " + " | ".join(cells) + " |", got


def model_rows(name: str, say) -> list[str]:
    mo, rows, got = _Model(name), [], {}
    n = len(mo.spans)
    for pol in POLICY_KIND_OF:
        r, got[pol] = mo.row(f"{pol} per layer", [pol] * n)
        rows.append(r)
        say(r)
    # the leanest policy after LEAN that compiles apart from it (ResNet-50's convolutions are not
    # dots: dots_with_no_batch_dims_saveable is nothing_saveable there)
    swap = next((p for p in POLICY_KIND_OF if p != LEAN and got[p][0] != got[LEAN][0]), None)
    for k in sorted({0, n // 2, n - 1}) if n > 2 and swap else []:
        pols = [LEAN] * n
        pols[k] = swap
        r, _ = mo.row(f"{LEAN} per layer, layer {k} {swap}: change", pols, base=got[LEAN])
        rows.append(r)
        say(r)
    return rows


def main(argv=None) -> int:
    return table_main(
        argv, __doc__, MODELS, "peak_location.py",
        ["| model | layers | plan | compiled MiB | model MiB | model, gradients from the start, MiB | "
         "model error | from the start, error |", "|---|---:|---|---:|---:|---:|---:|---:|"], model_rows,
        "Where the compiled peak sits, against the chain model",
        "Compiled peak = argument + output + temp - alias of `value_and_grad`, one device. 'model': "
        "the chain model as `optimize` plans with it (calibrated on the compiled un-optimized step; a "
        "gradient counted from the backward of its parameter's first use); 'from the start': the same "
        "with every gradient output counted throughout. Rows 'change': one layer switched, the "
        "figures' change against the same policy on every layer.")


if __name__ == "__main__":
    sys.exit(main())
