"""Finding the layers of any model, without its author's cooperation.

A training step's top-level equations are mostly a stack of identical layers: an unrolled
`for` loop over blocks, a library's layer stack, the stages of a conv net.  Per-layer
measurements (`runtime/_measure.py`) need to know where the layers are and which are the same:

* **Repeats.**  Each equation gets a token (primitive, types, and where its operands come from:
  how far back, or, for a value several equations read, only its type; so the token does not
  depend on where the layer sits, nor on how far back a value read by every layer was made);
  equations that depend on no input (masks, position tables) are left out, so layers alike but
  for a constant still repeat.  A layer stack is a tandem repeat of the token sequence: a
  period `P` with `tokens[i] == tokens[i + P]` over a run covering at least two periods.  The
  period covering the most equations wins (the smallest such period, so two layers are not
  taken for one); the search repeats on what is left, so a model with two stacks (an encoder
  and a decoder) gets both.  A repeat whose unit holds a shorter block repeating inside it
  (a hybrid's groups of two recurrent blocks and one attention block) is cut into its blocks
  where those repeats' cuts lie on the residual stream (`_unit_cuts`), as its author wraps them.
* **Where a layer starts.**  Within the period, at the cut crossed by the fewest bytes of
  intermediate values: the residual stream between layers (`crossing_bytes`).  Where several
  cuts are crossed by equally few (a block's residual add and the activation after it), at the
  one where the user's modules change (JAX's name stack, `cut_levels`); then the earliest.
* **Layers that do not repeat.**  Between the stacks, the pieces cut on the residual stream that
  hold two or more matmuls or convs (a ResNet stage's first block, with its projection
  shortcut), each from where the user's module holding its first matmul starts to where the
  one holding its last ends (as a person checkpoints it), where the name stack has one; a lone
  matmul (stem, head) is left outside.
* **Stages joined by skips.**  Where nothing repeats (a U-Net, whose stages all differ in
  width), the stages end where its long skips are made and taken (`_stages`); a model with
  neither repeats nor skips gets no layers: its plans are the chain solver's.
* **Which layers are the same.**  The layers' dataflow subgraphs are hashed with networkx's
  Weisfeiler-Lehman graph hash (node labels: primitive and types; inputs from outside the
  layer: their types and whether they are the function's inputs): equal hashes share one
  measurement.

Top-level `scan`s (`lax.scan`, flax `nn.scan`, haiku `layer_stack`, ...) are layers of their
own: the scan's body is the layer and its trip count the stack's depth.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass

import networkx as nx
import numpy as np

from autoremat.graph._costs import MATMUL_PRIMITIVES
from autoremat.graph._graph import Graph, OpInfo

__all__ = ["Layer", "crossing_bytes", "find_layers", "layer_spans"]

# Equations that make a run of equations a layer worth measuring (a stack of elementwise ops
# repeating is not one).
HEAVY_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated", "scan", "while", "cond",
                              "custom_vjp_call", "custom_jvp_call", "custom_vjp_call_jaxpr"})


@dataclass(frozen=True)
class Layer:
    """Top-level equations `[start, stop)` forming one layer; `key` is equal for identical ones."""

    start: int
    stop: int
    key: str


def layer_spans(layers) -> list[list]:
    """`[start, stop, key]` per layer: how plans record where the layers are (`plan.meta`), so
    that a saved plan can be shown per layer without the function."""
    return [[layer.start, layer.stop, layer.key] for layer in layers]


def is_heavy(op: OpInfo) -> bool:
    """A matmul, conv or control-flow equation (what makes a block or a layer worth one)."""
    return op.primitive in HEAVY_PRIMITIVES or bool(op.bodies)


def crossing_bytes(g: Graph) -> list[int]:
    """Bytes of intermediate values live across each cut position 0..n (cut p: before op p)."""
    n = len(g.ops)
    diff = [0] * (n + 2)
    for p, last, nbytes in _lifetimes(g):
        diff[p + 1] += nbytes
        diff[last + 1] -= nbytes
    return [int(x) for x in np.cumsum(diff[:n + 1])]


def _lifetimes(g: Graph) -> list[tuple[int, int, int]]:
    """(producer's position, last reader's position, bytes) of each intermediate value read
    after the equation that makes it."""
    pos, last_use = positions_and_last_uses(g)
    return [(pos[info.producer], last_use[v], info.nbytes) for v, info in g.values.items()
            if info.producer is not None and last_use.get(v, -1) > pos[info.producer]]


def positions_and_last_uses(g: Graph) -> tuple[dict[str, int], dict[str, int]]:
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


def find_layers(g: Graph, *, min_heavy: int = 1) -> tuple[Layer, ...]:
    """The layers of `g`'s top-level equations, in order (see the module docstring)."""
    ops = list(g.ops.values())
    order = [(c, lvl) for c, lvl in zip(crossing_bytes(g), cut_levels(g))]  # which cut is the better start
    spans = _repeats(g, ops, order, min_heavy)
    for i, op in enumerate(ops):
        if op.primitive == "scan" and not any(a <= i < b for a, b in spans):
            spans.append((i, i + 1))
    spans.sort()
    matmuls = np.array([_matmuls(op) for op in ops])
    if spans:
        spans = sorted(spans + _one_off_layers(g, matmuls, order, _gaps(spans, len(ops))))
    else:
        spans = _stages(g, matmuls)
    return tuple(Layer(a, b, _layer_hash(g, ops, a, b)) for a, b in spans)


def _repeats(g: Graph, ops: list[OpInfo], order: list, min_heavy: int) -> list[tuple[int, int]]:
    """The repeated layers' spans, found on the equations that depend on the function's inputs:
    the constant ones (masks and position tables from `iota`s and literals) are left out of the
    search and go with the equations after them.  Layers alike but for a constant (a decoder
    alternating local and global attention, whose local layers' mask adds a few comparisons)
    then repeat layer by layer, not only in pairs (6 layers of two found in such a 12-layer
    decoder, where a person wraps each of the 12; at the 12 layers' hand-written
    `dots_with_no_batch_dims_saveable` peak autoremat recomputed more than that policy:
    benchmarks/unseen.py); their keys still tell the two kinds apart."""
    const = _constant(g, ops)
    keep = [i for i in range(len(ops)) if not const[i]]
    if not keep:
        return []
    kept = [ops[i] for i in keep]
    cut = [0] + [i + 1 for i in keep]  # where cut c of the kept equations falls among all of them
    found: list[tuple[int, int]] = []
    _find_runs(g, kept, _tokens(g, kept), np.array([is_heavy(op) for op in kept]), [order[c] for c in cut],
               0, len(kept), found, min_heavy)
    return [(cut[a], cut[b]) for a, b in found]


def _constant(g: Graph, ops: list[OpInfo]) -> list[bool]:
    """Per equation: whether it depends on no input of the function (only on literals and
    other such equations: an `iota`, a mask made from them)."""
    made: set[str] = set()
    out = []
    for op in ops:
        c = all(g.values[v].producer is not None and v in made for v in op.inputs)
        if c:
            made.update(op.outputs)
        out.append(c)
    return out


def _gaps(spans: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """The runs of top-level equations outside `spans` (sorted, disjoint)."""
    edges = [0] + [x for span in spans for x in span] + [n]
    return [(a, b) for a, b in zip(edges[0::2], edges[1::2]) if b > a]


def _matmuls(op: OpInfo) -> int:
    """Matmuls and convolutions in an equation, nested bodies included."""
    if op.primitive in MATMUL_PRIMITIVES:
        return 1
    return sum(_matmuls(inner) for body in op.bodies for inner in body.ops.values())


def _one_off_layers(g: Graph, matmuls: np.ndarray, order: list, gaps) -> list[tuple[int, int]]:
    """Layers that do not repeat, in the equations between the stacks: the pieces of a gap
    between residual-stream cuts (where one value alone carries everything on, apart from
    values live across the whole gap: masks, position tables, a U-Net's skips) that hold at
    least two matmuls or convs (`matmuls`: per equation).  A ResNet stage's first bottleneck
    (a projection shortcut, so unlike the rest: ResNet-50 gave 12 of its 16 blocks without
    this) is one; a lone matmul (a head, a stem conv) is what people leave outside their
    per-layer checkpoints.  A piece's edges are its user's module's where they can be
    (`_heavy_pieces`)."""
    ops = list(g.ops.values())
    const, lives, modules = _constant(g, ops), _lifetimes(g), _modules(g, ops)
    out = []
    for a, b in gaps:
        if matmuls[a:b].sum() < 2:
            continue
        # values live across cut c (before op c), c in [a, b]: all, and those made from constants
        count, made = np.zeros((2, b - a + 2), dtype=np.int64)
        for p, last, _ in lives:
            lo, hi = max(p + 1, a), min(last, b)
            if lo <= hi and not (p < a and last >= b):  # not live across the whole gap
                for arr in (count, made) if const[p] else (count,):
                    arr[lo - a] += 1
                    arr[hi - a + 1] -= 1
        count, made = np.cumsum(count)[:b - a + 1], np.cumsum(made)[:b - a + 1]
        cuts = sorted({a + int(c) for c in np.flatnonzero(count <= 1)} | {a, b})
        # a module's edge may also have a constant (a position table) crossing it
        edges = {a + int(c) for c in np.flatnonzero(count - made <= 1)} | {a, b}
        out += _heavy_pieces(matmuls, order, cuts, lambda i, step: _module_edge(modules, i, step, edges, matmuls))
    return out


def _stages(g: Graph, matmuls: np.ndarray) -> list[tuple[int, int]]:
    """The stages of a model where nothing repeats but long skips run (a U-Net whose stages all
    differ in width): a skip is a value live across at least two matmuls or convs, and where one
    is made (a down stage's output) or last read (the up stage that concatenates it) a stage
    ends.  Each end goes to the cut, between the second heavy equation after the stage before and
    the next heavy one from the end on, whose crossing values the next stage reads least bytes of
    (`_Cuts.inputs`; latest of equals), among those that at most one value other than the skips
    crosses.  A down stage then closes after the pooling of its skip, and an up stage opens at
    the narrow input it upsamples, as a person writes them (`examples.convnet`: each JAX policy
    on the stages found compiles to the per-stage program written by hand, to the byte;
    benchmarks/results/unet_stages.md).  The pieces between the ends
    with at least two heavy equations are the layers; the first and last keep as many heavy
    equations as their neighbour stage (the stages mirror each other), leaving a stem or head
    conv outside.  None without skips."""
    cuts = _Cuts(g, matmuls)
    heavy, n = np.flatnonzero(matmuls), len(matmuls)
    bounds = [0]
    for e in cuts.ends:
        after, nxt = heavy[heavy >= bounds[-1]], heavy[heavy >= e]
        if len(after) >= 2:
            best = cuts.best(int(after[1]) + 1, int(nxt[0]) if len(nxt) else n)
            if best is not None and best > bounds[-1]:
                bounds.append(best)
    pieces = [(a, b) for a, b in zip(bounds, [*bounds[1:], n]) if cuts.heavy(a, b) >= 2]
    if len(pieces) < 2:
        return []
    pieces[0] = cuts.keep(pieces[0], cuts.heavy(*pieces[1]), first=True)
    pieces[-1] = cuts.keep(pieces[-1], cuts.heavy(*pieces[-2]), first=False)
    return pieces


class _Cuts:
    """The cuts `_stages` chooses among: the skips' ends, and per cut the values crossing it."""

    def __init__(self, g: Graph, matmuls: np.ndarray):
        n = len(matmuls)
        self.n, self.cum = n, np.concatenate(([0], np.cumsum(matmuls)))  # cum[i]: matmuls in [0, i)
        pos, _ = positions_and_last_uses(g)
        reads: dict[str, list[int]] = {}
        for oid, op in g.ops.items():
            for v in op.inputs:
                reads.setdefault(v, []).append(pos[oid])
        for v in g.outputs:
            reads.setdefault(v, []).append(n)
        self.lives = [(pos[info.producer], sorted(set(reads[v])), info.nbytes) for v, info in g.values.items()
                      if info.producer is not None and max(reads.get(v, [-1])) > pos[info.producer]]
        skips = [(p, rs[-1]) for p, rs, _ in self.lives if self.heavy(p + 1, rs[-1]) >= 2]
        self.ends = sorted({c for p, last in skips for c in (p + 1, last + 1) if 0 < c < n})
        self.short = np.zeros(n + 2, dtype=np.int64)  # values crossing each cut, skips left out
        for p, rs, _ in self.lives:
            if self.heavy(p + 1, rs[-1]) < 2:
                self.short[p + 1] += 1
                self.short[rs[-1] + 1] -= 1
        self.short = np.cumsum(self.short)[:n + 1]

    def heavy(self, a: int, b: int) -> int:
        """Matmuls and convs in equations [a, b)."""
        return int(self.cum[b] - self.cum[a])

    def inputs(self, c: int, lives) -> int:
        """Bytes of the values of `lives` crossing cut `c` that are read again up to the first
        heavy equation after it: what the stage starting at `c` takes in (a skip it reads only
        further on, in an up stage, is not)."""
        stop = self.n if self.cum[c] == self.cum[-1] else int(np.searchsorted(self.cum, self.cum[c] + 1)) - 1
        return sum(size for p, rs, size in lives if p < c <= rs[-1] and next(r for r in rs if r >= c) <= stop)

    def best(self, lo: int, hi: int) -> int | None:
        """The cut in [lo, hi] that `_stages` ends a stage at; None if at each of them more
        than one value besides the skips crosses."""
        open_ = [c for c in range(lo, hi + 1) if self.short[c] <= 1]
        near = [life for life in self.lives if life[0] < hi and life[1][-1] >= lo]  # crossing a cut in range
        return min(open_, key=lambda c: (self.inputs(c, near), -c)) if open_ else None

    def keep(self, piece: tuple[int, int], k: int, first: bool) -> tuple[int, int]:
        """`piece` cut down to its `k` heavy equations nearest the other stages (the first piece
        keeps its last k, the last its first k), at the `best` cut before or after them."""
        a, b = piece
        heavy = [i for i in range(a, b) if self.heavy(i, i + 1)]
        if len(heavy) <= k:
            return piece
        c = self.best(heavy[-k - 1] + 1, heavy[-k]) if first else self.best(heavy[k - 1] + 1, heavy[k])
        return piece if c is None else (c, b) if first else (a, c)


def _heavy_pieces(matmuls: np.ndarray, order: list, cuts: list[int], module_edge) -> list[tuple[int, int]]:
    """The pieces between consecutive cuts with at least two matmuls, each reaching from where
    the user's module holding its first matmul starts to where the one holding its last ends
    (`module_edge`, `_module_edge`); where there is no such module, from the best cut since the
    last matmul before it to the best before the next one (`order`: fewest crossing bytes, then
    the user's module boundary, then the earliest), where the repeated layers start too
    (`_find_runs`).  A ResNet stage's first block then opens and closes with the activation its
    module does (left between two regions, that activation was an extra equation outside every
    region), and starts after the stem's pooling, not before it (4x fewer bytes).  The module
    comes first because the per-layer plans stand for what a person writes, a checkpoint per
    module: penzai's first decoder block (unlike the rest: named axes transposed), cut at the
    fewest bytes, took in the embedding lookup and its scaling, and under FSDP
    `nothing_saveable` on it compiled 64 bytes over the same policy on penzai's block (cut at the
    block: equal; benchmarks/results/sharded_penzai.md)."""
    best = lambda cs: min(cs, key=lambda c: (order[c], c))
    heavy = np.flatnonzero(matmuls)
    out, opened, start = [], [], None  # opened: cuts since the last piece with a matmul
    for x, y in zip(cuts, cuts[1:]):
        opened.append(x)
        n = matmuls[x:y].sum()
        if n and start is not None:
            out.append((start[0], module_edge(heavy[heavy < start[1]][-1], 1) or best(opened)))
            start = None
        if n >= 2:
            edge = module_edge(heavy[heavy >= x][0], -1)
            start = (edge if edge is not None and edge >= (out[-1][1] if out else 0) else best(opened), y)
        if n:
            opened = []
    if start is not None:
        opened += cuts[-1:]
        out.append((start[0], module_edge(heavy[heavy < start[1]][-1], 1) or best(opened)))
    return out


def _modules(g: Graph, ops: list[OpInfo]) -> list[tuple[str, ...]]:
    """Per equation: the user's modules it is in, outermost first, from JAX's name stack
    (`Net/Block_0/Dense_1` -> `Net`, `Net/Block_0`, `Net/Block_0/Dense_1`; transformations such
    as `vmap(...)` are not modules)."""
    out = []
    for op in ops:
        parts = [p for p in _scope(g, op).split("/") if p and "(" not in p]
        out.append(tuple("/".join(parts[:k + 1]) for k in range(len(parts))))
    return out


def _module_edge(modules: list[tuple[str, ...]], i: int, step: int, edges: set[int], matmuls: np.ndarray) -> int | None:
    """Where the outermost module holding equation `i` starts (`step` -1) or ends (1), of those
    that do so at one of `edges` and with no other matmul between it and `i`; None if none."""
    for m in modules[i]:
        j = i
        while 0 <= j + step < len(modules) and m in modules[j + step]:
            j += step
        edge = j if step < 0 else j + 1
        between = matmuls[edge:i] if step < 0 else matmuls[i + 1:edge]
        if edge in edges and not between.any():
            return int(edge)
    return None


def cut_levels(g: Graph) -> list[float]:
    """Per cut position 0..n (before op p): how major a boundary of the user's modules it is,
    read from JAX's name stack (flax linen's `ResNet/Bottleneck_3/Conv_0`): the depth at which
    the scopes of the equations either side part (0 at the function's ends; lower is more
    major), or infinity where both are in the same scope, as in code without named scopes."""
    scopes = [_scope(g, op).split("/") for op in g.ops.values()]
    levels = [0.0]
    for left, right in zip(scopes, scopes[1:]):
        common = next((k for k, (a, b) in enumerate(zip(left, right)) if a != b), min(len(left), len(right)))
        levels.append(float("inf") if left == right else float(common))
    return levels + [0.0]


def _scope(g: Graph, op: OpInfo) -> str:
    return g.values[op.outputs[0]].scope if op.outputs else ""


def _tokens(g: Graph, ops: list[OpInfo]) -> np.ndarray:
    """One integer per equation: primitive, types and where its operands come from: an
    argument (by type), a value only this equation reads (by how far back its maker is), or a
    value several equations read (by type alone).  A value read by every layer (an encoder's
    output each decoder layer attends to, a mask or position table made once) is then the same
    operand in each layer, though each is further from its maker; counted by that distance, an
    encoder-decoder's 6 decoder layers did not repeat and were found as one layer with 82
    matmuls (the per-layer policies a person writes there were never tried).  Values read
    within a layer by several equations (a norm's output read by the q, k and v projections)
    repeat either way.  A piece of an equation with several outputs is counted by its type too:
    JAX 0.11 iterates over an array with one `unstack` (`for k in jax.random.split(key, n)`, a
    stacked weight unrolled), so each layer reads its own piece of one equation made before the
    stack, ever further back; counted by that distance, a dropout stack's layers were found
    shifted by their random-bit draws, and its `nothing_saveable` twin recomputed a matmul more
    than the person's (JAX 0.10 slices each piece inside its layer)."""
    pos = {op.id: i for i, op in enumerate(ops)}
    readers = Counter(v for op in ops for v in set(op.inputs))
    table: dict[str, int] = {}
    out = np.empty(len(ops), dtype=np.int64)
    for i, op in enumerate(ops):
        ins = []
        for v in op.inputs:
            p = g.values[v].producer
            if p not in pos:  # an argument of the function, or a constant (`_repeats`)
                ins.append(f"{'in' if p is None else 'const'}:{g.values[v].type_str}")
            else:
                ins.append(f"shared:{g.values[v].type_str}" if readers[v] > 1
                           else f"piece:{g.values[v].type_str}" if len(ops[pos[p]].outputs) > 1
                           else f"-{i - pos[p]}")
        outs = ",".join(g.values[v].type_str for v in op.outputs)
        key = f"{op.primitive}({','.join(ins)})->{outs}|{sorted(op.params.items())}"
        out[i] = table.setdefault(key, len(table))
    return out


def _longest_runs(tokens: np.ndarray, lo: int, hi: int):
    """Per period P: (start, copies) of the longest P-periodic run of tokens[lo:hi]."""
    t = tokens[lo:hi]
    n = len(t)
    for p in range(1, n // 2 + 1):
        eq = np.concatenate(([False], t[:-p] == t[p:], [False])).astype(np.int8)
        edges = np.flatnonzero(np.diff(eq))
        if len(edges) == 0:
            continue
        starts, stops = edges[0::2], edges[1::2]
        k = int(np.argmax(stops - starts))
        run = int(stops[k] - starts[k])
        copies = (run + p) // p
        if copies >= 2:
            yield p, lo + int(starts[k]), copies


def _find_runs(g, ops, tokens, heavy, order, lo, hi, spans, min_heavy):
    """The best tandem repeat in [lo, hi) as layer spans, then the same left and right of it."""
    best = None
    for p, s, copies in _longest_runs(tokens, lo, hi):
        if heavy[s:s + p].sum() < min_heavy:
            continue
        phase = min(range(p), key=lambda k: (order[s + k], k))
        n_layers = copies if phase == 0 else copies - 1
        if n_layers < 2:
            continue
        cover = n_layers * p
        if best is None or cover > best[0]:
            best = (cover, p, s + phase, n_layers)
    if best is None:
        return
    _, p, first, n_layers = best
    cuts = _unit_cuts(tokens, heavy, order, first, p, min_heavy)
    run = [(first + k * p + a, first + k * p + b) for k in range(n_layers) for a, b in zip(cuts, cuts[1:])]
    run = _extend(g, ops, run, len(cuts) - 1, lo, hi)
    spans.extend(run)
    _find_runs(g, ops, tokens, heavy, order, lo, run[0][0], spans, min_heavy)
    _find_runs(g, ops, tokens, heavy, order, run[-1][1], hi, spans, min_heavy)


def _extend(g, ops, run: list, k: int, lo: int, hi: int) -> list:
    """`run` (each unit cut into `k` blocks, `_unit_cuts`) with one more block at either end while
    its equations hash like the block it stands for: the first and last layers read from and feed
    other equations than the middle ones, so their tokens differ (a 24-layer GPT gave 23 layers
    without this), but their structure does not; a hybrid's last attention block, left out of the
    run of whole groups, was cut into 3 layers at its alike q, k and v projections.  The
    comparison ignores whether an outside value is an argument: the first layer of a stack that
    reads the function's input directly (flax nnx and equinox MLP stacks, `examples.mlp_chain`:
    3 of 4 and 7 of 8 layers found without this) is still a layer, with a key of its own."""
    run, key = list(run), lambda a, b: _layer_hash(g, ops, a, b, kinds=False)
    while (a := run[-1][1]) + (n := (m := run[-k])[1] - m[0]) <= hi and key(a, a + n) == key(*m):
        run.append((a, a + n))
    while (b := run[0][0]) - (n := (m := run[k - 1])[1] - m[0]) >= lo and key(b - n, b) == key(*m):
        run.insert(0, (b - n, b))
    return run


def _unit_cuts(tokens, heavy, order, first: int, p: int, min_heavy: int) -> list[int]:
    """Where a unit of a run of period `p` from `first` splits into the blocks a person wraps one
    by one: offsets 0..p, at the cuts of the most copies of a shorter block repeating one after
    another in the unit (read round from any of its cuts: the run may start at a group's second
    block, the first reading the function's input), the unit's own start among them, each cut
    crossed by no more bytes than the unit's start (the residual stream), every piece with at
    least `min_heavy` heavy equations.  A Griffin-style hybrid repeats (recurrent, recurrent,
    attention) blocks: found as 4 units of 3 where its author wraps each of the 12, and at the
    12 blocks' hand-written `dots_with_no_batch_dims_saveable` peak autoremat recomputed +1.28
    TFLOP against the policy's +0.69, and nothing_saveable's peak was out of its reach
    (benchmarks/unseen.py).  The unit's start counts: a block's mixing and MLP halves are cut on
    the residual stream too, and copies read from there are as many (without it that hybrid
    gave 16 layers, some of them half a block).  A repeat inside a layer that is not on the
    residual stream (its k and v projections, two alike matmuls) is crossed by more and does not
    split it; nor do a layer's attention and MLP halves, which do not repeat."""
    t, start = tokens[first:first + p], order[first][0]
    edges = [c for c in range(p) if order[first + c][0] <= start]  # the unit's residual-stream cuts
    best = [0, p]
    for r in edges:
        turned = np.concatenate([t[r:], t[:r]])  # the unit read from cut r round to it again
        for q in sorted({(c - r) % p for c in edges} - {0}):
            m = _copies(turned, q) if q <= p // 2 else 1
            at = {(r + j * q) % p for j in range(m + 1)}
            cuts = sorted(at | {p})
            if m > 1 and 0 in at and len(cuts) > len(best) and _splits(heavy, order, first, cuts, min_heavy):
                best = cuts
    return best


def _copies(t: np.ndarray, q: int) -> int:
    """How many copies of `t[:q]` follow one another from the start of `t` (1 if none repeats)."""
    m = 1
    while (m + 1) * q <= len(t) and np.array_equal(t[m * q:(m + 1) * q], t[:q]):
        m += 1
    return m


def _splits(heavy, order, first: int, cuts: list[int], min_heavy: int) -> bool:
    """Whether `cuts` (offsets in the unit from `first`) are residual-stream cuts leaving heavy pieces."""
    start = order[first][0]
    return (all(order[first + c][0] <= start for c in cuts[1:-1])
            and all(heavy[first + a:first + b].sum() >= min_heavy for a, b in zip(cuts, cuts[1:])))


def _layer_hash(g: Graph, ops: list[OpInfo], a: int, b: int, kinds: bool = True) -> str:
    """Weisfeiler-Lehman hash of equations [a, b) and the values they read from outside (with
    `kinds`: whether each is an argument of the function or an activation)."""
    G = nx.DiGraph()
    produced = {}
    for op in ops[a:b]:
        outs = ",".join(g.values[v].type_str for v in op.outputs)
        G.add_node(op.id, label=f"{op.primitive}->{outs}|{sorted(op.params.items())}")
        for v in op.outputs:
            produced[v] = op.id
    for k, op in enumerate(ops[a:b]):
        for j, v in enumerate(op.inputs):
            src = produced.get(v)
            if src is None:
                info = g.values[v]
                src = f"ext:{v}"
                kind = ("arg" if info.producer is None else "act") if kinds else "ext"
                G.add_node(src, label=f"{kind}:{info.type_str}")
            G.add_edge(src, op.id, operand=str(j))
    with warnings.catch_warnings():  # networkx 3.5 notes that directed hashes changed; ours are per run
        warnings.simplefilter("ignore", UserWarning)
        return nx.weisfeiler_lehman_graph_hash(G, node_attr="label", edge_attr="operand", iterations=4)
