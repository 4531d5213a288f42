"""CP-SAT's two region searches (`solver/_region.py`): which regions the first proves, and what
the second gives where it does not.

For every realscale.py and unseen.py model, the chain model is built (`build_chain_model`,
tracing only, no compile) and each region search is counted: how many first searches proved
their set optimal, the most deterministic and wall seconds one took, and how many second
searches ran.  Then, on the Griffin-style hybrid's scan body (`_unseen.griffin_scan`, the one
region the first search does not prove), each of the scan options' caps is solved as the
planner solves it, with its wall time, status and the roofline recompute time of its set, and
at four caps each search alone (the first alone with 2 s of wall time, as before 58aacae;
linearization level 2; eight interleaved workers) and the greedy.

    .venv/bin/python benchmarks/region_searches.py     # -> benchmarks/results/region_searches.md (~7 min)
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import realscale  # noqa: E402  (sets XLA:CPU's flags before JAX starts)
from _common import write_table  # noqa: E402
from _thirdparty import BUILDERS as THIRD  # noqa: E402
from _unseen import BUILDERS as UNSEEN  # noqa: E402
from ortools.sat.python import cp_model  # noqa: E402

from autoremat.graph import build_graph  # noqa: E402
from autoremat.solver import _region  # noqa: E402
from autoremat.solver._chain_model import build_chain_model  # noqa: E402
from autoremat.solver._peak_model import stored_residuals  # noqa: E402
from autoremat.solver._region_options import DEFAULT_CAPS, _region_problem, _solve_block_options  # noqa: E402
from autoremat.solver._scan_options import SCAN_CAPS  # noqa: E402

MODELS = ["llama", "llama_scan", "gpt", "gpt_scan", *THIRD, *UNSEEN]


def _counted(searches: list):
    """`_region._search`, recording (second?, status, wall s, deterministic s) of each search."""
    real = _region._search

    def search(model, deterministic_s, time_limit, **params):
        solver, status = real(model, deterministic_s, time_limit, **params)
        searches.append((bool(params), status, solver.wall_time, solver.deterministic_time))
        return solver, status
    return search


def model_rows(say) -> list[str]:
    rows = ["| model | first searches | proved | most deterministic s | most wall s | second searches | build s |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    searches: list = []
    _region._search = _counted(searches)
    for name in MODELS:
        searches.clear()
        t = time.perf_counter()
        fn, args, _, _ = realscale.make_model(name)
        build_chain_model(build_graph(fn, *args))
        first = [s for s in searches if not s[0]]
        proved = sum(s[1] == cp_model.OPTIMAL for s in first)
        row = (f"| {name} | {len(first)} | {proved} | {max((s[3] for s in first), default=0):.3f} | "
               f"{max((s[2] for s in first), default=0):.3f} | {len(searches) - len(first)} | {time.perf_counter() - t:.0f} |")
        say(row)
        rows.append(row)
    return rows


def griffin_body_rows(say) -> list[str]:
    """Each cap of the hybrid's scan body, solved as `_scan_options` solves it."""
    fn, args, _, _ = realscale.make_model("griffin_scan")
    g = build_graph(fn, *args)
    body = next(o for o in g.ops.values() if o.primitive == "scan").bodies[0]
    ops = list(body.ops.values())
    produced = frozenset(v for o in ops for v in o.outputs)
    residuals, _ = stored_residuals(body, ops)
    solved, real = [], _region.solve_region_cpsat

    def timed(problem, cap, time_limit=None):
        t = time.perf_counter()
        sol = real(problem, cap, time_limit=time_limit)
        solved.append((cap, time.perf_counter() - t, sol))
        return sol
    _region.solve_region_cpsat = timed
    t = time.perf_counter()
    _solve_block_options(body, ops, produced, residuals, sorted(set(DEFAULT_CAPS) | set(SCAN_CAPS)), "cpsat", 2.0)
    total = time.perf_counter() - t
    _region.solve_region_cpsat = real
    res = sum(body.values[v].nbytes for v in residuals if v in produced)
    rows = [f"The hybrid's scan body: {len(ops)} equations, {len(produced)} values; {len(solved)} caps in "
            f"{total:.1f} s.", "", "| cap (of the residual bytes) | wall s | status | recompute ms |",
            "|---:|---:|---|---:|"]
    for cap, dt, sol in solved:
        rows.append(f"| {cap / res:.0%} | {dt:.2f} | {sol.status} | {sol.recompute_time * 1e3:.1f} |")
    say("\n".join(rows))
    return rows + ["", "Each search alone at four caps of the same body:", ""] + compare_rows(
        _region_problem(body, ops, produced, residuals), res, say)


# (label, deterministic s, wall s, CP-SAT parameters) of one search alone, against the planner's two
SEARCHES = [("the first search alone, 2 s of wall time (before; load-dependent)", 1e9, 2.0, {}),
            ("linearization level 2, 1.0 deterministic s", 1.0, None, {"linearization_level": 2}),
            ("8 interleaved workers, 1.0 deterministic s", 1.0, None, {"interleave_search": True, "num_workers": 8})]


def _alone(det: float, wall, params: dict):
    """`_region._search` running one search with these bounds and parameters: the second search
    returns the first's result."""
    real, last = _region._search, []

    def search(model, deterministic_s, time_limit, **kw):
        if kw:
            return last[0]
        last[:] = [real(model, det, wall, **params)]
        return last[0]
    return search


def compare_rows(problem, res: int, say) -> list[str]:
    """At four caps of the hybrid's scan body: the planner's searches, each of `SEARCHES` alone, the greedy."""
    caps = (0.1, 0.3, 0.5, 0.8)
    rows = ["| search | " + " | ".join(f"{c:.0%}: recompute ms (wall s)" for c in caps) + " |",
            "|---|" + "---:|" * len(caps)]
    real = _region._search
    for label, det, wall, params in [("the planner's: 0.1 deterministic s, then 0.5 with level 2", None, None, {}),
                                     *SEARCHES]:
        _region._search = real if det is None else _alone(det, wall, params)
        cells = []
        for c in caps:
            t = time.perf_counter()
            sol = _region.solve_region_cpsat(problem, int(c * res), time_limit=2.0 if det is None else wall)
            cells.append(f"{sol.recompute_time * 1e3:.1f} ({time.perf_counter() - t:.1f})")
        _region._search = real
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
        say(rows[-1])
    cells = []
    for c in caps:
        t = time.perf_counter()
        sol = _region.solve_region_greedy(problem, int(c * res))
        cells.append(f"{sol.recompute_time * 1e3:.1f} ({time.perf_counter() - t:.1f})")
    rows.append("| the greedy | " + " | ".join(cells) + " |")
    say(rows[-1])
    return rows


def main() -> int:
    t0 = time.perf_counter()
    rows = model_rows(print) + [""] + griffin_body_rows(print)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "region_searches.md")
    write_table(out, "# CP-SAT's region searches on every benchmark model", "python benchmarks/region_searches.py",
                t0, rows, intro=__doc__.split("\n\n")[1].replace("\n", " "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
