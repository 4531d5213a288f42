"""What LLVM's optimization level costs the steps the tests compile in full (conftest.py sets -O0).

A test that runs a step compiles `jax.jit(jax.value_and_grad(fn))` in full, LLVM included; the
planner's compiles are memory-only and use `xla_backend_optimization_level=0` already
(`autoremat._xla.MEMORY_ONLY_CPU_OPTIONS`).  For each built-in example at its default size, in a
fresh process per setting (XLA_FLAGS is read once, at start-up): seconds to trace and lower, compile
and run the step (the median of `--repeats` fresh `jax.jit`s, no compile cache), and the compiled
peak (`CompiledStats.peak_bytes`), which should not move:

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
    """In this process: the step of example `name` staged, compiled in full and run once,
    `repeats` times (`runtime.stage_step` and `runtime.compile_step`, as `compiled_stats` with
    `n_steps=1` does), timed."""
    import autoremat

    autoremat.configure_cpu_flags()
    from autoremat import examples
    from autoremat.runtime._validate import compile_step, stage_step

    ex = examples.get_example(name)
    times, peak = [], None
    for _ in range(repeats):
        staged = stage_step(ex.fn, *ex.args)
        st = compile_step(staged, n_steps=1, warmup=0, run_args=ex.args)
        times.append([staged.trace_time, st.compile_time - staged.trace_time, st.step_time])
        peak = st.peak_bytes
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
    rows = ["| example | LLVM | trace and lower s | compile s | run s | compiled peak (bytes) |",
            "|---|---|---|---|---|---|"]
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
