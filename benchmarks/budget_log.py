"""A timed log of planning one real-scale model at each of its hand-written peaks, in one process.

`benchmarks/realscale.py` gives one planning time per budget; this shows where it goes.  Each
of the model's per-layer policies (and, unrolled, the half-and-half mixes) is compiled for its
peak, then `plan_for` plans at those peaks, loosest first, in one process (as realscale.py
does: later budgets reuse the graph, the chain model and the plans compiled before), and every
progress line is printed with the seconds since that budget's planning began:

    .venv/bin/python benchmarks/budget_log.py --model gpt
    .venv/bin/python benchmarks/budget_log.py --root /tmp/old   # another checkout's planner
    .venv/bin/python benchmarks/budget_log.py --only mix         # the budgets whose label has "mix"
    .venv/bin/python benchmarks/budget_log.py --model llama1b --layout fsdp_tp   # sharded.py's
    .venv/bin/python benchmarks/budget_log.py --model llama8b_scan --layout fsdp --budget 557.58  # one budget
    .venv/bin/python benchmarks/budget_log.py --model penzai --layout fsdp --batch-scale 8 \
        --only "nothing_saveable per layer" --bytes     # and every compiled plan's peak in bytes

Writes nothing.
"""

from __future__ import annotations

import importlib
import sys
import time

from _common import checkout_args


def _options(ap) -> None:
    ap.add_argument("--only", default="", help="plan only at the hand-written plans whose label contains this")
    ap.add_argument("--budget", type=float, default=None,
                    help="GiB: plan at this budget alone, not at the hand-written plans' peaks")
    ap.add_argument("--layout", default=None, choices=("fsdp", "fsdp_tp", "dp"),
                    help="sharded.py's layout on its 8-device host mesh (models llama1b, llama8b_scan; "
                         "unseen.py's with fsdp)")
    ap.add_argument("--batch-scale", type=int, default=1, help="every model's batch times this")
    ap.add_argument("--bytes", action="store_true",
                    help="after each budget, every plan compiled so far: its peak in bytes against the budget")


def main(argv=None) -> int:
    a = checkout_args(__doc__.split("\n")[0], argv, _options)
    # sharded.py's 8-device host mesh (set before JAX starts) and its models
    sharded = importlib.import_module("sharded") if a.layout else None
    import _unseen
    import realscale
    from autoremat import _search
    from autoremat._optimize import plan_for

    realscale.scale_batches(a.batch_scale)
    _unseen.scale_batches(a.batch_scale)
    from autoremat.runtime._validate import compiled_stats

    def model(pols=None, cse=True):
        """(fn, args, plan_for keywords): sharded like sharded.py with --layout."""
        fn, args, _, _ = realscale.make_model(a.model, pols, cse)
        if not a.layout:
            return fn, args, {}
        args, shardings = sharded.sharded(a.layout, *args, generic=a.model in sharded.GENERIC)
        return sharded.per_device(a.layout, fn), args, {"in_shardings": shardings}

    budgets = [] if a.budget is None else [(int(a.budget * 2**30), f"--budget {a.budget}")]
    for label, pols, cse in realscale.hand_variants(a.model)[1:] if a.budget is None else ():
        # a scan's prevent_cse=False variants compile to the same peaks (realscale.md)
        if cse and a.only in label:
            fn, args, _ = model(pols, cse)
            budgets.append((compiled_stats(fn, *args).peak_bytes, label))
    fn, args, kw = model()
    for budget, label in sorted(budgets, reverse=True):
        t0 = time.perf_counter()
        print(f"=== {a.model}{' ' + a.layout if a.layout else ''} at {label}'s {budget / 2**30:.2f} GiB", flush=True)
        planned = plan_for(fn, budget, args, **kw,
                           progress=lambda m: print(f"{time.perf_counter() - t0:6.1f} {m}", flush=True))
        print(f"=== planned in {time.perf_counter() - t0:.1f} s ({planned.plan.meta.get('found_by')})", flush=True)
        for key, c in (_search._COMPILED.items() if a.bytes else ()):
            print(f"    {c.plan.meta.get('found_by') or key[1]}: {c.peak} bytes ({c.peak - budget:+d}), "
                  f"+{c.matmul / 1e12:.3f} matmul TFLOP", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
