"""How the model splits a sharded scan body's values and work over devices (docs/FINDINGS.md,
twenty-third session).  For `sharded.py`'s 8B Llama scan on each layout: how many of the body's
values XLA's layout (`graph._shardings.propagated_divisors`, read from each value's stack over
the iterations) splits how many ways, and the body's per-device FLOPs (its ops' sum times the trip
count) against the scan equation's own.  They should agree: the model's FLOPs are converted to
the compiled step's by one device share.  Prints; writes nothing.

    .venv/bin/python benchmarks/scan_body_shards.py
    PYTHONPATH=/tmp/old .venv/bin/python benchmarks/scan_body_shards.py   # another checkout's graph
    .venv/bin/python benchmarks/scan_body_shards.py --model penzai_scan --batch-scale 8 --layouts fsdp
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sharded = importlib.import_module("sharded")  # its 8-device host mesh, set before JAX starts
import realscale  # noqa: E402
import _unseen  # noqa: E402

import autoremat  # noqa: E402
from autoremat.graph._graph import graph_from_traced  # noqa: E402
from autoremat.graph._shardings import propagated_divisors  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama8b_scan", help="realscale.make_model's name")
    ap.add_argument("--batch-scale", type=int, default=1, help="every model's batch times this")
    ap.add_argument("--layouts", nargs="+", default=["fsdp", "fsdp_tp"], choices=("fsdp", "fsdp_tp"))
    a = ap.parse_args(argv)
    realscale.scale_batches(a.batch_scale)
    _unseen.scale_batches(a.batch_scale)
    print(f"autoremat from {os.path.dirname(autoremat.__file__)}")
    for layout in a.layouts:
        fn, args, _, _ = realscale.make_model(a.model)
        args, _ = sharded.sharded(layout, *args, generic=a.model in sharded.GENERIC)
        t = trace(fn, args, {}, argnums=(0,), static_argnums=(), has_aux=False, skip_integer_leaves=False)
        split = collections.Counter(f for k, f in propagated_divisors(t).items() if len(k) == 3)
        g = graph_from_traced(t)
        scan = next(op for op in g.ops.values() if op.primitive == "scan")
        body = sum(op.cost.flops for op in scan.bodies[0].ops.values()) * int(scan.params["length"])
        print(f"{layout}: body values by pieces {dict(sorted(split.items()))}; per-device TFLOP: scan "
              f"{scan.cost.flops / 1e12:.1f}, its body's ops {body / 1e12:.1f} ({body / scan.cost.flops:.2f}x)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
