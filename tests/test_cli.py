"""The `autoremat` command line on tiny models (tests/cli_factories.py), and its errors.

Every user mistake must print exactly one line `autoremat: error: ...` on stderr, no
traceback, and exit with 2 (usage) or 1 (anything else).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoremat import InfeasibleBudgetError
from autoremat.cli import main, parse_budget_text
from autoremat.runtime import Plan

HERE = Path(__file__).resolve().parent
FACTORIES = str(HERE / "cli_factories.py")
TINY = f"{FACTORIES}:tiny_mlp"
TINY_BUDGET = "0.95"  # comfortably reachable on tiny_mlp (no remat 2.5 MiB; remat reaches ~2.0 MiB)


def run(*args, ok=True):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def assert_one_line_error(result, code, match):
    assert result.exit_code == code, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("autoremat: error:")]
    assert len(errors) == 1, result.stderr
    assert match in errors[0], errors[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""


def assert_image(path):
    path = Path(path)
    assert path.is_file() and path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """`search` with validation and a timeline, shared by the show/export tests."""
    out = tmp_path_factory.mktemp("search")
    result = run("search", TINY, "--budget", TINY_BUDGET, "--solver", "dp", "-o", out / "plan.json",
                 "--timeline", out / "timeline.png")
    return out, result


# -- search / show / export -------------------------------------------------------------------

def test_search_writes_a_validated_plan_and_a_timeline(plan_file):
    out, result = plan_file
    plan = Plan.load(out / "plan.json")
    assert plan.budget is not None and plan.meta["compiled_peak"] <= plan.budget
    assert plan.regions or plan.scans
    assert "validation: compiled peak" in result.stdout and "-> fits" in result.stdout
    assert "totals:" in result.stdout
    assert "[autoremat] round 1" in result.stderr  # progress goes to stderr
    assert_image(out / "timeline.png")


def test_search_module_form_with_set_and_no_validate(tmp_path, monkeypatch):
    monkeypatch.chdir(HERE)  # `cli_factories` is importable as a module from the current folder
    result = run("search", "cli_factories:tiny_mlp", "--set", "n_layers=4", "--budget", "0.95", "--no-validate",
                 "-q", "-o", tmp_path / "p.json")
    assert "not compiled (--no-validate)" in result.stdout
    assert "autoremat: warning:" in result.stderr and "NOT compiled" in result.stderr
    assert "[autoremat]" not in result.stderr  # --quiet
    assert Plan.load(tmp_path / "p.json").n_eqns > 0


def test_search_keeps_its_compiles_where_compile_cache_says(tmp_path, monkeypatch):
    """`--compile-cache DIR`: the planner's compiles go there for later runs (autoremat/_compile_cache.py)."""
    from autoremat._compile_cache import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, "off")  # restored after the test: the option sets it for the process
    cache = tmp_path / "cache"
    run("--compile-cache", cache, "search", TINY, "--set", "n_layers=7", "--budget", TINY_BUDGET, "--solver", "dp",
        "-q", "-o", tmp_path / "p.json")
    assert len(list(cache.rglob("*.json"))) >= 2  # the un-optimized step and at least one plan


def test_search_example_object_factory(tmp_path):
    """A factory returning an object with .fn and .args (autoremat.examples.Example)."""
    result = run("search", f"{FACTORIES}:tiny_example", "--budget", "1.0", "-q", "-o", tmp_path / "p.json")
    assert "fits" in result.stdout
    assert Plan.load(tmp_path / "p.json").meta.get("note") == "fits as written"


def test_show(plan_file):
    out, _ = plan_file
    result = run("show", out / "plan.json")
    assert result.stdout.startswith("autoremat plan for loss")
    assert "per layer" in result.stdout and "totals: save" in result.stdout
    assert "more values" not in result.stdout and "checkpoint eqns" not in result.stdout
    verbose = run("show", out / "plan.json", "--verbose", "--max-rows", "1").stdout
    assert "more values" in verbose and "regions:" in verbose


def test_export_stdout_and_file(plan_file, tmp_path):
    out, _ = plan_file
    code = run("export", out / "plan.json").stdout
    # Names and one policy, or (a JAX policy per layer won) plain jax.checkpoint calls.
    assert "policy" in code and ("checkpoint_name" in code or "jax.checkpoint(layer, policy=" in code)
    compile(code, "exported.py", "exec")
    run("export", out / "plan.json", "-o", tmp_path / "policy.py")
    assert (tmp_path / "policy.py").read_text().strip() == code.strip()


# -- inspect / frontier / demo ------------------------------------------------------------------

def test_inspect():
    result = run("inspect", TINY, "--set", "n_layers=2", "--max-rows", "4")
    assert "Residuals of loss" in result.stdout
    # tanh's output (jax 0.10), or only its derivative 1 - y**2 (jax 0.11's one_minus_square)
    assert ("tanh" in result.stdout or "one_minus_square" in result.stdout) and "total:" in result.stdout


def test_inspect_builtin_example():
    result = run("inspect", "--example", "mlp_chain", "--set", "n_layers=2", "--set", "width=16",
                 "--set", "batch=8", "--sort", "order")
    assert "Residuals of loss" in result.stdout


def test_frontier_measured_with_baselines_and_an_infeasible_budget(tmp_path):
    png = tmp_path / "frontier.png"
    result = run("frontier", TINY, "--budgets", f"1.0,{TINY_BUDGET},1KB", "--solver", "dp", "--measure", "-q",
                 "-o", png)
    assert_image(png)
    assert "budget 1KB: infeasible" in result.stderr
    rows = (tmp_path / "frontier.csv").read_text().splitlines()
    assert rows[0].startswith("kind,label,budget_bytes,peak_bytes")
    labels = [r.split(",")[1] for r in rows[1:]]
    assert labels == ["none", "per-block nothing_saveable", "per-block dots_saveable", "1.0", TINY_BUDGET, "1KB"]
    measured = [r.split(",")[6] for r in rows[1:]]
    assert all(float(m) > 0 for m in measured[:5]) and measured[5] == ""
    flops = [r.split(",")[7] for r in rows[1:]]
    assert float(flops[0]) == 0 and float(flops[1]) > 0 and flops[5] == ""  # none, nothing_saveable, 1KB
    md = (tmp_path / "frontier.md").read_text()
    assert md.startswith("| kind |") and "infeasible" in md and "recomputed GFLOP (compiled)" in md
    assert md.strip() in result.stdout


@pytest.mark.parametrize("y, compiled", [("flops", True), ("estimated", False), ("measured", True)])
def test_the_frontier_plot_says_what_it_shows(tmp_path, monkeypatch, y, compiled):
    """Axis labels say compiled vs predicted peaks and which cost the y axis is; an infeasible
    budget is a red cross with its lowest reachable peak (issue 17: pictures that tell the truth)."""
    from autoremat import _plots

    figures = []
    monkeypatch.setattr(_plots, "_save", lambda fig, path: figures.append(fig) or path)
    points = [_plots.ParetoPoint("0.6", 60 * 2**20, 2e9), _plots.ParetoPoint("0.8", 80 * 2**20, 1e9)]
    _plots.pareto_plot(points, [_plots.ParetoPoint("none", 100 * 2**20, 0.0)], tmp_path / "f.png", y=y,
                       compiled=compiled, infeasible=[("1KB", 1000, 40 * 2**20)])
    (ax,) = figures[0].axes
    assert ax.get_ylabel() == _plots.Y_AXES[y][0]
    assert ("compiled by XLA" if compiled else "predicted by autoremat") in ax.get_xlabel()
    assert "1KB: infeasible (lowest 40.0 MiB)" in [t.get_text() for t in ax.texts]
    assert "infeasible budget" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_frontier_estimated_without_validation(tmp_path):
    png = tmp_path / "f.png"
    run("frontier", TINY, "--budgets", "0.95", "--no-validate", "--solver", "dp", "-q", "-o", png)
    assert_image(png)
    assert "predicted peak" in (tmp_path / "f.md").read_text()


def test_demo_on_a_small_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("demo", "--example", "mlp_chain", "--set", "n_layers=4", "--set", "width=64", "--set",
                 "batch=256", "--budget", "0.95", "-q")
    assert "autoremat demo:" in result.stdout and "validation: compiled peak" in result.stdout
    assert "step time" in result.stdout
    assert not list(tmp_path.iterdir()), "the demo leaves no files behind unless asked"
    kept = run("demo", "--example", "mlp_chain", "--set", "n_layers=4", "--set", "width=64", "--set",
               "batch=256", "--budget", "0.95", "-q", "-o", "kept.json")
    assert "autoremat show kept.json" in kept.stdout
    assert Plan.load(tmp_path / "kept.json").budget is not None


def test_demo_defaults_are_the_readme_demo():
    cmd = main.commands["demo"]
    defaults = {p.name: p.default for p in cmd.params}
    assert defaults["example"] == "transformer_scan" and defaults["budget"] == "0.6"
    assert defaults["output"] is None


# -- user mistakes: one line, no traceback ------------------------------------------------------

@pytest.mark.parametrize("args, code, match", [
    (["search", "no_such_module_xyz:make", "--budget", "0.5"], 1, "cannot import module 'no_such_module_xyz'"),
    (["search", "/no/such/model.py:make", "--budget", "0.5"], 1, "does not exist"),
    (["search", f"{FACTORIES}:no_such_factory", "--budget", "0.5"], 1, "has no attribute 'no_such_factory'"),
    (["search", f"{FACTORIES}:NOT_CALLABLE", "--budget", "0.5"], 1, "NOT_CALLABLE is int"),
    (["search", f"{FACTORIES}:returns_garbage", "--budget", "0.5"], 1, "returned int"),
    (["search", f"{FACTORIES}:tiny_mlp", "--set", "bogus=1", "--budget", "0.5"], 1, "does not take"),
    (["search", "example:no_such_example", "--budget", "0.5"], 1, "unknown example 'no_such_example'"),
    (["search", "no_colon", "--budget", "0.5"], 2, "is not MODULE:FACTORY"),
    (["search", TINY, "--budget", "12XB"], 2, "unknown unit 'XB'"),
    (["search", TINY, "--budget", "lots"], 2, "budget 'lots' is not understood"),
    (["search", TINY, "--budget", "1.5"], 2, "fraction in (0, 1]"),
    (["search", TINY], 2, "Missing option '--budget'"),
    (["search", "--budget", "0.5"], 2, "missing MODEL"),
    (["search", TINY, "--budget", "1GB", "--device", "h999"], 1, "unknown device profile 'h999'"),
    (["search", TINY, "--budget", "1GB", "-o", "/no/such/folder/plan.json"], 1, "does not exist"),
    (["frontier", TINY, "--budgets", "0.5,abc"], 2, "budget 'abc' is not understood"),
    (["show", "missing-plan.json"], 2, "'missing-plan.json' does not exist"),
    (["export", "missing-plan.json"], 2, "'missing-plan.json' does not exist"),
    (["no-such-command"], 2, "No such command"),
])
def test_user_mistakes(args, code, match):
    assert_one_line_error(run(*args, ok=False), code, match)


def test_unreachable_budget(tmp_path):
    result = run("search", TINY, "--budget", "1KB", "-o", tmp_path / "never.json", ok=False)
    assert_one_line_error(result, 1, "budget 1000 B is below")
    assert "raise the budget to at least" in result.stderr
    assert not (tmp_path / "never.json").exists()


@pytest.mark.parametrize("content, match", [
    ("this is not json", "is not valid JSON"),
    ('{"hello": 1}', "is not an autoremat plan"),
    ('{"format": "autoremat-plan", "version": 1}', "corrupt autoremat plan"),
    ('{"format": "autoremat-plan", "version": 99}', "schema version 99"),
])
@pytest.mark.parametrize("command", ["show", "export"])
def test_corrupt_plan_files(tmp_path, command, content, match):
    path = tmp_path / "plan.json"
    path.write_text(content)
    assert_one_line_error(run(command, path, ok=False), 1, match)


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(InfeasibleBudgetError, match="raise the budget"):
        CliRunner().invoke(main, ["--debug", "search", TINY, "--budget", "1KB", "-q", "-o", tmp_path / "x.json"],
                           catch_exceptions=False)


def test_parse_budget_text():
    assert parse_budget_text(" 512MiB ") == "512MiB"
    assert parse_budget_text("1000000") == 1_000_000
    assert parse_budget_text("1.0") == 1.0 and isinstance(parse_budget_text("1"), int)
    assert parse_budget_text("AUTO") == "auto"


# -- the installed entry points, in fresh processes ---------------------------------------------

def _env_without_xla_flags():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    return env


def test_console_script_help():
    script = Path(sys.executable).parent / "autoremat"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for command in ("search", "show", "export", "frontier", "inspect", "demo"):
        assert command in out.stdout


def test_cli_sets_the_xla_flags_before_jax_starts():
    code = ("import os, autoremat.cli; from autoremat._xla import cpu_flags_active, _backend_started; "
            "print(cpu_flags_active(), _backend_started())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env_without_xla_flags(),
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


def test_python_m_autoremat_search_end_to_end(tmp_path):
    """A real process: the flags land before compilation (no warning), the plan is written."""
    out = subprocess.run(
        [sys.executable, "-m", "autoremat", "search", TINY, "--budget", TINY_BUDGET, "--solver", "dp",
         "-o", str(tmp_path / "plan.json")],
        capture_output=True, text=True, env=_env_without_xla_flags(), timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "XLA:CPU flags" not in out.stderr
    assert "-> fits" in out.stdout
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["format"] == "autoremat-plan"
