"""The `autoremat` command line: search, show, export, frontier, inspect, demo.

    autoremat search model.py:make --budget 8GB -o plan.json
    autoremat search example:transformer_scan --budget 0.6 -o plan.json --timeline memory.png
    autoremat show plan.json
    autoremat export plan.json -o remat_policy.py
    autoremat frontier model.py:make --budgets 1.0,0.8,0.6,0.4 -o frontier.png [--measure]
    autoremat inspect model.py:make
    autoremat demo

`MODEL` is `MODULE:FACTORY` (an importable module, or a file `path/to/model.py`) naming a
callable that returns `(fn, args)` or an object with `.fn` and `.args` (such as
`autoremat.examples.Example`), or `example:NAME` for a built-in example.  `--set KEY=VALUE`
passes keyword arguments to the factory.

User mistakes (a missing module, a malformed budget, a budget below the lowest reachable
peak, a corrupt plan) print one line `autoremat: error: ...` on stderr and exit with 2
(usage) or 1 (anything else); `--debug` shows the traceback instead.
"""

# The XLA:CPU flags must be in the environment before JAX initializes its backend (docs/FACTS.md
# fact 4).  Importing this module imports the `autoremat` package, and so jax, but jax starts
# its backend lazily, at the first computation, which only happens below.
from autoremat._xla import configure_cpu_flags

configure_cpu_flags()

import ast  # noqa: E402
import csv  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import click  # noqa: E402

from autoremat._compile_cache import CACHE_ENV  # noqa: E402
from autoremat._errors import AutorematError, InfeasibleBudgetError  # noqa: E402
from autoremat._units import format_bytes, parse_budget  # noqa: E402
from autoremat._bridge import baseline_segments, plan_segments, to_plan  # noqa: E402
from autoremat.solver._solve import METHODS  # noqa: E402

__all__ = ["main", "load_model", "parse_budget_text", "LoadedModel"]

_PROG = "autoremat"
_SOLVERS = METHODS
DEMO_BUDGET = "0.6"
DEMO_PLAN = "autoremat-demo-plan.json"
BASELINES = (  # (label, per-block option name without its "ckpt:" / "scan:" prefix)
    ("none", None),
    ("per-block nothing_saveable", "recompute"),
    ("per-block dots_saveable", "save:dots"),
)


class CLIError(click.ClickException):
    """A user mistake: printed as one line, exit status 1."""

    exit_code = 1


# -- loading a model ---------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadedModel:
    """What a `MODULE:FACTORY` spec names: the loss, its arguments, and a display name."""

    fn: Any
    args: tuple
    kwargs: dict = field(default_factory=dict)
    name: str = "fn"


def _parse_sets(sets) -> dict:
    out = {}
    for item in sets or ():
        key, sep, text = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE (e.g. n_layers=2)", param_hint="'--set'")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        out[key.strip()] = value
    return out


def _import_file(path: str):
    if not os.path.exists(path):
        raise CLIError(f"model file {path!r} does not exist")
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)  # so the file can import its neighbours
    mod_name = "_autoremat_model_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise CLIError(f"cannot import {path!r} as Python; give MODULE:FACTORY with a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        raise CLIError(f"importing {path!r} failed: {type(e).__name__}: {e}") from e
    except SyntaxError as e:
        raise CLIError(f"{path!r} has a syntax error at line {e.lineno}: {e.msg}") from e
    return module


def _import_module(name: str):
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules in the current folder
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        raise CLIError(
            f"cannot import module {name!r} ({e}); give MODULE:FACTORY with an importable module "
            f"or a file such as model.py:make_model") from e
    except ImportError as e:
        raise CLIError(f"importing module {name!r} failed: {e}") from e
    except SyntaxError as e:
        raise CLIError(f"module {name!r} has a syntax error in {e.filename} line {e.lineno}: {e.msg}") from e


def load_model(spec: str, *, sets: dict | None = None) -> LoadedModel:
    """Loads `MODULE:FACTORY`, `path/model.py:FACTORY` or `example:NAME` into a `LoadedModel`."""
    sets = dict(sets or {})
    if spec.startswith("example:"):
        from autoremat.examples import get_example

        ex = get_example(spec.split(":", 1)[1], **sets)
        return LoadedModel(ex.fn, tuple(ex.args), {}, ex.name)
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise click.BadParameter(
            f"{spec!r} is not MODULE:FACTORY (e.g. mypkg.models:make_model, model.py:make_model or "
            f"example:transformer)", param_hint="'MODEL'")
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        module = _import_file(module_part)
    else:
        module = _import_module(module_part)
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CLIError(f"{module_part!r} has no attribute {attr!r}; FACTORY must name a callable "
                           f"there that returns (fn, args)") from None
    if callable(obj) and not _looks_like_model(obj):
        try:
            made = obj(**sets)
        except TypeError as e:
            if sets:
                raise CLIError(f"{spec} does not take the arguments {sorted(sets)} given with --set: {e}") from e
            raise
    else:
        if sets:
            raise CLIError(f"{spec} is not callable, so --set {sorted(sets)} cannot be passed to it")
        made = obj
    return _as_model(made, spec, "returned" if made is not obj else "is")


def _looks_like_model(obj) -> bool:
    return hasattr(obj, "fn") and hasattr(obj, "args")


def _as_model(made, spec: str, verb: str = "returned") -> LoadedModel:
    if _looks_like_model(made):
        fn, args, kwargs = made.fn, made.args, dict(getattr(made, "kwargs", None) or {})
    elif isinstance(made, (tuple, list)) and len(made) in (2, 3) and callable(made[0]):
        fn, args = made[0], made[1]
        kwargs = dict(made[2]) if len(made) == 3 else {}
    else:
        raise CLIError(f"{spec} {verb} {type(made).__name__}; FACTORY must be a callable returning (fn, args) "
                       f"or an object with .fn and .args")
    if not isinstance(args, (tuple, list)):
        raise CLIError(f"{spec} {verb} args of type {type(args).__name__}; args must be a tuple of the "
                       f"arguments to call fn with, e.g. (params, batch)")
    if not callable(fn):
        raise CLIError(f"{spec} {verb} fn of type {type(fn).__name__}, which is not callable")
    return LoadedModel(fn, tuple(args), kwargs, getattr(fn, "__name__", "fn"))


def _spec(model: str | None, example: str | None) -> str:
    if example and model:
        raise click.UsageError("give either MODEL or --example NAME, not both")
    if example:
        return f"example:{example}"
    if not model:
        raise click.UsageError("missing MODEL (MODULE:FACTORY, a file model.py:FACTORY, or example:NAME)")
    return model


# -- budgets ---------------------------------------------------------------------------------

def parse_budget_text(text: str):
    """A budget as written on the command line: `8GB`, `512MiB`, `1000000` (bytes), `0.6`, `auto`.

    Returns what `optimize` takes (str, int bytes or float fraction); raises `BudgetError`
    for anything `parse_budget` would reject.

    >>> parse_budget_text("8GB"), parse_budget_text("0.6"), parse_budget_text("4096")
    ('8GB', 0.6, 4096)
    """
    text = text.strip()
    if text.lower() == "auto":
        return "auto"
    value: Any
    try:
        value = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            value = text
    parse_budget(value, reference_peak=2**40)  # validates the form; the reference is a placeholder
    return value


def _budget_option(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_budget_text(value)
    except AutorematError as e:
        raise click.BadParameter(str(e)) from e


def _budgets_option(ctx, param, value):
    items = [v for v in value.split(",") if v.strip()]
    if not items:
        raise click.BadParameter("give a comma-separated list such as 1.0,0.8,0.6,0.4")
    out = []
    for v in items:
        try:
            out.append((v.strip(), parse_budget_text(v)))
        except AutorematError as e:
            raise click.BadParameter(str(e)) from e
    return out


# -- output helpers ----------------------------------------------------------------------------

def _check_writable(path):
    """Fails early (before minutes of planning) when an output's folder is missing."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CLIError(f"cannot write {path!r}: folder {os.path.dirname(path)!r} does not exist")


def _progress(quiet: bool):
    from autoremat._progress import Progress

    if quiet:
        return lambda msg: None
    return Progress(lambda msg: click.echo(f"[autoremat] {msg}", err=True))


def _show_warning(message, category, filename, lineno, file=None, line=None):
    text = str(message)
    if text.startswith("autoremat: "):
        text = text[len("autoremat: "):]
    click.echo(f"{_PROG}: warning: {text}", err=True)


def _planning_kwargs(device, offload, solver, time_limit, validate, progress) -> dict:
    return dict(device=device, offload=offload, solver=solver, time_limit=time_limit, validate=validate,
                progress=progress)


def _check_device(device):
    if device is not None:
        from autoremat.graph._profiles import get_profile

        get_profile(device)  # AutorematError naming the known profiles
    return device


def _validation_lines(planned) -> list[str]:
    plan = planned.plan
    budget = plan.budget
    compiled = plan.meta.get("compiled_peak")
    base = planned.baseline_peak
    lines = []
    if compiled is None:
        lines.append("validation: not compiled (--no-validate); the peak above is the model's prediction")
        return lines
    verdict = "fits" if budget is None or compiled <= budget else "DOES NOT FIT"
    line = f"validation: compiled peak {format_bytes(compiled)}"
    if budget is not None:
        line += f" vs budget {format_bytes(budget)} -> {verdict}"
    lines.append(line)
    if base:
        lines.append(f"            un-optimized compiled peak {format_bytes(base)} "
                     f"({(compiled - base) / base:+.1%})")
    if plan.predicted_peak:
        lines.append(f"            predicted peak {format_bytes(plan.predicted_peak)} "
                     f"(model error {(plan.predicted_peak - compiled) / max(compiled, 1):+.1%})")
    return lines


# -- segments behind a plan (for the timeline) -------------------------------------------------

# -- the click application ---------------------------------------------------------------------

class _Group(click.Group):
    """Prints user mistakes as one line `autoremat: error: ...` (exit 2 usage, 1 otherwise)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        debug = "--debug" in (sys.argv[1:] if args is None else list(args))
        code = 0
        old_show = warnings.showwarning
        warnings.showwarning = _show_warning
        try:
            rv = super().main(args=args, prog_name=prog_name or _PROG, complete_var=complete_var,
                              standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0
        except click.UsageError as e:
            hint = ""
            if e.ctx is not None:
                hint = f" (see '{e.ctx.command_path} --help')"
            click.echo(f"{_PROG}: error: {e.format_message()}{hint}", err=True)
            code = e.exit_code
        except click.ClickException as e:
            click.echo(f"{_PROG}: error: {e.format_message()}", err=True)
            code = e.exit_code
        except click.exceptions.Abort:
            click.echo(f"{_PROG}: error: interrupted", err=True)
            code = 130
        except (AutorematError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
            if debug:
                raise
            msg = str(e) if isinstance(e, AutorematError) else f"{e.strerror}: {e.filename!r}"
            click.echo(f"{_PROG}: error: {' '.join(msg.split(chr(10)))}", err=True)
            code = 1
        finally:
            warnings.showwarning = old_show
        if standalone_mode:
            sys.exit(code)
        return code


def _version() -> str:
    import jax

    import autoremat

    return f"autoremat {autoremat.__version__} (jax {jax.__version__})"


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, help="Show the version and exit.",
              callback=lambda ctx, param, value: value and (click.echo(_version()), ctx.exit()))
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.option("--compile-cache", metavar="DIR|off",
              help="Where planning keeps what XLA said about each program it compiled, so that later runs "
                   "do not compile it again; 'off' compiles everything afresh [default: $AUTOREMAT_CACHE_DIR, "
                   "else ~/.cache/autoremat/compiled].")
def main(debug, compile_cache):
    """autoremat: automatic gradient checkpointing for JAX.

    MODEL is MODULE:FACTORY (an importable module or a file model.py) naming a callable that
    returns (fn, args) or an object with .fn and .args; or example:NAME for a built-in
    example (mlp_chain, transformer, transformer_scan, convnet).
    """
    if compile_cache is not None:
        os.environ[CACHE_ENV] = compile_cache


def _model_options(f):
    f = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                     help="Keyword argument for the factory (repeatable), e.g. --set n_layers=2.")(f)
    f = click.option("--example", metavar="NAME", help="A built-in example instead of MODEL.")(f)
    f = click.argument("model", required=False, metavar="MODEL")(f)
    return f


def _solver_options(f):
    f = click.option("--no-validate", "no_validate", is_flag=True,
                     help="Skip compiling to check the plan (faster; the peak is only predicted).")(f)
    f = click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), metavar="S",
                     help="Seconds for the exact solver.")(f)
    f = click.option("--solver", type=click.Choice(_SOLVERS), default="auto", show_default=True,
                     help="Chain solver.")(f)
    f = click.option("--offload/--no-offload", default=None,
                     help="Allow offloading to pinned host memory [default: on except on CPU].")(f)
    f = click.option("--device", metavar="PROFILE",
                     help="Device profile for the time model (h100, h200, a100, tpu-v5e, cpu, ...) "
                          "[default: detected].")(f)
    return f


@main.command()
@_model_options
@click.option("--budget", "-b", required=True, callback=_budget_option,
              help="Peak memory: 8GB, 7.5GiB, 512MiB, bytes, a fraction such as 0.6, or auto.")
@click.option("-o", "--output", default="plan.json", show_default=True, type=click.Path(dir_okay=False),
              help="Where to write the plan (JSON).")
@_solver_options
@click.option("--timeline", type=click.Path(dir_okay=False), metavar="PNG",
              help="Also draw the predicted memory timeline (plan vs no remat) to this image.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def search(model, example, sets, budget, output, device, offload, solver, time_limit, no_validate, timeline,
           quiet):
    """Find a plan for MODEL that fits --budget and write it to -o."""
    _search(_spec(model, example), _parse_sets(sets), budget, output, device=device, offload=offload,
            solver=solver, time_limit=time_limit, validate=not no_validate, timeline=timeline, quiet=quiet)


def _search(spec, sets, budget, output, *, device=None, offload=None, solver="auto", time_limit=None,
            validate=True, timeline=None, quiet=False, n_steps=0, keep=True):
    from autoremat._optimize import plan_for

    say = _progress(quiet)
    _check_device(device)
    _check_writable(output)
    _check_writable(timeline)
    say(f"loading {spec}")
    m = load_model(spec, sets=sets)
    planned = plan_for(m.fn, budget, m.args, m.kwargs,
                       **_planning_kwargs(device, offload, solver, time_limit, validate, say))
    planned.plan.save(output)
    say(f"wrote {output}")
    if timeline:
        from autoremat._plots import memory_timeline

        try:
            segs = plan_segments(planned.model, planned.plan)
        except AutorematError:  # a JAX policy per layer: the chain model has no curve for it
            segs = None
        memory_timeline(planned.model, segs, budget=planned.plan.budget, path=timeline,
                        compiled_peak=planned.plan.meta.get("compiled_peak"),
                        title=f"autoremat: memory of {m.name}" + (
                            "" if segs is not None else f" ({planned.plan.meta.get('found_by', 'plan')})"))
        say(f"wrote {timeline}")
    click.echo(planned.plan.summary())
    click.echo("")
    for line in _validation_lines(planned):
        click.echo(line)
    if n_steps and validate:
        from autoremat.runtime._validate import validate as validate_plan

        say(f"timing {n_steps} steps of the optimized function")
        report = validate_plan(m.fn, planned.plan, *m.args, n_steps=n_steps, **m.kwargs)
        if report.compiled.step_time is not None:
            click.echo(f"            step time {report.compiled.step_time * 1e3:.1f} ms "
                       f"(median of {len(report.compiled.step_times)}, {report.compiled.backend})")
    if keep:
        click.echo(f"plan written to {output}")
    return planned


@main.command()
@click.argument("plan_file", metavar="PLAN", type=click.Path(exists=True, dir_okay=False))
@click.option("--max-rows", default=40, show_default=True, type=click.IntRange(min=0),
              help="Rows of the per-value table (with --verbose).")
@click.option("-v", "--verbose", is_flag=True, help="Also the checkpoint regions and every value's decision.")
def show(plan_file, max_rows, verbose):
    """Print a saved plan per layer: what each keeps, offloads and recomputes, and why."""
    from autoremat.runtime._plan import Plan

    click.echo(Plan.load(plan_file).summary(max_rows=max_rows, verbose=verbose))


@main.command()
@click.argument("plan_file", metavar="PLAN", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the code here instead of stdout.")
@click.option("--framework", type=click.Choice(["jax", "flax-nnx", "flax-linen", "equinox"]), default="jax",
              show_default=True, help="Write per-layer policies in this framework's remat form.")
def export(plan_file, output, framework):
    """Print plain JAX code realizing a saved plan: a policy per layer in --framework's form, or
    checkpoint_name tags and a name-based policy, with which layers to wrap."""
    from autoremat.runtime._plan import Plan

    _check_writable(output)
    code = Plan.load(plan_file).to_python(framework)
    if output:
        with open(output, "w") as f:
            f.write(code if code.endswith("\n") else code + "\n")
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(code)


@main.command("inspect")
@_model_options
@click.option("--max-rows", default=30, show_default=True, type=click.IntRange(min=0), help="Rows to show.")
@click.option("--sort", type=click.Choice(("bytes", "flops", "order")), default="bytes", show_default=True)
def inspect_cmd(model, example, sets, max_rows, sort):
    """List what MODEL's un-optimized backward pass keeps (residuals, sizes, recompute FLOPs)."""
    from autoremat.graph._inspect import inspect

    m = load_model(_spec(model, example), sets=_parse_sets(sets))
    report = inspect(m.fn, *m.args, **m.kwargs)
    click.echo(report.table(max_rows=max_rows, sort=sort))


@main.command()
@_model_options
@click.option("--budgets", required=True, callback=_budgets_option, metavar="B1,B2,...",
              help="Comma-separated budgets, e.g. 1.0,0.8,0.6,0.4 or 2GB,1GB.")
@click.option("-o", "--output", default="frontier.png", show_default=True, type=click.Path(dir_okay=False),
              help="The picture; a .csv and a .md table are written beside it.")
@click.option("--measure", is_flag=True, help="Measure step times (median of 5) instead of estimating.")
@_solver_options
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def frontier(model, example, sets, budgets, output, measure, device, offload, solver, time_limit, no_validate,
             quiet):
    """Plot peak memory against step time over several budgets, with built-in policies."""
    from autoremat._optimize import plan_for
    from autoremat._shardings import abstract_arguments
    from autoremat._plots import ParetoPoint, pareto_plot
    from autoremat.graph._graph import graph_from_traced
    from autoremat.graph._profiles import detect_profile, get_profile
    from autoremat.graph._trace import trace
    from autoremat.runtime._validate import compiled_stats
    from autoremat.solver._chain_model import build_chain_model

    say = _progress(quiet)
    validate = not no_validate
    _check_device(device)
    spec = _spec(model, example)
    say(f"loading {spec}")
    m = load_model(spec, sets=_parse_sets(sets))
    for path in (output, os.path.splitext(output)[0] + ".csv"):
        _check_writable(path)
    if validate:
        # The un-optimized step fits a budget of 1.0: plan_for returns at once, with the chain
        # model calibrated to the compiled step and the compiled un-optimized peak.
        ref = plan_for(m.fn, 1.0, m.args, m.kwargs,
                       **_planning_kwargs(device, offload, solver, time_limit, True, say))
        chain = ref.model
    else:
        profile = get_profile(device) if device is not None else detect_profile()
        use_offload = (profile.name != "cpu") if offload is None else offload
        abstract, _ = abstract_arguments(m.args, {}, (), None)
        traced = trace(m.fn, abstract, dict(m.kwargs))
        chain = build_chain_model(graph_from_traced(traced, profile=profile), offload=use_offload)
    say(f"{len(chain.blocks)} blocks; {len(budgets)} budgets")

    def measure_fn(fn):
        stats = compiled_stats(fn, *m.args, n_steps=5 if measure else 0, **m.kwargs)
        return stats.peak_bytes, stats.step_time, stats.jaxpr_flops

    # (kind, label, budget bytes, peak, predicted, estimated extra, measured step, recomputed FLOPs, note)
    rows = []
    y_kind = "measured" if measure else ("flops" if validate else "estimated")
    points, budget_bytes, infeasible = [], [], []
    baselines, none_time = _frontier_baselines(m, chain, (measure, validate, y_kind), measure_fn, rows, say)
    for label, budget in budgets:
        try:
            planned = plan_for(m.fn, budget, m.args, m.kwargs,
                               **_planning_kwargs(device, offload, solver, time_limit, validate, say))
        except InfeasibleBudgetError as e:
            click.echo(f"budget {label}: infeasible: {e}", err=True)
            rows.append(("autoremat", label, e.budget, None, None, None, None, None,
                         f"infeasible (lowest {format_bytes(e.lowest)})"))
            infeasible.append((label, e.budget, e.lowest))
            continue
        row = _frontier_point(m, planned.plan, label, measure_fn if measure else None, say)
        rows.append(row)
        points.append(ParetoPoint(label, row[3], {"measured": row[6], "flops": row[7], "estimated": row[5]}[y_kind]))
        if planned.plan.budget:
            budget_bytes.append(planned.plan.budget)
    pareto_plot(points, baselines, output, y=y_kind, compiled=validate or measure, budgets=budget_bytes,
                infeasible=infeasible, title=f"autoremat frontier: {m.name}")
    stem = os.path.splitext(output)[0]
    _write_csv(stem + ".csv", rows)
    table = _markdown(rows, validate=validate or measure, none_time=none_time)
    with open(stem + ".md", "w") as f:
        f.write(table + "\n")
    click.echo(table)
    click.echo(f"wrote {output}, {stem}.csv, {stem}.md")


def _frontier_point(m, plan, label: str, measure_fn, say) -> tuple:
    """The frontier row of autoremat's plan for one budget (`measure_fn`: time it too)."""
    from autoremat.runtime._apply import apply

    peak = plan.meta.get("compiled_peak")
    if peak is None:
        peak = plan.predicted_peak
    step, flops = None, plan.meta.get("extra_flops")
    if measure_fn is not None:
        peak, step, _ = measure_fn(apply(m.fn, plan))
    extra = plan.estimated_extra_time or 0.0
    say(f"budget {label}: " + _point_words(peak, extra, flops, step))
    return ("autoremat", label, plan.budget, peak, plan.predicted_peak, extra, step, flops, "")


def _frontier_baselines(m, chain, how: tuple, measure_fn, rows: list, say):
    """The built-in policies per block, compiled (or predicted): their Pareto points, rows and
    the un-optimized step's measured time.  `how`: (measure, validate, the plot's y kind)."""
    from autoremat._plots import ParetoPoint, chain_problem
    from autoremat.runtime._apply import apply
    from autoremat.solver._chain import evaluate

    measure, validate, y_kind = how
    baselines, none_time, none_flops = [], None, None
    for label, option in BASELINES:
        segs, substituted = baseline_segments(chain, option)
        predicted, extra = evaluate(chain_problem(chain), segs)
        peak, step, flops = predicted, None, None
        if validate or measure:
            fn = m.fn if option is None else apply(m.fn, to_plan(chain, segs))
            peak, step, total = measure_fn(fn)
            none_flops = total if option is None else none_flops
            flops = total - none_flops
        if option is None:
            none_time = step
        note = f"{substituted} blocks without this option used their lowest-memory option" if substituted else ""
        rows.append(("baseline", label, None, peak, predicted, extra, step, flops, note))
        baselines.append(ParetoPoint(label, peak, {"measured": step, "flops": flops, "estimated": extra}[y_kind]))
        say(f"baseline {label}: " + _point_words(peak, extra, flops, step))
    return baselines, none_time


def _point_words(peak, extra: float, flops, step) -> str:
    """A frontier point in progress output: its peak, and the costs known of it."""
    return (f"peak {format_bytes(peak)}, +{extra * 1e3:.3g} ms estimated"
            + (f", +{flops / 1e9:.4g} GFLOP compiled" if flops is not None else "")
            + (f", {step * 1e3:.2f} ms measured" if step is not None else ""))


_COLUMNS = ("kind", "label", "budget_bytes", "peak_bytes", "predicted_peak_bytes", "estimated_extra_s",
            "measured_step_s", "recomputed_flops", "note")


def _write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(_COLUMNS)
        for r in rows:
            w.writerow(["" if v is None else (repr(v) if isinstance(v, float) else v) for v in r])


def _markdown(rows, *, validate: bool, none_time) -> str:
    peak_col = "compiled peak" if validate else "predicted peak"
    lines = [f"| kind | budget / policy | {peak_col} | predicted peak | est. extra time | measured step | "
             "recomputed GFLOP (compiled) | note |",
             "|---|---|---:|---:|---:|---:|---:|---|"]

    def b(v):
        return "" if v is None else format_bytes(v)

    for kind, label, budget, peak, predicted, extra, step, flops, note in rows:
        meas = ""
        if step is not None:
            meas = f"{step * 1e3:.2f} ms"
            if none_time:
                meas += f" ({step / none_time - 1:+.0%})"
        ex = "" if extra is None or (isinstance(extra, float) and math.isnan(extra)) else f"+{extra * 1e3:.3g} ms"
        name = label if budget is None else f"{label} ({format_bytes(budget)})"
        gflop = "" if flops is None else f"{flops / 1e9:.4g}"
        lines.append(f"| {kind} | {name} | {b(peak)} | {b(predicted)} | {ex} | {meas} | {gflop} | {note} |")
    return "\n".join(lines)


def _overhead_option(ctx, param, value):
    if value is None:
        return None
    text = value.strip()
    try:
        frac = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a fraction such as 10% or 0.1") from None
    if frac < 0:
        raise click.BadParameter(f"{value!r} is negative; give the extra FLOPs you accept, such as 10%")
    return frac


@main.command()
@_model_options
@click.option("--budget", "-b", required=True, help="Peak memory per device: 80GB, 7.5GiB, 512MiB or bytes.")
@click.option("--param", default="batch", show_default=True, metavar="NAME",
              help="The factory's keyword argument to vary (batch, seq, ...).")
@click.option("--min", "lo", default=1, show_default=True, type=click.IntRange(min=1), help="Smallest size.")
@click.option("--max", "hi", default=None, type=click.IntRange(min=1),
              help="Largest size [default: doubling until one does not fit].")
@click.option("--max-overhead", callback=_overhead_option, metavar="PCT",
              help="Accept a plan only if it recomputes at most this share of the step's FLOPs (10% or 0.1).")
@click.option("--device", metavar="PROFILE", help="Device profile for the time model [default: detected].")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def fit(model, example, sets, budget, param, lo, hi, max_overhead, device, quiet):
    """The largest --param (batch size, sequence length) whose training step fits --budget,
    as written and with autoremat's plan (compile-only with abstract arguments)."""
    from autoremat._fit import fit as fit_sizes

    spec, fixed = _spec(model, example), _parse_sets(sets)
    _check_device(device)
    if hi is not None and hi < lo:
        raise click.BadParameter(f"--max {hi} is below --min {lo}", param_hint="'--max'")
    budget = _budget_option(None, None, budget)
    if isinstance(budget, float) or budget == "auto":
        raise click.BadParameter("fit needs an absolute budget such as 80GB: the un-optimized peak changes "
                                 "with the size", param_hint="'--budget'")

    def factory(size):
        return load_model(spec, sets={**fixed, param: size})  # a LoadedModel: .fn, .args, .kwargs

    result = fit_sizes(factory, budget, lo=lo, hi=hi, max_overhead=max_overhead, device=device,
                       progress=_progress(quiet))
    click.echo(result.table())


@main.command()
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="Keep the demo plan in this file (default: nothing is written).")
@click.option("--budget", "-b", default=DEMO_BUDGET, show_default=True, callback=_budget_option,
              help="Budget for the demo search.")
@click.option("--example", default="transformer_scan", show_default=True, metavar="NAME",
              help="Built-in example to plan.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Knobs of the example (repeatable).")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def demo(output, budget, example, sets, quiet):
    """Plan the built-in scan-over-layers transformer for 60% of its memory and validate it."""
    from autoremat.examples import get_example

    ex = get_example(example, **_parse_sets(sets))
    click.echo(f"autoremat demo: {ex.description}")
    click.echo(f"budget {budget if isinstance(budget, str) else budget!r}"
               + (" (fraction of the un-optimized compiled peak)" if isinstance(budget, float) else ""))
    click.echo("")
    with tempfile.TemporaryDirectory() as scratch:
        path = output or os.path.join(scratch, DEMO_PLAN)
        _search(f"example:{example}", _parse_sets(sets), budget, path, quiet=quiet, n_steps=3, solver="dp",
                keep=bool(output))
    click.echo("")
    if output:
        click.echo(f"next: autoremat show {output}   |   autoremat export {output}")
    else:
        click.echo(f"the plan was not kept: `autoremat demo -o {DEMO_PLAN}` writes it, then "
                   f"`autoremat show {DEMO_PLAN}` / `autoremat export {DEMO_PLAN}`")


if __name__ == "__main__":  # pragma: no cover
    main()
