"""Measures this machine's arithmetic rates next to the `cpu` device profile's assumptions.

    python benchmarks/cpu_profile.py

Times (best of 5, after a warm-up) a 1024^3 f32 matmul, a 64 MiB f32 elementwise
multiply-add, and tanh / exp / gelu over 16M f32 values under `jax.jit`, and prints the
rates beside `get_profile("cpu")`'s `peak_flops`, `memory_bandwidth` and
`transcendental_rate`.  The profile's numbers are assumptions; this says how far off they
are here (docs/FINDINGS.md).
"""
import time

from autoremat._xla import configure_cpu_flags

configure_cpu_flags()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from autoremat.graph import get_profile  # noqa: E402


def best_time(f, *args, n=5):
    f = jax.jit(f)
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return min(times)


prof = get_profile("cpu")
x = jnp.ones((1024, 1024), jnp.float32)
y = jnp.ones((16 * 1024 * 1024,), jnp.float32)
rows = [
    ("matmul f32 (FLOP/s)", 2 * 1024**3 / best_time(lambda a, b: a @ b, x, x), prof.flops_rate("float32")),
    ("elementwise read+write (B/s)", 2 * y.nbytes / best_time(lambda a: a * 2.0 + 1.0, y), prof.memory_bandwidth),
    ("tanh (values/s)", y.size / best_time(jnp.tanh, y), prof.transcendental_rate),
    ("exp (values/s)", y.size / best_time(jnp.exp, y), prof.transcendental_rate),
    ("gelu (values/s)", y.size / best_time(jax.nn.gelu, y), prof.transcendental_rate),
]
print(f"{'rate':32s} {'measured':>10s} {'profile':>10s} {'profile/measured':>17s}")
for name, measured, assumed in rows:
    print(f"{name:32s} {measured:10.3g} {assumed:10.3g} {assumed / measured:17.2f}")
