"""Real-scale, compile-only: how fast does autoremat say a budget cannot be met?  (issue 14)

Issue 14 asks for an infeasible answer within 60 s at 1B parameters, and for the lowest peak it
reports to be at most per-layer `nothing_saveable`'s (the leanest plan a person writes).  For
each `realscale.py` model (and, as `model:layout:batch scale`, `sharded.py`'s layouts on its
8-device host mesh and `unseen.py`'s models) this compiles `nothing_saveable` per layer by
hand, then plans at 80% of that compiled peak in a fresh process (nothing compiled before: the
time a user waits who asks for too little first), and records the planning time, the
whole-step compiles it made, and the lowest compiled peak the `InfeasibleBudgetError` names
(or the plan, if one fits).

    .venv/bin/python benchmarks/infeasible.py                  # every model below (~7 min)
    .venv/bin/python benchmarks/infeasible.py --models llama   # one
    .venv/bin/python benchmarks/infeasible.py --models moe:fsdp:8 llama1b:dp:1   # sharded ones

Writes `benchmarks/results/infeasible.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GiB = 2**30
FRACTION = 0.8  # of nothing_saveable per layer's compiled peak


def one(spec: str) -> dict:
    """In this process (`main` put this folder on the path): the hand-written peak, then the
    planner at FRACTION of it.  `spec`: model[:layout[:batch scale]]."""
    import importlib

    parts = spec.split(":")
    name, layout, scale = parts[0], (parts[1:] or [""])[0], (parts[2:] or ["1"])[0]
    sharded = importlib.import_module("sharded") if layout else None  # sets the host mesh first
    import autoremat

    autoremat.configure_cpu_flags()
    import _unseen
    import realscale
    from autoremat import _search
    from autoremat._errors import InfeasibleBudgetError
    from autoremat._optimize import plan_for
    from autoremat.runtime._validate import compiled_stats

    realscale.scale_batches(int(scale))
    _unseen.scale_batches(int(scale))

    def model(pols=None):
        fn, args, _, n = realscale.make_model(name, pols)
        if not layout:
            return fn, args, {}, n
        args, shardings = sharded.sharded(layout, *args, generic=name in sharded.GENERIC)
        return sharded.per_device(layout, fn), args, {"in_shardings": shardings}, n

    fn, args, kw, n = model()
    hand_fn, hand_args, _, _ = model(["nothing_saveable"] * n)
    hand = compiled_stats(hand_fn, *hand_args).peak_bytes
    compiles = []
    counted = _search.compile_step
    _search.compile_step = lambda *a, **k: compiles.append(1) or counted(*a, **k)
    budget = int(FRACTION * hand)
    t0 = time.perf_counter()
    try:
        planned = plan_for(fn, budget, args, **kw, progress=lambda m: print(f"  {time.perf_counter() - t0:6.1f} {m}",
                                                                      file=sys.stderr, flush=True))
        out = {"status": "fits", "peak": planned.plan.meta.get("compiled_peak"),
               "found_by": planned.plan.meta.get("found_by", "")}
    except InfeasibleBudgetError as e:
        out = {"status": "infeasible", "peak": e.lowest, "found_by": ""}
    return {**out, "name": spec, "hand": hand, "budget": budget, "time": time.perf_counter() - t0,
            "compiles": len(compiles)}


def main(argv=None) -> int:
    sys.path.insert(0, HERE)
    from _thirdparty import BUILDERS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # sharded (sharded.py's 8 host devices): the 1B decoder under FSDP and FSDP x TP, the per-device
    # decoder whose peak remat does not move, and three unseen models, two of whose policies compile
    # near together under FSDP (results/peak_sensitivity.md)
    every = ["llama", "llama_scan", "gpt", "gpt_scan", *BUILDERS, "llama1b:fsdp", "llama1b:fsdp_tp", "llama1b:dp:1",
             "moe:fsdp:8", "alternating:fsdp:8", "penzai:fsdp:8"]
    ap.add_argument("--models", nargs="+", default=every)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process's model
    ap.add_argument("--out", default=os.path.join(HERE, "results", "infeasible.md"))
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one)))
        return 0
    t0 = time.perf_counter()
    rows = []
    for name in a.models:
        print(f"{name}:", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name], check=True,
                              stdout=subprocess.PIPE, text=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name}: {r['status']} at {r['budget'] / GiB:.2f} GiB, lowest {r['peak'] / GiB:.2f} GiB "
              f"in {r['time']:.0f} s, {r['compiles']} compiles", file=sys.stderr, flush=True)
        rows.append(r)
    _write(a.out, "" if a.models == every else " --models " + " ".join(a.models), rows,
           (time.perf_counter() - t0) / 60)
    return 0


def _write(out: str, models: str, rows: list, minutes: float) -> None:
    import autoremat

    autoremat.configure_cpu_flags()
    from _common import provenance

    lines = ["# An infeasible budget at real scale, compile-only (issue 14)", "",
             provenance(f"python benchmarks/infeasible.py{models}", minutes), "",
             f"Budget: {FRACTION:.0%} of `nothing_saveable` per layer's compiled peak (argument + output + temp - "
             "alias of the compiled `value_and_grad` step), planned in a fresh process. 'lowest': the lowest "
             "compiled peak the planner found (named by its `InfeasibleBudgetError`), against the hand-written "
             "plan's; 'compiles': the whole-step compiles it made (the un-optimized step's not counted). A row "
             "`model:layout:scale` is sharded.py's layout on its 8-device host mesh (peaks per device), the "
             "model's batch times the scale.", "",
             "| model | nothing_saveable per layer GiB | budget GiB | answer | lowest GiB | lowest / hand | "
             "planning s | compiles |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        answer = "infeasible" if r["status"] == "infeasible" else f"fits: {r['found_by']}"
        lines.append(f"| {r['name']} | {r['hand'] / GiB:.2f} | {r['budget'] / GiB:.2f} | {answer} | "
                     f"{r['peak'] / GiB:.2f} | {r['peak'] / r['hand']:.3f} | {r['time']:.0f} | {r['compiles']} |")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
