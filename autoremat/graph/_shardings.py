"""Per-device sizes of a sharded step's values, as XLA's sharding propagation lays them out.

Only the arguments' shardings are known when tracing (`jax.jit`'s `in_shardings`, or the
shardings JAX's types carry); XLA's SPMD partitioner decides every other value's.  A rule
such as "a value is split as finely as its most split input" is far off: on a 6-layer decoder
sharded FSDP x TP over a (4, 2) mesh it put the forward values at 804 MiB per device where
XLA's layout holds 2030 MiB (`benchmarks/sharded.py` has the model), and the chain solver's
plans compiled 2x over their predicted peak.

So the forward jaxpr is compiled once with every top-level value as an extra output, and
each output's sharding (`Compiled.output_shardings`, what propagation chose for it) gives the
value's per-device size.  One forward compile per signature: 2 s for that decoder.
"""

from __future__ import annotations

import jax
import jax.extend as jex
import numpy as np

from autoremat.graph._trace import Traced, concrete_sharding

__all__ = ["propagated_divisors"]

_CACHE: dict = {}


def propagated_divisors(t: Traced) -> dict[tuple[int, int], float]:
    """`{(equation index, output index): factor}` for the top-level values of `t`'s jaxpr: how
    many pieces XLA splits each into (1.0 replicated); empty when no argument is sharded or the
    forward pass does not compile on its own (callers then fall back to their own estimate)."""
    shardings = [concrete_sharding(s) for s in (t.in_shardings or ())]
    if not any(s is not None for s in shardings):
        return {}
    key = (t.fingerprint, str(t.in_avals), tuple(str(s) for s in shardings))
    if key not in _CACHE:
        _CACHE[key] = _compile_divisors(t, shardings)
    return _CACHE[key]


def _compile_divisors(t: Traced, shardings: list) -> dict[tuple[int, int], float]:
    jaxpr = t.closed_jaxpr.jaxpr
    where, extra = [], []
    for i, eqn in enumerate(jaxpr.eqns):
        for j, v in enumerate(eqn.outvars):
            if _splittable(v.aval):
                where.append((i, j))
                extra.append(v)
    if not extra:
        return {}
    widened = jex.core.ClosedJaxpr(jaxpr.replace(outvars=list(jaxpr.outvars) + extra), t.closed_jaxpr.consts)
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(t.in_avals, shardings)]
    try:
        out = jax.jit(jex.core.jaxpr_as_fun(widened)).lower(*args).compile().output_shardings
    except Exception:  # noqa: BLE001 - a layout we cannot compile alone: the caller's estimate stands
        return {}
    out = out[len(jaxpr.outvars):]
    return {w: _factor(v.aval, s) for w, v, s in zip(where, extra, out)}


def _splittable(aval) -> bool:
    shape = getattr(aval, "shape", None)
    return bool(shape) and np.prod(shape) > 1 and not jax.dtypes.issubdtype(aval.dtype, jax.dtypes.extended)


def _factor(aval, sharding) -> float:
    try:
        part = float(np.prod(sharding.shard_shape(tuple(aval.shape))))
    except Exception:  # noqa: BLE001 - an unusual sharding type: count the value whole
        return 1.0
    return max(1.0, float(np.prod(aval.shape)) / part) if part else 1.0
