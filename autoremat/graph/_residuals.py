"""Which values the backward pass needs, derived from JAX's own linearization.

Two views:

* `eqn_residuals(eqn, diff_mask)`: linearize ONE equation with `jax.linearize` and read off
  which of its inputs and outputs the linear (backward) part keeps, and how many bytes of
  new values it creates (for `tanh`, JAX keeps `1 - y**2`).  Results are cached by the
  equation's signature, so a 48-layer model costs the linearization of one layer.
* `function_residuals(fn, args)`: the residuals of the whole function's un-optimized
  linearization, exactly what `jax.ad_checkpoint.print_saved_residuals` prints, with the
  equation of the linearized jaxpr that produced each one (to cost its recomputation).

No list of primitives is written by hand: both views ask JAX.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import jax
import jax.extend as jex
from jax.extend import source_info_util
from jax.sharding import PartitionSpec as P

from autoremat.graph._costs import aval_bytes
from autoremat.graph._interpret import eval_eqn, user_name
from autoremat.graph._shard_map import aval_varying

__all__ = ["EqnResiduals", "eqn_residuals", "FunctionResidual", "function_residuals", "linearized_in"]


@dataclass(frozen=True)
class EqnResiduals:
    """What the backward pass of one equation reads.

    Attributes:
      inputs: per input, whether the backward pass reads it.
      outputs: per output, whether the backward pass reads it.
      extra_bytes: bytes of values the linearization creates that are not inputs or
        outputs of the equation (e.g. `1 - tanh(x)**2`), per execution.
      extra_avals: their abstract values.
    """

    inputs: tuple[bool, ...]
    outputs: tuple[bool, ...]
    extra_bytes: int
    extra_avals: tuple = ()


_CACHE: dict = {}
_MESH: ContextVar = ContextVar("autoremat_linearized_in", default=None)  # `linearized_in`


def _literal_key(v):
    try:
        return ("lit", str(v.aval), str(v.val))
    except Exception:  # pragma: no cover - defensive
        return ("lit", id(v))


def _cache_key(eqn, diff_mask):
    try:
        params = tuple(sorted((k, v) for k, v in eqn.params.items()))
        key = (eqn.primitive, params,
               tuple(_literal_key(v) if isinstance(v, jex.core.Literal) else ("var", v.aval) for v in eqn.invars),
               _var_pattern(eqn), tuple(diff_mask))
        mesh = _MESH.get()
        key = (*key, None if mesh is None else tuple(mesh.shape.items()))
        hash(key)
        return key
    except TypeError:
        return None


def _var_pattern(eqn):
    """Which inputs are the same variable (mul x x differs from mul x y)."""
    seen = {}
    return tuple(seen.setdefault(id(v), len(seen)) if not isinstance(v, jex.core.Literal) else -1
                 for v in eqn.invars)


@contextlib.contextmanager
def linearized_in(mesh):
    """Equations linearized meanwhile are a shard_map's body over `mesh` (None: not one): their
    collectives bind only there (`graph.shard_map_body`)."""
    token = _MESH.set(mesh)
    try:
        yield
    finally:
        _MESH.reset(token)


def _linearized(lin, avals):
    """The jaxpr of `lin` on `avals`; inside `linearized_in(mesh)`, traced inside a shard_map
    over `mesh` (its collectives bind there), each argument typed as varying over the mesh axes
    its value in the shard_map's body varies over (their checks read it)."""
    mesh = _MESH.get()
    plain = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    if mesh is None:
        return jax.make_jaxpr(lin)(*plain).jaxpr
    got = []

    def body(*xs):
        typed = [jax.lax.pcast(x, tuple(axes), to="varying") if (axes := aval_varying(a)) else x
                 for x, a in zip(xs, avals)]
        got.append(jax.make_jaxpr(lin)(*typed).jaxpr)
        return jax.numpy.zeros(())

    jax.make_jaxpr(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P()))(*plain)
    return got[0]


def eqn_residuals(eqn, diff_mask: Sequence[bool]) -> EqnResiduals:
    """Linearizes one equation and reports which of its values the backward pass reads.

    Args:
      eqn: a `jax.extend.core.JaxprEqn`.
      diff_mask: per input of `eqn`, whether a tangent flows into it.
    """
    n_in, n_out = len(eqn.invars), len(eqn.outvars)
    if not any(diff_mask):
        return EqnResiduals((False,) * n_in, (False,) * n_out, 0)
    key = _cache_key(eqn, diff_mask)
    if key is not None and key in _CACHE:
        return _CACHE[key]
    result = _linearize_eqn(eqn, diff_mask)
    if key is not None:
        _CACHE[key] = result
    return result


def _linearize_eqn(eqn, diff_mask) -> EqnResiduals:
    uvars, positions = [], {}
    for v in eqn.invars:
        if not isinstance(v, jex.core.Literal) and id(v) not in positions:
            positions[id(v)] = len(uvars)
            uvars.append(v)
    diff_u = sorted({positions[id(v)] for v, d in zip(eqn.invars, diff_mask)
                     if d and not isinstance(v, jex.core.Literal)})

    def run(xs):
        invals = [v.val if isinstance(v, jex.core.Literal) else xs[positions[id(v)]] for v in eqn.invars]
        return eval_eqn(eqn, invals)

    def lin(*xs):
        def h(*d):
            full = list(xs)
            for i, di in zip(diff_u, d):
                full[i] = di
            return run(full)

        out, f_lin = jax.linearize(h, *[xs[i] for i in diff_u])
        return out, f_lin

    jaxpr = _linearized(lin, [v.aval for v in uvars])
    primal_outs = jaxpr.outvars[: len(eqn.outvars)]
    residuals = jaxpr.outvars[len(eqn.outvars):]
    inv_index = {id(v): i for i, v in enumerate(jaxpr.invars)}
    out_index = {id(v): i for i, v in enumerate(primal_outs) if not isinstance(v, jex.core.Literal)}
    used_u, used_out, extras, seen = set(), set(), [], set()
    for r in residuals:
        if isinstance(r, jex.core.Literal) or id(r) in seen:
            continue
        seen.add(id(r))
        if id(r) in inv_index:
            used_u.add(inv_index[id(r)])
        elif id(r) in out_index:
            used_out.add(out_index[id(r)])
        elif r in jaxpr.constvars:
            continue
        else:
            extras.append(r.aval)
    inputs = tuple((not isinstance(v, jex.core.Literal)) and positions[id(v)] in used_u for v in eqn.invars)
    outputs = tuple(i in used_out for i in range(len(eqn.outvars)))
    return EqnResiduals(inputs, outputs, sum(aval_bytes(a) for a in extras), tuple(extras))


@dataclass(frozen=True)
class FunctionResidual:
    """One residual of the whole function's un-optimized linearization.

    Attributes:
      aval: its abstract value.
      nbytes: its size in bytes (global; see the graph for per-device sizes).
      source: where it comes from, as `print_saved_residuals` says it.
      primitive: the producing primitive ('argument' for function inputs).
      location: `file:line (function)` of the producing equation, '' for arguments.
      name: its `checkpoint_name`, if any.
      recompute_flops: FLOPs to recompute it from the function's inputs (its backward
        slice in the linearized jaxpr, each equation counted once).
      arg_index: the flat argument index when the residual is an argument.
    """

    aval: object
    nbytes: int
    source: str
    primitive: str
    location: str
    name: str | None
    recompute_flops: float
    arg_index: int | None = None


def function_residuals(traced) -> list[FunctionResidual]:
    """The residuals JAX keeps for `traced`'s un-optimized linearization.

    Mirrors `jax._src.ad_checkpoint.saved_residuals`, with the equation behind each row.
    """
    from autoremat.graph._costs import eqn_cost  # local: avoid an import cycle in docs builds

    jaxpr, consts = traced.closed_jaxpr.jaxpr, traced.closed_jaxpr.consts
    diff = [i for i, d in enumerate(traced.diff_mask) if d]

    def f(*xs):
        def h(*d):
            full = list(xs)
            for i, di in zip(diff, d):
                full[i] = di
            return jex.core.jaxpr_as_fun(jex.core.ClosedJaxpr(jaxpr, consts))(*full)

        return jax.linearize(h, *[xs[i] for i in diff])[1]

    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.invars]
    lj = jax.make_jaxpr(f)(*avals).jaxpr
    producer = {}
    for e in lj.eqns:
        for v in e.outvars:
            producer[id(v)] = e
    named = {}
    for e in lj.eqns:
        uname = user_name(e)
        if uname is not None:
            for v in e.invars:
                named[id(v)] = uname
            for v in e.outvars:
                named[id(v)] = uname
    inv = {id(v): i for i, v in enumerate(lj.invars)}
    flops_cache: dict[int, float] = {}
    rows, seen = [], set()
    for r in lj.outvars:
        if isinstance(r, jex.core.Literal):
            rows.append(FunctionResidual(r.aval, aval_bytes(r.aval), "from a literal", "literal", "", None, 0.0))
            continue
        if id(r) in seen:
            continue
        seen.add(id(r))
        if id(r) in inv:
            i = inv[id(r)]
            rows.append(FunctionResidual(r.aval, aval_bytes(r.aval), f"from the argument {traced.arg_names[i]}",
                                         "argument", "", None, 0.0, i))
            continue
        if r in lj.constvars:
            rows.append(FunctionResidual(r.aval, aval_bytes(r.aval), "from a constant", "constant", "", None, 0.0))
            continue
        e = producer[id(r)]
        loc = source_info_util.summarize(e.source_info)
        name = named.get(id(r))
        prim = e.primitive.name
        src = f"named '{name}' from {loc}" if name else f"output of {prim} from {loc}"
        rows.append(FunctionResidual(r.aval, aval_bytes(r.aval), src, prim, loc, name,
                                     _slice_flops(r, producer, eqn_cost, flops_cache)))
    return rows


def _slice_flops(var, producer, eqn_cost, cache) -> float:
    """FLOPs of every equation `var` transitively depends on (each counted once)."""
    seen, stack, total = set(), [var], 0.0
    while stack:
        v = stack.pop()
        e = producer.get(id(v))
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if id(e) not in cache:
            cache[id(e)] = eqn_cost(e).flops
        total += cache[id(e)]
        stack.extend(x for x in e.invars if not isinstance(x, jex.core.Literal))
    return total
