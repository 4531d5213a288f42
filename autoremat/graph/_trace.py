"""Tracing a user function to one flat jaxpr that plans refer to.

`trace(fn, args)` flattens pytree arguments, closes over static arguments, traces with
`jax.make_jaxpr`, and re-traces through `_interpret.eval_jaxpr` so that nested `jit`
calls and existing `jax.checkpoint` regions are inlined: every equation a plan talks about
is then a top-level equation (or one inside a `scan`/`while`/`cond` body).  Where each of the
user's checkpoints went is kept (`Traced.user_regions`), so that a plan can keep it.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.extend as jex
import numpy as np
from jax.extend import source_info_util

from autoremat._errors import ShardingUnknownError, UnsupportedFunctionError
from autoremat.graph._interpret import USER_CHECKPOINT_SCOPE, eval_jaxpr

__all__ = ["Traced", "UserCheckpoint", "trace", "structure_fingerprint", "describe_eqn"]


@dataclass(frozen=True, eq=False)
class UserCheckpoint:
    """One of the user's own `jax.checkpoint` calls, inlined into top-level equations
    `[start, stop)`: what a plan that keeps it (`Plan.user_checkpoints`) wraps in
    `jax.checkpoint(policy=policy, prevent_cse=prevent_cse)` again; `where` is the call's
    source line.  (`jax.checkpoint` picks remat2 or remat3 when it wraps a function: one the user
    wrapped under the other `jax_remat3` setting than the plan runs under is made under the
    plan's.)"""

    start: int
    stop: int
    policy: Any
    prevent_cse: bool = True
    where: str = ""


@dataclass(frozen=True, eq=False)
class Traced:
    """A function traced for one argument signature.

    Attributes:
      closed_jaxpr: the flat (inlined) jaxpr over the flattened arguments.
      in_tree: pytree structure of `(args, kwargs)` with static arguments removed.
      out_tree: pytree structure of the output.
      in_avals: abstract values of the flat inputs.
      arg_names: a readable name per flat input (`params['w'][0]`, ...).
      diff_mask: which flat inputs are differentiated (the leaves of `argnums`).
      fingerprint: a hash of the jaxpr's structure (see `structure_fingerprint`).
    """

    closed_jaxpr: Any
    in_tree: Any
    out_tree: Any
    in_avals: tuple
    arg_names: tuple[str, ...]
    diff_mask: tuple[bool, ...]
    fingerprint: str
    in_shardings: tuple = ()
    argnums: tuple[int, ...] = (0,)
    static_argnums: tuple[int, ...] = ()
    has_aux: bool = False
    fn_code: tuple[str, int] | None = None  # (file, first line) of the traced function's code
    # How many of the user's own jax.checkpoint calls inlining removed (0 with inline=False).
    user_checkpoints: int = 0
    # Those of them a plan can keep, outermost first (`UserCheckpoint`; one whose body left no
    # equation, or equations not in one run, is not among them).
    user_regions: tuple = ()
    # Where this is the body of a shard_map the planner plans inside (`graph.shard_map_body`):
    # the trace of the whole function, and the index of that shard_map among its equations.
    outer: Any = None
    inside: int = -1
    # `jax_remat3` when traced: the same jaxpr's plans compile to other programs under the other
    # setting (remat3 ties each checkpoint to the backward pass, `runtime._checkpoint`).
    remat3: bool = False

    @property
    def signature(self) -> tuple:
        """What a plan, a compile or a measurement of this trace depends on: the jaxpr's
        structure, the inputs' types and their shardings (the same step on another mesh
        layout compiles to other per-device peaks); a shard_map's body's, with the whole
        function's; and `jax_remat3`, which the compiled programs depend on."""
        own = self.fingerprint, str(self.in_avals), tuple(str(s) for s in self.in_shardings), self.remat3
        return own if self.outer is None else (*own, self.outer.signature)

    def user_lines(self) -> list[int | None]:
        """Per top-level equation, the line of the traced function that issued it (None when
        the function's frame is not in the equation's traceback, or its code is unknown)."""
        if self.fn_code is None:
            return [None] * len(self.jaxpr.eqns)
        file, first = self.fn_code
        out = []
        for eqn in self.jaxpr.eqns:
            line = None
            tb = getattr(eqn.source_info, "traceback", None)
            for fr in (getattr(tb, "frames", None) or ()):
                if fr.file_name == file and fr.function_start_line == first:
                    line = fr.line_num
                    break
            out.append(line)
        return out

    @property
    def jaxpr(self):
        return self.closed_jaxpr.jaxpr


def _normalize_argnums(argnums, nargs: int) -> tuple[int, ...]:
    if isinstance(argnums, int):
        argnums = (argnums,)
    out = []
    for a in argnums:
        if not -nargs <= a < nargs:
            raise UnsupportedFunctionError(
                f"argnums {a} is out of range for a function called with {nargs} positional arguments")
        out.append(a % nargs)
    return tuple(out)


def split_static(args: Sequence[Any], static_argnums: Sequence[int]):
    """Returns (dynamic_args, static_positions->value)."""
    static = {i % len(args): args[i] for i in static_argnums} if args else {}
    dynamic = tuple(a for i, a in enumerate(args) if i not in static)
    return dynamic, static


def signature_key(args: Sequence[Any], kwargs: dict, static_argnums: Sequence[int], *,
                  shardings: bool = True) -> tuple:
    """What one traced signature is keyed by, everywhere (`optimize`'s plans, `apply`'s traces):
    the pytree structure, each leaf's shape, dtype and (with `shardings`) NamedSharding, and the
    static arguments (by value, or by identity when unhashable), and `jax_remat3` (a plan found
    under one setting is found again under the other: their programs' peaks differ)."""
    dynamic, static = split_static(args, static_argnums)
    leaves, treedef = jax.tree_util.tree_flatten((dynamic, kwargs))

    def leaf(x):
        s = leaf_sharding(x) if shardings else None
        return (tuple(np.shape(x)), str(jax.numpy.result_type(x)),
                repr(s) if isinstance(s, jax.sharding.NamedSharding) else "")

    return (treedef, tuple(leaf(x) for x in leaves), tuple(sorted((k, _static_key(v)) for k, v in static.items())),
            remat3_enabled())


def remat3_enabled() -> bool:
    """Whether `jax.checkpoint` stages JAX's remat3 implementation right now."""
    return bool(getattr(jax.config, "jax_remat3", False))


def _static_key(v):
    try:
        hash(v)
        return v
    except TypeError:
        return id(v)


def merge_static(dynamic: Sequence[Any], static: dict[int, Any]) -> tuple:
    it = iter(dynamic)
    n = len(dynamic) + len(static)
    return tuple(static[i] if i in static else next(it) for i in range(n))


def _path_name(path) -> str:
    return jax.tree_util.keystr(path)


def trace(fn, args: Sequence[Any], kwargs: dict | None = None, *, argnums=0,
          static_argnums: Sequence[int] = (), has_aux: bool = False, inline: bool = True,
          skip_integer_leaves: bool = True) -> Traced:
    """Traces `fn(*args, **kwargs)` to a flat jaxpr.

    Args:
      fn: the function to be differentiated.  It must return a scalar floating-point
        array (or `(scalar, aux)` with `has_aux=True`).
      args: positional arguments (pytrees of arrays or `jax.ShapeDtypeStruct`).
      kwargs: keyword arguments (pytrees; never differentiated).
      argnums: which positional arguments are differentiated (as in `jax.grad`).
      static_argnums: positional arguments closed over as Python values.
      has_aux: the function returns `(loss, aux)`.
      inline: inline nested `jit` calls and existing checkpoints.
      skip_integer_leaves: leave integer leaves of `argnums` undifferentiated, as
        `saved_residuals` does; False raises UnsupportedFunctionError, as `jax.grad` would
        (what `optimize` wants, before it plans).

    Raises:
      UnsupportedFunctionError: the output is not a scalar float, a value is not an array,
        or the function has side effects remat cannot replay.
    """
    kwargs = dict(kwargs or {})
    dynamic, static = split_static(tuple(args), static_argnums)
    # argnums refer to positions in the full argument list; map them to dynamic positions.
    argnums = _normalize_argnums(argnums, len(args))
    bad = [a for a in argnums if a in static]
    if bad:
        raise UnsupportedFunctionError(f"argument(s) {bad} are both differentiated (argnums) and static")
    dyn_positions = [i for i in range(len(args)) if i not in static]
    diff_dyn = {dyn_positions.index(a) for a in argnums}

    leaves_with_path, in_tree = jax.tree_util.tree_flatten_with_path((dynamic, kwargs))
    leaves = [leaf for _, leaf in leaves_with_path]
    names, diff_mask = _leaf_names_and_mask(leaves_with_path, dyn_positions, diff_dyn)
    _check_leaves(names, leaves, diff_mask, argnums, skip_integer_leaves)

    def flat_fn(*flat):
        dyn, kw = jax.tree_util.tree_unflatten(in_tree, flat)
        return fn(*merge_static(dyn, static), **kw)

    in_avals = tuple(jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=leaf_sharding(x))
                     if not isinstance(x, jax.ShapeDtypeStruct) else x for x in leaves)
    try:
        closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*in_avals)
    except TypeError as e:
        raise UnsupportedFunctionError(
            f"could not trace {getattr(fn, '__name__', fn)!r}: {e}. autoremat needs a function of "
            f"arrays that returns arrays") from e
    out_tree = jax.tree_util.tree_structure(out_shape)
    _check_output(fn, closed, out_shape, has_aux)
    n_checkpoints, regions = 0, ()
    if inline:
        n_checkpoints = count_inlined_checkpoints(closed.jaxpr)
        closed, regions = _inline(closed, in_avals)
    return Traced(closed, in_tree, out_tree, tuple(v.aval for v in closed.jaxpr.invars),
                  tuple(names), tuple(diff_mask), structure_fingerprint(closed.jaxpr),
                  tuple(leaf_sharding(x) for x in leaves), argnums, tuple(static_argnums), has_aux,
                  _code_of(fn), n_checkpoints, regions, remat3=remat3_enabled())


def _leaf_names_and_mask(leaves_with_path, dyn_positions, diff_dyn) -> tuple[list[str], list[bool]]:
    """Each flat argument leaf's name (`args[0]['w']`, `kwargs['x']`) and whether it is
    differentiated."""
    names, diff_mask = [], []
    for path, _ in leaves_with_path:
        if path[0].idx == 0:  # positional
            pos = path[1].idx
            names.append(f"args[{dyn_positions[pos]}]" + _path_name(path[2:]))
            diff_mask.append(pos in diff_dyn)
        else:
            names.append("kwargs" + _path_name(path[1:]))
            diff_mask.append(False)
    return names, diff_mask


def _check_leaves(names, leaves, diff_mask: list, argnums, skip_integer_leaves: bool) -> None:
    """Every leaf an array; differentiated ones floating point (else, with
    `skip_integer_leaves`, not differentiated: `diff_mask` is updated in place)."""
    for name, leaf in zip(names, leaves):
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise UnsupportedFunctionError(
                f"argument {name} is a {type(leaf).__name__}, not an array; mark it static with "
                f"static_argnums or pass it as a jax array")
    for k, (name, leaf, d) in enumerate(zip(names, leaves, list(diff_mask))):
        if d and not jax.dtypes.issubdtype(leaf.dtype, np.inexact):
            if skip_integer_leaves:
                diff_mask[k] = False
                continue
            # jax.grad would raise its own TypeError later, from inside planning.
            raise UnsupportedFunctionError(
                f"argument {name} has dtype {leaf.dtype}, but it is differentiated (argnums={sorted(argnums)}) "
                f"and jax.grad differentiates only floating-point arrays; pass it in an argument outside "
                f"argnums (or mark it static), or cast it to a float dtype")


def _check_output(fn, closed, out_shape, has_aux: bool) -> None:
    """A scalar floating-point loss (or `(loss, aux)`), and no side effects."""
    loss_shape = out_shape[0] if has_aux else out_shape
    if has_aux and not (isinstance(out_shape, tuple) and len(out_shape) == 2):
        raise UnsupportedFunctionError("has_aux=True needs fn to return a pair (loss, aux)")
    if not (hasattr(loss_shape, "shape") and loss_shape.shape == ()
            and jax.dtypes.issubdtype(loss_shape.dtype, np.floating)):
        raise UnsupportedFunctionError(
            f"{getattr(fn, '__name__', 'fn')} must return a scalar floating-point array to be "
            f"differentiated, got {jax.tree_util.tree_map(lambda s: f'{s.dtype}{list(s.shape)}', loss_shape)}; "
            f"reduce it to a scalar loss (or use has_aux=True for extra outputs)")
    if closed.jaxpr.effects:
        raise UnsupportedFunctionError(
            f"{getattr(fn, '__name__', 'fn')} has side effects {sorted(map(str, closed.jaxpr.effects))}; "
            f"jax.checkpoint would replay them during recomputation. Remove prints/callbacks/state "
            f"from the differentiated function")


def leaf_sharding(x):
    """An argument leaf's sharding: its own, or under `jax.jit` the one its abstract value
    carries on a mesh with Explicit axes (tracers have no `.sharding`)."""
    if not isinstance(x, jax.core.Tracer):
        return getattr(x, "sharding", None)
    s = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(s, "mesh", None)
    if mesh is None or mesh.empty or not any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return None
    return s


def concrete_sharding(s):
    """`s` with its abstract mesh made concrete on this process's first devices (XLA's
    per-device memory figures do not depend on which devices); None for no sharding or a
    mesh of one device."""
    mesh = getattr(s, "mesh", None)
    if mesh is None or mesh.empty or mesh.size == 1:
        return None
    if isinstance(mesh, jax.sharding.Mesh):
        return s
    devices = jax.devices()
    if len(devices) < mesh.size:
        raise ShardingUnknownError(
            f"the arguments are sharded over {mesh.size} devices but this process sees {len(devices)}")
    grid = np.array(devices[:mesh.size]).reshape(mesh.axis_sizes)
    return jax.sharding.NamedSharding(jax.sharding.Mesh(grid, mesh.axis_names, axis_types=mesh.axis_types), s.spec)


def gradient_sharding(s):
    """The sharding a gradient of a value sharded as `s` is constrained to (`runtime._validate.gradient_layouts`):
    `s` made concrete (`concrete_sharding`); None where there is nothing to constrain: no named sharding, one
    device, or explicit mesh axes (the gradient's type carries its sharding already)."""
    if not isinstance(s, jax.sharding.NamedSharding):
        return None
    s = concrete_sharding(s)
    if s is None or any(t == jax.sharding.AxisType.Explicit for t in getattr(s.mesh, "axis_types", ())):
        return None
    return s


def check_reverse_mode(t: Traced, fn_name: str = "fn") -> None:
    """Raises UnsupportedFunctionError if `jax.grad` cannot differentiate the traced function.

    Traces the gradient abstractly (no compile): a `lax.while_loop` on a differentiated value
    otherwise surfaces as JAX's ValueError from deep inside planning.
    """
    diff = [i for i, d in enumerate(t.diff_mask) if d]
    run = jex.core.jaxpr_as_fun(t.closed_jaxpr)

    def grad_of(*flat):
        def loss(*dv):
            args = list(flat)
            for i, v in zip(diff, dv):
                args[i] = v
            return run(*args)[0]
        return jax.grad(loss, argnums=tuple(range(len(diff))))(*[flat[i] for i in diff])

    try:
        jax.eval_shape(grad_of, *t.in_avals)
    except ValueError as e:
        if "Reverse-mode differentiation" not in str(e):
            raise
        raise UnsupportedFunctionError(
            f"{fn_name} cannot be differentiated in reverse mode: it runs a lax.while_loop (or a fori_loop "
            f"with traced bounds) on a differentiated value. Use lax.scan, or fori_loop with static bounds") from None


def count_inlined_checkpoints(jaxpr) -> int:
    """How many `jax.checkpoint` calls inlining `jaxpr` removes (through nested `jit` calls)."""
    from autoremat.graph._interpret import inner_jaxpr, is_inline, primitive_label

    n = 0
    for eqn in jaxpr.eqns:
        if is_inline(eqn):
            n += primitive_label(eqn) in ("checkpoint", "remat2")
            n += count_inlined_checkpoints(inner_jaxpr(eqn)[0])
    return n


def _code_of(fn) -> tuple[str, int] | None:
    """(file, first line) of the Python function behind `fn` (partials, wrappers, callables)."""
    for _ in range(8):
        code = getattr(fn, "__code__", None)
        if code is not None:
            return code.co_filename, code.co_firstlineno
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        elif hasattr(fn, "__func__"):
            fn = fn.__func__
        elif callable(fn) and hasattr(type(fn), "__call__") and hasattr(type(fn).__call__, "__code__"):
            fn = type(fn).__call__
        else:
            return None
    return None


def _inline(closed, in_avals):
    """The jaxpr with nested calls and the user's checkpoints inlined, and where each of those
    checkpoints went (`UserCheckpoint`, read from the name-stack scope `eval_jaxpr` marks them
    with, which is then removed)."""
    marks: list = []
    f = functools.partial(eval_jaxpr, closed.jaxpr, closed.consts, marks=marks)
    return unmarked(jax.make_jaxpr(lambda *a: f(a))(*in_avals), marks)


def unmarked(flat, marks: list):
    """`flat` (a jaxpr re-traced by `eval_jaxpr(marks=marks)`) without the scopes that mark the
    user's inlined checkpoints, and those checkpoints as `UserCheckpoint`s."""
    at: dict[int, list[int]] = {}
    eqns = []
    for i, eqn in enumerate(flat.jaxpr.eqns):
        stack = eqn.source_info.name_stack.stack
        ids = [_mark_index(s) for s in stack]
        for k in ids:
            if k is not None:
                at.setdefault(k, []).append(i)
        if any(k is not None for k in ids):
            kept = source_info_util.NameStack(tuple(s for s, k in zip(stack, ids) if k is None))
            eqn = eqn.replace(source_info=eqn.source_info.replace(name_stack=kept))
        eqns.append(eqn)
    regions = [UserCheckpoint(idx[0], idx[-1] + 1, *marks[k]) for k, idx in at.items()
               if idx[-1] - idx[0] + 1 == len(idx)]
    regions.sort(key=lambda r: (r.start, -r.stop))
    return jex.core.ClosedJaxpr(flat.jaxpr.replace(eqns=eqns), flat.consts), tuple(regions)


def _mark_index(scope) -> int | None:
    name = getattr(scope, "name", "")
    if isinstance(name, str) and name.startswith(USER_CHECKPOINT_SCOPE):
        return int(name[len(USER_CHECKPOINT_SCOPE):])
    return None


def describe_eqn(eqn) -> str:
    """A one-line description: `dot_general f32[8,16],f32[16,4] -> f32[8,4]`.

    `checkpoint_name` reads `name` with `jax_remat3` on and off, so plans carry over.
    """
    from autoremat.graph._interpret import primitive_label

    ins = ",".join(v.aval.str_short(short_dtypes=True) for v in eqn.invars)
    outs = ",".join(v.aval.str_short(short_dtypes=True) for v in eqn.outvars)
    return f"{primitive_label(eqn)} {ins} -> {outs}"


def _structure_lines(jaxpr, prefix=""):
    for i, eqn in enumerate(jaxpr.eqns):
        yield f"{prefix}{i}:{describe_eqn(eqn)}"
        for key in ("jaxpr", "call_jaxpr", "branches", "body_jaxpr", "cond_jaxpr"):
            sub = eqn.params.get(key)
            subs = sub if isinstance(sub, (tuple, list)) else [sub]
            for k, s in enumerate(subs):
                if s is None:
                    continue
                inner = s.jaxpr if isinstance(s, jex.core.ClosedJaxpr) else s
                if isinstance(inner, jex.core.Jaxpr):
                    yield from _structure_lines(inner, f"{prefix}{i}/{key}{k}/")


def structure_lines(jaxpr) -> list[str]:
    """The structural description a plan's fingerprint is computed from, one line per equation."""
    ins = ",".join(v.aval.str_short(short_dtypes=True) for v in jaxpr.invars)
    return [f"in:{ins}"] + list(_structure_lines(jaxpr))


def structure_fingerprint(jaxpr) -> str:
    """A short hash of the jaxpr's equations (primitives, shapes, nesting).

    Two traces of the same function with the same argument shapes have the same
    fingerprint; a changed model or other shapes do not.
    """
    h = hashlib.sha256("\n".join(structure_lines(jaxpr)).encode())
    return h.hexdigest()[:16]
