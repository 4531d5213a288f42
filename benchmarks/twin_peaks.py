"""The chain model's per-layer plans against the same policies written by hand (compile-only).

The planner calibrates its model on JAX's policies written around every layer `graph.find_layers`
finds, through their twins: the same policy once per layer in the model's terms
(`ChainModel.per_span`, one region over the blocks that start inside each layer).  A twin is
the hand-written plan only where the chain's blocks are cut on the layers' edges; this compiles
both, on the unrolled real-scale models, and says where the blocks are cut.

    .venv/bin/python benchmarks/twin_peaks.py            # -> benchmarks/results/twin_peaks.md
    PYTHONPATH=/tmp/old .venv/bin/python benchmarks/twin_peaks.py --out /tmp/twins-old.md   # another checkout's

Columns: the layers' edges that are block edges; per policy, the compiled peak of the policy
written by hand around every layer (`realscale.make_model`), of its twin (`to_plan` of
`per_span`, applied with `autoremat.apply`) and the chain model's figure for the twin.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import autoremat  # noqa: E402

autoremat.configure_cpu_flags()

from _common import table_main  # noqa: E402
import realscale  # noqa: E402
from autoremat._bridge import to_plan  # noqa: E402
from autoremat._search import POLICY_KIND_OF  # noqa: E402
from autoremat.graph import build_graph  # noqa: E402
from autoremat.graph._layers import find_layers  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402
from autoremat.solver._chain import evaluate  # noqa: E402
from autoremat.solver._chain_model import build_chain_model  # noqa: E402

MODELS = ("llama", "gpt", "equinox", "resnet_flax")
GiB = 2**30


def model_rows(name: str, say) -> list[str]:
    fn, args, _, n_layers = realscale.make_model(name)
    g = build_graph(fn, *args)
    layers = find_layers(g)
    m = build_chain_model(g, offload=False)
    block_edges = {b.start for b in m.blocks} | {m.blocks[-1].stop}
    edges = sorted({e for la in layers for e in (la.start, la.stop)})
    on = sum(e in block_edges for e in edges)
    spans = [(la.start, la.stop) for la in layers]
    rows = []
    for pol, kind in POLICY_KIND_OF.items():
        hand_fn, hand_args, _, _ = realscale.make_model(name, [pol] * n_layers)
        hand = compiled_stats(hand_fn, *hand_args).peak_bytes
        segs = m.per_span(kind, spans)
        twin = compiled_stats(autoremat.apply(fn, to_plan(m, segs)), *args).peak_bytes
        model = evaluate(m.raw_problem, segs)[0]
        rows.append(f"| {name} | {len(m.blocks)} | {on} of {len(edges)} | {pol} | {hand / GiB:.2f} | "
                    f"{twin / GiB:.2f} | {(twin - hand) / GiB:+.2f} | {model / GiB:.2f} |")
        say(rows[-1])
    return rows


def main(argv=None) -> int:
    return table_main(
        argv, __doc__, MODELS, "twin_peaks.py",
        ["| model | blocks | layer edges on block edges | policy per layer | hand-written GiB | twin GiB | "
         "twin - hand GiB | model GiB (twin) |", "|---|---:|---|---|---:|---:|---:|---:|"], model_rows,
        "The model's per-layer plans against the hand-written ones",
        "Compiled peak = argument + output + temp - alias of `value_and_grad`, one device.")


if __name__ == "__main__":
    sys.exit(main())
