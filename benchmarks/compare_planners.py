"""Planning time of two (or more) checkouts of the planner, back to back, on one real-scale model.

Planning times move with this shared machine's speed from day to day (the same 1B compiles took
twice as long on some days as on others: results/realscale.md's history), so a change to the
planner is timed against the planner before it in the same sitting: each checkout plans the
model at each of its hand-written peaks, loosest first, in one process (`budget_log.py`, as
realscale.py does), and the checkouts take turns, `--runs` times each.

    git worktree add /tmp/old <commit>
    .venv/bin/python benchmarks/compare_planners.py --roots /tmp/old . --model gpt --runs 2
    git worktree remove /tmp/old

Writes results/compare_planners-<model>.md (`--out`): per budget and checkout, the planning
seconds of each run, the whole-step compiles and what the plan was found by.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

import autoremat
from _common import git_state, provenance

autoremat.configure_cpu_flags()  # as the children (budget_log.py) do: the flags the results name

HERE = os.path.dirname(os.path.abspath(__file__))
_PLANNED = re.compile(r"^=== planned in ([0-9.]+) s \((.*)\)$")
_CHOSEN = re.compile(r"chosen: .*; (\d+) plans compiled for this budget$")
_BUDGET = re.compile(r"^=== \S+ at (.*)'s ([0-9.]+) GiB$")


def plan_once(root: str, model: str) -> list[tuple[str, float, int, str]]:
    """(budget label, planning s, compiles, found by) per budget: `budget_log.py` in a child
    process with `root`'s autoremat."""
    out = subprocess.run([sys.executable, os.path.join(HERE, "budget_log.py"), "--root", root, "--model", model],
                         capture_output=True, text=True, check=True).stdout
    rows, label, compiles = [], None, 0
    for line in out.splitlines():
        if (m := _BUDGET.match(line)):
            label = f"{m.group(1)} ({m.group(2)} GiB)"
        elif (m := _CHOSEN.search(line)):
            compiles = int(m.group(1))
        elif (m := _PLANNED.match(line)):
            rows.append((label, float(m.group(1)), compiles, m.group(2)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--roots", nargs="+", required=True, help="checkouts whose planners are timed")
    ap.add_argument("--model", default="gpt", help="a realscale.py model (default: gpt)")
    ap.add_argument("--runs", type=int, default=2, help="runs of each checkout, taking turns")
    ap.add_argument("--out", default=None, help="default: results/compare_planners-<model>.md")
    a = ap.parse_args(argv)
    out = a.out or os.path.join(HERE, "results", f"compare_planners-{a.model}.md")
    t0 = time.perf_counter()
    runs: dict[str, list] = {root: [] for root in a.roots}
    for i in range(a.runs):
        for root in a.roots:
            runs[root].append(plan_once(root, a.model))
            print(f"run {i + 1}, {root}: {sum(r[1] for r in runs[root][-1]):.1f} s", file=sys.stderr, flush=True)
    names = {root: f"`{root}` at {git_state(os.path.abspath(root))}" for root in a.roots}
    lines = [f"# Planning time, checkouts back to back: {a.model}", "",
             provenance(f"python benchmarks/compare_planners.py --roots {' '.join(a.roots)} --model {a.model} "
                        f"--runs {a.runs}", (time.perf_counter() - t0) / 60), "",
             "Each checkout plans at each hand-written peak, loosest first, in one process (budget_log.py); "
             "s: planning seconds of each run; compiles: whole-step compiles of the first run.", "",
             "| budget | " + " | ".join(f"{names[r]}: s (compiles)" for r in a.roots) + " |",
             "|---|" + "---|" * len(a.roots)]
    for j, (label, *_rest) in enumerate(runs[a.roots[0]][0]):
        cells = [" / ".join(f"{run[j][1]:.1f}" for run in runs[r]) + f" ({runs[r][0][j][2]})" for r in a.roots]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    totals = [" / ".join(f"{sum(x[1] for x in run):.1f}" for run in runs[r]) for r in a.roots]
    lines += ["| all budgets | " + " | ".join(totals) + " |", "", "Found by (first run):", ""]
    for r in a.roots:
        lines.append(f"- {names[r]}: " + "; ".join(x[3] for x in runs[r][0]))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
