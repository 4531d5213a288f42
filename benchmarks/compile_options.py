"""Does LLVM's optimization level change XLA:CPU's memory figures?  (the planner's compiles)

The planner compiles a step only to read `memory_analysis` and the jaxpr's FLOPs; the machine
code is thrown away.  This compiles each program twice, with XLA's default options and with
`runtime._validate.MEMORY_ONLY_CPU_OPTIONS`, and compares argument + output + temp - alias and
the compile time.  Programs: the built-in examples (no remat, and `jax.checkpoint` with
`nothing_saveable` around the whole loss), and the real-scale models of
`benchmarks/realscale.py` with no remat and each JAX policy by hand.

    .venv/bin/python benchmarks/compile_options.py      # ~4 min on 2 cores

Other options against the planner's own (`--against` the baseline, `--options` the candidate,
both JSON; `--only` a substring of the program names; `--out` the results file):

    .venv/bin/python benchmarks/compile_options.py --only llama --against planner \
        --options '{"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": true}' \
        --out benchmarks/results/compile_options-llvm.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

import autoremat

autoremat.configure_cpu_flags()

import jax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import provenance  # noqa: E402
from realscale import hand_variants, make_model  # noqa: E402

from autoremat import examples  # noqa: E402
from autoremat.runtime._validate import MEMORY_ONLY_CPU_OPTIONS  # noqa: E402

REALSCALE = ("llama", "llama_scan", "gpt", "equinox", "haiku_scan", "resnet_flax")


def _programs():
    for name in examples.EXAMPLES:
        ex = examples.get_example(name)
        yield f"{name} no remat", ex.fn, ex.args
        ckpt = jax.checkpoint(ex.fn, policy=jax.checkpoint_policies.nothing_saveable)
        yield f"{name} nothing_saveable", ckpt, ex.args
    for name in REALSCALE:
        for label, pols, cse in hand_variants(name, mix=False):
            if cse:
                fn, args, _, _ = make_model(name, pols, cse)
                yield f"{name} {label}", fn, args


def _compile(fn, args, options):
    lowered = jax.jit(jax.value_and_grad(fn)).trace(*args).lower()
    t0 = time.perf_counter()
    m = lowered.compile(options).memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    return peak, time.perf_counter() - t0


def _parse(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", default="defaults", help="baseline: 'defaults' (XLA's), 'planner' "
                    "(MEMORY_ONLY_CPU_OPTIONS) or JSON")
    ap.add_argument("--options", default="planner", help="candidate: 'planner' or JSON")
    ap.add_argument("--only", default="", help="programs whose name contains this")
    ap.add_argument("--out", default=os.path.join(here, "results", "compile_options.md"))
    a = ap.parse_args(argv)
    named = {"defaults": None, "planner": MEMORY_ONLY_CPU_OPTIONS}
    a.against, a.options = (named[x] if x in named else json.loads(x) for x in (a.against, a.options))
    return a


def main(argv=None) -> int:
    a = _parse(argv)
    t0 = time.perf_counter()
    rows, same, times = [], 0, [0.0, 0.0]
    for label, fn, args in _programs():
        if a.only not in label:
            continue
        (p0, t_against), (p1, t_options) = _compile(fn, args, a.against), _compile(fn, args, a.options)
        same += p0 == p1
        times[0] += t_against
        times[1] += t_options
        rows.append(f"| {label} | {p0:,} | {p1:,} | {'yes' if p0 == p1 else '**NO**'} | {t_against:.2f} | "
                    f"{t_options:.2f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    cmd = " ".join(["python benchmarks/compile_options.py", shlex.join(argv if argv is not None else sys.argv[1:])])
    base = "XLA's defaults" if a.against is None else f"`{a.against}`"
    out = ["# XLA:CPU compile options for the planner's compiles", "",
           provenance(cmd, (time.perf_counter() - t0) / 60), "",
           f"Options: `{a.options}`, against {base}. Peak = argument + output + temp - alias (bytes). "
           f"Same peak on {same} of {len(rows)} programs; compile time {times[0]:.1f} s against, "
           f"{times[1]:.1f} s with the options ({1 - times[1] / times[0]:.0%} less).", "",
           "| program | peak, against | peak, options | same | compile s, against | compile s, options |",
           "|---|---|---|---|---|---|", *rows, ""]
    with open(a.out, "w") as f:
        f.write("\n".join(out))
    print(f"wrote {a.out}", file=sys.stderr)
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
