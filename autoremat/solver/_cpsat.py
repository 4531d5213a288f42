"""Exact chain solver: a CP-SAT model of the partition and its memory stages.

The formulation follows the style of Checkmate (Jain et al., "Checkmate:
Breaking the Memory Wall with Optimal Tensor Rematerialization", MLSys 2020)
and Moccasin (Bartan et al., "Moccasin: Efficient Tensor Rematerialization for
Neural Networks", ICML 2023): boolean decisions, integer memory accumulators,
constraints in labelled sections. The problem itself is Rotor's chain view
(Beaumont, Herrmann et al., 2019/2021): a partition of the chain into regions.

Variables:
  x[j, i, o]  boolean: region ``[j, i)`` is in the plan with option ``o``.
  P[p]        integer: bytes stored by the chosen regions that end at or before
              position ``p`` (in ``byte_unit`` units); for a position on the
              path, what the regions before it store.

Sections (2) and (3) are linear, with no enforcement literals: because exactly
one chosen region starts at each position on the path and none elsewhere, the
per-region implication ``x[j, i, o] => P[j] + b_o <= cap`` is the same as the
aggregated row in (3), whose LP relaxation is much tighter than a big-M one.

Constraints:
  (1) path:     for each position p, sum_out x - sum_in x = 1 at p=0, -1 at p=n, 0 else;
                the regions form a DAG so this is one path 0 -> n, i.e. a partition.
  (2) prefix:   P[0] = 0;  P[p] = P[p-1] + sum_{(j, o)} s_o x[j, p, o],  i.e. sum over i <= p
                (on the path: the bytes the regions before p store).
  (3) stage:    P[j] + sum_{(i, o)} b_o x[j, i, o] <= cap    for every position j
                (the backward of the region starting at j; at most one does).
  (4) forward:  P[n] <= cap                          (everything stored at the forward's end)
  where cap = budget - base_bytes.

Objective: minimize sum t_o * x[j, i, o], times in integer nanoseconds
(``round(seconds * 1e9)``), so the optimum is exact up to 0.5 ns per region.

Bytes are exact integers while ``cap <= 2**40``; above, they are counted in
units of ``byte_unit = ceil(cap / 2**40)`` bytes, stored and backward bytes
rounded up and ``cap`` down, so every plan the model accepts truly fits (the
result is then reported ``"feasible"``, not optimal). Every plan is re-checked
with ``evaluate``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from ortools.sat.python import cp_model

from autoremat._errors import SolverError
from autoremat.solver._chain import (
    ChainProblem,
    Segment,
    SolveResult,
    check_budget,
    evaluate,
    infeasible_result,
    lowest_peak,
    make_result,
    relative_gap,
    unknown_result,
)
from autoremat._units import format_bytes

__all__ = ["solve_cpsat"]

_MAX_CAP_UNITS = 2**40


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def _sum(variables: list) -> cp_model.LinearExprT:
    return cp_model.LinearExpr.sum(variables) if variables else 0


def _weighted(terms: list[tuple[cp_model.IntVar, int]]) -> cp_model.LinearExprT:
    if not terms:
        return 0
    return cp_model.LinearExpr.weighted_sum([v for v, _ in terms], [c for _, c in terms])


def solve_cpsat(
    problem: ChainProblem,
    budget: int,
    *,
    time_limit: float | None = None,
    hint: Sequence[Segment] | None = None,
    num_workers: int = 2,
    seed: int = 0,
) -> SolveResult:
    """Least extra time with peak <= budget, solved exactly with CP-SAT.

    Args:
      problem: the chain.
      budget: bytes.
      time_limit: seconds for CP-SAT (None: no limit).
      hint: a plan to start from (e.g. ``solve_dp``'s); must be valid for the problem.
      num_workers: CP-SAT search workers.
      seed: CP-SAT random seed, for reproducible runs.

    Returns:
      ``"optimal"`` (gap 0), ``"feasible"`` with the gap proven from CP-SAT's
      best bound when the time limit stops it (the hint itself, if CP-SAT found
      nothing better and it fits), ``"unknown"`` when no plan was found in time, ``"infeasible"`` (with ``lowest_peak``) exactly when
      budget < lowest peak.

    Raises:
      ValueError: the hint is not a valid plan.
      SolverError: CP-SAT rejects the model or returns a plan that breaks the budget.
    """
    t0 = time.perf_counter()
    budget = check_budget(budget)
    if hint is not None:
        hint = tuple(hint)
        evaluate(problem, hint)  # raises ValueError on an invalid plan
    if budget < lowest_peak(problem):
        return infeasible_result(problem, t0=t0, solver="cpsat")

    cap_bytes = budget - problem.base_bytes
    byte_unit = max(1, -(-cap_bytes // _MAX_CAP_UNITS))
    model, x, P = _chain_model(problem, cap_bytes // byte_unit, byte_unit)
    if hint is not None:
        _add_hint(model, problem, x, P, hint, cap_bytes // byte_unit, byte_unit)

    # ---- Solve ------------------------------------------------------------------------
    solver = cp_model.CpSolver()
    if time_limit is not None:
        solver.parameters.max_time_in_seconds = max(float(time_limit), 0.0)
    solver.parameters.num_workers = num_workers
    solver.parameters.random_seed = seed
    status = solver.solve(model)

    # ---- Read out ---------------------------------------------------------------------
    if status == cp_model.MODEL_INVALID:
        raise SolverError(f"CP-SAT rejected the chain model: {model.validate()}")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # No plan in time (INFEASIBLE here can only come from the byte scaling):
        # fall back to the hint when it fits.
        if hint is not None and evaluate(problem, hint)[0] <= budget:
            return make_result(problem, hint, status="feasible", gap=math.nan, t0=t0, solver="cpsat")
        return unknown_result(t0=t0, solver="cpsat")
    segments = _read_path(problem, solver, x)
    peak, _ = evaluate(problem, segments)
    if peak > budget:
        raise SolverError(
            f"CP-SAT returned a plan with peak {format_bytes(peak)} over the budget {format_bytes(budget)}; "
            "this is a bug in the chain model"
        )
    if status == cp_model.OPTIMAL and byte_unit == 1:
        gap = 0.0
    elif byte_unit == 1:
        gap = relative_gap(solver.objective_value / 1e9, solver.best_objective_bound / 1e9)
    else:
        gap = math.nan  # the bound is for the scaled model, not a bound for this one
    status_name = "optimal" if gap == 0.0 else "feasible"
    return make_result(problem, segments, status=status_name, gap=gap, t0=t0, solver="cpsat")


def _chain_model(problem: ChainProblem, cap: int, byte_unit: int):
    """(CP-SAT model, x[j, i, o] region-option booleans, P[p] prefix stored units)."""
    n = problem.n_blocks

    def units(nbytes: int) -> int:
        return -(-nbytes // byte_unit)

    model = cp_model.CpModel()
    # x[j, i, o]; options that can never fit are left out.
    x: dict[tuple[int, int, int], cp_model.IntVar] = {}
    for (j, i), opts in sorted(problem.options.items()):
        for o, opt in enumerate(opts):
            if units(opt.stored_bytes) <= cap and units(opt.backward_bytes) <= cap:
                x[j, i, o] = model.new_bool_var(f"x[{j},{i},{o}]")
    P = [model.new_int_var(0, cap, f"P[{p}]") for p in range(n + 1)]  # (4) forward: P[n] <= cap by domain

    # (1) path: one chain of regions from 0 to n.
    out_arcs: dict[int, list] = {p: [] for p in range(n + 1)}
    in_arcs: dict[int, list] = {p: [] for p in range(n + 1)}
    for (j, i, o), var in x.items():
        out_arcs[j].append(var)
        in_arcs[i].append(var)
    for p in range(n + 1):
        if out_arcs[p] or in_arcs[p]:
            supply = 1 if p == 0 else (-1 if p == n else 0)
            model.add(_sum(out_arcs[p]) - _sum(in_arcs[p]) == supply)

    # (2) prefix: P[p] = sum of s_o over regions ending at or before p.  On the path these are
    # exactly the regions before p, so the equality holds without enforcement literals (a much
    # tighter LP relaxation than big-M).
    ending_at: list[list] = [[] for _ in range(n + 1)]
    starting_at: list[list] = [[] for _ in range(n + 1)]
    for (j, i, o), var in x.items():
        ending_at[i].append((var, units(problem.options[j, i][o].stored_bytes)))
        starting_at[j].append((var, units(problem.options[j, i][o].backward_bytes)))
    model.add(P[0] == 0)
    for p in range(1, n + 1):
        model.add(P[p] == P[p - 1] + _weighted(ending_at[p]))

    # (3) stage: P[j] + sum_{i,o} b_o x[j, i, o] <= cap.  At most one region starts at j, and
    # none if j is off the path (then P[j] <= P[n] <= cap): this is x[j, i, o] => P[j] + b_o
    # <= cap, linearly.
    for j in range(n):
        if starting_at[j]:
            model.add(P[j] + _weighted(starting_at[j]) <= cap)

    # Objective: extra time in nanoseconds.
    model.minimize(_weighted([(var, _ns(problem.options[j, i][o].extra_time)) for (j, i, o), var in x.items()]))
    return model, x, P


def _add_hint(model, problem: ChainProblem, x: dict, P: list, hint, cap: int, byte_unit: int) -> None:
    """Warm start from a valid plan."""
    chosen = {(seg.start, seg.stop, problem.options[seg.start, seg.stop].index(seg.option)) for seg in hint}
    stored_at = {seg.stop: -(-seg.option.stored_bytes // byte_unit) for seg in hint}
    prefix = 0
    for p in range(problem.n_blocks + 1):
        prefix += stored_at.get(p, 0)
        model.add_hint(P[p], min(prefix, cap))
    for key, var in x.items():
        model.add_hint(var, key in chosen)


def _read_path(problem: ChainProblem, solver, x: dict) -> list[Segment]:
    """The chosen regions, from block 0 to the end."""
    chosen_at = {j: (i, o) for (j, i, o), var in x.items() if solver.boolean_value(var)}
    segments, p = [], 0
    while p < problem.n_blocks:
        i, o = chosen_at[p]
        segments.append(Segment(p, i, problem.options[p, i][o]))
        p = i
    return segments
