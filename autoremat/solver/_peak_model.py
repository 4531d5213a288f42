"""The peak-memory model of one block: what it stores for the backward pass, and what is live
while its backward runs.

`stored_residuals` estimates which of JAX's residuals XLA materializes (re-run elementwise
chains and outputs of expensive ones are, chains from saved values are fused);
`_BackwardProfile` walks a block's backward pass equation by equation.  The chain formula that
composes blocks is `_chain.evaluate`.  docs/FINDINGS.md records where this model misses XLA's
compiled peak (-18..+39% on the benchmark models).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autoremat.graph._graph import Graph, OpInfo
from autoremat.graph._layers import positions_and_last_uses as _positions_and_last_uses
from autoremat.solver._recompute import EXPENSIVE, FUSION_DEPTH, _fusible


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
