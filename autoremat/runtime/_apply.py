"""`apply(fn, plan)`: realize a plan by re-evaluating fn's jaxpr (docs/FACTS.md fact 2).

The function is traced once per argument signature; its flat jaxpr is evaluated equation
by equation.  Each `Region` of the plan becomes a `jax.checkpoint` whose policy is
name-based (`save_only_these_names`, or `save_and_offload_only_these_names` when the region
offloads), and the values the plan keeps are tagged with `checkpoint_name`.  Scans with a
`ScanPlan` are re-issued through `jax.lax.scan` with a checkpointed body.  The user's own
checkpoints the plan keeps (`Plan.user_checkpoints`) become `jax.checkpoint` calls with their
policies again, inside the region they lie in; the others stay inlined.  A region that draws
random bits gets its keys tied to its activations first (`_rng.py`), so XLA cannot draw every
layer's bits at the start of the step.  Because only
names and public policies are used, the result behaves the same with `jax_remat3` on and
off and under `jit`, `grad`, `value_and_grad` and `vmap` (under remat3 the checkpoints are tied
to the backward pass, see `_checkpoint.py`, which costs forward-mode differentiation).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from autoremat._errors import PlanMismatchError
from autoremat.graph._interpret import eval_eqn, scan_counts
from autoremat.graph._shard_map import rebuilt, shard_map_body
from autoremat.graph._trace import Traced, remat3_enabled, signature_key, split_static, trace
from autoremat.runtime._checkpoint import checkpoint
from autoremat.runtime._plan import Plan, Region, ScanPlan, checkpoint_names
from autoremat.runtime._remat3 import replay_casts_inputs
from autoremat.runtime._rng import rng_ties, tie_keys
from autoremat.runtime._varying import cast_varying, evaluated


__all__ = ["apply", "run_plan", "check_plan_matches", "region_policy", "segment_function"]


def region_policy(saved_names: Sequence[str], offloaded_names: Sequence[str], policy: str = ""):
    """The policy a region uses: its names, and the named JAX policy if it has one."""
    cp = jax.checkpoint_policies
    if offloaded_names:
        names = cp.save_and_offload_only_these_names(
            names_which_can_be_saved=list(saved_names), names_which_can_be_offloaded=list(offloaded_names),
            offload_src="device", offload_dst="pinned_host")
    else:
        names = cp.save_only_these_names(*saved_names)
    if not policy:
        return names
    if not saved_names and not offloaded_names:
        return getattr(cp, policy)
    return cp.save_from_both_policies(getattr(cp, policy), names)


def check_plan_matches(plan: Plan, traced: Traced, fn_name: str = "fn") -> None:
    """Raises PlanMismatchError, saying what differs, if `plan` was made for another function."""
    if plan.fingerprint == traced.fingerprint:
        _check_user_checkpoints(plan, traced, fn_name)
        return
    from autoremat.graph._trace import describe_eqn

    eqns = traced.jaxpr.eqns
    now = [describe_eqn(e) for e in eqns]
    detail = f"the plan has {plan.n_eqns} top-level equations, {fn_name} now has {len(eqns)}"
    for i, (a, b) in enumerate(zip(plan.structure, now)):
        if a != b:
            detail += f"; first difference at equation {i}: plan has `{a}`, function has `{b}`"
            break
    else:
        ins_now = ",".join(v.aval.str_short(short_dtypes=True) for v in traced.jaxpr.invars)
        detail += f"; argument shapes now {ins_now}"
    raise PlanMismatchError(
        f"this plan was made for a different function or other argument shapes (fingerprint "
        f"{plan.fingerprint}, {fn_name} traces to {traced.fingerprint}): {detail}. "
        f"Re-run the search for the changed function")


def _check_user_checkpoints(plan: Plan, traced: Traced, fn_name: str) -> None:
    """The user checkpoints `plan` keeps exist in `traced` and nest with its regions."""
    n = len(traced.user_regions)
    for k in plan.user_checkpoints:
        if k >= n:
            raise PlanMismatchError(
                f"the plan keeps the user's jax.checkpoint number {k}, and {fn_name} has {n} that a plan can "
                f"keep. Re-run the search for this function")
        u = traced.user_regions[k]
        for r in plan.all_regions():
            if u.start < r.start < u.stop or u.start < r.stop < u.stop:
                raise PlanMismatchError(
                    f"the plan keeps the user's jax.checkpoint over equations [{u.start}, {u.stop}), which "
                    f"overlaps its region [{r.start}, {r.stop}) without nesting in it. Re-run the search")


def _live_sets(jaxpr, start: int, stop: int):
    """(inputs, outputs) variables of the equation range [start, stop)."""
    defined, ins = set(), {}
    for eqn in jaxpr.eqns[start:stop]:
        for v in eqn.invars:
            if not isinstance(v, jex.core.Literal) and v not in defined:
                ins.setdefault(v, None)
        for v in eqn.outvars:
            defined.add(v)
    used_after = set()
    for eqn in jaxpr.eqns[stop:]:
        used_after.update(v for v in eqn.invars if not isinstance(v, jex.core.Literal))
    used_after.update(v for v in jaxpr.outvars if not isinstance(v, jex.core.Literal))
    outs = [v for eqn in jaxpr.eqns[start:stop] for v in eqn.outvars if v in used_after]
    return list(ins), outs


class _Evaluator:
    """Evaluates one flat jaxpr under a plan."""

    def __init__(self, traced: Traced, plan: Plan):
        self.jaxpr = traced.jaxpr
        self.consts = [_as_jax(c) for c in traced.closed_jaxpr.consts]
        self.plan = plan
        self.scans = {s.op: s for s in plan.scans}
        # id of each top-level var, for tagging
        self.var_ids = {}
        for i, eqn in enumerate(self.jaxpr.eqns):
            for j, v in enumerate(eqn.outvars):
                self.var_ids[v] = f"e{i}:{j}"
        # The user's own checkpoints the plan keeps, outermost first (as `Traced.user_regions`).
        regions = traced.user_regions
        self.kept = [regions[k] for k in sorted(plan.user_checkpoints) if k < len(regions)]
        self.kept_at: dict[int, list[int]] = {}
        for i, u in enumerate(self.kept):
            self.kept_at.setdefault(u.start, []).append(i)

    def __call__(self, flat_args):
        env = {}
        for v, val in zip(self.jaxpr.constvars, self.consts):
            env[v] = val
        for v, val in zip(self.jaxpr.invars, flat_args):
            env[v] = val
        self._run_range(env, 0, len(self.jaxpr.eqns), self.plan.regions, tags={})
        return [v.val if isinstance(v, jex.core.Literal) else env[v] for v in self.jaxpr.outvars]

    def _run_range(self, env, start, stop, regions: Sequence[Region], tags: dict):
        i = start
        for r in regions:
            self._eqns(env, i, r.start, tags)
            self._region(env, r)
            i = r.stop
        self._eqns(env, i, stop, tags)

    def _eqns(self, env, start: int, stop: int, tags: dict, inside: int = -1):
        """Equations `[start, stop)`, with the kept user checkpoints in that range (after
        `self.kept[inside]`, the one being evaluated) as theirs again."""
        k = start
        while k < stop:
            i = next((i for i in self.kept_at.get(k, ()) if i > inside and self.kept[i].stop <= stop), None)
            if i is None:
                self._eqn(env, k, tags)
                k += 1
            else:
                self._user_checkpoint(env, i, tags)
                k = self.kept[i].stop

    def _user_checkpoint(self, env, i: int, tags: dict):
        """The user's own `jax.checkpoint` `self.kept[i]` as they wrote it: plain `jax.checkpoint`
        with their policy and barriers (not `_checkpoint.checkpoint`, so under remat3 it is the
        remat3 program their step compiles to)."""
        u = self.kept[i]
        self._as_call(env, u.start, u.stop, lambda local: self._eqns(local, u.start, u.stop, tags, inside=i),
                      lambda body: jax.checkpoint(body, policy=u.policy, prevent_cse=u.prevent_cse))

    def _as_call(self, env, start: int, stop: int, run, wrap, tie: bool = False):
        """Equations `[start, stop)` as one call of their live-in values, made by `wrap` (a
        checkpoint) around a body in which `run(local)` evaluates them; with `tie`, the keys
        they draw random bits from tied to their activations first (`_rng.rng_ties`)."""
        ins, outs = _live_sets(self.jaxpr, start, stop)
        ties = rng_ties(self.jaxpr, start, stop, ins) if tie else None

        def body(*in_vals):
            local = dict(zip(ins, tie_keys(in_vals, ties)))
            run(local)
            return [local[v] for v in outs]

        vals, early = cast_varying(self.jaxpr.eqns[start:stop], ins, [env[v] for v in ins], outs)
        for v, val in zip(outs, wrap(body)(*vals)):
            env[v] = early.get(v, val)

    def _eqn(self, env, k, tags):
        eqn = self.jaxpr.eqns[k]
        invals = [v.val if isinstance(v, jex.core.Literal) else env[v] for v in eqn.invars]
        oid = f"e{k}"
        outvals = _body_eqn(eqn, invals, oid, self.scans, tags, self.plan)
        for j, (v, val) in enumerate(zip(eqn.outvars, outvals)):
            vid = f"{oid}:{j}"
            if vid in tags:
                val = checkpoint_name(val, tags[vid])
            if not isinstance(v, jex.core.DropVar):
                env[v] = val

    def _region(self, env, r: Region):
        tags = {}
        tags.update(checkpoint_names(self.plan.values, r.saved))
        tags.update(checkpoint_names(self.plan.values, r.offloaded))
        saved = sorted(set(checkpoint_names(self.plan.values, r.saved).values()))
        offloaded = sorted(set(checkpoint_names(self.plan.values, r.offloaded).values()))
        self._as_call(env, r.start, r.stop, lambda local: self._run_range(local, r.start, r.stop, r.children, tags),
                      lambda body: checkpoint(body, policy=region_policy(saved, offloaded, r.policy), prevent_cse=True),
                      tie=True)


def _as_jax(const):
    """A constant of the traced jaxpr as the user's function had it: a JAX array where the trace
    kept a NumPy one.  JAX differentiates a scan over a NumPy array by stacking the per-iteration
    slices its backward reads as a new residual, where over a JAX array it reads the array
    itself: the stochastic-depth decoder's per-layer survival chances (`benchmarks/unseen.py`,
    `sdepth_scan`), scanned with the weights, made the planner's copies of JAX's policies on its
    scan body compile 64 bytes above the same policies written by hand, so none fitted those
    plans' peaks (tests/test_runtime.py)."""
    return jnp.asarray(const) if isinstance(const, np.ndarray) else const


def _run_scan(eqn, invals, sp: ScanPlan | None, plan: Plan, oid: str, outer: dict | None = None):
    """Re-issues a scan with its body evaluated under a checkpoint with named values; `sp` None:
    a scan inside a planned scan's body, re-issued only to tag the values of its own body that
    the outer body's plan keeps (`outer`: id -> name), which the outer checkpoint's policy saves
    stacked over both trip counts (JAX's partial evaluation of a scan applies the policy to its
    body)."""
    p = eqn.params
    nc, ncar = scan_counts(p)
    bj, bconsts = p["jaxpr"].jaxpr, p["jaxpr"].consts
    consts, init, xs = invals[:nc], invals[nc:nc + ncar], invals[nc + ncar:]
    prefix = f"{oid}/body/"
    tags = {v: t for v, t in (outer or {}).items() if v.startswith(prefix)}  # the enclosing plan's, in here
    if sp is not None:
        tags.update(checkpoint_names(plan.values, sp.saved | sp.offloaded))
    nested = {s.op: s for s in plan.scans if s.op.startswith(prefix)}

    def body(consts, carry, x):
        env = dict(zip(bj.constvars, bconsts))
        env.update(zip(bj.invars, list(consts) + list(carry) + list(x)))
        for k, e in enumerate(bj.eqns):
            vals = [v.val if isinstance(v, jex.core.Literal) else env[v] for v in e.invars]
            vals = _body_eqn(e, vals, f"{prefix}e{k}", nested, tags, plan)
            for j, (v, val) in enumerate(zip(e.outvars, vals)):
                vid = f"{prefix}e{k}:{j}"
                if vid in tags:
                    val = checkpoint_name(val, tags[vid])
                if not isinstance(v, jex.core.DropVar):
                    env[v] = val
        outs = [v.val if isinstance(v, jex.core.Literal) else env[v] for v in bj.outvars]
        return list(outs[:ncar]), list(outs[ncar:])

    if sp is not None:
        saved = sorted(set(checkpoint_names(plan.values, sp.saved).values()))
        offloaded = sorted(set(checkpoint_names(plan.values, sp.offloaded).values()))
        body = checkpoint(body, policy=region_policy(saved, offloaded, sp.policy), prevent_cse=sp.prevent_cse)

    def step(carry, x):
        # Under jax_remat3 inside a shard_map, the inputs the body casts to varying are cast
        # here, outside the checkpoint and per iteration as the body's own casts were (per
        # iteration: 91.90 GiB against 92.79 cast before the scan, the 8B scan written per device
        # at `nothing_saveable` on the body, compiled under remat2 with the cast forced).
        ins = [*bj.invars[:nc], *bj.invars[nc + ncar:]]
        cast, early = (cast_varying(bj.eqns, ins, [*consts, *x], bj.outvars, bj.invars[nc:nc + ncar])
                       if sp is not None else ([*consts, *x], {}))  # no checkpoint of its own to replay
        carry, ys = body(cast[:nc], carry, cast[nc:])
        outs = [y if isinstance(v, jex.core.Literal) else early.get(v, y) for v, y in zip(bj.outvars, [*carry, *ys])]
        return outs[:ncar], outs[ncar:]

    kw = {}
    if "_split_transpose" in p:
        kw["_split_transpose"] = p["_split_transpose"]
    carry, ys = jax.lax.scan(step, list(init), list(xs), length=p["length"], reverse=p["reverse"],
                             unroll=p["unroll"], **kw)
    return list(carry) + list(ys)


def _body_eqn(e, vals, oid: str, nested: dict, tags: dict, plan: Plan) -> list:
    """One equation `oid` evaluated (at top level, or in a planned scan's body): a scan
    re-issued where the plan has a body plan for it (`nested`: op id -> `ScanPlan`; in a body, a
    checkpoint inside the outer one), for a scan inside its body, or keeps values of its body
    (`tags`: id -> name, which the enclosing checkpoint's policy saves); else as traced."""
    if e.primitive.name == "scan":
        inner = f"{oid}/body/"
        if oid in nested or any(t.startswith(inner) for t in (*tags, *nested)) or _replayed_varying(e):
            return _run_scan(e, vals, nested.get(oid), plan, oid, tags)
    return evaluated(e, vals)


def _replayed_varying(e) -> bool:
    """Whether scan `e`'s body casts to varying while jax_remat3 replays checkpoints on inputs
    cast to varying (`runtime._varying`): re-issued, its body's casts of a value that arrives
    varying are the identity (`evaluated`).  As traced, a scan in the body of a scan over layers
    written per device raised "pvary is a invariant->variant collective" in the outer body's
    replay (tests/test_nested_scans.py; in plain JAX 0.10.2 too, the policy on the outer body)."""
    return (remat3_enabled() and replay_casts_inputs()
            and any(x.primitive.name == "pvary" for x in e.params["jaxpr"].jaxpr.eqns))


def segment_function(traced: Traced, plan: Plan, start: int, stop: int):
    """Equations `[start, stop)` of the traced function as a function of their live-in values,
    run under `plan`'s regions and scan plans inside that range.

    Returns `(fn, in_vars, out_vars)`: `fn(*values of in_vars) -> [values of out_vars]`; the
    in_vars are top-level variables (function inputs, constants or earlier outputs).
    """
    ev = _Evaluator(traced, plan)
    ins, outs = _live_sets(ev.jaxpr, start, stop)
    consts = dict(zip(ev.jaxpr.constvars, ev.consts))
    ins = [v for v in ins if v not in consts]
    regions = [r for r in plan.regions if start <= r.start and r.stop <= stop]

    def fn(*in_vals):
        env = dict(consts)
        env.update(zip(ins, in_vals))
        ev._run_range(env, start, stop, regions, tags={})
        return [env[v] for v in outs]

    return fn, ins, outs


def run_plan(traced: Traced, plan: Plan, flat_args):
    """Evaluates the traced function's flat jaxpr under `plan` (flat outputs); where `traced`
    is a shard_map's body (`graph.shard_map_body`), the whole function, that shard_map's body
    evaluated under `plan`."""
    if traced.outer is None:
        return _Evaluator(traced, plan)(flat_args)
    outer, run_body = traced.outer, _Evaluator(traced, plan)
    env = dict(zip(outer.jaxpr.constvars, map(_as_jax, outer.closed_jaxpr.consts)))
    env.update(zip(outer.jaxpr.invars, flat_args))
    read = lambda v: v.val if isinstance(v, jex.core.Literal) else env[v]  # noqa: E731
    for k, eqn in enumerate(outer.jaxpr.eqns):
        invals = [read(v) for v in eqn.invars]
        if k == traced.inside:
            outvals = rebuilt(eqn, lambda *xs: tuple(run_body(xs)))(*invals)
        else:
            outvals = eval_eqn(eqn, invals)
        env.update((v, x) for v, x in zip(eqn.outvars, outvals) if not isinstance(v, jex.core.DropVar))
    return [read(v) for v in outer.jaxpr.outvars]


def _planned_view(plan: Plan, traced: Traced) -> Traced:
    """The trace `plan` was made for: `traced`, or the body of its shard_map where the plan was
    made inside it (`graph.shard_map_body`)."""
    if plan.fingerprint != traced.fingerprint:
        body = shard_map_body(traced)
        if body is not None and body.fingerprint == plan.fingerprint:
            return body
    return traced


def apply(fn, plan: Plan):
    """Returns `fn` rewritten so that its gradient follows `plan`.

    The returned function has fn's signature and output structure; its values and
    gradients equal fn's.  The plan's fingerprint is checked against the traced function
    at each new argument signature.

    Raises:
      PlanMismatchError: fn (or the argument shapes) changed since the plan was made.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from autoremat.runtime import Plan, Region, apply
      >>> def loss(w, x):
      ...     for _ in range(3):
      ...         x = jnp.tanh(x @ w)
      ...     return jnp.sum(x)
      >>> w, x = jnp.ones((4, 4)) * 0.1, jnp.ones((2, 4))
      >>> from autoremat.graph import trace
      >>> t = trace(loss, (w, x))
      >>> plan = Plan(t.fingerprint, len(t.jaxpr.eqns), regions=(Region(0, 2), Region(2, 4), Region(4, 6)))
      >>> g1 = jax.grad(loss)(w, x); g2 = jax.grad(apply(loss, plan))(w, x)
      >>> bool(jnp.allclose(g1, g2))
      True
    """
    cache: dict = {}
    name = getattr(fn, "__name__", "fn")

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        dynamic, _ = split_static(args, plan.static_argnums)
        leaves = jax.tree_util.tree_leaves((dynamic, kwargs))
        key = signature_key(args, kwargs, plan.static_argnums)
        traced = cache.get(key)
        if traced is None:
            traced = _planned_view(plan, trace(fn, args, kwargs, argnums=plan.argnums,
                                               static_argnums=plan.static_argnums, has_aux=plan.has_aux))
            check_plan_matches(plan, traced, name)
            cache[key] = traced
        if plan.as_written:
            return fn(*args, **kwargs)
        out = run_plan(traced, plan, leaves)
        return jax.tree_util.tree_unflatten(traced.out_tree, out)

    wrapped.plan = plan
    return wrapped
