"""The dataflow graph: a node per equation, an edge per value, with bytes, FLOPs and time.

`build_graph(fn, args)` traces `fn` (see `_trace.trace`), then walks the flat jaxpr:

* every equation becomes an `OpInfo` (cost from `_costs.eqn_cost`, time from the device
  profile's roofline, the residuals its backward pass reads from `_residuals`);
* every value becomes a `ValueInfo` (shape, dtype, per-device bytes, producer, source line,
  the user's `checkpoint_name` if any);
* `scan`, `while` and `cond` equations carry their bodies as nested `Graph`s (a scan's body
  is executed `length` times; a while loop's trip count is unknown and counted once).

The networkx view (`Graph.nx`) is a `MultiDiGraph` with one node per equation and per
function input, and one edge per (value, consumer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.extend as jex
import networkx as nx
import numpy as np
from jax.extend import source_info_util

from autoremat.graph._costs import OpCost, aval_bytes, aval_size, eqn_cost, eqn_matmul_flops, jaxpr_cost
from autoremat.graph._interpret import primitive_label, scan_counts
from autoremat.graph._interpret import user_name as _user_name
from autoremat.graph._profiles import DeviceProfile, _dtype_name, get_profile
from autoremat.graph._residuals import EqnResiduals, eqn_residuals, linearized_in
from autoremat.graph._shard_map import body_mesh
from autoremat.graph._shardings import propagated_divisors
from autoremat.graph._trace import Traced, trace

__all__ = ["ValueInfo", "OpInfo", "Graph", "build_graph", "graph_from_traced"]

# Control flow whose bodies are kept as nested graphs.
_BODY_KEYS = {"scan": ("jaxpr",), "while": ("cond_jaxpr", "body_jaxpr"), "cond": ("branches",)}
# Primitives with float outputs whose derivative is zero (JAX gives them a symbolic-zero
# tangent, so nothing downstream of them is linearized through them).
_ZERO_DERIVATIVE = frozenset({"stop_gradient", "sign", "floor", "ceil", "round", "bitcast_convert_type"})


@dataclass(frozen=True)
class ValueInfo:
    """One value (jaxpr variable).

    Attributes:
      id: stable identity: `in3` (function input 3), `e12:0` (output 0 of equation 12),
        `e5/body/e2:0` (inside the body of the scan at equation 5).
      shape, dtype: as traced (global shape).
      nbytes: bytes one device holds (global bytes divided by the estimated sharding).
      producer: the id of the producing op, None for inputs.
      source: `file:line:col (function)` of the producing equation.
      name: the user's `checkpoint_name` on this value, if any.
      kind: 'input', 'const' or 'intermediate'.
      differentiable: a tangent flows through it.
      arg_name: for inputs, the argument path (`args[0]['w']`).
    """

    id: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    producer: str | None
    source: str
    name: str | None
    kind: str
    differentiable: bool
    arg_name: str | None = None
    scope: str = ""  # JAX's name stack where it was made: flax linen's module path ("Net/Block_0/Dense_1")

    @property
    def type_str(self) -> str:
        """`float32[4, 8]`; JAX's extended dtypes as JAX names them (`key<fry>[3]`: the typed
        PRNG keys of `jax.random.key`, which dropout splits inside every layer)."""
        return f"{_dtype_name(self.dtype)}{list(self.shape)}"

    @property
    def whole_bytes(self) -> int:
        """Bytes of the whole value, every device's piece together (`nbytes` where its dtype has
        no item size: PRNG keys, tokens)."""
        try:
            return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize
        except TypeError:
            return self.nbytes


@dataclass(frozen=True)
class OpInfo:
    """One equation.

    Attributes:
      id: `e12` or `e5/body/e2`.
      index: position in its jaxpr.
      primitive: the primitive's name.
      inputs, outputs: value ids (literal inputs are omitted).
      cost: FLOPs and bytes of ONE execution (bodies included, scans times their length).
      matmul_flops: the FLOPs of its matmuls and convolutions, those in nested jaxprs included
        (`_costs.eqn_matmul_flops`), on one device as `cost`; batched_matmul_flops: those of them
        that are convolutions or dot_generals with batch dimensions.
      time: roofline seconds of one execution on the graph's profile.
      multiplicity: how many times it runs per forward pass (trip counts of enclosing scans).
      source: `file:line:col (function)`.
      residual_inputs, residual_outputs: value ids its backward pass reads.
      extra_residual_bytes: bytes of values its linearization creates (per execution).
      bodies: nested graphs of scan/while/cond bodies.
      params: a few scalar parameters worth showing (scan length, ...).
    """

    id: str
    index: int
    primitive: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cost: OpCost
    time: float
    multiplicity: int
    source: str
    residual_inputs: tuple[str, ...]
    residual_outputs: tuple[str, ...]
    extra_residual_bytes: int
    bodies: tuple["Graph", ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    matmul_flops: float = 0.0
    batched_matmul_flops: float = 0.0

    @property
    def unrolled(self) -> bool:
        """A scan unrolled (`unroll` > 1, as penzai's `LayerStack` scans with `unroll=True`): XLA
        then sees the forward and backward iterations side by side and, without optimization
        barriers (`jax.checkpoint(prevent_cse=False)`, what JAX's docs advise inside a scan),
        merges a body's recomputation with its forward pass.  A 4-layer scan of GeGLU MLPs (CPU,
        jax 0.10.2, nothing_saveable on the body, benchmarks/results/scan_barriers.md): 14.38 MiB
        with barriers and 21.38 without (no remat 21.63) at `unroll=4`, 19.76 and 22.51 at
        `unroll=2`, 18.26 and 18.39 at `unroll=1`."""
        return self.primitive == "scan" and int(self.params.get("unroll", 1)) > 1


@dataclass(eq=False)
class Graph:
    """A dataflow graph of one jaxpr (the function's, or a control-flow body's)."""

    values: dict[str, ValueInfo]
    ops: dict[str, OpInfo]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    profile: DeviceProfile
    prefix: str = ""
    traced: Traced | None = None
    nx: Any = None

    def residual_values(self) -> list[str]:
        """Ids of forward values (inputs included) the un-optimized backward pass reads."""
        seen: dict[str, None] = {}
        for op in self.ops.values():
            for v in op.residual_inputs + op.residual_outputs:
                seen.setdefault(v, None)
        return list(seen)

    def residual_bytes(self) -> int:
        """Bytes the un-optimized backward pass keeps: residual values plus extras."""
        return (sum(self.values[v].nbytes for v in self.residual_values())
                + sum(op.extra_residual_bytes for op in self.ops.values()))

    def total_flops(self) -> float:
        """FLOPs of one forward pass (scan bodies times their trip count)."""
        return sum(op.cost.flops for op in self.ops.values())

    def device_share(self) -> float:
        """One device's share of the step's FLOPs: the graph's per-device forward FLOPs over the
        traced jaxpr's global ones (1.0 unsharded, exactly: the same cost rules; about 0.125
        for a decoder sharded FSDP x TP over 8 devices).  Compiled steps count global jaxpr FLOPs;
        this puts them in the graph's terms."""
        if self.traced is None:
            return 1.0
        total = jaxpr_cost(self.traced.closed_jaxpr).flops
        return self.total_flops() / total if total > 0 else 1.0

    def total_time(self) -> float:
        return sum(op.time for op in self.ops.values())

    def consumers(self, value_id: str) -> list[str]:
        return [op.id for op in self.ops.values() if value_id in op.inputs]

    def __repr__(self) -> str:
        return (f"Graph({len(self.ops)} ops, {len(self.values)} values, "
                f"residuals {self.residual_bytes()} B, {self.total_flops():.3g} FLOPs, profile {self.profile.name})")


def build_graph(fn, *args, argnums=0, static_argnums: Sequence[int] = (), profile=None,
                has_aux: bool = False, **kwargs) -> Graph:
    """Traces `fn(*args, **kwargs)` and builds its dataflow graph.

    Args:
      fn: a function returning a scalar loss (see `trace`).
      *args: example arguments (arrays or `jax.ShapeDtypeStruct`, pytrees).
      argnums: differentiated positional arguments (default 0, like `jax.grad`).
      static_argnums: positional arguments treated as Python constants.
      profile: a device profile name or `DeviceProfile` (default: the local device).
      **kwargs: keyword arguments of `fn` (not differentiated).

    Example:
      >>> import jax.numpy as jnp
      >>> g = build_graph(lambda w, x: jnp.sum(jnp.tanh(x @ w)), jnp.ones((8, 4)), jnp.ones((2, 8)))
      >>> [op.primitive for op in g.ops.values()]
      ['dot_general', 'tanh', 'reduce_sum']
      >>> g.ops['e0'].cost.flops   # 2 * 2 * 8 * 4
      128.0
    """
    t = trace(fn, args, kwargs, argnums=argnums, static_argnums=static_argnums, has_aux=has_aux)
    return graph_from_traced(t, profile=profile)


def graph_from_traced(t: Traced, *, profile=None) -> Graph:
    """Builds the graph of an already traced function."""
    from autoremat.graph._profiles import detect_profile

    prof = get_profile(profile) if profile is not None else detect_profile()
    jaxpr = t.closed_jaxpr.jaxpr
    divisors = []
    for aval, sds_sharding in zip(t.in_avals, _input_shardings(t)):
        divisors.append(_sharding_divisor(aval, sds_sharding))
    # Only the loss (the first output) is differentiated; aux outputs are not.
    live_out = [i == 0 for i in range(len(jaxpr.outvars))]
    with linearized_in(body_mesh(t)):
        g = _build(jaxpr, prof, prefix="", in_diff=list(t.diff_mask), in_div=divisors,
                   arg_names=list(t.arg_names), multiplicity=1, live_out=live_out, out_div=propagated_divisors(t))
    g.traced = t
    g.nx = _to_nx(g)
    return g


def _input_shardings(t: Traced):
    return list(t.in_shardings) or [None] * len(t.in_avals)


def _sharding_divisor(aval, sharding) -> float:
    if sharding is None or not getattr(aval, "shape", None):
        return 1.0
    try:
        shard = sharding.shard_shape(tuple(aval.shape))
    except Exception:
        return 1.0
    full = float(np.prod(aval.shape))
    part = float(np.prod(shard)) or 1.0
    return max(1.0, full / part)


def _is_float(aval) -> bool:
    return hasattr(aval, "dtype") and jax.dtypes.issubdtype(aval.dtype, np.inexact)


def _src(eqn) -> str:
    try:
        return source_info_util.summarize(eqn.source_info)
    except Exception:  # pragma: no cover
        return ""


def _build(jaxpr, prof: DeviceProfile, *, prefix: str, in_diff: list[bool], in_div: list[float],
           arg_names: list[str] | None, multiplicity: int, live_out: list[bool] | None = None,
           out_div: dict | None = None, body: bool = False) -> Graph:
    """The graph of `jaxpr`.  A value is split over devices as XLA laid it out where `out_div`
    says (`{(equation, output): factor}`, `propagated_divisors`), else as finely as its most
    split input; an op's work like its most split input or output, in a scan's `body` also
    through values whose stacks XLA keeps whole (docs/FINDINGS.md, twenty-third session)."""
    given, per_body = _split_divisors(out_div or {})
    values: dict[str, ValueInfo] = {}
    ops: dict[str, OpInfo] = {}
    var_id: dict[int, str] = {}
    diff: dict[str, bool] = {}
    div: dict[str, float] = {}  # how many ways each value is split; `wdiv`: the work producing it
    wdiv: dict[str, float] = {}
    named_alias: dict[str, str] = {}

    def add_value(v, vid, producer, source, kind, d, dv, arg_name=None, name=None, scope="", wdv=None):
        aval = v.aval
        # A value cannot be split into more pieces than it has elements (a scalar loss
        # computed from sharded activations is replicated, not 1/8 of a float).
        dv = min(dv, max(aval_size(aval), 1))
        nbytes = int(aval_bytes(aval) / dv) if dv > 1 else aval_bytes(aval)
        dtype = str(aval.dtype) if hasattr(aval, "dtype") else "token"
        values[vid] = ValueInfo(vid, tuple(getattr(aval, "shape", ())), dtype, nbytes, producer, source,
                                name, kind, d, arg_name, scope)
        var_id[id(v)] = vid
        diff[vid] = d
        div[vid] = dv
        wdiv[vid] = dv if wdv is None else min(wdv, max(aval_size(aval), 1))

    live = _grad_live_eqns(jaxpr, live_out)
    for i, v in enumerate(jaxpr.constvars):
        add_value(v, f"{prefix}c{i}", None, "", "const", False, 1.0)
    inputs = []
    for i, v in enumerate(jaxpr.invars):
        vid = f"{prefix}in{i}"
        add_value(v, vid, None, "", "input", bool(in_diff[i]) and _is_float(v.aval), in_div[i],
                  arg_name=arg_names[i] if arg_names else None)
        inputs.append(vid)

    for idx, eqn in enumerate(jaxpr.eqns):
        oid = f"{prefix}e{idx}"
        src = _src(eqn)
        in_ids = [var_id[id(v)] if not isinstance(v, jex.core.Literal) else None for v in eqn.invars]
        in_d = [bool(x and diff[x]) for x in in_ids]
        in_dv, in_wdv = [div[x] for x in in_ids if x], [wdiv[x] for x in in_ids if x]
        outs_div = [given.get((idx, j), max(in_dv, default=1.0)) for j in range(len(eqn.outvars))]
        outs_wdiv = [max([f, *in_wdv]) for f in outs_div] if body else outs_div
        out_div = max(outs_div, default=1.0)
        any_d = any(in_d)
        out_ids = []
        user_name = _user_name(eqn)
        for j, v in enumerate(eqn.outvars):
            vid = f"{oid}:{j}"
            out_d = any_d and _is_float(v.aval) and eqn.primitive.name not in _ZERO_DERIVATIVE
            add_value(v, vid, oid, src, "intermediate", out_d, outs_div[j], name=user_name,
                      scope=str(eqn.source_info.name_stack), wdv=outs_wdiv[j])
            out_ids.append(vid)
        if user_name is not None and in_ids[0] is not None:
            # checkpoint_name is an identity: its input carries the user's name too.
            named_alias[in_ids[0]] = user_name
        res = eqn_residuals(eqn, in_d) if any_d and live[idx] else EqnResiduals((False,) * len(in_ids), (False,) * len(out_ids), 0)
        bodies = _bodies(eqn, oid, prof, in_d, _carried_divisors(eqn, [div[x] if x else 1.0 for x in in_ids],
                                                                 outs_div), multiplicity, per_body.get(idx))
        cost, matmul_flops, batched = _per_device_cost(eqn, max([*outs_wdiv, *in_wdv], default=1.0))
        dtype = str(eqn.outvars[0].aval.dtype) if eqn.outvars and hasattr(eqn.outvars[0].aval, "dtype") else "float32"
        ops[oid] = OpInfo(
            id=oid, index=idx, primitive=primitive_label(eqn),
            inputs=tuple(x for x in in_ids if x is not None), outputs=tuple(out_ids), cost=cost,
            time=prof.op_time(cost, dtype), multiplicity=multiplicity, source=src,
            residual_inputs=tuple(dict.fromkeys(x for x, r in zip(in_ids, res.inputs) if r and x is not None)),
            residual_outputs=tuple(x for x, r in zip(out_ids, res.outputs) if r),
            extra_residual_bytes=_per_device_extras(res.extra_bytes, eqn, bodies, out_div),
            bodies=bodies, params=_op_params(eqn), matmul_flops=matmul_flops, batched_matmul_flops=batched)

    for vid, name in named_alias.items():
        if values[vid].name is None:
            values[vid] = _replace(values[vid], name=name)
    outputs = tuple(var_id[id(v)] for v in jaxpr.outvars if not isinstance(v, jex.core.Literal))
    return Graph(values, ops, tuple(inputs), outputs, prof, prefix)


def _per_device_extras(nbytes: int, eqn, bodies, out_div: float) -> int:
    """One device's share of the `nbytes` an equation's linearization makes beyond its inputs and
    outputs (`EqnResiduals.extra_bytes`): split like its outputs; a scan's, its stacked
    residuals, like its body's residual values' stacks (`_stack_divisor`)."""
    div = _stack_divisor(bodies[0]) if eqn.primitive.name == "scan" and bodies else out_div
    return int(nbytes / div) if div > 1 else nbytes


def _stack_divisor(body: Graph) -> float:
    """How many ways a scan's stacked residuals are split, on average by bytes: as XLA lays out
    the stacks of its body's residual values (`propagated_divisors`).  The scan's own outputs'
    split said 8 under the 8B decoder's FSDP, where XLA keeps 85 of its 101 body stacks whole: no
    remat came to 130.5 GiB a device in the model and compiled to 1.51 TiB (benchmarks/sharded.py,
    docs/FINDINGS.md, twenty-fourth session)."""
    made = [body.values[v] for v in body.residual_values() if body.values[v].producer is not None]
    split = sum(info.nbytes for info in made)
    return sum(info.whole_bytes for info in made) / split if split else 1.0


def _per_device_cost(eqn, work_div: float) -> tuple[OpCost, float, float]:
    """`eqn`'s cost and matmul FLOPs (all, and batched: `eqn_matmul_flops`) on one device, its
    work split `work_div` ways: like its most split operand or result, since a matmul whose
    contracting dimension is split (row-parallel under tensor parallelism) does 1/8 of its FLOPs
    on each of 8 devices while its partial sums are reduced into an output split fewer ways
    (docs/FINDINGS.md, ninth session)."""
    div = max(work_div, 1.0)
    return (eqn_cost(eqn).scale(1.0 / div) if div > 1 else eqn_cost(eqn),
            eqn_matmul_flops(eqn) / div, eqn_matmul_flops(eqn, batched=True) / div)


def _split_divisors(out_div: dict) -> tuple[dict, dict[int, dict]]:
    """`propagated_divisors`' factors: (this jaxpr's values', {scan equation: its body's})."""
    per_body: dict[int, dict] = {}
    for k, f in out_div.items():
        if len(k) == 3:
            per_body.setdefault(k[0], {})[k[1:]] = f
    return {k: f for k, f in out_div.items() if len(k) == 2}, per_body


def _op_params(eqn) -> dict:
    """The few scalar parameters of an equation worth keeping on its `OpInfo`."""
    params = {k: eqn.params[k] for k in ("length", "reverse", "name", "unroll")
              if k in eqn.params and isinstance(eqn.params[k], (int, bool, str))}
    if eqn.primitive.name == "scan":
        params["num_consts"], params["num_carry"] = scan_counts(eqn.params)
    if eqn.primitive.name.startswith("custom_") and _elementwise_body(eqn):
        params["elementwise"] = True
    if eqn.primitive.name == "dot_general":
        # What `dots_with_no_batch_dims_saveable` looks at.
        (_, _), (lhs_b, rhs_b) = eqn.params["dimension_numbers"]
        params["batch_dims"] = bool(lhs_b or rhs_b)
    return params


def _grad_live_eqns(jaxpr, live_out: list[bool] | None) -> list[bool]:
    """Per equation, whether a cotangent reaches it from a differentiated output.

    The backward pass of an equation whose outputs only feed `stop_gradient`, aux outputs
    or nothing is dead code in JAX's linearization: it keeps no residuals.
    """
    outs = jaxpr.outvars if live_out is None else [v for v, k in zip(jaxpr.outvars, live_out) if k]
    needed = {id(v) for v in outs if not isinstance(v, jex.core.Literal)}
    live = [False] * len(jaxpr.eqns)
    for idx in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[idx]
        if eqn.primitive.name in _ZERO_DERIVATIVE or not any(id(v) in needed for v in eqn.outvars):
            continue
        live[idx] = True
        needed.update(id(v) for v in eqn.invars if not isinstance(v, jex.core.Literal))
    return live


def _replace(v: ValueInfo, **kw) -> ValueInfo:
    from dataclasses import replace
    return replace(v, **kw)


def _elementwise_body(eqn) -> bool:
    """Whether a custom_jvp/custom_vjp call's primal body is fusible elementwise work only."""
    return _fusible_jaxpr(eqn.params.get("call_jaxpr", eqn.params.get("fun_jaxpr")), nested=1)


def _fusible_jaxpr(jaxpr, nested: int) -> bool:
    """Whether every equation of `jaxpr` is fusible, looking `nested` levels into jit calls."""
    from autoremat.graph._costs import FUSIBLE_PRIMITIVES

    eqns = getattr(getattr(jaxpr, "jaxpr", jaxpr), "eqns", None)
    if not eqns:
        return False
    return all(e.primitive.name in FUSIBLE_PRIMITIVES
               or (nested > 0 and e.primitive.name in ("pjit", "jit", "closed_call")
                   and _fusible_jaxpr(e.params.get("jaxpr", e.params.get("call_jaxpr")), nested - 1))
               for e in eqns)


def _carried_divisors(eqn, in_div: list, outs_div: list) -> list:
    """The split of a scan's operands as its body sees them: a carry is laid out like the carry
    the scan returns where that is split finer than its initial value (zeros the body then fills
    with split values).  The LSTM in a scan over layers under FSDP on 8 devices
    (benchmarks/sharded.py --models lstm_scan --layouts fsdp --batch-scale 8): each layer's scan
    over time starts from zeros, and its per-step carries counted whole put the options keeping
    the inner body's values 8 times over, so none competed."""
    if eqn.primitive.name != "scan":
        return in_div
    n_consts, n_carry = scan_counts(eqn.params)
    out = list(in_div)
    for k in range(n_carry):
        if n_consts + k < len(out) and k < len(outs_div):
            out[n_consts + k] = max(out[n_consts + k], outs_div[k])
    return out


def _bodies(eqn, oid, prof, in_d, in_div, multiplicity, body_div=None) -> tuple[Graph, ...]:
    name = eqn.primitive.name
    if name not in _BODY_KEYS:
        return ()
    try:
        return _bodies_of(eqn, oid, prof, in_d, in_div, multiplicity, body_div)
    except (KeyError, AttributeError) as e:
        # A JAX version whose control-flow parameters we do not know: keep the equation
        # opaque (costed and linearized as a whole) rather than fail.
        import warnings
        warnings.warn(f"autoremat: cannot read the body of {name} ({type(e).__name__}: {e}); "
                      f"treating it as one opaque equation", stacklevel=2)
        return ()


def _bodies_of(eqn, oid, prof, in_d, in_div, multiplicity, body_div=None) -> tuple[Graph, ...]:
    """The graphs of `eqn`'s bodies; a scan body's values split as `body_div` says (XLA's layout,
    `propagated_divisors`) where it does."""
    name = eqn.primitive.name
    out = []
    if name == "scan":
        body = eqn.params["jaxpr"]
        n_consts, n_carry = scan_counts(eqn.params)
        bj = body.jaxpr
        # A carry is differentiable if its initial value or any differentiable input is.
        d = list(in_d)
        any_d = any(in_d)
        for k in range(n_consts, n_consts + n_carry):
            d[k] = d[k] or any_d
        # Scanned-over inputs lose their leading axis: the divisor stays (batch sharding).
        out.append(_build(bj, prof, prefix=f"{oid}/body/", in_diff=d, in_div=list(in_div),
                          arg_names=None, multiplicity=multiplicity * int(eqn.params["length"]), out_div=body_div,
                          body=True))
    elif name == "while":
        cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        body = eqn.params["body_jaxpr"]
        carry_d = in_d[cn + bn:]
        out.append(_build(body.jaxpr, prof, prefix=f"{oid}/body/",
                          in_diff=list(in_d[cn:cn + bn]) + list(carry_d),
                          in_div=list(in_div[cn:cn + bn]) + list(in_div[cn + bn:]),
                          arg_names=None, multiplicity=multiplicity))
    elif name == "cond":
        for k, br in enumerate(eqn.params["branches"]):
            out.append(_build(br.jaxpr, prof, prefix=f"{oid}/branch{k}/", in_diff=list(in_d[1:]),
                              in_div=list(in_div[1:]), arg_names=None, multiplicity=multiplicity))
    return tuple(out)


def _to_nx(g: Graph) -> nx.MultiDiGraph:
    G = nx.MultiDiGraph()
    for vid in g.inputs:
        G.add_node(vid, kind="input", primitive="input", arg_name=g.values[vid].arg_name)
    for op in g.ops.values():
        G.add_node(op.id, kind="op", primitive=op.primitive, flops=op.cost.flops, time=op.time,
                   source=op.source)
    for op in g.ops.values():
        for v in op.inputs:
            src = g.values[v].producer or v
            if src in G:
                G.add_edge(src, op.id, key=v, value=v, nbytes=g.values[v].nbytes)
    return G
