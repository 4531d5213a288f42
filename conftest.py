"""Strict settings for every test and doctest.

The XLA:CPU flags must be in the environment before JAX initializes (autoremat/_xla.py).
"""
from autoremat._xla import configure_cpu_flags

configure_cpu_flags()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
