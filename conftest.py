"""Strict settings for every test and doctest.

The XLA:CPU flags must be in the environment before JAX initializes (autoremat/_xla.py).  The
CPU is split into 4 host devices so that sharded inputs can be tested in-process
(tests/test_properties.py); unsharded arrays stay on the first device, as on one.
"""
import os

from autoremat._xla import configure_cpu_flags

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
configure_cpu_flags()
# No test reads a compile from an earlier run, or leaves one for the next (tests that exercise
# the compile cache point it at a temporary directory).
os.environ["AUTOREMAT_CACHE_DIR"] = "off"

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
