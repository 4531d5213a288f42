"""How well is a two-policy mix's compiled peak predicted before compiling it?

`HandSearch` (autoremat/_hand.py) finds how many of the last layers of a stack may take the
faster of two JAX policies (the rest the leaner one) within a budget; each count it tries is a
whole-step compile (5-12 s at 1B on this CPU).  Its first count comes from a prediction of the
mix's peak per count k.  This compiles, for each unrolled realscale.py model and each two
neighbouring policies, the mixes with k = 1, 2, 3, n/4, n/2, 3n/4, n-1 layers of the faster one
(written by hand, `jax.checkpoint` per layer; the small counts because near them the leaner
layers stop setting the peak, and there XLA's peak is not even monotone in k: docs/FINDINGS.md,
ninth session), and sets each against predictions made
from the two uniform plans' compiled peaks a (k = 0) and b (k = n) and the chain model's peak of
each count, c(k) (`autoremat._search.mix_curve`), and, as `HandSearch` does without a curve,
the bytes each policy stores per layer (JAX's: the per-layer plans' records, `policy_keeps`), s:

* fall:   b - (c(n) - c(k))                                  (the model's bytes, from b down)
* scaled: a + (c(k) - c(0)) * (b - a) / (c(n) - c(0))        (the model's shape, between a and b)
* linear: a + k / n * (b - a)
* bytes:  max(a, b - (n - k) * (s(fast) - s(lean)) / n)      (`HandSearch._first_count`'s step)

and, where every layer is alike, two from one layer measured under each policy (`_measured.py`:
the layer compiled alone and followed by the next, composed by the chain formula, M(k)), not
in the planner:

* measured fall: b - (M(n) - M(k))                           (the measured bytes, from b down)
* measured:      N + M(k) - M(none)                          (from the compiled un-optimized step N)

    .venv/bin/python benchmarks/mix_counts.py                          # writes results/mix_counts.md
    .venv/bin/python benchmarks/mix_counts.py --models equinox --out /tmp/m.md
"""

from __future__ import annotations

import os
import sys

import autoremat

autoremat.configure_cpu_flags()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realscale  # noqa: E402
from _common import models_run, planner_model, write_results  # noqa: E402
from _measured import chain_formula, measure_options  # noqa: E402

from autoremat._hand import layer_plan  # noqa: E402
from autoremat._search import mix_curve  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402

GiB = 2**30
MODELS = ("llama", "gpt", "equinox", "resnet_flax")
ESTIMATORS = ("fall", "scaled", "linear", "bytes", "measured fall", "measured")


def predictions(a: int, b: int, c: list, k: int, step: float) -> dict:
    n = len(c) - 1
    span = max(c[n] - c[0], 1)
    return {"fall": b - (c[n] - c[k]), "scaled": a + (c[k] - c[0]) * (b - a) / span, "linear": a + k / n * (b - a),
            "bytes": max(a, b - (n - k) * step)}


def model_rows(name: str, say) -> tuple[str, list]:
    """(description, rows): per pair and count, the compiled peak and each prediction."""
    fn, args, desc, n = realscale.make_model(name)
    g, layers, base, model = planner_model(fn, args, say)
    if len(layers) != n:
        say(f"{name}: {len(layers)} layers found, {n} written: skipped")
        return desc, []

    def peak(pols):
        hand_fn, hand_args, _, _ = realscale.make_model(name, pols)
        return compiled_stats(hand_fn, *hand_args).peak_bytes

    uniform = {p: peak([p] * n) for p in realscale.POLICIES}
    measured = measure_options(g, layers, (None, *realscale.POLICIES))
    stored = {p: sum(r.nbytes * r.multiplicity for r in layer_plan(g, layers, [p] * n).values.values()
                     if r.decision == "save") for p in realscale.POLICIES}
    rows = []
    for lean, fast in zip(realscale.POLICIES, realscale.POLICIES[1:]):
        a, b = uniform[lean], uniform[fast]
        curve = mix_curve(model, layers, lean, fast)
        if curve is None or b <= a:
            say(f"{name} {lean} / {fast}: {'no curve' if curve is None else 'the faster one is no higher'}: skipped")
            continue
        for k in sorted({1, 2, 3, n // 4, n // 2, 3 * n // 4, n - 1}):
            got = peak([lean] * (n - k) + [fast] * k)
            pred = predictions(a, b, curve, k, (stored[fast] - stored[lean]) / n)
            if measured is not None:
                meas, post = measured
                m = chain_formula([meas[lean]] * (n - k) + [meas[fast]] * k, post)
                pred["measured fall"] = b - (chain_formula([meas[fast]] * n, post) - m)
                pred["measured"] = base + m - chain_formula([meas[None]] * n, post)
            rows.append((lean, fast, n, k, got, pred))
            say(f"{name} {n - k} {lean} + {k} {fast}: compiled {got / GiB:.3f} GiB, "
                + ", ".join(f"{e} {v / GiB:.3f}" for e, v in rows[-1][5].items()))
    return desc, rows


def table(name: str, desc: str, rows: list) -> list[str]:
    out = [f"### {name}", "", desc, "",
           "| lean + fast | k of n | compiled GiB | " + " | ".join(f"{e} GiB (error)" for e in ESTIMATORS) + " |",
           "|---|---|---|" + "---|" * len(ESTIMATORS)]
    for lean, fast, n, k, got, pred in rows:
        cells = " | ".join(f"{pred[e] / GiB:.3f} ({(pred[e] - got) / got:+.1%})" if e in pred else ""
                           for e in ESTIMATORS)
        out.append(f"| {lean} + {fast} | {k} of {n} | {got / GiB:.3f} | {cells} |")
    return out + [""]


def summary(all_rows: list) -> list[str]:
    out = ["### Summary", "", "| estimator | mean abs error | worst under | worst over | over-predicted |",
           "|---|---|---|---|---|"]
    for e in ESTIMATORS:
        errs = [(pred[e] - got) / got for *_, got, pred in all_rows if e in pred]
        if errs:
            out.append(f"| {e} | {sum(map(abs, errs)) / len(errs):.2%} | {min(errs):+.1%} | {max(errs):+.1%} | "
                       f"{sum(x > 0 for x in errs)} of {len(errs)} |")
    return out + [""]


def main(argv=None) -> int:
    a, say, t0 = models_run(__doc__.split("\n")[0], MODELS, "mix_counts.md", argv)
    sections, all_rows = [], []
    for name in a.models:
        desc, rows = model_rows(name, say)
        sections += table(name, desc, rows)
        all_rows += rows
    write_results(a, say, t0, "mix_counts.py", MODELS, "A two-policy mix's compiled peak, predicted before compiling it",
                  "Compiled peak = argument + output + temp - alias of the compiled `value_and_grad` step of the mix "
                  "written by hand (the first n - k layers under the leaner policy, the last k under the faster). "
                  "Predictions from the uniform plans' compiled peaks a (k = 0), b (k = n) and the chain model's "
                  "peak per count c(k): fall = b - (c(n) - c(k)); scaled = a + (c(k) - c(0)) (b - a) / (c(n) - c(0)); "
                  "linear = a + k/n (b - a); bytes = max(a, b - (n - k) (s(fast) - s(lean)) / n), s = the bytes JAX stores "
                  "under a policy per layer, over the stack; measured fall = b - (M(n) - M(k)) and measured = N + M(k) - "
                  "M(none), M = the chain formula on one layer measured under each policy (alike layers only), N the "
                  "compiled un-optimized step.  Error = (predicted - compiled) / compiled.", summary(all_rows) + sections)
    return 0


if __name__ == "__main__":
    sys.exit(main())
