"""A fast local-search heuristic: for huge chains, and as CP-SAT's warm start.

1. Start from the fastest plan ignoring memory (a shortest path on time).
2. While over budget, apply the move with the most peak bytes saved per second
   added (a move that adds no time goes first).
3. If no move lowers the peak, restart from the lowest-peak plan (exact, see
   ``lowest_peak_segments``), which fits whenever any plan does.
4. While some move saves time and keeps the plan within budget, apply the one
   saving the most.

Moves: replace the regions covering ``[x, y)`` (``x`` and ``y`` current region
boundaries) by one allowed region ``[x, y)`` with any option, which covers
changing a region's option and merging regions; and split one region in two
(any options). Every move is priced in O(1) from prefix sums and prefix/suffix
maxima of the stages, vectorized with numpy over all moves, so a step costs
about ``n_candidates`` array operations.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from autoremat.solver._chain import (
    ChainProblem,
    Segment,
    SolveResult,
    check_budget,
    evaluate,
    infeasible_result,
    lowest_peak,
    lowest_peak_segments,
    make_result,
    min_time_segments,
    relative_gap,
)

__all__ = ["solve_greedy"]

_NEG = -(2**62)


class _Moves:
    """All candidate moves of a problem, as flat arrays (built once per solve)."""

    def __init__(self, problem: ChainProblem):
        self.problem = problem
        regions = sorted(problem.options.items())
        flat = [(j, i, o) for (j, i), opts in regions for o in opts]
        self.x = np.array([j for j, _, _ in flat], dtype=np.int64)
        self.y = np.array([i for _, i, _ in flat], dtype=np.int64)
        self.s = np.array([o.stored_bytes for *_, o in flat], dtype=np.int64)
        self.b = np.array([o.backward_bytes for *_, o in flat], dtype=np.int64)
        self.t = np.array([o.extra_time for *_, o in flat], dtype=np.float64)
        self.opt = [o for *_, o in flat]
        first = {}
        for k, (j, i, _) in enumerate(flat):
            first.setdefault((j, i), k)
        self.first = first  # (start, stop) -> index of its first option in the flat arrays
        self._splits: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}

    def splits(self, x: int, y: int) -> tuple[np.ndarray, np.ndarray]:
        """Flat indices (left, right) of every split of ``[x, y)`` into two allowed regions."""
        cached = self._splits.get((x, y))
        if cached is None:
            left, right = [], []
            options = self.problem.options
            for m in range(x + 1, y):
                if (x, m) in options and (m, y) in options:
                    lo, ro = self.first[x, m], self.first[m, y]
                    for a in range(len(options[x, m])):
                        for c in range(len(options[m, y])):
                            left.append(lo + a)
                            right.append(ro + c)
            cached = (np.array(left, dtype=np.int64), np.array(right, dtype=np.int64))
            self._splits[x, y] = cached
        return cached


class _Plan:
    """A plan as flat option indices, with the arrays that price moves."""

    def __init__(self, moves: _Moves, chosen: Sequence[int]):
        self.moves = moves
        self.chosen = list(chosen)
        n = moves.problem.n_blocks
        ch = np.array(self.chosen, dtype=np.int64)
        k = len(ch)
        self.prefix = np.concatenate([[0], np.cumsum(moves.s[ch])])
        self.tprefix = np.concatenate([[0.0], np.cumsum(moves.t[ch])])
        stages = self.prefix[:-1] + moves.b[ch]
        self.pre_max = np.concatenate([[_NEG], np.maximum.accumulate(stages)])  # max stage before k
        self.suf_max = np.concatenate([np.maximum.accumulate(stages[::-1])[::-1], [_NEG]])  # from k on
        self.total = int(self.prefix[-1])
        self.time = float(self.tprefix[-1])
        self.peak = max(self.total, int(self.suf_max[0])) + moves.problem.base_bytes
        self.boundary = np.zeros(n + 1, dtype=bool)
        self.index_at = np.zeros(n + 1, dtype=np.int64)  # segment starting at p (k at p = n)
        starts = moves.x[ch]
        self.boundary[starts] = True
        self.boundary[n] = True
        self.index_at[starts] = np.arange(k)
        self.index_at[n] = k

    def price_regions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(move, peak, time) of replacing the regions in [x, y) by a candidate region.

        Only moves whose ``x`` and ``y`` are current boundaries are priced.
        """
        m = self.moves
        move = np.nonzero(self.boundary[m.x] & self.boundary[m.y])[0]
        a, c = self.index_at[m.x[move]], self.index_at[m.y[move]]
        pa = self.prefix[a]
        delta = m.s[move] - (self.prefix[c] - pa)
        peak = np.maximum(
            np.maximum(self.pre_max[a], pa + m.b[move]), np.maximum(self.suf_max[c], self.total) + delta
        )
        new_time = self.time + m.t[move] - (self.tprefix[c] - self.tprefix[a])
        return move, peak + m.problem.base_bytes, new_time

    def price_splits(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(segment, left, right, peak, time) of splitting each current region in two."""
        m = self.moves
        segs, lefts, rights = [], [], []
        for k, f in enumerate(self.chosen):
            x, y = int(m.x[f]), int(m.y[f])
            if y - x > 1:
                left, right = m.splits(x, y)
                if left.size:
                    segs.append(k)
                    lefts.append(left)
                    rights.append(right)
        if not segs:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty, empty, np.zeros(0)
        seg = np.repeat(np.array(segs, dtype=np.int64), [len(v) for v in lefts])
        left, right = np.concatenate(lefts), np.concatenate(rights)
        pa = self.prefix[seg]
        delta = m.s[left] + m.s[right] - (self.prefix[seg + 1] - pa)
        peak = np.maximum(
            np.maximum(np.maximum(self.pre_max[seg], pa + m.b[left]), pa + m.s[left] + m.b[right]),
            np.maximum(self.suf_max[seg + 1], self.total) + delta,
        )
        new_time = self.time + m.t[left] + m.t[right] - (self.tprefix[seg + 1] - self.tprefix[seg])
        return seg, left, right, peak + m.problem.base_bytes, new_time

    def replace_region(self, f: int) -> _Plan:
        m = self.moves
        a, c = int(self.index_at[m.x[f]]), int(self.index_at[m.y[f]])
        return _Plan(m, self.chosen[:a] + [f] + self.chosen[c:])

    def split(self, k: int, left: int, right: int) -> _Plan:
        return _Plan(self.moves, self.chosen[:k] + [left, right] + self.chosen[k + 1 :])

    def segments(self) -> tuple[Segment, ...]:
        m = self.moves
        return tuple(Segment(int(m.x[f]), int(m.y[f]), m.opt[f]) for f in self.chosen)


def _pick_saving_memory(peak: np.ndarray, new_time: np.ndarray, plan: _Plan) -> int | None:
    """Index of the move saving most bytes per second added (free moves first), or None."""
    saved = plan.peak - peak
    added = new_time - plan.time
    ok = saved > 0
    if not ok.any():
        return None
    free = ok & (added <= 0)
    if free.any():
        most = saved[free].max()
        return int(np.argmin(np.where(free & (saved == most), added, np.inf)))
    return int(np.argmax(np.where(ok, saved / np.where(ok, added, 1.0), -np.inf)))


def _pick_saving_time(peak: np.ndarray, new_time: np.ndarray, plan: _Plan, budget: int) -> int | None:
    """Index of the fitting move with the least time, if it beats the plan, or None."""
    tol = 1e-12 * max(abs(plan.time), 1e-9)
    ok = (peak <= budget) & (new_time < plan.time - tol)
    if not ok.any():
        return None
    return int(np.argmin(np.where(ok, new_time, np.inf)))


def _step(plan: _Plan, budget: int, reduce_memory: bool) -> _Plan | None:
    """The plan after the best move, or None if no move helps."""
    move, r_peak, r_time = plan.price_regions()
    seg, left, right, s_peak, s_time = plan.price_splits()
    peak = np.concatenate([r_peak, s_peak])
    new_time = np.concatenate([r_time, s_time])
    if reduce_memory:
        best = _pick_saving_memory(peak, new_time, plan)
    else:
        best = _pick_saving_time(peak, new_time, plan, budget)
    if best is None:
        return None
    if best < move.size:
        return plan.replace_region(int(move[best]))
    best -= move.size
    return plan.split(int(seg[best]), int(left[best]), int(right[best]))


def solve_greedy(
    problem: ChainProblem,
    budget: int,
    *,
    time_limit: float | None = None,
    max_steps: int | None = None,
) -> SolveResult:
    """A good plan fast, by local search (see the module docstring).

    Args:
      problem: the chain.
      budget: bytes.
      time_limit: seconds after which the search stops and returns what it has
        (None: no limit; the work is bounded by ``max_steps`` anyway).
      max_steps: moves per phase (default ``10 * n_blocks``).

    Returns:
      ``"feasible"`` with the gap to the fastest plan's time (a lower bound),
      ``"optimal"`` when the fastest plan fits, ``"infeasible"`` (with
      ``lowest_peak``) exactly when budget < lowest peak.
    """
    t0 = time.perf_counter()
    budget = check_budget(budget)
    if budget < lowest_peak(problem):
        return infeasible_result(problem, t0=t0, solver="greedy")
    deadline = t0 + time_limit if time_limit is not None else float("inf")
    steps = max_steps if max_steps is not None else 10 * problem.n_blocks
    moves = _Moves(problem)

    def plan_of(segments: Sequence[Segment]) -> _Plan:
        return _Plan(moves, [moves.first[s.start, s.stop] + problem.options[s.start, s.stop].index(s.option) for s in segments])

    fastest = min_time_segments(problem)
    lower = evaluate(problem, fastest)[1]
    plan = plan_of(fastest)
    for _ in range(steps):
        if plan.peak <= budget or time.perf_counter() > deadline:
            break
        plan = _step(plan, budget, reduce_memory=True) or plan_of(lowest_peak_segments(problem))
    if plan.peak > budget:
        plan = plan_of(lowest_peak_segments(problem))
    for _ in range(steps):
        if time.perf_counter() > deadline:
            break
        better = _step(plan, budget, reduce_memory=False)
        if better is None:
            break
        plan = better
    _, extra = evaluate(problem, plan.segments())
    gap = relative_gap(extra, lower)
    return make_result(
        problem, plan.segments(), status="optimal" if gap == 0.0 else "feasible", gap=gap, t0=t0, solver="greedy"
    )
