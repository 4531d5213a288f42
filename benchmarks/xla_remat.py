"""Does XLA's own rematerialization pass change a step's compiled peak?  (DESIGN.md §5)

XLA runs an HloRematerialization pass by default (JAX's `jax_compiler_enable_remat_pass`); it
acts when a module's peak is over the backend's memory limit (a GPU's memory; XLA:CPU has none).
This compiles `realscale.py`'s Llama decoder, without remat and with JAX policies written per
layer, at several batch scales, with the pass on and off, and prints a markdown table of the
compiled peaks (argument + output + temp - alias) and of XLA's FLOPs.  Where the two agree, the
pass did nothing and the peaks the planner reads are the step's own.

    python benchmarks/xla_remat.py --scales 1 3 4 --policies none dots_saveable   # on a GPU
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realscale  # noqa: E402  (sets XLA:CPU's flags before JAX starts)

import jax  # noqa: E402

from _common import provenance  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402

GiB = 2**30


def peak(name: str, policy: str | None, on: bool):
    layers = realscale.make_model(name)[3]
    fn, args, _, _ = realscale.make_model(name, None if policy is None else [policy] * layers)
    jax.config.update("jax_compiler_enable_remat_pass", on)
    try:
        return compiled_stats(fn, *args)
    finally:
        jax.config.update("jax_compiler_enable_remat_pass", True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama")
    ap.add_argument("--scales", type=int, nargs="+", default=[1])
    ap.add_argument("--policies", nargs="+", default=["none", "dots_saveable"])
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for k in a.scales:
        base = realscale.FAMILIES[a.model]
        realscale.scale_family(a.model, k)
        for pol in a.policies:
            st = {on: peak(a.model, None if pol == "none" else pol, on) for on in (True, False)}
            rows.append(f"| {a.model} | {realscale.FAMILIES[a.model][7]} | {pol} | {st[True].peak_bytes / GiB:.2f} | "
                        f"{st[False].peak_bytes / GiB:.2f} | {(st[True].flops or 0) / 1e12:.2f} | "
                        f"{(st[False].flops or 0) / 1e12:.2f} |")
            print(rows[-1], file=sys.stderr, flush=True)
        realscale.FAMILIES[a.model] = base
    cmd = f"python benchmarks/xla_remat.py --model {a.model} --scales {' '.join(map(str, a.scales))} " \
          f"--policies {' '.join(a.policies)}"
    print("\n".join([f"# XLA's remat pass on and off ({jax.devices()[0].device_kind})", "",
                     provenance(cmd, (time.perf_counter() - t0) / 60), "",
                     "| model | batch | policy per layer | peak GiB, pass on | peak GiB, pass off | "
                     "XLA TFLOP, on | XLA TFLOP, off |", "|---|---|---|---|---|---|---|", *rows, ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
