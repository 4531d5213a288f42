"""Hand-written plans: what a person would write, compiled so that autoremat never loses to it;
and, in the same form, the region solver's saved sets per layer.

autoremat's promise is that at any budget where a per-layer JAX policy or a mix of two fits,
its plan fits too and recomputes no more.  The plan search keeps it by construction: the plans
a person would write are among the candidates it compiles, and the answer is the fitting
compiled plan that recomputes the fewest FLOPs.

* `layer_plan`: one `jax.checkpoint(policy=...)` per layer (`graph.find_layers`): an unrolled
  layer becomes a region, a top-level scan gets the policy on its body with JAX's default
  optimization barriers, exactly as written by hand.
* `HandSearch.uniform`: JAX's built-in policies, each on every layer; where a layer is a scan,
  also with `prevent_cse=False` on its body (what JAX's docs and MaxText write inside a scan);
  fastest first, up to the first that fits (the leaner ones cannot recompute less).
* `HandSearch.solver_sets`: the region solver's saved set per layer (`_layer_options`) where a
  line through the policies' compiled peaks predicts it fits and recomputes less: an option for
  the mixes, compiled alone (`HandSearch.sets_alone`) only where none of its mixes fits.
* `HandSearch.mix`: for a budget between two of them, the last `k` layers under the faster
  policy and the rest under the leaner one; `k` from the faster one's compiled peak less what
  the leaner layers store less (where the layers are alike; else the chain model's peak of
  each count between the two compiled peaks), then corrected by compiling (the peak grows with
  `k`); every pair of policies (and no remat) that brackets the budget and a solver set's pair
  are settled together, one compile at a time.

FLOPs are the matmul FLOPs of the step's jaxpr (`CompiledStats.matmul_flops`: recomputation
included, scan bodies times their trip count), relative to the un-optimized step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import jax.extend as jex

from autoremat._layer_options import fit_peak_line, layer_body, name_presets, policy_keeps, policy_layer_flops
from autoremat._units import format_bytes
from autoremat.graph._graph import Graph
from autoremat.graph._interpret import checkpoint_params
from autoremat.graph._layers import Layer, layer_spans
from autoremat.graph._trace import describe_eqn
from autoremat.runtime._plan import Plan, Region, ScanPlan, ValueRecord

__all__ = ["HAND_POLICIES", "HandPlan", "HandSearch", "Nested", "as_written", "authored_layers", "layer_plan",
           "maxtext_presets", "uniform_plans"]

# JAX's built-in policies a person applies per layer, leanest first.
HAND_POLICIES = ("nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable")
MAXTEXT = "maxtext "  # MaxText's presets as hand-written options: "maxtext minimal", ... (`uniform_plans`)
_POLICIES = (None, *HAND_POLICIES)  # the options a person writes per layer (None: no remat)
# The same, each storing in every layer what the one before it stores and more (no remat last).
_NESTED = (*HAND_POLICIES, None)
# Solver saved sets compiled alone per search (`HandSearch.sets_alone`): each is a whole-step
# compile (5-9 s at 1B).  The line through the policies' peaks predicted the small transformer's
# ilp25% set at 50.4 MiB (compiled 50.3) and the 16-layer 1B decoder's ilp10% set at 10.33 GiB
# (compiled 10.84, +5%), so the first one tried may miss; a second covers that, a third has not
# been seen to pay.
MAX_SET_COMPILES = 2
# Plans traced and lowered while another compiles (`PlanSearch.stage_ahead`): the next policy
# or the mix counts either side, the likeliest next compiles.  Tracing and lowering a 1B
# decoder's step takes 1.6-2.4 s against 5.0-6.4 s of XLA compile
# (benchmarks/results/compile_anatomy-llama.md), so two fit in one.
AHEAD = 2
# Compiles spent stepping to a mix's layer count; past them the counts still open are settled by
# bisection (at most log2 of the open range more).  The peak is not linear in the count: on the
# 18-layer 1B decoder (benchmarks/realscale.py) the line through nothing_saveable's and
# dots_with_no_batch_dims_saveable's peaks gave 0.22 GiB per layer, the compiled mixes 0.28, and
# secant steps then a bisection settle 18 layers within 5 compiles (log2 18 < 5).  Where the steps
# walk a plateau first they may not: penzai's decoder written per device
# (benchmarks/results/sharded_dp_unseen.md at 8b540d1) compiled the counts 1, 2 (a plateau), 7, 4
# and 5, stopped there, and lost to the hand-written 6 (6.598 against 5.773 TFLOP).
MAX_MIX_STEPS = 5
# Mix compiles per budget of the pairs with one of MaxText's presets (`HandSearch.mix`; the pairs of
# JAX's policies are not counted).  With seven presets on the tagged Llama 1B and no such bound,
# one budget took 19 compiles (94 s), 13 of them the presets' mixes; where a preset's mix won, it
# was the first to third of them compiled (benchmarks/realscale.py --models llama_tags --planner-log, at the
# presets' and the policies' peaks: results/presets.md).
MAX_PRESET_MIXES = 4
# A mix count whose peak, predicted as the faster policy's compiled peak less the chain model's
# fall from n layers to k, is over the budget by more than this is not compiled.  That
# prediction came out above the compiled peak once in 47 hand-written mixes of the four
# unrolled real-scale models, by 0.7% (benchmarks/results/mix_counts.md, "fall"; the others
# by 0.0% or under), and XLA's peak wanders by about 1% between neighbouring counts
# (docs/FINDINGS.md, "A mix's peak is not convex"): 3% stays clear of both.  Likewise a pair of
# JAX's policies whose first line (`HandSearch._first_line`) puts one layer of the faster one
# over the budget by no more than this is still tried (the bytes step's worst over-prediction
# on the 40 mixes of the alike-layer decoders there: +0.7%).
FALL_SLACK = 0.03
# A mix's peak may not rise with its count at first (its peak is elsewhere), then rise: where the
# counts compiled so far rose by less than this share of what the line through the last count that
# fits and the first over says they would, the search bisects instead of stepping one count a
# compile (`_next_count`).  Shares measured: on the plateaus 1e-6 (the alternating decoder under
# FSDP, benchmarks/results/sharded_unseen.md: 64 bytes a count against the line's 80 MiB) and 0.0
# (ResNet-50's dots_no_batch/dots mixes at nothing_saveable's peak, 32 bytes apart); on mixes that
# rise, 0.46-0.49 (Llama 1B under FSDP, where bisecting cost a compile that stepping saves) and
# about 0.88 where they rise with the count (GPT 1B: 0.219 GiB a layer compiled against 0.25
# stored, docs/FINDINGS.md).  0.25 lies between the two kinds.
PLATEAU_RISE = 0.25
# Where JAX's two leanest policies per layer compile over the budget to peaks nearer together
# than this share of the bytes they store apart, the step's peak may not be set by what its
# layers store (`HandSearch.peak_fixed`); the plan of lowest predicted peak, compiled, says
# whether it is (`HandSearch.peak_moves`: it must come under every hand-written plan by at
# least this share of those bytes).  Shares measured (|peak difference| / stored difference,
# benchmarks/results/peak_sensitivity.md at 1b06df9): 0.0005 on the 1B decoder written per
# device at one example a device (680 KiB apart, storing 1.34 GiB apart), where no plan
# compiled lower; 0.047 on the mixture-of-experts decoder under FSDP (batch x8:
# dots_with_no_batch_dims_saveable 24 MiB under nothing_saveable, storing 513 MiB more), where
# the plan of lowest predicted peak compiled 0.24 GiB under both and a uniform plan 0.64
# (docs/FINDINGS.md, thirty-sixth session); 0.29-1.0 on every other unrolled model and layout
# there, 11.5-54 on the scans (their bodies' bytes count once).  0.05 screens; the compile decides.
FIXED_PEAK_SHARE = 0.05


@dataclass
class _Pair:
    """A two-option mix being settled (`HandSearch.mix`): the last k layers `fast`, the rest
    `lean`; counts below `floor` cannot fit (`HandSearch._lean_floor`)."""

    lean: object
    fast: object
    floor: int
    over: int  # the fewest layers of `fast` compiled over the limit (n: `fast` alone is)
    line: Callable[[int], float]  # the peak expected at each count
    peaks: dict[int, int]  # count -> compiled peak (0 and n: the two options alone)
    fit: int = 0  # the most layers of `fast` compiled within the limit
    steps: int = 0  # counts compiled
    dropped: bool = False  # its fewest winning count was predicted well over (`_surely_over`)
    lean_compiled: bool = True  # peaks[0] compiled, not predicted (a solver's set: `solver_sets`)
    step: float | None = None  # the first line's bytes step per layer, where it is one (`_bytes_step`)


@dataclass(frozen=True)
class Nested:
    """JAX's `policy` on a layer and on the body of every scan in it, as a person checkpoints a
    recurrent layer and its cell: JAX keeps the cell's residuals through the layer's checkpoint
    (`solver._chain_model._Regions.around_scan`), so it stores per step what the cell's policy
    keeps and re-runs the rest of the layer.  On the unrolled stacked LSTM (benchmarks/_unseen.py
    `lstm`), `nothing_saveable` so compiles to 8.63 GiB, on the layers alone to 18.63 and on the
    cells alone to 16.00."""

    policy: str

    def __str__(self) -> str:
        return f"{self.policy} on the layer and its scans"


@dataclass(frozen=True)
class HandPlan:
    """A compiled hand-written plan: its label, plan, compiled peak and extra matmul FLOPs."""

    label: str
    plan: Plan
    peak: int
    extra_flops: float
    compiled: bool = True  # False: `peak` is predicted and `extra_flops` the model's count (`solver_sets`)


def layer_plan(g: Graph, layers: Sequence[Layer], policies: Sequence, *,
               meta: dict | None = None, prevent_cse: bool = True) -> Plan:
    """`policies[i]` on layer i of the traced function of `g`: a `jax.checkpoint_policies`
    name, a set of value ids to save (`_layer_options`), or None (left alone); `prevent_cse`
    for the bodies of scans (regions always have JAX's default barriers).  The plan's value
    records say what each layer saves."""
    traced = g.traced
    regions, scans = [], []
    for k, (layer, pol) in enumerate(zip(layers, policies)):
        if pol is None:
            continue
        eqn = traced.jaxpr.eqns[layer.start]
        if isinstance(pol, Nested):
            regions.append(Region(layer.start, layer.stop, policy=pol.policy, label=f"layer {k}: {pol}"))
            scans += [ScanPlan(f"e{i}", policy=pol.policy, prevent_cse=True) for i in _scans_in(traced, layer)]
        elif layer.stop - layer.start == 1 and eqn.primitive.name == "scan":
            sets = isinstance(pol, frozenset)
            scans.append(ScanPlan(f"e{layer.start}", saved=pol if sets else frozenset(), policy="" if sets else pol,
                                  prevent_cse=prevent_cse))
        elif isinstance(pol, frozenset):
            regions.append(Region(layer.start, layer.stop, saved=pol, label=f"layer {k}: {len(pol)} saved"))
        else:
            regions.append(Region(layer.start, layer.stop, policy=pol, label=f"layer {k}: {pol}"))
    return Plan(fingerprint=traced.fingerprint, n_eqns=len(traced.jaxpr.eqns), regions=tuple(regions),
                scans=tuple(scans), argnums=traced.argnums, static_argnums=traced.static_argnums,
                has_aux=traced.has_aux, meta={"layers": layer_spans(layers), **(meta or {})},
                values=_records(g, layers, policies),
                structure=tuple(describe_eqn(e) for e in traced.jaxpr.eqns),
                user_checkpoints=kept_user_checkpoints(traced, layers, policies))


def _scans_in(traced, layer: Layer) -> list[int]:
    """The top-level scan equations of a layer that is not a scan itself."""
    eqns = traced.jaxpr.eqns
    return [] if layer.stop - layer.start == 1 else [
        i for i in range(layer.start, layer.stop) if eqns[i].primitive.name == "scan"]


def kept_user_checkpoints(traced, layers: Sequence[Layer], policies: Sequence) -> tuple[int, ...]:
    """The user's own checkpoints (`Traced.user_regions`) a person keeps when they put
    `policies` on `layers`: those inside a layer under a JAX policy or left alone, and those
    outside every layer.  Not those a policy replaces (over a whole layer, or over more than
    one), nor those inside a layer under a solver's set, which decides per value what the
    layer keeps (it was solved on the inlined layer)."""
    kept = []
    for k, u in enumerate(traced.user_regions):
        home = next(((la, pol) for la, pol in zip(layers, policies)
                     if la.start <= u.start and u.stop <= la.stop), None)
        if home is None:
            if all(u.stop <= la.start or la.stop <= u.start for la in layers):
                kept.append(k)
            continue
        la, pol = home
        whole = (u.start, u.stop) == (la.start, la.stop)
        if pol is None or (isinstance(pol, (str, Nested)) and not whole):
            kept.append(k)
    return tuple(kept)


def _records(g: Graph, layers: Sequence[Layer], policies: Sequence) -> dict[str, ValueRecord]:
    """Per value produced at the top level of a layer (or in a scan layer's body) that the
    policy stores (`policy_keeps`) or the backward pass reads: saved or recomputed under the
    layer's policy (values inside nested calls are not listed); under `Nested`, the values of
    the bodies of the layer's scans too, their bytes stacked over the scan's steps."""
    out = {}
    for layer, pol in zip(layers, policies):
        if pol is None:
            continue
        parts = [layer_body(g, layer)]
        if isinstance(pol, Nested):
            pol = pol.policy
            scans = [g.ops[f"e{i}"] for i in _scans_in(g.traced, layer)]
            parts += [(s.bodies[0], list(s.bodies[0].ops.values()), int(s.params.get("length", 1))) for s in scans]
        for k, (graph, ops, length) in enumerate(parts):
            residual, keeps = set(graph.residual_values()), policy_keeps(graph, ops, pol)
            for op in ops:
                for vid in op.outputs:
                    if vid in residual or vid in keeps:
                        rec = ValueRecord.from_graph(vid, "save" if vid in keeps else "recompute", graph.values[vid], op)
                        out[vid] = replace(rec, nbytes=rec.nbytes * length) if k else rec
    return out


def authored_layers(traced, layers: Sequence[Layer]) -> tuple[bool, ...]:
    """Per layer, whether it holds one of the user's own `jax.checkpoint`s: inlined among its
    top-level equations (`Traced.user_regions`), or inside a scan (or other body) among them."""
    eqns = traced.jaxpr.eqns

    def holds(la: Layer) -> bool:
        return (any(la.start <= u.start and u.stop <= la.stop for u in traced.user_regions)
                or any(_has_checkpoint(e) for e in eqns[la.start:la.stop]))
    return tuple(holds(la) for la in layers)


def _has_checkpoint(eqn) -> bool:
    """Whether `eqn` is a `jax.checkpoint` or holds one in a body (a scan's, a cond's branches, a call's)."""
    if checkpoint_params(eqn) is not None:
        return True
    bodies = [b for v in eqn.params.values() for b in (v if isinstance(v, (tuple, list)) else (v,))]
    return any(_has_checkpoint(e) for b in bodies if isinstance(b, (jex.core.ClosedJaxpr, jex.core.Jaxpr))
               for e in (b.jaxpr if isinstance(b, jex.core.ClosedJaxpr) else b).eqns)


def _unauthored(authored: Sequence[bool], options: Sequence[tuple]) -> list[tuple]:
    """Each (policy, label, option per layer) of `options` on the layers without the user's own
    checkpoints alone, the others left as the user wrote them, where some layers hold them
    (`authored`) and some do not: a person adding a policy per layer leaves the layers they have
    checkpointed already.  A decoder whose loss is a scan over chunks of the sequence, each chunk
    under the author's `jax.checkpoint` (benchmarks/_unseen.py `chunked_scan`): the loss's scan is
    a layer too, and each policy on both scans replaced the author's checkpoint (saving the
    chunks' logits), so the policy on the layers alone, as a person writes it, was no candidate."""
    if not any(authored) or all(authored):
        return []
    return [(pol, f"{label.removesuffix(' per layer')} on the layers without your checkpoints",
             [None if a else x for a, x in zip(authored, per_layer)]) for pol, label, per_layer in options]


def maxtext_presets(g: Graph, layers: Sequence[Layer]) -> dict[str, tuple[frozenset, ...]]:
    """MaxText's presets on `layers` (`_layer_options.name_presets`), as `HandSearch.presets`."""
    return {f"{MAXTEXT}{name}": sets for name, sets in name_presets(g, layers)}


def uniform_plans(g: Graph, layers: Sequence[Layer], meta: dict | None = None,
                  presets: Mapping[str, Sequence[frozenset]] | None = None) -> list[tuple[str, str, Plan]]:
    """(policy, label, plan) of each of `HAND_POLICIES` on every layer, then of each of `presets`
    ("maxtext <preset>" -> the values it saves per layer: `HandSearch.presets`, MaxText's presets
    on layers tagged with its names); where some layers hold the user's own checkpoints and others
    do not (`authored_layers`), each also on the others alone (`_unauthored`); where a layer is a
    scan, twice: with JAX's default barriers on its body and with `prevent_cse=False` (not where the
    scan is unrolled: `OpInfo.unrolled`)."""
    n = len(layers)
    scans = any(g.traced.jaxpr.eqns[la.start].primitive.name == "scan" and not g.ops[f"e{la.start}"].unrolled
                for la in layers)
    options = [(pol, f"{pol} per layer", [pol] * n) for pol in HAND_POLICIES]
    options += [(pol, f"MaxText's {pol.removeprefix(MAXTEXT)} per layer", list(sets))
                for pol, sets in (presets or {}).items()]
    options += _unauthored(authored_layers(g.traced, layers), options)
    plans = [(pol, label + ("" if cse else " (scan bodies with prevent_cse=False)"),
              layer_plan(g, layers, per_layer, meta=meta, prevent_cse=cse))
             for pol, label, per_layer in options for cse in ((True, False) if scans else (True,))]
    if any(_scans_in(g.traced, la) for la in layers):  # recurrent layers: the policy on their cells too
        plans += [(pol, f"{pol} per layer and on the scans in it",
                   layer_plan(g, layers, [Nested(pol)] * n, meta=meta)) for pol in HAND_POLICIES]
    return plans


class HandSearch:
    """The hand-written plans of one traced function.

    `compile(plan, label, ahead=(), beside=())` is the caller's: it compiles a plan (once per
    process) and returns a `HandPlan`; the plans of `ahead` are the likeliest next, worth tracing
    meanwhile, the (plan, label) pairs of `beside` certain to be compiled next (`_certain`), or
    all but certain (the next policy, where the model puts the one compiling over).
    `none` is the un-optimized step as a `HandPlan` (no region at all).
    """

    def __init__(self, g: Graph, layers: Sequence[Layer], compile: Callable[..., HandPlan],
                 none: HandPlan, say: Callable[[str], None], meta: dict | None = None,
                 curve: Callable[[object, object], Sequence[int] | None] | None = None,
                 known: Callable[[str], HandPlan | None] | None = None,
                 best_fit: Callable[[int], float] | None = None,
                 presets: Mapping[str, Sequence[frozenset]] | None = None):
        self.g, self.traced, self.layers, self.compile, self.say = g, g.traced, tuple(layers), compile, say
        self.meta = dict(meta or {})
        self.known = known or (lambda label: None)  # label -> the plan compiled already (an earlier budget)
        self.mixes: list[HandPlan] = []  # the mixes compiled (`mix`)
        # limit -> the fewest extra matmul FLOPs of a plan compiled in this process that fits it
        self.best_fit = best_fit or (lambda limit: min((p.extra_flops for p in (*self.points.values(), *self.mixes)
                                                        if p.compiled and p.peak <= limit), default=math.inf))
        self.sets: list = []  # `solver_sets`' options not yet taken, likeliest winner first
        self.line = None  # `fit_peak_line` through the policies' compiled peaks
        self.share = 1.0  # one device's share of the step's FLOPs (`solver_sets`)
        self.set_compiles = 0
        # (lean, fast) -> the model's peak of the mix with k layers of `fast` last, k = 0..n; or
        # None (the caller's chain model, for JAX's policies and no remat; not for solver sets)
        self._curve = curve or (lambda lean, fast: None)
        self.points: dict[str | None, HandPlan] = {None: none}  # option on every layer -> compiled
        self.choice = {None: lambda k: None}  # option -> what layer k gets under it
        self.saved_bytes: dict[str, int] = {}  # option -> bytes it saves over the stack
        # option -> the matmul FLOPs each layer recomputes under it, as the region solver counts
        self.layer_flops: dict[str | None, tuple[float, ...]] = {None: (0.0,) * len(self.layers)}
        # MaxText's presets the layers' tags support: "maxtext <preset>" -> its saved set per layer
        # (`maxtext_presets`)
        self.presets = dict(presets or {})
        # (extra FLOPs, compile) of a plan of the caller's that may recompute less than some mixes
        # (the solver's first round), compiled among them in `_next_move`'s order (`_rival_first`);
        # `compile()` says whether it compiled the plan
        self.rival: tuple[float, Callable[[], bool]] | None = None

    def curve(self, lean, fast) -> Sequence[int] | None:
        """The caller's curve of a pair of options as their compiled plans write them (`as_written`)."""
        return self._curve(self._written(lean), self._written(fast))

    def _written(self, key):
        return as_written(key, getattr(self.points.get(key), "plan", None))

    def plan(self, policies: Sequence[str | None], label: str, ahead: Sequence[Sequence] = (),
             expected: float | None = None) -> HandPlan:
        """`policies` per layer, compiled; the per-layer policies of `ahead` (the likeliest next
        plans) are made into plans and traced while it compiles (`compile`'s `ahead`).
        `expected`: the peak the search expected of it (`_expecting`)."""
        later = (layer_plan(self.g, self.layers, pols, meta=self.meta) for pols in ahead)
        return self.compile(_expecting(layer_plan(self.g, self.layers, policies, meta=self.meta), expected),
                            label, later)

    def uniform(self, plans: Sequence[tuple[str, str, Plan]], limit: int) -> None:
        """`uniform_plans`' plans compiled, fewest recomputed FLOPs first (`_fastest_first`; scans:
        with and without barriers), up to the first of JAX's policies that fits `limit` in each
        family of plans (`_family`: those on every layer, those on the layers without the user's
        own checkpoints alone): the rest of a family recompute at least as much, and at 1B each
        costs a whole-step compile
        (benchmarks/realscale.py, Llama at dots_saveable's peak: 5.5 s for it alone; the three
        leanest-first, two at a time on this 2-core CPU, took 19.3 s).  A MaxText preset that
        fits does not end it: the leaner policies after it may still make better mixes.  On the
        tagged Llama 1B, `save_out_proj` per layer compiles below `nothing_saveable`'s peak, yet
        at the 9 + 9 `nothing_saveable` / `dots_with_no_batch_dims_saveable` mix's 10.72 GiB its
        own mixes fit 7 layers of the faster policy where `nothing_saveable`'s fit 9
        (benchmarks/results/presets.md).  Where the chain model puts a policy over the limit
        (`_model_over`: at 1B it under-predicts them), the next is compiled beside it: alone in a
        fresh process on the 1B Llama under FSDP, `nothing_saveable` was ready 1.8 s after
        `dots_with_no_batch_dims_saveable` where it took 7.1 s after it (docs/FINDINGS.md,
        twenty-eighth session)."""
        order = self._fastest_first(plans)
        fitted: dict[tuple, bool] = {}  # `_family` -> whether one of JAX's policies in it fitted
        tier: dict[tuple, int] = {}  # `_family` -> the least peak of the policy being compiled in it
        for i, (pol, label, plan) in enumerate(order):
            if not fitted.get(self._family(plan)):
                got = self._compile_uniform(order, i, fitted, limit)
                tier[self._family(plan)] = min(got.peak, tier.get(self._family(plan), got.peak))
            if i + 1 < len(order) and order[i + 1][0] == pol:
                continue
            if pol in HAND_POLICIES:  # the tier's last: a family whose policy fits is settled
                fitted.update({f: fitted.get(f, False) or peak <= limit for f, peak in tier.items()})
            tier = {}
            if fitted and all(fitted.values()) and i + 1 < len(order):
                self.say(f"{pol} per layer fits: the rest save less, so recompute no less; not compiled")
                return

    def _compile_uniform(self, order: Sequence[tuple], i: int, fitted: dict, limit: int) -> HandPlan:
        """`uniform`'s plan `order[i]` compiled and taken as its policy's point if its peak is the
        lowest so far; the plans after it certain to be compiled too (`_certain`, those of a
        family not settled yet) are compiled beside it, or the next two where the model puts
        this one over the limit."""
        pol, label, plan = order[i]
        open_ = [q for q in order[i + 1:] if not fitted.get(self._family(q[2]))]
        certain = [q for q in _certain(order, i) if q in open_]
        # the leaner ones are compiled only if this one is over, or if it cannot end the phase;
        # where the model puts this one over, the next is compiled beside it
        later = open_[:AHEAD] if self._model_over(pol, limit) else certain
        got = self.compile(_expecting(plan, self._policy_expected(pol, as_written(pol, plan))), label,
                           [q[2] for q in later[:AHEAD]],
                           [(q[2], q[1]) for q in later])
        self.say(f"hand-written {label} ({len(self.layers)} layers): compiled {format_bytes(got.peak)}, "
                 f"+{got.extra_flops / 1e9:.4g} GFLOP")
        if pol not in self.points or got.peak < self.points[pol].peak:
            self._take(pol, got)
        return got

    def _family(self, plan: Plan) -> tuple[bool, ...]:
        """Which layers `plan` leaves as written (`_unauthored`'s plans leave the user's
        checkpointed ones): within one such family JAX's policies nest, so once one fits the
        leaner ones of that family recompute no less; across families they do not (a policy on
        every layer replaces the user's own checkpoints, and may recompute less than the same
        policy on the others alone)."""
        return tuple(plan.leaves_alone(la.start, la.stop) for la in self.layers)

    def peak_fixed(self, limit: int) -> str | None:
        """Why no plan is likely to come under `limit`, or None: every option compiled is over
        it, and JAX's two leanest policies per layer, compiled to programs that recompute
        differently, came out nearer together than FIXED_PEAK_SHARE of what they store apart, so
        the peak may be set elsewhere (the arguments, their gradients, the outputs; a compile
        decides: `peak_moves`).  The 1B decoder
        written per device at one example a device: the two compiled 680 KiB apart storing 1.34
        GiB apart, and at the half-and-half mix's peak the search compiled 46 plans in 240 s,
        all over (docs/FINDINGS.md, thirty-fourth session)."""
        lean, next_ = HAND_POLICIES[0], HAND_POLICIES[1]
        if lean not in self.points or next_ not in self.points or any(p.peak <= limit for p in self.points.values()):
            return None
        stored = self._stored_apart()
        moved = abs(self.points[next_].peak - self.points[lean].peak)
        # two programs that recompute alike tell nothing (the 4-layer MLP chain of
        # tests/test_optimize.py: all three policies one program, +0 FLOPs, and two layers a
        # region compile lower)
        differ = self.points[lean].extra_flops > self.points[next_].extra_flops
        if stored <= 0 or not differ or moved >= FIXED_PEAK_SHARE * stored:
            return None
        return (f"{lean} and {next_} per layer store {format_bytes(stored)} apart and compiled "
                f"{format_bytes(moved)} apart")

    def peak_moves(self, peak: int) -> bool:
        """Whether a plan that compiled to `peak` lies under every hand-written plan compiled by
        at least FIXED_PEAK_SHARE of what JAX's two leanest policies per layer store apart: then
        remat does move the step's peak, whatever `peak_fixed` inferred from the two."""
        lowest = min(p.peak for p in (*self.points.values(), *self.mixes) if p.compiled and p.peak is not None)
        return lowest - peak >= FIXED_PEAK_SHARE * self._stored_apart()

    def _stored_apart(self) -> int:
        """The bytes JAX's second-leanest policy per layer stores beyond the leanest's."""
        return self.saved_bytes[HAND_POLICIES[1]] - self.saved_bytes[HAND_POLICIES[0]]

    def half_mix(self) -> HandPlan:
        """The mix a person writes of JAX's two leanest policies (the first half of the layers
        `nothing_saveable`, the rest `dots_with_no_batch_dims_saveable`), compiled: where the peak
        is fixed (`peak_fixed`) XLA still places its programs some bytes apart, and this one
        may be the lowest (the 1B decoder written per device: 7616 bytes under nothing_saveable's)."""
        n = len(self.layers)
        lean, fast = HAND_POLICIES[0], HAND_POLICIES[1]
        label = f"{n - n // 2} layers {_name(self._written(lean))}, {n // 2} layers {_name(self._written(fast))}"
        got = self.plan(self._mix(lean, fast, n // 2), label)
        self.say(f"hand-written mix, {got.label}: compiled {format_bytes(got.peak)}")
        self.mixes.append(got)
        return got

    def _fastest_first(self, plans: Sequence[tuple[str, str, Plan]]) -> list:
        """`plans` by the matmul FLOPs their policy recomputes (`policy_layer_flops`), JAX's
        policies first among equals.  Those nest (`nothing_saveable`'s saved set within
        `dots_with_no_batch_dims_saveable`'s within `dots_saveable`'s), so they keep that order;
        MaxText's presets fall between them (on a tagged Llama 1B layer, `minimal_with_context`
        recomputes half of `dots_with_no_batch_dims_saveable`'s FLOPs and `save_out_proj` 0.91 of
        `nothing_saveable`'s: benchmarks/results/presets.md)."""
        tier = {pol: i for i, pol in enumerate(reversed(HAND_POLICIES))}
        return sorted(plans, key=lambda p: (sum(self._flops_of(p[0])), p[0] not in tier, tier.get(p[0], 0)))

    def _flops_of(self, pol: str) -> tuple[float, ...]:
        """The matmul FLOPs each layer recomputes under `pol` (`policy_layer_flops`), once."""
        if pol not in self.layer_flops:
            self.layer_flops[pol] = policy_layer_flops(self.g, self.layers, self.presets.get(pol, pol))
        return self.layer_flops[pol]

    def _take(self, pol: str, got: HandPlan) -> None:
        """`got`, the compiled plan of `pol` on every layer, as an option for the mixes."""
        sets = self.presets.get(pol)
        self.points[pol] = got
        written = as_written(pol, got.plan)
        alone = [got.plan.leaves_alone(la.start, la.stop) for la in self.layers]  # `_unauthored`'s
        self.choice[pol] = lambda k, sets=sets, w=written, alone=alone: (
            None if alone[k] else sets[k] if sets is not None else w)
        self.saved_bytes[pol] = sum(r.nbytes for r in got.plan.values.values() if r.decision == "save")
        self._flops_of(pol)

    def _policy_expected(self, pol: str, written=None) -> float | None:
        """`pol` on every layer's peak expected before compiling it: the compiled peak of the
        leanest policy compiled so far (they compile fastest first, so that is the one nearest in
        peak) plus the chain model's difference between the two (`curve`); the model's own figure
        before any.  The model under-predicts the leaner plans by more (at 1B, dots_saveable per
        layer -45..+3% off its compiled peak, nothing_saveable -80..-8%), so its difference is
        nearer than its ratio: over the 1B decoders and ResNet-50 (Llama, GPT, equinox, Llama
        FSDP and FSDP x TP), the policies compiled after another came out 7 of 12 within 5% of
        their compiled peaks, -13.7..+2.6%, where scaling the model by the policy before gave 2
        of 12, -43.5..0% (benchmarks/policy_expected.py, results/policy_expected*.md)."""
        curve = self._curve(None, self._written(pol) if written is None else written)
        if curve is None:
            return None
        nearest = next((self.points[p].peak - c[-1] for p in HAND_POLICIES if p in self.points
                        and (c := self.curve(None, p)) is not None), 0.0)
        return curve[-1] + nearest

    def _model_over(self, pol: str, limit: int) -> bool:
        """Whether `pol` on every layer is expected over `limit` (`_policy_expected`).  At 1B the
        chain model predicted the plans near each budget 0.71-0.92x their compiled peaks
        (benchmarks/budget_log.py on gpt, equinox and resnet_flax at 3ff52da), so that policy then
        compiles over the limit too and the leaner ones are worth tracing while it compiles; at
        GPT 1B's first budget, where dots_saveable fits, tracing them anyway cost 2.5 s
        (benchmarks/results/compare_planners-gpt.md at 36903ab)."""
        expected = self._policy_expected(pol)
        return expected is not None and expected > limit

    def solver_sets(self, limit: int, options: Sequence) -> None:
        """The region solver's saved sets per layer (`_layer_options.ilp_options`) predicted, by
        the line through the policies' compiled peaks against their saved bytes (within -2.5..+4.9%
        of the compiled peaks of the sets that could win on the 1B decoders,
        benchmarks/results/set_peaks.md), to fit `limit` in a mix with at least one faster layer
        (`_lean_floor`) and to recompute fewer matmul FLOPs than the best plan so far that fits; the likeliest
        winner becomes an option at its predicted peak and its model's FLOPs (the compiled
        step's, exactly, on the 1B decoders: benchmarks/results/policy_bytes.md).  It is not
        compiled on its own here: a mix of it with a faster option recomputes less, so alone it
        is the answer only where no such mix fits (`sets_alone`); at the four mix budgets of the
        unrolled 1B decoders where the set's mix won, compiling it first cost 7-9 s each
        (benchmarks/budget_log.py --only mix at 7326a42)."""
        self.line = fit_peak_line([(self.saved_bytes[p], self.points[p].peak) for p in HAND_POLICIES
                                   if p in self.saved_bytes])
        if self.line is None:
            return
        self.share = self.g.device_share()  # options count per-device FLOPs, compiled plans global ones
        bound = self._bound(limit)
        self.sets = sorted((o for o in options if o.label not in self.points and o.matmul_flops < bound * self.share
                            and self._may_fit(self._predicted(o), o.saved_bytes, o.matmul_flops / self.share, limit)),
                           key=lambda o: (o.matmul_flops, o.saved_bytes))
        self._next_set(limit)

    def _bound(self, limit: int) -> float:
        """The extra matmul FLOPs a mix or a set must recompute less than to win: those of the
        options that fit `limit` (a solver's set by its predicted peak) and of every plan
        compiled that fits it (`best_fit`: the search's, the solver's first round included)."""
        return min(min((p.extra_flops for p in self.points.values() if p.peak <= limit), default=math.inf),
                   self.best_fit(limit))

    def _predicted(self, o) -> float:
        return self.line[0] + self.line[1] * o.saved_bytes

    def _next_set(self, limit: int) -> bool:
        """The next of `sets` as an option (compiled already at an earlier budget: as compiled);
        False if none is left to take or to compile."""
        while self.sets and self.set_compiles < MAX_SET_COMPILES:
            o = self.sets.pop(0)
            label = f"solver's saved set per layer ({_cap(o.label)})"
            got = self.known(label)
            if got is None:
                got = HandPlan(label, _expecting(layer_plan(self.g, self.layers, list(o.saved), meta=self.meta),
                                                 self._predicted(o)),
                               int(self._predicted(o)), o.matmul_flops / self.share, compiled=False)
                self.say(f"{label}: predicted {format_bytes(got.peak)}, +{got.extra_flops / 1e9:.4g} GFLOP: an option "
                         f"for the mixes, compiled alone only where none of them fits")
            self.points[o.label] = got
            self.choice[o.label] = lambda k, o=o: o.saved[k]
            self.saved_bytes[o.label] = o.saved_bytes
            if o.layer_flops:
                self.layer_flops[o.label] = o.layer_flops
            if self._may_fit(got.peak, o.saved_bytes, got.extra_flops, limit):
                return True
        return False

    def _may_fit(self, peak: float, nbytes: int, flops: float, limit: int) -> bool:
        """Whether a set of `peak` storing `nbytes` over the stack fits `limit`, alone or in a mix
        with a compiled faster policy on its last layers (at least `_lean_floor` of them): that
        policy's layer peaks while it runs backward at its own peak less, per set layer, what it
        stores beyond the set (the chain formula of `_first_count`)."""
        if peak <= limit:
            return True
        n = len(self.layers)
        k = self._floor_of(peak, nbytes, limit)
        return any(self.points[p].peak - (n - k) * (self.saved_bytes[p] - nbytes) / n <= limit
                   for p in HAND_POLICIES if p in self.points and p in self.saved_bytes and k < n
                   and self.saved_bytes[p] > nbytes and self.points[p].extra_flops < flops)

    def _lean_floor(self, lean, limit: int) -> int:
        """The fewest last layers of a faster option with which `lean` on the others may fit
        `limit`; n if none.  Backward runs from the last layer, so by the time the first `lean`
        layer runs backward the faster layers have freed what they stored: that moment peaks at
        `lean`'s own peak less what its k layers would have stored.  A saved set's own backward
        recomputes more than a faster policy's, so its mixes peak lower than its own peak less
        the bytes it stores beyond them: FSDP x TP's ilp10% set, predicted at 4.355 GiB, with 1
        of 18 layers `dots_with_no_batch_dims_saveable` compiled to 4.31; on the single-device
        Llama 1B, compiled peak less stored bytes is 9.18 GiB for that set and 8.05 for the
        policy (benchmarks/results/set_peaks*.md)."""
        return self._floor_of(self.points[lean].peak, self.saved_bytes.get(lean, 0), limit)

    def _floor_of(self, peak: float, nbytes: int, limit: int) -> int:
        n = len(self.layers)
        if peak <= limit:
            return 0
        return n if nbytes <= 0 else min(n, math.ceil((peak - limit) / (nbytes / n)))

    def sets_alone(self, limit: int) -> bool:
        """The solver's set taken by `solver_sets`, compiled on its own where it could still be
        the answer (no compiled plan that fits recomputes as little: no mix of it fitted).  True
        where the mixes are to be tried again: it compiled over `limit` and the next set took its
        place, or it recomputes more than it was counted at, the bound `mix` pruned the pairs by.
        A Mamba-2-style decoder's ilp25% set was counted at 138.5 GFLOP and compiled to 276 (the
        matmuls inside each layer's scan went uncounted, since fixed), and the 8 + 8 mix of JAX's
        policies that fits at 208.8 was never tried (benchmarks/results/unseen.md, ssd)."""
        best = self.best_fit(limit)
        for key, p in list(self.points.items()):
            if p.compiled or p.extra_flops >= best or p.peak > limit:  # over: an option for mixes only
                continue
            got = self.compile(p.plan, p.label)
            self.set_compiles += 1
            self.say(f"{p.label}: predicted {format_bytes(p.peak)}, compiled {format_bytes(got.peak)}, "
                     f"+{got.extra_flops / 1e9:.4g} GFLOP")
            self.points[key] = got
            if got.peak > limit:
                return self._next_set(limit)
            if got.extra_flops > p.extra_flops:
                return True
        return False

    def mix(self, limit: int) -> HandPlan | None:
        """The best two-option mix within `limit`, compiled.  The pairs tried: every pair of
        hand-written options (JAX's policies, no remat, MaxText's presets where the layers carry
        its tags) that brackets `limit`, of those on the front of compiled peak
        against FLOPs (`_front`), and the pair with a solver's set predicted to recompute least.
        They are settled together, one compile at a time (`_next_move`): each compile is of the
        pair and count predicted to recompute least among the counts that could still beat the
        best plan that fits, so a pair whose compiles come out over gives way to another, and
        a pair is dropped once its fewest winning count is compiled over (a mix's peak grows
        with its count).  So the mix a person writes is a candidate whenever it could win.  GPT
        1B at its 13.34 GiB mix budget: the policies' first count compiled over (13 of 24 layers,
        13.56 GiB) and settling it first cost five mix compiles where three settle both pairs
        (benchmarks/budget_log.py --model gpt --only "12 nothing").  On the H100 the 18-layer 1B
        decoder's ilp10% set fitted the hand-written mix's budget (9 nothing_saveable + 9
        dots_with_no_batch_dims_saveable, 9.22 GiB, +8.35 TFLOP); its mix was predicted best and
        settled at +8.52, and the policies' mix was never compiled
        (benchmarks/results/gpu-h100-realscale.md).  On the H100 ResNet-50 (batch 1536) at its
        dots_with_no_batch_dims_saveable + dots_saveable mix's 30.63 GiB (+6.35 TFLOP): one pair
        of policies was tried, and the one predicted best, with no remat on the last layers, was
        predicted well over and dropped uncompiled; the pair a person wrote never was, and
        autoremat returned +6.63 (gpu-h100-realscale-fill.md).  None if no mix fits and wins."""
        pairs, front = self._pairs(limit), self._front()
        written = (*_POLICIES, *self.presets)
        policies = [p for p in pairs if p[1] in front and p[2] in front]
        others = [p for p in pairs if not (p[1] in written and p[2] in written)]  # with a solver's set
        tops = sorted([*policies, *others[:1]], key=lambda p: p[0])  # options may be None
        mixes = [_Pair(lean, fast, self._lean_floor(lean, limit), len(self.layers), self._first_line(lean, fast),
                       {0: self.points[lean].peak, len(self.layers): self.points[fast].peak},
                       lean_compiled=self.points[lean].compiled, step=self._bytes_step(lean, fast))
                 for _, lean, fast, _ in tops]
        bound = self._bound(limit)
        best, spent = None, 0
        while (move := self._next_move([m for m in mixes if spent < MAX_PRESET_MIXES or not self._of_preset(m)],
                                       bound, limit)) is not None:
            if self._rival_first(*move, limit):
                bound = min(bound, self._bound(limit))
                continue
            got = self._compile_count(*move, limit)
            spent += self._of_preset(move[0])
            if got.peak <= limit and got.extra_flops < bound:
                best, bound = got, got.extra_flops
        return best

    def _rival_first(self, m: _Pair, k: int, limit: int) -> bool:
        """Whether the caller's `rival` was compiled now, before `k` layers of `m.fast`: it is
        aimed to fit, so under `_next_move`'s order it goes before a count expected over and
        before one that recomputes more.  Its FLOPs count every equation it recomputes, the
        mixes' only matmuls, so it goes no sooner than it should.  Its turn comes once: its
        `compile` returns False, compiling nothing, where it can no longer win (a mix compiled
        since recomputes less).  Compiled, a rival that fits leaves the mixes that recompute
        more uncompiled (`_bound`)."""
        if self.rival is None or (False, self.rival[0]) > (m.line(k) > limit, self._mix_flops(m.lean, m.fast, k)):
            return False
        compile_rival, self.rival = self.rival[1], None
        return compile_rival()

    def _of_preset(self, m: _Pair) -> bool:
        """Whether a mix has one of MaxText's presets on either side (`MAX_PRESET_MIXES`)."""
        return m.lean in self.presets or m.fast in self.presets

    def _front(self) -> set:
        """The hand-written options compiled so far (JAX's policies, no remat, MaxText's presets)
        that no other one matches in peak, FLOPs and the bytes it stores per layer (of two alike,
        the faster-named policy, then a policy before a preset): a mix with a matched one in
        either role is expected to be no better than the same mix with the one that matches it,
        and each pair costs compiles.  The bytes count: a mix's leaner layers leave room for
        faster ones by what they store less, and on the tagged Llama 1B MaxText's save_out_proj
        per layer beats nothing_saveable in peak and FLOPs but stores an activation a layer more,
        so at the 9 + 9 mix of nothing_saveable and dots_with_no_batch_dims_saveable (10.72 GiB)
        its own mixes fit two layers of the faster policy fewer.
        ResNet-50 on the H100: nothing_saveable and dots_with_no_batch_dims_saveable per layer
        both compile to 25.39 GiB and +12.19 TFLOP; on the tagged Llama 1B MaxText's minimal is
        dots_with_no_batch_dims_saveable's program (benchmarks/results/presets.md)."""
        opts = [o for o in (*_POLICIES, *self.presets) if o in self.points]
        rank = {o: i for i, o in enumerate(opts)}
        stored = {o: self.saved_bytes.get(o, math.inf) for o in opts}  # no remat: everything

        def matched(o, by) -> bool:
            a, b = self.points[o], self.points[by]
            return (b.peak <= a.peak and b.extra_flops <= a.extra_flops and stored[by] <= stored[o]
                    and (b.peak < a.peak or b.extra_flops < a.extra_flops or _nested(o, by)
                         or (not _nested(by, o) and rank[by] < rank[o])))
        return {o for o in opts if not any(matched(o, by) for by in opts if by != o)}

    def _next_move(self, mixes: Sequence[_Pair], bound: float, limit: int) -> tuple[_Pair, int] | None:
        """The pair and count to compile next: of each pair's next count (`_next_of`), a count
        expected to fit before one that only shows the pair over (a mix that fits lowers the
        bound, which may leave another pair nothing to show; a count shown over never does),
        then the fewest FLOPs."""
        moves = []
        for m in mixes:
            k = self._next_of(m, bound, limit, _known_over(m, mixes))
            if k is not None:
                moves.append((m.line(k) > limit, self._mix_flops(m.lean, m.fast, k), m, k))
        return min(moves, key=lambda mv: mv[:2])[2:] if moves else None

    def _next_of(self, m: _Pair, bound: float, limit: int, stop: int) -> int | None:
        """The count of `m` to compile next: the largest expected to fit (`m.line`) among those
        that could beat `bound` and are not known over (from `stop` up: `_known_over`), else the
        fewest of them (one compile shows whether the pair can win at all); after MAX_MIX_STEPS,
        the middle of those; None once there is none, or where the fewest is predicted well over
        before any count is compiled (`_surely_over`)."""
        below = self._count_below(m.lean, m.fast, bound)
        if m.dropped or below is None:
            return None
        lo = max(below, m.floor, m.fit + 1)
        if lo >= stop:
            return None
        if m.steps >= MAX_MIX_STEPS or _creeping(m):  # the counts still open, settled by bisection
            return (lo - 1 + stop) // 2
        if m.steps == 0 and self._surely_over(m.lean, m.fast, lo, limit):
            m.dropped = True
            return None
        return _next_count(m, lo, limit, stop)

    def _compile_count(self, m: _Pair, k: int, limit: int) -> HandPlan:
        """`k` layers of `m.fast` (the rest `m.lean`) compiled, the counts either side traced
        while it compiles; `m`'s bracket and line (`_line`) updated."""
        n = len(self.layers)
        nearby = [j for j in (k + 1, k - 1) if max(m.fit, m.floor - 1) < j < m.over][:AHEAD]
        label = f"{n - k} layers {_name(self._written(m.lean))}, {k} layers {_name(self._written(m.fast))}"
        got = self.plan(self._mix(m.lean, m.fast, k), label, [self._mix(m.lean, m.fast, j) for j in nearby],
                        expected=m.line(k))
        self.say(f"hand-written mix, {got.label}: compiled {format_bytes(got.peak)}")
        self.mixes.append(got)
        m.peaks[k], m.steps = got.peak, m.steps + 1
        if got.peak <= limit:
            m.fit = k
        else:
            m.over = k
        m.line = _line(m.peaks, m.fit, m.over, self.curve(m.lean, m.fast), m.step)
        return got

    def _count_below(self, lean, fast, bound: float) -> int | None:
        """The fewest layers of `fast` (the rest `lean`) whose FLOPs (`_mix_flops`) are below
        `bound`; None if even all but one are not."""
        return next((k for k in range(1, len(self.layers)) if self._mix_flops(lean, fast, k) < bound), None)

    def _mix_flops(self, lean, fast, k: int) -> float:
        """The extra matmul FLOPs of `k` layers of `fast` last, the rest `lean`: the two options'
        compiled FLOPs, and between them what the layers recompute under each (`layer_flops`), or
        the same share per layer where those are not known or the layers are alike.  An
        encoder-decoder's 6 + 6 layers, nothing_saveable on the encoder and
        dots_with_no_batch_dims_saveable on the decoder, recompute 2.78 TFLOP, not the 3.25 of
        an equal share (its decoder layers have twice the attention): at the hand-written mix's
        own peak that count was not tried, as it could not beat 7 + 5 layers (3.26 TFLOP)."""
        n, a, b = len(self.layers), self.points[lean].extra_flops, self.points[fast].extra_flops
        lo, hi = self.layer_flops.get(lean), self.layer_flops.get(fast)
        total = None if lo is None or hi is None else (sum(lo), sum(hi))
        if total is None or total[0] == total[1]:
            return a + k / n * (b - a)
        moved = sum(lo[n - k:]) - sum(hi[n - k:])  # what the last k layers recompute less under `fast`
        return a + moved / (total[0] - total[1]) * (b - a)

    def _surely_over(self, lean, fast, k: int, limit: int) -> bool:
        """Whether `k` layers of `fast` are predicted over `limit` by more than FALL_SLACK by both
        the faster option's compiled peak less the model's fall from n layers to k (`curve`, for
        JAX's policies) and the line through both options' compiled peaks with the model's shape
        (`_line`).  A mix needs at least `k` layers of `fast` to win, and its peak grows with the
        count, so the pair is not compiled: at 1B a compile each (GPT's challenger at its 19.37
        GiB mix budget, 9 + 15 layers, compiled to 20.21 GiB; the fall said 20.21).  The fall
        alone was nearly a lower bound of the compiled peaks on the CPU, not on the H100: there
        the model fell 21.96 GiB from 16 ResNet-50 blocks of dots_saveable to 13 + 3 with
        dots_with_no_batch_dims_saveable, where the compiled peaks fall at least 23.40 (to the
        8 + 8 mix's 30.63), so that count was predicted at 32.07 GiB and the pair written by
        hand was dropped (benchmarks/results/gpu-h100-resnet-mix.log).  The line scales the
        model's shape to the compiled peaks' whole fall (28.64 GiB); on the CPU that shape is flat
        over ResNet-50's small last blocks, which would put 13 + 3 near 25.39 (not yet rerun on
        a GPU)."""
        fall, n = self._fall(lean, fast, k), len(self.layers)
        if fall is None:
            return False
        shape = _line({0: self.points[lean].peak, n: self.points[fast].peak}, 0, n, self.curve(lean, fast))(k)
        predicted = min(fall, shape)
        if predicted <= limit * (1 + FALL_SLACK):
            return False
        self.say(f"hand-written mix, {n - k} layers {_name(self._written(lean))}, {k} layers {_name(self._written(fast))}, the fewest that could "
                 f"win: predicted {format_bytes(predicted)} (the lower of the faster plan's compiled peak less the "
                 f"model's fall and the line through both plans' compiled peaks), over the budget by more than "
                 f"{FALL_SLACK:.0%}: not compiled")
        return True

    def _fall(self, lean, fast, k: int) -> float | None:
        """`k` layers of `fast`'s peak predicted as `fast`'s compiled peak less the model's fall
        from n layers to k (`curve`); None without a curve for the pair."""
        curve, n = self.curve(lean, fast), len(self.layers)
        return None if curve is None else self.points[fast].peak - (curve[n] - curve[k])

    def _pairs(self, limit: int) -> list[tuple]:
        """(predicted extra FLOPs, lean, fast, first count) of every pair of options that brackets
        `limit` (the lean one fits, or does with enough layers of the fast one: `_lean_floor`; the
        fast one recomputes less and does not fit) and where at least one layer of the fast one
        is predicted to fit, or, for two of JAX's policies (the mixes a person writes), is
        predicted over by no more than FALL_SLACK: left out on a prediction, a mix that fits
        would never be tried, and the first line is off by up to +0.7% (the bytes step on one
        layer of Llama 1B's dots_with_no_batch_dims_saveable, 9.474 GiB where it compiled to
        9.411: benchmarks/results/mix_counts.md); least predicted first.  The FLOPs of a mix
        are its layers' (`_mix_flops`); only the count is a guess."""
        out = []
        for lean, a in self.points.items():
            for fast, b in self.points.items():
                if limit < b.peak and b.extra_flops < a.extra_flops:
                    k = self._first_count(lean, fast, limit)
                    if (k == 0 and lean in _POLICIES and fast in _POLICIES
                            and self._first_line(lean, fast)(1) <= limit * (1 + FALL_SLACK)):
                        k = 1
                    if k >= max(1, self._lean_floor(lean, limit)):
                        out.append((self._mix_flops(lean, fast, k), lean, fast, k))
        return sorted(out, key=lambda p: p[0])

    def _first_count(self, lean, fast, limit: int) -> int:
        """How many of the last layers may take `fast` within `limit`, before compiling any mix.
        The chain formula (`solver/_chain.py`): the step peaks while the first `fast` layer runs
        backward, over what every layer before it stores, so the mix's peak is `fast`'s peak
        less, per `lean` layer, what a `fast` layer stores beyond a `lean` one (its saved bytes
        per layer), down to `lean`'s own peak.  Measured on the 1B decoders
        (benchmarks/realscale.py): 0.30 GiB per layer between the mixes of Llama's 10.72 GiB
        budget, where 18 layers' saved bytes give 0.33; the line through the two uniform peaks
        instead gave 0.22 and its first count, 5 of the 9 that fit, took four compiles to mend.
        Where the layers are not alike (or a step is unknown: no remat) and the model gives the
        mix's peak per count (`curve`), its shape between the two compiled peaks (`_line`)
        instead: ResNet-50's last 8 of 16 blocks under dots_saveable, the first 8 under
        dots_with_no_batch_dims_saveable, compile to the latter's peak, 2.38 GiB, as that shape
        says (+0.0% at 1-8 layers, +5.0% and +2.8% at 12 and 15), where the model's fall from
        `fast`'s compiled peak said -12.0% (so the first count, 12, compiled over: 9 s).  Over
        the 47 compiled mixes of the four unrolled real-scale models (benchmarks/results/
        mix_counts.md) the bytes JAX stores came within 0.90% on average, that shape 1.45%, the
        fall 3.67% (down to -14.1%: too many layers of `fast`), the line without the model 2.30%."""
        line = self._first_line(lean, fast)
        return max((k for k in range(len(self.layers)) if line(k) <= limit), default=0)

    def _first_line(self, lean, fast) -> Callable[[int], float]:
        """The peak of `k` layers of `fast` (the rest `lean`) expected before any mix of the pair
        is compiled (`_first_count`'s rule): the bytes step from `fast`'s compiled peak where the
        layers are alike and both options' saved bytes are known, else the line between the two
        compiled peaks, against the model's peak of each count where there is one (`_line`)."""
        n, a, b = len(self.layers), self.points[lean], self.points[fast]
        step = self._bytes_step(lean, fast)
        if step is not None:
            return lambda k: b.peak - (n - k) * step
        return _line({0: a.peak, n: b.peak}, 0, n, self.curve(lean, fast))

    def _bytes_step(self, lean, fast) -> float | None:
        """What a layer of `fast` stores beyond one of `lean`, where `_first_line` goes by it (both
        options' saved bytes known, and the layers alike or no model's shape for the pair)."""
        n = len(self.layers)
        step = (self.saved_bytes.get(fast, 0) - self.saved_bytes.get(lean, 0)) / n
        known = lean in self.saved_bytes and fast in self.saved_bytes and step > 0
        if known and (len({la.key for la in self.layers}) == 1 or self.curve(lean, fast) is None):
            return step
        return None

    def _mix(self, lean, fast, k: int) -> list:
        """What each layer gets with the last `k` under `fast` and the rest under `lean`."""
        n = len(self.layers)
        return [self.choice[lean](i) for i in range(n - k)] + [self.choice[fast](i) for i in range(n - k, n)]


def as_written(pol, plan: Plan):
    """The per-layer option `pol` as `plan`, its hand-written plan on every layer, writes it:
    `Nested(pol)` where it puts `pol` on the scans inside the layers too."""
    return Nested(pol) if isinstance(pol, str) and isinstance(plan, Plan) and plan.scans_in_regions() else pol


def _certain(order: Sequence[tuple], i: int) -> list:
    """The plans after `order[i]` that `HandSearch.uniform` compiles whatever their peaks: up to
    the last variant of the next of JAX's policies (only one of those that fits ends the phase;
    a scan's variants with and without barriers are one policy, compiled both)."""
    out = []
    for j in range(i + 1, len(order)):
        if order[j - 1][0] in HAND_POLICIES and order[j][0] != order[j - 1][0]:
            break
        out.append(order[j])
    return out


def _expecting(plan: Plan, expected: float | None) -> Plan:
    """`plan` with the peak the search expected of it before compiling it in its meta
    ("expected_peak"; what the search's predictions are judged by: benchmarks/realscale.py)."""
    if expected is None or not isinstance(plan, Plan):
        return plan
    return replace(plan, meta={**plan.meta, "expected_peak": int(expected)})


def _cap(label: str) -> str:
    """What a solver's set per layer was capped at (`_layer_options.ilp_options`' labels)."""
    if label.startswith("ilp@"):
        return f"{label}: capped at the bytes {label[4:]} saves in each layer"
    return f"{label} of each layer's residual bytes"


def _name(option) -> str:
    if option is None:
        return "no remat"
    if isinstance(option, Nested):
        return str(option)
    if option in HAND_POLICIES:
        return option
    return f"MaxText's {option.removeprefix(MAXTEXT)}" if option.startswith(MAXTEXT) else f"the solver's {option} set"


def _line(peaks: dict, fit: int, over: int, curve=None, step: float | None = None) -> Callable[[int], float]:
    """The peak expected at each count between `fit` and `over`: the line through the two
    compiled peaks nearest the limit, against the model's peak of each count where there is one
    (`HandSearch.curve`, rising between them), else against the count (the same for alike layers,
    where the model's peak rises by one layer's bytes a count; where it is flat over some counts,
    as over ResNet-50's small last blocks, they go together).  Where no count has fitted yet
    (`fit` 0: the leaner option alone) and the pair's first line was a bytes `step`, the line
    through the count compiled over with that slope: the mix's peak is the leaner option's own
    up to some count and rises by about a layer's bytes a count after it (the chain formula,
    `HandSearch._first_count`), so the chord from the leaner option alone lies above it and, at
    a budget on that option's own peak, says every count is over."""
    lo, hi = peaks[fit], peaks[over]
    if fit == 0 and step is not None:
        return lambda k: hi - (over - k) * step
    if curve is not None and curve[over] > curve[fit]:
        slope = (hi - lo) / (curve[over] - curve[fit])
        return lambda k: lo + (curve[k] - curve[fit]) * slope
    return lambda k: lo + (k - fit) / (over - fit) * (hi - lo)


def _next_count(m: _Pair, lo: int, limit: int, stop: int) -> int:
    """The next layer count of `m` to compile, from `lo` up to (not including) `stop`: the
    largest whose expected peak (`m.line`) is within `limit`; where none is, `lo` (one compile
    shows whether the pair can win).  Where the counts compiled so far barely raised the peak (a
    plateau, `_plateau`), the middle of the counts still open if that is more: the line through
    a plateau's edge leaves little or no room, so it creeps up a count or two a compile.
    The alternating decoder under FSDP on 8 devices (benchmarks/results/sharded_unseen.md):
    6 layers nothing_saveable + 6 dots_with_no_batch_dims_saveable compile to nothing_saveable's
    own 7.47 GiB (to 64 bytes a layer), as do 1-5 layers of the faster policy; stepping one a compile, the
    search stopped at 5 (MAX_MIX_STEPS) and recomputed 43.98 TFLOP against the mix's 39.58."""
    expected = [k for k in range(lo, stop) if m.line(k) <= limit]
    if _plateau(m):
        return max([lo, (m.fit + stop) // 2, *expected])
    return max(expected) if expected else lo


def _known_over(m: _Pair, mixes: Sequence[_Pair]) -> int:
    """The fewest layers of `m.fast` known over the limit: `m.over`, or fewer where a pair with the
    same leaner option and a faster one that stores less in each layer was compiled over at that
    count (JAX's policies store nested sets: nothing_saveable's within
    dots_with_no_batch_dims_saveable's within dots_saveable's within no remat's, so the same count
    of `m.fast` stores more).  Equinox 1B at nothing_saveable's own peak (benchmarks/realscale.py):
    11 + 1 layers of it and dots_with_no_batch_dims_saveable compiled to 7.02 GiB, over the 6.90
    budget, and 11 + 1 with dots_saveable, compiled next, to 7.27 (benchmarks/budget_log.py)."""
    return min([m.over] + [s.over for s in mixes if s is not m and s.lean == m.lean and _nested(s.fast, m.fast)])


def _nested(a, b) -> bool:
    """Whether JAX's policy (or no remat: None) `a` stores a subset of what `b` stores, and less."""
    return a in _NESTED and b in _NESTED and _NESTED.index(a) < _NESTED.index(b)


def _creeping(m: _Pair) -> bool:
    """Whether, no count having fitted, the peak fell from the next count compiled over (or
    `m.fast` alone) to the fewest by less than PLATEAU_RISE of the bytes step a count (the
    plateau of `_plateau`, seen from above): the step's line then says one fewer fits after
    every compile.  The 1B decoder written per device at one example a device, at the 9 + 9 mix
    of dots_with_no_batch_dims_saveable and dots_saveable: 17 to 13 layers of the latter
    compiled 10.95 to 10.91 GiB, one count a compile, on each of two pairs (docs/FINDINGS.md,
    thirty-fourth session)."""
    above = [j for j in m.peaks if j > m.over]
    if m.fit or m.step is None or not above:
        return False
    j = min(above)
    return m.peaks[j] - m.peaks[m.over] < PLATEAU_RISE * m.step * (j - m.over)


def _plateau(m: _Pair) -> bool:
    """Whether the peak rose from the compiled count below `m.fit` to `m.fit` by less than
    PLATEAU_RISE of what the line through `m.fit` and `m.over` says (where the model's peak per
    count is flat there too, as over ResNet-50's small blocks, the line says so; a solver's set alone is
    predicted, not compiled: GPT 1B's ilp10% set at 12.78 GiB where its mixes' line starts at
    12.27, tests/test_hand.py)."""
    below = [j for j in m.peaks if j < m.fit and (j > 0 or m.lean_compiled)]
    if not below:
        return False
    j = max(below)
    said = m.line(m.fit) - m.line(j)  # the line's rise from j to fit, the curve's shape included
    return said > 0 and m.peaks[m.fit] - m.peaks[j] < PLATEAU_RISE * said
