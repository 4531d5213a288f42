"""Per-equation cost model: FLOPs, transcendentals and bytes of a jaxpr equation.

Costs come from a rule registry keyed by primitive name (``eqn.primitive.name``),
in the style of equinox's jaxpr interpreters: :func:`register_cost_rule` adds or
replaces a rule, and a primitive without a rule gets a conservative default (one
FLOP per output element, bytes = inputs + outputs) and is recorded so reports can
list it (:func:`conservatively_costed`).

Conventions (chosen to match XLA's ``HloCostAnalysis`` where it is exact):

- ``dot_general``: ``2 * prod(batch) * prod(lhs free) * prod(rhs free) * prod(contracting)``.
- ``conv_general_dilated``: ``2 * output elements * kernel spatial elements * kernel
  input features`` (the kernel's input-feature dimension is already ``C / feature_group_count``;
  ``batch_group_count`` splits the output features, so the same formula holds). XLA counts
  only taps that fall inside the unpadded input, so for ``SAME`` padding it reports a few
  percent less.
- Elementwise arithmetic: one FLOP per output element.
- Transcendental primitives (``exp``, ``tanh``, ``pow``, ...): one *transcendental* per
  output element and zero FLOPs, as XLA reports them.
- Reductions and scans along an axis (``reduce_sum``, ``argmax``, ``cumsum``, ...): one
  FLOP per input element (XLA counts ``n - 1`` per output for plain reductions).
- Data movement (``reshape``, ``transpose``, ``gather``, ``convert_element_type``, ...):
  zero FLOPs, but bytes. ``scatter-add`` and friends count one FLOP per update element.
- ``bytes_read`` is the size of every input (literals included), ``bytes_written`` the
  size of every output; tokens and other non-array values are 0 bytes.
- Higher-order primitives recurse into their jaxprs: ``jit``/``pjit``, ``closed_call``,
  ``core_call``, ``shard_map`` (per-device shapes), ``custom_jvp_call``,
  ``custom_vjp_call``/``custom_vjp_call_jaxpr``, ``checkpoint``/``remat2`` (and
  ``call_hi_primitive`` under ``jax_remat3``); ``scan`` is its body times ``length``;
  ``cond`` is the field-wise maximum over its branches;
  ``while`` counts its condition and body once and sets :attr:`OpCost.unknown_trip_count`,
  because the trip count is not known statically. XLA's ``cost_analysis`` also counts
  loop bodies once (docs/FACTS.md fact 6); this model multiplies ``scan`` bodies by their length.
- Every equation is counted, including dead ones: ``make_jaxpr(jax.grad(f))`` keeps some
  unused forward values that XLA removes, so on such jaxprs this model can exceed
  ``cost_analysis`` until the jaxpr is dead-code eliminated.
- Unknown primitives with sub-jaxprs get the default plus the cost of each sub-jaxpr once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

__all__ = [
    "jaxpr_matmul_flops",
    "eqn_matmul_flops",
    "OpCost",
    "CostRule",
    "aval_bytes",
    "aval_size",
    "register_cost_rule",
    "eqn_cost",
    "jaxpr_cost",
    "conservatively_costed",
]


@dataclasses.dataclass(frozen=True)
class OpCost:
    """The work of one equation (or a sum of equations).

    Attributes:
      flops: floating-point (and integer arithmetic) operations.
      transcendentals: transcendental function evaluations (exp, tanh, ...).
      bytes_read: bytes of all inputs.
      bytes_written: bytes of all outputs.
      unknown_trip_count: True when a ``while`` loop inside was counted once because its
        trip count is not known statically; the totals are then a lower bound.

    >>> a = OpCost(flops=10, bytes_read=8)
    >>> (a + a.scale(2)).flops
    30.0
    """

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    unknown_trip_count: bool = False

    def __post_init__(self):
        for field in ("flops", "transcendentals", "bytes_read", "bytes_written"):
            object.__setattr__(self, field, float(getattr(self, field)))

    @property
    def bytes_accessed(self) -> float:
        """``bytes_read + bytes_written``."""
        return self.bytes_read + self.bytes_written

    def __add__(self, other: OpCost) -> OpCost:
        if not isinstance(other, OpCost):
            return NotImplemented
        return OpCost(
            self.flops + other.flops,
            self.transcendentals + other.transcendentals,
            self.bytes_read + other.bytes_read,
            self.bytes_written + other.bytes_written,
            self.unknown_trip_count or other.unknown_trip_count,
        )

    def __radd__(self, other: Any) -> OpCost:
        # Lets the builtin ``sum(costs)`` start from 0.
        if isinstance(other, (int, float)) and other == 0:
            return self
        return NotImplemented

    def scale(self, k: float) -> OpCost:
        """Every count multiplied by ``k`` (e.g. a loop body times its trip count).

        >>> OpCost(flops=3, bytes_read=4).scale(2).bytes_read
        8.0
        """
        return OpCost(
            self.flops * k,
            self.transcendentals * k,
            self.bytes_read * k,
            self.bytes_written * k,
            self.unknown_trip_count,
        )

    def max(self, other: OpCost) -> OpCost:
        """Field-wise maximum (an upper bound over alternatives, e.g. ``cond`` branches)."""
        return OpCost(
            max(self.flops, other.flops),
            max(self.transcendentals, other.transcendentals),
            max(self.bytes_read, other.bytes_read),
            max(self.bytes_written, other.bytes_written),
            self.unknown_trip_count or other.unknown_trip_count,
        )


CostRule = Callable[[Any], OpCost]
"""A cost rule: ``rule(eqn) -> OpCost`` for one ``jax.extend.core.JaxprEqn``."""

_RULES: dict[str, CostRule] = {}
_CONSERVATIVE: set[str] = set()


# ----------------------------------------------------------------------------- sizes


def aval_size(aval: Any) -> int:
    """Number of elements of an abstract value (0 for tokens and non-arrays).

    >>> import jax
    >>> aval_size(jax.ShapeDtypeStruct((3, 4), "float32"))
    12
    """
    shape = getattr(aval, "shape", None)
    if shape is None or getattr(aval, "dtype", None) is None:
        return 0
    return int(math.prod(int(d) for d in shape))


def _itemsize(dtype: Any) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        # PRNG key types report the size of their key data (8 for threefry).
        itemsize = getattr(dtype, "itemsize", None)
        return int(itemsize) if itemsize else 8
    return int(np.dtype(dtype).itemsize)


def aval_bytes(aval: Any) -> int:
    """Bytes of an abstract value: ``itemsize * prod(shape)``.

    Accepts anything with ``shape`` and ``dtype`` (``ShapedArray``, ``ShapeDtypeStruct``,
    arrays). PRNG keys count their key data (8 bytes for threefry); tokens and other
    non-array values are 0.

    >>> import jax, jax.numpy as jnp
    >>> aval_bytes(jax.ShapeDtypeStruct((3, 4), jnp.bfloat16))
    24
    >>> aval_bytes(jax.random.key(0))
    8
    """
    dtype = getattr(aval, "dtype", None)
    if dtype is None or getattr(aval, "shape", None) is None:
        return 0
    return aval_size(aval) * _itemsize(dtype)


def _bytes(atoms: Iterable[Any]) -> int:
    return sum(aval_bytes(getattr(a, "aval", None)) for a in atoms)


def _out_elements(eqn) -> int:
    return sum(aval_size(v.aval) for v in eqn.outvars)


def _in_elements(eqn) -> int:
    return sum(aval_size(getattr(v, "aval", None)) for v in eqn.invars)


def _io(eqn, **counts: float) -> OpCost:
    return OpCost(bytes_read=_bytes(eqn.invars), bytes_written=_bytes(eqn.outvars), **counts)


# ----------------------------------------------------------------------------- registry


def register_cost_rule(primitive_name: str, rule: CostRule) -> CostRule:
    """Register (or replace) the cost rule for a primitive.

    Args:
      primitive_name: ``eqn.primitive.name``, e.g. ``"dot_general"`` or ``"scatter-add"``.
      rule: ``rule(eqn) -> OpCost``.

    Returns:
      ``rule``, so this can be used as ``register_cost_rule(name, rule)`` in a loop.

    >>> import jax
    >>> from jax.extend.core import Primitive
    >>> double_p = Primitive("my_double")
    >>> double_p.def_abstract_eval(lambda x: x)
    <function <lambda> at ...>
    >>> eqn = jax.make_jaxpr(double_p.bind)(jax.numpy.ones(4)).jaxpr.eqns[0]
    >>> _ = register_cost_rule("my_double", lambda eqn: OpCost(flops=4))
    >>> eqn_cost(eqn).flops
    4.0
    """
    if not isinstance(primitive_name, str):
        raise TypeError(
            f"primitive_name must be a str such as 'dot_general', got {primitive_name!r}"
        )
    if not callable(rule):
        raise TypeError(f"rule for {primitive_name!r} must be callable(eqn) -> OpCost, got {rule!r}")
    _RULES[primitive_name] = rule
    return rule


def conservatively_costed() -> frozenset[str]:
    """Names of primitives seen so far that had no cost rule (costed by the default).

    >>> isinstance(conservatively_costed(), frozenset)
    True
    """
    return frozenset(_CONSERVATIVE)


def _default_cost(eqn) -> OpCost:
    """One FLOP per output element, bytes in + out; sub-jaxprs (if any) are added."""
    cost = _io(eqn, flops=_out_elements(eqn))
    for sub in jex_core.jaxprs_in_params(eqn.params):
        cost = cost + jaxpr_cost(sub)
    return cost


def eqn_cost(eqn) -> OpCost:
    """Cost of one jaxpr equation (``jax.extend.core.JaxprEqn``).

    Primitives without a rule get the conservative default and are recorded in
    :func:`conservatively_costed`; this never raises for an unknown primitive.

    >>> import jax, jax.numpy as jnp
    >>> jaxpr = jax.make_jaxpr(jax.lax.dot)(jnp.ones((2, 3)), jnp.ones((3, 4)))
    >>> cost = eqn_cost(jaxpr.jaxpr.eqns[0])
    >>> cost.flops, cost.bytes_read, cost.bytes_written   # 2*M*N*K; (6+12)*4; 8*4
    (48.0, 72.0, 32.0)
    """
    name = eqn.primitive.name
    rule = _RULES.get(name)
    if rule is None:
        _CONSERVATIVE.add(name)
        return _default_cost(eqn)
    return rule(eqn)


def jaxpr_cost(jaxpr: Any) -> OpCost:
    """Total cost of a ``Jaxpr`` or ``ClosedJaxpr``, recursing into nested jaxprs.

    >>> import jax, jax.numpy as jnp
    >>> f = lambda x: jax.lax.scan(lambda c, _: (jnp.tanh(c), None), x, None, length=5)[0]
    >>> jaxpr_cost(jax.make_jaxpr(f)(jnp.ones(8))).transcendentals   # 8 per step, 5 steps
    40.0
    """
    inner = getattr(jaxpr, "jaxpr", jaxpr)  # ClosedJaxpr -> Jaxpr
    if not hasattr(inner, "eqns"):
        raise TypeError(f"jaxpr_cost expects a Jaxpr or ClosedJaxpr, got {type(jaxpr).__name__}")
    return sum((eqn_cost(e) for e in inner.eqns), OpCost())


MATMUL_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated"})


def jaxpr_matmul_flops(jaxpr: Any, batched: bool = False) -> float:
    """FLOPs of the matmuls and convolutions of a ``Jaxpr`` or ``ClosedJaxpr``, recursing into
    nested jaxprs (scan bodies times their length, the costlier branch of a cond); `batched`:
    only those `eqn_matmul_flops(..., batched=True)` counts.

    What two versions of one step are compared on: the equations around the matmuls change
    with how a function was staged (`jnp` helpers under `jit` or inlined), their FLOPs do not.

    >>> import jax, jax.numpy as jnp
    >>> f = lambda x: jax.lax.scan(lambda c, _: (jnp.tanh(c @ c), None), x, None, length=3)[0]
    >>> jaxpr_matmul_flops(jax.make_jaxpr(f)(jnp.ones((2, 2))))   # 2*2*2*2 per step, 3 steps
    48.0
    """
    return math.fsum(eqn_matmul_flops(e, batched) for e in getattr(jaxpr, "jaxpr", jaxpr).eqns)


def eqn_matmul_flops(eqn, batched: bool = False) -> float:
    """FLOPs of the matmuls and convolutions of one equation, those in its nested jaxprs
    included (as `jaxpr_matmul_flops`): a scan or a `custom_vjp` call with matmuls inside is
    not itself a matmul, but recomputing it recomputes them.  `batched`: only the convolutions
    and the dot_generals with batch dimensions, those JAX's dots_with_no_batch_dims_saveable
    does not save."""
    if eqn.primitive.name in MATMUL_PRIMITIVES:
        skip = batched and eqn.primitive.name == "dot_general" and not eqn.params["dimension_numbers"][1][0]
        return 0.0 if skip else eqn_cost(eqn).flops
    subs = [jaxpr_matmul_flops(j, batched) for j in _nested_jaxprs(eqn)]
    if not subs:
        return 0.0
    if eqn.primitive.name == "cond":
        return max(subs)
    if eqn.primitive.name == "scan":
        return int(eqn.params["length"]) * math.fsum(subs)
    return math.fsum(subs)


def _nested_jaxprs(eqn) -> list:
    out = []
    for v in eqn.params.values():
        for q in v if isinstance(v, (list, tuple)) else (v,):
            if hasattr(getattr(q, "jaxpr", q), "eqns"):
                out.append(q)
    sub = getattr(eqn.params.get("_prim"), "jaxpr", None)  # jax_remat3's call_hi_primitive
    if sub is not None and hasattr(getattr(sub, "jaxpr", sub), "eqns"):
        out.append(sub)
    return out


# ----------------------------------------------------------------------------- leaf rules


def _per_output(flops: float = 0.0, transcendentals: float = 0.0) -> CostRule:
    def rule(eqn) -> OpCost:
        n = _out_elements(eqn)
        return _io(eqn, flops=flops * n, transcendentals=transcendentals * n)

    return rule


def _per_input(flops: float = 1.0, transcendentals: float = 0.0) -> CostRule:
    def rule(eqn) -> OpCost:
        n = aval_size(eqn.invars[0].aval)
        return _io(eqn, flops=flops * n, transcendentals=transcendentals * n)

    return rule


def _zero_cost(eqn) -> OpCost:
    return OpCost()


_ELEMENTWISE = (
    "add", "add_any", "sub", "mul", "div", "rem", "max", "min", "neg", "abs", "sign",
    "floor", "ceil", "round", "is_finite", "nextafter", "square", "clamp", "select_n",
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor", "not",
    "shift_left", "shift_right_logical", "shift_right_arithmetic", "mulhi",
    "population_count", "clz", "conj", "real", "imag", "complex", "reduce_precision",
)  # fmt: skip
_TRANSCENDENTAL = (
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan",
    "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh",
    "sqrt", "rsqrt", "cbrt", "pow", "erf", "erfc", "erf_inv", "lgamma", "digamma",
    "polygamma", "igamma", "igammac", "igamma_grad_a", "random_gamma_grad",
    "bessel_i0e", "bessel_i1e", "regularized_incomplete_beta", "zeta",
)  # fmt: skip
# Primitives XLA fuses into their consumers (elementwise work and free layout changes).
FUSIBLE_PRIMITIVES = frozenset(set(_ELEMENTWISE) | set(_TRANSCENDENTAL) | {
    "integer_pow", "reshape", "broadcast_in_dim", "convert_element_type", "squeeze", "expand_dims",
    "copy", "name", "stop_gradient", "select_n", "iota"})
_REDUCTIONS = (
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor", "argmax", "argmin", "cumsum", "cumprod", "cummax",
    "cummin", "reduce",
)  # fmt: skip
_DATA_MOVEMENT = (
    "reshape", "broadcast_in_dim", "transpose", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "split", "gather", "scatter",
    "convert_element_type", "bitcast_convert_type", "squeeze", "expand_dims", "iota",
    "copy", "copy_p", "pad", "rev", "device_put", "random_wrap", "random_unwrap",
    "random_seed", "random_key_data", "random_clone", "stack", "unstack", "tile",
    "broadcast_to", "zeros_like", "empty", "from_edtype", "to_edtype",
)  # fmt: skip
_FREE = (
    # Identities at run time: checkpoint_name, stop_gradient, scheduling/sharding hints.
    "name", "stop_gradient", "optimization_barrier", "sharding_constraint",
    "mesh_cast", "reshard", "pvary", "tie_in", "pin", "unpin", "layout_constraint",
    "with_memory_space_constraint", "inspect_sharding", "create_token", "after_all",
    "axis_index", "platform_index", "shape_assertion",
)  # fmt: skip
_SCATTER_COMBINE = (
    "scatter-add", "scatter_add", "scatter-sub", "scatter_sub", "scatter-mul",
    "scatter_mul", "scatter-min", "scatter_min", "scatter-max", "scatter_max",
)  # fmt: skip

for _name in _ELEMENTWISE:
    register_cost_rule(_name, _per_output(flops=1.0))
for _name in _TRANSCENDENTAL:
    register_cost_rule(_name, _per_output(transcendentals=1.0))
for _name in _REDUCTIONS:
    register_cost_rule(_name, _per_input(flops=1.0))
register_cost_rule("cumlogsumexp", _per_input(flops=1.0, transcendentals=1.0))
for _name in _DATA_MOVEMENT:
    register_cost_rule(_name, _per_output())
for _name in _FREE:
    register_cost_rule(_name, _zero_cost)


def _scatter_combine_cost(eqn) -> OpCost:
    # operand, indices, updates: one combining FLOP per update element.
    return _io(eqn, flops=aval_size(eqn.invars[2].aval))


for _name in _SCATTER_COMBINE:
    register_cost_rule(_name, _scatter_combine_cost)


def _integer_pow_cost(eqn) -> OpCost:
    # x ** y by repeated squaring: floor(log2 y) squarings + (popcount y - 1) multiplies,
    # plus one division for a negative exponent.
    y = int(eqn.params["y"])
    m = abs(y)
    muls = max(m.bit_length() - 1 + bin(m).count("1") - 1, 0) + (1 if y < 0 else 0)
    return _io(eqn, flops=max(muls, 1) * _out_elements(eqn))


register_cost_rule("integer_pow", _integer_pow_cost)


def _dot_general_cost(eqn) -> OpCost:
    (lhs_contract, _), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    rhs_contract = eqn.params["dimension_numbers"][0][1]
    batch = math.prod(lhs[d] for d in lhs_batch)
    contract = math.prod(lhs[d] for d in lhs_contract)
    lhs_free = math.prod(s for d, s in enumerate(lhs) if d not in (*lhs_contract, *lhs_batch))
    rhs_free = math.prod(s for d, s in enumerate(rhs) if d not in (*rhs_contract, *rhs_batch))
    return _io(eqn, flops=2 * batch * lhs_free * rhs_free * contract)


register_cost_rule("dot_general", _dot_general_cost)


def _conv_cost(eqn) -> OpCost:
    rhs = eqn.invars[1].aval.shape
    dnums = eqn.params["dimension_numbers"]
    out_feature_dim = dnums.rhs_spec[0] if dnums is not None else 0
    # Each output element sums over the kernel window and the kernel's input features
    # (C / feature_group_count); batch groups split the output features, not the sum.
    macs_per_output = math.prod(rhs) // max(rhs[out_feature_dim], 1)
    return _io(eqn, flops=2 * _out_elements(eqn) * macs_per_output)


register_cost_rule("conv_general_dilated", _conv_cost)


def _reduce_window_cost(eqn) -> OpCost:
    window = math.prod(eqn.params["window_dimensions"])
    return _io(eqn, flops=_out_elements(eqn) * window)


for _name in ("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window"):
    register_cost_rule(_name, _reduce_window_cost)


def _select_and_scatter_cost(eqn) -> OpCost:
    # Max-pool gradients: a select over each window of the operand, then a scatter-add.
    window = math.prod(eqn.params["window_dimensions"])
    return _io(eqn, flops=aval_size(eqn.invars[0].aval) * window)


register_cost_rule("select_and_scatter_add", _select_and_scatter_cost)
register_cost_rule("select_and_gather_add", _reduce_window_cost)


def _sort_cost(eqn) -> OpCost:
    # Estimate: n log2(n) comparisons along the sorted dimension, per sorted row.
    aval = eqn.invars[0].aval
    n = aval.shape[eqn.params["dimension"]] if aval.shape else 1
    return _io(eqn, flops=aval_size(aval) * max(math.ceil(math.log2(max(n, 2))), 1))


register_cost_rule("sort", _sort_cost)


def _top_k_cost(eqn) -> OpCost:
    # Estimate: a partial sort, n log2(k) comparisons.
    k = int(eqn.params["k"])
    return _io(eqn, flops=aval_size(eqn.invars[0].aval) * max(math.ceil(math.log2(max(k, 2))), 1))


register_cost_rule("top_k", _top_k_cost)

# Threefry-2x32: 20 rounds of add/rotate/xor on two 32-bit words plus key injections,
# about 60 integer operations per 32-bit word of output. An estimate.
_THREEFRY_OPS_PER_WORD = 60


def _random_bits_cost(eqn) -> OpCost:
    words = sum(aval_bytes(v.aval) for v in eqn.outvars) / 4
    return _io(eqn, flops=_THREEFRY_OPS_PER_WORD * words)


def _random_key_derivation_cost(eqn) -> OpCost:
    # split / fold_in hash each output key's data (2 words per threefry key).
    words = sum(aval_bytes(v.aval) for v in eqn.outvars) / 4
    return _io(eqn, flops=_THREEFRY_OPS_PER_WORD * words)


for _name in ("random_bits", "threefry2x32", "threefry4x32", "philox2x32", "philox4x32",
              "rng_bit_generator"):
    register_cost_rule(_name, _random_bits_cost)
register_cost_rule("random_split", _random_key_derivation_cost)
register_cost_rule("random_fold_in", _random_key_derivation_cost)


# ----------------------------------------------------------------------------- higher-order


def _call_rule(*param_names: str) -> CostRule:
    """Cost of a call-like primitive: its (first present) jaxpr param, run once."""

    def rule(eqn) -> OpCost:
        for p in param_names:
            sub = eqn.params.get(p)
            if sub is not None:
                return jaxpr_cost(sub)
        _CONSERVATIVE.add(eqn.primitive.name)
        return _default_cost(eqn)

    return rule


register_cost_rule("jit", _call_rule("jaxpr"))
register_cost_rule("pjit", _call_rule("jaxpr"))
register_cost_rule("closed_call", _call_rule("call_jaxpr"))
register_cost_rule("core_call", _call_rule("call_jaxpr"))
register_cost_rule("remat", _call_rule("jaxpr"))
register_cost_rule("remat2", _call_rule("jaxpr"))
register_cost_rule("checkpoint", _call_rule("jaxpr"))
register_cost_rule("custom_jvp_call", _call_rule("call_jaxpr", "fun_jaxpr"))
register_cost_rule("custom_vjp_call", _call_rule("call_jaxpr", "fun_jaxpr"))
register_cost_rule("custom_vjp_call_jaxpr", _call_rule("fun_jaxpr", "call_jaxpr"))
register_cost_rule("custom_jvp_call_jaxpr", _call_rule("fun_jaxpr", "call_jaxpr"))
register_cost_rule("custom_vmap_call", _call_rule("call_jaxpr"))
# shard_map's body has per-shard shapes: its cost is per device, like the memory budget.
register_cost_rule("shard_map", _call_rule("jaxpr"))


def _call_hi_cost(eqn) -> OpCost:
    # Under jax_remat3, jax.checkpoint stages a `call_hi_primitive` whose `_prim`
    # (a RematTraced) carries the checkpointed ClosedJaxpr.
    sub = getattr(eqn.params.get("_prim"), "jaxpr", None)
    if sub is not None and hasattr(getattr(sub, "jaxpr", sub), "eqns"):
        return jaxpr_cost(sub)
    _CONSERVATIVE.add(eqn.primitive.name)
    return _default_cost(eqn)


register_cost_rule("call_hi_primitive", _call_hi_cost)


def _scan_cost(eqn) -> OpCost:
    return jaxpr_cost(eqn.params["jaxpr"]).scale(int(eqn.params["length"]))


def _while_cost(eqn) -> OpCost:
    once = jaxpr_cost(eqn.params["cond_jaxpr"]) + jaxpr_cost(eqn.params["body_jaxpr"])
    return dataclasses.replace(once, unknown_trip_count=True)


def _cond_cost(eqn) -> OpCost:
    costs = [jaxpr_cost(b) for b in eqn.params["branches"]]
    out = costs[0]
    for c in costs[1:]:
        out = out.max(c)
    return out


register_cost_rule("scan", _scan_cost)
register_cost_rule("while", _while_cost)
register_cost_rule("cond", _cond_cost)

del _name
