"""Inside a shard_map under `jax_remat3`: what is cast to varying before a checkpoint, and the
equations evaluated on the cast values.

Under jax_remat3 (jax 0.10.2) the backward pass of a checkpoint replays its region on its
inputs passed through one `optimization_barrier`, and the barrier casts them all to the most
varying input's type (`core.auto_insert_reshard`).  In a step written per device a layer's
inputs mix the activations (varying over the batch's axis) with replicated weights and
positions (invariant), so the replay sees those invariant inputs varying: their casts to
varying (the `pvary`s shard_map inserts where an invariant value meets a varying one) fail
("pvary is a invariant->variant collective": every decoder written per device), and so do
operations between them and values the region makes itself ("Primitive div requires varying
manual axes to match": penzai's rotary positions over a timescale made in the layer).  In plain
JAX too: a hand-written `nothing_saveable` layer of the 1B decoder written per device raises.

So a region is traced on what its replay will see.  Each invariant part of it (its values that
vary over no axis, joined by the equations between them) whose every way out is a `pvary` over
the same axes has its inputs cast to varying before the checkpoint (`cast_varying`); in the
region those `pvary`s are then the identity, and where a cast value meets one of the region's
own invariant values (a literal, a table made from `iota`), that value is cast as JAX's own
operations cast it (`evaluated`).  Both remat settings give the same gradients: each cast's
transpose, a psum, is the one the region's own casts had.  Under remat2 nothing is cast: a
stack of weights cast is a copy (92.79 against 77.40 GiB, the 8B scan written per device at
`nothing_saveable` on its body; docs/FINDINGS.md, thirty-third session).
"""

from __future__ import annotations

import jax
import jax.extend as jex
from networkx.utils import UnionFind

from autoremat.graph._interpret import eval_eqn
from autoremat.graph._shard_map import aval_varying, varying_axes
from autoremat.graph._trace import remat3_enabled

__all__ = ["cast_varying", "evaluated"]

# Primitives whose result's type is not their operands' (collectives and casts): an invariant
# value they take leaves its part another way than by a `pvary`.
_COLLECTIVES = frozenset({"psum", "pmax", "pmin", "psum_invariant", "all_gather", "all_gather_invariant",
                          "reduce_scatter", "all_to_all", "ppermute", "pbroadcast", "pcast", "pvary"})


def cast_varying(eqns, ins, vals, outs=()) -> tuple[list, dict]:
    """The values `vals` of the inputs `ins` of `eqns` (a checkpoint's region or a scan's body,
    whose results `outs` are used after it): under jax_remat3, those in a castable invariant
    part (`_castable`) cast to varying over the axes of its `pvary`s, else as they are; and the
    results in `outs` of the parts cast, evaluated here on the values as they were, for the
    caller to use in place of the region's (cast in it, they would vary)."""
    if not remat3_enabled() or not any(e.primitive.name == "pvary" for e in eqns):
        return list(vals), {}
    axes, early = _castable(eqns, outs)
    cast = [jax.lax.pcast(x, axes[v], to="varying") if v in axes and not _varies(x, axes[v]) else x
            for v, x in zip(ins, vals)]
    return cast, _evaluated_early(eqns, early, dict(zip(ins, vals)))


def _castable(eqns, outs) -> tuple[dict, list]:
    """Each invariant variable of `eqns` whose invariant part is left only by `pvary`s over one
    set of axes (and by results in `outs`), with those axes; and those results.  A part left
    any other way (a collective, an equation with a jaxpr inside) is not cast: the `pvary`s out
    of it would give what they give, and that way out something else."""
    parts, ways = UnionFind(), {}

    def leaves(u, way):
        ways.setdefault(parts[u], set()).add(way)

    for e in eqns:
        inv = [u for u in e.invars if _invariant(u)]
        outs_e = [o for o in e.outvars if not isinstance(o, jex.core.DropVar)]
        if not inv:
            continue
        if e.primitive.name == "pvary":
            for u in inv:
                leaves(u, tuple(e.params.get("axes", ())))
        elif (e.primitive.name in _COLLECTIVES or any(jex.core.jaxprs_in_params(e.params))
              or not all(_invariant(o) for o in outs_e)):
            for u in inv:
                leaves(u, None)
        else:
            parts.union(*inv, *outs_e)
    by_part: dict = {}
    for root, got in ways.items():
        by_part.setdefault(parts[root], set()).update(got)
    axes = {}
    for v in parts:
        got = by_part.get(parts[v], ())
        if len(got) == 1 and None not in got:
            axes[v] = next(iter(got))
    return axes, [v for v in outs if not isinstance(v, jex.core.Literal) and v in axes]


def _evaluated_early(eqns, early: list, env: dict) -> dict:
    """The variables `early`, evaluated from `env` by the equations of `eqns` they need."""
    need = set(early)
    if not need:
        return {}
    picked = []
    for e in reversed(eqns):
        if any(o in need for o in e.outvars):
            picked.append(e)
            need.update(u for u in e.invars if not isinstance(u, jex.core.Literal))
    env = dict(env)
    for e in reversed(picked):
        vals = evaluated(e, [u.val if isinstance(u, jex.core.Literal) else env[u] for u in e.invars])
        env.update((o, x) for o, x in zip(e.outvars, vals) if not isinstance(o, jex.core.DropVar))
    return {v: env[v] for v in early}


def _invariant(v) -> bool:
    return not isinstance(v, jex.core.Literal) and not aval_varying(v.aval)


def evaluated(eqn, vals) -> list:
    """`eqn` on `vals`: a `pvary` of values varying over its axes already (`cast_varying`) is
    the identity; under jax_remat3, operands varying over fewer axes than others (the
    region's own values meeting cast ones) are cast to the others' axes first."""
    axes = eqn.params.get("axes", ()) if eqn.primitive.name == "pvary" else ()
    if axes and all(_varies(x, axes) for x in vals):
        return list(vals)
    if remat3_enabled() and eqn.primitive.name not in _COLLECTIVES and not any(jex.core.jaxprs_in_params(eqn.params)):
        vals = _matched(eqn, vals)
    return eval_eqn(eqn, vals)


def _matched(eqn, vals) -> list:
    """`vals` as typed when traced, or, where one varies over more axes than it did (a cast
    value), every one cast to vary over all their axes."""
    have = [varying_axes(x) for x in vals]
    if have == [frozenset() if isinstance(v, jex.core.Literal) else aval_varying(v.aval) for v in eqn.invars]:
        return list(vals)
    every = frozenset().union(*have)
    return [jax.lax.pcast(x, tuple(sorted(every - h)), to="varying") if h != every else x for x, h in zip(vals, have)]


def _varies(x, axes) -> bool:
    return set(axes) <= varying_axes(x)
