"""What recomputation costs: the equations a saved set forces to re-run, and their time.

`_closure` is the recompute closure of a region given what it saves; `recompute_times` the
roofline time of re-running each value's producers, with cheap elementwise chains fused into
their consumers as XLA does.  Extra time of an offloading option counts host transfers not
hidden behind the region's compute (`OFFLOAD_OVERLAP`).
"""

from __future__ import annotations

from collections.abc import Sequence


from autoremat.graph import _costs
from autoremat.graph._graph import Graph, OpInfo


# Fraction of a region's forward + backward compute time that can hide host transfers.
OFFLOAD_OVERLAP = 0.5


def _closure(g: Graph, ops: Sequence[str], saved: frozenset[str], need_outputs: frozenset[str],
             residuals: frozenset[str]):
    """Ops of a block to re-run in backward, and outside values that must be available.

    Returns (recomputed op ids, values produced before the block that are needed).  Scan
    bodies pass `saved` with its `checkpoint_name` aliases (`_with_name_aliases`: MaxText-style
    tags are their options).  Top-level blocks do not yet: with aliases, the transformer's
    solver rounds at dots_with_no_batch_dims_saveable's budget compiled 0.01 MiB over and the
    fallback recomputed 2.21 GFLOP instead of 0.13 (benchmarks/run.py).
    """
    opset = set(ops)
    R: set[str] = set()
    outside: set[str] = set()
    stack = [v for v in (residuals | need_outputs) if v not in saved]
    for oid in ops:
        if g.ops[oid].extra_residual_bytes:
            if oid not in R:
                R.add(oid)
                stack.extend(v for v in g.ops[oid].inputs if v not in saved)
    seen = set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        prod = g.values[v].producer
        if prod is None:
            continue  # a function input or constant: always available
        if prod in opset:
            if prod not in R:
                R.add(prod)
                stack.extend(u for u in g.ops[prod].inputs if u not in saved)
        else:
            outside.add(v)
    return frozenset(R), frozenset(outside)


# Primitives XLA fuses into their consumers: a residual they produce is recomputed inside the
# backward pass's fusions from their inputs rather than stored.
FUSIBLE = _costs.FUSIBLE_PRIMITIVES


def _fusible(op: OpInfo) -> bool:
    """A fusible primitive, or a custom_jvp/custom_vjp call whose body is (jax.nn.relu)."""
    return op.primitive in FUSIBLE or bool(op.params.get("elementwise"))


FUSION_DEPTH = 12


# Elementwise primitives XLA counts as expensive and does not duplicate into several fusions
# (transcendentals, division): in a checkpointed run their re-run outputs are materialized.
EXPENSIVE = frozenset({"exp", "exp2", "expm1", "log", "log1p", "tanh", "logistic", "erf", "div", "rsqrt",
                       "sqrt", "pow"})


def recompute_times(g: Graph) -> dict[str, float]:
    """Seconds to re-run each equation of `g` in the backward pass, fusion-aware.

    The roofline `op.time` charges every elementwise equation a full read and write of its
    arrays, as if it ran alone.  Recomputed elementwise work runs inside XLA fusions instead:
    values passed between fusible equations never reach memory and the fusion's result is
    consumed by the backward fusion that needs it.  A fusible equation is therefore charged
    its arithmetic and the reads of inputs that come from memory (values produced by
    non-fusible equations, or function inputs); other equations keep their roofline time.
    Without this, recomputing a GELU (eight elementwise equations) looked almost as
    expensive as recomputing the matmul before it, and the solver saved activations and
    recomputed matmuls, the opposite of what `dots_saveable` does and of what is fast.
    """
    cached = g.__dict__.get("_recompute_times")
    if cached is not None:
        return cached
    prof = g.profile
    out: dict[str, float] = {}
    for op in g.ops.values():
        if not _fusible(op):
            out[op.id] = op.time
            continue
        read = 0
        for v in op.inputs:
            prod = g.values[v].producer
            if prod is None or not _fusible(g.ops[prod]):
                read += g.values[v].nbytes
        dtype = str(g.values[op.outputs[0]].dtype) if op.outputs else "float32"
        out[op.id] = max(op.cost.flops / prof.flops_rate(dtype), read / prof.memory_bandwidth,
                         op.cost.transcendentals / prof.transcendental_rate)
    g.__dict__["_recompute_times"] = out
    return out
