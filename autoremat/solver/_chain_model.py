"""The chain model: from a dataflow graph to the chain problem every solver works on.

The model (docs/FINDINGS.md; the parts live in `_blocks`, `_peak_model`, `_recompute`,
`_region_options` and `_scan_options`; `autoremat._bridge.to_plan` turns a solution into a `Plan`):

* **Blocks.**  The top-level equations are cut into a chain of blocks at the positions where
  the bytes of intermediate values crossing the cut are a local minimum (the residual stream
  between layers).  Each top-level `scan` is a block of its own.
* **Regions.**  A region covers blocks `[i, j)` and is either left alone (JAX saves what its
  linearization needs) or becomes one `jax.checkpoint` whose inputs are saved by
  construction and whose interior keeps only a saved set `S` (device) or an offloaded set.
  A checkpointed region may hold one scan block, the scan checkpointed inside it under one of
  its own options (`_Regions.around_scan`: a recurrent layer and its cell).
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
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field


from autoremat.graph._graph import Graph
from autoremat.solver._chain import ChainProblem, Option, Segment
from autoremat.solver._blocks import Block, crossing_bytes, find_blocks
from autoremat.solver._peak_model import _BackwardProfile
from autoremat.solver._recompute import OFFLOAD_OVERLAP
from autoremat.solver._region_options import DEFAULT_CAPS, _block_data, _BlockData, _region_recompute
from autoremat.solver._scan_options import _scan_options, made_operand_bytes

__all__ = ["AROUND", "ChainModel", "build_chain_model"]

# The option names of a region around a scan block (`_Regions.around_scan`): AROUND + the scan's.
AROUND = "ckpt:around:"


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

    @functools.cached_property
    def raw_problem(self) -> ChainProblem:
        """The chain problem with every option kept (dominated ones included), for baselines;
        built once (validating its ~20k options took 9 ms, and a search at 1B asked about 90
        times a budget: 0.8 s, a /tmp probe timing 90 evaluations on Llama 1B; 0.01 s now)."""
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
        around = kind.startswith(AROUND)  # regions go on over scan blocks
        while i < nb:
            if self.blocks[i].kind == "scan":
                j, want = i + 1, kind  # `_option` gives a scan block its scan kind
            elif scans_only:
                j, want = i + 1, "none"
            elif not self.blocks[i].heavy:
                j, want = i + 1, "none"  # a light block (the loss) is left alone
            else:
                j = i + 1
                end = offset if i < offset else i + size
                while j < min(nb, end) and (around or self.blocks[j].kind != "scan" and self.blocks[j].heavy):
                    j += 1
                want = kind
            opt = self._option(i, j, want)
            if opt is None:
                return None
            segs.append(Segment(i, j, opt))
            i = j
        return tuple(segs)

    def _option(self, i: int, j: int, name: str) -> Option | None:
        """The option called `name` of the region over blocks `[i, j)`, scan blocks' own kind
        (`ckpt:...` -> `scan:...`) where `[i, j)` is one scan block; None if there is none."""
        if name.startswith(AROUND) and (j == i + 1 or not any(b.kind == "scan" for b in self.blocks[i:j])):
            # a scan alone: its option; no scan in it: the same kind as a plain region
            name = name[len(AROUND):] if self.blocks[i].kind == "scan" else name[len(AROUND):].replace("scan:", "ckpt:", 1)
        if j == i + 1 and self.blocks[i].kind == "scan" and name.startswith("ckpt:"):
            name = name.replace("ckpt:", "scan:", 1)
        return next((o for o in self.raw_options.get((i, j), ()) if o.name == name), None)

    def per_span(self, kind: str | Sequence[str], spans: Sequence[tuple[int, int]]) -> tuple[Segment, ...] | None:
        """One region with option `kind` (or `kind[k]` on span k) per span of top-level equations
        `[start, stop)` (the layers `graph.find_layers` found), over the blocks that start inside
        it; a scan block gets the scan option of the same kind, blocks outside every span are
        left alone.
        This is a policy per layer written by hand, in the model's terms (its regions start and
        stop on the block boundaries nearest the layer's); with an AROUND kind, one region over
        the layer with its scans inside under the scan option the kind names (`_hand.Nested`).
        None if some region lacks that option."""
        def span_of(b: Block):
            return next((k for k, (lo, hi) in enumerate(spans) if lo <= b.start < hi), None)

        kinds = [kind] * len(spans) if isinstance(kind, str) else list(kind)
        segs, i, nb = [], 0, self.problem.n_blocks
        while i < nb:
            k, j = span_of(self.blocks[i]), i + 1
            if k is not None and self.blocks[i].kind != "scan":
                around = kinds[k].startswith(AROUND)  # one region over the layer, its scans inside
                while j < nb and span_of(self.blocks[j]) == k and (around or self.blocks[j].kind != "scan"):
                    j += 1
            opt = self._option(i, j, "none" if k is None else kinds[k])
            if opt is None:
                return None
            segs.append(Segment(i, j, opt))
            i = j
        return tuple(segs)


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
      region_time_limit: seconds per CP-SAT search, a safety net: its deterministic time bounds
        the searches (`_region.FIRST_SEARCH_S`), so that a set does not depend on the machine's
        load; the Griffin-style hybrid's scan body's second searches take 0.5-1.6 s of it
        alone, so a loaded machine may still cut them short (docs/FINDINGS.md, forty-sixth
        session).
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
    scans = {(i, i + 1): _scan_options(g, blocks[i], data[i], cross, caps, region_method, region_time_limit,
                                       offload, g.profile.host_bandwidth, none_scale)
             for i in range(nb) if blocks[i].kind == "scan"}
    regions = _Regions(g, blocks, data, none_scale, offload, cache, scans)
    raw_options: dict[tuple[int, int], tuple[Option, ...]] = {}
    for i in range(nb):  # in block order: the option kinds' order names the uniform plans
        if blocks[i].kind == "scan":
            raw_options[(i, i + 1)] = scans[(i, i + 1)]
        else:
            raw_options.update(regions.starting_at(i, max_region_blocks))
    options = {k: _dedupe(list(v)) for k, v in raw_options.items()}
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


@dataclass
class _Span:
    """What the blocks [i, j) of a region hold, grown one block at a time."""

    residuals: set = field(default_factory=set)
    extra_bytes: int = 0
    inputs: set = field(default_factory=set)
    produced: set = field(default_factory=set)
    time: float = 0.0

    def add(self, d: _BlockData) -> None:
        self.residuals |= d.residuals
        self.extra_bytes += d.extra_bytes
        self.inputs |= {v for v in d.ext_inputs if v not in self.produced}
        self.produced |= d.produced
        self.time += d.time


class _Regions:
    """The options of ordinary (non-scan) regions: left alone, or checkpointed with each of
    the first block's saved-set kinds (and offloaded, where offload is on)."""

    def __init__(self, g: Graph, blocks, data, none_scale: float, offload: bool, cache: dict, scans: dict):
        self.g, self.blocks, self.data = g, blocks, data
        self.scans = scans  # (i, i + 1) -> the options of scan block i
        self.none_scale, self.offload = none_scale, offload
        self.cache = cache  # the build's block cache: checkpointed options do not move with none_scale
        self.profile = _BackwardProfile(g)
        self.closure_cache: dict = {}

    def nbytes(self, vs) -> int:
        return sum(self.g.values[v].nbytes for v in vs)

    def starting_at(self, i: int, max_region_blocks: int) -> dict:
        """(i, j) -> options, for every region from block i up to the next scan block, and on
        over it to the one after (`around_scan`)."""
        out, span, scan = {}, _Span(), None
        for j in range(i + 1, min(len(self.blocks), i + max_region_blocks) + 1):
            if self.blocks[j - 1].kind == "scan":
                if scan is not None:
                    break
                scan = j - 1
            span.add(self.data[j - 1])
            if scan is None:
                out[(i, j)] = tuple([self.left_alone(i, j, span)] + self.checkpointed_once(i, j, span))
            elif j > scan + 1 and (around := self.around_scan(i, j, scan, span)):
                out[(i, j)] = around
        return out

    def around_scan(self, i: int, j: int, s: int, span: _Span) -> tuple[Option, ...]:
        """A region over blocks [i, j) that holds scan block `s` (and begins before it): one
        checkpoint, the scan inside it run under one of its own options (a checkpoint in the
        checkpoint), as a person writes `jax.checkpoint` around an RNN layer whose cell is
        checkpointed too.  JAX keeps the inner checkpoint's residuals from the forward pass
        through the outer one: on the unrolled stacked LSTM (benchmarks/_unseen.py `lstm`, 4
        layers), `nothing_saveable` on each layer and on its cell compiles to 8.63 GiB, and with
        `dots_saveable` on the cell to 10.63, the 4 x 512 MiB of its stacked matmul outputs
        more; XLA's live ranges hold each layer's stacked carries and scanned input at the peak.
        So the region stores its inputs and what the scan's option stores; its backward re-runs
        its forward (the scan's too), goes back through the blocks after the scan (the scan's
        stacks and the blocks before it live), the scan, and the blocks before it.  Nothing
        inside stored between the blocks: on that LSTM the plan of `nothing_saveable` on each
        layer and its cell compiled to 8.07 GiB (the head recomputed), where the same options
        cut at the scan compiled to 12.50 and the lowest plan without this option to 12.38.
        Only around a scan over operands the step makes (an RNN's projected inputs): around a
        scan over layers' weights the region would keep only its own input in place of the
        scan's, for the forward of the blocks around it re-run."""
        if not made_operand_bytes(self.g, self.g.ops[self.blocks[s].ops[0]]):
            return ()
        pre = self.left_alone(i, s, self._span(i, s)) if s > i else None
        post = self.left_alone(s + 1, j, self._span(s + 1, j)) if j > s + 1 else None
        pre_s, pre_b = (pre.stored_bytes, pre.backward_bytes) if pre else (0, 0)
        post_b = post.backward_bytes if post else 0
        in_b = self.nbytes(span.inputs)
        rtime, rflops = _region_recompute(self.g, self.blocks, self.data, i, j, 0, self.closure_cache)
        out = []
        for o in self.scans[(s, s + 1)]:
            p = o.payload or {}
            if p.get("kind") != "scan" or p.get("offloaded"):
                continue
            live = in_b + max(pre_s + o.stored_bytes + post_b, pre_s + o.backward_bytes, pre_b)
            out.append(Option(f"{AROUND}{o.name}", in_b + o.stored_bytes, live, rtime + o.extra_time, rflops + o.recompute_flops,
                              0, {"kind": "region", "saved": frozenset(), "scan": p}))
        return tuple(out)

    def _span(self, i: int, j: int) -> _Span:
        span = _Span()
        for k in range(i, j):
            span.add(self.data[k])
        return span

    def checkpointed_once(self, i: int, j: int, span: _Span) -> list[Option]:
        """`checkpointed`, once per block ranges over the builds that share the block cache
        (the recalibrated rebuild redid them: Llama's took 4.03 s, now 0.83; benchmarks/chain_build.py)."""
        key = ("checkpointed", self.offload, tuple((b.start, b.stop) for b in self.blocks[i:j]))
        if key not in self.cache:
            self.cache[key] = self.checkpointed(i, j, span)
        return self.cache[key]

    def left_alone(self, i: int, j: int, span: _Span) -> Option:
        """The region's residuals were stored in the forward pass; its backward frees them
        equation by equation."""
        a, b, sc = self.blocks[i].start, self.blocks[j - 1].stop, self.none_scale
        stored = int(sc * (self.nbytes(span.residuals) + span.extra_bytes))
        bwd = self.profile.peak(a, b, span.residuals & span.produced, scale=sc)
        bwd += int(sc * self.nbytes(span.residuals - span.produced))
        return Option("none", stored, max(stored, bwd), 0.0, 0.0, 0, {"kind": "none"})

    def checkpointed(self, i: int, j: int, span: _Span) -> list[Option]:
        """Inputs and saved values stay; the rest is recomputed up front and freed as the
        backward goes.  (The scan bodies' rule, chains re-run kept whole, is not used here: it
        lowered the unrolled transformer's predictions further below XLA's, -3% -> -10% with
        nothing saved per block, and the U-Net's solver plans then missed its 9.1 MiB floor;
        docs/FINDINGS.md.)"""
        a, b = self.blocks[i].start, self.blocks[j - 1].stop
        in_b, opts = self.nbytes(span.inputs), []
        for oi, (name, _) in enumerate(self.data[i].options):
            saved: set[str] = set()
            for kk in range(i, j):
                opts_k = self.data[kk].options
                saved |= opts_k[min(oi, len(opts_k) - 1)][1] if opts_k else set()
            saved -= span.inputs
            rtime, rflops = _region_recompute(self.g, self.blocks, self.data, i, j, oi, self.closure_cache)
            s_b = self.nbytes(saved)
            live_bwd = self.nbytes(span.inputs | saved) + self.profile.peak(
                a, b, (span.residuals & span.produced) - saved)
            opts.append(Option(f"ckpt:{name}", in_b + s_b, live_bwd, rtime, rflops, 0,
                               {"kind": "region", "saved": frozenset(saved)}))
            if self.offload and s_b > 0:
                host_bw = self.g.profile.host_bandwidth
                exposed = max(0.0, 2 * s_b / host_bw - OFFLOAD_OVERLAP * 3 * span.time)
                opts.append(Option(f"ckpt:{name}+offload", in_b, live_bwd, rtime + exposed, rflops, s_b,
                                   {"kind": "region", "saved": frozenset(), "offloaded": frozenset(saved)}))
        return opts


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
