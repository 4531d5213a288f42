"""`optimize(fn, budget)`: plan, realize and check rematerialization for a memory budget.

Like `jax.jit`, the returned function plans on the first call for each argument signature
(shapes, dtypes, shardings, static arguments) and caches the plan.  Planning is:

1. trace `fn` and build its graph on the device profile;
2. build the chain problem and solve it for the budget;
3. compile `jax.value_and_grad` of the rewritten function and read its peak; if it is over
   the budget, lower the solver's budget by the overshoot and solve again (bounded rounds).

A plan whose compiled peak is over the budget is never returned silently: `optimize` raises
`InfeasibleBudgetError` naming the lowest peak it reached (or, with `validate=False`, warns
that the plan was not checked).
"""

from __future__ import annotations

import functools
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import jax

from autoremat._errors import InfeasibleBudgetError, SolverError
from autoremat._bridge import to_plan
from autoremat._hand import HandPlan, HandSearch
from autoremat._shardings import abstract_arguments
from autoremat.graph._graph import graph_from_traced
from autoremat.graph._layers import find_layers
from autoremat.graph._profiles import detect_profile, get_profile
from autoremat.graph._trace import check_reverse_mode, signature_key, split_static, trace
from autoremat.runtime._apply import apply, run_plan
from autoremat.runtime._plan import Plan
from autoremat.runtime._validate import ValidationReport, compiled_stats, validate
from autoremat._units import check_budget, format_bytes, parse_budget
from autoremat.solver._chain import evaluate, lowest_peak_segments
from autoremat.solver._chain_model import ChainModel, build_chain_model
from autoremat.solver._solve import METHODS, solve

__all__ = ["optimize", "Optimized", "plan_for"]

AUTO_MARGIN = 0.9  # budget="auto": this fraction of the device's memory
# On GPU/TPU two compiles of the same program can differ in temp memory (autotuned GEMM/conv
# algorithms bring their own workspace): measured on an H100 (jax 0.11.2, docs/FINDINGS.md),
# one plan of the small transformer compiled to 45.30 and 46.29 MiB (+2.2%) in one process,
# with the same arguments.  Plans must fit this fraction below the budget there.
ACCELERATOR_SAFETY = 0.025
# When a compiled plan leaves more than RAISE_SLACK of the budget unused (the model
# over-predicted), the solver is asked again with the target raised by the unused part; if
# that overshoots, the target is bisected between the last fitting and the overshooting one
# (at most MAX_RAISES extra compiles in all).
RAISE_SLACK = 0.02
MAX_RAISES = 4
# After the solver's plan, at most MAX_UNIFORM_CHECKS faster uniform plans predicted within
# UNIFORM_REACH x the budget are compiled in case the model over-predicted them.
MAX_UNIFORM_CHECKS = 4
UNIFORM_REACH = 1.3
UNIFORM_NEAR = 1.1
# The option kinds that are JAX's built-in policies (nothing_saveable, dots_saveable,
# dots_with_no_batch_dims_saveable) applied per block or to a scan body; one of them
# replaces the solver's plan if it recomputes fewer FLOPs, is estimated at most this much
# slower, and compiles within the budget.
POLICY_KINDS = ("ckpt:recompute", "ckpt:save:dots", "ckpt:save:dots_no_batch")
POLICY_TOLERANCE = 0.10
# Plans already compiled in this process: (function signature, plan key) -> _Compiled.  Every
# plan that fits is a candidate at every later budget of the same signature, and the answer is
# the fitting one that recomputes the fewest FLOPs (counted on the step's jaxpr), so a looser
# budget never returns a plan that recomputes more than one already compiled within it (issue
# 15: on a 6-layer stack 6,350,081 B gave 1.383e9 FLOPs where 5,767,572 B gave 1.350e9), and
# the hand-written plans (`autoremat._hand`) bound the answer (issue 14).
_COMPILED: dict = {}
_BASELINES: dict = {}  # (fingerprint, argument types) -> the un-optimized step's CompiledStats


class _Compiled(NamedTuple):
    peak: int
    extra: float  # the model's estimated extra time (0 for hand-written plans: not modelled)
    flops: float  # the model's recomputed FLOPs
    plan: Plan
    measured: float  # extra FLOPs of the compiled step's jaxpr over the un-optimized one

    @property
    def rank(self) -> tuple:
        return (self.measured, self.extra, self.peak)


@dataclass
class _Planned:
    plan: Plan
    traced: object
    model: ChainModel
    baseline_peak: int | None
    history: list


def _log(verbose: bool, msg: str):
    if verbose:
        print(f"[autoremat] {msg}", file=sys.stderr, flush=True)


def plan_for(fn, budget, args: Sequence, kwargs: dict | None = None, *, device=None, offload=None,
             solver: str = "auto", time_limit: float | None = None, argnums=0, static_argnums=(),
             has_aux: bool = False, validate: bool = True, max_rounds: int = 4, verbose: bool = False,
             progress=None, max_candidates: int = 8, in_shardings=None) -> _Planned:
    """Plans `fn` for one argument signature (the work behind `Optimized.plan`)."""
    kwargs = dict(kwargs or {})
    say = progress or (lambda m: _log(verbose, m))
    profile = get_profile(device) if device is not None else detect_profile()
    if offload is None:
        # On the CPU, "host" memory is device memory: offloading saves nothing there.
        offload = profile.name != "cpu"
    abstract_args, abstract_kwargs = abstract_arguments(args, kwargs, static_argnums, in_shardings,
                                                        getattr(fn, "__name__", "fn"))
    t0 = time.perf_counter()
    traced = trace(fn, abstract_args, abstract_kwargs, argnums=argnums, static_argnums=static_argnums,
                   has_aux=has_aux, skip_integer_leaves=False)
    check_reverse_mode(traced, getattr(fn, "__name__", "fn"))
    g = graph_from_traced(traced, profile=profile)
    say(f"traced {len(traced.jaxpr.eqns)} equations; graph built in {time.perf_counter() - t0:.1f}s "
        f"(profile {profile.name})")
    t1 = time.perf_counter()
    block_cache: dict = {}  # shared by every chain model built below
    model = build_chain_model(g, offload=offload, block_cache=block_cache)
    say(f"{len(model.blocks)} blocks, {sum(len(v) for v in model.problem.options.values())} region options "
        f"({time.perf_counter() - t1:.1f}s)")

    stats_kw = dict(argnums=traced.argnums, static_argnums=static_argnums, has_aux=has_aux)
    baseline_peak = none_flops = None
    if validate or isinstance(budget, float):
        # A fraction is of the compiled un-optimized peak, also with validate=False.
        key = (traced.fingerprint, str(traced.in_avals))
        if key not in _BASELINES:  # one compile per signature and process (5 s at 1B parameters)
            _BASELINES[key] = compiled_stats(fn, *abstract_args, **stats_kw, **abstract_kwargs)
        baseline_peak, none_flops = _BASELINES[key].peak_bytes, _BASELINES[key].jaxpr_flops
        say(f"un-optimized compiled peak {format_bytes(baseline_peak)}")
    if isinstance(budget, str) and budget.strip().lower() == "auto":
        budget_bytes = int(_device_memory(profile) * AUTO_MARGIN)
    else:
        budget_bytes = parse_budget(budget, reference_peak=baseline_peak)
    say(f"budget {format_bytes(budget_bytes)}")
    if baseline_peak is not None:
        # Calibrate what un-checkpointed regions keep against the compiled un-optimized step
        # (with the user's own checkpoints inlined away: the model's all-none plan is that).
        none_peak = baseline_peak
        if traced.user_checkpoints:
            none_plan = to_plan(model, _all_none(model), budget=budget_bytes)
            none_peak = compiled_stats(apply(fn, none_plan), *abstract_args, **stats_kw, **abstract_kwargs).peak_bytes
            say(f"without its {traced.user_checkpoints} jax.checkpoint calls: {format_bytes(none_peak)}")
        predicted_none = evaluate(model.raw_problem, _all_none(model))[0]
        if predicted_none > model.base_bytes and none_peak > model.base_bytes:
            scale = (none_peak - model.base_bytes) / (predicted_none - model.base_bytes)
            scale = min(1.5, max(0.3, scale))
            if abs(scale - 1.0) > 0.03:
                model = build_chain_model(g, offload=offload, none_scale=scale, block_cache=block_cache)
                say(f"calibrated the residual model to the compiled step (x{scale:.2f})")

    # What a compiled peak must not exceed: the budget, less a safety margin off the CPU.
    limit = budget_bytes if jax.default_backend() == "cpu" else int(budget_bytes * (1 - ACCELERATOR_SAFETY))
    history = []
    meta = {"function": getattr(fn, "__name__", "fn"), "jax": jax.__version__, "backend": jax.default_backend(),
            "baseline_peak": baseline_peak, "blocks": len(model.blocks)}
    if baseline_peak is not None and baseline_peak <= limit:
        # As written: the user's own jax.checkpoint calls are part of the program (inlining
        # them away made one 4-layer stack compile to 7.50 MiB instead of its 4.50).
        segs = _all_none(model)
        note = "fits as written" + (f" (its {traced.user_checkpoints} jax.checkpoint calls kept)"
                                    if traced.user_checkpoints else "")
        plan = to_plan(model, segs, budget=budget_bytes, meta={**meta, "note": note, "compiled_peak": baseline_peak})
        plan = _with(plan, predicted_peak=evaluate(model.raw_problem, segs)[0], estimated_extra_time=0.0,
                     as_written=True)
        say(f"the un-optimized step already fits ({format_bytes(baseline_peak)}): running it as written")
        return _Planned(plan, traced, model, baseline_peak, history)

    target = budget_bytes
    tried: dict = {}
    sig = (traced.fingerprint, str(traced.in_avals), model.none_scale)

    def compile_once(key, plan, extra, flops) -> _Compiled:
        if (sig, key) not in _COMPILED:
            st = compiled_stats(apply(fn, plan), *abstract_args, **stats_kw, **abstract_kwargs)
            _COMPILED[(sig, key)] = _Compiled(st.peak_bytes, extra, flops, plan, st.jaxpr_flops - none_flops)
        tried[key] = _COMPILED[(sig, key)].peak
        return _COMPILED[(sig, key)]

    def compile_peak(segments, how="", result=None) -> int:
        # Equation ranges, not block indices: the two block variants index blocks differently.
        key = tuple((model.blocks[sg.start].start, model.blocks[sg.stop - 1].stop, sg.option.name)
                    for sg in segments)
        if key not in tried:
            p = to_plan(model, segments, budget=budget_bytes, result=result, meta={**meta, "found_by": how})
            peak, extra = evaluate(model.raw_problem, segments)
            compile_once(key, _with(p, predicted_peak=peak, estimated_extra_time=extra), extra, _recompute_flops(segments))
        return tried[key]

    def compile_hand(plan, label) -> HandPlan:
        c = compile_once(("hand", label), _with(plan, budget=budget_bytes, meta={**plan.meta, "found_by": label}),
                     0.0, 0.0)
        return HandPlan(label, c.plan, c.peak, c.measured)

    def can_win(segments, quiet=False) -> bool:
        """Whether a plan may recompute fewer FLOPs than the best fitting plan compiled so far
        (the model's recomputed FLOPs against the compiled one's, counted by the same cost
        rules); a plan that cannot is not compiled: at 1B parameters each compile takes 5-7 s."""
        known = _best_compiled(sig, limit)
        if known is None or _recompute_flops(segments) < known.measured:
            return True
        if not quiet:
                say(f"  (a plan recomputing {_recompute_flops(segments) / 1e9:.4g} GFLOP cannot beat the compiled "
                f"{known.plan.meta.get('found_by', 'plan')}, +{known.measured / 1e9:.4g} GFLOP: not compiled)")
        return False

    def accept(segments, result, how):
        compile_peak(segments, how, result)
        return finish(_best_compiled(sig, limit))

    def finish(best: _Compiled):
        """The fitting plan compiled in this process for this signature that recomputes least."""
        how = best.plan.meta.get("found_by", "")
        say(f"chosen: {how or 'the solver'}: compiled {format_bytes(best.peak)}, "
            f"+{best.measured / 1e9:.4g} GFLOP recomputed" + (f" (model: {best.flops / 1e9:.4g})" if best.flops else ""))
        plan = _with(best.plan, budget=budget_bytes, meta={
            **best.plan.meta, **meta, "compiled_peak": best.peak, "rounds": _rounds(history), "found_by": how,
            "extra_flops": best.measured, "hand_candidates": _hand_table(sig)})
        return _Planned(plan, traced, model, baseline_peak, history)

    layers = find_layers(g)
    if validate and layers:
        none_hand = HandPlan("no remat", None, baseline_peak, 0.0)
        hand = HandSearch(g, layers, compile_hand, none_hand, say, meta)
        hand.uniform()
        hand.mix(limit)

    if offload and validate:
        # Does offloading lower XLA's compiled peak here?  Compare the per-block plan that
        # offloads the matmul outputs with the one that keeps them on the device.  Measured on
        # an H100 with jax 0.11.2 (docs/FINDINGS.md): it does not; XLA keeps device buffers
        # for the transfers and the offloading plans compiled above their device-only twins,
        # some above no remat.  Plans that offload would only waste rounds there.
        dev, off = model.uniform("ckpt:save:dots", 1), model.uniform("ckpt:save:dots+offload", 1)
        if dev is not None and off is not None:
            peak_dev, peak_off = compile_peak(dev), compile_peak(off)
            if peak_off >= peak_dev:
                say(f"offloading does not lower the compiled peak on this backend (matmul outputs offloaded "
                    f"per block: {format_bytes(peak_off)}, kept: {format_bytes(peak_dev)}); planning without "
                    f"offload")
                offload = False
                meta["offload"] = (f"disabled: offloading per block compiled to {format_bytes(peak_off)}, "
                                   f"not below {format_bytes(peak_dev)} without it")
                model = build_chain_model(g, offload=False, none_scale=model.none_scale, block_cache=block_cache)

    best = None  # (estimated extra time, segments, result, how found) of the best fitting plan
    raised, fit_target, over_target = 0, 0, None
    for rnd in range(max_rounds + MAX_RAISES):
        if rnd >= max_rounds + raised:
            break
        try:
            result = solve(model.problem, target, method=solver, time_limit=time_limit)
        except InfeasibleBudgetError as e:
            if best is not None:
                break
            if rnd == 0 and not validate:
                raise InfeasibleBudgetError(
                    f"budget {format_bytes(budget_bytes)} is below the lowest peak autoremat's model predicts for "
                    f"{meta['function']}, {format_bytes(e.lowest)} (a prediction: validate=False compiled no "
                    f"plan); raise the budget to at least {format_bytes(e.lowest)}, or plan with validate=True "
                    f"for compiled figures" + _offload_hint(offload, profile, meta),
                    budget=budget_bytes, lowest=e.lowest) from None
            break
        say(f"round {rnd + 1}: solver {result.solver} ({result.status}, {result.solve_time:.2f}s) predicts "
            f"{format_bytes(result.peak_bytes)}, +{result.objective * 1e3:.3g} ms, "
            f"+{_recompute_flops(result.segments) / 1e9:.4g} GFLOP")
        if not validate:
            plan = to_plan(model, result.segments, budget=budget_bytes, result=result, meta=meta)
            warnings.warn(
                f"autoremat: plan for {meta['function']} predicts {format_bytes(result.peak_bytes)} for the budget "
                f"{format_bytes(budget_bytes)} but was NOT compiled to check it (validate=False)", stacklevel=3)
            return _Planned(plan, traced, model, baseline_peak, history)
        if validate and not can_win(result.segments):
            break
        same = next((h["round"] for h in history if h["segments"] == result.segments), None)
        compiled = compile_peak(result.segments, f"solver round {rnd + 1}", result)
        history.append({"round": rnd + 1, "target": target, "predicted": result.peak_bytes, "compiled": compiled,
                        "segments": result.segments})
        say(f"round {rnd + 1}: " + (f"the plan of round {same} again" if same else "compiled peak")
            + f" {format_bytes(compiled)} ({'fits' if compiled <= limit else 'over budget'})")
        if compiled <= limit:
            if best is None or result.objective < best[0]:
                best = (result.objective, result.segments, result, f"solver round {rnd + 1}")
            # The model over-predicted: the compiled plan leaves memory unused.  Ask the
            # solver for a plan predicted up to that much higher (a few times at most);
            # the fastest plan that compiles within the budget wins.
            slack = limit - compiled
            fit_target = max(fit_target, target)
            if raised >= MAX_RAISES or slack <= RAISE_SLACK * limit or result.objective <= 0:
                break
            nxt = target + slack if over_target is None else (fit_target + over_target) // 2
            if nxt <= target or (over_target is not None and over_target - fit_target <= RAISE_SLACK * limit):
                break
            raised += 1
            target = nxt
            continue
        if best is not None:
            # A raised target overshot: bisect between the highest target that fitted and it.
            over_target = target if over_target is None else min(over_target, target)
            if raised >= MAX_RAISES or over_target - fit_target <= RAISE_SLACK * limit:
                break
            raised += 1
            target = (fit_target + over_target) // 2
            continue
        # The model under-predicted: ask the solver for less.  After two over-budget rounds,
        # follow the line through them (the model's error often grows as plans get lower,
        # and stepping down by the overshoot alone then takes many rounds); else step down
        # by the overshoot.
        over = [h for h in history if h["compiled"] > limit]
        step = target - (compiled - limit) - max(1, budget_bytes // 200)
        if len(over) >= 2 and over[-2]["predicted"] != over[-1]["predicted"]:
            (p1, c1), (p2, c2) = ((h["predicted"], h["compiled"]) for h in over[-2:])
            slope = (c2 - c1) / (p2 - p1)
            if slope > 0.05:
                step = min(step, int(p2 - (c2 - limit) / slope) - max(1, budget_bytes // 200))
        target = step
        if target <= 0:
            break
    if best is not None:
        cands = _uniform_candidates(model)
        # JAX's built-in policies in the model's terms, where the time model cannot tell
        # them from the solver's plan: one that recomputes fewer FLOPs, estimated at most
        # POLICY_TOLERANCE slower (or faster), and compiles within the budget wins.  FLOPs
        # are exact; the estimated time of memory-bound recomputation is not.
        best_flops = _recompute_flops(best[1])
        solver_extra = best[0]
        for c in sorted((c for c in cands if c.is_policy), key=lambda c: c.flops):
            if (c.flops >= best_flops or c.extra > best[0] * (1 + POLICY_TOLERANCE)
                    or c.peak > UNIFORM_REACH * budget_bytes or not can_win(c.segs, quiet=True)):
                continue
            if compile_peak(c.segs, c.label) <= limit:
                say(f"{c.label} recomputes fewer FLOPs at about the same estimated time and compiles within "
                    f"the budget")
                best = (c.extra, c.segs, None, f"{c.label}, blocks merged next")
                break
        # Uniform plans (one option kind per block) that the model says are faster but over
        # budget may still fit: the model over-predicts plans that save much.  Compile the
        # ones likeliest to fit first (lowest predicted peak), each time among those faster
        # than the best so far and either faster than the solver's plan by more than
        # POLICY_TOLERANCE or recomputing no more FLOPs (so a policy chosen above for its
        # FLOPs is not traded back for an estimate within the tolerance).
        failed: set = set()
        for _ in range(MAX_UNIFORM_CHECKS):
            best_flops = _recompute_flops(best[1])
            pool = [c for c in cands
                    if c.segs != best[1] and c.segs not in failed and c.peak <= UNIFORM_REACH * budget_bytes
                    and c.extra < best[0] and (c.extra * (1 + POLICY_TOLERANCE) < min(best[0], solver_extra)
                                               or c.flops <= best_flops)]
            if not pool:
                break
            c = min(pool, key=lambda c: (c.peak, c.extra))
            if not can_win(c.segs, quiet=True):
                failed.add(c.segs)
                continue
            if compile_peak(c.segs, c.label) <= limit:
                say(f"{c.label} is faster and compiles within the budget")
                best = (c.extra, c.segs, None, f"{c.label}, blocks merged next")
            else:
                failed.add(c.segs)
        return accept(best[1], best[2], best[3])
    known = _best_compiled(sig, limit)
    if known is not None:  # a hand-written plan (or one compiled for another budget) fits: done
        return finish(known)
    # The model and XLA disagree here.  Fall back on compile-verified candidates, for each
    # way of cutting the chain into blocks (activations opening the next layer, closing
    # their layer, no merging at all): the solver's plan for the budget; every option kind
    # applied uniformly per block and per pair of blocks (this covers JAX's built-in
    # policies per block), cheapest estimated time first, with the all-recompute ones over
    # 1-4 blocks always included (not for unmerged blocks, which are too small to be
    # layers); and the plan of lowest predicted peak.
    for variant, m in _variants(g, model, offload, say, block_cache):
        if m is not model:
            model = m
            try:
                result = solve(model.problem, budget_bytes, method=solver, time_limit=time_limit)
                if compile_peak(result.segments, f"solver, blocks merged {variant}", result) <= limit:
                    return accept(result.segments, result, f"solver, blocks merged {variant}")
            except InfeasibleBudgetError:
                pass
        if variant != "none":
            # Fastest first, among those predicted within UNIFORM_REACH of the budget (the
            # rest are hopeless and, on scans, crowd out the rest: 21 ILP caps), the ones
            # predicted within UNIFORM_NEAR taken first; JAX's built-in policies per block,
            # per layer or on the scan bodies, the user's checkpoint_name tags saved alone
            # and the all-recompute ones are always among them (on the small scan
            # transformer the eight fastest were all ILP sets over budget, and all-recompute
            # won over dots_with_no_batch_dims_saveable, which fitted).
            cands = _uniform_candidates(model)
            reach = [c for c in cands if c.peak <= UNIFORM_REACH * budget_bytes]
            chosen = ([c for c in reach if c.peak <= UNIFORM_NEAR * budget_bytes]
                      + [c for c in reach if c.peak > UNIFORM_NEAR * budget_bytes])[:max_candidates]
            chosen += [c for c in cands if c not in chosen and (
                c.kind.endswith("recompute") or c.kind.startswith("scan:save:name:")
                or c.is_policy)]
            chosen.sort(key=lambda c: c.extra)
            say(f"the model and XLA disagree; trying {len(chosen)} compile-verified uniform plans (blocks merged "
                f"{variant})")
            chosen = [c for c in chosen if can_win(c.segs, quiet=True)]
            for k, c in enumerate(chosen):
                say(f"  compiling {k + 1}/{len(chosen)}: {c.label}")
                peak = compile_peak(c.segs, f"{c.label}, blocks merged {variant}")
                if peak <= limit:
                    say(f"{c.label}: compiled {format_bytes(peak)} fits")
                    return accept(c.segs, None, f"{c.label}, blocks merged {variant}")
        low = lowest_peak_segments(model.problem)
        if can_win(low) and compile_peak(low, f"lowest predicted peak, blocks merged {variant}") <= limit:
            return accept(low, None, f"lowest predicted peak, blocks merged {variant}")
    known = _best_compiled(sig, limit)
    if known is not None:  # compiled for another budget of this signature, and fits this one
        return finish(known)
    lowest = min(tried.values())
    need = lowest if limit == budget_bytes else -(-lowest * budget_bytes // limit)
    margin = ("" if limit == budget_bytes else
              f" (off the CPU a plan must compile {ACCELERATOR_SAFETY:.1%} below the budget, because two "
              f"compiles of one program can differ by that much)")
    raise InfeasibleBudgetError(
        f"budget {format_bytes(budget_bytes)} is below what autoremat could reach for {meta['function']}: the "
        f"lowest compiled peak it found is {format_bytes(lowest)}{margin}; raise the budget to at least "
        f"{format_bytes(need)}" + _offload_hint(offload, profile, meta),
        budget=budget_bytes, lowest=need)


def _rounds(history: list) -> list:
    """The solver rounds as plan metadata (without their segments)."""
    return [{k: v for k, v in h.items() if k != "segments"} for h in history]


def _best_compiled(sig, limit: int) -> _Compiled | None:
    """The plan compiled in this process for `sig` that fits `limit` and recomputes the fewest
    FLOPs (then: estimated fastest, lowest peak)."""
    fits = [c for (s, _), c in _COMPILED.items() if s == sig and c.peak <= limit]
    return min(fits, key=lambda c: c.rank, default=None)


def _hand_table(sig) -> list[dict]:
    """The hand-written plans compiled for `sig`: label, compiled peak, extra FLOPs."""
    return [{"label": key[1], "compiled_peak": c.peak, "extra_flops": c.measured}
            for (s, key), c in _COMPILED.items() if s == sig and key and key[0] == "hand"]


def _variants(g, model: ChainModel, offload: bool, say, block_cache: dict):
    """The model as built, then the model with blocks merged the other way, then with no
    blocks merged at all (finer regions: the U-Net's stages need cuts of both kinds);
    built lazily."""
    yield "next", model
    say("rebuilding the chain with activations closing their layer")
    yield "prev", build_chain_model(g, offload=offload, none_scale=model.none_scale, merge="prev",
                                    block_cache=block_cache)
    say("rebuilding the chain with every cut kept")
    yield "none", build_chain_model(g, offload=offload, none_scale=model.none_scale, merge="none",
                                    block_cache=block_cache)


class _Candidate(NamedTuple):
    """A uniform plan: one option kind over every `size` blocks (0: on the scan bodies
    alone), with the model's estimated extra time, predicted peak and recomputed FLOPs."""

    extra: float
    kind: str
    size: int
    segs: tuple
    peak: int
    flops: float
    offset: int = 0  # nonzero: regions of `size` blocks from this block on (one per layer)

    @property
    def is_policy(self) -> bool:
        """One of JAX's built-in policies per block, per layer or on the scan bodies."""
        return self.kind in POLICY_KINDS and (self.size <= 1 or bool(self.offset))

    @property
    def label(self) -> str:
        if self.offset:
            return f"uniform {self.kind} per repeated unit of {self.size} blocks"
        if self.size == 0:
            return f"uniform {self.kind} on the scan bodies"
        return f"uniform {self.kind} x{self.size}"


def _uniform_candidates(model: ChainModel) -> list[_Candidate]:
    """Uniform plans, fastest first: every option kind per block and per pair of blocks,
    all-recompute also over 3 and 4 blocks; where the chain has scans, every kind on the
    scan bodies alone (size 0), which is how a policy on the body of a scan over layers
    looks; where block structures repeat (`ChainModel.period`), JAX's policies once per
    repeated unit (a layer, cut where the least crosses)."""
    cands, seen = [], set()
    has_scan = any(b.kind == "scan" for b in model.blocks)
    period = model.period()
    for kind in model.option_kinds():
        shapes = [(size, 0) for size in ((0, 1, 2, 3, 4) if has_scan else (1, 2, 3, 4))
                  if size <= 2 or kind.endswith("recompute")]
        if period is not None and kind in POLICY_KINDS:
            shapes.append((period[1], period[0]))  # one region per repeated unit (layer)
        for size, offset in shapes:
            segs = model.uniform(kind, max(size, 1), scans_only=size == 0, offset=offset)
            if segs is not None and segs not in seen:
                seen.add(segs)
                peak, extra = evaluate(model.raw_problem, segs)
                cands.append(_Candidate(extra, kind, size, segs, peak, _recompute_flops(segs), offset))
    cands.sort(key=lambda c: c.extra)
    return cands


def _offload_hint(offload: bool, profile, meta: dict) -> str:
    """Suggest offload only where it can help: off, not on the CPU (host memory is device
    memory there), and not already found useless by the probe."""
    if offload or profile.name == "cpu" or "offload" in meta:
        return ""
    return " or enable offload (offload=True)"


def _recompute_flops(segments) -> float:
    return sum(sg.option.recompute_flops for sg in segments)


def _all_none(model: ChainModel):
    """Every block left alone: the un-optimized step in the model's terms."""
    return model.uniform("none")


def _with(plan: Plan, **kw) -> Plan:
    from dataclasses import replace

    return replace(plan, **kw)


def _device_memory(profile) -> int:
    try:
        stats = jax.devices()[0].memory_stats()
        if stats and stats.get("bytes_limit"):
            return int(stats["bytes_limit"])
    except Exception:
        pass
    return int(profile.memory_bytes)


class Optimized:
    """The function `optimize` returns: fn with a rematerialization plan per signature.

    Call it like fn.  `.plan(*args)`, `.validate(*args)` and `.report(*args)` expose the plan
    for those argument shapes, its compiled validation and a readable report.
    """

    def __init__(self, fn, budget, *, device=None, offload=None, solver="auto", time_limit=None, argnums=0,
                 static_argnums=(), has_aux=False, validate=True, max_rounds=4, verbose=False, in_shardings=None):
        check_budget(budget)  # a malformed budget fails here, not at the first call
        if solver not in METHODS:
            raise SolverError(f"unknown solver {solver!r}; use one of {', '.join(map(repr, METHODS))}")
        self.fn = fn
        self.budget = budget
        self._opts = dict(device=device, offload=offload, solver=solver, time_limit=time_limit, argnums=argnums,
                          static_argnums=tuple(static_argnums), has_aux=has_aux, validate=validate,
                          max_rounds=max_rounds, verbose=verbose,
                          in_shardings=None if in_shardings is None else tuple(in_shardings))
        self._cache: dict = {}
        functools.update_wrapper(self, fn)

    def _key(self, args, kwargs):
        # With in_shardings the shardings are the user's, whatever the leaves say.
        return signature_key(args, kwargs, self._opts["static_argnums"],
                             shardings=self._opts["in_shardings"] is None)

    def _planned(self, args, kwargs) -> _Planned:
        key = self._key(args, kwargs)
        if key not in self._cache:
            self._cache[key] = plan_for(self.fn, self.budget, args, kwargs, **self._opts)
        return self._cache[key]

    def plan(self, *args, **kwargs) -> Plan:
        """The plan for these argument shapes (solved on first use, then cached)."""
        return self._planned(args, kwargs).plan

    def __call__(self, *args, **kwargs):
        p = self._planned(args, kwargs)
        dynamic, _ = split_static(args, self._opts["static_argnums"])
        leaves = jax.tree_util.tree_leaves((dynamic, kwargs))
        if p.plan.as_written:
            return self.fn(*args, **kwargs)
        out = run_plan(p.traced, p.plan, leaves)
        return jax.tree_util.tree_unflatten(p.traced.out_tree, out)

    def validate(self, *args, n_steps: int = 0, **kwargs) -> ValidationReport:
        """Compiles value_and_grad of the optimized function and compares it with the plan."""
        return validate(self.fn, self.plan(*args, **kwargs), *args, n_steps=n_steps, **kwargs)

    def report(self, *args, **kwargs) -> str:
        """The plan's summary and its compiled validation, as text."""
        p = self._planned(args, kwargs)
        return p.plan.summary() + "\n\n" + str(self.validate(*args, **kwargs))


def optimize(fn, budget, *, device=None, offload=None, solver: str = "auto", time_limit: float | None = None,
             argnums=0, static_argnums: Sequence[int] = (), has_aux: bool = False, validate: bool = True,
             max_rounds: int = 4, verbose: bool = False, in_shardings: Sequence | None = None) -> Optimized:
    """Returns `fn` rewritten so that `jax.value_and_grad(fn)` fits `budget` at the least extra time.

    Args:
      fn: a function returning a scalar loss (differentiated w.r.t. `argnums`).
      budget: peak device memory of the compiled `value_and_grad` step: `"8GB"`, `"7.5GiB"`,
        `"512MiB"`, an int number of bytes, a float in (0, 1] (fraction of the un-optimized
        peak), or `"auto"` (90% of the device's memory).
      device: device profile name or `DeviceProfile` for the time model (default: detected).
      offload: allow offloading to pinned host memory (default: on except on CPU).  With
        validation on, it is dropped where compiling shows that offloading does not lower
        the peak (`plan.meta["offload"]` then says so).
      solver: one of `autoremat.solver.METHODS`: "auto" (DP, plus CP-SAT on small chains), "dp",
        "cpsat" (warm-started from the DP), "greedy" or "brute_force" (tiny chains only).
      time_limit: seconds for the exact solver.
      validate: compile to check the plan and correct the model (default True).
      max_rounds: compile-and-correct rounds before giving up.
      verbose: progress on stderr.
      in_shardings: one sharding (or pytree of shardings, or None) per positional argument, as
        for `jax.jit`.  Needed only where JAX cannot tell: inside `jax.jit` on a mesh whose axes
        are not Explicit (else `ShardingUnknownError`).  Budgets are per device.

    Raises:
      BudgetError: the budget is malformed.
      InfeasibleBudgetError: no plan reaches the budget; the message names the lowest peak.
      ShardingUnknownError: inside `jax.jit`, the arguments' shardings cannot be known.

    Example:
      >>> import jax, jax.numpy as jnp, autoremat
      >>> def loss(ws, x):
      ...     for w1, w2 in ws:
      ...         x = x + jnp.tanh(x @ w1) @ w2
      ...     return jnp.mean(x ** 2)
      >>> ws = [(jnp.full((64, 256), 0.01), jnp.full((256, 64), 0.01)) for _ in range(4)]
      >>> x = jnp.ones((128, 64))
      >>> opt = autoremat.optimize(loss, budget=0.8)
      >>> g1 = jax.grad(loss)(ws, x)
      >>> g2 = jax.grad(opt)(ws, x)
      >>> all(bool(jnp.allclose(a, b)) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)))
      True
      >>> opt.validate(ws, x).fits
      True
    """
    return Optimized(fn, budget, device=device, offload=offload, solver=solver, time_limit=time_limit,
                     argnums=argnums, static_argnums=static_argnums, has_aux=has_aux, validate=validate,
                     max_rounds=max_rounds, verbose=verbose, in_shardings=in_shardings)
