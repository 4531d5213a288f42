"""Brute force over every partition and option: the oracle the other solvers are tested against."""

from __future__ import annotations

import math
import time

from autoremat.solver._chain import (
    ChainProblem,
    Segment,
    SolveResult,
    check_budget,
    infeasible_result,
    make_result,
)

__all__ = ["solve_brute_force", "count_plans", "MAX_PLANS"]

MAX_PLANS = 200_000


def count_plans(problem: ChainProblem) -> int:
    """The number of (partition, option per region) plans of the problem."""
    count = [0] * (problem.n_blocks + 1)
    count[0] = 1
    for (start, stop), opts in sorted(problem.options.items(), key=lambda kv: kv[0][1]):
        count[stop] += count[start] * len(opts)
    return count[-1]


def solve_brute_force(problem: ChainProblem, budget: int, *, time_limit: float | None = None) -> SolveResult:
    """Enumerates every plan; least extra time with peak <= budget, ties to the lower peak.

    Args:
      problem: the chain.
      budget: bytes.
      time_limit: ignored (the enumeration is bounded by ``MAX_PLANS``).

    Returns:
      ``"optimal"``, or ``"infeasible"`` with ``lowest_peak``.

    Raises:
      ValueError: the problem has more than ``MAX_PLANS`` plans.
    """
    del time_limit
    t0 = time.perf_counter()
    budget = check_budget(budget)
    total = count_plans(problem)
    if total > MAX_PLANS:
        raise ValueError(
            f"solve_brute_force: the problem has {total} plans, more than MAX_PLANS={MAX_PLANS}; "
            "use solve_dp or solve_cpsat"
        )
    n = problem.n_blocks
    base = problem.base_bytes
    starting: dict[int, list[tuple[int, tuple]]] = {}
    for (start, stop), opts in sorted(problem.options.items()):
        starting.setdefault(start, []).append((stop, opts))

    best_key = (math.inf, math.inf)
    best: list[Segment] | None = None
    path: list[Segment] = []

    def walk(position: int, prefix: int, stage_max: int, extra: float) -> None:
        nonlocal best_key, best
        if base + max(prefix, stage_max) > budget:  # both only grow along the path
            return
        if position == n:
            peak = base + max(prefix, stage_max)
            key = (extra, peak)
            if peak <= budget and key < best_key:
                best_key, best = key, list(path)
            return
        for stop, opts in starting.get(position, ()):
            for opt in opts:
                path.append(Segment(position, stop, opt))
                walk(
                    stop,
                    prefix + opt.stored_bytes,
                    max(stage_max, prefix + opt.backward_bytes),
                    extra + opt.extra_time,
                )
                path.pop()

    walk(0, 0, 0, 0.0)
    if best is None:
        return infeasible_result(problem, t0=t0, solver="brute_force")
    return make_result(problem, best, status="optimal", gap=0.0, t0=t0, solver="brute_force")
