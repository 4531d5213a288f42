"""Dynamic programming over (position, stored-prefix bucket): fast and near-exact.

The state after the regions covering ``[0, i)`` is the bytes they store, ``P``.
Everything that follows depends on the past only through ``P`` (each later
stage is ``P + ...``), so ``F[i, P]`` = least extra time to cover ``[0, i)``
storing ``P`` is a dynamic program over the chain (as in Rotor, Beaumont et al.
2019, whose DP is over memory too). ``P`` is discretized into buckets of
``unit`` bytes:

- *conservative* pass: stored bytes rounded **up** to whole units, so every
  plan the DP accepts is truly within budget (``P <= q * unit``);
- *relaxed* pass: stored bytes rounded **down**, so every truly feasible plan
  passes and its optimum is a lower bound.

The gap between the two is the reported ``gap``; when ``unit`` divides every
stored size (e.g. the gcd is coarse enough) both agree and the result is optimal.
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


def _run(problem: ChainProblem, cap: int, unit: int, round_up: bool, want_plan: bool):
    """One DP pass; returns (best time, segments or None)."""
    n = problem.n_blocks
    tables = _tables(problem)
    n_q = cap // unit + 1
    qs = np.arange(n_q)
    table = np.full((n + 1, n_q), np.inf)
    table[0, 0] = 0.0
    back: list = [None] * (n + 1)
    for i in range(1, n + 1):
        t = tables[i]
        if t.starts.size == 0:
            continue
        shift = -(-t.stored // unit) if round_up else t.stored // unit
        # Largest source bucket whose stage fits: q * unit + backward <= cap.
        src_max = np.where(t.backward <= cap, (cap - t.backward) // unit, -1)
        keep = (shift < n_q) & (src_max >= 0)
        if not keep.any():
            continue
        idx = np.nonzero(keep)[0]
        shift, src_max = shift[idx], src_max[idx]
        src = qs[None, :] - shift[:, None]
        valid = (src >= 0) & (src <= src_max[:, None])
        cand = table[t.starts[idx][:, None], np.clip(src, 0, n_q - 1)] + t.time[idx][:, None]
        cand[~valid] = np.inf
        best = np.argmin(cand, axis=0)
        table[i] = cand[best, qs]
        if want_plan:
            back[i] = (idx[best], shift[best])
    q = int(np.argmin(table[n]))
    value = float(table[n, q])
    if not want_plan or math.isinf(value):
        return value, None
    segments = []
    i = n
    while i > 0:
        c_idx, c_shift = back[i]
        c = int(c_idx[q])
        start = int(tables[i].starts[c])
        segments.append(Segment(start, i, tables[i].options[c]))
        q -= int(c_shift[q])
        i = start
    return value, tuple(reversed(segments))


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
    value, plan = _run(problem, cap, unit, round_up=True, want_plan=True)
    lower = value if exact else _run(problem, cap, unit, round_up=False, want_plan=False)[0]

    # The lowest-peak plan always fits here; the fastest plan may. Keep the best.
    candidates = [p for p in (plan, lowest_peak_segments(problem), min_time_segments(problem)) if p]
    scored = [(evaluate(problem, p), p) for p in candidates]
    (peak, extra), best = min(
        (s for s in scored if s[0][0] <= budget), key=lambda s: (s[0][1], s[0][0])
    )
    del peak
    gap = relative_gap(extra, lower)
    return make_result(problem, best, status="optimal" if gap == 0.0 else "feasible", gap=gap, t0=t0, solver="dp")
