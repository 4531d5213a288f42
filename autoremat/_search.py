"""The plan search behind `optimize`: candidates, compiled, and the one that recomputes least.

`PlanSearch.run` goes through these phases (each a short method):

1. **hand-written policies** (`hand_policies`, `autoremat/_hand.py`): JAX's built-in policies on
   every layer `graph.find_layers` found (fastest first, up to the first that fits), compiled.
   Where all are over the budget and the two leanest came out nearer together than what they
   store apart would make them (`HandSearch.peak_fixed`: the peak may be set by what remat does
   not touch), their half-and-half mix and the plan of lowest predicted peak are compiled, and
   unless the latter comes well under them (`peak_moves`) the search ends there (`settled`),
   with that reason where nothing fits.
2. **offload probe** (`probe_offload`): off the CPU, whether offloading lowers the compiled peak
   at all on this backend; planning goes on without it if not.
3. **hand-written mixes** (`hand_mixes`): the best two-option mix for the budget (JAX's policies,
   the region solver's saved sets per layer), compiled where it could recompute less than every
   plan compiled so far that fits; the solver's first round is compiled among them, before the
   first mix that recomputes more (`first_round`).  With the policies, they bound the answer: it
   never recomputes more than the best of them that fits.
4. **solver rounds** (`solver_rounds`): the chain solver's plan for a target, compiled; the
   first target is the budget less what the model under-predicted the hand-written plans'
   twins by (`under_prediction`), and it moves with what XLA said (down after an overshoot,
   up into unused memory).  A plan the model says recomputes at least what the best compiled
   plan does, less MIN_GAIN of the step's FLOPs, is not compiled (how far the solver's plans
   compiled at other budgets came out above their prediction does not skip rounds: it belongs
   to the plan, not the function; docs/FINDINGS.md, twenty-sixth session).  Where every
   hand-written policy compiled over the budget, the lowest-peak plan is compiled before them
   (`lowest_first`), and if it too is over, a round out of reach ends them.
5. **policy checks** (`policy_checks`): JAX's policies per block in the model's terms, and
   faster uniform plans the model may have over-predicted, compiled where they could win.
6. **fallback** (`fallback`): when no solver plan fits: compile-verified uniform plans (the user's
   tags saved alone, JAX's policies per block, ...) that could recompute less (while a compiled
   plan fits: the user's tags first, then the model's own likeliest to fit first, up to the
   first over budget); the chain rebuilt two other ways only while nothing compiled fits.  None
   of the model's plans predicted far over the budget once corrected like the twins.
7. **choose** (`finish`): of every plan compiled in this process for this signature that fits,
   the one that recomputes the fewest FLOPs (counted on the compiled step's jaxpr); so a looser
   budget never recomputes more (every plan compiled for a tighter one is a candidate).
"""

from __future__ import annotations

import math
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from autoremat._bridge import to_plan, with_recompute_costs
from autoremat._errors import InfeasibleBudgetError
from autoremat._progress import working
from autoremat._hand import HAND_POLICIES, HandPlan, HandSearch, Nested, as_written, maxtext_presets, uniform_plans
from autoremat._layer_options import ilp_options
from autoremat._units import format_bytes
from autoremat.graph._costs import OpCost
from autoremat.graph._graph import Graph
from autoremat.runtime._apply import apply
from autoremat.runtime._plan import Plan
from autoremat.runtime._validate import CompiledStats, StagedStep, compile_later, compile_step, stage_step
from autoremat.solver._chain import evaluate, lowest_peak_segments
from autoremat.solver._chain_model import AROUND, ChainModel, build_chain_model
from autoremat.solver._solve import solve

__all__ = ["PlanSearch", "Planned", "mix_curve", "start_first_hand_plans"]

# When a compiled plan leaves more than RAISE_SLACK of the budget unused (the model
# over-predicted), the solver is asked again with the target raised by the unused part; if
# that overshoots, the next target lies between the last fitting and the overshooting one
# (`_Steer._between`; at most MAX_RAISES extra compiles in all).
RAISE_SLACK = 0.02
MAX_RAISES = 4
# After the solver's plan, at most MAX_UNIFORM_CHECKS faster uniform plans predicted within
# UNIFORM_REACH x the budget are compiled in case the model over-predicted them (predictions
# corrected by `PlanSearch.under_prediction`; the reach is wide because a plan may compile well
# below its prediction so corrected: on the small transformer (benchmarks/run.py)
# nothing_saveable once per repeated unit of blocks compiled to 40.3 MiB where per layer, as
# written by hand, it gave 47.6 (x1.18), and the former won at two budgets).
MAX_UNIFORM_CHECKS = 4
UNIFORM_REACH = 1.3
UNIFORM_NEAR = 1.1
# JAX's built-in policies and the option kinds that are they in the model's terms (applied
# per block, per layer or to a scan body).  One of those kinds replaces the solver's plan if it
# recomputes fewer FLOPs, is estimated at most POLICY_TOLERANCE slower, and compiles within the
# budget; per layer, they are the twins of the hand-written plans (`_twin_points`).
POLICY_KIND_OF = {"nothing_saveable": "ckpt:recompute", "dots_with_no_batch_dims_saveable": "ckpt:save:dots_no_batch",
                  "dots_saveable": "ckpt:save:dots"}
POLICY_KINDS = tuple(POLICY_KIND_OF.values())
POLICY_TOLERANCE = 0.10
# A plan is compiled only if it may recompute at least this fraction of the un-optimized step's
# FLOPs less than the best fitting plan compiled so far.  Measured step times on this machine
# vary by a few percent from run to run (docs/FINDINGS.md), so a smaller saving cannot be told
# apart in time, while finding out costs a whole-step compile: on the 1B decoders
# (benchmarks/realscale.py) at dots_saveable's peak, two compiles (11-14 s) for plans that
# would have saved 12-24 GFLOP of elementwise work in a ~60 TFLOP step (0.04%); the solver's
# wins there saved 0.34-0.9 TFLOP (about 1% of the step).
MIN_GAIN = 0.001
# Plans already compiled in this process: (function signature, plan key) -> _Compiled.  Every
# plan that fits is a candidate at every later budget of the same signature, and the answer is
# the fitting one that recomputes the fewest FLOPs (counted on the step's jaxpr), so a looser
# budget never returns a plan that recomputes more than one already compiled within it (issue
# 15: on a 6-layer stack 6,350,081 B gave 1.383e9 FLOPs where 5,767,572 B gave 1.350e9), and
# the hand-written plans (`autoremat._hand`) bound the answer (issue 14).
_COMPILED: dict = {}
_BY_CONTENT: dict = {}  # (signature, `_plan_content`) -> (peak, extra jaxpr FLOPs, of matmuls)
_LAYER_OPTIONS: dict = {}  # (fingerprint, argument types) -> `_layer_options.ilp_options`
# signature -> (predicted, compiled peak) of each plan of the chain model compiled for it
# (`PlanSearch.expected`).
_MODEL_POINTS: dict = {}
# (signature, `_plan_content`) -> (Future of the plan's `CompiledStats`, its program key): compiles
# started before the search (`start_first_hand_plans`: the key a Future too, set once the plan is
# lowered in the background) or beside another (`PlanSearch.start_beside`), taken by the first
# `compile_once` that needs them.
_STARTED: dict = {}
# (signature, `_plan_content`) -> StagedStep: plans traced and lowered while another compiled
# (`PlanSearch.stage_ahead`), taken by the first `compile_once` that needs them; at most
# MAX_STAGED, the oldest dropped first (a search stages at most `_hand.AHEAD` per compile).
_STAGED: dict = {}
MAX_STAGED = 4
_BY_PROGRAM: dict = {}  # `StagedStep.program_key` -> (CompiledStats, found_by) of the programs compiled (`_stats`)
_BUILDER: ThreadPoolExecutor | None = None  # `_chain_builder`


class _Compiled(NamedTuple):
    peak: int
    extra: float  # estimated extra time (hand-written plans: the roofline time of their extra FLOPs)
    flops: float  # the model's recomputed FLOPs
    plan: Plan
    measured: float  # extra FLOPs of the compiled step's jaxpr over the un-optimized one
    matmul: float  # ... of its matmuls and convolutions alone

    @property
    def rank(self) -> tuple:
        """Matmul FLOPs first: the equations around them change with how a step was staged
        (at 1B, dots_saveable per layer as a plan: +34.27 GFLOP in all, written by hand:
        +33.74; the matmuls and the compiled peak were the same)."""
        return (self.matmul, self.measured, self.extra, self.peak)


@dataclass
class Planned:
    plan: Plan
    traced: object
    model: ChainModel
    baseline_peak: int | None
    history: list


@dataclass
class PlanSearch:
    """The search for one signature and budget (see the module docstring)."""

    fn: object
    g: Graph
    model: ChainModel
    args: tuple
    kwargs: dict
    stats_kw: dict
    budget: int
    meta: dict
    say: object
    layers: tuple = ()
    baseline_peak: int | None = None
    none_flops: tuple = (0.0, 0.0)  # the un-optimized step's jaxpr FLOPs: all, matmuls
    offload: bool = False
    profile_name: str = "cpu"
    solver: str = "auto"
    time_limit: float | None = None
    validate: bool = True
    max_rounds: int = 4
    max_candidates: int = 8
    block_cache: dict = field(default_factory=dict)
    tried: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    twins: list = field(default_factory=list)  # `_twin_points`
    compiles: int = 0  # whole-step compiles this search made (at 1B on this CPU, 7-12 s each)
    from_cache: int = 0  # of them, read from the compile cache (`autoremat._compile_cache`)
    excess: list = field(default_factory=list)  # compiled / corrected prediction of its segment plans
    curves: dict = field(default_factory=dict)  # `mix_curve`
    lowest_over: bool = False  # `lowest_first` compiled the lowest-peak plan over the budget
    short_chain: bool = False  # `_try_lowest` compiled a lowest-peak plan that could win over the budget
    fixed: str | None = None  # why the step's peak is out of remat's reach (`HandSearch.peak_fixed`)
    rebuilds: dict = field(default_factory=dict)  # merge -> Future of a rebuilt chain (`start_rebuilds`)
    # (target, solver result, its `_Compiled` or None) of round 1, where `first_round` solved it
    first: tuple | None = None

    # The budget is the bar on every backend.  A 2.5% margin off the CPU, set when two compiles
    # of one small example's plan on an H100 came out 0.99 MiB (2.2%) apart
    # (benchmarks/results/gpu-h100-variance.log), kept the hand-written policies' own plans out
    # at their own peaks and broke the promise there (results/gpu-h100-realscale-margin.md); at 1B
    # on the H100, 18 programs compiled twice each came out byte-identical
    # (results/gpu-h100-hand_twins.log).  Headroom is the budget's (budget="auto": 90% of the device).
    def __post_init__(self):
        t = self.g.traced
        self.sig = (t.signature, self.model.none_scale)
        self.share = self.g.device_share()  # the model's FLOPs are per device, compiled ones global
        if self.share < 1.0:
            self.say(f"sharded: one device does {self.share:.3f} of the step's FLOPs (the model counts them "
                     f"per device, compiled steps in all)")

    def run(self) -> Planned:
        try:
            return self._phases()
        finally:
            for later in self.rebuilds.values():
                later.cancel()  # not begun yet: a plan fitted before the rebuilt chain was needed

    def _phases(self) -> Planned:
        if self.validate:
            hand = self.hand_policies()
            if self.fixed is not None:
                return self.settled()
            self.probe_offload()
            self.lowest_first()
            self.first_round(hand)
            self.hand_mixes(hand)
        best = self.solver_rounds()
        if isinstance(best, Planned):  # validate=False: the solver's plan, not compiled
            return best
        if best is not None:
            best = self.policy_checks(best)
            return self.accept(best[1], best[2], best[3])
        return self.fallback()

    # -- compiling -------------------------------------------------------------------------
    def compile_once(self, key, plan: Plan, extra: float, flops: float, ahead=(), beside=()) -> _Compiled:
        """`plan` compiled (once per process and signature), filed under `key`; while XLA
        compiles it, the first plan of `beside` (plans certain to be compiled next) with another
        program is compiled too (`start_beside`) and the plans of `ahead` (the likeliest next
        ones) are traced and lowered (`stage_ahead`).  Plans with the same regions and scan plans compile alike and are
        compiled once: at 8B (FSDP x TP) six scan-body options at caps 65-100% had one saved set
        and were compiled six times, 3.6 s each.  No region and no scan plan is the
        un-optimized step, compiled already."""
        if (self.sig, key) not in _COMPILED:
            content = (self.sig, _plan_content(plan))
            if content not in _BY_CONTENT and self.is_unoptimized(plan):
                _BY_CONTENT[content] = (self.baseline_peak, 0.0, 0.0)
            if content not in _BY_CONTENT:
                label = plan.meta.get("found_by") or "a candidate plan"
                with working(self.say, f"compiling {label}"):
                    later, running = _STARTED.pop(self._started_key(plan), (None, None))
                    if later is None:  # traced here (or ahead), compiled while the next are traced
                        staged = self.staged(plan)
                        later, running = compile_later(_compile_staged, staged, label), staged.program_key()
                    elif isinstance(running, Future) and beside:  # started before the search: its program,
                        running = running.result()  # so that no plan lowering to it compiles beside
                    self.start_beside(beside, running)
                    self.stage_ahead(ahead, later)
                    st, same_as = later.result()
                if same_as is None:
                    self.compiles += 1
                    self.from_cache += st.cached
                else:
                    self.say(f"  (the same program as {same_as}, compiled before: not compiled again)")
                _BY_CONTENT[content] = (st.peak_bytes, st.jaxpr_flops - self.none_flops[0],
                                        st.matmul_flops - self.none_flops[1])
            peak, measured, matmul = _BY_CONTENT[content]
            _COMPILED[(self.sig, key)] = _Compiled(peak, extra, flops, plan, measured, matmul)
        self.tried[key] = _COMPILED[(self.sig, key)].peak
        return _COMPILED[(self.sig, key)]

    def _started_key(self, plan: Plan) -> tuple:
        return self.g.traced.signature, _plan_content(plan)

    def staged(self, plan: Plan) -> StagedStep:
        """`plan`'s step traced and lowered: as `stage_ahead` left it, or now."""
        got = _STAGED.pop(self._started_key(plan), None)
        return got if got is not None else self._stage(plan)

    def _stage(self, plan: Plan) -> StagedStep:
        return _stage(self.fn, plan, self.args, self.stats_kw, self.kwargs)

    def stage_ahead(self, plans, later) -> None:
        """Trace and lower `plans` while `later` (a compile) runs, one by one until it is done:
        XLA compiles without Python's lock and tracing needs it, so on this 2-core machine the
        next plan's tracing and lowering (1.6-2.4 s beside 5.0-6.4 s of XLA compile on the 1B
        Llama, benchmarks/results/compile_anatomy-llama.md) is done by the time it is needed, if
        it is (benchmarks/results/compare_planners-*.md).  A plan
        compiled, started or staged already is skipped; one that fails to trace is left for its
        own compile to report."""
        for plan in plans:
            key = self._started_key(plan)
            if later.done():
                return
            if key in _STAGED or key in _STARTED or (self.sig, key[1]) in _BY_CONTENT or self.is_unoptimized(plan):
                continue
            try:
                staged = self._stage(plan)
            except Exception:  # noqa: BLE001 - speculative: the plan's own compile raises it, if ever needed
                continue
            _keep_staged(key, staged)

    def start_beside(self, plans, running: str | None) -> None:
        """Compile the first of `plans` whose program is neither `running` (the program
        compiling) nor compiled before, now, beside it; the ones before it are left staged
        (traced and lowered once).  `plans` are certain to be compiled next (`HandSearch.uniform`:
        MaxText's presets never end that phase), or all but certain (the next policy where the
        chain model puts the one compiling over), so the second core compiles too: two 1B steps
        side by side took 11.4 and 12.1 s where one after the other took 8.0 + 7.2 and 7.8 + 8.5
        (docs/FINDINGS.md, twenty-sixth session)."""
        for plan in plans:
            key = self._started_key(plan)
            if key in _STARTED or (self.sig, key[1]) in _BY_CONTENT or self.is_unoptimized(plan):
                continue
            staged = self.staged(plan)
            program = staged.program_key()
            if program != running and program not in _BY_PROGRAM and all(p != program for _, p in _STARTED.values()):
                _STARTED[key] = compile_later(_compile_staged, staged, plan.meta.get("found_by") or "a plan"), program
                return
            _keep_staged(key, staged)

    def is_unoptimized(self, plan: Plan) -> bool:
        """`plan` runs the function as written, which is what the baseline compile measured: no
        region, and every one of the user's own checkpoints kept."""
        return (not plan.regions and not plan.scans and self.baseline_peak is not None
                and len(plan.user_checkpoints) == self.g.traced.user_checkpoints)

    def compile_peak(self, segments, how: str = "", result=None) -> int:
        """The compiled peak of the plan of `segments` (compiled once per process)."""
        return self.compile_segments(segments, how, result).peak

    def compile_segments(self, segments, how: str = "", result=None) -> _Compiled:
        """The plan of `segments`, compiled once per process."""
        m = self.model
        # Equation ranges, not block indices: the block variants index blocks differently.
        key = tuple((m.blocks[sg.start].start, m.blocks[sg.stop - 1].stop, sg.option.name) for sg in segments)
        barriers = _scan_barriers(self.sig)
        key += (("scan barriers",) if barriers else ())
        if key not in self.tried:
            peak, extra = evaluate(m.raw_problem, segments)
            p = to_plan(m, segments, budget=self.budget, result=result, scan_barriers=barriers, meta={
                **self.meta, "found_by": how, "expected_peak": self.expected(peak)})
            got = self.compile_once(key, replace(p, predicted_peak=peak, estimated_extra_time=extra), extra,
                                    _recompute_flops(segments))
            self.excess.append(got.peak / max(peak * self.under_prediction(), 1.0))
            _MODEL_POINTS.setdefault(self.sig, []).append((peak, got.peak))
            return got
        return _COMPILED[(self.sig, key)]

    def expected(self, predicted: float) -> int:
        """The peak the search expects of a plan the model predicts at `predicted`: the compiled
        peaks of the plans compiled for this function (the hand-written plans' twins, the
        model's own plans) interpolated by their predicted peaks, between the nearest below and
        above (outside them, the nearest one's ratio).  How far a plan compiles from the model
        goes with which values it saves, not with the budget or the order of the budgets
        (docs/FINDINGS.md, twenty-sixth session): scaled by the last plan's excess, the scans'
        plans between two policies were expected -3.9..+12.1% off their compiled peaks, five of
        eight by over 5% (benchmarks/results/realscale.md at 8596d46; since, six within 5%)."""
        pts = sorted({**dict(self._twin_pairs()), **dict(_MODEL_POINTS.get(self.sig, []))}.items())
        if not pts:
            return int(predicted)
        below = [pc for pc in pts if pc[0] <= predicted]
        above = [pc for pc in pts if pc[0] >= predicted]
        if below and above and above[0][0] > below[-1][0]:
            (p0, c0), (p1, c1) = below[-1], above[0]
            return int(c0 + (c1 - c0) * (predicted - p0) / (p1 - p0))
        p, c = below[-1] if below else above[0]
        return int(predicted * c / max(p, 1))

    def _twin_pairs(self) -> list[tuple[float, int]]:
        """(predicted, compiled peak) of the hand-written plans' twins (`_twin_points`)."""
        return [(peak / ratio, peak) for peak, ratio in self.twins]

    def compile_hand(self, plan: Plan, label: str, ahead=(), beside=()) -> HandPlan:
        """A hand-written plan, compiled (the plans of `ahead` traced meanwhile, the first of
        `beside`, (plan, label) pairs certain to be compiled next, compiled beside it:
        `compile_once`); its estimated extra time is the roofline time of the FLOPs it
        recomputes (the chain model cannot express a JAX policy per layer)."""
        key = ("hand", label)
        beside = [replace(p, budget=self.budget, meta={**p.meta, "found_by": lab}) for p, lab in beside]
        c = self.compile_once(key, replace(plan, budget=self.budget, meta={**plan.meta, "found_by": label}), 0.0, 0.0,
                              ahead, beside)
        if c.plan.estimated_extra_time is None:  # compiled just now
            extra = self.g.profile.op_time(OpCost(flops=max(c.measured, 0.0)), self._dtype())
            c = _COMPILED[(self.sig, key)] = c._replace(extra=extra, plan=replace(c.plan, estimated_extra_time=extra))
        return HandPlan(label, c.plan, c.peak, c.matmul)

    def _best_matmul(self, limit: int) -> float:
        """The fewest extra matmul FLOPs of a plan compiled in this process that fits `limit`."""
        best = _best_compiled(self.sig, limit)
        return math.inf if best is None else best.matmul

    def hand_known(self, label: str) -> HandPlan | None:
        """The hand-written plan `label` as compiled in this process (an earlier budget), or None."""
        c = _COMPILED.get((self.sig, ("hand", label)))
        if c is None:
            return None
        self.tried[("hand", label)] = c.peak
        return HandPlan(label, c.plan, c.peak, c.matmul)

    def _dtype(self) -> str:
        """The dtype of the first differentiated argument (what the step's matmuls run in)."""
        return next((self.g.values[v].dtype for v in self.g.inputs if self.g.values[v].differentiable), "float32")

    def can_win(self, segments, quiet: bool = False) -> bool:
        """Whether a plan may recompute fewer FLOPs than the best fitting plan compiled so far
        (the model's recomputed FLOPs against the compiled one's, counted by the same cost
        rules; on the small transformer 0.800 vs 0.797 GFLOP for one plan); a plan that cannot
        is not compiled: at 1B parameters each compile takes 5-7 s.  Nor is one that could win by
        less than MIN_GAIN of the step's FLOPs."""
        known = _best_compiled(self.sig, self.budget)
        floor = MIN_GAIN * self.none_flops[0]  # global FLOPs, as compiled steps count them
        if known is None or _recompute_flops(segments) < (known.measured - floor) * self.share:
            return True
        if not quiet:
            flops = _recompute_flops(segments) / self.share
            self.say(f"  (a plan recomputing {flops / 1e9:.4g} GFLOP cannot beat the compiled "
                     f"{known.plan.meta.get('found_by', 'plan')}, +{known.measured / 1e9:.4g} GFLOP, by "
                     f"{MIN_GAIN:.1%} of the step's {self.none_flops[0] / 1e12:.3g} TFLOP: not compiled)")
        return False

    def _rebuilt(self, merge: str) -> ChainModel:
        """The chain rebuilt with blocks merged another way ("prev": activations closing their
        layer; "none": every cut kept, finer regions: the U-Net's stages need cuts of both kinds),
        as `start_rebuilds` began it in the background, or now."""
        said = {"prev": "the chain with activations closing their layer",
                "none": "the chain with every cut kept"}[merge]
        later = self.rebuilds.pop(merge, None)
        if later is not None:
            with working(self.say, f"rebuilding {said}"):
                model = later.result()
            self.say(f"rebuilt {said} (in the background, while the plans before it compiled)")
            return model
        self.say(f"rebuilding {said}")
        return build_chain_model(self.g, merge=merge, **self._build_kw())

    def _build_kw(self) -> dict:
        return dict(offload=self.offload, none_scale=self.model.none_scale, block_cache=self.block_cache)

    def start_rebuilds(self) -> None:
        """Begin both rebuilt chains on a background thread, one after the other.  They are
        Python (4-8 s at 1B) and XLA compiles without Python's lock, so they are built while the
        fallback's plans before them compile (benchmarks/infeasible.py, GPT: 68 s at edaf673,
        where each rebuild and its plan's compile took 11 and 15 s one after the other; 56 s
        at 8c4dc90, the same compiles)."""
        for merge in ("prev", "none"):
            if merge not in self.rebuilds:
                self.rebuilds[merge] = _chain_builder().submit(build_chain_model, self.g, merge=merge,
                                                               **self._build_kw())

    # -- phases ----------------------------------------------------------------------------
    def hand_policies(self) -> HandSearch | None:
        """Phase 1: JAX's policies per layer, compiled; the `HandSearch` that mixes them next
        (`hand_mixes`), or None without layers."""
        if not self.layers:
            return None
        none = HandPlan("no remat", None, self.baseline_peak, 0.0)
        hand = HandSearch(self.g, self.layers, self.compile_hand, none, self.say, self.meta, curve=self.mix_curve,
                          known=self.hand_known, best_fit=self._best_matmul,
                          presets=maxtext_presets(self.g, self.layers))
        hand.uniform(uniform_plans(self.g, self.layers, self.meta, hand.presets), self.budget)
        self.fixed = hand.peak_fixed(self.budget)
        if self.fixed is not None:
            self.say(f"{self.fixed}: the step's peak may be set by what remat does not touch; the "
                     f"half-and-half mix of the two and the plan of lowest predicted peak are compiled")
            hand.half_mix()
            self.twins = self._twin_points(hand.points)
            if not self.peak_moves(hand):
                return hand
        self.twins = self._twin_points(hand.points)
        return hand

    def hand_mixes(self, hand: HandSearch | None) -> None:
        """Phase 3: the best two-option mix for the budget (JAX's policies and the region solver's
        saved sets per layer), compiled where it could recompute less than every plan compiled
        so far that fits, the solver's first round among them (`first_round`)."""
        if hand is None:
            return
        key = self.g.traced.signature
        if key not in _LAYER_OPTIONS:  # CP-SAT per distinct layer and cap: once per signature
            _LAYER_OPTIONS[key] = ilp_options(self.g, self.layers)
        hand.solver_sets(self.budget, _LAYER_OPTIONS[key])
        hand.mix(self.budget)
        while hand.sets_alone(self.budget):  # a set over the budget: the next one, and its mixes
            hand.mix(self.budget)

    def peak_moves(self, hand: HandSearch) -> bool:
        """Where the hand-written plans say the step's peak is fixed (`HandSearch.peak_fixed`):
        the plan of lowest predicted peak compiled (`lowest_first`'s, so compiled once).  If it
        comes well under them (`HandSearch.peak_moves`), remat moves the peak after all and the
        search goes on (`fixed` cleared); else it ends with the hand-written plans.  The
        mixture-of-experts decoder under FSDP at 4.6 GiB: the two leanest policies compiled 24
        MiB apart (4.74 and 4.76 GiB), the lowest-peak plan 4.49, a uniform plan 4.09
        (benchmarks/budget_log.py --model moe --layout fsdp --batch-scale 8 --budget 4.6)."""
        how = _lowest_how("next")
        peak = self.compile_peak(lowest_peak_segments(self.model.problem), how)
        moves = hand.peak_moves(peak)
        self.say(f"  {how}: compiled {format_bytes(peak)}"
                 + (": remat moves the peak after all, the search goes on" if moves else ", no lower"))
        if moves:
            self.fixed = None
        return moves

    def mix_curve(self, lean, fast) -> list[int] | None:
        """`mix_curve` for this search's model and layers, once per pair (`HandSearch` finds a
        mix's layer count on it)."""
        if (lean, fast) not in self.curves:
            self.curves[(lean, fast)] = mix_curve(self.model, self.layers, lean, fast)
        return self.curves[(lean, fast)]

    def _twin_points(self, points: dict) -> list[tuple[int, float]]:
        """(compiled peak, compiled / predicted) of each hand-written per-layer policy, against
        the model's prediction of its twin: the same policy once per layer, its regions cut on
        the block boundaries nearest the layer's (`ChainModel.per_span`), on the layers the plan
        does not leave as written (`_hand._unauthored`)."""
        m, out = self.model, []
        for pol in POLICY_KIND_OF:
            plan = points[pol].plan if pol in points else None
            kind = _kind_of(as_written(pol, plan)) if plan is not None else None
            spans = [(la.start, la.stop) for la in self.layers if plan is None or not plan.leaves_alone(la.start, la.stop)]
            segs = m.per_span(kind, spans) if kind is not None else None
            if segs is not None:
                predicted = evaluate(m.raw_problem, segs)[0]
                out.append((points[pol].peak, points[pol].peak / max(predicted, 1)))
        return sorted(out)

    def under_prediction(self) -> float:
        """compiled / predicted near the budget: `_twin_points`' ratio interpolated between the
        hand-written peaks around the budget (the nearest one's outside them), at least 1."""
        pts = self.twins
        if not pts:
            return 1.0
        ratio = pts[0][1] if self.budget <= pts[0][0] else pts[-1][1]
        for (p0, r0), (p1, r1) in zip(pts, pts[1:]):
            if p0 <= self.budget <= p1:
                ratio = r0 + (r1 - r0) * (self.budget - p0) / max(p1 - p0, 1)
        return max(ratio, 1.0)

    def first_target(self) -> int:
        """The solver's first target: the budget, less what the model under-predicts plans near
        it by.  At 1B the model predicted the per-layer policies' twins 9-34% under their
        compiled peaks (benchmarks/budget_log.py, Llama), so a first round aimed at the budget
        overshot and cost a whole-step compile; aimed lower, equinox's fitting plans came a
        round sooner.  Never above the budget (the rounds raise it into unused memory)."""
        ratio = self.under_prediction()
        if ratio > 1.0:
            self.say(f"the model predicts the hand-written plans near the budget x{1 / ratio:.2f} of their "
                     f"compiled peaks: the solver aims at {format_bytes(int(self.budget / ratio))}")
        return int(self.budget / ratio)

    def probe_offload(self) -> None:
        """Phase 2: does offloading lower XLA's compiled peak here?  Compare the per-block plan
        that offloads the matmul outputs with the one that keeps them on the device.  Measured
        on an H100 with jax 0.11.2 (docs/FINDINGS.md): it does not; XLA keeps device buffers
        for the transfers and the offloading plans compiled above their device-only twins,
        some above no remat.  Plans that offload would only waste rounds there."""
        if not self.offload:
            return
        m = self.model
        dev, off = m.uniform("ckpt:save:dots", 1), m.uniform("ckpt:save:dots+offload", 1)
        if dev is None or off is None:
            return
        peak_dev, peak_off = self.compile_peak(dev), self.compile_peak(off)
        if peak_off >= peak_dev:
            self.say(f"offloading does not lower the compiled peak on this backend (matmul outputs offloaded "
                     f"per block: {format_bytes(peak_off)}, kept: {format_bytes(peak_dev)}); planning without "
                     f"offload")
            self.offload = False
            self.meta["offload"] = (f"disabled: offloading per block compiled to {format_bytes(peak_off)}, "
                                    f"not below {format_bytes(peak_dev)} without it")
            self.model = build_chain_model(self.g, offload=False, none_scale=m.none_scale,
                                           block_cache=self.block_cache)
        else:
            self.meta["offload"] = (f"kept: offloading per block compiled to {format_bytes(peak_off)}, below "
                                    f"{format_bytes(peak_dev)} without it")

    def lowest_first(self) -> None:
        """Before the rounds, where JAX's policies per layer all compiled over the budget (below
        the leanest plan a person writes): the plan of lowest predicted peak, the likeliest to
        fit, compiled first.  If it fits it is a candidate the rounds must beat; if not, how far
        above its prediction it came out (`excess`) corrects the rounds' plans, all predicted
        higher, and one out of reach ends them.  (ResNet-50 at 80% of `nothing_saveable` per
        layer, benchmarks/infeasible.py at edaf673: round 1, predicted at the budget once
        corrected, compiled to 2.89 GiB in 11 s before the lowest-peak plan's 2.57 said x1.68;
        81 s in all, 50 s at 8c4dc90.)"""
        if not self.twins or _best_compiled(self.sig, self.budget) is not None:
            return
        self.start_rebuilds()  # the fallback's, likely needed now: built while this compiles
        how = _lowest_how("next")  # `_try_lowest`'s and `peak_moves`': one plan, one label
        peak = self.compile_peak(lowest_peak_segments(self.model.problem), how)
        self.lowest_over = peak > self.budget
        self.say(f"  {how}: compiled {format_bytes(peak)}, {'over budget' if self.lowest_over else 'fits'}")

    def first_round(self, hand: HandSearch | None) -> None:
        """The solver's first round (`solver_rounds`), solved before the mixes and, where it could
        win, compiled among them as the mix search's `rival`: before the first mix count that
        recomputes more (or is expected over), so a plan of it that fits leaves those mixes
        uncompiled.  The dropout decoder (benchmarks/unseen.py) at nothing_saveable's 22.41 GiB,
        where JAX's policies per layer compile within 0.6 GiB of each other: 16 mixes compiled
        in 123 s (the best fitting, 5 layers nothing_saveable and 7 dots_saveable, +3.09 TFLOP
        in matmuls), then round 1 fitted at +0.76 (benchmarks/budget_log.py --model dropout at
        dedf4b3).  Compiled before every mix, it cost a compile where a solver's set's mix beat
        it (Llama and GPT 1B at their dots_with_no_batch_dims_saveable + dots_saveable mixes,
        benchmarks/realscale.py at 238336a)."""
        target = self.first_target()
        try:
            result = self._solve(target)
        except InfeasibleBudgetError:
            return
        self._say_round(0, result)
        self.first = (target, result, None)
        if hand is not None and self.can_win(result.segments, quiet=True) and not (
                self.lowest_over and not self.in_reach(result.segments)):
            hand.rival = (_recompute_flops(result.segments) / self.share, self._compile_first)

    def _compile_first(self) -> bool:
        """`first_round`'s plan, compiled (the mix search's `rival`) where it can still win
        (`can_win`: a mix compiled since may recompute less); whether it was."""
        target, result, _ = self.first
        if not self.can_win(result.segments, quiet=True):
            return False
        self.first = (target, result,
                      self._compile_round(0, result, "; among the mixes, which are compiled where they could beat it"))
        return True

    def _solve(self, target: int):
        """The chain solver's plan for `target` (raises InfeasibleBudgetError)."""
        return solve(self.model.problem, target, method=self.solver, time_limit=self.time_limit)

    def _say_round(self, rnd: int, result) -> None:
        self.say(f"round {rnd + 1}: solver {result.solver} ({result.status}, {result.solve_time:.2f}s) predicts "
                 f"{format_bytes(result.peak_bytes)}, +{result.objective * 1e3:.3g} ms, "
                 f"+{_recompute_flops(result.segments) / 1e9:.4g} GFLOP")

    def _compile_round(self, rnd: int, result, note: str = "") -> _Compiled:
        """Round `rnd`'s plan (from 0), compiled, and what XLA said of it."""
        same = next((h["round"] for h in self.history if h["segments"] == result.segments), None)
        got = self.compile_segments(result.segments, f"solver round {rnd + 1}", result)
        self.say(f"round {rnd + 1}: " + (f"the plan of round {same} again" if same else "compiled peak")
                 + f" {format_bytes(got.peak)} ({'fits' if got.peak <= self.budget else 'over budget'}), "
                 f"+{got.measured / 1e9:.4g} GFLOP recomputed (the model: "
                 f"+{_recompute_flops(result.segments) / self.share / 1e9:.4g}){note}")
        return got

    def solver_rounds(self):
        """Phase 4: (estimated time, segments, result, how) of the fastest solver plan that
        compiled within the budget, or None; with validate=False, the uncompiled `Planned`.
        Round 1 is `first_round`'s where that ran."""
        best, target = None, self.first_target() if self.first is None else self.first[0]
        steer = _Steer(self.budget)
        for rnd in range(self.max_rounds + MAX_RAISES):
            if rnd >= self.max_rounds + steer.raised:
                break
            first = self.first if rnd == 0 else None  # (target, result, compiled or None): `first_round`'s
            if first is not None:
                result = first[1]
            else:
                try:
                    result = self._solve(target)
                except InfeasibleBudgetError as e:
                    if best is None and rnd == 0 and not self.validate:
                        raise self._infeasible_unvalidated(e) from None
                    break
                self._say_round(rnd, result)
            if not self.validate:
                return self._unvalidated(result)
            ahead = first is not None and first[2] is not None  # compiled among the mixes
            if not ahead:
                if not self.can_win(result.segments):
                    target = steer.lifted(target, self.history) if best is None else None
                    if target is None:
                        break
                    continue
                if self.lowest_over and not self.in_reach(result.segments):
                    break
                if not steer.may_fit(result.peak_bytes, self.history):
                    self.say(f"round {rnd + 1}: not compiled: the rounds over budget compiled at least "
                             f"{steer.least_ratio(self.history):.3g}x their predicted peaks, which would put it over")
                    break
            compiled = (first[2] if ahead else self._compile_round(rnd, result)).peak
            self.history.append({"round": rnd + 1, "target": target, "predicted": result.peak_bytes,
                                 "compiled": compiled, "segments": result.segments})
            if compiled <= self.budget and (best is None or result.objective < best[0]):
                best = (result.objective, result.segments, result, f"solver round {rnd + 1}")
            target = steer.next(target, compiled, result.objective, best is not None, self.history)
            if target is None:
                break
        return best

    def policy_checks(self, best):
        """Phase 5: JAX's policies per block in the model's terms, where the time model cannot
        tell them from the solver's plan: one that recomputes fewer FLOPs, estimated at most
        POLICY_TOLERANCE slower (or faster), and compiles within the budget wins.  Then uniform
        plans (one option kind per block) that the model says are faster but over budget: the
        model over-predicts plans that save much.  The ones likeliest to fit are compiled first
        (lowest predicted peak), each time among those faster than the best so far and either
        faster than the solver's plan by more than POLICY_TOLERANCE or recomputing no more
        FLOPs (so a policy chosen for its FLOPs is not traded back for an estimate within the
        tolerance)."""
        cands = _uniform_candidates(self.model)
        best_flops, solver_extra = _recompute_flops(best[1]), best[0]
        for c in sorted((c for c in cands if c.is_policy), key=lambda c: c.flops):
            if (c.flops >= best_flops or c.extra > best[0] * (1 + POLICY_TOLERANCE)
                    or not self.reachable(c.peak) or not self.can_win(c.segs, quiet=True)):
                continue
            peak = self.compile_peak(c.segs, c.label)
            if peak <= self.budget:
                self.say(f"{c.label} recomputes fewer FLOPs at about the same estimated time and compiles "
                         f"within the budget")
                best = (c.extra, c.segs, None, f"{c.label}, blocks merged next")
                break
            self.say(f"  {c.label}, fewer FLOPs at about the same estimated time: compiled {format_bytes(peak)}, "
                     f"over budget")
        failed: set = set()
        for _ in range(MAX_UNIFORM_CHECKS):
            best_flops = _recompute_flops(best[1])
            pool = [c for c in cands
                    if c.segs != best[1] and c.segs not in failed and self.reachable(c.peak)
                    and c.extra < best[0] and (c.extra * (1 + POLICY_TOLERANCE) < min(best[0], solver_extra)
                                               or c.flops <= best_flops)]
            if not pool:
                break
            c = min(pool, key=lambda c: (c.peak, c.extra))
            peak = self.compile_peak(c.segs, c.label) if self.can_win(c.segs, quiet=True) else None
            if peak is not None and peak <= self.budget:
                self.say(f"{c.label} is faster and compiles within the budget")
                best = (c.extra, c.segs, None, f"{c.label}, blocks merged next")
            else:
                failed.add(c.segs)
                if peak is not None:
                    self.say(f"  {c.label}, estimated faster: compiled {format_bytes(peak)}, over budget")
        return best

    def settled(self) -> Planned:
        """The end of the search where no phase returned: the best plan compiled in this process
        for this signature that fits (for another budget, or a hand-written one), or the
        infeasible answer, with the reason where the step's peak is out of remat's reach
        (`fixed`: the search ends here after the hand-written plans, the rounds would compile
        for nothing)."""
        known = _best_compiled(self.sig, self.budget)
        if known is not None:
            return self.finish(known)
        raise self._infeasible("" if self.fixed is None else
                               f"; {self.fixed}: the step's peak is set by what remat does not touch")

    def fallback(self) -> Planned:
        """Phase 6, when no solver plan fits: compile-verified candidates for each way of
        cutting the chain into blocks (activations opening the next layer, closing their layer,
        no merging at all; the last two only while no compiled plan fits): the solver's plan for
        the budget; uniform plans (`_fallback_pool`); and the plan of lowest predicted peak
        (before the uniform plans while nothing compiled fits and it is predicted over the
        budget).  Raises InfeasibleBudgetError if none fits."""
        if _best_compiled(self.sig, self.budget) is None:
            self.start_rebuilds()  # the rebuilt chains are needed unless a plan of this one fits
        for variant in ("next", "prev", "none"):
            if variant != "next" and _best_compiled(self.sig, self.budget) is not None and not self.short_chain:
                # A compiled plan fits (a hand-written one): rebuilding the chain two more ways
                # costs region solves (at 1B, minutes with the compiles) for rarely better plans,
                # unless this chain's blocks fall short (`_try_lowest`).
                break
            if variant != "next":
                self.model = self._rebuilt(variant)
                try:
                    result = self._solve(self.budget)
                    how = f"solver, blocks merged {variant}"
                    if (self.can_win(result.segments) and self.in_reach(result.segments)
                            and self.compile_peak(result.segments, how, result) <= self.budget):
                        return self.accept(result.segments, result, how)
                except InfeasibleBudgetError:
                    pass
            low = lowest_peak_segments(self.model.problem)
            # predicted over the budget, the lowest-peak plan goes first: what it compiles to
            # corrects the predictions of the pool's plans, all predicted higher (`correction`)
            first = _best_compiled(self.sig, self.budget) is None and not self.reachable_at(low, 1.0)
            for turn in ("lowest", "pool") if first else ("pool", "lowest"):
                found = (self._try_lowest(low, variant) if turn == "lowest"
                         else self._try_pool(variant) if variant != "none" else None)
                if found is not None:
                    return found
        return self.settled()

    def _try_lowest(self, low, variant: str) -> Planned | None:
        """The plan of lowest predicted peak (`low`), compiled where it could win and is within
        reach; out of reach or not if nothing was compiled yet (an infeasible answer names the
        lowest compiled peak).  Accepted if it fits.  Over the budget, this chain's blocks fall
        short of every plan that could win (`short_chain`): the fallback rebuilds the chain the
        other ways even where a hand-written plan fits.  The small U-Net of `examples.convnet` at
        its per-stage dots_with_no_batch_dims_saveable's 9.1 MiB (+0.67 GFLOP): this chain's
        lowest compiled to 10.3 MiB, and the chain with every cut kept gave 8.6 MiB and +0.40
        (benchmarks/run.py, cpu.md)."""
        how = _lowest_how(variant)
        if self.can_win(low) and (not self.tried or self.in_reach(low)):
            peak = self.compile_peak(low, how)
            if peak <= self.budget:
                return self.accept(low, None, how)
            self.short_chain = True
            if not (variant == "next" and self.lowest_over):  # `lowest_first` said so
                self.say(f"  {how}: compiled {format_bytes(peak)}, over budget")
        return None

    def _try_pool(self, variant: str) -> Planned | None:
        """The fallback's uniform plans compiled in turn; the first that fits is accepted.  While
        a compiled plan fits already (a hand-written one), the ones that save the user's
        `checkpoint_name` tags (MaxText-style presets: hand-written plans in the user's own
        vocabulary) are tried first, fastest first (the first that fits is taken), then the
        model's own plans lowest predicted peak first, up to the first over budget: the rest
        are predicted higher, and at 1B each compile takes 6-7 s (benchmarks/realscale.py: on
        the Llama and GPT decoders none of the 2-8 tried per budget fitted where a hand-written
        plan did).  (The tags' plans are not ordered by the model: on the small scan transformer
        they won at three budgets, predicted above plans that compiled over.)  While nothing
        fits, all of them, fastest first.  Either way, not the model's plans out of reach
        (`_likely`): below the 1B Llama decoder's reach, where the model predicts the policies
        x0.66 of their compiled peaks, the fallback had compiled 18 of them over budget (25
        compiles, 264 s: benchmarks/infeasible.py at c949bc3; 6 at 9a7cab3)."""
        settled = _best_compiled(self.sig, self.budget) is not None
        chosen = self._fallback_pool(variant)
        if settled:
            chosen.sort(key=lambda c: (False, c.extra) if c.is_tags else (True, c.peak))
        chosen = self._likely(chosen, UNIFORM_NEAR if settled else UNIFORM_REACH)
        for k, c in enumerate(chosen):
            self.say(f"  trying {k + 1}/{len(chosen)}: {c.label} (predicted {format_bytes(c.peak)})")
            peak = self.compile_peak(c.segs, f"{c.label}, blocks merged {variant}")
            if peak <= self.budget:
                self.say(f"{c.label}: compiled {format_bytes(peak)} fits")
                return self.accept(c.segs, None, f"{c.label}, blocks merged {variant}")
            stop = settled and not c.is_tags
            self.say(f"  compiled {format_bytes(peak)}: over budget" + (
                "; the rest are predicted higher: stopping" if stop and k + 1 < len(chosen) else ""))
            if stop:
                return None
        return None

    def _likely(self, chosen: list, reach: float) -> list:
        """Of the model's plans, those predicted within `reach` x the budget (`reachable`; the
        user's tags' plans are all kept).  While a compiled plan fits, UNIFORM_NEAR: the plan
        would only improve on it, and at the policy mixes' budgets of the unrolled 1B decoders
        the one plan tried between 1.1 and 1.3x (dots_saveable once per repeated unit, x1.15-1.27
        corrected) compiled 18-28% over the budget each time, 5-8 s (benchmarks/budget_log.py
        --only mix at 7326a42: Llama, GPT, equinox).  While none fits, UNIFORM_REACH."""
        keep = [c for c in chosen if c.is_tags or self.reachable(c.peak, reach)]
        if len(keep) < len(chosen):
            self.say(f"  {len(chosen) - len(keep)} of them predicted over {reach:.1f}x the budget, corrected "
                     f"x{self.correction():.2f} like the hand-written plans' twins and the plans compiled: not compiled")
        return keep

    def correction(self) -> float:
        """What the model's predicted peaks are multiplied by: `under_prediction`, and the least
        that this search's compiled segment plans came out above their prediction so corrected
        (`excess`), where all did.  On ResNet-50 below its reach (benchmarks/infeasible.py at
        029b9c6) the twins said x1.08 and every plan of the model's compiled 1.4-1.6 times above
        that: 17 compiles in 244 s, where 6 showed the same (102 s at 4cdb333)."""
        return self.under_prediction() * max(1.0, min(self.excess, default=1.0))

    def reachable(self, predicted: float, reach: float = UNIFORM_REACH) -> bool:
        """Whether a plan the model predicts at `predicted` is, so corrected (`correction`),
        within `reach` x the budget."""
        return predicted * self.correction() <= reach * self.budget

    def reachable_at(self, segments, reach: float) -> bool:
        """`reachable` for the plan of `segments`."""
        return self.reachable(evaluate(self.model.raw_problem, segments)[0], reach)

    def in_reach(self, segments) -> bool:
        """`reachable` for the plan of `segments`, said when it is not (it is then not compiled)."""
        predicted = evaluate(self.model.raw_problem, segments)[0]
        if self.reachable(predicted):
            return True
        self.say(f"  (a plan predicted at {format_bytes(int(predicted * self.correction()))} once corrected "
                 f"(x{self.correction():.2f}) is over {UNIFORM_REACH:.1f}x the budget: not compiled)")
        return False

    def _fallback_pool(self, variant: str) -> list:
        """Fastest first, among those predicted within UNIFORM_REACH of the budget (the rest
        are hopeless and, on scans, crowd out the rest: 21 ILP caps), the ones predicted within
        UNIFORM_NEAR taken first; JAX's built-in policies per block, per layer or on the scan
        bodies, the user's checkpoint_name tags saved alone and the all-recompute ones are
        always among them (on the small scan transformer the eight fastest were all ILP sets
        over budget, and all-recompute won over dots_with_no_batch_dims_saveable, which
        fitted)."""
        cands = _uniform_candidates(self.model)
        reach = [c for c in cands if self.reachable(c.peak)]
        chosen = ([c for c in reach if c.peak <= UNIFORM_NEAR * self.budget]
                  + [c for c in reach if c.peak > UNIFORM_NEAR * self.budget])[:self.max_candidates]
        chosen += [c for c in cands if c not in chosen and (
            c.kind.endswith("recompute") or c.kind.startswith("scan:save:name:") or c.is_policy)]
        chosen = sorted((c for c in chosen if self.can_win(c.segs, quiet=True)), key=lambda c: c.extra)
        self.say(f"the model and XLA disagree; trying {len(chosen)} compile-verified uniform plans (blocks merged "
                 f"{variant})")
        return chosen

    # -- answers ---------------------------------------------------------------------------
    def accept(self, segments, result, how) -> Planned:
        self.compile_peak(segments, how, result)
        return self.finish(_best_compiled(self.sig, self.budget))

    def finish(self, best: _Compiled) -> Planned:
        """Phase 7: the fitting plan compiled in this process for this signature that recomputes least."""
        how = best.plan.meta.get("found_by", "")
        self.say(f"chosen: {how or 'the solver'}: compiled {format_bytes(best.peak)}, "
                 f"+{best.measured / 1e9:.4g} GFLOP recomputed ({best.matmul / 1e9:.4g} in matmuls)"
                 + (f" (model: {best.flops / 1e9:.4g})" if best.flops else "")
                 + f"; {self.compiles} plans compiled for this budget"
                 + (f" ({self.from_cache} of them read from the compile cache)" if self.from_cache else ""))
        plan = replace(best.plan, budget=self.budget, meta={
            **best.plan.meta, **self.meta, "compiled_peak": best.peak, "rounds": _rounds(self.history),
            "compiles": self.compiles, "cached_compiles": self.from_cache,
            "found_by": how, "extra_flops": best.measured, "extra_matmul_flops": best.matmul,
            "hand_candidates": _hand_table(self.sig)})
        return Planned(with_recompute_costs(self.g, plan), self.g.traced, self.model, self.baseline_peak, self.history)

    def _unvalidated(self, result) -> Planned:
        plan = with_recompute_costs(self.g, to_plan(self.model, result.segments, budget=self.budget, result=result,
                                                    meta=self.meta))
        warnings.warn(
            f"autoremat: plan for {self.meta['function']} predicts {format_bytes(result.peak_bytes)} for the budget "
            f"{format_bytes(self.budget)} but was NOT compiled to check it (validate=False)", stacklevel=6)
        return Planned(plan, self.g.traced, self.model, self.baseline_peak, self.history)

    def _infeasible_unvalidated(self, e) -> InfeasibleBudgetError:
        return InfeasibleBudgetError(
            f"budget {format_bytes(self.budget)} is below the lowest peak autoremat's model predicts for "
            f"{self.meta['function']}, {format_bytes(e.lowest)} (a prediction: validate=False compiled no "
            f"plan); raise the budget to at least {format_bytes(e.lowest)}, or plan with validate=True "
            f"for compiled figures" + self._offload_hint(), budget=self.budget, lowest=e.lowest)

    def _infeasible(self, why: str = "") -> InfeasibleBudgetError:
        lowest = min(self.tried.values())
        return InfeasibleBudgetError(
            f"budget {format_bytes(self.budget)} is below what autoremat could reach for {self.meta['function']}: "
            f"the lowest compiled peak it found is {format_bytes(lowest)}; raise the budget to at least "
            f"{format_bytes(lowest)}" + self._offload_hint() + self._opaque_hint() + why, budget=self.budget,
            lowest=lowest)

    def _opaque_hint(self) -> str:
        """Name what the planner cannot see into, where the step has it."""
        if not any(op.primitive == "shard_map" for op in self.g.ops.values()):
            return ""
        return ("; autoremat plans inside a shard_map only where one holds every matmul of the step, and here "
                "the others are one opaque step each to it: put jax.checkpoint inside their bodies, or shard with "
                "NamedSharding inputs under jax.jit instead")

    def _offload_hint(self) -> str:
        """Suggest offload only where it can help: off, not on the CPU (host memory is device
        memory there), and not already found useless by the probe."""
        if self.offload or self.profile_name == "cpu" or "offload" in self.meta:
            return ""
        return " or enable offload (offload=True)"


class _Steer:
    """Where the solver's next target goes after a compile (phase 3)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.raised, self.fit_target, self.over_target = 0, 0, None
        self.low = None  # the highest target whose plan could not win (`lifted`)
        self.fit_point = self.over_point = None  # (predicted, compiled) of the plans at those targets

    def next(self, target: int, compiled: int, objective: float, have_fit: bool, history: list) -> int | None:
        budget = self.budget
        point = (history[-1]["predicted"], compiled) if history else (target, compiled)
        if compiled <= budget:
            # The model over-predicted: the compiled plan leaves memory unused.  Ask the
            # solver for a plan predicted up to that much higher (a few times at most); the
            # fastest plan that compiles within the budget wins.
            slack = budget - compiled
            if target >= self.fit_target:
                self.fit_target, self.fit_point = target, point
            if self.raised >= MAX_RAISES or slack <= RAISE_SLACK * budget or objective <= 0:
                return None
            over = self.over_target
            nxt = target + slack if over is None else self._between()
            if nxt <= target or (over is not None and over - self.fit_target <= RAISE_SLACK * budget):
                return None
            self.raised += 1
            return nxt
        if have_fit:
            # A raised target overshot: aim between the highest target that fitted and it.
            if self.over_target is None or target < self.over_target:
                self.over_target, self.over_point = target, point
            if self.raised >= MAX_RAISES or self.over_target - self.fit_target <= RAISE_SLACK * budget:
                return None
            self.raised += 1
            return self._between()
        return self._step_down(target, point[0], compiled, history)

    def lifted(self, target: int, history: list) -> int | None:
        """After a round over the budget, the solver's plan for `target` cannot beat the best
        plan compiled (`PlanSearch.can_win`), and a lower target recomputes no less: the plans
        worth a compile lie between `target` and the lowest predicted peak that compiled over,
        so aim at the middle (None where there is no room).  The Griffin-style hybrid's scan
        under FSDP at 20.60 GiB a device (benchmarks/budget_log.py --model griffin_scan --layout
        fsdp --batch-scale 8): round 1, predicted 11.33 GiB, compiled 21.84; the step down asked
        for a plan at 10.01 recomputing 12.2 TFLOP, which could not beat the policy's 5.5, and
        the rounds ended there, where the plan found at the lower 18.98 GiB recomputes 3.0."""
        over = self._over(history)
        if not over:
            return None
        self.low = max(target, self.low or 0)
        return self._above_low(min(h["predicted"] for h in over))

    def may_fit(self, predicted: int, history: list) -> bool:
        """Whether a plan for a lifted target (`lifted`) may fit: its `predicted` peak times the
        least compiled bytes per predicted one of the rounds over the budget is within it (where
        the model misses a fixed part of the peak that ratio is more than the slope, so this
        lets through more than fit).  Where it does not, a higher target's plan does not
        either, and below it none can win.  ResNet-50 at dots_saveable's 2.99 GiB
        (benchmarks/budget_log.py --model resnet_flax): round 1 predicted 2.52 GiB compiled
        3.87, x1.54."""
        ratio = self.least_ratio(history) if self.low is not None else None
        return ratio is None or predicted * ratio <= self.budget

    def least_ratio(self, history: list) -> float | None:
        """The least compiled bytes per predicted one of the rounds over the budget (None: none)."""
        ratios = [h["compiled"] / h["predicted"] for h in self._over(history) if h["predicted"] > 0]
        return min(ratios, default=None)

    def _over(self, history: list) -> list:
        """The rounds of `history` whose plans compiled over the budget, in order."""
        return [h for h in history if h["compiled"] > self.budget]

    def margin(self) -> int:
        """How far under the budget a target read off a line aims: 0.5% of it, as the step down
        has since the rounds were written (not re-measured)."""
        return max(1, self.budget // 200)

    def _between(self) -> int:
        """A target strictly between the highest that fitted and the lowest that overshot: where
        the line through their plans' (predicted, compiled) peaks meets the budget less the
        `margin`, or the middle where that line does not rise.  Compiled peaks
        follow predicted ones nearly on a line between two such plans, while the middle may land
        far below the budget and take more rounds: the mixed-precision decoder under FSDP at
        `nothing_saveable`'s 7.09 GiB (`benchmarks/budget_log.py --model mixed --layout fsdp
        --batch-scale 8`), predicted 3.97 / 4.71 GiB, compiled 6.35 / 7.10; bisecting took three
        more rounds (6.68, 6.92, 7.00 GiB), where that line says 4.67 for 7.06."""
        mid = (self.fit_target + self.over_target) // 2
        (p0, c0), (p1, c1) = self.fit_point, self.over_point
        if p1 <= p0 or c1 <= c0:
            return mid
        aim = p0 + (self.budget - self.margin() - c0) * (p1 - p0) / (c1 - c0)
        return int(min(max(aim, self.fit_target + 1), self.over_target - 1))

    def _step_down(self, target: int, predicted: int, compiled: int, history: list) -> int | None:
        """The model under-predicted: ask the solver for less.  After two over-budget rounds,
        follow the line through them (the model's error often grows as plans get lower, and
        stepping down by the overshoot alone then takes many rounds); else step down by the
        overshoot; and in any case the `margin` below the over-budget plan's own `predicted`
        peak: the solver's fastest plan within a target is the fastest within every lower
        target it meets, so any target from there up returns it again.  LoRA's scan over layers
        at dots_with_no_batch_dims_saveable's 29.35 GiB (benchmarks/unseen.py): the plan
        predicted at 16.48 GiB compiled 0.16 over, and stepping down by that asked for it in all
        four rounds; below it, round 2 fitted (28.51 GiB, +1.10 TFLOP, where the fallback then
        took one at 21.03 recomputing 1.13).  A byte below was too little: on the flax scan
        (benchmarks/realscale.py) halfway between dots_with_no_batch_dims_saveable and
        dots_saveable, the solver then gave a plan predicted at the same 10.32 GiB, cut
        differently, which compiled to the same 19.61."""
        budget = self.budget
        over = self._over(history)
        step = min(target - (compiled - budget), predicted) - self.margin()
        if len(over) >= 2 and over[-2]["predicted"] != over[-1]["predicted"]:
            (p1, c1), (p2, c2) = ((h["predicted"], h["compiled"]) for h in over[-2:])
            slope = (c2 - c1) / (p2 - p1)
            if slope > 0.05:
                step = min(step, int(p2 - (c2 - budget) / slope) - self.margin())
        if self.low is not None and step <= self.low:  # below it the plans cannot win (`lifted`)
            return self._above_low(min(predicted, target))
        return step if step > 0 else None

    def _above_low(self, high: int) -> int | None:
        """The middle between `low` (`lifted`) and the `margin` below `high`, if above `low`."""
        nxt = (self.low + high - self.margin()) // 2
        return nxt if nxt > self.low else None


def _lowest_how(variant: str) -> str:
    """The label of the plan of lowest predicted peak on the chain whose blocks merge `variant`."""
    return f"lowest predicted peak, blocks merged {variant}"


def _rounds(history: list) -> list:
    """The solver rounds as plan metadata (without their segments)."""
    return [{k: v for k, v in h.items() if k != "segments"} for h in history]


def start_first_hand_plans(fn, g: Graph, layers, call) -> None:
    """The fastest of JAX's policies on every layer (`HandSearch.uniform` compiles it first
    whenever there are layers and the un-optimized step does not fit), compiled in the
    background while the un-optimized step compiles and the chain model is built.  `call`:
    (abstract args, kwargs, compiled_stats keywords), as `PlanSearch` compiles them."""
    args, kwargs, stats_kw = call
    first = [replace(plan, meta={**plan.meta, "found_by": label})
             for pol, label, plan in uniform_plans(g, layers) if pol == HAND_POLICIES[-1]]
    for plan in first:
        key = (g.traced.signature, _plan_content(plan))
        if key not in _STARTED and not any(k[0][0] == key[0] and k[1] == key[1] for k in _BY_CONTENT):
            program = Future()
            _STARTED[key] = compile_later(_stats, fn, plan, args, stats_kw, kwargs, program), program


def _chain_builder() -> ThreadPoolExecutor:
    """The one background thread `PlanSearch.start_rebuilds` builds chains on (one: two builds
    side by side would share a core the compiles need, and hold Python's lock in turn)."""
    global _BUILDER
    if _BUILDER is None:
        _BUILDER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autoremat-chain")
    return _BUILDER


class _Stats(NamedTuple):
    stats: CompiledStats
    same_as: str | None  # the plan compiled before whose program this one's is (not compiled again)


def _keep_staged(key, staged: StagedStep) -> None:
    """`staged` kept for the first `compile_once` that needs it; at most MAX_STAGED, the oldest
    (not taken since) dropped first."""
    while len(_STAGED) >= MAX_STAGED:
        del _STAGED[next(iter(_STAGED))]
    _STAGED[key] = staged


def _stage(fn, plan: Plan, args, stats_kw: dict, kwargs: dict) -> StagedStep:
    """The step of `fn` under `plan`, traced and lowered (`runtime.stage_step`)."""
    return stage_step(apply(fn, plan), *args, **stats_kw, **kwargs)


def _stats(fn, plan: Plan, args, stats_kw: dict, kwargs: dict, program: Future) -> _Stats:
    """The `CompiledStats` of `fn` under `plan` (`_compile_staged`); `program` gets the step's
    program key once it is lowered, before it compiles (or the error lowering it raised)."""
    try:
        staged = _stage(fn, plan, args, stats_kw, kwargs)
    except BaseException as e:
        program.set_exception(e)
        raise
    program.set_result(staged.program_key())
    return _compile_staged(staged, plan.meta.get("found_by") or "a plan")


def _compile_staged(staged: StagedStep, label: str) -> _Stats:
    """The `CompiledStats` of a staged step.  A step that lowered to a program compiled before
    in this process (`StagedStep.program_key`) is not compiled again: its own jaxpr's FLOPs,
    that program's memory.  Plans written differently can be one program: a policy decides per
    primitive, and ResNet-50's layers have no matmul, so nothing_saveable and
    dots_with_no_batch_dims_saveable per layer lowered alike (3.2-4.0 s to trace and lower the
    second at 1B, where compiling it had taken 10.6 s more: benchmarks/infeasible.py's logs,
    docs/FINDINGS.md thirteenth session)."""
    key = staged.program_key()
    if key in _BY_PROGRAM:
        st, same_as = _BY_PROGRAM[key]
        return _Stats(replace(st, jaxpr_flops=staged.jaxpr_flops, matmul_flops=staged.matmul_flops), same_as)
    st = compile_step(staged, cache=True)
    _BY_PROGRAM.setdefault(key, (st, label))
    return _Stats(st, None)


def _best_compiled(sig, limit: int) -> _Compiled | None:
    """The plan compiled in this process for `sig` that fits `limit` and recomputes the fewest
    FLOPs (then: estimated fastest, lowest peak)."""
    fits = [c for (s, _), c in _COMPILED.items() if s == sig and c.peak <= limit]
    return min(fits, key=lambda c: c.rank, default=None)


def _scan_barriers(sig) -> bool:
    """Whether the solver's scan-body plans for `sig` get JAX's optimization barriers
    (`ScanPlan.prevent_cse`): yes where a JAX policy on the scan bodies, written by hand both ways
    (`uniform_plans`) and compiled in this process, came out lower with them, and none higher.
    Which is lower depends on the model, so it is measured, not assumed: on the built-in scan
    transformer (CPU, jax 0.10.2) the nothing-saved body compiled to 51.3 MiB with barriers and
    50.8 without (docs/FINDINGS.md, "Scan bodies: no optimization barriers"), and the 1B scan
    decoders of benchmarks/realscale.py alike both ways; penzai's LayerStack decoder
    (benchmarks/unseen.py) compiled to no remat's 32.70 GiB without them under every policy and
    to 9.78-16.88 GiB with them, so without barriers every solver plan for it came out at no
    remat's peak.  No such pair compiled: without, as before."""
    peaks: dict = {}
    for (s, key), c in _COMPILED.items():
        if s == sig and key and key[0] == "hand" and c.plan is not None and c.plan.scans and not c.plan.regions:
            body = {(sp.op, sp.policy) for sp in c.plan.scans}
            cse = {sp.prevent_cse for sp in c.plan.scans}
            if len(cse) == 1:
                peaks.setdefault(frozenset(body), {})[cse.pop()] = c.peak
    pairs = [(p[True], p[False]) for p in peaks.values() if len(p) == 2]
    return any(a < b for a, b in pairs) and not any(a > b for a, b in pairs)


def _hand_table(sig) -> list[dict]:
    """The hand-written plans compiled for `sig`: label, compiled peak, extra FLOPs."""
    return [{"label": key[1], "compiled_peak": c.peak, "extra_flops": c.measured, "extra_matmul_flops": c.matmul}
            for (s, key), c in _COMPILED.items() if s == sig and key and key[0] == "hand"]


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
    def is_tags(self) -> bool:
        """Saves the user's `checkpoint_name` tags, alone or beside the matmul outputs."""
        return "save:name" in self.kind or "save:dots_no_batch+" in self.kind

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
        around = kind.startswith(AROUND)  # a region over a layer holding a scan: per layer only
        shapes = [(size, 0) for size in ((0, 1, 2, 3, 4) if has_scan else (1, 2, 3, 4))
                  if (size <= 2 or kind.endswith("recompute")) and not around]
        if period is not None and (kind in POLICY_KINDS or around):
            shapes.append((period[1], period[0]))  # one region per repeated unit (layer)
        for size, offset in shapes:
            segs = model.uniform(kind, max(size, 1), scans_only=size == 0, offset=offset)
            if segs is not None and segs not in seen:
                seen.add(segs)
                peak, extra = evaluate(model.raw_problem, segs)
                cands.append(_Candidate(extra, kind, size, segs, peak, _recompute_flops(segs), offset))
    cands.sort(key=lambda c: c.extra)
    return cands


def _kind_of(option) -> str | None:
    """The chain model's option kind of a hand-written per-layer option (JAX's policy by name,
    None: no remat, `Nested`: the policy on the layer and on its scans' bodies); None for others.
    A region around a scan saves nothing outside the scan (`_Regions.around_scan`), so of the
    nested policies only `nothing_saveable`'s has a twin: taking `AROUND + scan:save:dots` for
    `dots_saveable` on the layers and cells of the Mamba-2-style decoder (benchmarks/unseen.py
    `ssd`, at d0dba34) expected 6.85 GiB of a plan that compiled to 15.93."""
    if isinstance(option, Nested):
        return AROUND + "scan:recompute" if option.policy == HAND_POLICIES[0] else None
    return "none" if option is None else POLICY_KIND_OF.get(option) if isinstance(option, str) else None


def mix_curve(model: ChainModel, layers, lean, fast) -> list[int] | None:
    """The chain model's peak of the mix of two per-layer options (`_kind_of`), `lean` on the
    first layers and `fast` on the last k, for k = 0..n; None for other options or where the
    chain's blocks do not cover the layers."""
    kinds = (_kind_of(lean), _kind_of(fast))
    if None in kinds:
        return None
    n, spans = len(layers), [(la.start, la.stop) for la in layers]
    segs = [model.per_span([kinds[0]] * (n - k) + [kinds[1]] * k, spans) for k in range(n + 1)]
    return None if None in segs else [evaluate(model.raw_problem, sg)[0] for sg in segs]


def _recompute_flops(segments) -> float:
    return sum(sg.option.recompute_flops for sg in segments)


def _plan_content(plan: Plan) -> tuple:
    """What `apply` makes of a plan: its regions and scan plans, without labels or meta."""
    def region(r):
        return (r.start, r.stop, tuple(sorted(r.saved)), tuple(sorted(r.offloaded)), r.policy,
                tuple(region(c) for c in r.children))

    return (tuple(region(r) for r in plan.regions),
            tuple((s.op, tuple(sorted(s.saved)), tuple(sorted(s.offloaded)), s.policy, s.prevent_cse)
                  for s in plan.scans))
