"""How long planning takes on a deep model, without compiling it (issue #6).

    .venv/bin/python benchmarks/solve_time.py            # 48-layer transformer, CPU and H100 profiles
    .venv/bin/python benchmarks/solve_time.py --layers 96 --budgets 0.8 0.5

Traces a `--layers`-layer unrolled transformer (small widths, so tracing is quick; the solver's
work depends on the number of blocks and options, not on the widths), then times:

1. graph build: trace to a jaxpr and build the dataflow graph (`build_graph`);
2. chain model: blocks, per-block region solves and region options (`build_chain_model`);
3. `solve` with method "auto" and "dp" at fractions of the predicted no-remat peak
   (`evaluate(model.problem, model.uniform("none"))`).

Parameters are shapes only (`jax.eval_shape`): nothing is compiled.  Results are printed and
appended to benchmarks/results/solve_time.md.
"""

from autoremat._xla import configure_cpu_flags

configure_cpu_flags()

import argparse  # noqa: E402
import datetime  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

from autoremat._errors import InfeasibleBudgetError  # noqa: E402
from autoremat.examples import transformer  # noqa: E402
from autoremat.graph._graph import build_graph  # noqa: E402
from autoremat._units import format_bytes  # noqa: E402
from autoremat.solver._chain import evaluate, lowest_peak  # noqa: E402
from autoremat.solver._chain_model import build_chain_model  # noqa: E402
from autoremat.solver._solve import solve  # noqa: E402

TARGET_S = 10.0


from _common import git_state  # noqa: E402  (benchmarks/ is sys.path[0] when run as a script)


def abstract_example(**knobs):
    """The example's loss and its arguments as `ShapeDtypeStruct`s (the initializer is traced only)."""
    holder = {}

    def make():
        ex = transformer(**knobs)
        holder["ex"] = ex
        return ex.args

    args = jax.eval_shape(make)
    return holder["ex"], args


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.9, 0.7, 0.5, 0.3],
                    help="fractions of the predicted no-remat peak")
    ap.add_argument("--profiles", nargs="+", default=["cpu", "h100"],
                    help="device profiles; offload options are on for every profile but cpu")
    ap.add_argument("--methods", nargs="+", default=["auto", "dp"])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "solve_time.md"))
    a = ap.parse_args(argv)

    knobs = dict(n_layers=a.layers, d_model=a.d_model, n_heads=2, seq=a.seq, batch=a.batch, vocab=128)
    t0 = time.perf_counter()
    ex, args = abstract_example(**knobs)
    t_example = time.perf_counter() - t0
    lines = [f"## {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}: "
             f"{a.layers}-layer transformer", "",
             f"`python benchmarks/solve_time.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
             f"{ex.description}.", "",
             f"Machine: {platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
             f"jax {jax.__version__}, autoremat {git_state()}.  Example (shapes only) built in {t_example:.2f} s.",
             ""]
    solve_times = []
    for prof in a.profiles:
        offload = prof != "cpu"
        t0 = time.perf_counter()
        g = build_graph(ex.fn, *args, profile=prof)
        t_graph = time.perf_counter() - t0
        t0 = time.perf_counter()
        model = build_chain_model(g, offload=offload)
        t_model = time.perf_counter() - t0
        none_peak = evaluate(model.problem, model.uniform("none"))[0]
        low = lowest_peak(model.problem)
        n_opts = sum(len(v) for v in model.problem.options.values())
        lines += [f"### profile {prof} (offload {'on' if offload else 'off'})", "",
                  f"{len(g.traced.jaxpr.eqns)} equations; graph build {t_graph:.2f} s; chain model "
                  f"{t_model:.2f} s ({model.problem.n_blocks} blocks, {len(model.problem.options)} regions, "
                  f"{n_opts} options); predicted no-remat peak {format_bytes(none_peak)}, lowest reachable "
                  f"{format_bytes(low)}.", "",
                  "| budget | method | solve s | status | solver | gap | predicted peak | extra ms |",
                  "|---|---|---:|---|---|---:|---:|---:|"]
        print(lines[-4], flush=True)
        for f in a.budgets:
            budget = int(f * none_peak)
            for method in a.methods:
                t0 = time.perf_counter()
                try:
                    r = solve(model.problem, budget, method=method)
                    dt = time.perf_counter() - t0
                    row = (f"| {f:g} ({format_bytes(budget)}) | {method} | {dt:.2f} | {r.status} | {r.solver} | "
                           f"{r.gap:.2%} | {format_bytes(r.peak_bytes)} | {r.objective * 1e3:.2f} |")
                except InfeasibleBudgetError as e:
                    dt = time.perf_counter() - t0
                    row = (f"| {f:g} ({format_bytes(budget)}) | {method} | {dt:.2f} | infeasible (lowest "
                           f"{format_bytes(e.lowest)}) | | | | |")
                solve_times.append(dt)
                lines.append(row)
                print(row, flush=True)
        lines.append("")
    worst = max(solve_times)
    lines += [f"Slowest solve: {worst:.2f} s (target <= {TARGET_S:g} s: {'met' if worst <= TARGET_S else 'MISSED'}).",
              ""]
    print(lines[-2])
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "a") as fh:
        fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
