"""How far the chain model's peak is from XLA:CPU's, in float32 and in bfloat16.

XLA:CPU has no bfloat16 matmul: it converts a bf16 dot's operands to f32, multiplies in f32
and converts back, and the compiled step keeps some of those f32 copies alive.  So a bf16 step
on this CPU holds more than half of its f32 twin, which a model counting each value at its
JAX dtype cannot see.  This script measures the gap:

1. an 8-layer tanh MLP (width 1024, batch 4096), in f32 and in bf16: the compiled step
   (value_and_grad; peak = argument + output + temp - alias), the `convert` instructions in
   its optimized HLO, and the chain model's (uncalibrated) peak for no remat and for
   all-recompute per block;
2. the 1B decoders of `benchmarks/realscale.py` (`--models`, default llama gpt), as written
   (bf16) and with every bf16 array made f32: the un-optimized step's compiled peak against
   the chain model's, and `nothing_saveable` per layer (written by hand) against the model's
   twin of it (the same policy per repeated unit of blocks);
3. what-ifs on the first of those decoders, in bf16: the model with the bf16 operands of every
   matmul counted at f32 size (activations alone, or weights too), against the compiled
   per-layer policies (no change to autoremat: a probe of whether that alone would mend it);
4. what XLA:CPU holds at its peak, by dtype, and how much of it is f32 copies of the step's
   parameters (its live-range dump, written by a child process with `--xla_dump_to`): for the
   bf16 MLP without remat and with `nothing_saveable` per layer, and for the first decoder with
   `nothing_saveable` and `dots_saveable` per layer.

    .venv/bin/python benchmarks/cpu_bf16.py > benchmarks/results/cpu_bf16.md
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re
import subprocess
import tempfile
import sys
import time

import autoremat

autoremat.configure_cpu_flags()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import realscale  # noqa: E402
from _common import provenance  # noqa: E402
from autoremat._bridge import to_plan  # noqa: E402
from autoremat._optimize import _all_none  # noqa: E402
from autoremat.graph import graph_from_traced, trace  # noqa: E402
from autoremat.graph._profiles import detect_profile  # noqa: E402
from autoremat.runtime import apply  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402
from autoremat.solver._chain import evaluate  # noqa: E402
from autoremat.solver._chain_model import build_chain_model  # noqa: E402

MiB, GiB = 2**20, 2**30
TWINS = ("ckpt:recompute", "ckpt:save:dots_no_batch", "ckpt:save:dots")  # of realscale.POLICIES


def _model(fn, args):
    t = trace(fn, args, {}, argnums=0, static_argnums=(), has_aux=False, skip_integer_leaves=False)
    return build_chain_model(graph_from_traced(t, profile=detect_profile()), offload=False)


def mlp(dtype):
    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x.astype(jnp.float32))

    return loss, ([jax.ShapeDtypeStruct((1024, 1024), dtype)] * 8, jax.ShapeDtypeStruct((4096, 1024), dtype))


def mlp_rows() -> list[str]:
    rows = []
    for dtype in (jnp.float32, jnp.bfloat16):
        fn, args = mlp(dtype)
        compiled = jax.jit(jax.value_and_grad(fn)).lower(*args).compile()
        converts = compiled.as_text().count(" convert(")
        m = _model(fn, args)
        rec = m.uniform("ckpt:recompute", 1)
        none_c = compiled_stats(fn, *args).peak_bytes
        rec_c = compiled_stats(apply(fn, to_plan(m, rec)), *args).peak_bytes
        none_p, rec_p = evaluate(m.raw_problem, _all_none(m))[0], evaluate(m.raw_problem, rec)[0]
        rows.append(f"| {jnp.dtype(dtype).name} | {converts} | {none_c / MiB:.1f} | {none_p / MiB:.1f} "
                    f"| {rec_c / MiB:.1f} | {rec_p / MiB:.1f} |")
    return rows


def decoder_rows(name: str) -> list[str]:
    rows = []
    for dtype in (jnp.bfloat16, jnp.float32):
        realscale.bf = dtype  # the decoders' parameters and casts read this module global
        t0 = time.perf_counter()
        fn, args, _, n = realscale.make_model(name)
        hand, _, _, _ = realscale.make_model(name, ["nothing_saveable"] * n)
        m = _model(fn, args)
        offset, size = m.period()
        twin = m.uniform("ckpt:recompute", size, offset=offset)
        none_c, hand_c = compiled_stats(fn, *args).peak_bytes, compiled_stats(hand, *args).peak_bytes
        none_p, twin_p = evaluate(m.raw_problem, _all_none(m))[0], evaluate(m.raw_problem, twin)[0]
        rows.append(f"| {name} | {jnp.dtype(dtype).name} | {none_c / GiB:.2f} | {none_p / GiB:.2f} "
                    f"| {none_c / none_p:.2f} | {hand_c / GiB:.2f} | {twin_p / GiB:.2f} | {hand_c / twin_p:.2f} "
                    f"| {time.perf_counter() - t0:.0f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    realscale.bf = jnp.bfloat16
    return rows


def _upcast(g, weights: bool) -> None:
    """Counts the bf16 operands of `g`'s matmuls (nested graphs too) at f32 size, in place."""
    ids = set()
    for op in g.ops.values():
        if op.primitive == "dot_general":
            ids |= {v for v in op.inputs if weights or g.values[v].kind != "input"}
        for body in getattr(op, "bodies", None) or ():
            _upcast(body, weights)
    for v in ids:
        if g.values[v].dtype == "bfloat16":
            g.values[v] = dataclasses.replace(g.values[v], nbytes=2 * g.values[v].nbytes)


def upcast_rows(name: str) -> list[str]:
    fn, args, _, n = realscale.make_model(name)
    compiled = [compiled_stats(realscale.make_model(name, [pol] * n)[0], *args).peak_bytes / GiB
                for pol in realscale.POLICIES]
    rows = [f"| {name}, compiled per layer | " + " | ".join(f"{c:.2f}" for c in compiled) + " |"]
    t = trace(fn, args, {}, argnums=0, static_argnums=(), has_aux=False, skip_integer_leaves=False)
    for label, weights in (("as is", None), ("activations at f32", False), ("activations and weights at f32", True)):
        g = graph_from_traced(t, profile=detect_profile())
        if weights is not None:
            _upcast(g, weights)
        m = build_chain_model(g, offload=False)
        offset, size = m.period()
        twins = [evaluate(m.raw_problem, m.uniform(k, size, offset=offset))[0] / GiB for k in TWINS]
        rows.append(f"| model's twins, {label} | " + " | ".join(
            f"{p:.2f} ({p / c - 1:+.0%})" for p, c in zip(twins, compiled)) + " |")
    return rows


def _buffers_child(name: str) -> None:
    """Compiles the programs of section 4 under the dump flags the parent set."""
    def compile_as(label, fn, args):
        def step(*a):
            return jax.value_and_grad(fn)(*a)
        step.__name__ = label
        jax.jit(step).lower(*args).compile()

    fn, args = mlp(jnp.bfloat16)
    compile_as("mlp_no_remat", fn, args)

    def per_layer(ws, x):
        for w in ws:
            x = jax.checkpoint(lambda x, w: jnp.tanh(x @ w), policy=jax.checkpoint_policies.nothing_saveable)(x, w)
        return jnp.sum(x.astype(jnp.float32))
    compile_as("mlp_nothing_saveable", per_layer, args)
    n = realscale.make_model(name)[3]
    for pol in ("nothing_saveable", "dots_saveable"):
        fn, args, _, _ = realscale.make_model(name, [pol] * n)
        compile_as(f"{name}_{pol}", fn, args)


def _peak_live(live_range: str, hlo: str) -> dict:
    """Bytes live at XLA's peak (its live-range dump: "Live ranges at N (peak)"), in all, in
    f32 buffers, in bf16 ones, and in f32 copies of the step's parameters (the weights: a
    `convert` whose operand is a parameter)."""
    params = set(re.findall(r"%(\S+) = \S+ parameter\(", hlo))
    shape = dict(re.findall(r"%(\S+) = (\w+)\[", hlo))
    operands = {name: re.findall(r"%([\w.\-]+)", args) for name, args in
                re.findall(r"%(\S+) = \S+ fusion\(([^)]*)\)", hlo)}
    section = live_range.split("(peak):")[1].split("Stack trace")[0]
    out = {"all": 0, "f32": 0, "bf16": 0, "f32 copies of parameters": 0}
    for name, nbytes in re.findall(r"^\s+([\w.\-]+)\{\S*\}: (\d+) bytes", section, re.M):
        n = int(nbytes)
        out["all"] += n
        out[shape.get(name)] = out.get(shape.get(name), 0) + n
        ops = operands.get(name, [])
        if shape.get(name) == "f32" and "convert" in name and ops and all(o in params for o in ops):
            out["f32 copies of parameters"] += n
    return out


def buffer_rows(name: str) -> list[str]:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={d}")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--buffers-child", name], env=env, check=True,
                       capture_output=True)
        rows = []
        for label in ("mlp_no_remat", "mlp_nothing_saveable", f"{name}_nothing_saveable", f"{name}_dots_saveable"):
            def read(suffix):
                return open(next(iter(glob.glob(os.path.join(d, f"*jit_{label}.cpu_after_optimizations{suffix}"))))).read()
            live = _peak_live(read("-live-range.txt"), read(".txt"))
            unit, u = (MiB, "MiB") if label.startswith("mlp") else (GiB, "GiB")
            rows.append(f"| {label} | " + " | ".join(
                f"{live.get(k, 0) / unit:.2f}" for k in ("all", "f32", "bf16", "f32 copies of parameters")) + f" | {u} |")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*", default=["llama", "gpt"])
    ap.add_argument("--buffers-child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.buffers_child:
        _buffers_child(a.buffers_child)
        return 0
    t0 = time.perf_counter()
    lines = ["## 8-layer tanh MLP, width 1024, batch 4096\n",
             "| dtype | converts in the HLO | no remat, compiled MiB | model MiB "
             "| recompute per block, compiled MiB | model MiB |", "|---|---:|---:|---:|---:|---:|", *mlp_rows(),
             "\n## The 1B decoders of benchmarks/realscale.py\n",
             "| model | dtype | no remat, compiled GiB | model GiB | compiled / model "
             "| nothing_saveable per layer, compiled GiB | model's twin GiB | compiled / model | s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in a.models:
        lines += decoder_rows(name)
    lines += [f"\n## What if the model counted matmul operands at f32 ({a.models[0]}, bf16; GiB, vs compiled)\n",
              "| | " + " | ".join(realscale.POLICIES) + " |", "|---|---:|---:|---:|", *upcast_rows(a.models[0])]
    lines += ["\n## What XLA:CPU holds at its peak (bf16 programs; XLA's live-range dump)\n",
              "| program | live at the peak | f32 buffers | bf16 buffers | f32 copies of the parameters | unit |",
              "|---|---:|---:|---:|---:|---|", *buffer_rows(a.models[0])]
    command = "python benchmarks/cpu_bf16.py" + (" --models " + " ".join(a.models) if argv else "")
    print("# The chain model against XLA:CPU, float32 and bfloat16\n")
    print(provenance(command, (time.perf_counter() - t0) / 60) + " Peaks: compiled argument + output + temp - "
          "alias of `jax.value_and_grad`, abstract arguments; model: the chain model's peak, uncalibrated.\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
