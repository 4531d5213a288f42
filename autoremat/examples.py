"""Built-in example models for tests, the README demo and benchmarks.

Each factory returns an :class:`Example`: a loss ``fn(params, batch)`` that
returns a float32 scalar, arguments to call it with, and the number of blocks
(layers or stages) it is built from. Gradients are taken with respect to the
first argument, ``params``.

Every factory takes ``policy``. ``None`` means no rematerialization; anything
else is a JAX checkpoint policy (``jax.checkpoint_policies.nothing_saveable``,
``save_only_these_names(...)``, one of :data:`MAXTEXT_PRESETS`, ...) applied
*per block*: each layer or stage is wrapped in
``jax.checkpoint(block, policy=policy)``, and in the scan-over-layers
transformer the scan body is. This is the "built-in policy per block"
baseline that autoremat plans are compared against. One checkpoint around the
whole loss would save nothing (docs/FACTS.md section 2, fact 1).

Models:

* :func:`mlp_chain`: a residual-free chain of dense + gelu layers.
* :func:`transformer`: a GPT-style pre-LN decoder, unrolled or as a
  ``jax.lax.scan`` over stacked layer parameters (MaxText style), with MaxText's
  ``checkpoint_name`` tags on the projections.
* :func:`transformer_scan`: :func:`transformer` with ``scan=True``.
* :func:`convnet`: a small U-Net whose skip connections make the graph a DAG
  rather than a chain.

Default sizes compile and run forward + backward in a few seconds at most on a
2-core CPU. :data:`SIZES` holds larger ``"gpu"`` knobs for benchmarks;
:func:`get_example` picks a size preset and applies overrides.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from autoremat._errors import AutorematError
from autoremat._presets import MAXTEXT_NAMES, OFFLOADED_NAMES, SAVED_NAMES

__all__ = [
    "Example",
    "mlp_chain",
    "transformer",
    "transformer_scan",
    "convnet",
    "MAXTEXT_PRESETS",
    "TRANSFORMER_TAGS",
    "EXAMPLES",
    "SIZES",
    "get_example",
]

Policy = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Example:
    """A loss function with arguments to call it on.

    Attributes:
      name: the registry name of the model (a key of :data:`EXAMPLES`).
      fn: the loss, ``fn(params, batch) -> float32 scalar``.
      args: ``(params, batch)``, pytrees of arrays.
      description: one line naming the model, its sizes and its remat.
      n_blocks: how many blocks (layers or stages) the model is built from; with
        a policy, each is one ``jax.checkpoint`` region.
    """

    name: str
    fn: Callable[..., jax.Array]
    args: tuple[Any, ...]
    description: str
    n_blocks: int


def _per_block(block: Callable, policy: Policy | None, *, prevent_cse: bool = True) -> Callable:
    """Wraps ``block`` in ``jax.checkpoint(policy=policy)``, or returns it as is for ``None``."""
    if policy is None:
        return block
    return jax.checkpoint(block, policy=policy, prevent_cse=prevent_cse)


def _remat_text(policy: Policy | None) -> str:
    if policy is None:
        return "no remat"
    presets = {id(p): f"MAXTEXT_PRESETS[{k!r}]" for k, p in MAXTEXT_PRESETS.items() if k != "full"}
    name = presets.get(id(policy)) or getattr(policy, "__name__", None) or repr(policy)
    return f"per-block jax.checkpoint(policy={name})"


def _check_positive(**knobs: int) -> None:
    for knob, value in knobs.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{knob} must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class _Normal:
    """A placeholder for ``scale * normal(shape)``, filled in by :func:`_draw`."""

    shape: tuple[int, ...]
    scale: float = 1.0


def _draw(key: jax.Array, tree: Any) -> Any:
    """Replaces every :class:`_Normal` in ``tree`` with float32 normal samples.

    All samples come from one ``jax.random.normal`` call: XLA:CPU takes seconds
    to compile each separate threefry call, one draw per leaf would dominate the
    time to build an example.
    """
    leaves, treedef = jax.tree.flatten(tree, is_leaf=lambda x: isinstance(x, _Normal))
    total = sum(math.prod(leaf.shape) for leaf in leaves if isinstance(leaf, _Normal))
    flat = jax.random.normal(key, (total,), jnp.float32)
    out, offset = [], 0
    for leaf in leaves:
        if isinstance(leaf, _Normal):
            size = math.prod(leaf.shape)
            leaf = leaf.scale * flat[offset : offset + size].reshape(leaf.shape)
            offset += size
        out.append(leaf)
    return jax.tree.unflatten(treedef, out)


# ---------------------------------------------------------------------------
# MLP chain
# ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _mlp_init(key: jax.Array, n_layers: int, width: int, batch: int) -> tuple[Any, Any]:
    scale = 1.0 / math.sqrt(width)
    params = [
        {"w": _Normal((width, width), scale), "b": jnp.zeros((width,), jnp.float32)} for _ in range(n_layers)
    ]
    data = {"x": _Normal((batch, width)), "y": _Normal((batch, width))}
    return _draw(key, (params, data))


def _mlp_layer(h: jax.Array, layer: dict[str, jax.Array]) -> jax.Array:
    return jax.nn.gelu(h @ layer["w"] + layer["b"][None, :])


def mlp_chain(
    n_layers: int = 8,
    width: int = 512,
    batch: int = 256,
    *,
    policy: Policy | None = None,
    seed: int = 0,
) -> Example:
    """A residual-free chain of ``n_layers`` dense + gelu layers with a mean-squared loss.

    Args:
      n_layers: number of layers, each one block.
      width: input, hidden and output width.
      batch: batch size.
      policy: ``None`` for no remat, else a checkpoint policy applied per layer.
      seed: seed of ``jax.random.key`` for parameters and data.

    Returns:
      An :class:`Example` with ``params = [{"w": (width, width), "b": (width,)}, ...]``
      and ``batch = {"x": (batch, width), "y": (batch, width)}``.
    """
    _check_positive(n_layers=n_layers, width=width, batch=batch)
    params, data = _mlp_init(jax.random.key(seed), n_layers, width, batch)
    layer = _per_block(_mlp_layer, policy)

    def loss(params, batch):
        h = batch["x"]
        for p in params:
            h = layer(h, p)
        return jnp.mean((h - batch["y"]) ** 2)

    return Example(
        name="mlp_chain",
        fn=loss,
        args=(params, data),
        description=(
            f"{n_layers}-layer gelu MLP, width {width}, batch {batch}, MSE loss; "
            f"{_remat_text(policy)}"
        ),
        n_blocks=n_layers,
    )


# ---------------------------------------------------------------------------
# Transformer
# ---------------------------------------------------------------------------

TRANSFORMER_TAGS: tuple[str, ...] = MAXTEXT_NAMES
"""The ``checkpoint_name`` tags :func:`transformer` puts in each block (MaxText's names)."""

MAXTEXT_PRESETS: dict[str, Policy] = {
    **{k: jax.checkpoint_policies.save_only_these_names(*names) for k, names in SAVED_NAMES.items()},
    **{k: jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=list(names),
        offload_src="device", offload_dst="pinned_host") for k, names in OFFLOADED_NAMES.items()},
    "full": jax.checkpoint_policies.nothing_saveable,
}
"""MaxText ``remat_policy`` presets over the names in :data:`TRANSFORMER_TAGS`.

Ordered roughly from most to least saved. ``"full"`` saves nothing inside a
block; MaxText's ``"none"`` (no remat) is ``policy=None`` here. The offloaded
presets move residuals to ``pinned_host`` memory, which also exists on CPU
(docs/FACTS.md fact 7).
"""


def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale[None, None, :] + bias[None, None, :]


def _transformer_block(h: jax.Array, p: dict[str, jax.Array], *, tags: bool) -> jax.Array:
    """One pre-LN block: ``h + attn(ln(h))``, then ``h + mlp(ln(h))``."""
    tag = checkpoint_name if tags else (lambda x, name: x)
    seq = h.shape[1]
    # Attention.
    x = _layer_norm(h, p["ln1_scale"], p["ln1_bias"])
    q = tag(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), "query_proj")
    k = tag(jnp.einsum("bsd,dhk->bshk", x, p["wk"]), "key_proj")
    v = tag(jnp.einsum("bsd,dhk->bshk", x, p["wv"]), "value_proj")
    scores = jnp.einsum("bqhk,bthk->bhqt", q, k) / math.sqrt(q.shape[-1])
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))[None, None, :, :]
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1)
    context = tag(jnp.einsum("bhqt,bthk->bqhk", probs, v), "context")
    h = h + tag(jnp.einsum("bqhk,hkd->bqd", context, p["wo"]), "out_proj")
    # MLP.
    x = _layer_norm(h, p["ln2_scale"], p["ln2_bias"])
    up = tag(jnp.einsum("bsd,df->bsf", x, p["w_in"]), "mlpwi")
    down = tag(jnp.einsum("bsf,fd->bsd", jax.nn.gelu(up), p["w_out"]), "mlpwo")
    return h + down


def _transformer_layer_params(d_model: int, n_heads: int, d_ff: int) -> dict[str, Any]:
    d_head = d_model // n_heads
    s_in, s_ff = 1.0 / math.sqrt(d_model), 1.0 / math.sqrt(d_ff)
    f32 = jnp.float32
    return {
        "ln1_scale": jnp.ones((d_model,), f32),
        "ln1_bias": jnp.zeros((d_model,), f32),
        "wq": _Normal((d_model, n_heads, d_head), s_in),
        "wk": _Normal((d_model, n_heads, d_head), s_in),
        "wv": _Normal((d_model, n_heads, d_head), s_in),
        "wo": _Normal((n_heads, d_head, d_model), s_in),
        "ln2_scale": jnp.ones((d_model,), f32),
        "ln2_bias": jnp.zeros((d_model,), f32),
        "w_in": _Normal((d_model, d_ff), s_in),
        "w_out": _Normal((d_ff, d_model), s_ff),
    }


@functools.partial(jax.jit, static_argnums=tuple(range(1, 9)))
def _transformer_init(
    key: jax.Array, n_layers: int, d_model: int, n_heads: int, d_ff: int, seq: int, batch: int, vocab: int, scan: bool
) -> tuple[Any, Any]:
    k_params, k_tokens = jax.random.split(key)
    params = _draw(
        k_params,
        {
            "embed": _Normal((vocab, d_model), 0.02),
            "pos": _Normal((seq, d_model), 0.02),
            "layers": [_transformer_layer_params(d_model, n_heads, d_ff) for _ in range(n_layers)],
            "ln_f_scale": jnp.ones((d_model,), jnp.float32),
            "ln_f_bias": jnp.zeros((d_model,), jnp.float32),
            "unembed": _Normal((d_model, vocab), 1.0 / math.sqrt(d_model)),
        },
    )
    if scan:
        params["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *params["layers"])
    stream = jax.random.randint(k_tokens, (batch, seq + 1), 0, vocab, dtype=jnp.int32)
    return params, {"tokens": stream[:, :-1], "targets": stream[:, 1:]}


def transformer(n_layers: int = 4, d_model: int = 256, n_heads: int = 4, seq: int = 128, batch: int = 4,
                d_ff: int | None = None, *, vocab: int = 512, scan: bool = False, policy: Policy | None = None,
                tags: bool = True, seed: int = 0) -> Example:
    """A GPT-style pre-LN decoder with a next-token cross-entropy loss.

    Blocks: layernorm, causal multi-head attention (einsum + softmax) and a gelu MLP around a
    residual stream; learned position embedding; a final layernorm, untied unembedding.

    Args:
      n_layers, n_heads, seq, batch, vocab: blocks, attention heads, sequence length, batch size.
      d_model: width of the residual stream; a multiple of ``n_heads``.
      d_ff: MLP hidden width; ``None`` means ``4 * d_model``.
      scan: ``False`` unrolls the blocks; ``True`` stacks the layer parameters and runs
        ``jax.lax.scan`` over them (as MaxText does), with the same parameters per seed.
      policy: ``None`` for no remat, else a checkpoint policy per block (with ``scan=True``,
        on the scan body, with ``prevent_cse=False``).
      tags: ``checkpoint_name`` tags :data:`TRANSFORMER_TAGS` in each block (for name-based
        policies such as :data:`MAXTEXT_PRESETS`).
      seed: seed of ``jax.random.key`` for parameters and data.

    Returns an :class:`Example`: ``params = {"embed", "pos", "layers", "ln_f_scale",
    "ln_f_bias", "unembed"}`` (``"layers"``: per-block dicts, or stacked arrays with
    ``scan=True``), ``batch = {"tokens", "targets"}`` (int32, (batch, seq)).
    """
    d_ff = 4 * d_model if d_ff is None else d_ff
    _check_positive(
        n_layers=n_layers, d_model=d_model, n_heads=n_heads, seq=seq, batch=batch, d_ff=d_ff, vocab=vocab
    )
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
    params, data = _transformer_init(jax.random.key(seed), n_layers, d_model, n_heads, d_ff, seq, batch, vocab, scan)

    block = functools.partial(_transformer_block, tags=tags)
    if scan:
        body = _per_block(block, policy, prevent_cse=False)

        def run_layers(h, layers):
            h, _ = jax.lax.scan(lambda carry, p: (body(carry, p), None), h, layers)
            return h

    else:
        body = _per_block(block, policy)

        def run_layers(h, layers):
            for p in layers:
                h = body(h, p)
            return h

    def loss(params, batch):
        h = params["embed"][batch["tokens"]] + params["pos"][None, :, :]
        h = run_layers(h, params["layers"])
        h = _layer_norm(h, params["ln_f_scale"], params["ln_f_bias"])
        logits = jnp.einsum("bsd,dv->bsv", h, params["unembed"])
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, batch["targets"][:, :, None], axis=-1)
        return jnp.mean(nll)

    layout = "scan over layers" if scan else "unrolled"
    return Example(
        name="transformer_scan" if scan else "transformer",
        fn=loss,
        args=(params, data),
        description=(
            f"{n_layers}-layer pre-LN transformer ({layout}), d_model {d_model}, {n_heads} heads, "
            f"d_ff {d_ff}, seq {seq}, batch {batch}, vocab {vocab}, cross-entropy loss"
            f"{'' if tags else ', untagged'}; {_remat_text(policy)}"
        ),
        n_blocks=n_layers,
    )


def transformer_scan(
    n_layers: int = 4,
    d_model: int = 256,
    n_heads: int = 4,
    seq: int = 128,
    batch: int = 4,
    d_ff: int | None = None,
    *,
    vocab: int = 512,
    policy: Policy | None = None,
    tags: bool = True,
    seed: int = 0,
) -> Example:
    """:func:`transformer` with ``scan=True``: ``jax.lax.scan`` over stacked layer parameters.

    Args:
      n_layers: number of blocks (scan iterations).
      d_model: width of the residual stream; a multiple of ``n_heads``.
      n_heads: attention heads.
      seq: sequence length.
      batch: batch size.
      d_ff: MLP hidden width; ``None`` means ``4 * d_model``.
      vocab: vocabulary size.
      policy: ``None`` for no remat, else a checkpoint policy on the scan body.
      tags: put the ``checkpoint_name`` tags :data:`TRANSFORMER_TAGS` in each block.
      seed: seed of ``jax.random.key``.

    Returns:
      The :class:`Example` of :func:`transformer` with ``scan=True``.
    """
    return transformer(
        n_layers, d_model, n_heads, seq, batch, d_ff, vocab=vocab, scan=True, policy=policy, tags=tags, seed=seed
    )


# ---------------------------------------------------------------------------
# U-Net
# ---------------------------------------------------------------------------


def _conv(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    y = jax.lax.conv_general_dilated(
        x, p["w"], window_strides=(1, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return y + p["b"][None, None, None, :]


def _double_conv(x: jax.Array, p: dict[str, Any]) -> jax.Array:
    x = jax.nn.relu(_conv(x, p["conv1"]))
    return jax.nn.relu(_conv(x, p["conv2"]))


def _avg_pool2(x: jax.Array) -> jax.Array:
    b, h, w, c = x.shape
    return x.reshape(b, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


def _upsample2(x: jax.Array) -> jax.Array:
    return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


def _down_block(x: jax.Array, p: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
    skip = _double_conv(x, p)
    return skip, _avg_pool2(skip)


def _up_block(x: jax.Array, skip: jax.Array, p: dict[str, Any]) -> jax.Array:
    return _double_conv(jnp.concatenate([_upsample2(x), skip], axis=-1), p)


def _conv_params(k: int, c_in: int, c_out: int) -> dict[str, Any]:
    return {"w": _Normal((k, k, c_in, c_out), math.sqrt(2.0 / (k * k * c_in))), "b": jnp.zeros((c_out,), jnp.float32)}


def _double_conv_params(c_in: int, c_out: int) -> dict[str, Any]:
    return {"conv1": _conv_params(3, c_in, c_out), "conv2": _conv_params(3, c_out, c_out)}


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def _convnet_init(
    key: jax.Array, depth: int, channels: int, image: int, batch: int, in_channels: int
) -> tuple[Any, Any]:
    width = [channels * 2**i for i in range(depth + 1)]
    params = {
        "down": [_double_conv_params(in_channels if i == 0 else width[i - 1], width[i]) for i in range(depth)],
        "mid": _double_conv_params(width[depth - 1], width[depth]),
        # up[i] takes the output of stage i + 1 and the skip of down stage i.
        "up": [_double_conv_params(width[i + 1] + width[i], width[i]) for i in range(depth)],
        "head": _conv_params(1, width[0], in_channels),
    }
    shape = (batch, image, image, in_channels)
    return _draw(key, (params, {"x": _Normal(shape), "y": _Normal(shape)}))


def convnet(
    depth: int = 3,
    channels: int = 16,
    image: int = 32,
    batch: int = 8,
    *,
    in_channels: int = 3,
    policy: Policy | None = None,
    seed: int = 0,
) -> Example:
    """A small U-Net (NHWC, 3x3 convs + relu) with a mean-squared loss.

    The down path has ``depth`` stages (two convs, then a 2x2 average pool; the
    pre-pool output is a skip connection), a middle stage, and ``depth`` up stages
    (nearest-neighbour 2x upsample, concatenate the skip, two convs); a 1x1 conv
    maps back to ``in_channels``. Stage ``i`` has ``channels * 2**i`` channels.
    Each of the ``2 * depth + 1`` stages is one block; the skip connections make
    the graph a DAG rather than a chain.

    Args:
      depth: number of down (and up) stages; ``image`` must be divisible by ``2**depth``.
      channels: channels of the first stage.
      image: image height and width.
      batch: batch size.
      in_channels: channels of the input and target images.
      policy: ``None`` for no remat, else a checkpoint policy applied per stage.
      seed: seed of ``jax.random.key``.

    Returns:
      An :class:`Example` with ``params = {"down": [...], "mid": ..., "up": [...],
      "head": ...}`` and ``batch = {"x", "y"}`` of shape ``(batch, image, image, in_channels)``.
    """
    _check_positive(depth=depth, channels=channels, image=image, batch=batch, in_channels=in_channels)
    if image % (2**depth):
        raise ValueError(f"image={image} must be divisible by 2**depth={2**depth}")
    params, data = _convnet_init(jax.random.key(seed), depth, channels, image, batch, in_channels)
    down = _per_block(_down_block, policy)
    mid = _per_block(_double_conv, policy)
    up = _per_block(_up_block, policy)

    def loss(params, batch):
        x, skips = batch["x"], []
        for p in params["down"]:
            skip, x = down(x, p)
            skips.append(skip)
        x = mid(x, params["mid"])
        for p, skip in zip(reversed(params["up"]), reversed(skips)):
            x = up(x, skip, p)
        out = _conv(x, params["head"])
        return jnp.mean((out - batch["y"]) ** 2)

    return Example(
        name="convnet",
        fn=loss,
        args=(params, data),
        description=(
            f"U-Net, depth {depth}, {channels} base channels, {image}x{image}x{in_channels} images, "
            f"batch {batch}, MSE loss; {_remat_text(policy)}"
        ),
        n_blocks=2 * depth + 1,
    )


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

EXAMPLES: dict[str, Callable[..., Example]] = {
    "mlp_chain": mlp_chain,
    "transformer": transformer,
    "transformer_scan": transformer_scan,
    "convnet": convnet,
}
"""Example factories by name."""

_TRANSFORMER_GPU = {"n_layers": 12, "d_model": 1024, "n_heads": 16, "seq": 1024, "batch": 8, "vocab": 32768}

SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "mlp_chain": {"small": {}, "gpu": {"n_layers": 24, "width": 4096, "batch": 4096}},
    "transformer": {"small": {}, "gpu": dict(_TRANSFORMER_GPU)},
    "transformer_scan": {"small": {}, "gpu": dict(_TRANSFORMER_GPU)},
    "convnet": {"small": {}, "gpu": {"depth": 4, "channels": 64, "image": 256, "batch": 16}},
}
"""Size presets per example: ``"small"`` (the defaults, for a 2-core CPU) and ``"gpu"``.

The ``"gpu"`` sizes fit one 80 GB accelerator without remat; XLA:CPU compiles them to
peaks of about 6 GiB (mlp_chain), 24 GiB (transformer), 30 GiB (transformer_scan) and
5 GiB (convnet).
"""


def get_example(name: str, *, size: str = "small", **overrides: Any) -> Example:
    """Builds the example ``name`` at a size preset, with knobs overridden.

    Args:
      name: a key of :data:`EXAMPLES`.
      size: a key of :data:`SIZES` (``"small"`` or ``"gpu"``).
      **overrides: keyword arguments of the factory (``policy=``, ``seed=``, size
        knobs), applied over the size preset.

    Returns:
      The :class:`Example`.

    Raises:
      AutorematError: for an unknown name, size or knob; the message lists the known ones.

    Example:
      >>> import jax
      >>> from autoremat.examples import get_example
      >>> ex = get_example("mlp_chain", n_layers=2, width=8, batch=4,
      ...                  policy=jax.checkpoint_policies.nothing_saveable)
      >>> ex.n_blocks
      2
      >>> loss, grads = jax.value_and_grad(ex.fn)(*ex.args)
      >>> loss.dtype, grads[0]["w"].shape
      (dtype('float32'), (8, 8))
    """
    if name not in EXAMPLES:
        raise AutorematError(f"unknown example {name!r}; known examples: {', '.join(sorted(EXAMPLES))}")
    presets = SIZES[name]
    if size not in presets:
        raise AutorematError(f"unknown size {size!r} for example {name!r}; known sizes: {', '.join(presets)}")
    factory = EXAMPLES[name]
    knobs = [p for p in inspect.signature(factory).parameters]
    unknown = sorted(set(overrides) - set(knobs))
    if unknown:
        raise AutorematError(
            f"unknown argument(s) {', '.join(unknown)} for example {name!r}; it takes: {', '.join(knobs)}"
        )
    return factory(**{**presets[size], **overrides})
