"""The XLA:CPU flag that lets remat show up in compiled memory (imports no JAX).

Measured with jax 0.10.2 on a 2-core CPU (`python benchmarks/cpu_flags.py` reruns it;
results in benchmarks/results/cpu_flags.md):

* `--xla_disable_hlo_passes=cse_barrier_expander` is what matters.  XLA:CPU expands the
  optimization barriers that `jax.checkpoint(prevent_cse=True)` inserts *before* its CSE
  pass, which then merges the recomputation back into the forward pass: per-block
  `nothing_saveable` on an 8-block MLP compiled to the same temp memory as no remat.
* `--xla_cpu_enable_concurrency_optimized_scheduler=false` (docs/FACTS.md fact 4, written for an
  older XLA) is deprecated in this XLA and now *hurts*: it selects a scheduler that hoists
  every block's recomputation to the start of the backward pass (4-layer transformer,
  per-layer `nothing_saveable`: 75.8 MiB with it, 47.6 MiB without; no remat 82.4 MiB).

The flag must be in the environment before JAX initializes its CPU backend.  It must NOT
be set where JAX will use a GPU: XLA:GPU cannot emit the barriers it then keeps
(`INTERNAL: Unsupported instruction opcode: opt-barrier`, seen on an H100 with jax 0.11.2),
so `configure_cpu_flags` leaves XLA_FLAGS alone when an accelerator plugin is installed
and JAX_PLATFORMS does not restrict JAX to the CPU.
"""

from __future__ import annotations

import importlib.util
import os
import sys

__all__ = ["CPU_XLA_FLAGS", "MEMORY_ONLY_CPU_OPTIONS", "accelerator_expected", "configure_cpu_flags",
           "cpu_flags_active"]

CPU_XLA_FLAGS = ("--xla_disable_hlo_passes=cse_barrier_expander",)
# Compile options for programs that are compiled to be read (memory, shardings), never run: on
# XLA:CPU LLVM need not optimize the machine code, as buffer assignment and sharding
# propagation are done on HLO before it.  Measured by benchmarks/compile_options.py
# (results/compile_options.md): the same compiled peak on every program there, built-in
# examples and real-scale models alike, in less compile time; and on the sharded graph's
# compile (`graph/_shardings.py`) the same split of every value of the 1B decoder under FSDP
# and FSDP x TP, of the 8B scan, and of the mixture-of-experts and penzai scan decoders of
# benchmarks/sharded.py's unseen models (FSDP, batch x8), in 6.3 s against 7.1-7.6, 6.0 against
# 8.3, 2.0 against 3.4, 2.2 against 2.9 and 4.3 against 6.1 (a /tmp probe timing
# `propagated_divisors` both ways, docs/FINDINGS.md twenty-seventh session).
MEMORY_ONLY_CPU_OPTIONS = {"xla_backend_optimization_level": 0}
_PASS = "cse_barrier_expander"


_ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_cuda12_pjrt", "jax_cuda13_pjrt",
                        "jax_rocm60_plugin", "jax_rocm7_plugin", "libtpu", "jax_plugins.xla_cuda12",
                        "jax_plugins.xla_cuda13")


def accelerator_expected() -> bool:
    """Whether JAX will probably run on a GPU/TPU here (an accelerator plugin is installed
    and JAX_PLATFORMS does not say cpu)."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms.split(",")[0] != "cpu"
    for name in _ACCELERATOR_PLUGINS:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def configure_cpu_flags() -> bool:
    """Adds `CPU_XLA_FLAGS` to `XLA_FLAGS` when JAX will run on the CPU.

    Returns False if JAX's backend already started (too late for flags).  An existing
    `--xla_disable_hlo_passes=...` list is extended rather than duplicated.  Nothing is
    changed where an accelerator is expected (see `accelerator_expected`).
    """
    if accelerator_expected():
        return not _backend_started()
    current = os.environ.get("XLA_FLAGS", "")
    if _PASS not in current:
        parts = current.split()
        for i, p in enumerate(parts):
            if p.startswith("--xla_disable_hlo_passes="):
                parts[i] = p + "," + _PASS
                break
        else:
            parts.append(CPU_XLA_FLAGS[0])
        os.environ["XLA_FLAGS"] = " ".join(parts)
    return not _backend_started()


def _backend_started() -> bool:
    xb = sys.modules.get("jax._src.xla_bridge")
    return bool(xb is not None and getattr(xb, "_backends", None))


def cpu_flags_active() -> bool:
    """Whether the flag is in the environment (they count only if set before JAX started)."""
    return _PASS in os.environ.get("XLA_FLAGS", "")
