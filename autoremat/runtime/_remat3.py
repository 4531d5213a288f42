"""What this JAX's `jax_remat3` does, asked of JAX once a process.

Remat3 changed between the versions autoremat supports, and the runtime works around what a
version lacks only where it lacks it.  Each question traces one tiny gradient under remat3 on
an abstract mesh (no device, no compile, a few milliseconds), on a thread of its own: asked from
inside a trace (a shard_map's, a jit's), it would be traced under that trace's mesh.

- `barrier_holds_cotangent`: jax 0.10.2 replays a checkpoint's region behind a barrier over its
  inputs only, which XLA:CPU's scheduler runs next to the forward pass (`runtime._checkpoint`
  ties it, measured there); 0.11.2's barrier holds the incoming cotangent too, as remat2's does
  (a 6-block residual MLP at `nothing_saveable` per block: 56.0 MiB with remat3 on and off on
  0.11.2, 96.0 against 56.0 MiB on 0.10.2).
- `replay_casts_inputs`: jax 0.10.2's barrier casts a region's inputs inside a shard_map to one
  varying type, so the replay of a `pvary` of an invariant input raises "pvary is a
  invariant->variant collective" (`runtime._varying` casts them before the checkpoint); 0.11.2
  replays each input as its own type.
"""

from __future__ import annotations

import concurrent.futures
import functools

import jax
import jax.numpy as jnp

__all__ = ["barrier_holds_cotangent", "replay_casts_inputs"]


@functools.cache
def barrier_holds_cotangent() -> bool:
    """Whether remat3's barrier before a checkpoint's replay holds the incoming cotangent as well
    as the region's inputs (one input here: a barrier over more)."""
    def step():
        region = jax.checkpoint(jnp.sin)
        return jax.grad(lambda x: jnp.sum(region(x) * x))

    jaxpr = _traced(step, jax.ShapeDtypeStruct((2,), jnp.float32))
    return any(e.primitive.name == "optimization_barrier" and len(e.invars) > 1 for e in jaxpr.eqns)


@functools.cache
def replay_casts_inputs() -> bool:
    """Whether remat3 replays a checkpoint's region on its inputs cast to one varying type: a
    region casting its invariant input to varying, inside a one-axis shard_map, raises there."""
    def step():
        region = jax.checkpoint(lambda w, x: jnp.sin(jax.lax.pcast(w, "i", to="varying") * x))

        def body(w, x):
            return jax.lax.psum(region(w, jax.lax.pcast(x, "i", to="varying")).sum(), "i")

        mesh = jax.sharding.AbstractMesh((1,), ("i",))
        return jax.grad(jax.shard_map(body, mesh=mesh, in_specs=(jax.P(), jax.P()), out_specs=jax.P()))

    a = jax.ShapeDtypeStruct((2,), jnp.float32)
    try:
        _traced(step, a, a)
    except ValueError as e:
        if "invariant->variant" in str(e):
            return True
        raise
    return False


def _traced(make, *args):
    """The jaxpr of the function `make()` returns, made and traced on `args` under remat3 (which
    `jax.checkpoint` reads when it wraps a function), on a thread of its own.  The runtime asks
    only with remat3 on, so the flag is not changed under another thread's trace."""
    old = bool(getattr(jax.config, "jax_remat3", False))
    jax.config.update("jax_remat3", True)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(lambda: jax.make_jaxpr(make())(*args)).result().jaxpr
    finally:
        jax.config.update("jax_remat3", old)
