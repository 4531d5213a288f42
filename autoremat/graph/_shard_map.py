"""Planning inside a `shard_map`: its body as the function the planner sees.

A training step written per device (`jax.shard_map(per_device_loss, ...)` with the gradients'
mean taken by a collective, as data-parallel and hand-sharded code does) is one opaque equation
at the top level of its jaxpr: no layer, no region, no value to save or recompute.  Where one
shard_map holds every matmul of the step, `shard_map_body` returns a `Traced` of its body
instead, re-traced inside the same shard_map so that nested `jit` calls and the user's own
checkpoints are inlined as `graph.trace` inlines them at the top level.  Its values have
per-device shapes (the body's), so the graph needs no sharding propagation; every plan the
planner makes on it is realized inside a shard_map rebuilt from the same parameters
(`runtime.run_plan`), and every compile that judges it is of the whole step.

`rebuilt(eqn, body)`: that shard_map, with `body` in place of the traced one.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import jax
import jax.extend as jex

from autoremat.graph._costs import eqn_matmul_flops, jaxpr_matmul_flops
from autoremat.graph._interpret import eval_jaxpr
from autoremat.graph._trace import Traced, structure_fingerprint, unmarked

__all__ = ["shard_map_body", "rebuilt", "body_mesh", "varying_axes", "aval_varying", "cast_to_vary"]


def shard_map_body(t: Traced) -> Traced | None:
    """The body of the one top-level shard_map of `t` that holds all of its matmuls (and at
    least one), as a `Traced` whose `outer` is `t`; None where there is no such shard_map, or
    where its parameters are not the ones `rebuilt` knows (jax 0.10's; then it stays one
    opaque equation, as before)."""
    k = _the_shard_map(t.jaxpr)
    if k is None:
        return None
    try:
        return _body_traced(t, k)
    except (KeyError, TypeError):
        return None


def rebuilt(eqn, body):
    """The shard_map of `eqn` (its mesh, specs, checks and manual axes) around `body`."""
    p = eqn.params
    kw = {}
    if "check_vma" in p:
        kw["check_vma"] = p["check_vma"]
    axes = p.get("newly_manual_axes", p.get("manual_axes"))
    if axes is not None:
        kw["axis_names"] = set(axes)
    return jax.shard_map(body, mesh=p["mesh"], in_specs=tuple(p["in_specs"]), out_specs=tuple(p["out_specs"]),
                         **kw)


def body_mesh(t: Traced):
    """The mesh of the shard_map whose body `t` is (None where `t` is not one)."""
    return t.outer.jaxpr.eqns[t.inside].params["mesh"] if t.outer is not None else None


def varying_axes(x) -> frozenset:
    """The manual mesh axes a value inside a shard_map is typed as varying over; empty outside one."""
    return aval_varying(jax.typeof(x))


def cast_to_vary(x, axes):
    """`x` cast to vary over each of the mesh axes `axes` it does not vary over already, in
    their order (the identity where it varies over them all)."""
    have = varying_axes(x)
    return jax.lax.pcast(x, tuple(a for a in axes if a not in have), to="varying")


def aval_varying(aval) -> frozenset:
    """`varying_axes` of an abstract value (jax 0.10: `aval.mat.varying`; `aval.vma` where that
    is the form)."""
    mat = getattr(aval, "mat", None)
    return frozenset(getattr(mat, "varying", None) or getattr(aval, "vma", None) or ())


def _the_shard_map(jaxpr) -> int | None:
    """The index of the top-level shard_map equation holding every matmul FLOP, or None."""
    total = jaxpr_matmul_flops(jaxpr)
    found = [i for i, e in enumerate(jaxpr.eqns) if e.primitive.name == "shard_map"]
    if total <= 0 or len(found) != 1:
        return None
    return found[0] if eqn_matmul_flops(jaxpr.eqns[found[0]]) >= total else None


def _body_traced(t: Traced, k: int) -> Traced | None:
    eqn = t.jaxpr.eqns[k]
    marks: list = []
    body = eqn.params["jaxpr"]

    def inlined(*xs):
        return tuple(eval_jaxpr(body, (), xs, marks=marks))

    outer = jax.make_jaxpr(rebuilt(eqn, inlined))(*[_arg(v.aval) for v in eqn.invars])
    inner_eqn = next(e for e in outer.jaxpr.eqns if e.primitive.name == "shard_map")
    if len(inner_eqn.invars) != len(eqn.invars):  # re-tracing hoisted constants into operands
        return None
    closed, regions = unmarked(jex.core.ClosedJaxpr(inner_eqn.params["jaxpr"], ()), marks)
    diff = _differentiated(t.jaxpr, k, t.diff_mask)
    names = tuple(_operand_name(t, v, j) for j, v in enumerate(eqn.invars))
    h = hashlib.sha256(f"{structure_fingerprint(closed.jaxpr)} in shard_map {k} of {t.fingerprint}".encode())
    return replace(t, closed_jaxpr=closed, in_avals=tuple(v.aval for v in closed.jaxpr.invars), arg_names=names,
                   diff_mask=diff, fingerprint=h.hexdigest()[:16], in_shardings=(),
                   user_checkpoints=len(marks), user_regions=regions, outer=t, inside=k)


def _arg(aval):
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=getattr(aval, "sharding", None))


def _differentiated(jaxpr, k: int, diff_mask) -> tuple[bool, ...]:
    """Per operand of equation `k`: whether it depends on a differentiated input."""
    diff = {v for v, d in zip(jaxpr.invars, diff_mask) if d}
    for eqn in jaxpr.eqns[:k]:
        if any(not isinstance(v, jex.core.Literal) and v in diff for v in eqn.invars):
            diff.update(eqn.outvars)
    return tuple(not isinstance(v, jex.core.Literal) and v in diff for v in jaxpr.eqns[k].invars)


def _operand_name(t: Traced, v, j: int) -> str:
    """The function argument an operand is, by name, else its position in the shard_map."""
    for u, name in zip(t.jaxpr.invars, t.arg_names):
        if u is v:
            return name
    return f"shard_map operand {j}"
