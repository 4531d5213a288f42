"""One layer measured under each per-layer option, and the chain formula over measured layers.

The measured-layers design of issue 14 (`runtime._measure`, `benchmarks/layer_measure.py`):
compile one layer alone and followed by the next under an option (`measure_layer`: its `s`,
what it stores, and `b`, what is live while it runs backward), measure the blocks after the
layers alone (their backward runs first), and compose `solver/_chain.py`'s formula.  Used by
`policy_expected.py`, `mix_counts.py` and `layer_measure.py` to set that composition against
compiled steps.
"""

from __future__ import annotations

from autoremat._hand import layer_plan
from autoremat.runtime._measure import measure_layer, measure_segment


def measure_options(g, layers, options) -> tuple[dict, int] | None:
    """({option: the first layer's `LayerMeasurement` under it}, the blocks after the layers'
    backward bytes); None unless every layer is alike (one layer stands for all) and the first
    two are contiguous.  `options`: JAX policy names or None (no remat)."""
    n, (l0, l1) = len(layers), layers[:2]
    if len({la.key for la in layers}) != 1 or l0.stop != l1.start:
        return None
    none = layer_plan(g, layers, [None] * n)
    next_alone = measure_segment(g.traced, none, l1.start, l1.stop)
    post = measure_segment(g.traced, none, layers[-1].stop, len(g.traced.jaxpr.eqns)).backward_bytes
    meas = {pol: measure_layer(g.traced, layer_plan(g, layers, [pol] + [None] * (n - 1)), l0.start, l0.stop,
                               l1.stop, next_alone) for pol in options}
    return meas, post


def chain_formula(per_layer, post: int) -> int:
    """The peak over the layers (measurements in order) and the blocks after them, less what
    lives through the whole step: a layer peaks running backward over what the layers before
    it store; the blocks after them run backward first, over what every layer stores."""
    prefix, stage = 0, 0
    for m in per_layer:
        stage = max(stage, prefix + m.backward_bytes)
        prefix += m.stored_bytes
    return max(prefix, stage, prefix + post)
