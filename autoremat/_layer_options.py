"""Per-layer saved sets from the exact region solver, and the line that predicts their peaks.

JAX's policies choose what a layer saves by primitive; the exact region solver
(`solver/_region.py`, CP-SAT) chooses the set that recomputes least under a byte cap.  Between
`nothing_saveable` and `dots_with_no_batch_dims_saveable` there is room the policies do not reach.

* `ilp_options(g, layers)`: for each distinct layer of an unrolled stack (`graph.find_layers`;
  identical layers share one solve), the solver's saved sets at the caps of
  `solver._region_options.DEFAULT_CAPS` and at the bytes each of JAX's matmul policies saves in
  the layer (`POLICY_CAPS`), copied onto every layer of its kind (value ids shifted by the
  layer's position), with the bytes they save and the matmul FLOPs their recomputation costs
  over the stack.
* `fit_peak_line`: the compiled peak of a uniform plan as `a + b x saved bytes`, fitted on the
  policies compiled per layer (the measurements in context: the same step, every layer alike),
  so an option is compiled only where it is predicted to fit and to recompute less.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoremat._presets import MAXTEXT_NAMES, SAVED_NAMES
from autoremat.graph._costs import MATMUL_PRIMITIVES
from autoremat.graph._graph import Graph
from autoremat.graph._layers import Layer
from autoremat.solver._peak_model import stored_residuals
from autoremat.solver._region import recompute_closure, region_solution
from autoremat.solver._region_options import DEFAULT_CAPS, _region_problem, _solve_block_options

__all__ = ["LayerOption", "POLICY_CAPS", "ilp_options", "fit_peak_line", "layer_body", "name_presets",
           "policy_layer_flops", "policy_saves", "policy_keeps"]

# Caps at the bytes of the outputs a JAX policy may save in the layer (`policy_saves`), labelled
# by it.  That is one activation per decoder layer more than the policy stores (`policy_keeps`:
# the layer's last matmul output, which its backward never reads).  There the solver's set
# recomputed half the policy's matmul FLOPs on the Llama, GPT and equinox 1B decoders and
# compiled 4.3-5.4% above it, where the fixed caps straddle it: GPT's ilp40% set, the same
# FLOPs, compiled 1.5 GiB higher (benchmarks/results/policy_bytes.md).  At the bytes the policy
# stores, Llama's set recomputes the policy's own FLOPs (results/set_packing.md): no option.
POLICY_CAPS = ("dots_with_no_batch_dims_saveable", "dots_saveable")


@dataclass(frozen=True)
class LayerOption:
    """One saved set per layer (value ids), its bytes over the stack and recomputed matmul FLOPs
    (in all, and per layer: empty where not known)."""

    label: str
    saved: tuple[frozenset, ...]
    saved_bytes: int
    matmul_flops: float
    layer_flops: tuple[float, ...] = ()


def ilp_options(g: Graph, layers: Sequence[Layer], *, time_limit: float | None = 2.0) -> list[LayerOption]:
    """The region solver's saved sets per layer (see the module docstring), but for the empty
    one (`nothing_saveable`); none where a layer is a scan (its body's options are the chain
    solver's) or layers of a kind differ in order."""
    ops = list(g.ops.values())
    if any(la.stop - la.start == 1 and ops[la.start].primitive == "scan" for la in layers):
        return []
    per_key: dict[str, list] = {}
    for layer in layers:
        if layer.key not in per_key:
            per_key[layer.key] = _solve(g, ops[layer.start:layer.stop], time_limit)
    out, seen = [], set()
    n_caps = len(DEFAULT_CAPS) + len(POLICY_CAPS)
    for c in range(n_caps):
        saved, nbytes, flops = [], 0, []
        for layer in layers:
            proto_start, kinds = per_key[layer.key]
            label, proto_saved, proto_flops = kinds[c]
            shifted = _shift(g, proto_saved, layer.start - proto_start)
            if shifted is None:
                return []
            saved.append(shifted)
            nbytes += sum(g.values[v].nbytes for v in shifted)
            flops.append(proto_flops)
        key = tuple(saved)
        # A set empty on every layer is `nothing_saveable`, which `HandSearch.uniform` compiles
        # as written: as an option of its own it was compiled again, with its mixes (llama 1B
        # FSDP x TP at nothing_saveable's 3.73 GiB: three of seven compiles, 45 s;
        # benchmarks/budget_log.py --model llama1b --layout fsdp_tp --only nothing).
        if key not in seen and any(saved):
            seen.add(key)
            out.append(LayerOption(label, key, nbytes, sum(flops), tuple(flops)))
    return out


def policy_layer_flops(g: Graph, layers: Sequence[Layer], policy) -> tuple[float, ...]:
    """The matmul FLOPs each layer recomputes under one of JAX's policies (None: no remat), or
    under a saved set per layer (a sequence of value-id sets: `name_presets`), as the region
    solver counts its sets' (`policy_keeps`, then what the backward pass re-runs; a scan layer's
    body, times its length): how a mix's FLOPs change from layer to layer where the layers are
    not alike (`HandSearch._mix_flops`), and which of the hand-written plans recompute least."""
    if policy is None:
        return (0.0,) * len(layers)
    per_key = {}
    for k, layer in enumerate(layers):
        if layer.key not in per_key:
            graph, layer_ops, length = layer_body(g, layer)
            pol = policy if isinstance(policy, str) else policy[k]
            closure = recompute_closure(_layer_problem(graph, layer_ops)[2], policy_keeps(graph, layer_ops, pol))
            per_key[layer.key] = length * math.fsum(_recomputed_matmuls(graph.ops[o], pol) for o in closure)
    return tuple(per_key[layer.key] for layer in layers)


def _recomputed_matmuls(op, policy) -> float:
    """The matmul FLOPs that recomputing `op` costs under `policy`: all of its own
    (`OpInfo.matmul_flops`), but for an op with matmuls inside (a scan, a `custom_vjp` call)
    under one of JAX's matmul policies, only those the policy does not save: JAX applies a
    checkpoint's policy inside them too.  A Mamba-2-style layer's scan and a custom_vjp
    attention keep their dots under dots_saveable, and their batched ones are recomputed under
    dots_with_no_batch_dims_saveable (tests/test_hand.py).  A saved set names values of the
    layer itself, so inside them it saves nothing."""
    if op.primitive in MATMUL_PRIMITIVES or not isinstance(policy, str) or policy == "nothing_saveable":
        return op.matmul_flops
    return op.batched_matmul_flops if "no_batch" in policy else 0.0


def name_presets(g: Graph, layers: Sequence[Layer]) -> list[tuple[str, tuple[frozenset, ...]]]:
    """MaxText's presets (`_presets.SAVED_NAMES`) on layers tagged with its names: (preset, the
    values it saves in each layer), where every layer has one of MaxText's tags.  A preset saves
    the values its names tag (the `name` equation's input, one buffer with its output: counted
    once); one that saves nothing, or what an earlier one saves, is left out.  A scan layer's
    values are its body's."""
    tags = [_layer_tags(g, layer) for layer in layers]
    if not tags or any(not set(t) & set(MAXTEXT_NAMES) for t in tags):
        return []
    out, seen = [], set()
    for preset, names in SAVED_NAMES.items():
        sets = tuple(frozenset().union(*(t.get(n, frozenset()) for n in names)) for t in tags)
        if any(sets) and sets not in seen:
            seen.add(sets)
            out.append((preset, sets))
    return out


def _layer_tags(g: Graph, layer: Layer) -> dict[str, frozenset]:
    """`checkpoint_name` -> the values it tags in `layer` (made in the layer)."""
    graph, layer_ops, _ = layer_body(g, layer)
    made = {v for op in layer_ops for v in op.outputs}
    out: dict[str, frozenset] = {}
    for op in layer_ops:
        name = op.params.get("name")
        if op.primitive == "name" and isinstance(name, str) and op.inputs and op.inputs[0] in made:
            out[name] = out.get(name, frozenset()) | {op.inputs[0]}
    return out


def layer_body(g: Graph, layer: Layer) -> tuple[Graph, list, int]:
    """(graph, ops, trip count) of a layer: a scan layer's body, else its own equations once."""
    first = g.ops[f"e{layer.start}"]
    if layer.stop - layer.start == 1 and first.primitive == "scan":
        body = first.bodies[0]
        return body, list(body.ops.values()), int(first.params.get("length", 1))
    return g, [op for op in g.ops.values() if layer.start <= op.index < layer.stop], 1


def _solve(g: Graph, layer_ops, time_limit) -> tuple[int, list]:
    """(first equation, [(label, saved set, recomputed matmul FLOPs) per cap]) of one layer: the
    caps of DEFAULT_CAPS, then those of POLICY_CAPS (labelled `ilp@<policy>`)."""
    produced, residuals, problem = _layer_problem(g, layer_ops)
    res_bytes = sum(g.values[v].nbytes for v in residuals if v in produced)
    policy_caps = [min(1.0, _policy_bytes(g, layer_ops, pol) / max(res_bytes, 1)) for pol in POLICY_CAPS]
    kinds = _solve_block_options(g, layer_ops, produced, residuals, (*DEFAULT_CAPS, *policy_caps), "cpsat",
                                 time_limit)
    ilp = [(label, saved) for label, saved in kinds if label.startswith("ilp")]
    labels = [label for label, _ in ilp[:len(DEFAULT_CAPS)]] + [f"ilp@{pol}" for pol in POLICY_CAPS]
    out = []
    for label, (_, saved) in zip(labels, ilp):
        closure = recompute_closure(problem, saved)
        flops = math.fsum(g.ops[o].matmul_flops for o in closure)
        out.append((label, frozenset(saved), flops))
    return layer_ops[0].index, out


def _layer_problem(g: Graph, layer_ops):
    """(values the layer makes, the residuals XLA keeps of them, its region problem)."""
    produced = frozenset(v for op in layer_ops for v in op.outputs)
    residuals, _ = stored_residuals(g, layer_ops)
    return produced, residuals, _region_problem(g, layer_ops, produced, residuals)


def policy_saves(policy, op, vid: str) -> bool:
    """Whether `policy` (one of JAX's by name, `runtime._plan.POLICY_NAMES`; or a set of value
    ids) saves output `vid` of graph op `op`.  JAX's `DotsSaveable` (jax/_src/ad_checkpoint.py)
    saves every dot_general's and conv_general_dilated's output, or, without batch dimensions,
    dot_general's only."""
    if isinstance(policy, frozenset):
        return vid in policy
    if policy == "everything_saveable":
        return True
    if policy == "nothing_saveable" or op.primitive not in MATMUL_PRIMITIVES:
        return False
    if "no_batch" in policy:
        return op.primitive == "dot_general" and not op.params.get("batch_dims")
    return True


def policy_keeps(g: Graph, layer_ops, policy) -> frozenset:
    """The outputs `policy` saves in the layer that its backward pass reads, directly or to
    re-run what it recomputes.  JAX's partial evaluation stores no others: a layer's last matmul,
    whose output only the next layer reads, is saveable under the dots policies but not stored
    (the 1B decoders of benchmarks/realscale.py, `jax.ad_checkpoint.print_saved_residuals`: 6 of
    each Llama layer's 7 dot outputs under dots_with_no_batch_dims_saveable, 304 MiB of 336).
    Counting it put a saved set of the policy's counted bytes at the policy's peak, where it
    compiled 32 MiB per layer above (benchmarks/results/set_packing.md)."""
    saves = frozenset(v for op in layer_ops for v in op.outputs if policy_saves(policy, op, v))
    if not saves:
        return saves
    return region_solution(_layer_problem(g, layer_ops)[2], saves, "policy").saved


def _policy_bytes(g: Graph, layer_ops, policy: str) -> int:
    """Bytes of the outputs JAX's `policy` may save in the layer (`policy_saves`)."""
    return sum(g.values[v].nbytes for op in layer_ops for v in op.outputs if policy_saves(policy, op, v))


def _shift(g: Graph, ids, delta: int) -> frozenset | None:
    """Value ids `e{i}:{j}` moved by `delta` equations; None if a moved id is not a value made
    by the same primitive (the layers differ in order)."""
    out = []
    for vid in ids:
        eq, j = vid.split(":")
        moved = f"e{int(eq[1:]) + delta}:{j}"
        info = g.values.get(moved)
        if info is None or g.ops[info.producer].primitive != g.ops[g.values[vid].producer].primitive:
            return None
        out.append(moved)
    return frozenset(out)


def fit_peak_line(points: Sequence[tuple[int, int]]) -> tuple[float, float] | None:
    """(a, b) of compiled peak = a + b x saved bytes, least squares over (saved bytes, peak)
    points; None with fewer than two distinct byte counts."""
    xs = np.array([p[0] for p in points], dtype=float)
    ys = np.array([p[1] for p in points], dtype=float)
    if len(set(xs.tolist())) < 2:
        return None
    b, a = np.polyfit(xs, ys, 1)
    return float(a), float(b)
