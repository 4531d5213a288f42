"""Measures which XLA:CPU flags autoremat needs (autoremat/_xla.py), with `jax_remat3` off and on.

Compiles value_and_grad of a 6-block residual MLP (x + tanh(x @ w1) @ w2, batch 2048, width
256/1024) and of the built-in 4-layer transformer with no remat, with hand-written per-block
`jax.checkpoint(nothing_saveable)`, and with the same checkpoints made through
`autoremat.runtime._checkpoint.checkpoint` (what autoremat's plans use: under remat3 it ties the
recomputation to the backward pass), under several flag settings, each in a fresh process
(flags only count before JAX initializes), and prints the compiled peak
(argument + output + temp - alias, MiB).
Run: `.venv/bin/python benchmarks/cpu_flags.py`.
"""

import os
import subprocess
import sys

CHILD = r"""
import sys
import jax, jax.numpy as jnp
jax.config.update("jax_remat3", sys.argv[1] == "1")
from autoremat.runtime._checkpoint import checkpoint
from autoremat.examples import get_example
NOTHING = jax.checkpoint_policies.nothing_saveable
def hand(f): return jax.checkpoint(f, policy=NOTHING)
def tied(f): return checkpoint(f, policy=NOTHING, prevent_cse=True)
def block(x, w1, w2): return x + jnp.tanh(x @ w1) @ w2
def mlp(wrap):
    def loss(ws, x):
        for w1, w2 in ws:
            x = wrap(block)(x, w1, w2)
        return jnp.mean(x ** 2)
    return loss
def peak(fn, args):
    m = jax.jit(jax.value_and_grad(fn)).lower(*args).compile().memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes) / 2**20
ws = [(jnp.ones((256, 1024)), jnp.ones((1024, 256))) for _ in range(6)]
x = jnp.ones((2048, 256))
ex = get_example("transformer")
import autoremat.examples as E
orig = E._per_block
def tf(wrap):
    E._per_block = lambda b, policy, prevent_cse=True: wrap(b)
    try:
        return get_example("transformer", policy=NOTHING).fn
    finally:
        E._per_block = orig
vals = [peak(mlp(lambda f: f), (ws, x)), peak(mlp(hand), (ws, x)), peak(mlp(tied), (ws, x)),
        peak(ex.fn, ex.args), peak(tf(hand), ex.args), peak(tf(tied), ex.args)]
print(" ".join(f"{v:.1f}" for v in vals))
"""

SETTINGS = [
    ("default XLA:CPU", ""),
    ("scheduler flag only (docs/FACTS.md fact 4)", "--xla_cpu_enable_concurrency_optimized_scheduler=false"),
    ("scheduler flag + cse_barrier_expander off", "--xla_cpu_enable_concurrency_optimized_scheduler=false "
                                                  "--xla_disable_hlo_passes=cse_barrier_expander"),
    ("cse_barrier_expander off (autoremat)", "--xla_disable_hlo_passes=cse_barrier_expander"),
]


def main():
    print("Compiled peak (MiB). MLP: 6 residual blocks; transformer: autoremat.examples 'transformer' (4 layers).")
    print("hand = per-block `jax.checkpoint(nothing_saveable)`; tied = the same through "
          "autoremat.runtime._checkpoint.checkpoint.\n")
    print("| XLA_FLAGS | jax_remat3 | MLP no remat | MLP hand | MLP tied "
          "| transformer no remat | transformer hand | transformer tied |")
    print("|---|---|---|---|---|---|---|---|")
    for label, flags in SETTINGS:
        for remat3 in ("0", "1"):
            env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
            out = subprocess.run([sys.executable, "-c", CHILD, remat3], env=env, capture_output=True,
                                 text=True, check=True)
            cells = " | ".join(out.stdout.split())
            print(f"| {label} | {'on' if remat3 == '1' else 'off'} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
