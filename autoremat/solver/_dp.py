"""Dynamic programming over (position, stored-prefix bucket): fast and near-exact.

The state after the regions covering ``[0, i)`` is the bytes they store, ``P``.
Everything that follows depends on the past only through ``P`` (each later
stage is ``P + ...``), so ``F[i, P]`` = least extra time to cover ``[0, i)``
storing ``P`` is a dynamic program over the chain (as in Rotor, Beaumont et al.
2019, whose DP is over memory too). ``P`` is discretized into buckets of
``unit`` bytes:

- *planning* pass: each stored size is rounded to the nearest unit to pick
  the bucket, but every state also carries its exact prefix, and the stage
  and forward checks use the exact bytes, so every plan found truly fits.
  Within a bucket the fastest state wins (ties: the smaller exact prefix);
  that merge is the only approximation;
- *bounding* pass: stored sizes rounded **down** and checks made on
  ``bucket * unit``, a relaxation that every truly feasible plan passes, so
  its optimum is a lower bound.

The relative difference is the reported ``gap``. When ``unit`` divides every
stored size (e.g. the gcd of the sizes is coarse enough) the planning pass is
the exact DP and the result is optimal. The error grows with the number of
regions in the plan (each may lose up to a bucket), so for very long chains
raise ``buckets`` or compare with ``solve_greedy`` (``solve(method="auto")``
runs both).
Each step is vectorized with numpy over the bucket axis and all candidate
(region, option) pairs ending at the same position.
"""

from __future__ import annotations

import math
import time
from functools import reduce

import numpy as np

from autoremat.solver._chain import (
    ChainProblem,
    Segment,
    SolveResult,
    _BIG,
    _tables,
    check_budget,
    evaluate,
    infeasible_result,
    lowest_peak,
    lowest_peak_segments,
    make_result,
    min_time_segments,
    relative_gap,
)

__all__ = ["solve_dp", "DEFAULT_BUCKETS"]

DEFAULT_BUCKETS = 512
_CHUNK = 1 << 19  # candidates x buckets per numpy step, to bound temporary memory


def _plan_pass(problem: ChainProblem, cap: int, unit: int) -> tuple[Segment, ...] | None:
    """The planning pass: buckets index approximate prefixes, checks use exact bytes.

    Each state ``(i, q)`` keeps the fastest partial plan (ties: fewer stored
    bytes) whose stored sizes, each rounded to the nearest unit, add up to
    ``q``, together with its exact stored prefix. Stages and the forward total
    are checked with the exact prefix, so every plan found truly fits; with
    ``unit`` dividing every stored size this is the exact DP.
    """
    n = problem.n_blocks
    tables = _tables(problem)
    # Rounding to nearest drifts by at most n/2 units from the exact prefix.
    n_q = cap // unit + n // 2 + 2
    qs = np.arange(n_q)
    best_time = np.full((n + 1, n_q), np.inf)
    best_time[0, 0] = 0.0
    prefix = np.full((n + 1, n_q), _BIG, dtype=np.int64)
    prefix[0, 0] = 0
    back: list = [None] * (n + 1)
    for i in range(1, n + 1):
        t = tables[i]
        keep = np.nonzero((t.stored <= cap) & (t.backward <= cap))[0]
        row_time = np.full(n_q, np.inf)
        row_prefix = np.full(n_q, _BIG, dtype=np.int64)
        row_choice = np.zeros(n_q, dtype=np.int64)
        row_shift = np.zeros(n_q, dtype=np.int64)
        for lo in range(0, keep.size, max(1, _CHUNK // n_q)):
            idx = keep[lo : lo + max(1, _CHUNK // n_q)]
            shift = (2 * t.stored[idx] + unit) // (2 * unit)  # nearest, halves up
            src = qs[None, :] - shift[:, None]
            ok_src = src >= 0
            src = np.where(ok_src, src, 0)
            starts = t.starts[idx][:, None]
            p_src = prefix[starts, src]
            p_new = p_src + t.stored[idx][:, None]
            cand = best_time[starts, src] + t.time[idx][:, None]
            valid = ok_src & (p_src + t.backward[idx][:, None] <= cap) & (p_new <= cap)
            cand[~valid] = np.inf
            fastest = cand.min(axis=0)
            # Among the fastest candidates of each bucket, the one storing least.
            best = np.argmin(np.where(cand == fastest[None, :], p_new, _BIG), axis=0)
            b_time, b_prefix = cand[best, qs], p_new[best, qs]
            better = (b_time < row_time) | ((b_time == row_time) & (b_prefix < row_prefix))
            row_time = np.where(better, b_time, row_time)
            row_prefix = np.where(better, b_prefix, row_prefix)
            row_choice = np.where(better, idx[best], row_choice)
            row_shift = np.where(better, shift[best], row_shift)
        best_time[i] = row_time
        prefix[i] = np.where(np.isinf(row_time), _BIG, row_prefix)
        back[i] = (row_choice, row_shift)
    if np.isinf(best_time[n]).all():
        return None
    final = best_time[n]
    q = int(np.argmin(np.where(final == final.min(), prefix[n], _BIG)))
    segments = []
    i = n
    while i > 0:
        c_idx, c_shift = back[i]
        c = int(c_idx[q])
        start = int(tables[i].starts[c])
        segments.append(Segment(start, i, tables[i].options[c]))
        q -= int(c_shift[q])
        i = start
    return tuple(reversed(segments))


def _bound_pass(problem: ChainProblem, cap: int, unit: int) -> float:
    """The bounding pass: stored sizes rounded down, checks on ``q * unit`` (a relaxation).

    Every truly feasible plan passes (its bucket is at most its exact prefix),
    so the optimum is a lower bound on the true optimum.
    """
    n = problem.n_blocks
    tables = _tables(problem)
    n_q = cap // unit + 1
    qs = np.arange(n_q)
    table = np.full((n + 1, n_q), np.inf)
    table[0, 0] = 0.0
    for i in range(1, n + 1):
        t = tables[i]
        shift = t.stored // unit
        # Largest source bucket whose stage passes: q * unit + backward <= cap.
        src_max = np.where(t.backward <= cap, (cap - t.backward) // unit, -1)
        keep = np.nonzero((shift < n_q) & (src_max >= 0))[0]
        for lo in range(0, keep.size, max(1, _CHUNK // n_q)):
            idx = keep[lo : lo + max(1, _CHUNK // n_q)]
            src = qs[None, :] - shift[idx][:, None]
            valid = (src >= 0) & (src <= src_max[idx][:, None])
            cand = table[t.starts[idx][:, None], np.clip(src, 0, n_q - 1)] + t.time[idx][:, None]
            cand[~valid] = np.inf
            table[i] = np.minimum(table[i], cand.min(axis=0))
    return float(table[n].min())


def solve_dp(
    problem: ChainProblem,
    budget: int,
    *,
    time_limit: float | None = None,
    buckets: int = DEFAULT_BUCKETS,
) -> SolveResult:
    """Least extra time with peak <= budget, by DP over stored-prefix buckets.

    Args:
      problem: the chain.
      budget: bytes.
      time_limit: ignored (the DP's cost is fixed: about
        ``n_candidates * buckets`` operations).
      buckets: number of buckets the bytes available for stored values are split
        into; more is slower and tighter.

    Returns:
      ``"optimal"`` when the discretization is exact or the bound meets the plan,
      else ``"feasible"`` with the gap to the relaxed lower bound;
      ``"infeasible"`` (with ``lowest_peak``) exactly when budget < lowest peak.
    """
    del time_limit
    t0 = time.perf_counter()
    budget = check_budget(budget)
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise ValueError(f"solve_dp: buckets must be a positive int, got {buckets!r}")
    if budget < lowest_peak(problem):
        return infeasible_result(problem, t0=t0, solver="dp")
    cap = budget - problem.base_bytes
    stored = {o.stored_bytes for opts in problem.options.values() for o in opts}
    g = reduce(math.gcd, stored, 0)
    if g == 0:  # nothing is ever stored: one bucket is exact
        unit, exact = max(cap, 1), True
    elif cap // g <= buckets:
        unit, exact = g, True
    else:
        unit = -(-cap // buckets)
        exact = g % unit == 0
    plan = _plan_pass(problem, cap, unit)
    lower = -math.inf if exact else _bound_pass(problem, cap, unit)

    # The lowest-peak plan always fits here; the fastest plan may. Keep the fastest that fits.
    fitting = []
    for segments in (plan, lowest_peak_segments(problem), min_time_segments(problem)):
        if segments:
            peak, extra = evaluate(problem, segments)
            if peak <= budget:
                fitting.append((extra, peak, segments))
    extra, _, best = min(fitting, key=lambda f: f[:2])
    gap = 0.0 if exact else relative_gap(extra, lower)
    return make_result(problem, best, status="optimal" if gap == 0.0 else "feasible", gap=gap, t0=t0, solver="dp")
