"""A fast local-search heuristic: for huge chains, and as CP-SAT's warm start.

1. Start from the fastest plan ignoring memory (a shortest path on time).
2. While over budget, apply the local move with the most peak bytes saved per
   second added (a move with no time cost goes first).
3. If no move lowers the peak, restart from the lowest-peak plan (exact, see
   ``lowest_peak_segments``), which fits whenever any plan does.
4. While some move saves time and keeps the plan within budget, apply the one
   saving the most.

Moves replace one or two adjacent regions: change a region's option, merge two
adjacent regions into one, split a region in two (any options). Each move's
peak is computed in O(1) from prefix/suffix maxima of the stages.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from autoremat.solver._chain import (
    ChainProblem,
    Option,
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


class _State:
    """A plan with the prefix sums and stage maxima that price moves in O(1)."""

    def __init__(self, problem: ChainProblem, segments: Sequence[Segment]):
        self.problem = problem
        self.segments = list(segments)
        stored = [seg.option.stored_bytes for seg in self.segments]
        k = len(stored)
        self.prefix = [0] * (k + 1)
        for m, s in enumerate(stored):
            self.prefix[m + 1] = self.prefix[m] + s
        stages = [self.prefix[m] + seg.option.backward_bytes for m, seg in enumerate(self.segments)]
        self.pre_max = [_NEG] * (k + 1)  # max stage before m
        for m in range(k):
            self.pre_max[m + 1] = max(self.pre_max[m], stages[m])
        self.suf_max = [_NEG] * (k + 1)  # max stage from m on
        for m in range(k - 1, -1, -1):
            self.suf_max[m] = max(self.suf_max[m + 1], stages[m])
        self.total = self.prefix[k]
        self.peak = max(self.total, self.suf_max[0]) + problem.base_bytes
        self.time = sum(seg.option.extra_time for seg in self.segments)

    def price(self, a: int, c: int, new: Sequence[tuple[int, int, Option]]) -> tuple[int, float]:
        """(peak, time) after replacing segments ``a..c-1`` with ``new``."""
        p = self.prefix[a]
        peak = self.pre_max[a]
        dtime = 0.0
        for _, _, opt in new:
            peak = max(peak, p + opt.backward_bytes)
            p += opt.stored_bytes
            dtime += opt.extra_time
        delta = p - self.prefix[c]
        peak = max(peak, self.suf_max[c] + delta, self.total + delta) + self.problem.base_bytes
        for seg in self.segments[a:c]:
            dtime -= seg.option.extra_time
        return peak, self.time + dtime

    def moves(self) -> Iterator[tuple[int, int, tuple[tuple[int, int, Option], ...]]]:
        """Every (a, c, replacement) local move."""
        options = self.problem.options
        segs = self.segments
        for k, seg in enumerate(segs):
            for opt in options[seg.start, seg.stop]:
                if opt != seg.option:
                    yield k, k + 1, ((seg.start, seg.stop, opt),)
            if k + 1 < len(segs):
                merged = options.get((seg.start, segs[k + 1].stop), ())
                for opt in merged:
                    yield k, k + 2, ((seg.start, segs[k + 1].stop, opt),)
            for m in range(seg.start + 1, seg.stop):
                left, right = options.get((seg.start, m)), options.get((m, seg.stop))
                if left and right:
                    for o1 in left:
                        for o2 in right:
                            yield k, k + 1, ((seg.start, m, o1), (m, seg.stop, o2))

    def apply(self, a: int, c: int, new) -> _State:
        segs = self.segments[:a] + [Segment(s, e, o) for s, e, o in new] + self.segments[c:]
        return _State(self.problem, segs)


def _reduce_peak(state: _State, budget: int, max_steps: int) -> _State | None:
    """Step 2: best bytes-saved per second-added moves until the plan fits, or None."""
    for _ in range(max_steps):
        if state.peak <= budget:
            return state
        best_key, best_move = None, None
        for a, c, new in state.moves():
            peak, new_time = state.price(a, c, new)
            saved = state.peak - peak
            if saved <= 0:
                continue
            added = new_time - state.time
            key = (1, saved, -added) if added <= 0 else (0, saved / added, saved)
            if best_key is None or key > best_key:
                best_key, best_move = key, (a, c, new)
        if best_move is None:
            return None
        state = state.apply(*best_move)
    return state if state.peak <= budget else None


def _reduce_time(state: _State, budget: int, max_steps: int) -> _State:
    """Step 4: the move saving the most time within budget, until none does."""
    for _ in range(max_steps):
        best_key, best_move = None, None
        tol = 1e-12 * max(abs(state.time), 1e-9)
        for a, c, new in state.moves():
            peak, new_time = state.price(a, c, new)
            if peak > budget or new_time >= state.time - tol:
                continue
            key = (new_time, peak)
            if best_key is None or key < best_key:
                best_key, best_move = key, (a, c, new)
        if best_move is None:
            return state
        state = state.apply(*best_move)
    return state


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
      time_limit: ignored; the work is bounded by ``max_steps``.
      max_steps: moves per phase (default ``20 * n_blocks``).

    Returns:
      ``"feasible"`` with the gap to the fastest plan's time (a lower bound),
      ``"optimal"`` when the fastest plan fits, ``"infeasible"`` (with
      ``lowest_peak``) exactly when budget < lowest peak.
    """
    del time_limit
    t0 = time.perf_counter()
    budget = check_budget(budget)
    if budget < lowest_peak(problem):
        return infeasible_result(problem, t0=t0, solver="greedy")
    steps = max_steps if max_steps is not None else 20 * problem.n_blocks
    fastest = min_time_segments(problem)
    lower = evaluate(problem, fastest)[1]
    state = _reduce_peak(_State(problem, fastest), budget, steps)
    if state is None:
        state = _State(problem, lowest_peak_segments(problem))
    state = _reduce_time(state, budget, steps)
    _, extra = evaluate(problem, state.segments)
    gap = relative_gap(extra, lower)
    return make_result(
        problem, state.segments, status="optimal" if gap == 0.0 else "feasible", gap=gap, t0=t0, solver="greedy"
    )
