"""Chain solvers against a brute-force oracle on small random problems."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoremat._errors import BudgetError, InfeasibleBudgetError
from autoremat.solver._brute import MAX_PLANS, count_plans, solve_brute_force
from autoremat.solver._chain import (
    ChainProblem,
    Option,
    Segment,
    evaluate,
    evaluate_plan,
    fixed_partition,
    lowest_peak,
    lowest_peak_segments,
    min_time_segments,
    uniform_segments,
)
from autoremat.solver._cpsat import solve_cpsat
from autoremat.solver._dp import solve_dp
from autoremat.solver._greedy import solve_greedy
from autoremat.solver._solve import METHODS, solve

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MiB = 2**20


# ---------------------------------------------------------------------------
# Oracle, written from the definition independently of the package.


def all_plans(problem):
    """Every (partition, option per region) plan, as tuples of Segments."""

    def walk(position):
        if position == problem.n_blocks:
            yield ()
            return
        for (start, stop), opts in problem.options.items():
            if start == position:
                for opt, rest in itertools.product(opts, list(walk(stop))):
                    yield (Segment(start, stop, opt),) + rest

    return list(walk(0))


def peak_of(problem, plan):
    stored = [seg.option.stored_bytes for seg in plan]
    stages = [problem.base_bytes + sum(stored[:k]) + seg.option.backward_bytes for k, seg in enumerate(plan)]
    return max([problem.base_bytes + sum(stored)] + stages)


def time_of(plan):
    return sum(seg.option.extra_time for seg in plan)


def oracle(problem, budget):
    """(least time within budget or None, lowest peak)."""
    plans = all_plans(problem)
    fits = [time_of(p) for p in plans if peak_of(problem, p) <= budget]
    return (min(fits) if fits else None), min(peak_of(problem, p) for p in plans)


def close(a, b, n_blocks):
    # CP-SAT rounds each region's time to the nanosecond.
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9 * (n_blocks + 1))


# ---------------------------------------------------------------------------
# Strategies.


@st.composite
def chain_problems(draw, max_blocks=6, max_options=3):
    n = draw(st.integers(1, max_blocks))
    options = {}
    for start in range(n):
        for stop in range(start + 1, n + 1):
            if stop - start > 1 and not draw(st.booleans()):
                continue
            k = draw(st.integers(1, max_options))
            options[(start, stop)] = tuple(
                Option(
                    f"o{m}",
                    stored_bytes=draw(st.integers(0, 100)),
                    backward_bytes=draw(st.integers(0, 100)),
                    extra_time=draw(st.integers(0, 1000)) * 1e-6,
                )
                for m in range(k)
            )
    return ChainProblem(n, draw(st.integers(0, 50)), options)


@st.composite
def problems_and_budgets(draw):
    problem = draw(chain_problems())
    lowest = lowest_peak(problem)
    budget = draw(st.one_of(st.integers(0, 800), st.integers(max(0, lowest - 3), lowest + 3)))
    return problem, budget


# ---------------------------------------------------------------------------
# The memory model.


@SETTINGS
@given(chain_problems(), st.data())
def test_evaluate_matches_definition(problem, data):
    plan = data.draw(st.sampled_from(all_plans(problem)))
    assert evaluate(problem, plan) == (peak_of(problem, plan), pytest.approx(time_of(plan)))


@SETTINGS
@given(chain_problems())
def test_lowest_peak_is_the_brute_force_minimum(problem):
    lowest = min(peak_of(problem, p) for p in all_plans(problem))
    assert lowest_peak(problem) == lowest
    assert evaluate(problem, lowest_peak_segments(problem))[0] == lowest


@SETTINGS
@given(chain_problems())
def test_min_time_segments_is_fastest(problem):
    fastest = min(time_of(p) for p in all_plans(problem))
    assert evaluate(problem, min_time_segments(problem))[1] == pytest.approx(fastest)


def test_count_plans():
    a, b = Option("a", 1, 1, 0.0), Option("b", 2, 2, 0.0)
    problem = ChainProblem(3, 0, {(0, 1): (a, b), (1, 2): (a,), (2, 3): (a, b), (0, 3): (a,), (1, 3): (b,)})
    assert count_plans(problem) == len(all_plans(problem)) == 2 * 1 * 2 + 1 + 2 * 1


# ---------------------------------------------------------------------------
# Solvers against the oracle.


@SETTINGS
@given(problems_and_budgets())
def test_exact_solvers_match_brute_force(case):
    problem, budget = case
    best, lowest = oracle(problem, budget)
    for solver in (solve_brute_force, solve_cpsat):
        result = solver(problem, budget)
        if best is None:
            assert budget < lowest
            assert result.status == "infeasible"
            assert result.lowest_peak == lowest == result.peak_bytes
        else:
            assert result.status == "optimal" and result.gap == 0.0
            assert close(result.objective, best, problem.n_blocks)
            assert result.peak_bytes == evaluate(problem, result.segments)[0] <= budget


@SETTINGS
@given(problems_and_budgets())
def test_heuristics_are_feasible_and_never_beat_brute_force(case):
    problem, budget = case
    best, lowest = oracle(problem, budget)
    for solver in (solve_dp, solve_greedy):
        result = solver(problem, budget)
        assert (result.status == "infeasible") == (budget < lowest)
        if best is None:
            assert result.lowest_peak == lowest
            continue
        assert result.status in ("optimal", "feasible")
        peak, extra = evaluate(problem, result.segments)
        assert peak == result.peak_bytes <= budget
        assert extra == pytest.approx(result.objective)
        assert result.objective >= best - 1e-12
        assert 0.0 <= result.gap or math.isnan(result.gap)
        if result.status == "optimal":
            assert close(result.objective, best, problem.n_blocks)
        else:  # the gap is a proven bound: best >= objective * (1 - gap)
            assert best >= result.objective * (1 - result.gap) - 1e-12


@SETTINGS
@given(problems_and_budgets())
def test_dp_with_few_buckets_stays_feasible(case):
    problem, budget = case
    best, lowest = oracle(problem, budget)
    result = solve_dp(problem, budget, buckets=3)
    if best is None:
        assert result.status == "infeasible"
    else:
        assert result.peak_bytes <= budget and result.objective >= best - 1e-12
        assert best >= result.objective * (1 - result.gap) - 1e-12


@SETTINGS
@given(problems_and_budgets(), st.sampled_from(METHODS))
def test_solve_returns_optimal_plan_or_raises(case, method):
    problem, budget = case
    best, lowest = oracle(problem, budget)
    if best is None:
        with pytest.raises(InfeasibleBudgetError, match=r"is below the lowest reachable peak") as info:
            solve(problem, budget, method=method)
        assert info.value.lowest == lowest and info.value.budget == budget
        assert f"({lowest} bytes)" in str(info.value)
        return
    result = solve(problem, budget, method=method)
    assert result.peak_bytes <= budget
    if method in ("auto", "cpsat", "brute_force"):
        assert result.status == "optimal"
        assert close(result.objective, best, problem.n_blocks)
    else:
        assert result.objective >= best - 1e-12


def test_infeasible_message_names_both_sides():
    opt = Option("save", stored_bytes=int(55.5 * MiB), backward_bytes=0, extra_time=0.0)
    problem = ChainProblem(1, 0, {(0, 1): (opt,)})
    with pytest.raises(
        InfeasibleBudgetError,
        match=r"^budget 40\.0 MiB is below the lowest reachable peak 55\.5 MiB; raise the budget to at least "
        r"55\.5 MiB \(58195968 bytes\) or enable offload$",
    ) as info:
        solve(problem, 40 * MiB)
    assert (info.value.budget, info.value.lowest) == (40 * MiB, 58195968)


# ---------------------------------------------------------------------------
# A tradeoff chain where CP-SAT is worth running.


def tradeoff_chain(n, max_len, seed=0, n_options=6):
    rng = np.random.default_rng(seed)
    act = rng.integers(50, 300, n) * MiB + rng.integers(0, MiB, n)
    boundary = rng.integers(5, 20, n) * MiB + rng.integers(0, MiB, n)
    compute = rng.random(n) * 1e-3 + 1e-4
    options = {}
    for j in range(n):
        for i in range(j + 1, min(n, j + max_len) + 1):
            a, c = int(act[j:i].sum()), float(compute[j:i].sum())
            options[(j, i)] = tuple(
                Option(
                    f"o{k}",
                    stored_bytes=int(boundary[j] + a * (n_options - 1 - k) // (n_options - 1)),
                    backward_bytes=int(a * k // (n_options - 1) + act[j:i].max()),
                    extra_time=c * k / (n_options - 1),
                )
                for k in range(n_options)
            )
    return ChainProblem(n, 2**30, options, block_names=tuple(f"layer{i}" for i in range(n)))


def test_auto_on_a_tradeoff_chain():
    problem = tradeoff_chain(12, 12, n_options=4)
    low, high = lowest_peak(problem), evaluate(problem, min_time_segments(problem))[0]
    budget = (low + high) // 2
    result = solve(problem, budget, time_limit=20)
    dp, greedy = solve_dp(problem, budget), solve_greedy(problem, budget)
    assert result.status == "optimal" and result.peak_bytes <= budget
    assert result.objective <= dp.objective + 1e-12 and result.objective <= greedy.objective + 1e-12
    hinted = solve_cpsat(problem, budget, hint=greedy.segments, time_limit=20)
    assert hinted.objective == pytest.approx(result.objective, abs=1e-8)


def test_dp_scales_to_100_blocks():
    problem = tradeoff_chain(100, 100)
    low, high = lowest_peak(problem), evaluate(problem, min_time_segments(problem))[0]
    result = solve_dp(problem, (low + high) // 3)
    assert result.feasible and result.peak_bytes <= (low + high) // 3
    assert 0.0 <= result.gap < 1.0


def test_cpsat_time_limit_reports_a_gap_or_optimal():
    problem = tradeoff_chain(25, 25)
    low, high = lowest_peak(problem), evaluate(problem, min_time_segments(problem))[0]
    budget = low + (high - low) // 5
    hint = solve_dp(problem, budget).segments
    result = solve_cpsat(problem, budget, time_limit=0.5, hint=hint)
    assert result.status in ("optimal", "feasible")  # at worst, the hint
    assert result.peak_bytes <= budget
    assert result.gap >= 0.0 or math.isnan(result.gap)
    assert result.objective <= evaluate(problem, hint)[1] + 1e-12


# ---------------------------------------------------------------------------
# Baselines and validation.


def small_problem():
    save = Option("save-all", stored_bytes=100, backward_bytes=10, extra_time=0.0)
    remat = Option("recompute-all", stored_bytes=10, backward_bytes=100, extra_time=1.0)
    options = {(j, j + 1): (save, remat) for j in range(4)}
    options.update({(0, 2): (save, remat), (2, 4): (save, remat)})
    return ChainProblem(4, 5, options), save, remat


def test_uniform_and_fixed_partitions():
    problem, save, remat = small_problem()
    every = uniform_segments(problem, 1, "save-all")
    assert every == tuple(Segment(j, j + 1, save) for j in range(4))
    sqrt = uniform_segments(problem, 2, "recompute-all")
    assert sqrt == (Segment(0, 2, remat), Segment(2, 4, remat))
    assert evaluate(problem, sqrt) == (5 + 10 + 100, 2.0)
    assert fixed_partition(problem, [(0, 2, "save-all"), (2, 3, "recompute-all"), (3, 4, "save-all")])[1] == Segment(
        2, 3, remat
    )
    base = evaluate_plan(problem, every, budget=405)
    assert (base.status, base.peak_bytes, base.objective, base.lowest_peak) == ("feasible", 405, 0.0, None)
    over = evaluate_plan(problem, every, budget=404)
    assert over.status == "infeasible" and over.lowest_peak == lowest_peak(problem)


@pytest.mark.parametrize(
    "size, name, match",
    [
        (3, "save-all", r"region \[0, 3\) is not allowed"),
        (1, "offload", r"region \[0, 1\) has no option named 'offload'; its options are \['save-all', 'recompute-all'\]"),
        (0, "save-all", r"size must be a positive int, got 0"),
    ],
)
def test_uniform_segments_errors(size, name, match):
    problem, _, _ = small_problem()
    with pytest.raises(ValueError, match=match):
        uniform_segments(problem, size, name)


def test_evaluate_rejects_bad_plans():
    problem, save, remat = small_problem()
    other = Option("other", 1, 1, 0.0)
    with pytest.raises(ValueError, match=r"segments\[1\] starts at 2 but the previous region ends at 1"):
        evaluate(problem, [Segment(0, 1, save), Segment(2, 4, save)])
    with pytest.raises(ValueError, match=r"segments end at 2 but the chain has 4 blocks"):
        evaluate(problem, [Segment(0, 2, save)])
    with pytest.raises(ValueError, match=r"region \[1, 3\) is not allowed"):
        evaluate(problem, [Segment(0, 1, save), Segment(1, 3, save), Segment(3, 4, save)])
    with pytest.raises(ValueError, match=r"option 'other' is not one of region \[0, 2\)'s options"):
        evaluate(problem, [Segment(0, 2, other), Segment(2, 4, save)])
    with pytest.raises(ValueError, match=r"segments are empty"):
        evaluate(problem, [])
    with pytest.raises(ValueError, match=r"option 'other'"):
        solve_cpsat(problem, 1000, hint=[Segment(0, 2, other), Segment(2, 4, save)])


def test_payload_is_passed_through_and_ignored_by_equality():
    tagged = Option("save", 1, 1, 0.0, payload={"names": ("a",)})
    plain = Option("save", 1, 1, 0.0)
    assert tagged == plain and hash(tagged) == hash(plain)
    problem = ChainProblem(1, 0, {(0, 1): (tagged,)})
    assert solve(problem, 10).segments[0].option.payload == {"names": ("a",)}


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(n_blocks=0, base_bytes=0, options={}), ValueError, r"n_blocks must be a positive int, got 0"),
        (dict(n_blocks=2, base_bytes=-1, options={}), ValueError, r"base_bytes must be in \[0, 2\*\*52\)"),
        (dict(n_blocks=2, base_bytes=0, options={(0, 3): ()}), ValueError, r"region \(0, 3\) is not inside \[0, 2\)"),
        (dict(n_blocks=2, base_bytes=0, options={(0, 2): ()}), ValueError, r"region \[0, 2\) has no options"),
        (
            dict(n_blocks=3, base_bytes=0, options={(0, 1): (Option("a", 0, 0, 0.0),), (2, 3): (Option("a", 0, 0, 0.0),)}),
            ValueError,
            r"no partition of blocks \[0, 3\) .* reaches position 2",
        ),
        (
            dict(n_blocks=1, base_bytes=0, options={(0, 1): (Option("a", 0, 0, 0.0), Option("a", 1, 0, 0.0))}),
            ValueError,
            r"several options named \['a'\]",
        ),
        (
            dict(n_blocks=1, base_bytes=0, options={(0, 1): (Option("a", 0, 0, 0.0),)}, block_names=("x", "y")),
            ValueError,
            r"2 block_names for n_blocks=1",
        ),
    ],
)
def test_chain_problem_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        ChainProblem(**kwargs)


@pytest.mark.parametrize(
    "args, error, match",
    [
        (("a", -1, 0, 0.0), ValueError, r"Option 'a': stored_bytes must be in \[0, 2\*\*52\)"),
        (("a", 1.5, 0, 0.0), TypeError, r"Option 'a': stored_bytes must be an int number of bytes, got 1\.5"),
        (("a", 0, 0, math.nan), ValueError, r"Option 'a': extra_time must be a finite number, got nan"),
    ],
)
def test_option_validation(args, error, match):
    with pytest.raises(error, match=match):
        Option(*args)


@pytest.mark.parametrize("solver", [solve_brute_force, solve_dp, solve_cpsat, solve_greedy])
@pytest.mark.parametrize("budget", ["8GB", -1, 1.0, True])
def test_solvers_want_int_bytes(solver, budget):
    problem, _, _ = small_problem()
    with pytest.raises(BudgetError, match=r"must be an int number of bytes >= 0; convert '8GB'-style budgets"):
        solver(problem, budget)


def test_solve_rejects_unknown_method():
    problem, _, _ = small_problem()
    with pytest.raises(ValueError, match=r"unknown method 'ilp'; choose one of"):
        solve(problem, 1000, method="ilp")


def test_brute_force_refuses_huge_problems():
    opts = (Option("a", 0, 0, 0.0), Option("b", 0, 0, 0.0), Option("c", 0, 0, 0.0))
    problem = ChainProblem(12, 0, {(j, j + 1): opts for j in range(12)})
    assert count_plans(problem) == 3**12 > MAX_PLANS
    with pytest.raises(ValueError, match=r"has 531441 plans, more than MAX_PLANS=200000; use solve_dp or solve_cpsat"):
        solve_brute_force(problem, 10)


def test_problem_pickles_and_hashes():
    import copy
    import pickle

    problem, _, _ = small_problem()
    lowest_peak(problem)  # fills the caches, which must not travel
    again = pickle.loads(pickle.dumps(problem))
    assert again == problem and hash(again) == hash(problem) and copy.deepcopy(problem) == problem
    assert lowest_peak(again) == lowest_peak(problem)
