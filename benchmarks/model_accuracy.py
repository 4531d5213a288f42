"""Predicted vs compiled peak of uniform plans, per built-in model (docs/FINDINGS.md).

For each model, applies one option kind to every block (and every pair of blocks) of autoremat's chain (`none` = no
remat, `ckpt:recompute` = nothing saved per block; scan bodies get the matching `scan:` kind)
and compares the chain model's predicted peak with XLA's compiled peak. No calibration is
applied (that is what `optimize` adds). Run: `.venv/bin/python benchmarks/model_accuracy.py`.
"""

from autoremat._xla import configure_cpu_flags

configure_cpu_flags()

import jax  # noqa: E402

from autoremat.examples import get_example  # noqa: E402
from autoremat.graph import build_graph  # noqa: E402
from autoremat.runtime import apply, compiled_stats  # noqa: E402
from autoremat.solver import build_chain_model, evaluate  # noqa: E402

MODELS = ("mlp_chain", "transformer", "transformer_scan", "convnet")
KINDS = ("none", "ckpt:recompute", "ckpt:save:dots", "ckpt:ilp100%")
SIZES = (1, 2)  # one option kind on every block, on every pair of blocks


def main():
    print(f"jax {jax.__version__}, backend {jax.default_backend()}")
    print("| model | plan | predicted MiB | compiled MiB | error |")
    print("|---|---|---:|---:|---:|")
    for name in MODELS:
        ex = get_example(name)
        model = build_chain_model(build_graph(ex.fn, *ex.args), offload=False)
        for kind in KINDS:
            for size in SIZES if kind != "none" else (1,):
                segs = model.uniform(kind, size)
                if segs is None:
                    continue
                predicted = evaluate(model.raw_problem, segs)[0]
                compiled = compiled_stats(apply(ex.fn, model.to_plan(segs)), *ex.args).peak_bytes
                print(f"| {name} | {kind} x{size} | {predicted / 2**20:.1f} | {compiled / 2**20:.1f} | "
                      f"{(predicted - compiled) / compiled:+.0%} |")


if __name__ == "__main__":
    main()
