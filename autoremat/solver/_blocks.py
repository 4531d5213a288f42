"""Where the chain's blocks are cut: at the residual stream between layers.

The top-level equations are cut into a chain of blocks at the positions where the bytes of
intermediate values crossing the cut are a local minimum (the residual stream between layers)
and at the edges of the layers `graph.find_layers` finds (so a region can be exactly a layer
checkpointed by hand); each top-level `scan` is a block of its own.  `find_blocks` also merges
light blocks into their neighbours (`merge="next"`/`"prev"`/`"none"`), and `_signature` gives
blocks with the same structure the same key, so repeated layers share their per-block work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


from autoremat.graph._graph import Graph, OpInfo
from autoremat.graph._layers import crossing_bytes, find_layers, is_heavy



@dataclass(frozen=True)
class Block:
    """A run of top-level equations `[start, stop)`; `scan` blocks hold one scan equation."""

    index: int
    start: int
    stop: int
    ops: tuple[str, ...]
    kind: str  # "ops" | "scan"
    signature: str
    heavy: bool = True  # holds a matmul/conv/control-flow equation


def find_blocks(g: Graph, *, max_blocks: int = 160, merge: str = "next") -> tuple[Block, ...]:
    """Cuts the top-level equations into a chain of blocks (see the module docstring).

    Args:
      merge: where equations without a heavy primitive (norms, activations, residual adds)
        go: "next" ends each block at the first cut after its heavy equation (activations
        open the next block); "prev" ends it at the last cut before the next heavy equation
        (activations close their layer, as hand-written per-layer checkpoints do).
    """
    if merge not in ("next", "prev", "none"):
        raise ValueError(f"merge must be 'next', 'prev' or 'none', got {merge!r}")
    ops = list(g.ops.values())
    n = len(ops)
    if n == 0:
        return ()
    cross = crossing_bytes(g)
    forced = set()
    for i, op in enumerate(ops):
        if op.primitive == "scan":
            forced.update((i, i + 1))
    # With merge="next" (the chain planned first) the layers' edges too, so that a region can
    # be exactly a layer a person checkpoints by hand: Llama 1B's dots_with_no_batch_dims_saveable
    # per layer, cut on the nearest block edges (each region from 9 equations into its layer,
    # after the RMSNorm, to 9 into the next: the cut at the layer's edge, where half the bytes
    # cross, fell within min_ops of the one before), compiled to 15.30 GiB where written by
    # hand 13.39 (docs/FINDINGS.md, fortieth session).  The other two chains, rebuilt
    # when no plan of it fits, keep their own cuts: they are there to cut elsewhere (a 4-layer
    # MLP's fitting plan, two layers a region, is on the "prev" chain's edges).
    edges = {e for la in find_layers(g) for e in (la.start, la.stop)} if merge == "next" else set()
    forced |= edges
    cuts = set(forced)
    for p in range(1, n):
        if cross[p] <= cross[p - 1] and cross[p] <= cross[p + 1]:
            cuts.add(p)
    # Where the traced function moves to its next line (`x = stage(x)`, then `out = head(x)`),
    # a user-level call ends: a boundary hand-written checkpoints would use, even where skip
    # connections keep the crossing bytes from being a local minimum (the U-Net's decoder).
    if g.traced is not None and len(g.traced.jaxpr.eqns) == n:
        lines = g.traced.user_lines()
        for p in range(1, n):
            if lines[p] is not None and lines[p - 1] is not None and lines[p] != lines[p - 1]:
                cuts.add(p)
    # Every local minimum is kept (a filter keeping only cuts near the smallest interior
    # crossing hurt the U-Net, whose skip tensors cross its decoder stages: lowest compiled
    # peak 10.1 MiB without it, 12.2 MiB with it); light blocks are merged below instead.
    cuts = sorted(c for c in cuts if 0 < c < n)
    # Thin out cuts so that there are at most max_blocks blocks: keep forced cuts, then walk
    # left to right keeping a cut once the current block has at least min_ops equations.
    min_ops = max(1, math.ceil(n / max_blocks))
    kept, last = [], 0
    for c in cuts:
        if c in forced or c - last >= min_ops:
            if c - last > 0:
                kept.append(c)
                last = c
    bounds = [0] + kept + [n]
    heavy = [is_heavy(op) for op in ops]
    bounds = _merged(bounds, heavy, forced, edges, merge)
    blocks = []
    for k in range(len(bounds) - 1):
        a, b = bounds[k], bounds[k + 1]
        ids = tuple(op.id for op in ops[a:b])
        kind = "scan" if (b - a == 1 and ops[a].primitive == "scan") else "ops"
        blocks.append(Block(k, a, b, ids, kind, _signature(g, ops[a:b]), any(heavy[a:b])))
    return tuple(blocks)


def _merged(bounds: list[int], heavy: list[bool], forced: set, edges: set, merge: str) -> list[int]:
    """The block edges `bounds` (0 first, n last) with blocks of no heavy equation (layer norms,
    residual adds) merged (`find_blocks`' `merge`); with "next" into the next block, so regions
    start at the residual stream before a layer's first projection, but a light block ending on
    a layer's edge (`edges`) into the one before."""
    n = bounds[-1]
    merged = [0]
    for k in range(1, len(bounds) - 1):
        a, b = merged[-1], bounds[k]
        if merge == "none":
            keep = True
        elif merge == "prev" and b not in forced:
            # ... and the first cut of a heavy-free tail (the loss stays its own block).
            keep = any(heavy[a:b]) and (any(heavy[b:bounds[k + 1]]) or not any(heavy[b:n]))
        else:
            keep = any(heavy[a:b]) or b in forced
        if keep:
            if b in edges and not any(heavy[a:b]) and len(merged) > 1 and a not in forced:
                merged.pop()  # a light layer tail (the residual add) closes its layer
            merged.append(b)
    if merge == "next" and len(merged) > 1 and not any(heavy[merged[-1]:n]) and merged[-1] not in forced:
        merged.pop()  # a trailing light block (loss reduction) joins the one before
    return merged + [n]


def _signature(g: Graph, ops: Sequence[OpInfo]) -> str:
    """Structure of a block up to renaming: primitives, shapes and internal wiring."""
    local = {}
    parts = []
    for i, op in enumerate(ops):
        for j, v in enumerate(op.outputs):
            local[v] = f"{i}.{j}"
        ins = ",".join(local.get(v, f"x{g.values[v].type_str}") for v in op.inputs)
        outs = ",".join(g.values[v].type_str for v in op.outputs)
        parts.append(f"{op.primitive}({ins})->{outs}")
    return ";".join(parts)


def _lookup(g: Graph, key: str | None, table: str):
    """`g.values[key]` or `g.ops[key]` (table 'values' / 'ops'), searching nested bodies."""
    if key is None:
        return None
    if key in getattr(g, table):
        return getattr(g, table)[key]
    for op in g.ops.values():
        for body in op.bodies:
            if key.startswith(body.prefix):
                return _lookup(body, key, table)
    return None


def _value(g: Graph, vid: str):
    return _lookup(g, vid, "values")


def _op(g: Graph, oid: str | None):
    return _lookup(g, oid, "ops")
