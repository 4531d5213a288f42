"""autoremat's per-block plans against the hand-written ones on ResNet-50 (flax linen), compiled.

`find_layers` cuts each bottleneck block where the fewest bytes cross; a person wraps the flax
module (`nn.remat(Bottleneck, policy=...)`).  This compiles JAX's policies on every block both
ways and prints the compiled peaks (argument + output + temp - alias).

    .venv/bin/python benchmarks/resnet_cuts.py   # ~2 min; -> benchmarks/results/resnet_cuts.md
"""

import os
import sys
import time

import autoremat

autoremat.configure_cpu_flags()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import provenance  # noqa: E402
from _thirdparty import resnet_flax  # noqa: E402

from autoremat._hand import HAND_POLICIES, layer_plan  # noqa: E402
from autoremat.graph._graph import graph_from_traced  # noqa: E402
from autoremat.graph._layers import find_layers  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402
from autoremat.runtime import apply  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402

GiB = 2**30


def main() -> int:
    t0 = time.perf_counter()
    fn, args, desc, n = resnet_flax()
    g = graph_from_traced(trace(fn, args, {}, skip_integer_leaves=False))
    layers = find_layers(g)
    rows = ["| policy on every block | hand-written (nn.remat) GiB | autoremat's blocks GiB |", "|---|---|---|"]
    for pol in HAND_POLICIES:
        hand_fn, hand_args, _, _ = resnet_flax([pol] * n)
        hand = compiled_stats(hand_fn, *hand_args).peak_bytes
        ours = compiled_stats(apply(fn, layer_plan(g, layers, [pol] * len(layers))), *args).peak_bytes
        rows.append(f"| {pol} | {hand / GiB:.3f} | {ours / GiB:.3f} |")
        print(rows[-1], flush=True)
    spans = ", ".join(f"{la.start}-{la.stop}" for la in layers)
    out = ["# ResNet-50: autoremat's per-block cuts against the module's", "",
           provenance("python benchmarks/resnet_cuts.py", (time.perf_counter() - t0) / 60), "",
           f"{desc}. `find_layers`: {len(layers)} blocks (top-level equations {spans}).", "", *rows, ""]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "resnet_cuts.md")
    with open(path, "w") as f:
        f.write("\n".join(out))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
