"""How long the chain model takes to build, and to rebuild when `optimize` recalibrates it.

`optimize` builds a model's chain once, then, calibrated on the compiled un-optimized step,
once more with another `none_scale` (`_optimize._calibrated`), sharing one block cache.  This
traces one `realscale.py` model and times both builds with the autoremat found under `--root`,
so two checkouts can be compared back to back:

    git worktree add /tmp/old <commit>
    .venv/bin/python benchmarks/chain_build.py --root /tmp/old   # the old planner
    .venv/bin/python benchmarks/chain_build.py                   # this checkout's
    git worktree remove /tmp/old

Prints the two times and whether the rebuilt model's options equal a fresh build's at the same
scale (they must: the cache may only save time); writes nothing.
"""

from __future__ import annotations

import sys
import time

from _common import checkout_args


def _table(model) -> dict:
    return {k: [(o.name, o.stored_bytes, o.backward_bytes, o.extra_time, o.recompute_flops) for o in v]
            for k, v in model.problem.options.items()}


def main(argv=None) -> int:
    a = checkout_args(__doc__.split("\n")[0], argv)
    import autoremat
    import realscale
    from autoremat.graph import graph_from_traced
    from autoremat.graph._profiles import detect_profile
    from autoremat.graph._trace import trace
    from autoremat.solver._chain_model import build_chain_model

    fn, args, _, _ = realscale.make_model(a.model)
    traced = trace(fn, args, {}, argnums=0, static_argnums=(), has_aux=False, skip_integer_leaves=False)
    g = graph_from_traced(traced, profile=detect_profile())
    cache: dict = {}
    t0 = time.perf_counter()
    build_chain_model(g, offload=False, block_cache=cache)
    t1 = time.perf_counter()
    rebuilt = build_chain_model(g, offload=False, none_scale=1.5, block_cache=cache)
    t2 = time.perf_counter()
    same = _table(rebuilt) == _table(build_chain_model(g, offload=False, none_scale=1.5, block_cache={}))
    print(f"{a.model} with {autoremat.__file__}: first build {t1 - t0:.2f} s, rebuild at another scale "
          f"{t2 - t1:.2f} s; rebuilt options equal a fresh build's: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
