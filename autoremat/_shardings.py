"""Where each argument's sharding comes from, so that budgets are per device, also inside `jax.jit`.

Budgets are per device everywhere.  Eagerly, an argument is a `jax.Array` that knows its
sharding.  Inside `jax.jit` it is a tracer, and JAX exposes its sharding in the abstract value
only on meshes with explicit axes (`jax.make_mesh` makes them by default in jax 0.10; the spec
is then authoritative).  On a mesh with `Auto` axes (`jax.sharding.Mesh(...)`) the abstract value
names the mesh but not how the array is laid out on it, so the per-device sizes cannot be known:
`ShardingUnknownError` then says to pass `in_shardings=` (as for `jax.jit`), or to plan once
outside `jit`.  An abstract mesh is made concrete on this process's first devices: XLA's
per-device memory figures do not depend on which devices they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from autoremat._errors import ShardingUnknownError
from autoremat.graph._trace import concrete_sharding

__all__ = ["abstract_arguments"]


def abstract_arguments(args: Sequence[Any], kwargs: dict, static_argnums: Sequence[int],
                       in_shardings: Sequence[Any] | None, fn_name: str = "fn"):
    """`(args, kwargs)` as `jax.ShapeDtypeStruct`s carrying per-argument shardings (static ones kept)."""
    if in_shardings is not None and len(in_shardings) != len(args):
        raise ShardingUnknownError(
            f"in_shardings has {len(in_shardings)} entries but {fn_name} was called with {len(args)} positional "
            f"arguments; give one sharding (or pytree of shardings, or None) per positional argument")
    static = set(static_argnums)
    out = []
    for i, a in enumerate(args):
        if i in static:
            out.append(a)
            continue
        given = None if in_shardings is None else in_shardings[i]
        out.append(_abstract_tree(a, given, f"{fn_name} argument {i}"))
    kw = jax.tree_util.tree_map(lambda x: _abstract(x, None, f"{fn_name} keyword argument"), kwargs)
    return tuple(out), kw


def _abstract_tree(arg, given, where: str):
    if given is None or isinstance(given, jax.sharding.Sharding):
        return jax.tree_util.tree_map(lambda x: _abstract(x, given, where), arg)
    try:
        return jax.tree_util.tree_map(lambda x, s: _abstract(x, s, where), arg, given)
    except ValueError as e:
        raise ShardingUnknownError(f"in_shardings for {where} does not match its structure: {e}") from None


def _abstract(x, given, where: str):
    sharding = given if given is not None else _own_sharding(x, where)
    shape, dtype = jax.numpy.shape(x), jax.numpy.result_type(x)
    if isinstance(x, jax.ShapeDtypeStruct) and sharding is None:
        return x
    try:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
    except Exception:
        return jax.ShapeDtypeStruct(shape, dtype)


def _own_sharding(x, where: str):
    """The sharding an argument leaf carries itself (None: one device, or unsharded)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x.sharding
    if not isinstance(x, jax.core.Tracer):
        return getattr(x, "sharding", None)
    s = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(s, "mesh", None)
    if s is None or mesh is None or mesh.empty or mesh.size == 1:
        return None
    explicit = jax.sharding.AxisType.Explicit
    if any(t != explicit for t in mesh.axis_types):
        raise ShardingUnknownError(
            f"{where} is traced by jax.jit on a {dict(zip(mesh.axis_names, mesh.axis_sizes))} mesh whose axes are not "
            f"Explicit, so JAX does not say how it is sharded and per-device budgets cannot be planned; pass "
            f"in_shardings=... to autoremat.optimize (the shardings you give jax.jit), call the optimized function "
            f"once outside jit, or build the mesh with jax.make_mesh(..., axis_types=(AxisType.Explicit, ...))")
    return concrete_sharding(s)
