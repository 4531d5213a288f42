"""A block's options as a `jax.checkpoint` region: candidate saved sets from the exact region
solver (`_region`, CP-SAT) at several memory caps, and what each costs to recompute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


from autoremat.graph._costs import MATMUL_PRIMITIVES
from autoremat.graph._graph import Graph, OpInfo
from autoremat.solver._blocks import Block
from autoremat.solver._peak_model import stored_residuals
from autoremat.solver._recompute import _closure, recompute_times


# Fractions of a block's residual bytes at which the region solver is asked for a saved set.
DEFAULT_CAPS = (0.0, 0.1, 0.25, 0.4, 0.6, 0.8, 1.0)


@dataclass(frozen=True)
class _BlockData:
    produced: frozenset[str]           # intermediate values produced in the block
    residuals: frozenset[str]          # intermediate values its backward reads (any producer)
    extra_bytes: int                   # bytes of residuals that are not forward values
    ext_inputs: frozenset[str]         # intermediates produced before the block and used in it
    options: tuple[tuple[str, frozenset[str]], ...]  # (name, saved set) candidates
    time: float                        # roofline time of its forward equations


def _block_data(g: Graph, b: Block, caps, region_method: str, time_limit: float | None,
                cache: dict) -> _BlockData:
    ops = [g.ops[o] for o in b.ops]
    produced = frozenset(v for op in ops for v in op.outputs)
    if b.kind == "scan":
        residuals = frozenset(v for op in ops for v in op.residual_inputs + op.residual_outputs
                              if g.values[v].producer is not None)
        extra = sum(op.extra_residual_bytes for op in ops)
    else:
        residuals, extra = stored_residuals(g, ops)
    ext_inputs = frozenset(v for op in ops for v in op.inputs
                           if g.values[v].producer is not None and v not in produced)
    time = sum(op.time for op in ops)
    if b.kind == "scan":
        return _BlockData(produced, residuals, extra, ext_inputs, (), time)
    key = b.signature
    if key in cache:
        proto_ids, proto_opts = cache[key]
        rename = dict(zip(proto_ids, [v for op in ops for v in op.outputs]))
        options = tuple((name, frozenset(rename[v] for v in s)) for name, s in proto_opts)
    else:
        options = _solve_block_options(g, ops, produced, residuals, caps, region_method, time_limit)
        cache[key] = ([v for op in ops for v in op.outputs], options)
    return _BlockData(produced, residuals, extra, ext_inputs, options, time)


def _region_problem(g: Graph, ops: Sequence[OpInfo], produced, residuals):
    from autoremat.solver._region import RegionProblem

    rt = recompute_times(g)
    return RegionProblem(
        value_bytes={v: g.values[v].nbytes for v in produced},
        producer={v: g.values[v].producer for v in produced},
        op_inputs={op.id: tuple(u for u in op.inputs if u in produced) for op in ops},
        op_time={op.id: rt[op.id] for op in ops},
        op_flops={op.id: float(op.cost.flops) for op in ops},
        needed=frozenset(v for v in residuals if v in produced),
        needed_ops=frozenset(op.id for op in ops if op.extra_residual_bytes),
    )


def _solve_block_options(g, ops, produced, residuals, caps, method, time_limit):
    """Candidate saved sets for one block, aligned to a fixed list of kinds.

    Kinds: `recompute` (nothing saved), `save:dots` (outputs of dot_general/conv),
    `save:dots_no_batch` (outputs of dot_generals without batch dimensions), `save:names`
    (values the user tagged with checkpoint_name), and `ilp<c>%` (the least recompute time
    with saved bytes <= c% of the block's residual bytes, solved exactly).  Every block has
    every kind, so a region over several blocks combines like with like.
    """
    from autoremat.solver import _region

    dots = frozenset(v for op in ops if op.primitive in MATMUL_PRIMITIVES for v in op.outputs)
    no_batch = frozenset(v for op in ops if op.primitive == "dot_general" and not op.params.get("batch_dims")
                         for v in op.outputs)
    named = frozenset(v for op in ops if op.primitive == "name" for v in op.outputs)
    kinds = [("recompute", frozenset()), ("save:dots", dots), ("save:dots_no_batch", no_batch),
             ("save:names", named)]
    res_bytes = sum(g.values[v].nbytes for v in residuals if v in produced)
    problem = _region_problem(g, ops, produced, residuals) if res_bytes else None
    for c in caps:
        saved = frozenset()
        if problem is not None:
            cap = int(c * res_bytes)
            # CP-SAT at every size: its time limit bounds it, where the greedy's closures grow
            # with the values squared (benchmarks/region_solvers.py, a 762-value region: CP-SAT
            # 0.02-2.01 s a cap; the greedy, used above 400 values before, 18.5 s at the 10% cap,
            # and a layer's options take nine caps)
            if method == "cpsat":
                sol = _region.solve_region_cpsat(problem, cap, time_limit=time_limit)
                if sol.status not in ("optimal", "feasible"):
                    sol = _region.solve_region_greedy(problem, cap)
            else:
                sol = _region.solve_region_greedy(problem, cap)
            saved = frozenset(sol.saved)
        kinds.append((f"ilp{round(c * 100)}%", saved))
    return tuple(kinds)


def _region_recompute(g, blocks, data, i, j, oi, cache):
    """Recompute time and FLOPs of region [i, j) with option index oi in every block."""
    needed: set[str] = set()
    total_t, total_f = 0.0, 0.0
    for k in range(j - 1, i - 1, -1):
        d = data[k]
        saved = d.options[min(oi, len(d.options) - 1)][1] if d.options else frozenset()
        need_out = frozenset(v for v in needed if v in d.produced)
        key = (k, oi, need_out)
        if key not in cache:
            R, outside = _closure(g, blocks[k].ops, saved, need_out, d.residuals)
            rt = recompute_times(g)
            # fsum: R is a set, and a plain sum's last bits follow its hash order, which differs
            # from process to process (PYTHONHASHSEED); ties between options then broke either way
            cache[key] = (R, outside, math.fsum(rt[o] for o in R), math.fsum(g.ops[o].cost.flops for o in R))
        R, outside, t, f = cache[key]
        total_t += t
        total_f += f
        needed -= need_out
        needed |= outside
    return total_t, total_f
