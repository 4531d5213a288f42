"""Real-scale, compile-only: does autoremat beat hand-written policies at >= 1B parameters?  (issue 14)

Models (bf16, abstract `jax.ShapeDtypeStruct` arguments: nothing is allocated; XLA's
`memory_analysis` of the compiled `value_and_grad` step is the judge, docs/FACTS.md fact 11):

* `llama`: Llama-style decoder, RMSNorm / SwiGLU / rotary positions, 18 layers, d_model 2048,
  d_ff 5632, vocab 32000, seq 2048, batch 4 (1.06B parameters); unrolled, and `llama_scan`: the
  same layers stacked and run by `lax.scan`.
* `gpt`: GPT-style decoder, LayerNorm / GELU / learned positions, 24 layers, d_model 2048,
  d_ff 8192, vocab 50304, seq 1024, batch 8 (1.42B parameters); `gpt_scan` likewise.
* `llama_tags` (and `llama_tags_scan`): `llama` with MaxText's `checkpoint_name` tags (not run by
  default): its hand-written rows add MaxText's presets per layer (`PRESETS`), and autoremat
  plans at each one's peak too (`--models llama_tags llama_tags_scan --out
  benchmarks/results/presets.md`).
* written with third-party libraries' own layer code and remat wrappers (`_thirdparty.py`, needs
  `pip install -e .[bench]`): `flax_scan` (flax linen, `nn.scan` + `nn.remat`), `haiku_scan`
  (`hk.layer_stack` + `hk.remat`), `equinox` (unrolled, `eqx.filter_checkpoint`), all 0.74B
  parameters, and `resnet_flax` (ResNet-50, flax linen, 224 x 224, batch 64).

Rows, per model: no remat; each JAX policy written by hand around every layer
(`jax.checkpoint(layer, policy=...)`; inside the scan around the body, with JAX's default
`prevent_cse=True` and with `prevent_cse=False` as MaxText writes it); unrolled, two two-policy
mixes, whose peaks lie between the policies' (the first half of the layers `nothing_saveable`,
the rest `dots_with_no_batch_dims_saveable`; the first half that one, the rest `dots_saveable`);
then `autoremat.optimize`'s planner at each of those compiled peaks and, for a scan (one layer:
no mixes), halfway between each two neighbouring policies' peaks, judged against the best
hand-written plan within that budget (`between_budgets`).
autoremat's plan is compiled again here, apart from the planner.

Extra FLOPs: the step's jaxpr FLOPs minus the un-optimized step's (recomputation included, a
scan body times its trip count): of its matmuls (`CompiledStats.matmul_flops`, what the verdict
compares: the equations around them change with how a step was staged) and in all
(`CompiledStats.jaxpr_flops`).

    .venv/bin/python benchmarks/realscale.py                  # all models (~11 min on 2 cores)
    .venv/bin/python benchmarks/realscale.py --models llama   # one model
    python benchmarks/realscale.py --models llama --batch-scale 3 --out ...  # batch x3 (on a GPU: fill it)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import autoremat

autoremat.configure_cpu_flags()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import expected_cell, provenance  # noqa: E402
from _thirdparty import BUILDERS, DEC, RESNET  # noqa: E402
from _unseen import BUILDERS as UNSEEN  # noqa: E402

from jax.ad_checkpoint import checkpoint_name  # noqa: E402

from autoremat._errors import InfeasibleBudgetError  # noqa: E402
from autoremat._optimize import plan_for  # noqa: E402
from autoremat._presets import SAVED_NAMES  # noqa: E402
from autoremat.examples import MAXTEXT_PRESETS  # noqa: E402
from autoremat.runtime import apply  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402

GiB = 2**30
POLICIES = ("nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable")
# MaxText's `remat_policy` presets by name (`autoremat.examples.MAXTEXT_PRESETS`), written per layer
# on the models with its tags; not "full" (`nothing_saveable`) nor the offloaded ones (host memory).
PRESETS = tuple(SAVED_NAMES)
TAGGED = ("llama_tags",)  # families with MaxText's `checkpoint_name` tags
bf = jnp.bfloat16
sd = jax.ShapeDtypeStruct
PLANNER_LOG = lambda m: None  # noqa: E731  (--planner-log: the planner's progress to stderr)
ASCENDING = False  # --ascending: the budgets from the lowest up (a run cut short then has the lean end)


def rms(x, w):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(bf) * w


def layer_norm(x, w, b):
    x32 = x.astype(jnp.float32)
    mu = jnp.mean(x32, -1, keepdims=True)
    var = jnp.mean((x32 - mu) ** 2, -1, keepdims=True)
    return ((x32 - mu) * jax.lax.rsqrt(var + 1e-5)).astype(bf) * w + b


def rope(x):  # [B, S, H, Dh]
    dh = x.shape[-1] // 2
    freq = 1.0 / (10000 ** (jnp.arange(dh, dtype=jnp.float32) / dh))
    ang = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(ang)[None, :, None, :].astype(bf), jnp.sin(ang)[None, :, None, :].astype(bf)
    x1, x2 = x[..., :dh], x[..., dh:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def attention(q, k, v):
    S, dh = q.shape[1], q.shape[-1]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.asarray(dh, bf))
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, jnp.asarray(-1e4, bf))
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s.astype(jnp.float32), -1).astype(bf), v)


def llama_layer(h, p, H, tag=lambda x, name: x):
    B, S, D = h.shape
    x = rms(h, p["ln1"])
    q, k = (rope(tag(x @ p[w], n).reshape(B, S, H, D // H)) for w, n in (("wq", "query_proj"), ("wk", "key_proj")))
    v = tag(x @ p["wv"], "value_proj").reshape(B, S, H, D // H)
    h = h + tag(tag(attention(q, k, v).reshape(B, S, D), "context") @ p["wo"], "out_proj")
    x = rms(h, p["ln2"])
    return h + tag((jax.nn.silu(tag(x @ p["wg"], "mlpwi")) * tag(x @ p["wu"], "mlpwi")) @ p["wd"], "mlpwo")


def llama_tags_layer(h, p, H):
    """`llama_layer` with MaxText's `checkpoint_name` tags (`autoremat.examples.TRANSFORMER_TAGS`):
    the q, k and v projections, the attention output before and after its projection, both MLP
    inputs (MaxText's `mlpwi`) and the MLP output, as MaxText's Llama decoder names them."""
    return llama_layer(h, p, H, checkpoint_name)


def gpt_layer(h, p, H):
    B, S, D = h.shape
    x = layer_norm(h, p["ln1_w"], p["ln1_b"])
    qkv = (x @ p["wqkv"] + p["bqkv"]).reshape(B, S, 3, H, D // H)
    h = h + attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]).reshape(B, S, D) @ p["wo"] + p["bo"]
    x = layer_norm(h, p["ln2_w"], p["ln2_b"])
    return h + jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def _llama_shapes(D, F):
    return {"ln1": (D,), "wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D), "ln2": (D,),
            "wg": (D, F), "wu": (D, F), "wd": (F, D)}


FAMILIES = {
    # name: (layer fn, layers, d_model, heads, d_ff, vocab, seq, batch, per-layer parameter shapes)
    "llama": (llama_layer, 18, 2048, 16, 5632, 32000, 2048, 4, _llama_shapes),
    "llama_tags": (llama_tags_layer, 18, 2048, 16, 5632, 32000, 2048, 4, _llama_shapes),
    "gpt": (gpt_layer, 24, 2048, 16, 8192, 50304, 1024, 8,
            lambda D, F: {"ln1_w": (D,), "ln1_b": (D,), "wqkv": (D, 3 * D), "bqkv": (3 * D,), "wo": (D, D),
                          "bo": (D,), "ln2_w": (D,), "ln2_b": (D,), "w1": (D, F), "b1": (F,), "w2": (F, D),
                          "b2": (D,)}),
}


def scale_family(name: str, k: int) -> None:
    """`FAMILIES[name]`'s batch times `k`."""
    f = FAMILIES[name]
    FAMILIES[name] = f[:7] + (f[7] * k,) + f[8:]


def scale_batches(k: int) -> None:
    """Every model's batch times `k` (the decoders' and ResNet's; compile time barely changes): the
    suite at sizes that fill a larger device, whose hand-written policies fit it and whose no-remat
    step does not."""
    for name in FAMILIES:
        scale_family(name, k)
    DEC["B"] *= k
    RESNET["batch"] *= k


def make_model(name: str, policies=None, prevent_cse: bool = True, n_layers: int | None = None):
    """(loss, abstract args, description, layers).  `policies`: per layer, a JAX policy name or
    None, applied by hand with `jax.checkpoint` (scan: the first entry, on the body);
    `n_layers`: another depth than the family's."""
    if name in BUILDERS:  # written with a third-party library (`_thirdparty.py`)
        return BUILDERS[name](policies, prevent_cse)
    if name in UNSEEN:  # unseen.py's (`_unseen.py`), for the scripts that replay them
        return UNSEEN[name](policies, prevent_cse)
    family, scan = name.removesuffix("_scan"), name.endswith("_scan")
    layer_fn, L, D, H, F, V, S, B, shapes = FAMILIES[family]
    L = L if n_layers is None else n_layers
    one = {k: sd(s, bf) for k, s in shapes(D, F).items()}
    layers = ({k: sd((L,) + v.shape, bf) for k, v in one.items()} if scan else [dict(one) for _ in range(L)])
    params = {"embed": sd((V, D), bf), "layers": layers, "ln_f": sd((D,), bf), "head": sd((D, V), bf)}
    if family == "gpt":
        params["pos"] = sd((S, D), bf)
    tokens = sd((B, S), jnp.int32)
    pols = list(policies) if policies is not None else [None] * L

    def wrap(fn, pol, cse=True):
        if pol is None:
            return fn
        return jax.checkpoint(fn, policy=policy_of(pol), prevent_cse=cse)

    def loss(params, tokens):
        h = params["embed"][tokens]
        if family == "gpt":
            h = h + params["pos"][None]
        if scan:
            body = wrap(lambda h, p: (layer_fn(h, p, H), None), pols[0], prevent_cse)
            h, _ = jax.lax.scan(body, h, params["layers"])
        else:
            for p, pol in zip(params["layers"], pols):
                h = wrap(lambda h, p: layer_fn(h, p, H), pol)(h, p)
        logits = (rms(h, params["ln_f"]) @ params["head"]).astype(jnp.float32)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1))

    n_params = (L * sum(int(jnp.prod(jnp.array(s))) for s in shapes(D, F).values()) + 2 * V * D
                + (S * D if family == "gpt" else 0))
    desc = (f"{family} decoder{' (scan over layers)' if scan else ''}: {L} layers, d_model {D}, d_ff {F}, "
            f"seq {S}, batch {B}, bf16, {n_params / 1e9:.2f}B parameters")
    return loss, (params, tokens), desc, L


def policy_of(pol: str):
    """A JAX policy by name, or a MaxText preset (`PRESETS`) by its label."""
    if pol.startswith("maxtext "):
        return MAXTEXT_PRESETS[pol.removeprefix("maxtext ")]
    return getattr(jax.checkpoint_policies, pol)


def hand_policies(name: str) -> tuple:
    """JAX's policies, and on a model with MaxText's tags (`TAGGED`) MaxText's presets too."""
    tagged = name.removesuffix("_scan") in TAGGED
    return POLICIES + (tuple(f"maxtext {k}" for k in PRESETS) if tagged else ())


def hand_variants(name: str, mix: bool = True) -> list:
    """(label, policy per layer, prevent_cse) of the hand-written baselines: no remat, each policy
    per layer (a scan's with prevent_cse True and False), and with `mix` the half-and-half mixes of
    each two neighbouring policies (the first half the leaner one), whose peaks lie between theirs."""
    _, _, _, L = make_model(name)
    variants = [("no remat", None, True)]
    for pol in hand_policies(name):
        variants.append((f"{pol} per layer", [pol] * L, True))
        if name.endswith("_scan"):
            variants.append((f"{pol} per layer, prevent_cse=False", [pol] * L, False))
    if mix and not name.endswith("_scan"):
        half = L // 2
        for lean, fast in zip(POLICIES, POLICIES[1:]):  # a budget between each two policies' peaks
            variants.append((f"mix: {half} {lean} + {L - half} {fast}", [lean] * half + [fast] * (L - half), True))
    return variants


def hand_rows(name: str, say):
    """The hand-written baselines: (label, compiled stats)."""
    rows = []
    for label, pols, cse in hand_variants(name):
        fn, args, _, _ = make_model(name, pols, cse)
        t0 = time.perf_counter()
        st = compiled_stats(fn, *args)
        say(f"  {label}: {st.peak_bytes / GiB:.2f} GiB ({time.perf_counter() - t0:.1f}s)")
        rows.append((label, st))
    return rows


def autoremat_row(name: str, budget: int, none: tuple, say):
    fn, args, _, _ = make_model(name)
    t0 = time.perf_counter()
    try:
        planned = plan_for(fn, budget, args, progress=PLANNER_LOG)
    except InfeasibleBudgetError as e:
        return {"status": "infeasible", "lowest": e.lowest, "time": time.perf_counter() - t0}
    dt = time.perf_counter() - t0
    plan = planned.plan
    st = compiled_stats(apply(fn, plan), *args)
    return {"status": "ok", "peak": st.peak_bytes, "host": st.host_bytes, "extra": st.matmul_flops - none[0],
            "extra_all": st.jaxpr_flops - none[1], "time": dt,
            "predicted": plan.predicted_peak, "expected": plan.meta.get("expected_peak"),
            "found_by": plan.meta.get("found_by", ""),
            "compiles": plan.meta.get("compiles", "")}


def between_budgets(hand: list) -> list:
    """(budget, label, extra matmul FLOPs of the best hand-written plan within it) halfway between
    each two neighbouring policies' compiled peaks (JAX's default barriers).  A scan's body is
    one layer, so a scan has no mixes to give budgets between its policies, where the planner's
    own plans matter most (issue 14 asks for autoremat 'at each of those peaks and between them')."""
    none = hand[0][1].matmul_flops
    peaks = sorted((st.peak_bytes, label) for label, st in hand[1:] if "prevent_cse" not in label
                   and not label.startswith("maxtext"))
    out = []
    for (lo, lo_label), (hi, hi_label) in zip(peaks, peaks[1:]):
        if hi > lo:
            b = (lo + hi) // 2
            best = min(st.matmul_flops for _, st in hand if st.peak_bytes <= b) - none
            out.append((b, f"between {lo_label.removesuffix(' per layer')} and {hi_label}", best))
    return out


def run_model(name: str, say, lines: list) -> None:
    """Appends `name`'s table to `lines`, row by row (`say` may write them out as they come)."""
    _, _, desc, _ = make_model(name)
    say(f"{name}: {desc}")
    hand = hand_rows(name, say)
    none = (hand[0][1].matmul_flops, hand[0][1].jaxpr_flops)
    lines += [f"### {name}", "", desc, "",
              "| plan | budget GiB | compiled GiB | +TFLOP matmul | +TFLOP all | planning s | compiles | "
              "model GiB | expected GiB (error) | found by | vs hand |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, st in hand:
        lines.append(f"| {label} | | {st.peak_bytes / GiB:.2f} | {(st.matmul_flops - none[0]) / 1e12:.3f} | "
                     f"{(st.jaxpr_flops - none[1]) / 1e12:.3f} | | | | | hand-written | |")
    budgets = [(st.peak_bytes, label, st.matmul_flops - none[0]) for label, st in hand[1:]]
    if name.endswith("_scan"):
        budgets += between_budgets(hand)
    for b, label, hand_extra in sorted(budgets, reverse=not ASCENDING):
        r = autoremat_row(name, b, none, say)
        if r["status"] != "ok":
            lines.append(f"| autoremat at {label} | {b / GiB:.2f} | infeasible (lowest {r['lowest'] / GiB:.2f}) | | | "
                         f"{r['time']:.0f} | | | | | |")
            say(f"  autoremat at {label} ({b / GiB:.2f} GiB): infeasible, lowest {r['lowest'] / GiB:.2f} GiB "
                f"({r['time']:.0f}s)")
            continue
        verdict = ""
        if hand_extra is not None:
            ok = r["peak"] <= b and r["extra"] <= hand_extra
            verdict = "no more" if ok else "**MORE**"
        pred = f"{r['predicted'] / GiB:.2f}" if r["predicted"] else ""
        host = f" (+{r['host'] / GiB:.2f} host)" if r["host"] else ""  # offloaded: outside the device peak
        lines.append(f"| autoremat at {label} | {b / GiB:.2f} | {r['peak'] / GiB:.2f}{host} | "
                     f"{r['extra'] / 1e12:.3f} | {r['extra_all'] / 1e12:.3f} | {r['time']:.0f} | {r['compiles']} | "
                     f"{pred} | {expected_cell(r['expected'], r['peak'])} | {r['found_by']} | {verdict} |")
        say(f"  autoremat at {label} ({b / GiB:.2f} GiB): {r['peak'] / GiB:.2f} GiB{host}, "
            f"+{r['extra'] / 1e12:.2f} TFLOP, {r['time']:.0f}s ({r['compiles']} compiles), {r['found_by']} {verdict}")
    lines.append("")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["llama", "llama_scan", "gpt", "gpt_scan", *BUILDERS])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "realscale.md"))
    ap.add_argument("--batch-scale", type=int, default=1, help="every model's batch times this (default 1)")
    ap.add_argument("--ascending", action="store_true",
                    help="plan the budgets from the lowest up (default: from the highest down)")
    ap.add_argument("--planner-log", action="store_true", help="the planner's progress on stderr")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    models = "" if a.models == ap.get_default("models") else " --models " + " ".join(a.models)
    if a.planner_log:
        global PLANNER_LOG
        PLANNER_LOG = lambda m: print(f"    planner: {m}", file=sys.stderr, flush=True)  # noqa: E731
    if a.batch_scale != 1:
        scale_batches(a.batch_scale)
        models += f" --batch-scale {a.batch_scale}"
    if a.ascending:
        global ASCENDING
        ASCENDING = True
        models += " --ascending"
    body: list[str] = []

    def say(m):  # progress, and the results so far (a run stopped early keeps its rows)
        print(m, file=sys.stderr, flush=True)
        head = [
            "# Real-scale plans, compile-only (issue 14)", "",
            provenance(f"python benchmarks/realscale.py{models}", (time.perf_counter() - t0) / 60), "",
            "Compiled peak = argument + output + temp - alias of the compiled `value_and_grad` step; +TFLOP = the "
            "step's jaxpr FLOPs over no remat, of its matmuls and in all (recomputation included, scan bodies "
            "times their trip count). 'vs hand': whether autoremat at that hand-written plan's compiled peak fits "
            "and recomputes no more matmul FLOPs. 'compiles': the whole-step compiles the planner made for that "
            "budget (plans compiled for an earlier budget of the model are reused, uncounted; the un-optimized step's "
            "compile, once per model, is not counted). "
            "autoremat's plan is compiled again by this script; 'model' is the chain model's figure for the "
            "plan (its solver's plans only), 'expected' the peak the search expected before compiling it (the model's "
            "figure placed between the compiled peaks of the plans compiled before it, twins of the hand-written "
            "policies and the model's own, nearest in predicted peak; a mix count's from its neighbours' compiled peaks; a policy's "
            "the compiled peak of the policy before it plus the model's difference between the two); '+N host': bytes its plan offloads to host memory, "
            "outside the device peak.", ""]
        with open(a.out, "w") as f:
            f.write("\n".join(head + body))

    for name in a.models:
        run_model(name, say, body)
    say(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
