"""The bridge from the solver's answer to the runtime's plan (the product layer: it may import
every stage; the stages never import it).

* `to_plan(model, segments)`: chosen chain segments -> a `Plan` of regions, scan plans and
  per-value decisions for the traced function.
* `plan_segments(model, plan)`: the inverse, for reports on a saved plan.
* `baseline_segments(model, option)`: a JAX policy applied per block, in the chain's terms.
* `with_recompute_costs(g, plan)`: the plan with the FLOPs it re-runs per top-level equation
  (for the per-layer view, `runtime/_by_layer.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from autoremat._errors import AutorematError
from autoremat.graph._trace import describe_eqn
from autoremat.runtime._plan import Plan, Region, ScanPlan, ValueRecord
from autoremat.solver import _blocks
from autoremat.solver._chain import Segment, SolveResult
from autoremat.solver._chain_model import ChainModel
from autoremat.solver._recompute import _closure, recompute_times
from autoremat.solver._scan_options import _with_name_aliases

__all__ = ["to_plan", "plan_segments", "baseline_segments", "with_recompute_costs"]


def to_plan(model: ChainModel, segments: Sequence[Segment], *, budget: int | None = None,
            result: SolveResult | None = None, meta: dict | None = None, scan_barriers: bool = False) -> Plan:
    """Turns chosen segments into a `Plan` for the traced function; `scan_barriers`: the scan
    bodies' `prevent_cse` (`ScanPlan.prevent_cse`)."""
    g = model.graph
    t = g.traced
    regions, scans, decisions = [], [], {}
    for seg in segments:
        payload = seg.option.payload or {}
        kind = payload.get("kind", "none")
        blocks = model.blocks[seg.start:seg.stop]
        if kind == "none":
            for b in blocks:
                for vid in model.data[b.index].residuals:
                    decisions.setdefault(vid, "save")
            continue
        saved, off = frozenset(payload.get("saved", ())), frozenset(payload.get("offloaded", ()))
        if kind == "scan":
            scans.extend(_scan_plans(g, payload, decisions, scan_barriers))
            continue
        if "scan" in payload:  # a region around a scan, the scan checkpointed inside it
            scans.extend(_scan_plans(g, payload["scan"], decisions, scan_barriers))
        start, stop = blocks[0].start, blocks[-1].stop
        label = f"blocks {seg.start}-{seg.stop - 1}: {seg.option.name}"
        regions.append(Region(start, stop, saved, off, label=label))
        for b in blocks:
            for vid in model.data[b.index].residuals | model.data[b.index].produced & (saved | off):
                if g.values[vid].producer in b.ops:
                    decisions[vid] = "offload" if vid in off else ("save" if vid in saved else "recompute")
    for vid in _kept_at_boundaries(g, regions):
        decisions[vid] = "save"  # a later region's input (or a later equation's residual)
    names = _merge_named_copies(g, decisions)
    values = {}
    for vid, dec in decisions.items():
        info = _blocks._value(g, vid)
        if info is None:
            continue
        rec = ValueRecord.from_graph(vid, dec, info, _blocks._op(g, info.producer))
        values[vid] = replace(rec, name=rec.name or names.get(vid))
    m = dict(meta or {})
    if result is not None:
        m.update(solver=result.solver, status=result.status, gap=result.gap, solve_time=result.solve_time)
    m.setdefault("profile", g.profile.name)
    return Plan(
        fingerprint=t.fingerprint, n_eqns=len(t.jaxpr.eqns), regions=tuple(regions), scans=tuple(scans),
        values=values, argnums=t.argnums, static_argnums=t.static_argnums, has_aux=t.has_aux,
        predicted_peak=result.peak_bytes if result is not None else None, budget=budget,
        estimated_extra_time=result.objective if result is not None else None, meta=m,
        structure=tuple(describe_eqn(e) for e in t.jaxpr.eqns))


def _scan_plans(g, payload: dict, decisions: dict, scan_barriers: bool) -> list[ScanPlan]:
    """The scan plans of a scan option's `payload` (its body's, and those of scans checkpointed
    inside the body), the decisions on its body's values recorded in `decisions`."""
    saved, off = frozenset(payload.get("saved", ())), frozenset(payload.get("offloaded", ()))
    barriers = scan_barriers or g.ops[payload["op"]].unrolled
    outer = payload.get("outer", True)  # else the body is left alone, a scan inside it checkpointed
    out = [ScanPlan(payload["op"], saved, off, prevent_cse=barriers)] if outer else []
    body = g.ops[payload["op"]].bodies[0]
    for vid in body.residual_values():
        if body.values[vid].producer is not None:
            decisions[vid] = "offload" if vid in off else ("save" if vid in saved or not outer else "recompute")
    for inner, kept in payload.get("nested", {}).items():  # a scan in the body, checkpointed inside it
        out.append(ScanPlan(inner, frozenset(kept), prevent_cse=barriers))
        saved = saved | kept
    for vid in saved | off:  # kept values the backward pass does not read itself
        decisions.setdefault(vid, "offload" if vid in off else "save")
    return out


def _kept_at_boundaries(g, regions) -> set[str]:
    """Values a region produces that stay in memory anyway: an equation after the region reads
    them, and either a later region keeps them as its input or the reader's backward pass does."""
    region_of = {}
    for k, r in enumerate(regions):
        for i in range(r.start, r.stop):
            region_of[i] = k
    kept = set()
    for op in g.ops.values():
        k = region_of.get(op.index)
        for v in op.inputs:
            prod = g.values[v].producer
            made_in = region_of.get(g.ops[prod].index) if prod is not None else None
            if made_in is not None and made_in != k and (k is not None or v in op.residual_inputs):
                kept.add(v)
    return kept


def _merge_named_copies(g, decisions: dict) -> dict[str, str]:
    """A `checkpoint_name` of a kept value is the same buffer: its record goes, and the kept
    value carries the user's name instead (returned: value id -> name)."""
    names = {}
    for vid, dec in list(decisions.items()):
        info = _blocks._value(g, vid)
        op = _blocks._op(g, info.producer) if info is not None and info.producer else None
        if op is None or op.primitive != "name" or not op.inputs:
            continue
        source = op.inputs[0]
        if decisions.get(source, "recompute") != "recompute" and dec in ("recompute", decisions[source]):
            del decisions[vid]
            names.setdefault(source, info.name)
    return names


def plan_segments(model, plan):
    """The chain segments of a plan of `model`: its regions matched by range and saved set.

    Blocks outside every region are grouped into the longest allowed `none` regions (the plan
    does not record the solver's grouping, so the predicted peak may differ slightly).
    """
    from autoremat._plots import chain_problem
    from autoremat.solver._chain import Segment

    problem = chain_problem(model)
    start_of = {b.start: b.index for b in model.blocks}
    stop_of = {b.stop: b.index + 1 for b in model.blocks}
    scan_block = {b.ops[0]: b.index for b in model.blocks if b.kind == "scan"}
    chosen: dict[int, Segment] = {}
    scans = _scan_keys(plan)

    def pick(i, j, saved, off, name=None, scan=None):
        opts = problem.options.get((i, j), ())
        same = [o for o in opts if isinstance(o.payload, dict) and o.payload.get("kind") != "none"
                and frozenset(o.payload.get("saved", ())) == saved
                and frozenset(o.payload.get("offloaded", ())) == off
                and (_scan_key(o.payload.get("scan")) if j > i + 1 else _scan_key(o.payload)) == scan]
        named = [o for o in same if o.name == name]
        if not (named or same):
            raise AutorematError(f"the plan's region over blocks [{i}, {j}) matches none of the model's options")
        return Segment(i, j, (named or same)[0])

    for r in plan.regions:
        i, j = start_of.get(r.start), stop_of.get(r.stop)
        if i is None or j is None:
            raise AutorematError(f"the plan's region [{r.start}, {r.stop}) does not fall on block boundaries")
        name = r.label.split(": ", 1)[1] if ": " in r.label else None
        inside = [op for op, k in scan_block.items() if i <= k < j and op in scans]  # a scan checkpointed in it
        chosen[i] = pick(i, j, r.saved, r.offloaded, name, scans.pop(inside[0]) if inside else None)
    for op, key in scans.items():
        i = scan_block.get(op)
        if i is None:
            raise AutorematError(f"the plan's scan {op} is not a block of the model")
        chosen[i] = pick(i, i + 1, key[1], key[2], scan=key)
    segs, i = [], 0
    while i < problem.n_blocks:
        if i in chosen:
            segs.append(chosen[i])
            i = chosen[i].stop
            continue
        # Blocks outside every region: the plan does not record how the solver grouped them
        # into "none" regions; take the longest allowed "none" regions up to the next region.
        stop = min([k for k in chosen if k > i], default=problem.n_blocks)
        for j in range(stop, i, -1):
            none = [o for o in problem.options.get((i, j), ()) if o.name == "none"]
            if none:
                segs.append(Segment(i, j, none[0]))
                i = j
                break
        else:
            raise AutorematError(f"block {i} has no 'none' option to leave it un-rematerialized")
    return tuple(segs)


def _scan_key(payload: dict | None) -> tuple | None:
    """What a scan option's payload asks of the scan: (op, saved, offloaded, the scans
    checkpointed in its body with their saved sets, whether its own body is checkpointed)."""
    if not payload or payload.get("kind") != "scan":
        return None
    return (payload["op"], frozenset(payload.get("saved", ())), frozenset(payload.get("offloaded", ())),
            frozenset((k, frozenset(v)) for k, v in payload.get("nested", {}).items()), payload.get("outer", True))


def _scan_keys(plan) -> dict:
    """Top-level scan op -> `_scan_key` of what `plan` does with it: its body's plan, or (body
    left alone) the plans of the scans in its body."""
    planned = {s.op for s in plan.scans}
    out = {}
    for s in plan.scans:
        top = s.op.split("/body/")[0]
        if s.op != top and top in planned:
            continue  # a scan in a planned scan's body: matched with it
        nested = frozenset((n.op, n.saved) for n in plan.scans if n.op.startswith(f"{top}/body/"))
        out[top] = ((top, s.saved, s.offloaded, nested, True) if s.op == top
                    else (top, frozenset(), frozenset(), nested, False))
    return out


def baseline_segments(model, option: str | None):
    """Per-block segments of a built-in policy: `None` = no remat, else an option kind per block.

    `option` is a block option kind (`"recompute"` = `nothing_saveable`, `"save:dots"` =
    `dots_saveable`), named `ckpt:<kind>` on ordinary blocks and `scan:<kind>` on scan blocks.
    Segments refer to `chain_problem(model)` (all options, before dominance pruning).  On a
    model without those, a block whose option was pruned uses the option with the same saved
    set, else the one with the least memory.  Returns `(segments, substituted blocks)`.
    """
    from autoremat._plots import chain_problem
    from autoremat.solver._chain import Segment

    if hasattr(model, "uniform"):
        segs = model.uniform("none" if option is None else "ckpt:" + option, 1)
        if segs is not None:
            return segs, 0
    problem = chain_problem(model)
    segs, substituted = [], 0
    for b in model.blocks:
        i = b.index
        opts = problem.options[(i, i + 1)]
        if option is None:
            want = "none"
        else:
            want = ("scan:" if b.kind == "scan" else "ckpt:") + option
        match = [o for o in opts if o.name == want]
        if not match and option is not None and b.kind != "scan":
            wanted_set = dict(model.data[i].options).get(option) if model.data else None
            match = [o for o in opts if isinstance(o.payload, dict) and o.payload.get("kind") == "region"
                     and not o.payload.get("offloaded")
                     and frozenset(o.payload.get("saved", ())) == wanted_set]
        if not match:
            if any(o.name != "none" for o in opts):
                substituted += 1
            match = [min(opts, key=lambda o: (max(o.stored_bytes, o.backward_bytes), o.extra_time))]
        segs.append(Segment(i, i + 1, match[0]))
    return tuple(segs), substituted


def with_recompute_costs(g, plan: Plan) -> Plan:
    """`plan` with `meta["recompute_flops"]` and `meta["recompute_time"]`: per top-level
    equation, the model's FLOPs and seconds (fusion-aware, as the solver counts them:
    `recompute_times`) of the equations the backward pass re-runs in it (a scan: its body's,
    times the trip count), from the recompute closure of what each region and scan body keeps."""
    kept = {vid for vid, rec in plan.values.items() if rec.decision != "recompute"}
    for part in (*plan.regions, *plan.scans):
        kept |= part.saved | part.offloaded
    for graph in (g, *(_blocks._op(g, s.op).bodies[0] for s in plan.scans)):  # a kept value's checkpoint_name
        kept = set(_with_name_aliases(graph.ops.values(), frozenset(kept)))
    per_eqn: dict[str, list] = {}
    for r in plan.regions:
        ops = [op.id for op in g.ops.values() if r.start <= op.index < r.stop]
        inside = {v for o in ops for v in g.ops[o].outputs}
        residuals = frozenset(v for o in ops for v in g.ops[o].residual_inputs + g.ops[o].residual_outputs
                              if v in inside)
        recomputed, _ = _closure(g, ops, frozenset(kept), frozenset(), residuals)
        for o in recomputed:
            per_eqn.setdefault(str(g.ops[o].index), []).append(g.ops[o])
    times = dict(recompute_times(g))
    for s in plan.scans:  # a scan in a planned scan's body counts in the top-level scan's equation
        body = _blocks._op(g, s.op).bodies[0]
        recomputed, _ = _closure(body, list(body.ops), frozenset(kept), frozenset(), frozenset(body.residual_values()))
        per_eqn.setdefault(str(g.ops[s.op.split("/")[0]].index), []).extend(body.ops[o] for o in recomputed)
        times.update(recompute_times(body))
    flops = {k: sum(op.cost.flops * op.multiplicity for op in ops) for k, ops in per_eqn.items()}
    time = {k: sum(times[op.id] * op.multiplicity for op in ops) for k, ops in per_eqn.items()}
    return replace(plan, meta={**plan.meta, "recompute_flops": flops, "recompute_time": time})
