"""The chain solver entry point: picks a method and turns failures into typed errors."""

from __future__ import annotations

import math
import time

from autoremat._errors import InfeasibleBudgetError, SolverError
from autoremat.solver._brute import solve_brute_force
from autoremat.solver._chain import ChainProblem, SolveResult, check_budget, infeasible_message, relative_gap
from autoremat.solver._cpsat import solve_cpsat
from autoremat.solver._dp import solve_dp
from autoremat.solver._greedy import solve_greedy

__all__ = ["solve", "METHODS", "AUTO_CPSAT_MAX_BLOCKS", "AUTO_CPSAT_TIME_LIMIT"]

METHODS = ("auto", "dp", "cpsat", "greedy", "brute_force")
AUTO_CPSAT_MAX_BLOCKS = 40
AUTO_CPSAT_TIME_LIMIT = 10.0

_SOLVERS = {"dp": solve_dp, "cpsat": solve_cpsat, "greedy": solve_greedy, "brute_force": solve_brute_force}


def _lower_bound(result: SolveResult) -> float:
    """The lower bound on the optimum that a result proves (-inf if none)."""
    if result.status == "optimal":
        return result.objective
    if math.isnan(result.gap) or math.isinf(result.gap):
        return -math.inf
    return result.objective - result.gap * abs(result.objective)


def solve(problem: ChainProblem, budget: int, *, method: str = "auto", time_limit: float | None = None) -> SolveResult:
    """Least extra time with peak <= budget.

    Args:
      problem: the chain.
      budget: bytes (see ``parse_budget`` for ``"8GB"``-style budgets).
      method: ``"auto"`` (DP; then, for at most ``AUTO_CPSAT_MAX_BLOCKS`` blocks
        and unless the DP proved optimality, CP-SAT warm-started from the DP plan,
        keeping the faster plan), ``"dp"``, ``"cpsat"``, ``"greedy"`` or
        ``"brute_force"``.
      time_limit: seconds for CP-SAT; for ``"auto"`` None means
        ``AUTO_CPSAT_TIME_LIMIT``.

    Returns:
      A result with status ``"optimal"`` or ``"feasible"``.

    Raises:
      InfeasibleBudgetError: the budget is below the lowest reachable peak.
      SolverError: no plan was found in the time limit.
      ValueError: unknown method.
    """
    if method not in METHODS:
        raise ValueError(f"solve: unknown method {method!r}; choose one of {METHODS}")
    budget = check_budget(budget)
    t0 = time.perf_counter()
    if method == "auto":
        result = solve_dp(problem, budget)
        if result.feasible and result.status != "optimal" and problem.n_blocks <= AUTO_CPSAT_MAX_BLOCKS:
            limit = AUTO_CPSAT_TIME_LIMIT if time_limit is None else time_limit
            exact = solve_cpsat(problem, budget, time_limit=limit, hint=result.segments)
            candidates = [r for r in (result, exact) if r.feasible]
            best = min(candidates, key=lambda r: (r.objective, r.peak_bytes))
            gap = relative_gap(best.objective, max(_lower_bound(r) for r in candidates))
            result = SolveResult(
                "optimal" if gap == 0.0 else "feasible",
                best.segments,
                best.objective,
                best.peak_bytes,
                gap,
                time.perf_counter() - t0,
                f"dp+cpsat ({best.solver})",
            )
    else:
        result = _SOLVERS[method](problem, budget, time_limit=time_limit)
    if result.status == "infeasible":
        lowest = result.lowest_peak
        raise InfeasibleBudgetError(infeasible_message(budget, lowest), budget=budget, lowest=lowest)
    if result.status == "unknown":
        raise SolverError(
            f"solver {result.solver!r} found no plan within time_limit={time_limit!r} s; "
            "raise time_limit or use method='dp'"
        )
    return result
