"""From a dataflow graph to the chain problem, and from a solution back to a `Plan`.

The model (DESIGN.md section 3):

* **Blocks.**  The top-level equations are cut into a chain of blocks at the positions where
  the bytes of intermediate values crossing the cut are a local minimum (the residual stream
  between layers).  Each top-level `scan` is a block of its own.
* **Regions.**  A region covers blocks `[i, j)` and is either left alone (JAX saves what its
  linearization needs) or becomes one `jax.checkpoint` whose inputs are saved by
  construction and whose interior keeps only a saved set `S` (device) or an offloaded set.
* **Peak.**  Backward runs regions in reverse; while region `k` runs backward, live memory
  is: arguments + gradients + outputs (`base`), what earlier regions stored, region `k`'s
  full residuals (recomputed), and the cotangent at its output boundary.  This is
  `ChainProblem`'s stage-by-stage peak (`_chain.evaluate`).
* **Time.**  Extra time over the un-optimized step: roofline time of the recomputed
  equations (their recompute closure given `S`), plus offload transfers over the host link
  not hidden behind the region's compute (half of its forward + backward time is assumed
  available for overlap; transfers beyond that are exposed).

Per block, candidate saved sets come from the exact region solver (`_region`) at several
memory caps; repeated layers share one solve through a structural signature.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
from collections.abc import Sequence
from dataclasses import dataclass, field

from autoremat.graph import _costs
from autoremat.graph._graph import Graph, OpInfo
from autoremat.runtime._plan import Plan, Region, ScanPlan, ValueRecord
from autoremat.solver._chain import ChainProblem, Option, Segment, SolveResult

__all__ = ["Block", "ChainModel", "build_chain_model", "find_blocks", "crossing_bytes", "DEFAULT_CAPS"]

# Fractions of a block's residual bytes at which the region solver is asked for a saved set.
DEFAULT_CAPS = (0.0, 0.1, 0.25, 0.4, 0.6, 0.8, 1.0)
# ... and for a scan body (one solve serves every iteration).
SCAN_CAPS = tuple(round(0.05 * k, 2) for k in range(21))
# Fraction of a region's forward + backward compute time that can hide host transfers.
OFFLOAD_OVERLAP = 0.5
# Equations that make a block worth being a block of its own.
HEAVY_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated", "scan", "while", "cond",
                              "custom_vjp_call", "custom_jvp_call", "custom_vjp_call_jaxpr"})
# Backward workspace of a scan body, in units of its largest internal value (see _scan_options).
WORKSPACE_FACTOR = 2
# Scan bodies with at most this many `checkpoint_name` tags also get every pair of tags as a
# candidate saved set (8 tags: 28 pairs, each one closure over the body).
MAX_TAG_PAIRS = 8


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


@dataclass(frozen=True)
class _BlockData:
    produced: frozenset[str]           # intermediate values produced in the block
    residuals: frozenset[str]          # intermediate values its backward reads (any producer)
    extra_bytes: int                   # bytes of residuals that are not forward values
    ext_inputs: frozenset[str]         # intermediates produced before the block and used in it
    options: tuple[tuple[str, frozenset[str]], ...]  # (name, saved set) candidates
    time: float                        # roofline time of its forward equations


def crossing_bytes(g: Graph) -> list[int]:
    """Bytes of intermediate values live across each cut position 0..n (cut p: before op p)."""
    pos, last_use = _positions_and_last_uses(g)
    n = len(pos)
    diff = [0] * (n + 2)
    for vid, info in g.values.items():
        if info.producer is None or vid not in last_use:
            continue
        p = pos[info.producer]
        if last_use[vid] > p:
            diff[p + 1] += info.nbytes
            diff[last_use[vid] + 1] -= info.nbytes
    out, acc = [], 0
    for p in range(n + 1):
        acc += diff[p]
        out.append(acc)
    return out


def _positions_and_last_uses(g: Graph) -> tuple[dict[str, int], dict[str, int]]:
    """Position of each equation, and of the last equation reading each value (the graph's
    outputs: len(ops))."""
    pos = {oid: i for i, oid in enumerate(g.ops)}
    last_use: dict[str, int] = {}
    for oid, op in g.ops.items():
        for v in op.inputs:
            last_use[v] = pos[oid]
    for v in g.outputs:
        last_use[v] = len(pos)
    return pos, last_use


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
    # Merge blocks with no heavy equation (layer norms, residual adds) into the next block:
    # regions then start at the residual stream before a layer's first projection.
    heavy = [op.primitive in HEAVY_PRIMITIVES or bool(op.bodies) for op in ops]
    merged = [0]
    for k in range(1, len(bounds) - 1):
        a, b = merged[-1], bounds[k]
        if merge == "none":
            keep = True
        elif merge == "prev" and bounds[k] not in forced:
            # ... and the first cut of a heavy-free tail (the loss stays its own block).
            keep = any(heavy[a:b]) and (any(heavy[b:bounds[k + 1]]) or not any(heavy[b:n]))
        else:
            keep = any(heavy[a:b]) or bounds[k] in forced
        if keep:
            merged.append(bounds[k])
    if merge == "next" and len(merged) > 1 and not any(heavy[merged[-1]:n]) and merged[-1] not in forced:
        merged.pop()  # a trailing light block (loss reduction) joins the one before
    bounds = merged + [n]
    blocks = []
    for k in range(len(bounds) - 1):
        a, b = bounds[k], bounds[k + 1]
        ids = tuple(op.id for op in ops[a:b])
        kind = "scan" if (b - a == 1 and ops[a].primitive == "scan") else "ops"
        blocks.append(Block(k, a, b, ids, kind, _signature(g, ops[a:b]), any(heavy[a:b])))
    return tuple(blocks)


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


@dataclass
class ChainModel:
    """The chain problem built from a graph, and the way back to a `Plan`."""

    graph: Graph
    blocks: tuple[Block, ...]
    problem: ChainProblem
    cross: list[int]
    base_bytes: int
    data: list[_BlockData] = field(repr=False, default_factory=list)
    none_scale: float = 1.0
    raw_options: dict = field(repr=False, default_factory=dict)

    @property
    def raw_problem(self) -> ChainProblem:
        """The chain problem with every option kept (dominated ones included), for baselines."""
        return ChainProblem(self.problem.n_blocks, self.problem.base_bytes, self.raw_options,
                            self.problem.block_names)

    def option_kinds(self) -> list[str]:
        """Names of the per-region option kinds (`none`, `ckpt:recompute`, `ckpt:save:dots`, ...)."""
        names = []
        for opts in self.raw_options.values():
            for o in opts:
                if o.name not in names:
                    names.append(o.name)
        return names

    def period(self) -> tuple[int, int] | None:
        """`(offset, p)`: from block `offset` on, block structures repeat every `p` blocks
        (the layers of an unrolled stack), for at least two full periods; None if they do
        not, or if `p` is 1 (blocks are layers already)."""
        sigs = [b.signature for b in self.blocks]
        n = len(sigs)
        for p in range(2, n // 2 + 1):
            for s in range(0, n - 2 * p + 1):
                run = 0
                while s + run + p < n and sigs[s + run] == sigs[s + run + p]:
                    run += 1
                if run >= p:
                    if any(sigs[s + k] == sigs[s] for k in range(1, p)):
                        return None
                    # Cut where the least crosses (the residual stream between layers).
                    phase = min(range(p), key=lambda k: (self.cross[self.blocks[s + k].start], k))
                    return s + phase, p
        return None

    def uniform(self, kind: str, size: int = 1, *, scans_only: bool = False,
                offset: int = 0) -> tuple[Segment, ...] | None:
        """Every `size` consecutive blocks one region with option `kind`; scan blocks get
        the scan option of the same kind (`ckpt:save:dots` -> `scan:save:dots`).  With
        `scans_only`, only scan blocks get it and the others are left alone.

        This is how built-in policies applied per block are expressed in the same model
        (`ckpt:recompute` ~ nothing_saveable, `ckpt:save:dots` ~ dots_saveable,
        `ckpt:save:dots_no_batch` ~ dots_with_no_batch_dims_saveable, `none` ~ no remat;
        `scans_only` ~ a policy on the body of a scan over layers).  With `offset`, the
        first region ends at block `offset` (with `period()`: one region per layer, a
        policy applied per layer).  Returns None if some region lacks that option.
        """
        segs, i, nb = [], 0, self.problem.n_blocks
        scan_kind = kind.replace("ckpt:", "scan:", 1) if kind.startswith("ckpt:") else kind
        while i < nb:
            if self.blocks[i].kind == "scan":
                j, want = i + 1, scan_kind
            elif scans_only:
                j, want = i + 1, "none"
            elif not self.blocks[i].heavy:
                j, want = i + 1, "none"  # a light block (the loss) is left alone
            else:
                j = i + 1
                end = offset if i < offset else i + size
                while j < min(nb, end) and self.blocks[j].kind != "scan" and self.blocks[j].heavy:
                    j += 1
                want = kind
            opt = next((o for o in self.raw_options.get((i, j), ()) if o.name == want), None)
            if opt is None:
                return None
            segs.append(Segment(i, j, opt))
            i = j
        return tuple(segs)

    def to_plan(self, segments: Sequence[Segment], *, budget: int | None = None,
                result: SolveResult | None = None, meta: dict | None = None) -> Plan:
        """Turns chosen segments into a `Plan` for the traced function."""
        g = self.graph
        t = g.traced
        regions, scans, decisions = [], [], {}
        for seg in segments:
            payload = seg.option.payload or {}
            kind = payload.get("kind", "none")
            blocks = self.blocks[seg.start:seg.stop]
            if kind == "none":
                for b in blocks:
                    for vid in self.data[b.index].residuals:
                        decisions.setdefault(vid, "save")
                continue
            saved, off = frozenset(payload.get("saved", ())), frozenset(payload.get("offloaded", ()))
            if kind == "scan":
                scans.append(ScanPlan(payload["op"], saved, off))
                body = g.ops[payload["op"]].bodies[0]
                for vid in body.residual_values():
                    if body.values[vid].producer is not None:
                        decisions[vid] = "offload" if vid in off else ("save" if vid in saved else "recompute")
                continue
            start, stop = blocks[0].start, blocks[-1].stop
            label = f"blocks {seg.start}-{seg.stop - 1}: {seg.option.name}"
            regions.append(Region(start, stop, saved, off, label=label))
            for b in blocks:
                for vid in self.data[b.index].residuals | self.data[b.index].produced & (saved | off):
                    if g.values[vid].producer in b.ops:
                        decisions[vid] = "offload" if vid in off else ("save" if vid in saved else "recompute")
        values = {}
        for vid, dec in decisions.items():
            info = _value(g, vid)
            if info is None:
                continue
            op = _op(g, info.producer)
            values[vid] = ValueRecord(vid, dec, info.type_str, info.nbytes, op.primitive if op else "input",
                                      info.source, info.name, float(op.cost.flops) if op else 0.0,
                                      op.multiplicity if op else 1)
        from autoremat.graph._trace import describe_eqn
        m = dict(meta or {})
        if result is not None:
            m.update(solver=result.solver, status=result.status, gap=result.gap, solve_time=result.solve_time)
        m.setdefault("profile", g.profile.name)
        return Plan(
            fingerprint=t.fingerprint, n_eqns=len(t.jaxpr.eqns), regions=tuple(regions), scans=tuple(scans),
            values=values, argnums=t.argnums, static_argnums=t.static_argnums, has_aux=t.has_aux,
            predicted_peak=result.peak_bytes if result is not None else None, budget=budget,
            estimated_extra_time=result.objective if result is not None else None, meta=m,
            structure=tuple(describe_eqn(e) for e in t.jaxpr.eqns))


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


# -- recompute closure ------------------------------------------------------------------

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


def stored_residuals(g: Graph, ops: Sequence[OpInfo],
                     saved: frozenset[str] | None = None) -> tuple[frozenset[str], int]:
    """The residuals XLA actually keeps for a run of equations, and their extra bytes.

    JAX's linearization lists every value each equation's backward reads, but XLA fuses
    cheap elementwise work into the backward pass.  A residual read by a non-fusible
    equation's backward (a matmul's inputs) is stored as is; a residual read by a fusible
    equation's backward, if a fusible equation of the same run produced it, is recomputed
    from that equation's inputs (up to FUSION_DEPTH levels); extras of fusible equations
    (`1 - tanh(x)**2`) are recomputed from their inputs.  What remains is stored.  Measured
    against compiled no-remat steps: benchmarks report the error per model.

    With `saved` (the run is checkpointed and saves these values), an elementwise chain
    whose roots include a value the run recomputes is kept whole instead: XLA materializes
    the re-run chain's values (and extras) rather than fusing them into the backward; and
    outputs of EXPENSIVE equations count as roots (XLA does not duplicate them into several
    fusions).  Measured on the scan transformer's body (jax 0.10.2, CPU, benchmark size):
    per-iteration live bytes with nothing saved are close to JAX's full list, and with the
    matmul outputs saved close to the fusion-aware set; this rule gives both.  The scan
    transformer's per-point prediction errors in benchmarks/results/cpu.md went from
    +0.9..+21.7% (JAX's full list less the saved values) to -4.0..+13.6%.  Used for scan
    bodies only (see `build_chain_model`).
    """
    local = {op.id for op in ops}
    out: set[str] = set()
    extra = 0

    def roots(v: str, depth: int, acc: set[str]):
        prod = g.values[v].producer
        if prod is None:
            return  # a function input: counted in the base already
        op = g.ops.get(prod)
        if (op is not None and prod in local and _fusible(op) and depth < FUSION_DEPTH
                and not (saved is not None and op.primitive in EXPENSIVE)):
            for u in op.inputs:
                roots(u, depth + 1, acc)
        else:
            acc.add(v)

    def recomputed(acc: set[str]) -> bool:
        return saved is not None and any(g.values[u].producer in local and u not in saved for u in acc)

    for op in ops:
        fusible = _fusible(op)
        for v in op.residual_inputs + op.residual_outputs:
            if g.values[v].producer is None:
                continue
            if not fusible:
                out.add(v)  # read by a matmul/conv/reduction backward: stored as is
                continue
            acc: set[str] = set()
            roots(v, 0, acc)  # read by elementwise backward work: fused, recomputed ...
            if recomputed(acc) and g.values[v].producer in local:
                out.add(v)  # ... unless its chain is re-run: then kept whole
            else:
                out |= acc
        if op.extra_residual_bytes:
            if fusible:
                acc = set()
                for u in op.inputs:
                    roots(u, 1, acc)
                if recomputed(acc):
                    extra += op.extra_residual_bytes
                else:
                    out |= acc
            else:
                extra += op.extra_residual_bytes
    return frozenset(out), extra


def _block_data(g: Graph, b: Block, caps, region_method: str, time_limit: float | None,
                cache: dict) -> _BlockData:
    ops = [g.ops[o] for o in b.ops]
    produced = frozenset(v for op in ops for v in op.outputs)
    if b.kind == "scan":
        residuals = frozenset(v for op in ops for v in op.residual_inputs + op.residual_outputs
                              if g.values[v].producer is not None)
        extra = sum(op.extra_residual_bytes for op in ops)
    else:
        residuals, extra = stored_residuals(g, ops)
    ext_inputs = frozenset(v for op in ops for v in op.inputs
                           if g.values[v].producer is not None and v not in produced)
    time = sum(op.time for op in ops)
    if b.kind == "scan":
        return _BlockData(produced, residuals, extra, ext_inputs, (), time)
    key = b.signature
    if key in cache:
        proto_ids, proto_opts = cache[key]
        rename = dict(zip(proto_ids, [v for op in ops for v in op.outputs]))
        options = tuple((name, frozenset(rename[v] for v in s)) for name, s in proto_opts)
    else:
        options = _solve_block_options(g, ops, produced, residuals, caps, region_method, time_limit)
        cache[key] = ([v for op in ops for v in op.outputs], options)
    return _BlockData(produced, residuals, extra, ext_inputs, options, time)


def _region_problem(g: Graph, ops: Sequence[OpInfo], produced, residuals):
    from autoremat.solver._region import RegionProblem

    rt = recompute_times(g)
    return RegionProblem(
        value_bytes={v: g.values[v].nbytes for v in produced},
        producer={v: g.values[v].producer for v in produced},
        op_inputs={op.id: tuple(u for u in op.inputs if u in produced) for op in ops},
        op_time={op.id: rt[op.id] for op in ops},
        op_flops={op.id: float(op.cost.flops) for op in ops},
        needed=frozenset(v for v in residuals if v in produced),
        needed_ops=frozenset(op.id for op in ops if op.extra_residual_bytes),
    )


def _solve_block_options(g, ops, produced, residuals, caps, method, time_limit):
    """Candidate saved sets for one block, aligned to a fixed list of kinds.

    Kinds: `recompute` (nothing saved), `save:dots` (outputs of dot_general/conv),
    `save:dots_no_batch` (outputs of dot_generals without batch dimensions), `save:names`
    (values the user tagged with checkpoint_name), and `ilp<c>%` (the least recompute time
    with saved bytes <= c% of the block's residual bytes, solved exactly).  Every block has
    every kind, so a region over several blocks combines like with like.
    """
    from autoremat.solver import _region

    dots = frozenset(v for op in ops if op.primitive in ("dot_general", "conv_general_dilated") for v in op.outputs)
    no_batch = frozenset(v for op in ops if op.primitive == "dot_general" and not op.params.get("batch_dims")
                         for v in op.outputs)
    named = frozenset(v for op in ops if op.primitive == "name" for v in op.outputs)
    kinds = [("recompute", frozenset()), ("save:dots", dots), ("save:dots_no_batch", no_batch),
             ("save:names", named)]
    res_bytes = sum(g.values[v].nbytes for v in residuals if v in produced)
    problem = _region_problem(g, ops, produced, residuals) if res_bytes else None
    for c in caps:
        saved = frozenset()
        if problem is not None:
            cap = int(c * res_bytes)
            if method == "cpsat" and len(produced) <= 400:
                sol = _region.solve_region_cpsat(problem, cap, time_limit=time_limit)
                if sol.status not in ("optimal", "feasible"):
                    sol = _region.solve_region_greedy(problem, cap)
            else:
                sol = _region.solve_region_greedy(problem, cap)
            saved = frozenset(sol.saved)
        kinds.append((f"ilp{round(c * 100)}%", saved))
    return tuple(kinds)


# -- the chain problem ----------------------------------------------------------------

class _BackwardProfile:
    """Live bytes while a region's backward runs, equation by equation.

    The backward of a region visits its equations in reverse.  When it reaches equation
    `k`, the residuals of equations after `k` have been consumed and freed; still live are
    the residuals produced at or before `k`, the cotangents of values produced at or
    before `k` that are used after the region (they arrived at its output boundary, or
    earlier for values crossing the whole region: skip connections), and equation `k`'s
    own cotangents (of its outputs and of its differentiable inputs; none for elementwise
    equations, whose backward is fused).  The region's backward peak is the largest of
    these over its equations.
    """

    def __init__(self, g: Graph):
        ops = list(g.ops.values())
        self.pos, last_use = _positions_and_last_uses(g)
        n = len(ops)
        prod, last, nb = [], [], []
        for vid, info in g.values.items():
            if info.producer is None or info.producer not in self.pos or not info.differentiable:
                continue
            prod.append(self.pos[info.producer])
            last.append(last_use.get(vid, -1))
            nb.append(info.nbytes)
        self.prod = np.asarray(prod, dtype=np.int64)
        self.last = np.asarray(last, dtype=np.int64)
        self.nbytes = np.asarray(nb, dtype=np.float64)
        local = np.zeros(n)
        for i, op in enumerate(ops):
            if _fusible(op):
                continue  # its cotangents are computed inside a backward fusion
            vs = {v for v in op.outputs + op.inputs if g.values[v].differentiable}
            local[i] = sum(g.values[v].nbytes for v in vs)
        self.local = local
        self.extra = np.asarray([op.extra_residual_bytes for op in ops], dtype=np.float64)
        self.g = g

    def crossing_cotangents(self, a: int, b: int) -> np.ndarray:
        """Per equation k in [a, b): bytes of cotangents live from outside the region."""
        out = (self.last >= b) & (self.prod < b)
        through = float(self.nbytes[out & (self.prod < a)].sum())
        m = out & (self.prod >= a)
        inner = np.bincount(self.prod[m] - a, weights=self.nbytes[m], minlength=b - a)
        return through + np.cumsum(inner)

    def residual_prefix(self, a: int, b: int, values, extra: bool) -> np.ndarray:
        """Per equation k in [a, b): bytes of `values` produced in [a, k] (+ extras of [a, k])."""
        acc = np.zeros(b - a)
        for v in values:
            p = self.pos.get(self.g.values[v].producer)
            if p is not None and a <= p < b:
                acc[p - a] += self.g.values[v].nbytes
        if extra:
            acc += self.extra[a:b]
        return np.cumsum(acc)

    def peak(self, a: int, b: int, values, *, scale: float = 1.0, extra: bool = True) -> int:
        """Largest live bytes over the region's backward: `scale` x residual prefix + cotangents."""
        if b <= a:
            return 0
        live = scale * self.residual_prefix(a, b, values, extra) + self.crossing_cotangents(a, b) + self.local[a:b]
        return int(live.max())


def build_chain_model(g: Graph, *, offload: bool = True, max_region_blocks: int | None = None,
                      caps: Sequence[float] = DEFAULT_CAPS, region_method: str = "cpsat",
                      region_time_limit: float | None = 2.0, max_blocks: int = 160,
                      none_scale: float = 1.0, merge: str = "next",
                      block_cache: dict | None = None) -> ChainModel:
    """Builds the chain problem of a graph (see the module docstring).

    Args:
      block_cache: per-block candidate saved sets by structural signature; pass the same
        dict to several builds of one graph (recalibration, the other block variant) so the
        region solves are not repeated.
      none_scale: calibration of what un-checkpointed regions keep.  JAX's linearization
        lists every residual, but XLA fuses cheap elementwise residuals into the backward
        pass and never stores them; `optimize` measures the compiled un-optimized peak and
        scales the stored bytes of un-checkpointed regions by the ratio it finds.
    """
    blocks = find_blocks(g, max_blocks=max_blocks, merge=merge)
    cross = crossing_bytes(g)
    base = sum(g.values[v].nbytes for v in g.inputs)
    base += sum(g.values[v].nbytes for v in g.inputs if g.values[v].differentiable)
    base += sum(g.values[v].nbytes for v in g.outputs)
    cache: dict = {} if block_cache is None else block_cache
    data = [_block_data(g, b, caps, region_method, region_time_limit, cache) for b in blocks]
    nb = len(blocks)
    if max_region_blocks is None:
        max_region_blocks = max(1, min(nb, max(8, int(2 * math.sqrt(nb)) + 2)))
    host_bw = g.profile.host_bandwidth
    options: dict[tuple[int, int], tuple[Option, ...]] = {}
    closure_cache: dict = {}
    raw_options: dict[tuple[int, int], tuple[Option, ...]] = {}
    nbytes = lambda vs: sum(g.values[v].nbytes for v in vs)  # noqa: E731
    profile = _BackwardProfile(g)

    for i in range(nb):
        if blocks[i].kind == "scan":
            raw_options[(i, i + 1)] = _scan_options(
                g, blocks[i], data[i], cross, caps, region_method, region_time_limit, offload, host_bw, none_scale)
            options[(i, i + 1)] = _dedupe(list(raw_options[(i, i + 1)]))
            continue
        res_union: set[str] = set()
        ext = 0
        inputs: set[str] = set()
        produced: set[str] = set()
        fwd_time = 0.0
        for j in range(i + 1, min(nb, i + max_region_blocks) + 1):
            k = j - 1
            if blocks[k].kind == "scan":
                break
            d = data[k]
            res_union |= d.residuals
            ext += d.extra_bytes
            inputs |= {v for v in d.ext_inputs if v not in produced}
            produced |= d.produced
            fwd_time += d.time
            a, b = blocks[i].start, blocks[k].stop
            opts = []
            stored_none = int(none_scale * (nbytes(res_union) + ext))
            # Left alone, the region's residuals were stored in the forward pass; its backward
            # frees them equation by equation.
            bwd_none = profile.peak(a, b, res_union & produced, scale=none_scale)
            bwd_none += int(none_scale * nbytes(res_union - produced))
            opts.append(Option("none", stored_none, max(stored_none, bwd_none), 0.0, 0.0, 0,
                               {"kind": "none"}))
            in_b = nbytes(inputs)
            names = [name for name, _ in data[i].options]
            for oi, name in enumerate(names):
                saved: set[str] = set()
                for kk in range(i, j):
                    opts_k = data[kk].options
                    saved |= opts_k[min(oi, len(opts_k) - 1)][1] if opts_k else set()
                saved -= inputs
                rtime, rflops = _region_recompute(g, blocks, data, i, j, oi, closure_cache)
                s_b = nbytes(saved)
                # Checkpointed: inputs and saved values stay; the rest is recomputed up front
                # and freed as the backward goes.  (The scan bodies' rule, chains re-run kept
                # whole, is not used here: it lowered the unrolled transformer's predictions
                # further below XLA's, -3% -> -10% with nothing saved per block, and the
                # U-Net's solver plans then missed its 9.1 MiB floor; docs/FINDINGS.md.)
                live_bwd = nbytes(inputs | saved) + profile.peak(a, b, (res_union & produced) - saved)
                opts.append(Option(f"ckpt:{name}", in_b + s_b, live_bwd, rtime, rflops, 0,
                                   {"kind": "region", "saved": frozenset(saved)}))
                if offload and s_b > 0:
                    exposed = max(0.0, 2 * s_b / host_bw - OFFLOAD_OVERLAP * 3 * fwd_time)
                    opts.append(Option(f"ckpt:{name}+offload", in_b, live_bwd, rtime + exposed, rflops, s_b,
                                       {"kind": "region", "saved": frozenset(), "offloaded": frozenset(saved)}))
            raw_options[(i, j)] = tuple(opts)
            options[(i, j)] = _dedupe(opts)
    # Gradient buffers.  XLA's buffer assignment lets activations use the memory of a
    # gradient output until that gradient is written, which happens in the backward pass of
    # the parameter's first use (measured: the MLP with nothing saved per layer compiles to
    # its arguments + gradients + 1.0 MiB although 3.5 MiB of layer inputs are stored).  So a
    # gradient counts only from the backward of the region holding its first use: while
    # region [i, j) runs backward, the gradients of parameters first used in block >= i.
    grads = _gradient_bytes_from(g, blocks)
    base -= grads[0]

    def with_grads(table):
        return {k: tuple(dataclasses.replace(o, backward_bytes=o.backward_bytes + grads[k[0]]) for o in v)
                for k, v in table.items()}

    options, raw_options = with_grads(options), with_grads(raw_options)
    problem = ChainProblem(nb, int(base), options, tuple(f"{b.start}-{b.stop}" for b in blocks))
    return ChainModel(g, blocks, problem, cross, int(base), data, none_scale, raw_options)


def _gradient_bytes_from(g: Graph, blocks: Sequence[Block]) -> list[int]:
    """Per block i: bytes of the gradients of differentiated inputs first used in a block >= i
    (inputs never used count everywhere: their zero gradient may be written at any time)."""
    block_of = {}
    for b in blocks:
        for oid in b.ops:
            block_of[oid] = b.index
    first = {}
    for op in g.ops.values():
        for v in op.inputs:
            if v not in first and g.values[v].producer is None:
                first[v] = block_of.get(op.id, 0)
    out = [0] * (len(blocks) + 1)
    for v in g.inputs:
        info = g.values[v]
        if info.differentiable:
            k = first.get(v, len(blocks))
            for i in range(0, min(k, len(blocks) - 1) + 1):
                out[i] += info.nbytes
    return out


def _dedupe(opts: list[Option]) -> tuple[Option, ...]:
    """Drops options dominated in (stored, backward, time) by another option."""
    keep = []
    for o in sorted(opts, key=lambda o: (o.extra_time, o.stored_bytes, o.backward_bytes)):
        if any(k.stored_bytes <= o.stored_bytes and k.backward_bytes <= o.backward_bytes
               and k.extra_time <= o.extra_time and k.offloaded_bytes <= o.offloaded_bytes for k in keep):
            continue
        keep.append(o)
    return tuple(keep)


def _region_recompute(g, blocks, data, i, j, oi, cache):
    """Recompute time and FLOPs of region [i, j) with option index oi in every block."""
    needed: set[str] = set()
    total_t, total_f = 0.0, 0.0
    for k in range(j - 1, i - 1, -1):
        d = data[k]
        saved = d.options[min(oi, len(d.options) - 1)][1] if d.options else frozenset()
        need_out = frozenset(v for v in needed if v in d.produced)
        key = (k, oi, need_out)
        if key not in cache:
            R, outside = _closure(g, blocks[k].ops, saved, need_out, d.residuals)
            rt = recompute_times(g)
            cache[key] = (R, outside, sum(rt[o] for o in R), sum(g.ops[o].cost.flops for o in R))
        R, outside, t, f = cache[key]
        total_t += t
        total_f += f
        needed -= need_out
        needed |= outside
    return total_t, total_f


def _with_name_aliases(ops, values: frozenset) -> frozenset:
    """`values` plus their `checkpoint_name` aliases, both ways.

    A `name` equation's output and input are one buffer: saving `checkpoint_name(x @ w, "out")`
    keeps the matmul output too, so recomputing what reads it does not re-run the matmul.
    """
    out = set(values)
    for o in ops:
        if o.primitive == "name" and o.inputs and o.outputs:
            if o.inputs[0] in values:
                out.add(o.outputs[0])
            elif o.outputs[0] in values:
                out.add(o.inputs[0])
    return frozenset(out)


def _scan_options(g, b, d, cross, caps, method, time_limit, offload, host_bw, none_scale=1.0):
    op = g.ops[b.ops[0]]
    body = op.bodies[0]
    length = int(op.params.get("length", 1))
    ncar = int(op.params.get("num_carry", 0))
    nconst = int(op.params.get("num_consts", 0))
    body_largest = max((v.nbytes for v in op.bodies[0].values.values() if v.producer is not None), default=0)
    cot = cross[b.stop] + WORKSPACE_FACTOR * body_largest
    opts = []
    # No remat: JAX's own residuals of the whole scan (stacked over iterations).
    none_b = int(none_scale * (sum(g.values[v].nbytes for v in d.residuals) + d.extra_bytes))
    opts.append(Option("none", none_b, none_b + cot, 0.0, 0.0, 0, {"kind": "none"}))
    body_ops = list(body.ops.values())
    produced = frozenset(v for o in body_ops for v in o.outputs)
    # What one iteration's backward keeps, fusion-aware as for top-level blocks.
    residuals, body_extra = stored_residuals(body, body_ops)
    carry_ids = body.inputs[nconst:nconst + ncar]
    xs_ids = body.inputs[nconst + ncar:]
    # Per iteration, a checkpointed body keeps its carry and the slices it reads.
    # (The scanned-over slices are forwarded from the stacked inputs by JAX, not copied.)
    del xs_ids
    per_iter_in = sum(body.values[v].nbytes for v in carry_ids)
    # While one iteration's backward runs, its recomputed residuals are live.  Inside a
    # loop body XLA keeps more than the fusion-aware set (measured on the scan transformer,
    # nothing saved: fusion-aware 43.6 MiB predicted vs 50.8 compiled; JAX's full list
    # 54.1): chains re-run are kept whole (`stored_residuals` with a saved set).
    # The body is solved once for all iterations, and its saved set is the only knob of
    # the whole scan: ask the region solver at a finer grid of caps than for blocks.
    scan_caps = sorted(set(caps) | set(SCAN_CAPS))
    cands = _solve_block_options(body, body_ops, produced, residuals, scan_caps, method, time_limit)
    # The user's own vocabulary: each checkpoint_name saved alone, and with the matmul
    # outputs without batch dimensions (MaxText's save_out_proj, minimal_with_context, ...).
    tags: dict[str, frozenset] = {}
    for o in body_ops:
        if o.primitive == "name" and isinstance(o.params.get("name"), str):
            tags[o.params["name"]] = tags.get(o.params["name"], frozenset()) | frozenset(o.outputs)
    no_batch = dict(cands).get("save:dots_no_batch", frozenset())
    covered = _with_name_aliases(body_ops, no_batch)  # tags of those matmul outputs add nothing
    # Two tags saved together (MaxText's presets are such sets), up to MAX_TAG_PAIRS tags.
    pairs = (itertools.combinations(sorted(tags), 2) if len(tags) <= MAX_TAG_PAIRS else ())
    cands = tuple(cands) + tuple((f"save:name:{n}", vs) for n, vs in sorted(tags.items())) + tuple(
        (f"save:name:{a}+{b}", tags[a] | tags[b]) for a, b in pairs) + tuple(
        (f"save:dots_no_batch+{n}", no_batch | vs) for n, vs in sorted(tags.items()) if not vs <= covered)
    body_time = sum(o.time for o in body_ops)
    body_rt = recompute_times(body)
    for name, saved in cands:
        # A saved value also stands for its `checkpoint_name` alias (same buffer:
        # MaxText-style tags), in what is recomputed and in what is live.
        kept = _with_name_aliases(body_ops, saved)
        R, _ = _closure(body, [o.id for o in body_ops], kept, frozenset(), residuals)
        rt = length * sum(body_rt[o] for o in R)
        rf = length * sum(body.ops[o].cost.flops for o in R)
        s_b = sum(body.values[v].nbytes for v in saved)
        stored = length * (per_iter_in + s_b)
        # The iteration's saved values are part of `stored` already; the rest of what its
        # backward reads is re-run and live (chains re-run are kept whole).
        rerun, rerun_extra = stored_residuals(body, body_ops, kept)
        iteration = sum(body.values[v].nbytes for v in rerun - kept) + rerun_extra + cot
        live = stored + iteration
        opts.append(Option(f"scan:{name}", stored, live, rt, rf, 0,
                           {"kind": "scan", "op": op.id, "saved": saved}))
        if offload and s_b:
            exposed = max(0.0, 2 * length * s_b / host_bw - OFFLOAD_OVERLAP * 3 * length * body_time)
            opts.append(Option(f"scan:{name}+offload", length * per_iter_in, length * per_iter_in + s_b + iteration,
                               rt + exposed, rf,
                               length * s_b, {"kind": "scan", "op": op.id, "saved": frozenset(),
                                              "offloaded": saved}))
    return tuple(opts)
