"""The per-layer measurements: compile one segment of the function alone, under one option.

Rotor/Rockmate's lesson (docs/FACTS.md section 3, "Measure, then compose"): a chain planner is
as good as its per-stage numbers, and a model of the framework's allocator tuned on a few models
does not carry to others (docs/FINDINGS.md: the analytic model was -18..+39% off on our own
models, 23-40% under at 1B).  So a layer's option can be measured by XLA itself: equations
`[start, stop)` of the flat jaxpr become a function of their live-in values, realized exactly as
`apply` realizes the plan (same regions, names and policies), and `jax.vjp` of it is compiled
with abstract shapes (the model's dtypes, and shardings where JAX's types carry them).

* `measure_segment` -> `backward_bytes`: the segment's compiled peak less the function inputs it
  reads and their gradients (which live through the whole step): the `b` of the chain formula
  in `solver/_chain.py`, what is live while this segment runs backward.
* `measure_layer` -> also `stored_bytes` (the chain's `s`): the layer followed by the next
  block, less that block alone; while the next block runs backward the layer's stored values
  are live.

docs/FACTS.md fact 13 checked this composition at 1B by hand; `benchmarks/layer_measure.py`
checks it on the benchmark models and a 1B decoder (`benchmarks/results/layer_measure.md`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jax
import numpy as np

from autoremat.graph._costs import aval_bytes
from autoremat.graph._trace import Traced, concrete_sharding
from autoremat.runtime._apply import segment_function
from autoremat.runtime._plan import Plan

__all__ = ["LayerMeasurement", "Measurement", "measure_layer", "measure_segment", "segment_key"]


@dataclass(frozen=True)
class Measurement:
    """What XLA says about one segment under one option (bytes per device).

    Attributes:
      backward_bytes: the compiled peak less the function inputs the segment reads and their
        gradients (what is live while it runs, beyond what lives through the whole step).
      compiled_peak: argument + output + temp - alias of the segment's forward + backward.
      activation_input_bytes: its live-in values that are not the function's own inputs.
    """

    backward_bytes: int
    compiled_peak: int
    compile_time: float
    activation_input_bytes: int = 0


@dataclass(frozen=True)
class LayerMeasurement:
    """One layer under one option: the `s` and `b` of the chain formula (`solver/_chain.py`)."""

    stored_bytes: int
    backward_bytes: int
    input_bytes: int
    compile_time: float


def _struct(var, traced: Traced):
    """An abstract argument for `var`, with its sharding where JAX's types carry one."""
    aval = var.aval
    sharding = None
    jaxpr = traced.jaxpr
    if var in jaxpr.invars and traced.in_shardings:
        sharding = traced.in_shardings[jaxpr.invars.index(var)]
    if sharding is None or not isinstance(sharding, jax.sharding.Sharding):
        sharding = _typed_sharding(aval)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding)


def _typed_sharding(aval):
    return concrete_sharding(getattr(aval, "sharding", None))


def segment_key(traced: Traced, plan: Plan, start: int, stop: int) -> str:
    """A structural key: segments with equal keys measure the same (identical layers)."""
    from autoremat.graph._trace import structure_fingerprint

    fn, ins, _ = segment_function(traced, plan, start, stop)
    structs = [_struct(v, traced) for v in ins]
    persistent = _persistent(traced, ins)
    jaxpr = jax.make_jaxpr(fn)(*structs)
    return f"{structure_fingerprint(jaxpr.jaxpr)}:{''.join('p' if p else 'a' for p in persistent)}"


def _persistent(traced: Traced, ins) -> list[bool]:
    """Which live-in values are the function's own inputs (alive through the whole step)."""
    top = set(traced.jaxpr.invars) | set(traced.jaxpr.constvars)
    return [v in top for v in ins]


def measure_segment(traced: Traced, plan: Plan, start: int, stop: int) -> Measurement:
    """Compiles equations `[start, stop)` under `plan` alone and reads what they need.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from autoremat.graph import trace
      >>> from autoremat.runtime import Plan, Region
      >>> def loss(w, x):
      ...     return jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w))
      >>> t = trace(loss, (jnp.ones((64, 64)), jnp.ones((256, 64))))
      >>> m = measure_segment(t, Plan(t.fingerprint, len(t.jaxpr.eqns)), 0, 4)
      >>> m.compiled_peak - m.backward_bytes   # w and x (arguments) and their gradients
      163840
    """
    fn, ins, outs = segment_function(traced, plan, start, stop)
    structs = [_struct(v, traced) for v in ins]
    persistent = _persistent(traced, ins)
    diff = [i for i, s in enumerate(structs) if jax.dtypes.issubdtype(s.dtype, np.inexact)]
    out_float = [j for j, v in enumerate(outs) if jax.dtypes.issubdtype(v.aval.dtype, np.inexact)]

    def forward(diff_vals, other):
        vals = list(other)
        for i, v in zip(diff, diff_vals):
            vals[i] = v
        out = fn(*vals)
        return [out[j] for j in out_float]

    def step(diff_vals, other, cts):
        out, vjp = jax.vjp(lambda *d: forward(d, other), *diff_vals)
        # In the step the cotangent arrives after the forward pass; as an argument here it
        # would be there from the start, and XLA could run a region's recomputation during the
        # forward (one layer of the small transformer: 21.0 MiB under nothing_saveable, as
        # much as left alone).  The barrier makes it wait for the segment's outputs.
        _, cts = jax.lax.optimization_barrier((out, list(cts)))
        return vjp(cts)

    cts = [jax.ShapeDtypeStruct(outs[j].aval.shape, outs[j].aval.dtype,
                                sharding=_typed_sharding(outs[j].aval)) for j in out_float]
    other = [None if i in diff else s for i, s in enumerate(structs)]
    t0 = time.perf_counter()
    compiled = jax.jit(step).lower([structs[i] for i in diff], other, cts).compile()
    compile_time = time.perf_counter() - t0
    m = compiled.memory_analysis()
    peak = sum(int(getattr(m, k, 0) or 0) for k in (
        "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")) - int(m.alias_size_in_bytes or 0)
    fixed = sum(aval_bytes(v.aval) for v, p in zip(ins, persistent) if p)
    fixed += sum(aval_bytes(ins[i].aval) for i in diff if persistent[i])  # their gradients
    acts = sum(aval_bytes(v.aval) for v, p in zip(ins, persistent) if not p)
    return Measurement(max(0, peak - fixed), peak, compile_time, acts)


def measure_layer(traced: Traced, plan: Plan, start: int, mid: int, stop: int,
                  next_alone: Measurement) -> LayerMeasurement:
    """The layer `[start, mid)` under `plan`, measured alone and followed by the next block.

    `[mid, stop)` is the block after it, which `plan` leaves alone, and `next_alone` is that
    block's own measurement under the same treatment.  While the next block runs backward the
    layer's stored values are live, so the two differ by what the layer stores beyond its input
    (docs/FACTS.md fact 13: 0.27-0.30 GiB per layer at 1B, as saved_residuals).  The input,
    an argument of the layer's compile, is added: a region stores it by construction, and so
    do un-checkpointed layers for their first matmul's weight gradient.  (With it, the 1B
    decoder's composed peaks were within -2.8..0% of compiled: benchmarks/results/layer_measure.md.)
    JAX's residual list over-counts what XLA stores (it fuses elementwise residuals into the
    backward pass), so the difference comes from XLA, not from that list.
    """
    m1 = measure_segment(traced, plan, start, mid)
    m2 = measure_segment(traced, plan, start, stop)
    stored = max(0, m2.backward_bytes - next_alone.backward_bytes) + m1.activation_input_bytes
    return LayerMeasurement(stored, m1.backward_bytes, m1.activation_input_bytes,
                            m1.compile_time + m2.compile_time)
