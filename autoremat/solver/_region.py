"""Inside one region: which values to save, and what the backward must then recompute.

Given a saved set ``S``, the ops the backward re-runs are the closure ``R``:
start from the producers of the needed values not in ``S`` plus the
``needed_ops``; every op in ``R`` needs its in-region inputs, so an input not
in ``S`` adds its producer to ``R``. Inputs from outside the region are free
(the region's boundary). The cost of ``S`` is the time of ``R``.

The exact solver is a small 0-1 program in the style of Checkmate (Jain et al.,
MLSys 2020), solved with CP-SAT as in Moccasin (Bartan et al., 2023)::

    variables    s[v]  value v is saved;   r[op]  op is recomputed
    needed       s[v] + r[producer(v)] >= 1            for v in needed
    inputs       r[op] => s[v] + r[producer(v)] >= 1   for v an in-region input of op
    forced       r[op] = 1                             for op in needed_ops
    capacity     sum_v bytes(v) s[v] <= cap
    objective    min  W * sum_op time(op) r[op]  +  sum_v bytes(v) s[v]

Times are integer nanoseconds; the byte term (scaled to at most 10**6 units) is
a tie-break: ``W`` exceeds its largest value, so among equally fast plans the
one saving fewer bytes wins.  Each solve is bounded by CP-SAT's deterministic
time, so a set does not depend on the machine's load: a first search with its
defaults, and, where that proves nothing, a second from its set with stronger
cuts (``FIRST_SEARCH_S``).
"""

from __future__ import annotations

import math
import numbers
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from autoremat._errors import SolverError

__all__ = [
    "RegionProblem",
    "RegionSolution",
    "recompute_closure",
    "region_solution",
    "solve_region_cpsat",
    "solve_region_brute_force",
    "solve_region_greedy",
    "region_pareto",
    "MAX_BRUTE_FORCE_VALUES",
]

MAX_BRUTE_FORCE_VALUES = 16
_TIE_BREAK_UNITS = 10**6
_MAX_TIME_UNITS = 10**12
# CP-SAT's searches, each bounded by its deterministic time (the same work on any machine under
# any load, so the same set comes back; the caller's seconds, 2 from the chain model, are a
# safety net).  The first: its defaults on one worker, as before; every region of the 36 other
# realscale.py and unseen.py models proves optimal in it within 0.008 deterministic s.  Where it
# proves nothing, a second search from its set with the LP relaxation's stronger cuts
# (linearization level 2).  On the Griffin-style hybrid's scan body (783 values, 3 blocks with
# an associative scan each) the first search, given 2 s of wall time, ended without a proof at
# each of 21 caps (39 s a body) and at 80% of the residual bytes kept a set recomputing 4411 ms
# where the greedy's recomputes 233; with these bounds, 19-24 s a body, 12 caps proved, 231.2
# ms at 80% and 408.0 at 50% (492.9 before; linearization level 2 alone at 1.0 deterministic
# s: 231.5 and 400.9; eight interleaved workers 230.9 and 398.7 in 7 s of two cores a cap):
# benchmarks/region_searches.py (results/region_searches.md).
FIRST_SEARCH_S = 0.1
SECOND_SEARCH_S = 0.5


@dataclass(frozen=True)
class RegionProblem:
    """What to save inside one region.

    Attributes:
      value_bytes: values produced inside the region -> bytes.
      producer: value -> the op that produces it.
      op_inputs: op -> its input values produced inside the region (inputs
        from outside are free).
      op_time: op -> seconds to recompute it.
      op_flops: op -> FLOPs to recompute it (missing ops count 0).
      needed: values the backward pass reads.
      needed_ops: ops the backward re-runs anyway (they make residuals that
        are not forward values); their inputs must be available.
      saveable: values that may be saved (None: all).

    Raises:
      ValueError: names that do not resolve (a value without producer, an op
        without time, ...), negative bytes or times.
    """

    value_bytes: Mapping[str, int] = field(hash=False)
    producer: Mapping[str, str] = field(hash=False)
    op_inputs: Mapping[str, tuple[str, ...]] = field(hash=False)
    op_time: Mapping[str, float] = field(hash=False)
    op_flops: Mapping[str, float] = field(hash=False)
    needed: frozenset[str]
    needed_ops: frozenset[str] = frozenset()
    saveable: frozenset[str] | None = None

    def __post_init__(self):
        freeze = lambda m: types.MappingProxyType(dict(m))  # noqa: E731
        object.__setattr__(self, "value_bytes", freeze(self.value_bytes))
        object.__setattr__(self, "producer", freeze(self.producer))
        object.__setattr__(self, "op_inputs", freeze({op: tuple(vs) for op, vs in self.op_inputs.items()}))
        object.__setattr__(self, "op_time", freeze(self.op_time))
        object.__setattr__(self, "op_flops", freeze(self.op_flops))
        object.__setattr__(self, "needed", frozenset(self.needed))
        object.__setattr__(self, "needed_ops", frozenset(self.needed_ops))
        if self.saveable is not None:
            object.__setattr__(self, "saveable", frozenset(self.saveable))
        values, ops = self.value_bytes, self.op_time
        for v, nbytes in values.items():
            if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 0:
                raise ValueError(f"RegionProblem: value {v!r} has bytes {nbytes!r}; expected an int >= 0")
            if v not in self.producer:
                raise ValueError(f"RegionProblem: value {v!r} has no producer")
        for v, op in self.producer.items():
            if op not in ops:
                raise ValueError(f"RegionProblem: producer {op!r} of value {v!r} has no op_time")
        for op, t in ops.items():
            if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
                raise ValueError(f"RegionProblem: op {op!r} has time {t!r}; expected a finite number >= 0")
        for op, inputs in self.op_inputs.items():
            if op not in ops:
                raise ValueError(f"RegionProblem: op_inputs names op {op!r}, which has no op_time")
            unknown = [v for v in inputs if v not in values]
            if unknown:
                raise ValueError(
                    f"RegionProblem: op {op!r} reads {unknown}, not values of the region; "
                    "list only inputs produced inside the region"
                )
        for name, group, universe in (
            ("needed", self.needed, values),
            ("needed_ops", self.needed_ops, ops),
            ("saveable", self.saveable or frozenset(), values),
            ("op_flops", frozenset(self.op_flops), ops),
        ):
            unknown = sorted(group - universe.keys())
            if unknown:
                raise ValueError(f"RegionProblem: {name} names {unknown}, unknown to the region")

    def __reduce__(self):
        # The read-only mapping views do not pickle; rebuild from dicts.
        fields = (self.value_bytes, self.producer, self.op_inputs, self.op_time, self.op_flops)
        return (RegionProblem, (*map(dict, fields), self.needed, self.needed_ops, self.saveable))

    def can_save(self, value: str) -> bool:
        """Whether ``value`` may be saved."""
        return self.saveable is None or value in self.saveable


@dataclass(frozen=True)
class RegionSolution:
    """Which values a region saves and what its backward recomputes."""

    saved: frozenset[str]
    recomputed_ops: frozenset[str]
    saved_bytes: int
    recompute_time: float
    recompute_flops: float
    status: str


def recompute_closure(problem: RegionProblem, saved: Iterable[str]) -> frozenset[str]:
    """The ops the backward must re-run when ``saved`` are the saved values.

    Raises:
      ValueError: ``saved`` names an unknown or unsaveable value.

    >>> p = RegionProblem(
    ...     value_bytes={"a": 4, "b": 4}, producer={"a": "f", "b": "g"},
    ...     op_inputs={"g": ("a",)}, op_time={"f": 1.0, "g": 2.0}, op_flops={},
    ...     needed=frozenset({"b"}))
    >>> sorted(recompute_closure(p, set()))
    ['f', 'g']
    >>> sorted(recompute_closure(p, {"a"}))
    ['g']
    """
    saved = frozenset(saved)
    bad = sorted(v for v in saved if v not in problem.value_bytes or not problem.can_save(v))
    if bad:
        raise ValueError(f"recompute_closure: {bad} are not saveable values of the region")
    ops = set(problem.needed_ops)
    for v in problem.needed - saved:
        ops.add(problem.producer[v])
    stack = list(ops)
    while stack:
        op = stack.pop()
        for v in problem.op_inputs.get(op, ()):
            if v not in saved:
                p = problem.producer[v]
                if p not in ops:
                    ops.add(p)
                    stack.append(p)
    return frozenset(ops)


def region_solution(problem: RegionProblem, saved: Iterable[str], status: str) -> RegionSolution:
    """The solution for a saved set, with saved values nothing reads dropped."""
    saved = frozenset(saved)
    ops = recompute_closure(problem, saved)
    read = set(problem.needed)
    for op in ops:
        read.update(problem.op_inputs.get(op, ()))
    saved = frozenset(v for v in saved if v in read)
    return RegionSolution(
        saved=saved,
        recomputed_ops=ops,
        saved_bytes=sum(problem.value_bytes[v] for v in saved),
        recompute_time=math.fsum(problem.op_time[op] for op in sorted(ops)),
        recompute_flops=math.fsum(problem.op_flops.get(op, 0.0) for op in sorted(ops)),
        status=status,
    )


def _check_cap(cap_bytes) -> int:
    if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, numbers.Integral) or cap_bytes < 0:
        raise ValueError(f"cap_bytes {cap_bytes!r} must be an int number of bytes >= 0")
    return int(cap_bytes)


def _relevant(problem: RegionProblem) -> tuple[frozenset[str], tuple[str, ...]]:
    """Ops that may be recomputed (the closure with nothing saved) and the values worth saving."""
    ops = recompute_closure(problem, ())
    read = set(problem.needed)
    for op in ops:
        read.update(problem.op_inputs.get(op, ()))
    return ops, tuple(sorted(v for v in read if problem.can_save(v)))


def solve_region_brute_force(problem: RegionProblem, cap_bytes: int, *, time_limit: float | None = None) -> RegionSolution:
    """Tries every subset of the values worth saving (at most ``MAX_BRUTE_FORCE_VALUES``).

    Raises:
      ValueError: more saveable values that matter than ``MAX_BRUTE_FORCE_VALUES``.
    """
    del time_limit
    cap = _check_cap(cap_bytes)
    _, candidates = _relevant(problem)
    if len(candidates) > MAX_BRUTE_FORCE_VALUES:
        raise ValueError(
            f"solve_region_brute_force: {len(candidates)} saveable values matter, more than "
            f"{MAX_BRUTE_FORCE_VALUES}; use solve_region_cpsat"
        )
    best_key, best = None, frozenset()
    for mask in range(1 << len(candidates)):
        saved = frozenset(v for k, v in enumerate(candidates) if mask >> k & 1)
        nbytes = sum(problem.value_bytes[v] for v in saved)
        if nbytes > cap:
            continue
        ops = recompute_closure(problem, saved)
        key = (math.fsum(problem.op_time[op] for op in sorted(ops)), nbytes)
        if best_key is None or key < best_key:
            best_key, best = key, saved
    return region_solution(problem, best, "optimal")


def solve_region_greedy(problem: RegionProblem, cap_bytes: int, *, time_limit: float | None = None) -> RegionSolution:
    """Save everything worth saving, then drop the value costing least time per byte freed until it fits.

    A last pass adds back, while they fit, values that cut recompute time the
    most per byte. ``O(values**2)`` closures.
    """
    del time_limit
    cap = _check_cap(cap_bytes)
    _, candidates = _relevant(problem)
    size = problem.value_bytes

    def cost(saved: frozenset[str]) -> float:
        return math.fsum(problem.op_time[op] for op in recompute_closure(problem, saved))

    saved = frozenset(candidates)
    nbytes = sum(size[v] for v in saved)
    current = cost(saved)
    while nbytes > cap:
        best_key, best_v = None, None
        for v in saved:
            if size[v] == 0:
                continue
            added = cost(saved - {v}) - current
            key = (added / size[v], -size[v], v)
            if best_key is None or key < best_key:
                best_key, best_v = key, v
        saved = saved - {best_v}
        nbytes -= size[best_v]
        current = cost(saved)
    while True:
        best_key, best_v = None, None
        for v in candidates:
            if v in saved or nbytes + size[v] > cap:
                continue
            gain = current - cost(saved | {v})
            if gain > 1e-15:
                key = (-gain / max(size[v], 1), v)
                if best_key is None or key < best_key:
                    best_key, best_v = key, v
        if best_v is None:
            break
        saved = saved | {best_v}
        nbytes += size[best_v]
        current = cost(saved)
    return region_solution(problem, saved, "feasible")


def solve_region_cpsat(problem: RegionProblem, cap_bytes: int, *, time_limit: float | None = None) -> RegionSolution:
    """Least recompute time with saved bytes <= cap (ties: fewer bytes), exactly with CP-SAT.

    Falls back to ``solve_region_greedy`` (status ``"feasible"``) if CP-SAT
    finds nothing in ``time_limit``.

    Raises:
      SolverError: CP-SAT rejects the model or returns a plan over the cap.
    """
    cap = _check_cap(cap_bytes)
    ops, candidates = _relevant(problem)
    if not ops:
        return region_solution(problem, (), "optimal")

    # ---- Data --------------------------------------------------------------------
    total_time = math.fsum(problem.op_time[op] for op in ops)
    time_scale = 1e9 if total_time * 1e9 <= _MAX_TIME_UNITS else _MAX_TIME_UNITS / total_time
    total_bytes = sum(problem.value_bytes[v] for v in candidates)
    tie_unit = max(1, -(-total_bytes // _TIE_BREAK_UNITS))
    weight = -(-total_bytes // tie_unit) + 1

    model = cp_model.CpModel()

    # ---- Variables: s[v], r[op] ------------------------------------------------------
    s = {v: model.new_bool_var(f"s[{v}]") for v in candidates}
    r = {op: model.new_bool_var(f"r[{op}]") for op in sorted(ops)}

    def available(v: str) -> list:
        """Literals of which one makes v available to the backward: saved or recomputed."""
        return ([s[v]] if v in s else []) + [r[problem.producer[v]]]

    # ---- needed: s[v] + r[producer(v)] >= 1 ----------------------------------------------
    for v in sorted(problem.needed):
        model.add_bool_or(available(v))
    # ---- inputs: r[op] => s[v] + r[producer(v)] >= 1 -------------------------------------
    for op in sorted(ops):
        for v in problem.op_inputs.get(op, ()):
            model.add_bool_or(available(v)).only_enforce_if(r[op])
    # ---- forced: r[op] = 1 for needed_ops ------------------------------------------------
    for op in sorted(problem.needed_ops):
        model.add(r[op] == 1)
    # ---- capacity: sum bytes(v) s[v] <= cap ------------------------------------------------
    if s:
        model.add(cp_model.LinearExpr.weighted_sum(list(s.values()), [problem.value_bytes[v] for v in s]) <= cap)
    # ---- objective: W * time + tie-break bytes --------------------------------------------
    terms = [(r[op], weight * int(round(problem.op_time[op] * time_scale))) for op in r]
    terms += [(s[v], -(-problem.value_bytes[v] // tie_unit)) for v in s]
    model.minimize(cp_model.LinearExpr.weighted_sum([t[0] for t in terms], [t[1] for t in terms]))

    # ---- Solve and read out ------------------------------------------------------------------
    solver, status = _search(model, FIRST_SEARCH_S, time_limit)
    if status in (cp_model.FEASIBLE, cp_model.UNKNOWN):  # no proof: the second search
        for var in (*s.values(), *r.values()) if status == cp_model.FEASIBLE else ():
            model.add_hint(var, solver.boolean_value(var))
        solver, status = _search(model, SECOND_SEARCH_S, time_limit, linearization_level=2)
    if status == cp_model.MODEL_INVALID:
        raise SolverError(f"CP-SAT rejected the region model: {model.validate()}")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return solve_region_greedy(problem, cap)
    saved = frozenset(v for v, var in s.items() if solver.boolean_value(var))
    solution = region_solution(problem, saved, "optimal" if status == cp_model.OPTIMAL else "feasible")
    if solution.saved_bytes > cap:
        raise SolverError(f"CP-SAT saved {solution.saved_bytes} bytes over the cap {cap}; this is a bug")
    return solution


def _search(model, deterministic_s: float, time_limit: float | None, **params):
    """One CP-SAT search of `model` (`FIRST_SEARCH_S`): (solver, status)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = deterministic_s
    if time_limit is not None:
        solver.parameters.max_time_in_seconds = max(float(time_limit), 0.0)
    # One worker, so that of several sets that tie the same one comes back every time: with two,
    # the first to finish won, and on a Mamba-2-style layer (benchmarks/unseen.py's ssd) three
    # processes got three ilp25% sets, compiling 15.43-15.46 GiB around a 15.44 GiB budget
    # (tests/test_hand.py).  The region solves of every benchmark model take at most 0.02 s.
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    for key, value in params.items():
        setattr(solver.parameters, key, value)
    return solver, solver.solve(model)


_REGION_SOLVERS = {
    "cpsat": solve_region_cpsat,
    "brute_force": solve_region_brute_force,
    "greedy": solve_region_greedy,
}


def region_pareto(
    problem: RegionProblem,
    caps: Iterable[int],
    *,
    method: str = "cpsat",
    time_limit: float | None = None,
) -> list[RegionSolution]:
    """Solutions for several caps, deduplicated, by increasing saved bytes.

    Args:
      problem: the region.
      caps: byte caps to solve for.
      method: ``"cpsat"``, ``"brute_force"`` or ``"greedy"``.
      time_limit: seconds per cap (CP-SAT only).

    Returns:
      One solution per distinct saved set, sorted by ``saved_bytes`` then
      ``recompute_time``.
    """
    if method not in _REGION_SOLVERS:
        raise ValueError(f"region_pareto: unknown method {method!r}; choose one of {tuple(_REGION_SOLVERS)}")
    solve = _REGION_SOLVERS[method]
    found: dict[frozenset[str], RegionSolution] = {}
    for cap in sorted(set(caps)):
        solution = solve(problem, cap, time_limit=time_limit)
        found.setdefault(solution.saved, solution)
    return sorted(found.values(), key=lambda sol: (sol.saved_bytes, sol.recompute_time, sorted(sol.saved)))
