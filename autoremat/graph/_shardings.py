"""Per-device sizes of a sharded step's values, as XLA's sharding propagation lays them out.

Only the arguments' shardings are known when tracing (`jax.jit`'s `in_shardings`, or the
shardings JAX's types carry); XLA's SPMD partitioner decides every other value's.  The rule
"a value is split as finely as its most split input" misses tensor parallelism (x split 4 ways
by rows times w split 2 ways by columns gives x @ w in 8 pieces, not 4; tests/test_graph.py);
on the 1B decoder under FSDP x TP it puts the forward values 4% under the step's layout.

So the training step (`value_and_grad` of the forward pass) is compiled once with every forward
value as an extra output (a scan body's values as extra stacked outputs of the scan), and each
output's sharding (`Compiled.output_shardings`, what propagation chose for it) gives the
value's per-device size.  The backward pass must be in the program: compiled alone, the
forward pass of `benchmarks/sharded.py`'s 1B decoder under FSDP left its attention values
replicated, 292017 MiB of forward values per device against the step's 65364
(`benchmarks/results/shard_sizes.md`).  One compile per signature, of about the step's size
(6-8 s of the sharded 1B's 9 s graph build on this 2-core CPU; memory-only options, as for the
planner's compiles; kept for later processes by `autoremat._compile_cache`).
"""

from __future__ import annotations

import jax
import jax.extend as jex
import numpy as np

from autoremat import _compile_cache
from autoremat._xla import MEMORY_ONLY_CPU_OPTIONS
from autoremat.graph._interpret import eval_eqn, eval_jaxpr, scan_counts
from autoremat.graph._trace import Traced, concrete_sharding, gradient_sharding

__all__ = ["propagated_divisors"]

_CACHE: dict = {}


def propagated_divisors(t: Traced) -> dict[tuple, float]:
    """`{(equation, output): factor}` for the top-level values of `t`'s jaxpr, and `{(scan
    equation, body equation, output): factor}` for the values of top-level scans' bodies: how
    many pieces XLA splits each into (1.0 replicated; a body value's as XLA lays out its stack
    over the iterations, which may be whole where the body's work is split, or, where the scan is
    unrolled entirely, one iteration's value, as there are no stacks); empty when no
    argument is sharded or the forward pass does not compile on its own (callers then fall back
    to their own estimate)."""
    shardings = [concrete_sharding(s) for s in (t.in_shardings or ())]
    if not any(s is not None for s in shardings):
        return {}
    key = t.signature
    if key not in _CACHE:
        _CACHE[key] = _compile_divisors(t, shardings)
    return _CACHE[key]


def _compile_divisors(t: Traced, shardings: list) -> dict[tuple, float]:
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(t.in_avals, shardings)]
    diff = [i for i, d in enumerate(t.diff_mask) if d]
    where: list[tuple] = []

    def step(*flat):
        def loss(*diff_args):
            full = list(flat)
            for i, a in zip(diff, diff_args):
                full[i] = a
            outs, values, where[:] = _forward_exposing(t.closed_jaxpr, full)
            return outs[0], values

        (_, values), grads = jax.value_and_grad(loss, argnums=tuple(range(len(diff))), has_aux=True)(
            *[flat[i] for i in diff])
        # laid out like their arguments, as the planner's compiled steps lay them out
        # (`runtime._validate.gradient_layouts`): the backward pass's layout moves the forward values'
        return values, [g if (s := gradient_sharding(shardings[i])) is None else jax.lax.with_sharding_constraint(g, s)
                        for i, g in zip(diff, grads)]

    try:
        lowered = jax.jit(step).lower(*args)
        options = MEMORY_ONLY_CPU_OPTIONS if jax.default_backend() == "cpu" else None  # read, never run
        key = _compile_cache.program_key(lowered)
        kept = _compile_cache.load("divisors", key, options)  # this program compiled by an earlier process
        if isinstance(kept, list) and len(kept) == len(where):
            return {w: float(f) for (w, _), f in zip(where, kept)}
        out = lowered.compile(options).output_shardings[0]
    except Exception:  # noqa: BLE001 - a layout we cannot compile alone: the caller's estimate stands
        return {}
    factors = [_factor(aval, s) for (_, aval), s in zip(where, out)]
    _compile_cache.store("divisors", key, factors, options)
    return {w: f for (w, _), f in zip(where, factors)}


def _forward_exposing(closed, flat) -> tuple[list, list, list]:
    """Evaluates the forward jaxpr: its outputs, every splittable top-level value and every value
    of a top-level scan's body (stacked over the iterations), and `((index...), aval)` of each."""
    jaxpr, env = closed.jaxpr, {}
    read = lambda v: v.val if isinstance(v, jex.core.Literal) else env[v]  # noqa: E731
    for v, x in zip(jaxpr.constvars, closed.consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, flat):
        env[v] = x
    values, where = [], []
    for i, eqn in enumerate(jaxpr.eqns):
        invals = [read(v) for v in eqn.invars]
        if eqn.primitive.name == "scan":
            whole_unroll = int(eqn.params.get("unroll", 1)) >= int(eqn.params["length"]) > 1  # no stacks
            outs, inner = _scan_exposing(eqn, invals, per_iteration=whole_unroll)
            for (k, j), (aval, x) in inner.items():
                values.append(x)
                # a stack's aval: its layout read with one iteration's shape said every body
                # value of the 8B scan under FSDP was whole (shard_shape refuses another rank)
                stacked = aval.update(shape=(eqn.params["length"], *aval.shape))
                where.append(((i, k, j), aval if whole_unroll else stacked))
        else:
            outs = eval_eqn(eqn, invals)
        for j, (v, x) in enumerate(zip(eqn.outvars, outs)):
            env[v] = x
            if _splittable(v.aval):
                values.append(x)
                where.append(((i, j), v.aval))
    return [read(v) for v in jaxpr.outvars], values, where


def _scan_exposing(eqn, invals, per_iteration: bool = False) -> tuple[list, dict]:
    """The scan of `eqn`, also returning its body's splittable values as stacked outputs:
    `(outputs, {(body equation, output): (per-iteration aval, stacked value)})`; with
    `per_iteration` (a scan unrolled entirely), one iteration's values instead
    (`_unrolled_exposing`)."""
    body = eqn.params["jaxpr"]
    n_consts, n_carry = scan_counts(eqn.params)
    consts, init, xs = invals[:n_consts], invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]
    picks = [((k, j), v.aval) for k, e in enumerate(body.jaxpr.eqns) for j, v in enumerate(e.outvars)
             if _splittable(v.aval)]

    def step(carry, x):
        got = {}

        def keep(k, e, outs):
            got.update({(k, j): o for j, o in enumerate(outs)})
            return outs

        outs = eval_jaxpr(body.jaxpr, body.consts, [*consts, *carry, *x], inline=False, on_eqn=keep)
        return outs[:n_carry], (outs[n_carry:], [got[p] for p, _ in picks])

    if per_iteration:
        return _unrolled_exposing(step, list(init), list(xs), eqn.params, picks)
    carry, (ys, inner) = jax.lax.scan(step, list(init), list(xs), length=eqn.params["length"],
                                      reverse=eqn.params["reverse"])
    return [*carry, *ys], {p: (aval, x) for (p, aval), x in zip(picks, inner)}


def _unrolled_exposing(step, carry, xs, params, picks) -> tuple[list, dict]:
    """A scan unrolled entirely (`unroll` at least its length, as penzai's `LayerStack` scans),
    evaluated iteration by iteration as XLA sees it: its body's values exposed as the middle
    iteration's, not stacked.  Stacked as outputs, XLA laid out 119 of penzai's 159 body values
    whole under FSDP (its attention scores 1 GiB a device each), and the model put
    `dots_saveable` on the body at 38.52 GiB a device where it compiles to 14.09; one iteration's
    split 112 of them 8 ways.  On a rolled scan the stacks' layouts are the program's: the 8B
    decoder keeps 85 of its 101 whole (docs/FINDINGS.md, twenty-third and twenty-fourth sessions)."""
    length = int(params["length"])
    order = range(length - 1, -1, -1) if params["reverse"] else range(length)
    ys_at, mid = {}, None
    for t in order:
        carry, (ys, inner) = step(carry, [a[t] for a in xs])
        ys_at[t] = ys
        if t == length // 2:
            mid = inner
    ys = [jax.numpy.stack([ys_at[t][k] for t in range(length)]) for k in range(len(ys_at[0]))]
    return [*carry, *ys], {p: (aval, x) for (p, aval), x in zip(picks, mid)}


def _splittable(aval) -> bool:
    shape = getattr(aval, "shape", None)
    return bool(shape) and np.prod(shape) > 1 and not jax.dtypes.issubdtype(aval.dtype, jax.dtypes.extended)


def _factor(aval, sharding) -> float:
    try:
        part = float(np.prod(sharding.shard_shape(tuple(aval.shape))))
    except Exception:  # noqa: BLE001 - an unusual sharding type: count the value whole
        return 1.0
    return max(1.0, float(np.prod(aval.shape)) / part) if part else 1.0
