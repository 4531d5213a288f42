"""How far an optimized function's gradients are from the original's, per framework model.

    python benchmarks/gradient_error.py

For the models of tests/test_frameworks.py (equinox MLP, scan over layers, flax nnx), plans
with `autoremat.optimize(loss, budget=0.75)` and prints the worst elementwise relative error
(with an absolute floor of 1e-6 x the largest entry) of `jit(grad(optimized))` against
`jit(grad(loss))`, and of a second `jit(grad(loss))` against the first (run-to-run noise).
results/gpu-h100-gradients.log is an H100 run.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from autoremat._xla import configure_cpu_flags  # noqa: E402

configure_cpu_flags()

import jax  # noqa: E402
import numpy as np  # noqa: E402

import autoremat  # noqa: E402
from test_frameworks import BUDGET, MODELS  # noqa: E402

for name in ("equinox", "scan", "flax_nnx"):
    loss, args = MODELS[name]()
    opt = autoremat.optimize(loss, budget=BUDGET)
    g1 = jax.jit(jax.grad(loss))(*args)
    g2 = jax.jit(jax.grad(opt))(*args)
    g0 = jax.jit(jax.grad(loss))(*args)
    for tag, ga in (("opt", g2), ("rerun", g0)):
        worst = 0.0
        for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(g1)):
            a, b = np.asarray(a), np.asarray(b)
            worst = max(worst, float(np.max(np.abs(a - b) / (np.abs(b) + 1e-6 * np.max(np.abs(b))))))
        print(name, tag, "worst elementwise rel err (atol 1e-6*max)", worst, flush=True)
