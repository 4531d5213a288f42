"""Region solvers (which values to save) against brute force on small random DAGs."""

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoremat.solver._region import (
    MAX_BRUTE_FORCE_VALUES,
    RegionProblem,
    recompute_closure,
    region_pareto,
    region_solution,
    solve_region_brute_force,
    solve_region_cpsat,
    solve_region_greedy,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def region_problems(draw, max_values=10):
    """A random DAG: ops in topological order, each making 1-2 values, reading earlier values."""
    n_ops = draw(st.integers(1, max_values))
    value_bytes, producer, op_inputs, op_time, op_flops = {}, {}, {}, {}, {}
    for k in range(n_ops):
        op = f"op{k}"
        earlier = sorted(value_bytes)
        op_inputs[op] = tuple(draw(st.lists(st.sampled_from(earlier), unique=True, max_size=3))) if earlier else ()
        op_time[op] = draw(st.integers(0, 1000)) * 1e-6
        op_flops[op] = float(draw(st.integers(0, 10**6)))
        for m in range(draw(st.integers(1, 2))):
            if len(value_bytes) >= max_values:
                break
            v = f"v{k}_{m}"
            value_bytes[v] = draw(st.integers(0, 100))
            producer[v] = op
    values = sorted(value_bytes)
    needed = frozenset(draw(st.lists(st.sampled_from(values), unique=True, min_size=1)))
    needed_ops = frozenset(draw(st.lists(st.sampled_from(sorted(op_time)), unique=True, max_size=2)))
    saveable = draw(st.one_of(st.none(), st.frozensets(st.sampled_from(values))))
    problem = RegionProblem(value_bytes, producer, op_inputs, op_time, op_flops, needed, needed_ops, saveable)
    cap = draw(st.integers(0, sum(value_bytes.values()) + 1))
    return problem, cap


def oracle(problem, cap):
    """Least recompute time over every saveable subset within the cap (independent of the package)."""
    values = sorted(v for v in problem.value_bytes if problem.can_save(v))
    best = math.inf
    for k in range(len(values) + 1):
        for saved in itertools.combinations(values, k):
            if sum(problem.value_bytes[v] for v in saved) > cap:
                continue
            ops = set(problem.needed_ops) | {problem.producer[v] for v in problem.needed - set(saved)}
            changed = True
            while changed:
                extra = {problem.producer[v] for op in ops for v in problem.op_inputs.get(op, ()) if v not in saved}
                changed = not extra <= ops
                ops |= extra
            best = min(best, math.fsum(problem.op_time[op] for op in ops))
    return best


def check_solution(problem, cap, solution):
    assert solution.saved_bytes == sum(problem.value_bytes[v] for v in solution.saved) <= cap
    assert all(problem.can_save(v) for v in solution.saved)
    assert solution.recomputed_ops == recompute_closure(problem, solution.saved)
    assert solution.recompute_time == pytest.approx(sum(problem.op_time[op] for op in solution.recomputed_ops))
    assert solution.recompute_flops == pytest.approx(sum(problem.op_flops.get(op, 0.0) for op in solution.recomputed_ops))


@SETTINGS
@given(region_problems())
def test_solvers_match_oracle(case):
    problem, cap = case
    best = oracle(problem, cap)
    brute = solve_region_brute_force(problem, cap)
    exact = solve_region_cpsat(problem, cap)
    greedy = solve_region_greedy(problem, cap)
    for solution in (brute, exact, greedy):
        check_solution(problem, cap, solution)
    assert brute.status == exact.status == "optimal" and greedy.status == "feasible"
    assert brute.recompute_time == pytest.approx(best, abs=1e-12)
    assert exact.recompute_time == pytest.approx(best, abs=1e-9 * len(problem.op_time))
    assert greedy.recompute_time >= best - 1e-12


@SETTINGS
@given(region_problems())
def test_the_second_search_is_exact_too(case):
    """Where CP-SAT's first search proves nothing (here given no time at all), the second, from
    its set where it found one and with stronger cuts, still returns the optimum."""
    from unittest import mock

    from ortools.sat.python import cp_model

    from autoremat.solver import _region

    problem, cap = case
    searches = []
    real = _region._search

    def counted(*args, **kwargs):
        solver, status = real(*args, **kwargs)
        searches.append((kwargs, status))
        return solver, status

    with mock.patch.object(_region, "FIRST_SEARCH_S", 0.0), mock.patch.object(_region, "_search", counted):
        exact = solve_region_cpsat(problem, cap)
    check_solution(problem, cap, exact)
    assert exact.recompute_time == pytest.approx(oracle(problem, cap), abs=1e-9 * len(problem.op_time))
    proved = searches[:1] and searches[0][1] == cp_model.OPTIMAL
    assert [kw for kw, _ in searches] == ([] if not searches else [{}] if proved else [{}, {"linearization_level": 2}])


@SETTINGS
@given(region_problems())
def test_ties_prefer_fewer_saved_bytes(case):
    problem, cap = case
    brute = solve_region_brute_force(problem, cap)
    exact = solve_region_cpsat(problem, cap)
    if math.isclose(brute.recompute_time, exact.recompute_time, rel_tol=0, abs_tol=1e-15):
        assert exact.saved_bytes == brute.saved_bytes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(region_problems())
def test_pareto_is_monotone_and_deduplicated(case):
    problem, _ = case
    total = sum(problem.value_bytes.values())
    caps = sorted({0, total // 4, total // 2, total, total // 2})
    for method in ("brute_force", "cpsat"):
        front = region_pareto(problem, caps, method=method)
        assert len({sol.saved for sol in front}) == len(front)
        assert [sol.saved_bytes for sol in front] == sorted(sol.saved_bytes for sol in front)
        times = [sol.recompute_time for sol in front]
        assert all(b <= a + 1e-9 for a, b in zip(times, times[1:]))
        assert front[-1].recompute_time == pytest.approx(oracle(problem, max(caps)), abs=1e-8)
    assert region_pareto(problem, caps, method="greedy")


def chain_problem():
    """x -> a -> b -> c (all in the region except x); the backward reads a and c."""
    return RegionProblem(
        value_bytes={"a": 10, "b": 100, "c": 10},
        producer={"a": "f", "b": "g", "c": "h"},
        op_inputs={"g": ("a",), "h": ("b",)},
        op_time={"f": 1.0, "g": 5.0, "h": 1.0},
        op_flops={"f": 10.0, "g": 50.0, "h": 10.0},
        needed=frozenset({"a", "c"}),
    )


@pytest.mark.parametrize(
    "cap, saved, ops, seconds",
    [(0, set(), {"f", "g", "h"}, 7.0), (10, {"c"}, {"f"}, 1.0), (20, {"a", "c"}, set(), 0.0), (1000, {"a", "c"}, set(), 0.0)],
)
def test_chain_example(cap, saved, ops, seconds):
    problem = chain_problem()
    for solver in (solve_region_cpsat, solve_region_brute_force, solve_region_greedy):
        solution = solver(problem, cap)
        assert (solution.saved, solution.recomputed_ops, solution.recompute_time) == (frozenset(saved), frozenset(ops), seconds)


def test_needed_ops_force_their_inputs():
    problem = RegionProblem(
        value_bytes={"a": 10, "b": 10},
        producer={"a": "f", "b": "g"},
        op_inputs={"g": ("a",)},
        op_time={"f": 3.0, "g": 1.0},
        op_flops={},
        needed=frozenset(),
        needed_ops=frozenset({"g"}),
    )
    assert recompute_closure(problem, ()) == {"f", "g"}
    solution = solve_region_cpsat(problem, 10)
    assert (solution.saved, solution.recomputed_ops, solution.recompute_time) == (frozenset({"a"}), frozenset({"g"}), 1.0)


def test_unsaveable_values_are_recomputed():
    problem = RegionProblem(
        value_bytes={"a": 1}, producer={"a": "f"}, op_inputs={}, op_time={"f": 2.0}, op_flops={},
        needed=frozenset({"a"}), saveable=frozenset(),
    )
    for solver in (solve_region_cpsat, solve_region_brute_force, solve_region_greedy):
        assert solver(problem, 100).recomputed_ops == {"f"}
    with pytest.raises(ValueError, match=r"\['a'\] are not saveable values of the region"):
        recompute_closure(problem, {"a"})


def test_region_solution_drops_unread_saved_values():
    problem = chain_problem()
    solution = region_solution(problem, {"a", "b", "c"}, "feasible")
    assert solution.saved == {"a", "c"} and solution.saved_bytes == 20


def test_brute_force_refuses_many_values():
    n = MAX_BRUTE_FORCE_VALUES + 1
    problem = RegionProblem(
        value_bytes={f"v{k}": 1 for k in range(n)}, producer={f"v{k}": f"op{k}" for k in range(n)},
        op_inputs={}, op_time={f"op{k}": 1.0 for k in range(n)}, op_flops={}, needed=frozenset(f"v{k}" for k in range(n)),
    )
    with pytest.raises(ValueError, match=r"17 saveable values matter, more than 16; use solve_region_cpsat"):
        solve_region_brute_force(problem, 5)
    assert solve_region_cpsat(problem, 5).recompute_time == n - 5


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(value_bytes={"a": 10, "b": -1, "c": 10}), r"value 'b' has bytes -1; expected an int >= 0"),
        (dict(producer={"a": "f", "b": "g"}), r"value 'c' has no producer"),
        (dict(producer={"a": "f", "b": "g", "c": "zz"}), r"producer 'zz' of value 'c' has no op_time"),
        (dict(op_inputs={"g": ("a", "x")}), r"op 'g' reads \['x'\], not values of the region"),
        (dict(op_inputs={"zz": ()}), r"op_inputs names op 'zz', which has no op_time"),
        (dict(op_time={"f": 1.0, "g": -5.0, "h": 1.0}), r"op 'g' has time -5\.0; expected a finite number >= 0"),
        (dict(needed=frozenset({"q"})), r"needed names \['q'\], unknown to the region"),
        (dict(needed_ops=frozenset({"q"})), r"needed_ops names \['q'\]"),
        (dict(saveable=frozenset({"q"})), r"saveable names \['q'\]"),
    ],
)
def test_region_problem_validation(change, match):
    fields = {k: getattr(chain_problem(), k) for k in ("value_bytes", "producer", "op_inputs", "op_time", "op_flops", "needed")}
    fields.update(change)
    with pytest.raises(ValueError, match=match):
        RegionProblem(**fields)


@pytest.mark.parametrize("solver", [solve_region_cpsat, solve_region_brute_force, solve_region_greedy])
def test_negative_cap_is_rejected(solver):
    with pytest.raises(ValueError, match=r"cap_bytes -1 must be an int number of bytes >= 0"):
        solver(chain_problem(), -1)


def test_pareto_rejects_unknown_method():
    with pytest.raises(ValueError, match=r"unknown method 'lp'"):
        region_pareto(chain_problem(), [1], method="lp")


def test_region_problem_pickles_and_hashes():
    import pickle

    problem = chain_problem()
    again = pickle.loads(pickle.dumps(problem))
    assert again == problem and hash(again) == hash(problem)
