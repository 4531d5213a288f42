"""How well is a JAX policy's compiled peak expected before compiling it?

`HandSearch.uniform` (autoremat/_hand.py) compiles JAX's policies on every layer, fastest first,
and records the peak it expected of each before compiling it (`plan.meta["expected_peak"]`,
judged in benchmarks/realscale.py and sharded.py).  Before any policy is compiled that is the
chain model's peak c(p) of the policy on every layer (`autoremat._search.mix_curve`); after, it
leans on the leanest policy q compiled so far (the nearest in peak), compiled at C(q):

* ratio:      c(p) x C(q) / c(q)       (the rule until 2026-11-26)
* difference: C(q) + c(p) - c(q)       (`HandSearch._policy_expected` since)

and, not in the planner, two rules with no compiled policy before it (so also for the first),
from the compiled un-optimized step N and the model's peak of no remat on every layer c(none):

* un-optimized: N + c(p) - c(none)
* measured:   C(none) + m(p) - m(none), m = the chain formula over the layers on one layer's
  measurements under each option (`runtime._measure.measure_layer`: the layer compiled alone,
  and followed by the next; the blocks after the layers measured alone, left as they are), C(none)
  = N; where every layer is alike (one layer is measured), on one device.

This compiles each policy per layer (written by hand, `jax.checkpoint` around every layer) of
realscale.py's unrolled models, or of sharded.py's with `--layout`, and sets the rules against
the compiled peaks, q being the policy compiled just before p (fastest first).

    .venv/bin/python benchmarks/policy_expected.py          # writes results/policy_expected.md
    .venv/bin/python benchmarks/policy_expected.py --layout fsdp_tp --models llama1b \\
        --out benchmarks/results/policy_expected-fsdp_tp.md
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
LAYOUT = next((sys.argv[i + 1] for i, x in enumerate(sys.argv[:-1]) if x == "--layout"), None)
if LAYOUT:
    import sharded  # noqa: E402  (its 8-device host mesh, set before JAX starts)

import autoremat  # noqa: E402

autoremat.configure_cpu_flags()

import realscale  # noqa: E402
from _common import models_run, planner_model, write_results  # noqa: E402
from _measured import chain_formula, measure_options  # noqa: E402

from autoremat._search import mix_curve  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402

GiB = 2**30
MODELS = ("llama", "gpt", "equinox", "resnet_flax")
FASTEST_FIRST = tuple(reversed(realscale.POLICIES))


def _args(name: str, pols=None):
    fn, args, desc, n = realscale.make_model(name, pols)
    if LAYOUT:
        args, _ = sharded.sharded(LAYOUT, *args)
    return fn, args, desc, n


def measured(g, layers, none_peak: int, say) -> dict | None:
    """policy (None: no remat) -> `measured` rule's peak; None unless every layer is alike, and
    on the meshes (not measured there: a layer's compile would need the step's shardings)."""
    got = None if LAYOUT else measure_options(g, layers, (None, *FASTEST_FIRST))
    if got is None:
        return None
    meas, post = got
    m = {pol: chain_formula([x] * len(layers), post) for pol, x in meas.items()}
    say(f"measured one layer under each option: chain formula {', '.join(f'{v / GiB:.3f}' for v in m.values())} GiB")
    return {pol: none_peak + v - m[None] for pol, v in m.items()}


def model_rows(name: str, say) -> tuple[str, list]:
    """(description, rows): per policy, fastest first, (policy, model's peak, compiled peak,
    the policy before it or None, ratio rule, difference rule, measured rule or None,
    un-optimized rule)."""
    fn, args, desc, n = _args(name)
    g, layers, base, model = planner_model(fn, args, say)
    if len(layers) != n:
        say(f"{name}: {len(layers)} layers found, {n} written: skipped")
        return desc, []
    meas = measured(g, layers, base, say)
    c_none = mix_curve(model, layers, None, None)[-1]
    say(f"{name}: un-optimized step compiled {base / GiB:.3f} GiB, the model's no remat per layer {c_none / GiB:.3f}")
    rows, prev = [], None
    for pol in FASTEST_FIRST:
        c = mix_curve(model, layers, None, pol)[-1]
        hand_fn, hand_args, _, _ = _args(name, [pol] * n)
        got = compiled_stats(hand_fn, *hand_args).peak_bytes
        ratio = diff = c
        if prev is not None:
            q, cq, gq = prev
            ratio, diff = c * gq / cq, gq + c - cq
        rows.append((pol, c, got, prev[0] if prev else None, ratio, diff, meas and meas[pol], base + c - c_none))
        say(f"{name} {pol}: model {c / GiB:.3f}, compiled {got / GiB:.3f}, ratio {ratio / GiB:.3f}, "
            f"difference {diff / GiB:.3f}" + (f", measured {meas[pol] / GiB:.3f}" if meas else "") + " GiB")
        prev = (pol, c, got)
    return desc, rows


def _cell(v: float | None, got: int) -> str:
    return "" if v is None else f"{v / GiB:.3f} ({(v - got) / got:+.1%})"


def table(name: str, desc: str, rows: list) -> list[str]:
    out = [f"### {name}" + (f", {LAYOUT}" if LAYOUT else ""), "", desc, "",
           "| policy per layer | after | model GiB | compiled GiB | ratio GiB (error) | difference GiB (error) | "
           "measured GiB (error) | un-optimized GiB (error) |", "|---|---|---|---|---|---|---|---|"]
    for pol, c, got, q, ratio, diff, meas, unopt in rows:
        out.append(f"| {pol} | {q or '(first)'} | {c / GiB:.3f} | {got / GiB:.3f} | {_cell(ratio, got)} | "
                   f"{_cell(diff, got)} | {_cell(meas, got)} | {_cell(unopt, got)} |")
    return out + [""]


def summary(all_rows: list) -> list[str]:
    out = ["### Summary", "", "| rule | policies | within 5% | worst under | worst over |", "|---|---|---|---|---|"]
    after = [r for r in all_rows if r[3] is not None]
    for k, rule, rows, which in ((4, "ratio", after, "compiled after another"),
                                 (5, "difference", after, "compiled after another"),
                                 (6, "measured", after, "compiled after another"),
                                 (6, "measured", all_rows, "all"),
                                 (7, "un-optimized", all_rows, "all")):
        errs = [(r[k] - r[2]) / r[2] for r in rows if r[k] is not None]
        if errs:
            out.append(f"| {rule} | {which} | {sum(abs(x) <= 0.05 for x in errs)} of {len(errs)} | {min(errs):+.1%} | "
                       f"{max(errs):+.1%} |")
    return out + [""]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--layout" in argv:  # read above, before JAX started
        i = argv.index("--layout")
        del argv[i:i + 2]
    a, say, t0 = models_run(__doc__.split("\n")[0], MODELS, "policy_expected.md", argv)
    sections, all_rows = [], []
    for name in a.models:
        desc, rows = model_rows(name, say)
        sections += table(name, desc, rows)
        all_rows += rows
    write_results(a, say, t0, "policy_expected.py" + (f" --layout {LAYOUT}" if LAYOUT else ""), MODELS,
                  "A JAX policy's compiled peak, expected before compiling it",
                  "Compiled peak = argument + output + temp - alias (per device) of the compiled `value_and_grad` "
                  "step with the policy written by hand around every layer; model = the chain model's peak of that "
                  "plan (`mix_curve`), calibrated on the un-optimized step as the planner does.  The policies compile "
                  "fastest first; 'after' is the one compiled before.  Error = (expected - compiled) / compiled.",
                  summary(all_rows) + sections)
    return 0


if __name__ == "__main__":
    sys.exit(main())
