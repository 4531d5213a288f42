"""Measures which XLA:CPU flags autoremat needs (autoremat/_xla.py), with `jax_remat3` off and on.

Runs benchmarks/remat3.py (a 6-block residual MLP and the built-in 4-layer transformer: no
remat, hand-written per-block `jax.checkpoint(nothing_saveable)`, and the same checkpoints as
autoremat's plans make them, tied to the backward pass under remat3) under several XLA_FLAGS
settings, each in a fresh process (flags only count before JAX initializes), and prints the
compiled peaks (argument + output + temp - alias, MiB) side by side.
Run: `.venv/bin/python benchmarks/cpu_flags.py`.
"""

import os
import subprocess
import sys

SETTINGS = [
    ("default XLA:CPU", ""),
    ("scheduler flag only (docs/FACTS.md fact 4)", "--xla_cpu_enable_concurrency_optimized_scheduler=false"),
    ("scheduler flag + cse_barrier_expander off", "--xla_cpu_enable_concurrency_optimized_scheduler=false "
                                                  "--xla_disable_hlo_passes=cse_barrier_expander"),
    ("cse_barrier_expander off (autoremat)", "--xla_disable_hlo_passes=cse_barrier_expander"),
]
REMAT3 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "remat3.py")


def _rows(flags: str) -> list[list[str]]:
    """benchmarks/remat3.py's table rows (model, remat3, no remat, hand, tied) under `flags`."""
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, REMAT3, "--keep-flags"], env=env, capture_output=True, text=True,
                         check=True).stdout
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| MLP") or line.startswith("| transformer")]


def main():
    print("Compiled peak (MiB). MLP: 6 residual blocks; transformer: autoremat.examples 'transformer' (4 layers).")
    print("hand = per-block `jax.checkpoint(nothing_saveable)`; tied = the same through "
          "autoremat.runtime._checkpoint.checkpoint.\n")
    print("| XLA_FLAGS | jax_remat3 | MLP no remat | MLP hand | MLP tied "
          "| transformer no remat | transformer hand | transformer tied |")
    print("|---|---|---|---|---|---|---|---|")
    for label, flags in SETTINGS:
        rows = _rows(flags)
        for remat3 in ("off", "on"):
            mlp, tf = (next(r for r in rows if r[0].startswith(m) and r[1] == remat3) for m in ("MLP", "transformer"))
            print(f"| {label} | {remat3} | " + " | ".join(mlp[2:] + tf[2:]) + " |", flush=True)


if __name__ == "__main__":
    main()
