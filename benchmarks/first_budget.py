"""Planning time at a real-scale model's first budget, for comparing two versions of the planner.

Planning times in `results/realscale.md` move with the machine's state (a shared 2-core CPU:
the same planner took 43 s and 55.5 s at Llama's first budget on two days).  This plans one
`realscale.py` model at per-layer `dots_saveable`'s compiled peak (the first budget there: the
graph, chain model and hand-written plans are all built for it) with the autoremat found under
`--root`, so two checkouts can be timed back to back:

    git worktree add /tmp/old <commit>
    .venv/bin/python benchmarks/first_budget.py --root /tmp/old   # the old planner
    .venv/bin/python benchmarks/first_budget.py                   # this checkout's
    git worktree remove /tmp/old

Prints the planning time and what the plan was found by; writes nothing.
"""

from __future__ import annotations

import sys
import time

from _common import checkout_args


def main(argv=None) -> int:
    a = checkout_args(__doc__.split("\n")[0], argv)
    import autoremat
    import realscale
    from autoremat._optimize import plan_for
    from autoremat.runtime._validate import compiled_stats

    fn, args, _, n = realscale.make_model(a.model)
    hand_fn, hand_args, _, _ = realscale.make_model(a.model, ["dots_saveable"] * n)
    budget = compiled_stats(hand_fn, *hand_args).peak_bytes
    t0 = time.perf_counter()
    planned = plan_for(fn, budget, args, progress=lambda m: None)
    print(f"{a.model} at dots_saveable's {budget / 2**30:.2f} GiB with {autoremat.__file__}: planned in "
          f"{time.perf_counter() - t0:.1f} s ({planned.plan.meta.get('found_by')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
