"""Strict settings for every test and doctest.

The XLA:CPU flags must be in the environment before JAX initializes (autoremat/_xla.py).  The
CPU is split into 4 host devices so that sharded inputs can be tested in-process
(tests/test_properties.py); unsharded arrays stay on the first device, as on one.
"""
import atexit
import os
import shutil
import tempfile

from autoremat._xla import accelerator_expected, configure_cpu_flags

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
configure_cpu_flags()
# Tests that run a step compile it in full; LLVM at -O0 cuts that by 39-44% on XLA:CPU (the built-in
# examples' value_and_grad compiled in 2.14 / 1.92 / 1.61 s at the default, 1.20 / 1.18 / 0.92 at -O0,
# each run -0.02..+0.15 s apart, the same compiled peaks: benchmarks/full_compile_levels.py);
# memory is decided before LLVM (the planner's own compiles already use it,
# autoremat._xla.MEMORY_ONLY_CPU_OPTIONS).  Not where an accelerator runs the tests.
if not accelerator_expected() and "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# No test reads a compile from an earlier run, or leaves one for the next (tests that exercise
# the compile cache point it at a temporary directory).
os.environ["AUTOREMAT_CACHE_DIR"] = "off"

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

# XLA's own compilation cache, empty at the start of each run and removed at its end, shared by
# the pytest-xdist workers (they inherit the directory through the environment): tests compile the
# same small steps again and again (the hand-written policies of the built-in examples, a search run
# twice "in a new process"), and a program compiled once in the run is read back instead of compiled
# again.  autoremat sees every compile as before (its own cache, above, stays off).  Measured on the
# 2-core machine: tests/test_hand.py + tests/test_optimize.py took 193 s without it, 161 s with it.
_XLA_CACHE = "AUTOREMAT_TESTS_XLA_CACHE"
if _XLA_CACHE not in os.environ:  # the first process of the run (xdist's controller, or the only one)
    os.environ[_XLA_CACHE] = tempfile.mkdtemp(prefix="autoremat-tests-xla-")
    atexit.register(shutil.rmtree, os.environ[_XLA_CACHE], ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", os.environ[_XLA_CACHE])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
