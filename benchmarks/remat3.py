"""Does remat show in compiled memory with `jax_remat3` off and on, on this backend?

For a 6-block residual MLP and the built-in 4-layer transformer, compiles `value_and_grad` with
no remat, with hand-written per-block `jax.checkpoint(nothing_saveable)` ("hand") and with the
same checkpoints made the way autoremat's plans make them ("tied":
`autoremat.runtime._checkpoint.checkpoint`, which under remat3 ties the recomputation to the
backward pass), each with remat3 off and on, in this process's XLA_FLAGS.  Prints compiled
peaks (argument + output + temp - alias, MiB) and, with --time, median step times.

Run: `.venv/bin/python benchmarks/remat3.py` (on the CPU, autoremat's CSE flag is set first
unless --keep-flags; benchmarks/cpu_flags.py runs it under several flag sets).
"""

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from autoremat import configure_cpu_flags
from autoremat.examples import get_example
from autoremat.runtime._checkpoint import checkpoint

NOTHING = jax.checkpoint_policies.nothing_saveable


def _block(x, w1, w2):
    return x + jnp.tanh(x @ w1) @ w2


def _mlp(wrap):
    def loss(ws, x):
        for w1, w2 in ws:
            x = wrap(_block)(x, w1, w2)
        return jnp.mean(x**2)
    return loss


def _transformer(wrap):
    import autoremat.examples as E

    orig = E._per_block
    E._per_block = lambda b, policy, prevent_cse=True: wrap(b)
    try:
        return get_example("transformer", policy=NOTHING).fn
    finally:
        E._per_block = orig


WRAPS = {
    "no remat": lambda f: f,
    "hand": lambda f: jax.checkpoint(f, policy=NOTHING),
    "tied": lambda f: checkpoint(f, policy=NOTHING, prevent_cse=True),
}


def _measure(fn, args, n_steps):
    step = jax.jit(jax.value_and_grad(fn))
    m = step.lower(*args).compile().memory_analysis()
    peak = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)
    cell = f"{peak / 2**20:.1f}"
    if n_steps:
        jax.block_until_ready(step(*args))
        times = []
        for _ in range(n_steps):
            t0 = time.perf_counter()
            jax.block_until_ready(step(*args))
            times.append(time.perf_counter() - t0)
        cell += f" / {statistics.median(times) * 1e3:.2f} ms"
    return cell


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time", type=int, default=0, metavar="N", help="also time N steps (median)")
    ap.add_argument("--keep-flags", action="store_true", help="run under XLA_FLAGS as they are")
    opts = ap.parse_args(argv)
    if not opts.keep_flags:
        configure_cpu_flags()  # before the first compile starts JAX's backend
    ws = [(jnp.ones((256, 1024)) * 0.01, jnp.ones((1024, 256)) * 0.01) for _ in range(6)]
    x = jnp.ones((2048, 256))
    ex = get_example("transformer")
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}, "
          f"XLA_FLAGS={__import__('os').environ.get('XLA_FLAGS', '')!r}")
    unit = "peak MiB" + (" / step ms" if opts.time else "")
    print("\n| model | jax_remat3 | " + " | ".join(f"{k} ({unit})" for k in WRAPS) + " |")
    print("|---|---|" + "---|" * len(WRAPS))
    for model, build, args in (("MLP, 6 blocks", _mlp, (ws, x)), ("transformer, 4 layers", _transformer, ex.args)):
        for on in (False, True):
            jax.config.update("jax_remat3", on)
            cells = [_measure(build(w), args, opts.time) for w in WRAPS.values()]
            print(f"| {model} | {'on' if on else 'off'} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
