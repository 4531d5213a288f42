"""XLA:CPU flags that let remat show up in compiled memory (imports no JAX).

Measured (jax 0.10.2, 2-core CPU; `python benchmarks/cpu_flags.py` reruns it):

* `--xla_cpu_enable_concurrency_optimized_scheduler=false`: the default scheduler hoists
  recomputation and hides remat savings (DESIGN.md fact 4).
* `--xla_disable_hlo_passes=cse_barrier_expander`: XLA:CPU expands the optimization
  barriers that `jax.checkpoint(prevent_cse=True)` inserts *before* its CSE pass, which then
  merges the recomputation back into the forward pass: per-block `nothing_saveable` on an
  8-block MLP compiled to the same 320 MiB temp as no remat; with the pass disabled, 140 MiB.

Both must be in the environment before JAX initializes its CPU backend.
"""

from __future__ import annotations

import os
import sys

__all__ = ["CPU_XLA_FLAGS", "configure_cpu_flags", "cpu_flags_active"]

CPU_XLA_FLAGS = (
    "--xla_cpu_enable_concurrency_optimized_scheduler=false",
    "--xla_disable_hlo_passes=cse_barrier_expander",
)


def configure_cpu_flags() -> bool:
    """Adds `CPU_XLA_FLAGS` to `XLA_FLAGS`; returns False if JAX's backend already started."""
    current = os.environ.get("XLA_FLAGS", "")
    missing = [f for f in CPU_XLA_FLAGS if f.split("=")[0] not in current]
    if missing:
        os.environ["XLA_FLAGS"] = " ".join([current, *missing]).strip()
    return not _backend_started()


def _backend_started() -> bool:
    xb = sys.modules.get("jax._src.xla_bridge")
    return bool(xb is not None and getattr(xb, "_backends", None))


def cpu_flags_active() -> bool:
    """Whether the flags are in the environment (they count only if set before JAX started)."""
    current = os.environ.get("XLA_FLAGS", "")
    return all(f in current for f in CPU_XLA_FLAGS)
