"""Predicted vs compiled peak of uniform plans, per built-in model (docs/FINDINGS.md).

For each model, applies one option kind to every block (and every pair of blocks) of
autoremat's chain (`none` = no remat, `ckpt:recompute` = nothing saved per block; scan bodies
get the matching `scan:` kind) and compares the chain model's predicted peak with XLA's
compiled peak. No calibration is applied (that is what `optimize` adds). Run:
`.venv/bin/python benchmarks/model_accuracy.py [model ...]`.

The compiled peak is what XLA allocates (arguments + outputs + temporaries - aliases).  The
"XLA live" column is the most XLA holds at one point of its schedule, read from its
live-range dump (`--xla_dump_to`): the gap between the two is in how XLA packs buffers
into allocations (docs/FINDINGS.md), which a liveness model does not see.  The dump's format is XLA's, not a
stable API; the column is blank where it cannot be read.
"""

import os
import re
import shutil
import sys
import tempfile

_DUMP = tempfile.mkdtemp(prefix="autoremat-xla-dump-")
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={_DUMP}".strip()

from autoremat._xla import configure_cpu_flags  # noqa: E402

configure_cpu_flags()

import jax  # noqa: E402

from autoremat.examples import get_example  # noqa: E402
from autoremat.graph import build_graph  # noqa: E402
from autoremat.runtime import apply, compiled_stats  # noqa: E402
from autoremat.solver import build_chain_model, evaluate  # noqa: E402
from autoremat._bridge import to_plan  # noqa: E402

MODELS = ("mlp_chain", "transformer", "transformer_scan", "convnet")
KINDS = ("none", "ckpt:recompute", "ckpt:save:dots", "ckpt:ilp100%")
SIZES = (1, 2)  # one option kind on every block, on every pair of blocks
_PEAK = re.compile(r"Stack trace breakdown for peak usage: ([\d ]+) bytes")


def _live_peak(before: set) -> int | None:
    """XLA's largest live set among the live-range dumps written since `before`."""
    peaks = []
    for name in set(os.listdir(_DUMP)) - before:
        if name.endswith("live-range.txt"):
            with open(os.path.join(_DUMP, name)) as f:
                m = _PEAK.search(f.read())
            if m:
                peaks.append(int(m.group(1).replace(" ", "")))
    return max(peaks, default=None)


def main(models=MODELS):
    print(f"jax {jax.__version__}, backend {jax.default_backend()}")
    print("| model | plan | predicted MiB | compiled MiB | error | XLA live MiB | error vs live |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in models:
        ex = get_example(name)
        model = build_chain_model(build_graph(ex.fn, *ex.args), offload=False)
        for kind in KINDS:
            for size in SIZES if kind != "none" else (1,):
                segs = model.uniform(kind, size)
                if segs is None:
                    continue
                predicted = evaluate(model.raw_problem, segs)[0]
                before = set(os.listdir(_DUMP))
                compiled = compiled_stats(apply(ex.fn, to_plan(model, segs)), *ex.args).peak_bytes
                live = _live_peak(before)
                live_cols = ("| |" if live is None else
                             f"| {live / 2**20:.1f} | {(predicted - live) / live:+.0%} |")
                print(f"| {name} | {kind} x{size} | {predicted / 2**20:.1f} | {compiled / 2**20:.1f} | "
                      f"{(predicted - compiled) / compiled:+.0%} {live_cols}", flush=True)
    shutil.rmtree(_DUMP, ignore_errors=True)


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or MODELS)
