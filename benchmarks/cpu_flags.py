"""Measures which XLA:CPU flags autoremat needs (autoremat/_xla.py).

Compiles value_and_grad of an 8-block residual MLP (x + tanh(x @ w1) @ w2, batch 4096) and of
the built-in 4-layer transformer with no remat and with per-block
`jax.checkpoint(nothing_saveable)`, under several flag settings, each in a fresh process
(flags only count before JAX initializes), and prints the compiled memory.
Run: `.venv/bin/python benchmarks/cpu_flags.py`.
"""

import os
import subprocess
import sys

CHILD = r"""
import jax, jax.numpy as jnp
def block(x, w1, w2): return x + jnp.tanh(x @ w1) @ w2
def loss(ws, x, pol=None):
    for w1, w2 in ws:
        x = (jax.checkpoint(block, policy=pol) if pol else block)(x, w1, w2)
    return jnp.mean(x ** 2)
ws = [(jnp.ones((256, 1024)), jnp.ones((1024, 256))) for _ in range(8)]
x = jnp.ones((4096, 256))
def temp(f):
    m = jax.jit(jax.value_and_grad(f)).lower(ws, x).compile().memory_analysis()
    return m.temp_size_in_bytes / 2**20
print(f"{temp(loss):.0f} {temp(lambda w, x: loss(w, x, jax.checkpoint_policies.nothing_saveable)):.0f}")
from autoremat.examples import get_example
def peak(ex):
    m = jax.jit(jax.value_and_grad(ex.fn)).lower(*ex.args).compile().memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes) / 2**20
print(f"{peak(get_example('transformer')):.1f} "
      f"{peak(get_example('transformer', policy=jax.checkpoint_policies.nothing_saveable)):.1f}")
"""

SETTINGS = [
    ("default XLA:CPU", ""),
    ("scheduler flag only (DESIGN.md fact 4)", "--xla_cpu_enable_concurrency_optimized_scheduler=false"),
    ("scheduler flag + cse_barrier_expander off", "--xla_cpu_enable_concurrency_optimized_scheduler=false "
                                                  "--xla_disable_hlo_passes=cse_barrier_expander"),
    ("cse_barrier_expander off (autoremat)", "--xla_disable_hlo_passes=cse_barrier_expander"),
]


def main():
    print("| XLA_FLAGS | MLP no remat temp (MiB) | MLP per-block nothing_saveable temp (MiB) "
          "| transformer no remat peak (MiB) | transformer per-layer nothing_saveable peak (MiB) |")
    print("|---|---|---|---|---|")
    for label, flags in SETTINGS:
        env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
        none, remat, t_none, t_remat = out.stdout.split()
        print(f"| {label} | {none} | {remat} | {t_none} | {t_remat} |")


if __name__ == "__main__":
    main()
