"""Does autoremat's own copy of a hand-written policy compile to the hand-written one's peak?

The plan search keeps its promise by compiling, among its candidates, each JAX policy once per
layer (`_hand.layer_plan`: one region per `graph.find_layers` layer).  At a hand-written plan's
compiled peak that copy must fit, so it must compile to the same peak.  This compiles, for one
realscale.py model in one process, each per-layer policy and half-and-half mix
(`realscale.hand_variants`) written by hand and autoremat's copy,
each twice, and prints their memory figures (GiB), to tell a structural difference (copy always
higher) from compile-to-compile variation (the same program compiled twice differs: on XLA:GPU,
autotuning picks kernels by timing them):

    .venv/bin/python benchmarks/hand_twins.py --model llama
    .venv/bin/python benchmarks/hand_twins.py --model resnet_flax --lowered   # and where the two programs differ
    .venv/bin/python benchmarks/hand_twins.py --model resnet_flax --batch-scale 24 --only mix  # the mixes, batch x24

`--lowered` also compares the two StableHLO programs JAX hands XLA (`jit(...).lower`, names and
source locations left out) and prints the lines that differ: a difference there is structural,
one that appears only after compiling is XLA's.  Writes nothing.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys

import autoremat

autoremat.configure_cpu_flags()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realscale  # noqa: E402

import jax  # noqa: E402

from autoremat.graph._graph import graph_from_traced  # noqa: E402
from autoremat.graph._layers import find_layers  # noqa: E402
from autoremat.graph._profiles import detect_profile  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402
from autoremat._hand import layer_plan  # noqa: E402
from autoremat.runtime import apply  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402

GiB = 2**30


def line(label: str, st) -> str:
    return (f"{label:58s} peak {st.peak_bytes / GiB:7.3f}  temp {st.temp_bytes / GiB:7.3f}  "
            f"args {st.argument_bytes / GiB:6.3f}  xla peak {(st.xla_peak_bytes or 0) / GiB:7.3f}  TFLOP {st.matmul_flops / 1e12:8.3f}")


def lowered(fn, args) -> list[str]:
    """The StableHLO text of `value_and_grad(fn)`, without SSA names, function names and locations."""
    text = jax.jit(jax.value_and_grad(fn)).lower(*args).as_text()
    text = re.sub(r"loc\([^)]*\)", "", text)
    text = re.sub(r"@[A-Za-z0-9_.]+", "@f", re.sub(r"%[A-Za-z0-9_#]+", "%v", text))
    return [ln.rstrip() for ln in text.splitlines() if not ln.startswith("#loc")]


def differences(a: list[str], b: list[str]) -> str:
    """How many lines differ, and the first few of them."""
    diff = [d for d in difflib.unified_diff(a, b, lineterm="", n=0) if d[:1] in "+-" and d[:3] not in ("+++", "---")]
    head = "\n".join("    " + d[:160] for d in diff[:6])
    return f"{len(diff)} lines differ" + (":\n" + head if diff else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--lowered", action="store_true", help="also compare the lowered programs")
    ap.add_argument("--batch-scale", type=int, default=1, help="the model's batch times this (default 1)")
    ap.add_argument("--only", default="", help="only the hand-written plans whose label contains this")
    a = ap.parse_args(argv)
    realscale.scale_batches(a.batch_scale)
    fn, args, desc, _ = realscale.make_model(a.model)
    g = graph_from_traced(trace(fn, args, {}, skip_integer_leaves=False), profile=detect_profile())
    layers = find_layers(g)
    print(f"{a.model}: {desc}; {len(layers)} layers found", flush=True)
    for label, pols, cse in realscale.hand_variants(a.model):
        if pols is None or not cse or a.only not in label or len(pols) != len(layers):
            continue
        hand_fn, hand_args, _, _ = realscale.make_model(a.model, pols)
        copy = apply(fn, layer_plan(g, layers, pols))
        if a.lowered:
            print(f"{label}, lowered, by hand against autoremat's copy: "
                  f"{differences(lowered(hand_fn, hand_args), lowered(copy, args))}", flush=True)
        for k in range(a.repeats):
            print(line(f"{label} by hand, compile {k + 1}", compiled_stats(hand_fn, *hand_args)), flush=True)
            print(line(f"{label} autoremat's copy, compile {k + 1}", compiled_stats(copy, *args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
