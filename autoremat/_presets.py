"""MaxText's `remat_policy` presets, by the `checkpoint_name` tags each saves.

MaxText names the values of a decoder layer (`query_proj`, `key_proj`, `value_proj`, `context`,
`out_proj`, `mlpwi`, `mlpwo`) and its presets are `jax.checkpoint_policies.save_only_these_names`
over subsets of them.  A model tagged with those names gets them as hand-written plans
(`_hand.uniform_plans`: what its author would write per layer), and `examples.MAXTEXT_PRESETS`
builds the policies from the same table.
"""

from __future__ import annotations

__all__ = ["MAXTEXT_NAMES", "SAVED_NAMES", "OFFLOADED_NAMES"]

_QKV = ("query_proj", "key_proj", "value_proj")

# The names MaxText tags in each decoder layer.
MAXTEXT_NAMES: tuple[str, ...] = (*_QKV, "context", "out_proj", "mlpwi", "mlpwo")

# Preset -> the names it saves on the device, in MaxText's order.  "minimal" is MaxText's current
# one: every weight matmul's output by name (older MaxText used
# checkpoint_dots_with_no_batch_dims, which selects the same values by primitive; names are what
# jax_remat3 keeps, docs/FACTS.md fact 3).
SAVED_NAMES: dict[str, tuple[str, ...]] = {
    "minimal": (*_QKV, "out_proj", "mlpwi", "mlpwo"),
    "minimal_with_context": (*_QKV, "context", "out_proj", "mlpwi", "mlpwo"),
    "save_dot_with_context_except_mlp": (*_QKV, "context", "out_proj"),
    "save_dot_except_mlpwi": (*_QKV, "out_proj", "mlpwo"),
    "save_dot_except_mlp": (*_QKV, "out_proj"),
    "save_qkv_proj": _QKV,
    "save_out_proj": ("out_proj",),
}

# Preset -> the names it offloads to pinned host memory (saving none on the device).
OFFLOADED_NAMES: dict[str, tuple[str, ...]] = {
    "qkv_proj_offloaded": _QKV,
    "minimal_offloaded": (*_QKV, "out_proj", "mlpwi", "mlpwo"),
}
