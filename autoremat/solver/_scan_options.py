"""The options of a scan over layers: what the body saves (JAX's policies, the user's
`checkpoint_name` tags and pairs of them, the region solver's sets), with the residuals stacked
over the trip count.
"""

from __future__ import annotations

import itertools
import math


from autoremat.solver._chain import Option
from autoremat.solver._peak_model import stored_residuals
from autoremat.solver._recompute import OFFLOAD_OVERLAP, _closure, recompute_times
from autoremat.solver._region_options import _solve_block_options


# ... and for a scan body (one solve serves every iteration).
SCAN_CAPS = tuple(round(0.05 * k, 2) for k in range(21))


# Backward workspace of a scan body, in units of its largest internal value (see _scan_options).
WORKSPACE_FACTOR = 2


# Scan bodies with at most this many `checkpoint_name` tags also get every pair of tags as a
# candidate saved set (8 tags: 28 pairs, each one closure over the body).
MAX_TAG_PAIRS = 8


def _with_name_aliases(ops, values: frozenset) -> frozenset:
    """`values` plus their `checkpoint_name` aliases, both ways.

    A `name` equation's output and input are one buffer: saving `checkpoint_name(x @ w, "out")`
    keeps the matmul output too, so recomputing what reads it does not re-run the matmul.
    """
    out = set(values)
    for o in ops:
        if o.primitive == "name" and o.inputs and o.outputs:
            if o.inputs[0] in values:
                out.add(o.outputs[0])
            elif o.outputs[0] in values:
                out.add(o.inputs[0])
    return frozenset(out)


def made_operand_bytes(g, op) -> int:
    """The bytes of scan `op`'s operands (scanned over or closed over, not its carries) that the
    step makes, as opposed to arguments such as a scan over layers' weights."""
    nconst, ncar = int(op.params.get("num_consts", 0)), int(op.params.get("num_carry", 0))
    return sum(g.values[v].nbytes for v in dict.fromkeys(op.inputs[:nconst] + op.inputs[nconst + ncar:])
               if g.values[v].producer is not None)


def _scan_options(g, b, d, cross, caps, method, time_limit, offload, host_bw, none_scale=1.0):
    op = g.ops[b.ops[0]]
    body = op.bodies[0]
    length = int(op.params.get("length", 1))
    ncar = int(op.params.get("num_carry", 0))
    nconst = int(op.params.get("num_consts", 0))
    body_largest = max((v.nbytes for v in op.bodies[0].values.values() if v.producer is not None), default=0)
    cot = cross[b.stop] + WORKSPACE_FACTOR * body_largest
    opts = []
    # No remat: JAX's own residuals of the whole scan (stacked over iterations).
    none_b = int(none_scale * (sum(g.values[v].nbytes for v in d.residuals) + d.extra_bytes))
    opts.append(Option("none", none_b, none_b + cot, 0.0, 0.0, 0, {"kind": "none"}))
    body_ops = list(body.ops.values())
    produced = frozenset(v for o in body_ops for v in o.outputs)
    # What one iteration's backward keeps, fusion-aware as for top-level blocks.
    residuals, body_extra = stored_residuals(body, body_ops)
    carry_ids = body.inputs[nconst:nconst + ncar]
    xs_ids = body.inputs[nconst + ncar:]
    # Per iteration, a checkpointed body keeps its carry and the slices it reads.
    # (The scanned-over slices are forwarded from the stacked inputs by JAX, not copied.)
    del xs_ids
    per_iter_in = sum(body.values[v].nbytes for v in carry_ids)
    # A checkpointed body re-runs on the scan's operands, so those made by the step (an RNN's
    # input projection for every time step; not a scan over layers' weights) stay until its
    # backward, whether or not JAX's own residuals of the body read them.
    operands = made_operand_bytes(g, op)
    # While one iteration's backward runs, its recomputed residuals are live.  Inside a
    # loop body XLA keeps more than the fusion-aware set (measured on the scan transformer,
    # nothing saved: fusion-aware 43.6 MiB predicted vs 50.8 compiled; JAX's full list
    # 54.1): chains re-run are kept whole (`stored_residuals` with a saved set).
    # The body is solved once for all iterations, and its saved set is the only knob of
    # the whole scan: ask the region solver at a finer grid of caps than for blocks.
    scan_caps = sorted(set(caps) | set(SCAN_CAPS))
    cands = _solve_block_options(body, body_ops, produced, residuals, scan_caps, method, time_limit)
    # The user's own vocabulary: each checkpoint_name saved alone, and with the matmul
    # outputs without batch dimensions (MaxText's save_out_proj, minimal_with_context, ...).
    tags: dict[str, frozenset] = {}
    for o in body_ops:
        if o.primitive == "name" and isinstance(o.params.get("name"), str):
            tags[o.params["name"]] = tags.get(o.params["name"], frozenset()) | frozenset(o.outputs)
    no_batch = dict(cands).get("save:dots_no_batch", frozenset())
    covered = _with_name_aliases(body_ops, no_batch)  # tags of those matmul outputs add nothing
    # Two tags saved together (MaxText's presets are such sets), up to MAX_TAG_PAIRS tags.
    pairs = (itertools.combinations(sorted(tags), 2) if len(tags) <= MAX_TAG_PAIRS else ())
    cands = tuple(cands) + tuple((f"save:name:{n}", vs) for n, vs in sorted(tags.items())) + tuple(
        (f"save:name:{a}+{b}", tags[a] | tags[b]) for a, b in pairs) + tuple(
        (f"save:dots_no_batch+{n}", no_batch | vs) for n, vs in sorted(tags.items()) if not vs <= covered)
    body_time = sum(o.time for o in body_ops)
    body_rt = recompute_times(body)
    for name, saved in cands:
        # A saved value also stands for its `checkpoint_name` alias (same buffer:
        # MaxText-style tags), in what is recomputed and in what is live.
        kept = _with_name_aliases(body_ops, saved)
        R, _ = _closure(body, [o.id for o in body_ops], kept, frozenset(), residuals)
        rt = length * math.fsum(body_rt[o] for o in R)  # R is a set: fsum is independent of its order
        rf = length * math.fsum(body.ops[o].cost.flops for o in R)
        s_b = sum(body.values[v].nbytes for v in saved)
        stored = length * (per_iter_in + s_b) + operands
        # The iteration's saved values are part of `stored` already; the rest of what its
        # backward reads is re-run and live (chains re-run are kept whole).
        rerun, rerun_extra = stored_residuals(body, body_ops, kept)
        iteration = sum(body.values[v].nbytes for v in rerun - kept) + rerun_extra + cot
        live = stored + iteration
        opts.append(Option(f"scan:{name}", stored, live, rt, rf, 0,
                           {"kind": "scan", "op": op.id, "saved": saved}))
        if offload and s_b:
            exposed = max(0.0, 2 * length * s_b / host_bw - OFFLOAD_OVERLAP * 3 * length * body_time)
            opts.append(Option(f"scan:{name}+offload", length * per_iter_in + operands,
                               length * per_iter_in + operands + s_b + iteration,
                               rt + exposed, rf,
                               length * s_b, {"kind": "scan", "op": op.id, "saved": frozenset(),
                                              "offloaded": saved}))
    return tuple(opts) + _nested_options(body, op.id, length, per_iter_in, cot, scan_caps, method, time_limit,
                                         none_b, none_scale)


def _nested_options(body, oid: str, length: int, per_iter_in: int, cot: int, caps, method,
                    time_limit, none_b: int, none_scale: float) -> tuple[Option, ...]:
    """Options of a scan body that holds scans of its own (an LSTM layer's scan over time in a
    scan over layers), three per saved set the region solver gives each inner body:
    `scan:in:<set>`: the outer body saves only those inner values (stacked over both trip
    counts), so its backward re-runs no more of the inner scan than the set leaves out;
    `scan:nest:<set>`: the outer body saves nothing and the inner scan gets a checkpoint of
    its own keeping the set, so one outer iteration's inner values are live while it runs
    backward; `scan:inner:<set>`: the outer body left alone (JAX keeps its residuals, `none_b`,
    but the inner scan's own stacks), the inner scan checkpointed keeping the set, as a policy
    written on an RNN's cell (under FSDP on 8 devices, `nothing_saveable` on the LSTM scan's
    cells recomputes half the FLOPs of the nested option at the same budget:
    benchmarks/sharded.py --models lstm_scan --layouts fsdp --batch-scale 8).  The outer
    body's own options stop at the inner scan: its region solver sees it as one equation whose
    residuals are all it stacks.  On the LSTM in a scan over layers
    (benchmarks/_unseen.py `lstm_scan`, 4 layers of 1024 steps; benchmarks/budget_log.py
    --model lstm_scan --budget B): at 14.13 GiB the outer body keeping the inner gates compiled
    to 11.75 GiB recomputing no matmul, where the leanest of its own options that recomputes
    none (`dots_saveable` on the body) compiles to 17.44; at 7.5, nothing outside and the
    gates inside to 7.44 GiB, where `nothing_saveable` on the body compiles to 8.94, both +8.80
    TFLOP; at 6.6, nothing saved inside either, 6.50 GiB and +13.20."""
    ops, rt = list(body.ops.values()), recompute_times(body)
    out = []
    for inner in (o for o in ops if o.primitive == "scan" and o.bodies):
        rest = [o for o in ops if o.id != inner.id]
        # nested: the whole body re-run, the inner scan's forward with it, its own stacks replaced
        rf_b, rt_b, live_b = _outer_rerun(body, rest, frozenset(inner.inputs), rt)
        rf_b, rt_b = rf_b + inner.cost.flops, rt_b + rt[inner.id]
        rest_b = max(none_b - int(none_scale * length * inner.extra_residual_bytes), 0)  # left alone, less its stacks
        for name, saved, s_in, rf_in, rt_in, needs in _inner_sets(inner, caps, method, time_limit):
            rf_a, rt_a, live_a = _outer_rerun(body, rest, needs, rt)
            stored = length * (per_iter_in + s_in)
            out.append(Option(f"scan:in:{name}", stored, stored + live_a + cot, length * (rt_a + rt_in),
                              length * (rf_a + rf_in), 0, {"kind": "scan", "op": oid, "saved": saved}))
            stored = length * per_iter_in
            out.append(Option(f"scan:nest:{name}", stored, stored + live_b + s_in + cot, length * (rt_b + rt_in),
                              length * (rf_b + rf_in), 0,
                              {"kind": "scan", "op": oid, "saved": frozenset(), "nested": {inner.id: saved}}))
            stored = rest_b + length * s_in
            out.append(Option(f"scan:inner:{name}", stored, stored + cot, length * rt_in, length * rf_in, 0,
                              {"kind": "scan", "op": oid, "outer": False, "saved": frozenset(),
                               "nested": {inner.id: saved}}))
    return tuple(out)


def _inner_sets(inner, caps, method, time_limit):
    """Per region-solver set of the body of scan `inner` (nested in a scan body): (name, saved
    set, bytes stacked per run of `inner` (its carries and the set, as a checkpointed body's),
    FLOPs and seconds its backward re-runs per run of `inner`, the operands of `inner` that its
    backward then reads)."""
    ib, n = inner.bodies[0], int(inner.params.get("length", 1))
    iops = list(ib.ops.values())
    produced = frozenset(v for o in iops for v in o.outputs)
    residuals, _ = stored_residuals(ib, iops)
    rt = recompute_times(ib)
    n_consts, n_carry = int(inner.params.get("num_consts", 0)), int(inner.params.get("num_carry", 0))
    carry = sum(ib.values[v].nbytes for v in ib.inputs[n_consts:n_consts + n_carry])
    operand = dict(zip(ib.inputs, inner.inputs)) if len(ib.inputs) == len(inner.inputs) else None
    for name, saved in _solve_block_options(ib, iops, produced, residuals, caps, method, time_limit):
        kept = _with_name_aliases(iops, saved)
        R, _ = _closure(ib, [o.id for o in iops], kept, frozenset(), residuals)
        read = (residuals | {u for o in R for u in ib.ops[o].inputs}) - kept
        needs = (frozenset(inner.inputs) if operand is None
                 else frozenset(operand[v] for v in read if v in operand))
        yield (name, saved, n * (carry + sum(ib.values[v].nbytes for v in saved)),
               n * math.fsum(ib.ops[o].cost.flops for o in R), n * math.fsum(rt[o] for o in R), needs)


def _outer_rerun(body, ops, needs: frozenset, rt: dict) -> tuple[float, float, int]:
    """(FLOPs, seconds, live bytes) of re-running `ops` of a scan body that saves none of
    their values, for what their own backward reads and for `needs`."""
    residuals, _ = stored_residuals(body, ops)
    R, _ = _closure(body, [o.id for o in ops], frozenset(), frozenset(), residuals | needs)
    rerun, extra = stored_residuals(body, ops, frozenset())
    live = sum(body.values[v].nbytes for v in rerun) + extra
    return math.fsum(body.ops[o].cost.flops for o in R), math.fsum(rt[o] for o in R), live
