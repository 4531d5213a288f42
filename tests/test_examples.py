"""Tests of the built-in example models (autoremat/examples.py)."""

import functools
import inspect
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from autoremat import examples
from autoremat._errors import AutorematError
from autoremat._xla import CPU_XLA_FLAGS, cpu_flags_active
from _helpers import assert_trees_close

CP = jax.checkpoint_policies

# Small knobs so the whole file stays well under a minute on a 2-core CPU.
SMALL = {
    "mlp_chain": dict(n_layers=4, width=128, batch=64),
    "transformer": dict(n_layers=2, d_model=64, n_heads=2, seq=32, batch=2, vocab=128),
    "transformer_scan": dict(n_layers=2, d_model=64, n_heads=2, seq=32, batch=2, vocab=128),
    "convnet": dict(depth=2, channels=8, image=16, batch=2),
}
NAMES = sorted(examples.EXAMPLES)
TRANSFORMERS = ["transformer", "transformer_scan"]


def small(name, **overrides):
    return examples.get_example(name, **{**SMALL[name], **overrides})


def compile_value_and_grad(ex):
    return jax.jit(jax.value_and_grad(ex.fn)).lower(*ex.args).compile()


def value_and_grad(ex):
    return compile_value_and_grad(ex)(*ex.args)


def compiled_peak(compiled):
    """Peak bytes: arguments + outputs + temporaries - aliases (docs/FACTS.md section 2, fact 5)."""
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


@functools.cache
def no_remat(name):
    """``(example, (loss, grads), compiled peak)`` of the small example without remat, built once."""
    ex = small(name)
    compiled = compile_value_and_grad(ex)
    return ex, compiled(*ex.args), compiled_peak(compiled)


def equations(jaxpr):
    """Yields every equation of a jaxpr, looking inside nested jaxprs (scan bodies, remat, jit)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else [value]:
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    yield from equations(sub)


def count_checkpoints(jaxpr):
    """Counts remat regions (the primitive is ``checkpoint`` or, in newer JAX, ``remat2``)."""
    return sum(eqn.primitive.name in ("checkpoint", "remat2") for eqn in equations(jaxpr))


def checkpoint_names(jaxpr):
    """The ``checkpoint_name`` tags in a jaxpr."""
    return {eqn.params["name"] for eqn in equations(jaxpr) if eqn.primitive.name == "name"}


# ---------------------------------------------------------------------------
# Every example runs and is deterministic
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_value_and_grad_is_finite(name):
    ex, (loss, grads), _ = no_remat(name)
    assert ex.name == name
    assert loss.shape == () and loss.dtype == jnp.float32
    assert np.isfinite(float(loss))
    assert jax.tree.structure(grads) == jax.tree.structure(ex.args[0])
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    assert ex.description and ex.n_blocks > 0


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_arguments(name):
    a, b, c = small(name), small(name), small(name, seed=1)
    assert_trees_close(a.args, b.args, rtol=0.0)
    assert not np.array_equal(jax.tree.leaves(a.args)[-1], jax.tree.leaves(c.args)[-1])


@pytest.mark.parametrize("name", NAMES)
def test_policy_wraps_each_block(name):
    ex = small(name, policy=CP.nothing_saveable)
    n = count_checkpoints(jax.make_jaxpr(ex.fn)(*ex.args))
    # One region per block; a scan has one region, its body.
    assert n == (1 if name == "transformer_scan" else ex.n_blocks)
    plain = small(name)
    assert count_checkpoints(jax.make_jaxpr(plain.fn)(*plain.args)) == 0
    assert "no remat" in plain.description and "nothing_saveable" in ex.description


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformer_tags(name):
    tagged, untagged = small(name), small(name, tags=False)
    assert checkpoint_names(jax.make_jaxpr(tagged.fn)(*tagged.args)) == set(examples.TRANSFORMER_TAGS)
    assert checkpoint_names(jax.make_jaxpr(untagged.fn)(*untagged.args)) == set()


# ---------------------------------------------------------------------------
# Remat does not change gradients
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
@pytest.mark.parametrize("name", NAMES)
def test_per_block_policy_keeps_gradients(name, policy):
    _, (loss, grads), _ = no_remat(name)
    loss_r, grads_r = value_and_grad(small(name, policy=getattr(CP, policy)))
    assert_trees_close(loss_r, loss)
    assert_trees_close(grads_r, grads)


@pytest.mark.parametrize(
    "name, preset",
    [
        ("transformer", "minimal"),
        ("transformer_scan", "save_dot_except_mlp"),
        ("transformer", "qkv_proj_offloaded"),
        ("transformer_scan", "qkv_proj_offloaded"),
    ],
)
def test_maxtext_preset_keeps_gradients(name, preset):
    _, (loss, grads), _ = no_remat(name)
    loss_r, grads_r = value_and_grad(small(name, policy=examples.MAXTEXT_PRESETS[preset]))
    assert_trees_close(loss_r, loss)
    assert_trees_close(grads_r, grads)


def test_offload_preset_moves_residuals_to_host():
    ex = small("transformer", policy=examples.MAXTEXT_PRESETS["qkv_proj_offloaded"])
    # The residuals cross to host memory: device_put equations with f32<host> outputs.
    assert "f32<host>" in str(jax.make_jaxpr(jax.grad(ex.fn))(*ex.args))


def test_maxtext_presets():
    assert examples.MAXTEXT_PRESETS["full"] is CP.nothing_saveable
    assert {"minimal", "save_qkv_proj", "save_dot_except_mlp", "save_out_proj", "qkv_proj_offloaded"} <= set(
        examples.MAXTEXT_PRESETS
    )


# ---------------------------------------------------------------------------
# Scan over layers equals the unrolled model
# ---------------------------------------------------------------------------


def test_scan_matches_unrolled():
    unrolled, (loss_u, grads_u), _ = no_remat("transformer")
    scanned, (loss_s, grads_s), _ = no_remat("transformer_scan")
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *unrolled.args[0]["layers"])
    assert_trees_close(scanned.args[0]["layers"], stacked, rtol=0.0)
    assert_trees_close(scanned.args[1], unrolled.args[1], rtol=0.0)
    assert_trees_close(loss_s, loss_u)
    grads_u = {**grads_u, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *grads_u["layers"])}
    assert_trees_close(grads_s, grads_u)


def test_scan_flag_and_transformer_scan_agree():
    a = examples.transformer(**SMALL["transformer"], scan=True)
    b = small("transformer_scan")
    assert a.name == b.name == "transformer_scan"
    assert_trees_close(a.args, b.args, rtol=0.0)
    assert str(jax.make_jaxpr(a.fn)(*a.args)) == str(jax.make_jaxpr(b.fn)(*b.args))


# ---------------------------------------------------------------------------
# Per-block remat lowers the compiled peak (docs/FACTS.md section 2, facts 1 and 8)
# ---------------------------------------------------------------------------

def test_per_block_nothing_saveable_lowers_compiled_peak():
    # Without the XLA:CPU flags (set by conftest.py) the scheduler hoists recomputation and
    # CSE merges it back into the forward pass; the convnet then shows no saving at all.
    assert cpu_flags_active(), f"XLA_FLAGS={os.environ.get('XLA_FLAGS')!r} lacks {CPU_XLA_FLAGS}"
    print("\ncompiled peak (args + outputs + temp - alias), MiB:")
    for name in NAMES:
        none = no_remat(name)[2]
        per_block = compiled_peak(compile_value_and_grad(small(name, policy=CP.nothing_saveable)))
        print(f"  {name:17s} no remat {none / 2**20:7.3f}   per-block nothing_saveable {per_block / 2**20:7.3f}")
        assert per_block < none, (name, per_block, none)


# ---------------------------------------------------------------------------
# Registry and errors
# ---------------------------------------------------------------------------


def test_unknown_example_names_the_known_ones():
    with pytest.raises(AutorematError, match=r"unknown example 'resnet'; known examples: convnet, mlp_chain, "):
        examples.get_example("resnet")


def test_unknown_size_and_knob():
    with pytest.raises(AutorematError, match=r"unknown size 'tpu' for example 'convnet'; known sizes: small, gpu"):
        examples.get_example("convnet", size="tpu")
    with pytest.raises(AutorematError, match=r"unknown argument\(s\) width for example 'transformer'; it takes: "):
        examples.get_example("transformer", width=3)


def test_sizes_fit_the_factories():
    assert set(examples.SIZES) == set(examples.EXAMPLES)
    for name, presets in examples.SIZES.items():
        assert set(presets) == {"small", "gpu"}
        for knobs in presets.values():
            inspect.signature(examples.EXAMPLES[name]).bind(**knobs)


def test_invalid_knobs():
    with pytest.raises(ValueError, match=r"d_model=30 must be a multiple of n_heads=4"):
        examples.transformer(d_model=30)
    with pytest.raises(ValueError, match=r"image=20 must be divisible by 2\*\*depth=8"):
        examples.convnet(image=20)
    with pytest.raises(ValueError, match=r"width must be a positive int, got 0"):
        examples.mlp_chain(width=0)
