"""The layers `graph.find_layers` finds in every benchmark model (tracing only, about a minute).

A change to layer finding changes which per-layer hand policies the planner compiles and which
per-layer options it measures; this table says whether a change touched any benchmark model
(the first and last layers' top-level equations `[start, stop)` show where the cuts fall, a digest
of every layer's span whether any other moved), and how many of the layers hold the user's own
`jax.checkpoint` (`_hand.authored_layers`: where some do and some do not, each hand-written policy
is also compiled on the others alone).

    .venv/bin/python benchmarks/layers_found.py   # -> benchmarks/results/layers_found.md
"""

import hashlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import autoremat  # noqa: E402

autoremat.configure_cpu_flags()

from _common import write_table  # noqa: E402
import realscale  # noqa: E402
from autoremat._hand import authored_layers  # noqa: E402
from autoremat.examples import get_example  # noqa: E402
from autoremat.graph._graph import graph_from_traced  # noqa: E402
from autoremat.graph._layers import find_layers  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402


def _models():
    for name in ("mlp_chain", "transformer", "transformer_scan", "convnet"):
        ex = get_example(name)
        yield f"examples.{name}", ex.fn, ex.args
    for name in ("llama", "gpt", "llama_scan", "gpt_scan", *realscale.BUILDERS, *realscale.UNSEEN):
        loss, args, _, _ = realscale.make_model(name)
        yield f"realscale {name}", loss, args


def _digest(layers) -> str:
    """Eight hex digits of every layer's `[start, stop)`: a change to any cut, not only the
    first and last, shows."""
    return hashlib.sha256(repr([(int(la.start), int(la.stop)) for la in layers]).encode()).hexdigest()[:8]


def main() -> int:
    t0 = time.perf_counter()
    rows = ["| model | top-level equations | layers found | equations per layer | distinct keys | "
            "first and last layer | every layer's span (digest) | with your checkpoints |", "|---|---:|---:|---|---:|---|---|---:|"]
    for label, fn, args in _models():
        g = graph_from_traced(trace(fn, args, skip_integer_leaves=False))
        layers = find_layers(g)
        widths = sorted({layer.stop - layer.start for layer in layers})
        ends = ", ".join(f"{la.start}-{la.stop}" for la in (layers[:1] + layers[1:][-1:]))
        rows.append(f"| {label} | {len(g.ops)} | {len(layers)} | {', '.join(map(str, widths)) or '-'} | "
                    f"{len({layer.key for layer in layers})} | {ends or '-'} | {_digest(layers)} | "
                    f"{sum(authored_layers(g.traced, layers))} |")
        print(rows[-1], flush=True)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "layers_found.md")
    write_table(out, "# Layers found per benchmark model", "python benchmarks/layers_found.py", t0, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
