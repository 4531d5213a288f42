"""How far the step's compiled peak moves with what its layers store: JAX's two leanest policies.

`nothing_saveable` and `dots_with_no_batch_dims_saveable` per layer store different bytes (the
latter keeps its matmuls' outputs); where the step's peak comes while a layer's stored values are
live, their compiled peaks differ by about that much.  Where it comes elsewhere (the replicated
weights' gradients of a step written per device at one example a device), they compile to one
peak, and no mix or coarser region lowers it.  The planner tells the two apart by the share
below (`autoremat._hand.HandSearch.peak_fixed`, FIXED_PEAK_SHARE).

Each row: the two policies per layer, compiled as the planner compiles them (its first phase,
`HandSearch.uniform`, at a budget of one byte, stopped there), their compiled peaks, the bytes
their plans store apart (`HandSearch.saved_bytes`: the values saved inside the layers; a scan's
per iteration), and the share = peak difference / stored difference.  One process per row
(the sharded layouts need the host mesh before JAX starts), ~15 min on 2 cores:

    .venv/bin/python benchmarks/peak_sensitivity.py
    .venv/bin/python benchmarks/peak_sensitivity.py --rows llama1b:dp:1 gpt --out /tmp/s.md
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# model[:layout[:batch scale]]: realscale.py's, unseen.py's and sharded.py's models and layouts
ROWS = ("llama1b:dp:1", "llama1b:dp:8", "llama1b:fsdp", "llama1b:fsdp_tp", "llama", "llama_tags", "gpt",
        "equinox", "resnet_flax", "llama_scan", "gpt_scan", "flax_scan", "haiku_scan", "nnx_scan", "equinox_scan",
        "moe", "unet", "encdec", "vit_nnx", "alternating", "penzai", "penzai_scan", "ssd", "ssd_scan",
        "vjp_attention", "inner_checkpoint", "inner_checkpoint_scan", "alternating:fsdp:8", "moe:fsdp:8",
        "penzai:dp:8", "vit_nnx:dp:8")


INTRO = ("Per row, JAX's two leanest policies per layer compiled as the planner's first phase compiles them "
         "(`HandSearch.uniform`; sharded rows on 8 host devices, sharded.py's layouts), the bytes their plans "
         "store apart (`HandSearch.saved_bytes`: values saved inside the layers, a scan's per iteration), and "
         "share = peak apart / stored apart, least first. The planner takes a share under FIXED_PEAK_SHARE "
         "(`autoremat/_hand.py`) to mean the step's peak is set by what remat does not touch "
         "(`HandSearch.peak_fixed`).")


class _Stop(Exception):
    pass


def one(spec: str) -> dict:
    """The row of `spec`, measured in this process."""
    import importlib

    parts = spec.split(":")
    name, layout, scale = parts[0], (parts[1:] or [""])[0], (parts[2:] or ["1"])[0]
    sys.path.insert(0, HERE)
    sharded = importlib.import_module("sharded") if layout else None  # sets the host mesh first
    import _unseen
    import realscale

    realscale.scale_batches(int(scale))
    _unseen.scale_batches(int(scale))
    from autoremat import _hand
    from autoremat._optimize import plan_for

    lean, fast = _hand.HAND_POLICIES[:2]
    got = {}
    uniform = _hand.HandSearch.uniform

    def measured(self, plans, limit):
        uniform(self, plans, limit)
        got.update(peaks=[self.points[p].peak for p in (lean, fast)], stored=[self.saved_bytes[p] for p in (lean, fast)])
        raise _Stop

    _hand.HandSearch.uniform = measured
    fn, args, _, _ = realscale.make_model(name, None, True)
    kw = {}
    if layout:
        args, shardings = sharded.sharded(layout, *args, generic=name in sharded.GENERIC)
        fn, kw = sharded.per_device(layout, fn), {"in_shardings": shardings}
    try:
        plan_for(fn, 1, args, **kw)
    except _Stop:
        pass
    return {"spec": spec, **got}


def _cells(r: dict) -> str:
    (pa, pb), (sa, sb) = r["peaks"], r["stored"]
    share = f"{(pb - pa) / (sb - sa):.4f}" if sb != sa else "(store alike)"
    return f"| {r['spec']} | {pa / 2**30:.3f} | {pb / 2**30:.3f} | {pb - pa} | {sb - sa} | {share} |"


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", nargs="+", default=list(ROWS), help="model[:layout[:batch scale]]")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "peak_sensitivity.md"))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a row, in a process of its own
    a = ap.parse_args(argv)
    if a.one:  # realscale.py and sharded.py set XLA's flags before JAX starts
        print("ROW " + json.dumps(one(a.one)), flush=True)
        return 0
    t0, rows = time.perf_counter(), []
    for spec in a.rows:
        out = subprocess.run([sys.executable, __file__, "--one", spec], capture_output=True, text=True)
        found = [line[4:] for line in out.stdout.splitlines() if line.startswith("ROW ")]
        if not found:
            raise SystemExit(f"{spec}: no row\n{out.stderr[-2000:]}")
        rows.append(json.loads(found[0]))
        print(f"{time.perf_counter() - t0:7.1f} {_cells(rows[-1])}", flush=True)
    from _common import write_table

    cmd = "python benchmarks/peak_sensitivity.py" + ("" if a.rows == list(ROWS) else " --rows " + " ".join(a.rows))
    lean, fast = "nothing_saveable", "dots_with_no_batch_dims_saveable"
    head = [f"| model[:layout[:batch scale]] | {lean} GiB | {fast} GiB | peak apart, bytes | stored apart, bytes "
            "| share |", "|---|---|---|---|---|---|"]
    import autoremat

    autoremat.configure_cpu_flags()  # as each row's process had them (sharded rows: 8 host devices too)
    write_table(a.out, "# How far the compiled peak moves with what the layers store", cmd, t0,
                head + [_cells(r) for r in sorted(rows, key=_share)], intro=INTRO)
    return 0


def _share(r: dict) -> float:
    (pa, pb), (sa, sb) = r["peaks"], r["stored"]
    return (pb - pa) / (sb - sa) if sb != sa else -1.0


if __name__ == "__main__":
    sys.exit(main())
