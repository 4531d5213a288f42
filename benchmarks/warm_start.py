"""Planning again in a new process: cold, then with the compile cache the first run filled.

A training script that restarts, or a user who plans once more at the same budget, starts a new
process: the graph, the chain model and every whole-step compile are made again.  The compile
cache (autoremat/runtime/_compile_cache.py) keeps what XLA said about each program the planner
compiled, so the second process traces and lowers each plan but compiles none of them.  For each
model and budget this runs `plan_for` in a fresh process with an empty cache directory, then in
another process with the same directory, and reports both planning times and whether the plan
is the same:

    .venv/bin/python benchmarks/warm_start.py                  # ~8 min on a 2-core CPU
    .venv/bin/python benchmarks/warm_start.py --models llama --budgets 10.75

Writes benchmarks/results/warm_start.md (or --out).  Every other benchmark plans cold
(benchmarks/_common.py turns the cache off).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# (realscale.py model, sharded.py layout or None, budgets in GiB): near the per-layer policies'
# and the 9 + 9 mix's compiled peaks of results/realscale.md and results/sharded.md, as a user
# would write them
CASES = {"llama": (None, (13.4, 10.75, 9.5)), "llama1b": ("fsdp", (6.7, 6.05, 5.75))}


def child(model: str, layout: str | None, budget: float, cache: str) -> None:
    """Plan once in this process with the compile cache in `cache`; print one JSON line."""
    sharded = None
    if layout:
        import sharded  # its 8-device host mesh, set before JAX starts
    import realscale  # noqa: F401 - sets XLA:CPU's flags

    from _common import git_state  # turns the cache off: turned on again below, for this run

    os.environ["AUTOREMAT_CACHE_DIR"] = cache
    from autoremat._optimize import plan_for

    fn, args, _, _ = realscale.make_model(model)
    kw = {}
    if sharded is not None:
        args, shardings = sharded.sharded(layout, *args, generic=model in sharded.GENERIC)
        kw = {"in_shardings": shardings}
    t0 = time.perf_counter()
    plan = plan_for(fn, int(budget * 2**30), args, **kw).plan
    print(json.dumps({"time": time.perf_counter() - t0, "found_by": plan.meta.get("found_by"),
                      "peak": plan.meta.get("compiled_peak"), "flops": plan.meta.get("extra_matmul_flops"),
                      "compiles": plan.meta.get("compiles"), "cached": plan.meta.get("cached_compiles"),
                      "commit": git_state()}))


def _run(model: str, layout: str | None, budget: float, cache: str) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", model, layout or "-", str(budget),
                          cache], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{model} at {budget} GiB failed:\n{out.stderr[-3000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "process": time.perf_counter() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--budgets", nargs="+", type=float, default=None, help="GiB (default: each model's three)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "warm_start.md"))
    ap.add_argument("--child", nargs=4, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        model, layout, budget, cache = a.child
        child(model, None if layout == "-" else layout, float(budget), cache)
        return 0
    from _common import provenance

    from autoremat._xla import configure_cpu_flags

    configure_cpu_flags()  # the children's flags (they set them too), for the provenance line
    t0, rows = time.perf_counter(), []
    for model in a.models:
        layout, budgets = CASES[model]
        for budget in a.budgets or budgets:
            with tempfile.TemporaryDirectory() as cache:
                cold = _run(model, layout, budget, cache)
                warm = _run(model, layout, budget, cache)
            same = all(cold[k] == warm[k] for k in ("found_by", "peak", "flops", "compiles"))
            print(f"{model} {layout or ''} {budget} GiB: cold {cold['time']:.1f} s ({cold['compiles']} compiles), "
                  f"warm {warm['time']:.1f} s ({warm['cached']} read back), same plan: {same}", flush=True)
            rows.append(f"| {model}{', ' + layout if layout else ''} | {budget} | {cold['found_by']} | "
                        f"{cold['peak'] / 2**30:.2f} | {cold['compiles']} | {cold['time']:.1f} | {cold['process']:.1f} | "
                        f"{warm['cached']} | {warm['time']:.1f} | {warm['process']:.1f} | {'yes' if same else '**no**'} |")
    cmd = "python benchmarks/warm_start.py" + ("" if a.models == list(CASES) else " --models " + " ".join(a.models))
    cmd += "" if a.budgets is None else " --budgets " + " ".join(map(str, a.budgets))
    with open(a.out, "w") as f:
        f.write("\n".join([
            "# Planning again in a new process: the compile cache", "",
            provenance(cmd, (time.perf_counter() - t0) / 60), "",
            "Each budget planned by `plan_for` in a fresh process with an empty compile cache (cold), then in "
            "another fresh process with the cache the first filled (warm). 'planning s': `plan_for` alone "
            "(tracing, the graph, the chain model, the un-optimized step's compile and the search); 'process s': "
            "the whole process, Python and JAX's imports and the model's construction included. 'read back': "
            "the warm run's whole-step compiles answered from the cache. 'same plan': the same plan, compiled "
            "peak, matmul FLOPs and compile count both times. The FSDP rows run on `sharded.py`'s 8-device host mesh "
            "(its XLA_FLAGS add `--xla_force_host_platform_device_count=8`).", "",
            "| model | budget GiB | plan | compiled GiB | compiles | cold planning s | cold process s | read back | "
            "warm planning s | warm process s | same plan |",
            "|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
