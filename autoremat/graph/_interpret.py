"""A small jaxpr interpreter shared by the graph (inlining) and the runtime (plans).

It follows the `env` / `read` / `write` shape of equinox's jaxpr interpreters: equations
are re-bound one by one, with their source information kept, so that a re-traced jaxpr
still points at the user's code.  Call-like primitives listed in `INLINE_PRIMITIVES`
(`jit`, `closed_call`, an existing `jax.checkpoint`) are evaluated by recursing into their
jaxprs, which flattens them into the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.extend as jex
from jax.extend import source_info_util

__all__ = ["scan_counts", "INLINE_PRIMITIVES", "inner_jaxpr", "eval_eqn", "eval_jaxpr", "hi_kind", "user_name",
           "is_inline", "primitive_label", "checkpoint_params", "USER_CHECKPOINT_SCOPE"]

# Primitives that are pure calls: evaluating their body inline changes nothing but the
# structure.  `remat2`/`checkpoint` is an existing user checkpoint: inlined for planning, and
# kept or replaced by each plan (`Plan.user_checkpoints`).
INLINE_PRIMITIVES = frozenset({"jit", "pjit", "closed_call", "core_call", "remat2", "checkpoint"})
# The name-stack scope `eval_jaxpr(marks=...)` puts around the equations an inlined user
# checkpoint became (followed by its index in `marks`); `graph.trace` reads and removes it.
USER_CHECKPOINT_SCOPE = "autoremat-user-checkpoint-"


def scan_counts(params) -> tuple[int, int]:
    """(number of consts, number of carries) of a scan equation, on jax 0.10 and 0.11.

    jax 0.10 has `num_consts`/`num_carry`; jax 0.11 has `ft_in`, a FlatTree of the
    (consts, carry, xs) inputs.
    """
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    nc, ncar, _ = (len(group) for group in params["ft_in"].unpack())
    return nc, ncar


def hi_kind(eqn) -> str | None:
    """Under `jax_remat3`, `checkpoint_name` and `jax.checkpoint` are `call_hi_primitive`
    equations wrapping a `CheckpointName` / `RematTraced` object; returns that class name."""
    if eqn.primitive.name != "call_hi_primitive":
        return None
    return type(eqn.params.get("_prim")).__name__


def user_name(eqn) -> str | None:
    """The name of a `checkpoint_name` equation (either form), else None."""
    if eqn.primitive.name == "name":
        return eqn.params.get("name")
    if hi_kind(eqn) == "CheckpointName":
        return getattr(eqn.params["_prim"], "name", None)
    return None


def is_inline(eqn) -> bool:
    """Whether `eval_jaxpr(inline=True)` evaluates this equation's body in place."""
    return eqn.primitive.name in INLINE_PRIMITIVES or hi_kind(eqn) == "RematTraced"


def primitive_label(eqn) -> str:
    """A primitive name that is the same with `jax_remat3` on and off (`name` for checkpoint_name)."""
    if user_name(eqn) is not None:
        return "name"
    kind = hi_kind(eqn)
    return "checkpoint" if kind == "RematTraced" else eqn.primitive.name


def checkpoint_params(eqn) -> tuple[Any, bool] | None:
    """(policy, prevent_cse) of a `jax.checkpoint` equation, remat3 on or off; None for any other
    equation.  Remat3's equation records prevent_cse from JAX 0.11 on; on 0.10 it has none, and
    the region is replayed behind barriers: True, JAX's default."""
    if hi_kind(eqn) == "RematTraced":
        params = eqn.params["_prim"].params
        return params.get("policy"), bool(params.get("prevent_cse", True))
    if eqn.primitive.name in ("remat2", "checkpoint"):
        return eqn.params.get("policy"), bool(eqn.params.get("prevent_cse", True))
    return None


def inner_jaxpr(eqn) -> tuple[Any, Sequence[Any]]:
    """Returns (jaxpr, consts) of a call-like equation's body."""
    if hi_kind(eqn) == "RematTraced":
        j = eqn.params["_prim"].jaxpr
        return (j.jaxpr, j.consts) if isinstance(j, jex.core.ClosedJaxpr) else (j, ())
    for key in ("jaxpr", "call_jaxpr"):
        if key in eqn.params:
            j = eqn.params[key]
            if isinstance(j, jex.core.ClosedJaxpr):
                return j.jaxpr, j.consts
            return j, ()
    raise KeyError(f"equation {eqn.primitive.name} has no inner jaxpr")


def eval_eqn(eqn, invals: Sequence[Any]) -> list[Any]:
    """Binds one equation to `invals`, keeping its source information and context."""
    bound = eqn.primitive.get_bind_params(eqn.params)
    # Older JAX returns (subfuns, params); 0.10+ returns params alone.
    if isinstance(bound, tuple) and len(bound) == 2 and isinstance(bound[1], dict):
        subfuns, bind_params = bound
    else:
        subfuns, bind_params = (), bound
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
        out = eqn.primitive.bind(*subfuns, *invals, **bind_params)
    return list(out) if eqn.primitive.multiple_results else [out]


def eval_jaxpr(
    jaxpr,
    consts: Sequence[Any],
    args: Sequence[Any],
    *,
    inline: bool = True,
    on_eqn: Callable[[int, Any, list[Any]], list[Any]] | None = None,
    marks: list | None = None,
) -> list[Any]:
    """Evaluates `jaxpr`, inlining call-like primitives when `inline` is true.

    Args:
      jaxpr: a `jax.extend.core.Jaxpr`.
      consts: values of its constvars.
      args: values of its invars.
      inline: recurse into `INLINE_PRIMITIVES` instead of binding them.
      on_eqn: optional hook `(index, eqn, outvals) -> outvals` run after each equation
        (used to tag values with `checkpoint_name`).
      marks: where given, each inlined `jax.checkpoint`'s `checkpoint_params` and source line
        (`file:line (function)`) are appended to it, and the equations its body becomes carry
        `USER_CHECKPOINT_SCOPE` and its index in their name stack.
    """
    env: dict[Any, Any] = {}

    def read(v):
        return v.val if isinstance(v, jex.core.Literal) else env[v]

    def write(v, val):
        if not isinstance(v, jex.core.DropVar):
            env[v] = val

    for v, val in zip(jaxpr.constvars, consts):
        write(v, val)
    for v, val in zip(jaxpr.invars, args):
        write(v, val)
    for i, eqn in enumerate(jaxpr.eqns):
        invals = [read(v) for v in eqn.invars]
        if inline and is_inline(eqn):
            outvals = _inlined(eqn, invals, marks)
        else:
            outvals = eval_eqn(eqn, invals)
        if on_eqn is not None:
            outvals = on_eqn(i, eqn, outvals)
        for v, val in zip(eqn.outvars, outvals):
            write(v, val)
    return [read(v) for v in jaxpr.outvars]


def _inlined(eqn, invals, marks: list | None) -> list[Any]:
    body, body_consts = inner_jaxpr(eqn)
    params = checkpoint_params(eqn) if marks is not None else None
    if params is None:
        return eval_jaxpr(body, body_consts, invals, inline=True, marks=marks)
    marks.append((*params, source_info_util.summarize(eqn.source_info)))
    with source_info_util.extend_name_stack(f"{USER_CHECKPOINT_SCOPE}{len(marks) - 1}"):
        return eval_jaxpr(body, body_consts, invals, inline=True, marks=marks)
