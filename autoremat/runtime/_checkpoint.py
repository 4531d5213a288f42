"""The one place the runtime makes a `jax.checkpoint`, so that remat shows with `jax_remat3` on.

With `jax_remat3` off, `jax.checkpoint(prevent_cse=True)` lowers its backward pass behind an
optimization barrier over the region's inputs *and the incoming cotangent*: the recomputation
cannot start before the backward pass reaches the region.  With `jax_remat3` on (jax 0.10,
`RematTraced.vjp_bwd`) the barrier holds the inputs only, so nothing ties the recomputation to
the backward pass, and XLA:CPU's default scheduler runs it early, next to the forward pass.
Measured with `benchmarks/cpu_flags.py` (results in benchmarks/results/cpu_flags.md; 6-block
residual MLP, batch 2048, width 256/1024, compiled peak): no remat 96.0 MiB, per-block
`nothing_saveable` 56.0 MiB with remat3 off and 96.0 MiB with it on, under every XLA:CPU flag
set tried (the CSE flag, the scheduler flags, both).

`checkpoint` below restores remat2's ordering under remat3 with public APIs only: a
`jax.custom_vjp` whose forward pass is `jax.vjp` of the `jax.checkpoint` (so it keeps what the
policy saves) and whose backward pass first puts the saved residuals and the cotangent through
one `jax.lax.optimization_barrier`.  Same measurement, remat3 on: 56.0 MiB, gradients
bit-identical.  The cost is forward-mode differentiation: a `custom_vjp` has no JVP, so under
remat3 `jax.jvp`/`jax.hessian` of an optimized function raise; reverse mode, `jit` and `vmap`
work.  With remat3 off, `checkpoint` is `jax.checkpoint` itself, and so it is under remat3 where
JAX's own barrier holds the cotangent (jax 0.11.2: 56.0 MiB on the same MLP, remat3 on and off;
`runtime._remat3.barrier_holds_cotangent`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from autoremat.graph._shard_map import cast_to_vary, varying_axes
from autoremat.graph._trace import remat3_enabled
from autoremat.runtime._remat3 import barrier_holds_cotangent

__all__ = ["checkpoint", "remat3_enabled"]


def checkpoint(fn, *, policy, prevent_cse: bool):
    """`jax.checkpoint(fn, policy=..., prevent_cse=...)`, tied to the backward pass under remat3.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> f = checkpoint(lambda x: jnp.sin(x) * 2, policy=None, prevent_cse=True)
      >>> float(jax.grad(lambda x: f(x))(0.0))
      2.0
    """
    ck = jax.checkpoint(fn, policy=policy, prevent_cse=prevent_cse)
    if not remat3_enabled() or barrier_holds_cotangent():
        return ck
    return _tied(ck)


def _tied(ck):
    @jax.custom_vjp
    def region(*args):
        return ck(*args)

    def fwd(*args):
        return jax.vjp(ck, *args)

    def bwd(vjp_fn, ct):
        # float0 cotangents (integer outputs) cannot go through a barrier; they carry no data.
        res, res_tree = jax.tree_util.tree_flatten(vjp_fn)
        cts, ct_tree = jax.tree_util.tree_flatten(ct)
        leaves = res + cts
        real = [i for i, x in enumerate(leaves) if jnp.result_type(x) != jax.dtypes.float0]
        for i, x in zip(real, _held([leaves[i] for i in real], [i >= len(res) for i in real])):
            leaves[i] = x
        vjp_fn = jax.tree_util.tree_unflatten(res_tree, leaves[:len(res)])
        return vjp_fn(jax.tree_util.tree_unflatten(ct_tree, leaves[len(res):]))

    region.defvjp(fwd, bwd)
    return region


def _held(xs: list, is_ct: list) -> list:
    """`xs` (residuals and cotangents, `is_ct`) through `optimization_barrier`s.  Outside a
    shard_map, one.  Inside one, one per varying type: a barrier over values of several types
    casts them all to the most varying (`core.auto_insert_reshard`), and the backward pass
    would get a residual or a cotangent of another type than it was made for ("unexpected JAX
    type ... for argument to VJP function", the 8B scan written per device under remat3).  Each
    holds the residuals of its type with those cotangents that cast to it, so that still ties
    them to the backward pass."""
    types = [varying_axes(x) for x in xs]
    out = list(xs)
    for t in dict.fromkeys(types):
        own = [i for i, u in enumerate(types) if u == t]
        ties = [cast_to_vary(xs[i], sorted(t)) for i, u in enumerate(types) if is_ct[i] and u < t]
        held = jax.lax.optimization_barrier([xs[i] for i in own] + ties)
        for i, x in zip(own, held):
            out[i] = x
    return out
