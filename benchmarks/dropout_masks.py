"""What the dropout decoder's step holds that remat does not move (compile-only).

`unseen.py`'s dropout decoder (GPT-2 style, 12 layers, dropout on the attention probabilities
and on both residual branches, keys split per layer from one typed key) compiles to about 22.4
GiB under every JAX policy per layer, where the same decoder without dropout (equinox's sizes)
compiles to 6.9 (`results/unseen.md`, `results/peak_location.md`: only the first layer's
saved values move it).  This compiles it with `nothing_saveable` and `dots_saveable` per layer:
with its dropouts switched off in turn, and with each dropout's key tied to the value it masks by
`jax.lax.optimization_barrier` (identity on values: the same masks, the same gradients), so
XLA cannot generate a layer's mask before that layer runs; and, last, the same policies as
autoremat realizes them (`autoremat.apply` of their twins per layer), which ties the keys itself
(`runtime/_rng.py`).

    .venv/bin/python benchmarks/dropout_masks.py     # -> benchmarks/results/dropout_masks.md, ~2 min
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import autoremat  # noqa: E402

autoremat.configure_cpu_flags()

import jax  # noqa: E402

from _common import models_run, write_results  # noqa: E402
import _unseen  # noqa: E402
from autoremat._bridge import to_plan  # noqa: E402
from autoremat._search import POLICY_KIND_OF  # noqa: E402
from autoremat.graph import build_graph  # noqa: E402
from autoremat.graph._layers import find_layers  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402
from autoremat.solver._chain_model import build_chain_model  # noqa: E402

_MASK = _unseen._dropout
# Which of a layer's three dropouts (in the order `_dropout_layer` calls them: the attention
# probabilities, the attention branch, the MLP branch) each variant keeps.
VARIANTS = {"no dropout": (), "attention probabilities only": (0,), "residual branches only": (1, 2),
            "all three (as benchmarked)": (0, 1, 2)}
POLICIES = ("nothing_saveable", "dots_saveable")
GiB = 2**30


def _masked(keep, tied: bool):
    """A `_dropout` that masks only the calls in `keep` (by their place in the layer), its key
    tied to the value first where `tied`."""
    calls = [0]

    def dropout(x, key):
        k, calls[0] = calls[0] % 3, calls[0] + 1
        if k not in keep:
            return x
        if tied:
            x, key = jax.lax.optimization_barrier((x, key))
        return _MASK(x, key)
    return dropout


def _peak(policy: str, keep, tied: bool) -> float:
    jax.clear_caches()  # jax.checkpoint keeps the layer's trace by function: trace it again
    _unseen._dropout = _masked(keep, tied)
    try:
        fn, args, _, n = _unseen.dropout([policy] * _unseen.DR["L"])
        return compiled_stats(fn, *args).peak_bytes / GiB
    finally:
        _unseen._dropout = _MASK


def _applied() -> list[float]:
    """`POLICIES`, each once per layer in the chain model's terms (its twin: `ChainModel.per_span`),
    through `autoremat.apply`, which ties a region's keys to its activations (`runtime/_rng.py`)."""
    jax.clear_caches()
    fn, args, _, _ = _unseen.dropout()
    g = build_graph(fn, *args)
    m = build_chain_model(g, offload=False)
    spans = [(la.start, la.stop) for la in find_layers(g)]
    return [compiled_stats(autoremat.apply(fn, to_plan(m, m.per_span(POLICY_KIND_OF[p], spans))), *args).peak_bytes
            / GiB for p in POLICIES]


def main(argv=None) -> int:
    a, say, t0 = models_run(__doc__.split("\n")[0], ("dropout",), "dropout_masks.md", argv)
    body = ["| dropouts | keys tied to the masked value | " + " | ".join(f"{p} per layer, GiB" for p in POLICIES)
            + " |", "|---|---|" + "---:|" * len(POLICIES)]
    rows = [(v, False) for v in VARIANTS] + [("all three (as benchmarked)", True)]
    for label, tied in rows:
        peaks = [_peak(p, VARIANTS[label], tied) for p in POLICIES]
        body.append(f"| {label} | {'yes' if tied else 'no'} | " + " | ".join(f"{x:.2f}" for x in peaks) + " |")
        say(body[-1])
    peaks = _applied()
    body.append("| all three, through `autoremat.apply` | by `apply` | " + " | ".join(f"{x:.2f}" for x in peaks) + " |")
    say(body[-1])
    write_results(a, say, t0, "dropout_masks.py", ("dropout",), "The dropout decoder's masks, compiled",
                  "Compiled peak = argument + output + temp - alias of `value_and_grad`, one device; "
                  f"{_unseen._dropout_desc('layers unrolled')}.", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
