"""CP-SAT against the greedy on one large region: the per-layer saved sets of a layer of 762
values (`_layer_options.ilp_options` solves each distinct layer at 9 caps).

An encoder-decoder's 6 decoder layers (`_unseen.encdec`) were once found as one layer
(docs/FINDINGS.md); the region solver took the greedy for it, as for every region of more than
400 values then, at each of the nine caps.  This times, on the decoder stack as one
region, CP-SAT at each of `DEFAULT_CAPS` (with the planner's 2 s time limit) and the greedy at
one cap (in a child process, stopped after `--greedy-limit` seconds), and lists the most values
a layer of each benchmark model has (`graph.find_layers`).

    .venv/bin/python benchmarks/region_solvers.py    # -> benchmarks/results/region_solvers.md (~1 min)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import realscale  # noqa: E402  (sets XLA:CPU's flags before JAX starts)
from _common import provenance  # noqa: E402
from _unseen import BUILDERS as UNSEEN  # noqa: E402

from autoremat._layer_options import _layer_problem  # noqa: E402
from autoremat.graph._graph import graph_from_traced  # noqa: E402
from autoremat.graph._layers import find_layers  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402
from autoremat.solver import _region  # noqa: E402
from autoremat.solver._region_options import DEFAULT_CAPS  # noqa: E402


def _graph(fn, args):
    traced = trace(fn, args, {}, argnums=(0,), static_argnums=(), has_aux=False, skip_integer_leaves=False)
    return graph_from_traced(traced)


def decoder_stack():
    """(graph, region problem, residual bytes) of the encoder-decoder's decoder layers as one region."""
    fn, args, _, _ = UNSEEN["encdec"]()
    g = _graph(fn, args)
    layers = find_layers(g)
    ops = list(g.ops.values())[layers[6].start:layers[-1].stop]
    produced, residuals, problem = _layer_problem(g, ops)
    return g, problem, sum(g.values[v].nbytes for v in residuals if v in produced), len(produced)


def _values(ops) -> int:
    """Values the equations make, a scan's body's instead of the scan's own."""
    return sum(sum(len(o.outputs) for b in op.bodies for o in b.ops.values()) if op.bodies else len(op.outputs)
               for op in ops)


def _greedy(cap_fraction: float, out) -> None:
    _, problem, res, _ = decoder_stack()
    t = time.perf_counter()
    _region.solve_region_greedy(problem, int(cap_fraction * res))
    out.put(time.perf_counter() - t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--greedy-limit", type=float, default=120.0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "region_solvers.md"))
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    _, problem, res, n_values = decoder_stack()
    rows = ["| solver | cap | seconds | status | values saved |", "|---|---:|---:|---|---:|"]
    for c in DEFAULT_CAPS:
        t = time.perf_counter()
        sol = _region.solve_region_cpsat(problem, int(c * res), time_limit=2.0)
        rows.append(f"| CP-SAT | {c:.0%} | {time.perf_counter() - t:.2f} | {sol.status} | {len(sol.saved)} |")
        print(rows[-1], flush=True)
    q = mp.get_context("spawn").Queue()
    child = mp.get_context("spawn").Process(target=_greedy, args=(0.1, q))
    child.start()
    child.join(a.greedy_limit + 60)  # the child traces the model again first
    if child.is_alive():
        child.terminate()
        rows.append(f"| greedy | 10% | > {a.greedy_limit:.0f} (stopped) | | |")
    else:
        rows.append(f"| greedy | 10% | {q.get():.2f} | feasible | |")
    print(rows[-1], flush=True)
    sizes = ["| model | layers | most values in a layer |", "|---|---:|---:|"]
    models = [(n, lambda n=n: realscale.make_model(n)) for n in ("llama", "gpt", *realscale.BUILDERS)]
    models += [(n, b) for n, b in UNSEEN.items()]
    for name, build in models:
        fn, args, _, _ = build()
        g = _graph(fn, args)
        ops = list(g.ops.values())
        layers = find_layers(g)
        most = max((_values(ops[la.start:la.stop]) for la in layers), default=0)
        sizes.append(f"| {name} | {len(layers)} | {most} |")
        print(sizes[-1], flush=True)
    head = ["# CP-SAT and the greedy on a large region", "",
            provenance("python benchmarks/region_solvers.py", (time.perf_counter() - t0) / 60), "",
            f"The encoder-decoder's 6 decoder layers as one region: {n_values} values; caps are fractions of its "
            f"residual bytes ({res / 2**30:.2f} GiB). CP-SAT with the planner's 2 s time limit; the greedy in a "
            "child process (which traces the model again first; not counted).", ""]
    with open(a.out, "w") as f:
        f.write("\n".join(head + rows + ["", "The most values (equation outputs; a scan's: its "
                                         "body's) in one layer of each benchmark model, as `graph.find_layers` cuts "
                                         "them:", ""] + sizes) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
