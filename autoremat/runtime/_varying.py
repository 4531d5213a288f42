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

JAX 0.11 replays each input as its own type (`replay_casts_inputs`, asked of JAX once a
process), and nothing is cast there either: a cast part whose results are used after the region
is evaluated outside it, and where that part takes a collective's result (the residual stream
of a tensor-parallel layer) that is the whole layer, which then keeps all it makes (the (2, 2)
tensor-parallel stack of `tests/test_shard_map.py` at `nothing_saveable` per layer: 5802196
bytes, as un-optimized, where jax 0.11.2's own per-layer checkpoint compiles to 3213780).
"""

from __future__ import annotations

import jax.extend as jex
from networkx.utils import UnionFind

from autoremat.graph._interpret import eval_eqn
from autoremat.graph._shard_map import aval_varying, cast_to_vary, varying_axes
from autoremat.graph._trace import remat3_enabled
from autoremat.runtime._remat3 import replay_casts_inputs

__all__ = ["cast_varying", "evaluated"]

# Primitives whose result's type is not their operands' (collectives and casts): an invariant
# value they take leaves its part another way than by a `pvary`.
_COLLECTIVES = frozenset({"psum", "pmax", "pmin", "psum_invariant", "all_gather", "all_gather_invariant",
                          "reduce_scatter", "all_to_all", "ppermute", "pbroadcast", "pcast", "pvary"})


def cast_varying(eqns, ins, vals, outs=(), fixed=()) -> tuple[list, dict]:
    """The values `vals` of the inputs `ins` of `eqns` (a checkpoint's region or a scan's body,
    whose results `outs` are used after it; `fixed`: its other inputs, a scan's carry, which
    keep their type): under jax_remat3, those in a castable part (`_castable`) cast to vary
    over all the axes the checkpoint's inputs vary over, else as they are; and the results in
    `outs` of the parts cast, evaluated here on the values as they were, for the caller to use
    in place of the region's (cast in it, they would vary more)."""
    if not (remat3_enabled() and any(e.primitive.name == "pvary" for e in eqns) and replay_casts_inputs()):
        return list(vals), {}
    every = frozenset().union(*(aval_varying(v.aval) for v in [*ins, *fixed]))
    cast, early = _castable(eqns, outs, every, fixed)
    vals = list(vals)
    out = [cast_to_vary(x, sorted(every)) if v in cast else x for v, x in zip(ins, vals)]
    return out, _evaluated_early(eqns, early, dict(zip(ins, vals)))


def _castable(eqns, outs, every: frozenset, fixed=()) -> tuple[set, list]:
    """The variables of `eqns` that vary over fewer of the axes `every` (short) and whose part
    (the short values joined by the equations between them) is left only by `pvary`s to all of
    `every` (and by results in `outs`); and those results.  A part left any other way (a
    collective, an equation with a jaxpr inside, a value not short that is no `pvary`'s) or
    holding a `fixed` input is not cast: the `pvary`s out of it would give what they give, and
    that way out something else."""
    parts, ways = UnionFind(), {}

    def short(v) -> bool:
        return not isinstance(v, jex.core.Literal) and aval_varying(v.aval) != every

    def leaves(u, ok: bool):
        ways.setdefault(parts[u], set()).add(ok)

    for e in eqns:
        inv = [u for u in e.invars if short(u)]
        outs_e = [o for o in e.outvars if not isinstance(o, jex.core.DropVar)]
        if not inv:
            continue
        if e.primitive.name != "pvary" and not _plain(e):
            through = _cast_in_scan(e, every)
            for u in inv:
                leaves(u, u in through)
        elif all(short(o) for o in outs_e):
            parts.union(*inv, *outs_e)
        else:
            for u in inv:
                leaves(u, e.primitive.name == "pvary")
    for v in fixed:
        if short(v):
            leaves(v, False)
    by_part: dict = {}
    for root, got in ways.items():
        by_part.setdefault(parts[root], set()).update(got)
    cast = {v for v in parts if by_part.get(parts[v]) == {True}}
    return cast, [v for v in outs if not isinstance(v, jex.core.Literal) and v in cast]


def _cast_in_scan(e, every: frozenset) -> set:
    """The operands of scan `e` (of a planned scan's body) that its own body would cast
    (`_castable`, recursively): constants whose part there is left only by `pvary`s to all of
    `every`.  Cast before the outer checkpoint, they reach the inner scan varying, which
    `apply` re-issues so that its casts are the identity (`_apply._replayed_varying`): the LSTM
    written per device, its weights cast to varying in each step's cell
    (tests/test_nested_scans.py)."""
    if e.primitive.name != "scan":
        return set()
    body, nc = e.params["jaxpr"].jaxpr, int(e.params["num_consts"])
    ncar = int(e.params["num_carry"])
    cast, early = _castable(body.eqns, body.outvars, every, body.invars[nc:nc + ncar])
    return {u for u, b in zip(e.invars[:nc], body.invars[:nc]) if b in cast and b not in early}


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


def evaluated(eqn, vals) -> list:
    """`eqn` on `vals`.  A `pvary` casts only over the axes its operands do not vary over
    already (`cast_varying`'s values): over none, it is the identity.  Under jax_remat3, where
    an operand varies over more axes than when traced (a cast value), the others are cast to
    its axes first, as JAX's own operations cast them (the region's own values meeting cast
    ones)."""
    if eqn.primitive.name == "pvary":
        axes = tuple(eqn.params.get("axes", ()))
        if any(set(axes) & varying_axes(x) for x in vals):
            return [cast_to_vary(x, axes) for x in vals]
        return eval_eqn(eqn, vals)
    if remat3_enabled() and _plain(eqn):
        vals = _matched(eqn, vals)
    return eval_eqn(eqn, vals)


def _matched(eqn, vals) -> list:
    """`vals` as typed when traced, or, where one varies over more axes than it did (a cast
    value), every one cast to vary over all their axes."""
    have = [varying_axes(x) for x in vals]
    if have == [frozenset() if isinstance(v, jex.core.Literal) else aval_varying(v.aval) for v in eqn.invars]:
        return list(vals)
    return [cast_to_vary(x, sorted(frozenset().union(*have))) for x in vals]


def _plain(eqn) -> bool:
    """Neither a collective nor a cast (`_COLLECTIVES`), nor an equation with a jaxpr inside."""
    return eqn.primitive.name not in _COLLECTIVES and not any(jex.core.jaxprs_in_params(eqn.params))
