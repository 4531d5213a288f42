"""`autoremat.fit` / `autoremat fit`: the largest size whose training step fits a budget."""

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

import autoremat
from autoremat import examples
from autoremat._fit import _largest
from autoremat.cli import main
from autoremat.runtime._validate import compiled_stats


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50), st.integers(0, 5000), st.one_of(st.none(), st.integers(0, 5000)))
def test_largest_finds_the_threshold(lo, threshold, span):
    hi = None if span is None else lo + span
    calls = []

    def ok(n):
        calls.append(n)
        return n <= threshold

    want = 0 if threshold < lo else threshold if hi is None else min(threshold, hi)
    assert _largest(ok, lo, hi) == want
    assert len(set(calls)) <= 2 * 13 + 3  # logarithmic: doubling to 2**13, then bisecting


def _mlp(batch):
    ex = examples.mlp_chain(n_layers=4, width=64, batch=batch)
    return ex.fn, ex.args


def _peak(batch):
    fn, args = _mlp(batch)
    return compiled_stats(fn, *args).peak_bytes


def test_fit_answers_with_compiled_peaks():
    peak = _peak
    budget = (peak(48) + peak(49)) // 2
    r = autoremat.fit(_mlp, budget, lo=32, hi=64)
    assert peak(r.plain) <= budget < peak(r.plain + 1)
    rows = {row.size: row for row in r.rows}
    assert r.planned > r.plain  # remat lets a larger batch fit
    assert rows[r.planned].plan_peak <= budget
    assert rows[r.plain + 1].peak > budget  # the search compiled the next size as written
    assert f"with autoremat's plan: {r.planned}" in r.table()


def test_fit_rejects_a_fraction_budget_and_bad_sizes():
    with pytest.raises(autoremat.BudgetError, match="absolute budget"):
        autoremat.fit(_mlp, 0.5)
    with pytest.raises(ValueError, match="lo <= hi"):
        autoremat.fit(_mlp, "1MiB", lo=8, hi=4)


def test_fit_command_line_errors_are_one_line():
    runner = CliRunner()
    out = runner.invoke(main, ["fit", "example:mlp_chain", "--budget", "0.5"])
    assert out.exit_code == 2 and "absolute budget" in out.output
    out = runner.invoke(main, ["fit", "example:mlp_chain", "--budget", "1MiB", "--max-overhead", "lots"])
    assert out.exit_code == 2 and "not a fraction" in out.output
