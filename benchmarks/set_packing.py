"""Why does the region solver's set at a policy's own bytes compile above the policy?

`benchmarks/results/policy_bytes.md`: per layer, the region solver's set capped at the bytes of
the outputs `dots_with_no_batch_dims_saveable` may save recomputes half that policy's matmul
FLOPs on the 1B decoders, and compiles 4-5% above it.  This measures, on the Llama decoder of
`realscale.py`:

* the set's matmul FLOPs at caps below those bytes (the region problem's count, no compile):
  whether a smaller set could win and fit; and the bytes JAX stores of the policy
  (`_layer_options.policy_keeps`: not the outputs its backward never reads);
* at a few depths, the policy and the set per layer compiled with XLA's dumps
  (`xla_dump_to`, per compile): the compiled peak (argument + output + temp - alias), the
  temp allocation XLA reports, and the bytes of the buffers live at its heap simulator's peak
  (the "Live ranges at ... (peak)" list of the live-range dump), beside the bytes the set
  stores beyond what JAX stores of the policy.  Where the compiled peaks differ and the live
  bytes do not, the difference is how XLA packs buffers, not what is kept.

Writes results/set_packing.md (~2 min on 2 cores):

    .venv/bin/python benchmarks/set_packing.py
    .venv/bin/python benchmarks/set_packing.py --depths 2 --out /tmp/s.md
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import tempfile
import time

import autoremat

autoremat.configure_cpu_flags()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realscale  # noqa: E402
from _common import provenance  # noqa: E402
from policy_bytes import MiB, solve_at_policy_bytes  # noqa: E402

import jax  # noqa: E402

from autoremat._hand import layer_plan  # noqa: E402
from autoremat._layer_options import _shift, policy_keeps  # noqa: E402
from autoremat._optimize import _graph  # noqa: E402
from autoremat.graph._profiles import detect_profile  # noqa: E402
from autoremat.graph._trace import trace  # noqa: E402
from autoremat.runtime import apply  # noqa: E402
from autoremat.runtime._validate import MEMORY_ONLY_CPU_OPTIONS  # noqa: E402

POLICY = "dots_with_no_batch_dims_saveable"
FRACTIONS = (1.0, 0.95, 0.9, 0.8, 0.7, 0.5)


def cap_rows(g, layer_ops, n: int) -> list[str]:
    """The set's bytes and the stack's recomputed matmul FLOPs at fractions of the policy's bytes."""
    rows = []
    for f in FRACTIONS:
        policy_bytes, set_bytes, _, policy_flops, set_flops = solve_at_policy_bytes(g, layer_ops, POLICY, f)
        if not rows:
            stored = sum(g.values[v].nbytes for v in policy_keeps(g, layer_ops, POLICY))
            rows.append(f"| the policy, what it may save | {policy_bytes / MiB:.1f} | {n * policy_flops / 1e12:.3f} |")
            rows.append(f"| the policy, what JAX stores of it (`policy_keeps`) | {stored / MiB:.1f} | "
                        f"{n * policy_flops / 1e12:.3f} |")
        rows.append(f"| set at {f:.2f} x its bytes | {set_bytes / MiB:.1f} | {n * set_flops / 1e12:.3f} |")
    return rows


def dumped(fn, args) -> tuple[int, int, int]:
    """(compiled peak, XLA's temp bytes, bytes live at the heap simulator's peak) of the step."""
    with tempfile.TemporaryDirectory() as d:
        lowered = jax.jit(jax.value_and_grad(fn)).trace(*args).lower()
        m = lowered.compile({**MEMORY_ONLY_CPU_OPTIONS, "xla_dump_to": d}).memory_analysis()
        peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
        live_file = max(glob.glob(os.path.join(d, "*after_optimizations-live-range.txt")), key=os.path.getsize)
        text = open(live_file).read()
    at_peak = text[text.index("(peak):"):]
    live = sum(int(b) for b in re.findall(r": (\d+) bytes \(cumulative", at_peak))
    return peak, m.temp_size_in_bytes, live


def depth_rows(depth: int, say) -> list[str]:
    fn, args, _, n = realscale.make_model("llama", n_layers=depth)
    g, layers = _graph(trace(fn, args, {}, skip_integer_leaves=False), detect_profile(), say)
    ops = list(g.ops.values())
    first = layers[0]
    layer_ops = ops[first.start:first.stop]
    saved = solve_at_policy_bytes(g, layer_ops, POLICY)[2]
    stored = sum(g.values[v].nbytes for v in saved) - sum(g.values[v].nbytes for v in policy_keeps(g, layer_ops, POLICY))
    sets = [_shift(g, saved, la.start - first.start) for la in layers]
    got = {}
    for label, plan in (("policy", layer_plan(g, layers, [POLICY] * n)), ("set", layer_plan(g, layers, sets))):
        got[label] = dumped(apply(fn, plan), args)
        say(f"{depth} layers, {label}: " + ", ".join(f"{x / MiB:.1f}" for x in got[label]) + " MiB")
    (pp, pt, pl), (sp, st, sl) = got["policy"], got["set"]
    return [f"| {depth} | {pp / MiB:.1f} / {sp / MiB:.1f} | {(sp - pp) / MiB:+.1f} | {pt / MiB:.1f} / {st / MiB:.1f} | "
            f"{pl / MiB:.1f} / {sl / MiB:.1f} | {(sl - pl) / MiB:+.1f} | {depth * stored / MiB:+.1f} |"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depths", nargs="+", type=int, default=[2, 4, 18])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "set_packing.md"))
    a = ap.parse_args(argv)
    t0 = time.perf_counter()

    def say(m):
        print(f"{time.perf_counter() - t0:7.1f} {m}", flush=True)

    fn, args, desc, n = realscale.make_model("llama")
    g, layers = _graph(trace(fn, args, {}, skip_integer_leaves=False), detect_profile(), say)
    ops = list(g.ops.values())
    caps = cap_rows(g, ops[layers[0].start:layers[0].stop], n)
    depths = [row for d in a.depths for row in depth_rows(d, say)]
    cmd = "python benchmarks/set_packing.py" + ("" if a.depths == [2, 4, 18] else " --depths "
                                                 + " ".join(map(str, a.depths)))
    body = [f"# The solver's set at {POLICY}'s bytes: what XLA keeps and what it allocates", "",
            provenance(cmd, (time.perf_counter() - t0) / 60), "", desc + ".", "",
            "## Smaller caps", "",
            f"The region solver (CP-SAT, least recompute time) per layer at fractions of the bytes of the outputs "
            f"{POLICY} may save in the layer (`policy_saves`, the planner's `ilp@` cap); matmul FLOPs recomputed "
            "over the stack (the region problem's count). JAX stores fewer: not the outputs the backward never "
            "reads (`policy_keeps`).", "",
            "| per layer | bytes MiB | +TFLOP matmul |", "|---|---|---|", *caps, "",
            "## Compiled at a few depths", "",
            f"{POLICY} per layer against the set at its bytes per layer, the same decoder at other depths. Peak = "
            "argument + output + temp - alias; temp = XLA's temp allocation; live = the bytes of the buffers live "
            "at the heap simulator's peak (XLA's live-range dump); stored (model) = the set's bytes less the "
            "policy's stored bytes (`policy_keeps`), per layer times the layers. All MiB, policy / set.", "",
            "| layers | compiled peak | set - policy | temp | live at XLA's peak | set - policy, live | "
            "set - policy, stored (model) |",
            "|---|---|---|---|---|---|---|", *depths, ""]
    with open(a.out, "w") as f:
        f.write("\n".join(body))
    say(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
