"""Two-policy mixes of other shapes than the first half lean: does autoremat still win?  (issue 14)

`realscale.py`'s mixes put the leaner policy on the first half of the layers, the shape the
planner's mix search builds (`HandSearch.mix`: the faster policy on the last k layers).  People
write other shapes: every other layer checkpointed (torchtitan's selective activation
checkpointing by layer), the faster policy first, or half the layers left without remat.  This
compiles each such mix written by hand around the layers of an unrolled `realscale.py` decoder
(and of `_unseen.py`'s encoder-decoder, whose two halves differ: there the first half is the
encoder), then runs autoremat's planner at its compiled peak and compiles its plan: 'vs hand' says whether
that plan fits and recomputes no more matmul FLOPs.

    .venv/bin/python benchmarks/mix_shapes.py                 # llama, gpt, equinox, encdec (~12 min on 2 cores)
    .venv/bin/python benchmarks/mix_shapes.py --models gpt
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realscale  # noqa: E402  (sets XLA:CPU's flags before JAX starts)
from _common import models_run, write_results  # noqa: E402

from autoremat.runtime._validate import compiled_stats  # noqa: E402

GiB = 2**30
N, D, O = "nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable"
SHORT = {None: "no remat", N: "nothing", D: "dots_no_batch", O: "dots"}


def shapes(layers: int) -> list[tuple[str, list]]:
    """(label, policy per layer) of each mix shape."""
    h = layers // 2
    out = []
    for a, b in ((N, None), (N, D), (D, O)):
        out.append((f"alternating {SHORT[a]} / {SHORT[b]}", [a, b] * h + [a] * (layers - 2 * h)))
        out.append((f"alternating {SHORT[b]} / {SHORT[a]}", [b, a] * h + [b] * (layers - 2 * h)))
        out.append((f"first half {SHORT[b]}, rest {SHORT[a]}", [b] * h + [a] * (layers - h)))
    return out


def run_model(name: str, say, lines: list) -> None:
    fn, args, desc, layers = realscale.make_model(name)
    base = compiled_stats(fn, *args)
    none = (base.matmul_flops, base.jaxpr_flops)
    say(f"{name}: {desc}; no remat {base.peak_bytes / GiB:.2f} GiB")
    lines += [f"### {name}", "", desc + f"; no remat {base.peak_bytes / GiB:.2f} GiB", "",
              "| hand-written mix | hand GiB | hand +TFLOP | autoremat GiB | autoremat +TFLOP | planning s | "
              "compiles | found by | vs hand |", "|---|---|---|---|---|---|---|---|---|"]
    for label, pols in shapes(layers):
        hand_fn, hand_args, _, _ = realscale.make_model(name, pols)
        st = compiled_stats(hand_fn, *hand_args)
        hand = st.matmul_flops - none[0]
        r = realscale.autoremat_row(name, st.peak_bytes, none, say)
        if r["status"] != "ok":
            row = f"infeasible (lowest {r['lowest'] / GiB:.2f}) | | {r['time']:.0f} | | | **MORE** |"
        else:
            ok = r["peak"] <= st.peak_bytes and r["extra"] <= hand
            row = (f"{r['peak'] / GiB:.2f} | {r['extra'] / 1e12:.3f} | {r['time']:.0f} | {r['compiles']} | "
                   f"{r['found_by']} | {'no more' if ok else '**MORE**'} |")
        lines.append(f"| {label} | {st.peak_bytes / GiB:.2f} | {hand / 1e12:.3f} | {row}")
        say(f"  {lines[-1]}")
    lines.append("")


def main(argv=None) -> int:
    models = ("llama", "gpt", "equinox", "encdec")
    a, say, t0 = models_run(__doc__.split("\n")[0], models, "mix_shapes.md", argv)
    about = ("Compiled peak = argument + output + temp - alias of the compiled `value_and_grad` step; +TFLOP = "
             "its matmul FLOPs over no remat (recomputation included). 'alternating a / b': policy a on the "
             "first layer, b on the second, and so on; 'first half b, rest a': the faster (or no remat) "
             "first, the reverse of realscale.py's mixes. autoremat's planner runs at each hand-written mix's "
             "compiled peak, and its plan is compiled again here.")
    body: list[str] = []
    for name in a.models:
        run_model(name, say, body)
        write_results(a, say, t0, "mix_shapes.py", models, "Mixes of other shapes (issue 14)", about, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
