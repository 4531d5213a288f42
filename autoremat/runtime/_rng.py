"""Random keys tied to the region that draws from them.

A key depends on the step's arguments alone, so XLA may draw every layer's random bits before
the first layer runs and hold them all at once: the dropout decoder of `benchmarks/unseen.py`
(12 layers, dropout on the attention probabilities) compiled to 22.41 GiB under
`nothing_saveable` per layer where the same decoder without dropout compiled to 6.90, the
attention masks holding 13.4 GiB of it (`benchmarks/dropout_masks.py`, docs/FINDINGS.md,
forty-first session).  A checkpointed region that draws random bits therefore passes its keys
through `jax.lax.optimization_barrier` together with its largest floating-point input computed
by an earlier equation (the activations it works on), so its bits are drawn only once the
region runs: 8.65 GiB there (`nothing_saveable` per layer through `apply`).  The barrier is the
identity on values: the same keys, the same bits, the same gradients.  It is not free, though,
so a region is tied only where its bits take at least that input's bytes (`rng_ties`): a layer
that draws one scalar has nothing worth drawing late.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.extend as jex
import jax.numpy as jnp

from autoremat.graph._costs import aval_bytes

__all__ = ["rng_ties", "tie_keys"]

# The primitives that turn a key into random bits, and the one that makes a typed key of raw
# uint32 key data (legacy `jax.random.PRNGKey` keys).
_DRAWS = frozenset({"random_bits", "threefry2x32"})
_WRAP = "random_wrap"


def _drawn_bytes(eqns) -> int:
    """The bytes of random bits `eqns` draw (their jaxprs nested in them included, once each)."""
    total = 0
    for e in eqns:
        if e.primitive.name in _DRAWS:
            total += sum(aval_bytes(v.aval) for v in e.outvars)
        for sub in jex.core.jaxprs_in_params(e.params):
            total += _drawn_bytes(sub.eqns)
    return total


def _dtype(aval):
    return getattr(aval, "dtype", None)  # None for tokens


def _is_key(aval) -> bool:
    return _dtype(aval) is not None and jax.dtypes.issubdtype(_dtype(aval), jax.dtypes.prng_key)


def _raw_keys(eqns, ins: Sequence) -> set[int]:
    """The positions in `ins` of the uint32 inputs that `eqns` make typed keys of (legacy keys:
    `random_wrap` of key data, sliced from a split array first or not)."""
    came = {v: {k} for k, v in enumerate(ins) if _dtype(v.aval) == jnp.uint32}
    out: set[int] = set()
    for e in eqns:
        src = set().union(*(came.get(v, set()) for v in e.invars if not isinstance(v, jex.core.Literal)))
        if e.primitive.name == _WRAP:
            out |= src
        elif src:
            came.update({v: src for v in e.outvars})
    return out


def rng_ties(jaxpr, start: int, stop: int, ins: Sequence) -> tuple[tuple[int, ...], int] | None:
    """For the equations `[start, stop)` of `jaxpr` with live-in variables `ins`: (the positions
    in `ins` of the keys they draw from, the position of the input to tie them to), or None
    where they draw no random bits, take no key from outside, or have no floating-point input
    computed before them (the activations: a key tied to an argument could still be drawn at
    the start).  Also None where the bits they draw take fewer bytes than the input they would
    be tied to: drawn early, every layer's bits together then take less than the layers'
    inputs the backward holds anyway, and the barrier is not free.  Layers that draw one
    scalar each (stochastic depth, `lax.cond` on a Bernoulli draw; a /tmp probe of 6 layers
    at d_model 128) compiled 960-1536 bytes above the same policies written by hand when tied,
    so the planner's copies of those policies did not fit the hand-written plans' own peaks
    and it returned plans that recompute more: at all five points of `benchmarks/unseen.py`'s
    1B `sdepth` (tests/test_runtime.py; docs/FINDINGS.md, forty-second session)."""
    eqns = jaxpr.eqns[start:stop]
    drawn = _drawn_bytes(eqns)
    if not drawn:
        return None
    raw = _raw_keys(eqns, ins)
    keys = tuple(k for k, v in enumerate(ins) if _is_key(v.aval) or k in raw)
    produced = {v for e in jaxpr.eqns[:start] for v in e.outvars}
    acts = [k for k, v in enumerate(ins) if v in produced and _dtype(v.aval) is not None
            and not _is_key(v.aval) and jnp.issubdtype(_dtype(v.aval), jnp.floating)]
    if not keys or not acts:
        return None
    anchor = max(acts, key=lambda k: aval_bytes(ins[k].aval))
    return (keys, anchor) if drawn >= aval_bytes(ins[anchor].aval) else None


def tie_keys(vals: Sequence, ties: tuple[tuple[int, ...], int] | None) -> list:
    """`vals` (a region's live-in values) with the keys of `ties` (`rng_ties`) and the input they
    are tied to passed through one optimization barrier."""
    vals = list(vals)
    if ties is None:
        return vals
    keys, anchor = ties
    at = (*keys, anchor)
    for k, val in zip(at, jax.lax.optimization_barrier(tuple(vals[k] for k in at))):
        vals[k] = val
    return vals
