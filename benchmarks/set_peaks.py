"""Where does the region solver's saved set per layer compile, predicted before compiling it?

`HandSearch.solver_sets` (autoremat/_hand.py) offers a per-layer saved set of the region solver
(`_layer_options.ilp_options`) as an option only where its uniform plan (the set on every layer)
is predicted to fit; the prediction decides which sets the mixes may use.  This compiles, on the
unrolled realscale.py models, JAX's policies per layer and every such set per layer, and sets
two predictions made from the policies' compiled peaks and the bytes each plan stores (the
policies': what JAX stores, `_layer_options.policy_keeps`; a set's: the values it names) against
the compiled peak:

* line: the least-squares line of compiled peak against stored bytes through the policies;
* step: the chain formula of a mix's first count (`HandSearch._first_count`): the step peaks
  while the first layer of the policy that stores the least above the set runs backward, over
  what the layers before it store, so that policy's compiled peak less what it stores beyond
  the set, and at least the compiled peak of the policy that stores the most below it.

Error = (predicted - compiled) / compiled.  Writes results/set_peaks.md (~8 min on 2 cores);
with `--layout`, sharded.py's 1B decoder on its 8-device host mesh (peaks and bytes per device):

    .venv/bin/python benchmarks/set_peaks.py
    .venv/bin/python benchmarks/set_peaks.py --models gpt --out /tmp/s.md
    .venv/bin/python benchmarks/set_peaks.py --layout fsdp_tp --models llama1b --out results/set_peaks_fsdp_tp.md
"""

from __future__ import annotations

import os
import sys

import numpy as np

import autoremat

autoremat.configure_cpu_flags()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realscale  # noqa: E402
from _common import models_run, write_results  # noqa: E402

from autoremat._hand import HAND_POLICIES, layer_plan  # noqa: E402
from autoremat._layer_options import ilp_options  # noqa: E402
from autoremat._optimize import _graph  # noqa: E402
from autoremat.graph._profiles import detect_profile  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402
from autoremat.runtime import apply  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402

GiB, MiB = 2**30, 2**20
MODELS = ("llama", "gpt", "equinox", "resnet_flax")


def line(points: list, nbytes: int) -> float:
    """The least-squares line through (stored bytes, compiled peak) at `nbytes`."""
    b, a = np.polyfit([p[0] for p in points], [p[1] for p in points], 1)
    return float(a + b * nbytes)


def step(points: list, nbytes: int) -> float | None:
    """The chain formula's peak (see the module docstring); None above every policy."""
    above = [p for p in points if p[0] >= nbytes]
    if not above:
        return None
    stored, peak = min(above)
    floor = max((p[1] for p in points if p[0] < nbytes), default=0)
    return max(floor, peak - (stored - nbytes))


def model_rows(name: str, say, layout=None) -> tuple[str, list]:
    fn, args, desc, n = realscale.make_model(name)
    if layout:
        args, _ = sys.modules["sharded"].sharded(layout, *args)
        desc += f"; {sys.modules['sharded'].LAYOUTS[layout][1]}, per device"
    traced = trace(fn, args, {}, skip_integer_leaves=False)
    g, layers = _graph(traced, detect_profile(), say)
    points, rows = [], []
    for pol in HAND_POLICIES:
        plan = layer_plan(g, layers, [pol] * len(layers))
        stored = sum(r.nbytes * r.multiplicity for r in plan.values.values() if r.decision == "save")
        points.append((stored, compiled_stats(apply(fn, plan), *args).peak_bytes))
        say(f"{name} {pol}: stores {stored / MiB:.0f} MiB, compiled {points[-1][1] / GiB:.3f} GiB")
    for o in ilp_options(g, layers):
        got = compiled_stats(apply(fn, layer_plan(g, layers, list(o.saved))), *args).peak_bytes
        rows.append((o.label, o.saved_bytes, o.matmul_flops, got, line(points, o.saved_bytes),
                     step(points, o.saved_bytes)))
        say(f"{name} {o.label}: stores {o.saved_bytes / MiB:.0f} MiB, compiled {got / GiB:.3f} GiB")
    return desc, [(pol, *p) for pol, p in zip(HAND_POLICIES, points)], rows


def _cell(predicted, compiled: int) -> str:
    if predicted is None:
        return "(above every policy)"
    return f"{predicted / GiB:.3f} ({(predicted - compiled) / compiled:+.1%})"


def table(name: str, desc: str, policies: list, rows: list) -> list[str]:
    out = [f"### {name}", "", desc, "", "| plan per layer | stores GiB | model +TFLOP matmul | compiled GiB "
           "| line GiB (error) | step GiB (error) |", "|---|---|---|---|---|---|"]
    out += [f"| {pol} | {s / GiB:.3f} | | {p / GiB:.3f} | | |" for pol, s, p in policies]
    out += [f"| the solver's {label} set | {s / GiB:.3f} | {f / 1e12:.3f} | {c / GiB:.3f} | {_cell(li, c)} | "
            f"{_cell(st, c)} |" for label, s, f, c, li, st in rows]
    return out + [""]


def summary(all_rows: list) -> list[str]:
    out = ["### Summary", "", "| estimator | sets predicted | mean abs error | worst under | worst over |",
           "|---|---|---|---|---|"]
    for k, est in ((4, "line"), (5, "step")):
        errs = [(r[k] - r[3]) / r[3] for r in all_rows if r[k] is not None]
        if errs:
            out.append(f"| {est} | {len(errs)} of {len(all_rows)} | {np.mean(np.abs(errs)):.2%} | "
                       f"{min(errs):+.1%} | {max(errs):+.1%} |")
    return out + [""]


def main(argv=None) -> int:
    import argparse
    import importlib

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--layout", choices=("fsdp", "fsdp_tp"), default=None)
    known, rest = pre.parse_known_args(argv)
    if known.layout:  # sharded.py's 8-device host mesh, set before JAX starts, and its models
        importlib.import_module("sharded")
    a, say, t0 = models_run(__doc__.split("\n")[0], MODELS, "set_peaks.md", rest)
    sections, all_rows = [], []
    for name in a.models:
        desc, policies, rows = model_rows(name, say, known.layout)
        sections += table(name, desc, policies, rows)
        all_rows += rows
    script = "set_peaks.py" + (f" --layout {known.layout}" if known.layout else "")
    write_results(a, say, t0, script, MODELS, "A per-layer saved set's compiled peak, predicted before "
                  "compiling it", "Compiled peak = argument + output + temp - alias of the compiled `value_and_grad` "
                  "step (abstract arguments) with the plan on every layer (`autoremat._hand.layer_plan`). Stores: the "
                  "bytes the plan keeps for the backward pass beyond `nothing_saveable`, over the stack. line, step: "
                  "the module docstring's predictions from the policies' rows.", summary(all_rows) + sections)
    return 0


if __name__ == "__main__":
    sys.exit(main())
