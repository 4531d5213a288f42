"""What LLVM's optimization level costs the steps the tests compile in full (conftest.py sets -O0).

A test that runs a step compiles `jax.jit(jax.value_and_grad(fn))` in full, LLVM included; the
planner's compiles are memory-only and use `xla_backend_optimization_level=0` already
(`autoremat._xla.MEMORY_ONLY_CPU_OPTIONS`).  For each built-in example at its default size, in a
fresh process per setting (XLA_FLAGS is read once, at start-up): seconds to trace, lower, compile
and run the step (the median of `--repeats` fresh `jax.jit`s, no compile cache), and the compiled
peak, which should not move:

    .venv/bin/python benchmarks/full_compile_levels.py     # ~1 min; writes results/full_compile_levels.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from _common import write_table

EXAMPLES = ("transformer", "transformer_scan", "convnet")
SETTINGS = {"default": "", "-O0": "--xla_backend_optimization_level=0"}


def _child(name: str, repeats: int) -> dict:
    """In this process: the step of example `name` staged and run `repeats` times, timed."""
    import autoremat

    autoremat.configure_cpu_flags()
    import jax

    from autoremat import examples

    ex = examples.get_example(name)
    times, peak = [], None
    for _ in range(repeats):
        t = [time.perf_counter()]
        traced = jax.jit(jax.value_and_grad(ex.fn)).trace(*ex.args)
        t.append(time.perf_counter())
        lowered = traced.lower()
        t.append(time.perf_counter())
        compiled = lowered.compile()
        t.append(time.perf_counter())
        jax.block_until_ready(compiled(*ex.args))
        t.append(time.perf_counter())
        times.append([b - a for a, b in zip(t, t[1:])])
        m = compiled.memory_analysis()
        peak = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                - m.alias_size_in_bytes)
    return {"seconds": [statistics.median(col) for col in zip(*times)], "peak": peak}


def _measure(name: str, flag: str, repeats: int) -> dict:
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flag).strip())
    out = subprocess.run([sys.executable, __file__, "--child", name, "--repeats", str(repeats)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "full_compile_levels.md"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(_child(a.child, a.repeats)))
        return 0
    t0 = time.perf_counter()
    rows = ["| example | LLVM | trace s | lower s | compile s | run s | compiled peak (bytes) |",
            "|---|---|---|---|---|---|---|"]
    for name in EXAMPLES:
        for label, flag in SETTINGS.items():
            got = _measure(name, flag, a.repeats)
            rows.append(f"| {name} | {label} | " + " | ".join(f"{s:.2f}" for s in got["seconds"])
                        + f" | {got['peak']:,} |")
            print(rows[-1], flush=True)
    intro = (f"Each step `jax.jit(jax.value_and_grad(fn))` of a built-in example at its default size, the median of "
             f"{a.repeats} fresh jits in one process per row (no compile cache); 'LLVM -O0' adds "
             f"`--xla_backend_optimization_level=0` to XLA_FLAGS, as conftest.py does for the tests.")
    write_table(a.out, "# The tests' full compiles at LLVM's default level and at -O0", "python benchmarks/"
                "full_compile_levels.py", t0, rows, intro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
