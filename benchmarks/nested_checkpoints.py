"""A checkpoint around a recurrent layer and one on its cell: what does each keep?

The unrolled stacked LSTM of `_unseen.py` (`lstm`: 4 layers, each a `lax.scan` over 1024 steps)
compiled with a JAX policy written around each layer, on each layer's cell (the scan's body), or
both, as a person writes them: `jax.checkpoint(layer, policy=...)` with `jax.checkpoint(cell,
policy=...)` inside.  With both, JAX keeps what the cell's policy saves through the layer's
checkpoint (from the forward pass), so the cell's policy sets what each layer stores
(`solver/_chain_model.py` `_Regions.around_scan`, `_hand.Nested`).  Peak = argument + output +
temp - alias of the compiled `value_and_grad` step; +TFLOP = its jaxpr's matmul FLOPs over no
remat's.  Writes results/nested_checkpoints.md (~20 s):

    .venv/bin/python benchmarks/nested_checkpoints.py
"""

from __future__ import annotations

import os
import sys

import autoremat

autoremat.configure_cpu_flags()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _unseen  # noqa: E402
from _common import table_main  # noqa: E402
from _thirdparty import _xent  # noqa: E402

from autoremat.runtime._validate import compiled_stats  # noqa: E402

GiB = 2**30
# (policy around each layer, policy on each layer's cell)
PAIRS = ((None, None), ("nothing_saveable", None), (None, "nothing_saveable"), (None, "dots_saveable"),
         ("nothing_saveable", "nothing_saveable"), ("nothing_saveable", "dots_saveable"),
         ("dots_saveable", "dots_saveable"))


def _loss(layer_policy, cell_policy):
    def loss(params, tokens):
        h = params["embed"][tokens]
        for p in params["layers"]:
            layer = _unseen._wrap(lambda h, p: _unseen._lstm_layer(h, p, cell_policy, True), layer_policy)
            h = layer(h, p)
        return _xent(_unseen._ln(h) @ params["head"], tokens)
    return loss


def model_rows(name: str, say) -> list[str]:
    args = _unseen._lstm_params()
    base = compiled_stats(_loss(None, None), *args).matmul_flops
    rows = []
    for layer_policy, cell_policy in PAIRS:
        st = compiled_stats(_loss(layer_policy, cell_policy), *args)
        say(f"{name}: layers {layer_policy}, cells {cell_policy}: {st.peak_bytes / GiB:.2f} GiB")
        rows.append(f"| {name} | {layer_policy or '-'} | {cell_policy or '-'} | {st.peak_bytes / GiB:.2f} | "
                    f"{(st.matmul_flops - base) / 1e12:.3f} |")
    return rows


def _about() -> str:
    d = _unseen.LSTM
    return (f"Stacked LSTM language model, {d['L']} layers unrolled, each a scan over {d['S']} steps (the input "
            f"projection for all steps before it, the cell state in float32): hidden {d['D']}, batch {d['B']}, bf16.")


def main(argv=None) -> int:
    return table_main(argv, __doc__, ("lstm",), "nested_checkpoints.py",
                      ["| model | around each layer | on each cell | compiled GiB | +TFLOP matmul |",
                       "|---|---|---|---:|---:|"], model_rows,
                      "A checkpoint around a recurrent layer and one on its cell", _about())


if __name__ == "__main__":
    sys.exit(main())
