"""Does a scan body under `jax.checkpoint` need optimization barriers?  Only where the scan is unrolled.

JAX's docs (and MaxText) write `prevent_cse=False` on a scan's body: the loop keeps XLA from
merging the body's recomputation into the forward pass.  An unrolled scan (`unroll` > 1, as
penzai's `LayerStack` writes it) puts the iterations side by side, as at top level.  This
compiles a 4-layer scan of GeGLU MLPs (bf16, RMS-normed, abstract arguments) with no remat and
with `nothing_saveable` on the body, barriers on and off, at unroll 1, 2 and 4
(`OpInfo.unrolled`, `_search._scan_barriers`).

    .venv/bin/python benchmarks/scan_barriers.py      # writes results/scan_barriers.md (~10 s)
"""

from __future__ import annotations

import os
import sys
import time

import autoremat

autoremat.configure_cpu_flags()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_table  # noqa: E402

from autoremat.runtime._validate import compiled_stats  # noqa: E402

bf = jnp.bfloat16
L, B, S, D, F = 4, 2, 128, 256, 512


def body(h, p):
    x = h * jax.lax.rsqrt(jnp.mean(h.astype(jnp.float32) ** 2, -1, keepdims=True) + 1e-6).astype(bf) * p["g"]
    return h + (jax.nn.gelu(x @ p["w1"]) * (x @ p["w3"])) @ p["w2"]


def step(unroll: int, policy, prevent_cse: bool):
    f = body if policy is None else jax.checkpoint(body, policy=policy, prevent_cse=prevent_cse)

    def loss(params, h):
        out, _ = jax.lax.scan(lambda c, p: (f(c, p), None), h, params, unroll=unroll)
        return jnp.mean(out.astype(jnp.float32) ** 2)

    sd = jax.ShapeDtypeStruct
    params = {"g": sd((L, D), bf), "w1": sd((L, D, F), bf), "w3": sd((L, D, F), bf), "w2": sd((L, F, D), bf)}
    return loss, (params, sd((B, S, D), bf))


def main() -> int:
    t0 = time.perf_counter()
    rows = ["| unroll | no remat MiB | nothing_saveable, barriers MiB | nothing_saveable, prevent_cse=False MiB |",
            "|---|---|---|---|"]
    for unroll in (1, 2, 4):
        peaks = []
        for pol, cse in ((None, True), (jax.checkpoint_policies.nothing_saveable, True),
                         (jax.checkpoint_policies.nothing_saveable, False)):
            fn, args = step(unroll, pol, cse)
            peaks.append(compiled_stats(fn, *args).peak_bytes / 2**20)
        rows.append(f"| {unroll} | " + " | ".join(f"{p:.2f}" for p in peaks) + " |")
        print(rows[-1], flush=True)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "scan_barriers.md")
    write_table(out, "# Scan bodies and optimization barriers", "python benchmarks/scan_barriers.py", t0, rows,
                  f"A {L}-layer scan of GeGLU MLPs (d {D}, d_ff {F}, batch {B} x {S}, bf16); compiled peak = "
                  "argument + output + temp - alias of the `value_and_grad` step.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
