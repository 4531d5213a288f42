"""Models of families none of autoremat's other benchmarks has, for `benchmarks/unseen.py`:
written after the planner, to find where its promise breaks on models it never saw.  Plain JAX
unless named; bf16, abstract parameters (`jax.ShapeDtypeStruct`), a few GiB each.

Each builder takes (policies, prevent_cse): per layer a JAX policy name or None, written by hand
around that layer (`jax.checkpoint`; flax nnx's `nnx.remat`), and returns (loss, abstract args,
description, layers), as `_thirdparty.py`'s do.

* `moe`: a decoder whose MLP is a mixture of 8 experts, tokens dispatched densely with capacity
  (einsums), so the experts' matmuls have a batch dimension (`dots_with_no_batch_dims_saveable`
  recomputes them).
* `unet`: a convolutional U-Net, 4 levels of 64..512 channels, skip connections from each down
  block to its up block (no two blocks alike).
* `encdec`: an encoder-decoder, 6 + 6 layers, each decoder layer attending to the encoder's
  output (made once, read by every decoder layer).
* `vit_nnx`: a ViT-L/16-like encoder in flax nnx (`nnx.MultiHeadAttention`, `nnx.remat`).
* `alternating`: a decoder whose layers alternate local (sliding-window) and global causal
  attention, as Gemma 2's do: alike but for the mask.
* `penzai`, `penzai_scan`: penzai's own Gemma-like decoder (`llamalike_common`: GeGLU, grouped
  RMSNorm, RoPE, tied embeddings, a soft-capped head) on named axes, whose every op is an
  `nmap` (`vmap`) over them; its blocks unrolled in a `pz.nn.Sequential`, or stacked by
  penzai's `LayerStack` (a `lax.scan`).  Each block is wrapped by hand in a penzai layer that
  calls it under `jax.checkpoint`, as penzai has no remat layer of its own.
* `nnx_scan`, `equinox_scan`: scans over layers as flax nnx (`nnx.vmap`-made stacked blocks,
  `nnx.scan` over `nnx.remat`) and equinox (`eqx.filter_vmap`-made stacked blocks, `lax.scan`
  over `eqx.filter_checkpoint`) write them; decoders as `_thirdparty.py`'s.
* `ssd`, `ssd_scan`: a Mamba-2-style state-space decoder (the SSD mixer's chunked algorithm:
  within a chunk a decay-masked matmul, across chunks a `lax.scan` carrying the state), so every
  layer holds a scan with matmuls inside; its layers unrolled, or in a scan over layers (a scan
  in a scan).
* `vjp_attention`: a decoder whose attention is a `jax.custom_vjp` that keeps q, k, v, the output
  and the log-sum-exp and recomputes the probabilities in its backward (memory-efficient
  attention as JAX code writes it), so the attention's matmuls are inside a custom_vjp call.
* `inner_checkpoint`: a decoder whose author wrapped the attention core (scores, softmax, the
  product with v) in `jax.checkpoint`, as people do to save the S x S scores; the hand-written
  policies per layer go around that.  `inner_checkpoint_scan`: its layers in a scan over layers.
* `mixed`: a Llama-style decoder trained in mixed precision, as flax's `param_dtype=float32,
  dtype=bfloat16` and MaxText's `weight_dtype` train: float32 master weights, each layer casting
  its own to bfloat16 where it uses them, so every layer's bf16 weight copies are values the
  backward pass may keep or recompute; its layers unrolled, or in a scan over layers as MaxText runs
  them (`mixed_scan`).
* `dropout`: a GPT-2-style decoder trained with dropout (on the attention probabilities, the
  attention's and the MLP's outputs, rate 0.1), its masks drawn from a typed PRNG key argument
  (`jax.random.key`) split per layer inside the loss, so every layer holds random-bit generation
  the backward pass may keep or draw again; its layers unrolled, or in a scan over layers whose
  keys are scanned with the weights (`dropout_scan`).
* `sdepth`: the same decoder trained with stochastic depth instead: each layer runs or is the
  identity on one Bernoulli draw (`lax.cond`), the chance to run falling linearly from 1 to 0.8
  at the last layer, so every layer is a `cond` holding its matmuls and draws one random scalar;
  its layers unrolled, or in a scan over layers whose keys and chances are scanned with the
  weights (`sdepth_scan`).
* `lora`: a Llama-style decoder fine-tuned with LoRA: its base weights a frozen argument the loss
  is not differentiated by, rank-16 adapters on all seven projections the only differentiated
  one (so the step holds no weight gradient but the adapters'); its layers unrolled, or in a scan
  over layers whose adapters and base weights are scanned together (`lora_scan`).
* `shared`: a GPT-2-style decoder whose layers all run one layer's weights, as ALBERT's (and
  looped transformers') do, so that one weight gradient sums every layer's; its layers unrolled,
  or a scan over layers that closes over the weights (`shared_scan`: the body's constants are
  differentiated, their gradient accumulated across the backward scan).
* `lstm`: a stacked LSTM language model whose every layer is a `lax.scan` over 1024 time steps
  (the input projection for all steps before it; the cell state in float32), the hand-written
  policies on each layer's cell, as recurrent networks are checkpointed per step (flax's
  `nn.remat` of a cell); its layers unrolled, or in a scan over layers (`lstm_scan`: a scan over
  time in a scan over layers, the policies still on the cell).
* `gnn`: a MeshGraphNet-style graph network on a batch of graphs: per message-passing layer each
  edge's MLP on (edge, sender, receiver), the nodes gathered onto the edges, then each node's MLP on
  (node, the sum of its incoming edges), scattered back with `segment_sum`; its layers unrolled, or
  in a scan over layers closing over the graphs' indices (`gnn_scan`).
* `griffin`: a Griffin-style hybrid (RecurrentGemma's architecture): groups of two recurrent
  blocks (a temporal conv, then the RG-LRU, whose gates are block-diagonal per-head einsums and
  whose recurrence is a float32 `lax.associative_scan` over time) and one local multi-query
  attention block, each block followed by a GeGLU MLP; its 12 blocks unrolled, each under its
  own hand-written policy, or its 4 groups in a scan over the groups, the policy on the body
  (`griffin_scan`).
* `chunked`, `chunked_scan`: a GPT-2-style decoder with a Llama-3-sized vocabulary (128256) whose
  loss is computed chunk by chunk along the sequence, as people write it so that the B x S x V
  float32 logits are never held at once: a `lax.scan` over 8 chunks whose body, under the
  author's own `jax.checkpoint`, makes one chunk's logits and its cross-entropy; its layers
  unrolled, or in a scan over layers (two top-level scans: the layers' and the loss's).  The
  hand-written policies go on the layers; the loss stays as its author wrote it.
* `fori_scan`: a GPT-2-style decoder whose layers run in a `lax.fori_loop` over stacked weights,
  each step indexing its layer's weights (`w[i]`), the hand-written policy on the loop's body
  (reverse mode turns the loop into a scan whose weights are indexed, not scanned over).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from _thirdparty import _policy, _xent, equinox_block  # the third-party models' loss, policy lookup, block

bf = jnp.bfloat16
sd = jax.ShapeDtypeStruct


def _wrap(fn, pol, cse=True):
    return fn if pol is None else jax.checkpoint(fn, policy=_policy(pol), prevent_cse=cse)


def _decoder_loss(block, pols, prevent_cse):
    """The loss of an unrolled decoder: embedding, `block` per layer under its hand-written
    policy (`pols`), LayerNorm, head, cross-entropy."""
    def loss(params, tokens):
        h = params["embed"][tokens]
        for p, pol in zip(params["layers"], pols):
            h = _wrap(block, pol, prevent_cse)(h, p)
        return _xent(_ln(h) @ params["head"], tokens)
    return loss


def _ln(x):
    x32 = x.astype(jnp.float32)
    mu = x32.mean(-1, keepdims=True)
    return ((x32 - mu) * jax.lax.rsqrt(((x32 - mu) ** 2).mean(-1, keepdims=True) + 1e-5)).astype(bf)


def _attn(x, kv, p, H, causal, on_probs=lambda a: a, proj=None):
    """Multi-head attention of `x` over `kv`; `on_probs` applied to its probabilities (dropout);
    `proj(y, name)` each projection by the weights `name` (default `y @ p[name]`; LoRA adds its
    adapters)."""
    proj = proj or (lambda y, name: y @ p[name])
    B, S, D = x.shape
    T = kv.shape[1]
    q = proj(x, "wq").reshape(B, S, H, D // H)
    k = proj(kv, "wk").reshape(B, T, H, D // H)
    v = proj(kv, "wv").reshape(B, T, H, D // H)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.asarray(D // H, bf))
    if causal:
        s = jnp.where(jnp.tril(jnp.ones((S, T), bool)), s, jnp.asarray(-1e4, bf))
    o = jnp.einsum("bhqk,bkhd->bqhd", on_probs(jax.nn.softmax(s.astype(jnp.float32), -1).astype(bf)), v)
    return proj(o.reshape(B, S, D), "wo")


# -- MoE decoder: dense dispatch with capacity, the experts as one batched einsum ---------------
MOE = dict(L=8, D=1024, H=8, E=8, C=512, F=2816, V=32000, S=1024, B=8)


def moe(policies=None, prevent_cse=True):
    d = MOE
    D, E, C, F = d["D"], d["E"], d["C"], d["F"]
    attn = {k: sd((D, D), bf) for k in ("wq", "wk", "wv", "wo")}
    layer = dict(attn, router=sd((D, E), bf), w1=sd((E, D, F), bf), w2=sd((E, F, D), bf))
    params = {"embed": sd((d["V"], D), bf), "layers": [dict(layer) for _ in range(d["L"])],
              "head": sd((D, d["V"]), bf)}
    pols = list(policies) if policies is not None else [None] * d["L"]

    def block(h, p):
        h = h + _attn(_ln(h), _ln(h), p, d["H"], True)
        x = _ln(h)
        B, S, _ = x.shape
        gates = jax.nn.softmax((x @ p["router"]).astype(jnp.float32), -1).astype(bf)  # [B,S,E]
        # dense dispatch: each expert takes C slots per sequence, weighted by its gate (the shapes and
        # matmuls of a capacity-based MoE layer; no routing decisions, which do not change them)
        disp = jax.nn.one_hot(jnp.arange(S) % C, C, dtype=bf)[None, :, None, :] * gates[..., None]  # [B,S,E,C]
        xe = jnp.einsum("bsd,bsec->becd", x, disp)
        he = jax.nn.gelu(jnp.einsum("becd,edf->becf", xe, p["w1"]))
        ye = jnp.einsum("becf,efd->becd", he, p["w2"])
        return h + jnp.einsum("becd,bsec->bsd", ye, disp)

    loss = _decoder_loss(block, pols, prevent_cse)
    desc = (f"MoE decoder: {d['L']} layers, {E} experts (capacity {C}), d_model {D}, d_ff {F}, seq {d['S']}, "
            f"batch {d['B']}, bf16")
    return loss, (params, sd((d["B"], d["S"]), jnp.int32)), desc, d["L"]


# -- U-Net: conv blocks with long skip connections ------------------------------------------------
UNET = dict(ch=(64, 128, 256, 512), image=256, batch=16)


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def unet(policies=None, prevent_cse=True):
    d = UNET
    ch, n, cin, blocks = d["ch"], len(d["ch"]), 3, []
    for c in ch:  # down
        blocks.append({"w1": sd((3, 3, cin, c), bf), "w2": sd((3, 3, c, c), bf)})
        cin = c
    blocks.append({"w1": sd((3, 3, cin, 2 * cin), bf), "w2": sd((3, 3, 2 * cin, 2 * cin), bf)})
    cin = 2 * cin
    for c in reversed(ch):  # up: upsample cin -> c channels, concat the skip (c), two convs back to c
        blocks.append({"up": sd((1, 1, cin, c), bf), "w1": sd((3, 3, 2 * c, c), bf), "w2": sd((3, 3, c, c), bf)})
        cin = c
    params = {"blocks": blocks, "out": sd((1, 1, cin, 3), bf)}
    L = len(blocks)
    pols = list(policies) if policies is not None else [None] * L

    def conv_block(x, p):
        x = jax.nn.relu(_conv(x, p["w1"]))
        return jax.nn.relu(_conv(x, p["w2"]))

    def up_block(x, skip, p):
        x = jnp.repeat(jnp.repeat(x, 2, 1), 2, 2)
        x = _conv(x, p["up"])
        return conv_block(jnp.concatenate([x, skip], -1), p)

    def loss(params, img):
        x, skips = img, []
        bl = params["blocks"]
        for i in range(n):
            x = _wrap(conv_block, pols[i], prevent_cse)(x, bl[i])
            skips.append(x)
            x = x.reshape(x.shape[0], x.shape[1] // 2, 2, x.shape[2] // 2, 2, x.shape[3]).max((2, 4))
        x = _wrap(conv_block, pols[n], prevent_cse)(x, bl[n])
        for j in range(n):
            x = _wrap(up_block, pols[n + 1 + j], prevent_cse)(x, skips[n - 1 - j], bl[n + 1 + j])
        y = _conv(x, params["out"]).astype(jnp.float32)
        return jnp.mean((y - img.astype(jnp.float32)) ** 2)

    img = sd((d["batch"], d["image"], d["image"], 3), bf)
    return loss, (params, img), (f"U-Net: {n} levels of {ch[0]}..{ch[-1]} channels, {L} blocks, {d['image']} x "
                                 f"{d['image']}, batch {d['batch']}, bf16"), L


# -- encoder-decoder with cross attention --------------------------------------------------------
ED = dict(L=6, D=1536, H=12, F=6144, V=32000, S=1024, B=8)


def encdec(policies=None, prevent_cse=True):
    d = ED
    D, F = d["D"], d["F"]
    att = {k: sd((D, D), bf) for k in ("wq", "wk", "wv", "wo")}
    enc = {"att": att, "w1": sd((D, F), bf), "w2": sd((F, D), bf)}
    dec = {"att": att, "x": att, "w1": sd((D, F), bf), "w2": sd((F, D), bf)}
    params = {"embed": sd((d["V"], D), bf), "enc": [dict(enc) for _ in range(d["L"])],
              "dec": [dict(dec) for _ in range(d["L"])], "head": sd((D, d["V"]), bf)}
    L = 2 * d["L"]
    pols = list(policies) if policies is not None else [None] * L

    def mlp(h, p):
        return h + jax.nn.gelu(_ln(h) @ p["w1"]) @ p["w2"]

    def enc_layer(h, p):
        h = h + _attn(_ln(h), _ln(h), p["att"], d["H"], False)
        return mlp(h, p)

    def dec_layer(h, m, p):
        h = h + _attn(_ln(h), _ln(h), p["att"], d["H"], True)
        h = h + _attn(_ln(h), m, p["x"], d["H"], False)
        return mlp(h, p)

    def loss(params, src, tgt):
        m = params["embed"][src]
        for i, p in enumerate(params["enc"]):
            m = _wrap(enc_layer, pols[i], prevent_cse)(m, p)
        m = _ln(m)
        h = params["embed"][tgt]
        for i, p in enumerate(params["dec"]):
            h = _wrap(dec_layer, pols[d["L"] + i], prevent_cse)(h, m, p)
        return _xent(_ln(h) @ params["head"], tgt)

    tok = sd((d["B"], d["S"]), jnp.int32)
    desc = (f"encoder-decoder: {d['L']} + {d['L']} layers, d_model {d['D']}, d_ff {d['F']}, seq {d['S']}, "
            f"batch {d['B']}, bf16")
    return loss, (params, tok, tok), desc, L


# -- ViT in flax nnx, unrolled, nnx.remat per block ----------------------------------------------
VIT = dict(L=12, D=1024, H=16, F=4096, P=16, image=224, batch=64, classes=1000)


def vit_nnx(policies=None, prevent_cse=True):
    from flax import nnx

    d = VIT

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1 = nnx.LayerNorm(d["D"], dtype=bf, param_dtype=bf, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(d["H"], d["D"], dtype=bf, param_dtype=bf, decode=False,
                                               rngs=rngs)
            self.ln2 = nnx.LayerNorm(d["D"], dtype=bf, param_dtype=bf, rngs=rngs)
            self.fc1 = nnx.Linear(d["D"], d["F"], dtype=bf, param_dtype=bf, rngs=rngs)
            self.fc2 = nnx.Linear(d["F"], d["D"], dtype=bf, param_dtype=bf, rngs=rngs)

        def __call__(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.fc2(nnx.gelu(self.fc1(self.ln2(x))))

    class ViT(nnx.Module):
        def __init__(self, rngs):
            self.patch = nnx.Conv(3, d["D"], (d["P"], d["P"]), strides=(d["P"], d["P"]), dtype=bf, param_dtype=bf,
                                  rngs=rngs)
            blocks = [Block(rngs) for _ in range(d["L"])]
            self.blocks = nnx.List(blocks) if hasattr(nnx, "List") else blocks
            self.ln = nnx.LayerNorm(d["D"], dtype=bf, param_dtype=bf, rngs=rngs)
            self.head = nnx.Linear(d["D"], d["classes"], dtype=bf, param_dtype=bf, rngs=rngs)

    gdef, params = nnx.split(nnx.eval_shape(lambda: ViT(nnx.Rngs(0))))
    pols = list(policies) if policies is not None else [None] * d["L"]

    def loss(params, img, labels):
        m = nnx.merge(gdef, params)
        x = m.patch(img)
        x = x.reshape(x.shape[0], -1, d["D"])
        for blk, pol in zip(m.blocks, pols):
            if pol is None:
                x = blk(x)
            else:
                x = nnx.remat(lambda b, x: b(x), policy=_policy(pol), prevent_cse=prevent_cse)(blk, x)
        logits = m.head(m.ln(x).mean(1)).astype(jnp.float32)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1))

    img = sd((d["batch"], d["image"], d["image"], 3), bf)
    desc = (f"ViT (flax nnx): {d['L']} blocks, d_model {d['D']}, d_ff {d['F']}, {d['P']} x {d['P']} patches of "
            f"{d['image']} x {d['image']}, batch {d['batch']}, bf16")
    return loss, (params, img, sd((d["batch"],), jnp.int32)), desc, d["L"]


# -- a decoder alternating local and global attention (Gemma 2's way): layers differ in a mask ---
ALT = dict(L=12, D=2048, H=16, F=8192, V=32000, S=2048, B=4, W=256)


def alternating(policies=None, prevent_cse=True):
    d = ALT
    D, F = d["D"], d["F"]
    layer = {k: sd((D, D), bf) for k in ("wq", "wk", "wv", "wo")}
    layer.update(w1=sd((D, F), bf), w2=sd((F, D), bf))
    params = {"embed": sd((d["V"], D), bf), "layers": [dict(layer) for _ in range(d["L"])],
              "head": sd((D, d["V"]), bf)}
    pols = list(policies) if policies is not None else [None] * d["L"]

    def block(h, p, local):
        B, S, _ = h.shape
        H = d["H"]
        x = _ln(h)
        q = (x @ p["wq"]).reshape(B, S, H, D // H)
        k = (x @ p["wk"]).reshape(B, S, H, D // H)
        v = (x @ p["wv"]).reshape(B, S, H, D // H)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.asarray(D // H, bf))
        i = jnp.arange(S)
        mask = i[:, None] >= i[None, :]
        if local:
            mask = mask & (i[:, None] - i[None, :] < d["W"])
        s = jnp.where(mask, s, jnp.asarray(-1e4, bf))
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s.astype(jnp.float32), -1).astype(bf), v)
        h = h + o.reshape(B, S, D) @ p["wo"]
        return h + jax.nn.gelu(_ln(h) @ p["w1"]) @ p["w2"]

    def loss(params, tokens):
        h = params["embed"][tokens]
        for i, (p, pol) in enumerate(zip(params["layers"], pols)):
            h = _wrap(lambda h, p, local=(i % 2 == 0): block(h, p, local), pol, prevent_cse)(h, p)
        return _xent(_ln(h) @ params["head"], tokens)

    desc = (f"decoder alternating local ({d['W']}-token window) and global attention: {d['L']} layers, d_model "
            f"{d['D']}, d_ff {d['F']}, seq {d['S']}, batch {d['B']}, bf16")
    return loss, (params, sd((d["B"], d["S"]), jnp.int32)), desc, d["L"]


# -- penzai's Gemma-like decoder: named axes, its blocks unrolled or in a LayerStack (a scan) ----
PZ = dict(L=12, D=2048, KV=8, P=256, F=8192, V=32000, S=1024, B=8)


def _penzai(policies, prevent_cse, stack):
    import dataclasses

    from penzai import pz
    from penzai.models.transformer import model_parts
    from penzai.models.transformer.variants import llamalike_common as ll

    d = PZ
    cfg = ll.LlamalikeTransformerConfig(
        num_kv_heads=d["KV"], query_head_multiplier=1, embedding_dim=d["D"], projection_dim=d["P"],
        mlp_hidden_dim=d["F"], num_decoder_blocks=d["L"], vocab_size=d["V"], mlp_variant="geglu_approx",
        tie_embedder_and_logits=True, final_logit_softcap=30.0, parameter_dtype=bf, activation_dtype=bf,
        use_layer_stack=stack)

    @pz.pytree_dataclass
    class Remat(pz.nn.Layer):  # a block called under jax.checkpoint, written by hand
        sublayer: pz.nn.Layer
        policy: str = dataclasses.field(metadata={"pytree_node": False})
        cse: bool = dataclasses.field(metadata={"pytree_node": False})

        def __call__(self, x, **side):
            return jax.checkpoint(lambda layer, x, side: layer(x, **side), policy=_policy(self.policy),
                                  prevent_cse=self.cse)(self.sublayer, x, side)

    pols = iter(policies if policies is not None else [None] * d["L"])
    slotted = pz.select(ll.build_llamalike_transformer(cfg, init_base_rng=None)).at_instances_of(
        model_parts.TransformerBlock).apply(lambda b: b if (pol := next(pols)) is None else Remat(b, pol, prevent_cse))
    params = jax.eval_shape(lambda: pz.unbind_params(
        ll.build_llamalike_transformer(cfg, init_base_rng=jax.random.key(0)), freeze=True)[1])

    def loss(params, tokens):
        model = pz.bind_variables(slotted, params)
        logits = model(pz.nx.wrap(tokens).tag("batch", "seq")).unwrap("batch", "seq", "vocabulary")
        return _xent(logits, tokens)

    desc = (f"penzai Gemma-like decoder ({'LayerStack' if stack else 'blocks unrolled'}): {d['L']} layers, d_model "
            f"{d['D']}, {d['KV']} heads of {d['P']}, GeGLU d_ff {d['F']}, seq {d['S']}, batch {d['B']}, bf16")
    return loss, (params, sd((d["B"], d["S"]), jnp.int32)), desc, d["L"]


def penzai(policies=None, prevent_cse=True):
    return _penzai(policies, prevent_cse, stack=False)


def penzai_scan(policies=None, prevent_cse=True):
    return _penzai(policies, prevent_cse, stack=True)


# -- scans over layers as flax nnx and equinox code writes them ---------------------------------
SCANS = dict(L=12, D=2048, H=16, F=8192, V=32000, S=1024, B=8)


def _scan_desc(lib: str, how: str) -> str:
    d = SCANS
    return (f"{lib} decoder ({how}): {d['L']} layers, d_model {d['D']}, d_ff {d['F']}, seq {d['S']}, "
            f"batch {d['B']}, bf16")


def nnx_scan(policies=None, prevent_cse=True):
    from flax import nnx
    d = SCANS
    pol = (policies or [None])[0]

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1 = nnx.RMSNorm(d["D"], dtype=bf, param_dtype=bf, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(d["H"], d["D"], dtype=bf, param_dtype=bf, decode=False, use_bias=False, rngs=rngs)
            self.ln2 = nnx.RMSNorm(d["D"], dtype=bf, param_dtype=bf, rngs=rngs)
            self.up = nnx.Linear(d["D"], d["F"], use_bias=False, dtype=bf, param_dtype=bf, rngs=rngs)
            self.down = nnx.Linear(d["F"], d["D"], use_bias=False, dtype=bf, param_dtype=bf, rngs=rngs)

        def __call__(self, h):
            mask = nnx.make_causal_mask(jnp.ones(h.shape[:2], jnp.int32))
            h = h + self.attn(self.ln1(h), mask=mask)
            return h + self.down(nnx.gelu(self.up(self.ln2(h))))

    class Decoder(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(d["V"], d["D"], dtype=bf, param_dtype=bf, rngs=rngs)

            @nnx.split_rngs(splits=d["L"])
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make(rngs):
                return Block(rngs)
            self.blocks = make(rngs)
            self.ln = nnx.RMSNorm(d["D"], dtype=bf, param_dtype=bf, rngs=rngs)
            self.head = nnx.Linear(d["D"], d["V"], use_bias=False, dtype=bf, param_dtype=bf, rngs=rngs)

    gdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(nnx.Rngs(0))))

    def loss(params, tokens):
        m = nnx.merge(gdef, params)
        h = m.embed(tokens)

        def step(h, blk):
            return blk(h)
        if pol is not None:
            step = nnx.remat(step, policy=_policy(pol), prevent_cse=prevent_cse)

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(h, blk):
            return step(h, blk)
        h = run(h, m.blocks)
        return _xent(m.head(m.ln(h)), tokens)
    return loss, (params, sd((d["B"], d["S"]), jnp.int32)), _scan_desc("flax nnx", "nnx.scan + nnx.remat"), d["L"]


def equinox_scan(policies=None, prevent_cse=True):
    import equinox as eqx
    d = SCANS
    pol = (policies or [None])[0]

    Block = equinox_block(d, eqx.nn.RMSNorm)  # the unrolled `equinox` model's block, RMSNorm

    class Decoder(eqx.Module):
        embed: eqx.nn.Embedding
        blocks: Block
        ln: eqx.nn.RMSNorm
        head: eqx.nn.Linear

        def __init__(self, key):
            k0, k1, k2 = jax.random.split(key, 3)
            self.embed = eqx.nn.Embedding(d["V"], d["D"], dtype=bf, key=k0)
            self.blocks = eqx.filter_vmap(Block)(jax.random.split(k2, d["L"]))
            self.ln = eqx.nn.RMSNorm(d["D"], dtype=bf)
            self.head = eqx.nn.Linear(d["D"], d["V"], use_bias=False, dtype=bf, key=k1)

    abstract = eqx.filter_eval_shape(Decoder, jax.random.key(0))
    params, static = eqx.partition(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct))

    def loss(params, tokens):
        m = eqx.combine(params, static)
        h = jax.vmap(jax.vmap(m.embed))(tokens)
        dyn, st = eqx.partition(m.blocks, eqx.is_array)

        def step(h, blk):
            b = eqx.combine(blk, st)
            return jax.vmap(b)(h), None
        if pol is not None:
            step = eqx.filter_checkpoint(step, policy=_policy(pol), prevent_cse=prevent_cse)
        h, _ = jax.lax.scan(step, h, dyn)
        return _xent(jax.vmap(jax.vmap(lambda v: m.head(m.ln(v))))(h), tokens)
    return loss, (params, sd((d["B"], d["S"]), jnp.int32)), _scan_desc("equinox", "eqx.filter_vmap-stacked layers, lax.scan + eqx.filter_checkpoint"), d["L"]


# -- a Mamba-2-style state-space decoder: a scan over chunks inside every layer -------------------
SSD = dict(L=16, D=2048, E=4096, H=32, N=128, T=128, K=4, V=32000, S=2048, B=4)


def _rms(x):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)).astype(bf)


def _ssd_mixer(h, p):
    """Mamba-2's SSD mixer as JAX code writes it (the chunked "minimal" algorithm): in and out
    projections, a causal depthwise conv, per-head scalar decay; within a chunk of T steps the
    recurrence is a masked matmul, across chunks a `lax.scan` carries the [B, H, P, N] state."""
    d = SSD
    B, S, _ = h.shape
    E, H, N, T = d["E"], d["H"], d["N"], d["T"]
    P, nc = E // H, S // T
    z, xbc, dt = jnp.split(_rms(h) @ p["w_in"], [E, 2 * E + 2 * N], -1)
    pad = jnp.pad(xbc, ((0, 0), (d["K"] - 1, 0), (0, 0)))
    xbc = jax.nn.silu(sum(pad[:, k:k + S] * p["conv"][k] for k in range(d["K"])))
    xs, Bm, Cm = jnp.split(xbc, [E, E + N], -1)
    dt = jax.nn.softplus(dt.astype(jnp.float32) + p["dt_bias"])  # [B, S, H]
    cs = jnp.cumsum((-jnp.exp(p["A_log"]) * dt).reshape(B, nc, T, H), 2)  # log decay, cumulative in a chunk
    X = (xs.reshape(B, nc, T, H, P) * dt.reshape(B, nc, T, H, 1)).astype(bf)
    Bc, Cc = Bm.reshape(B, nc, T, N), Cm.reshape(B, nc, T, N)
    i = jnp.arange(T)
    seg = jnp.where((i[:, None] >= i[None, :])[None, None, :, :, None],
                    cs[:, :, :, None, :] - cs[:, :, None, :, :], -jnp.inf)  # [B, nc, T, T, H]
    M = (jnp.einsum("bcin,bcjn->bcij", Cc, Bc)[..., None] * jnp.exp(seg)).astype(bf)
    y_diag = jnp.einsum("bcijh,bcjhp->bcihp", M, X)
    to_end = jnp.exp(cs[:, :, -1:, :] - cs).astype(bf)  # [B, nc, T, H]
    states = jnp.einsum("bcjn,bcjh,bcjhp->bchpn", Bc, to_end, X)  # each chunk's own state

    def step(state, c):
        st, decay, C, cum = c
        y = jnp.einsum("bin,bhpn->bihp", C, state.astype(bf)) * jnp.exp(cum)[..., None].astype(bf)
        return state * decay[:, :, None, None] + st.astype(jnp.float32), y
    carry = jnp.zeros((B, H, P, N), jnp.float32)
    _, y_off = jax.lax.scan(step, carry, (states.swapaxes(0, 1), jnp.exp(cs[:, :, -1, :]).swapaxes(0, 1),
                                          Cc.swapaxes(0, 1), cs.swapaxes(0, 1)))
    y = (y_diag + y_off.swapaxes(0, 1)).reshape(B, S, E) + xs * p["D_skip"]
    return h + _rms(y * jax.nn.silu(z)) @ p["w_out"]


def _ssd_params(d):
    E, N, H = d["E"], d["N"], d["H"]
    return dict(w_in=sd((d["D"], 2 * E + 2 * N + H), bf), conv=sd((d["K"], E + 2 * N), bf),
                dt_bias=sd((H,), jnp.float32), A_log=sd((H,), jnp.float32), D_skip=sd((E,), bf),
                w_out=sd((E, d["D"]), bf))


def _ssd_desc(how: str) -> str:
    d = SSD
    return (f"Mamba-2-style SSD decoder ({how}; a lax.scan over {d['S'] // d['T']} chunks of {d['T']} in each "
            f"layer): {d['L']} layers, d_model {d['D']}, d_inner {d['E']}, {d['H']} heads, state {d['N']}, "
            f"seq {d['S']}, batch {d['B']}, bf16")


def ssd(policies=None, prevent_cse=True):
    d = SSD
    params = {"embed": sd((d["V"], d["D"]), bf), "layers": [_ssd_params(d) for _ in range(d["L"])],
              "head": sd((d["D"], d["V"]), bf)}
    pols = list(policies) if policies is not None else [None] * d["L"]

    def loss(params, tokens):
        h = params["embed"][tokens]
        for p, pol in zip(params["layers"], pols):
            h = _wrap(_ssd_mixer, pol, prevent_cse)(h, p)
        return _xent(_rms(h) @ params["head"], tokens)
    return loss, (params, sd((d["B"], d["S"]), jnp.int32)), _ssd_desc("layers unrolled"), d["L"]


def ssd_scan(policies=None, prevent_cse=True):
    d = SSD
    stacked = jax.tree.map(lambda s: sd((d["L"], *s.shape), s.dtype), _ssd_params(d))
    params = {"embed": sd((d["V"], d["D"]), bf), "layers": stacked, "head": sd((d["D"], d["V"]), bf)}
    pol = (policies or [None])[0]

    def loss(params, tokens):
        body = _wrap(lambda h, p: (_ssd_mixer(h, p), None), pol, prevent_cse)
        h, _ = jax.lax.scan(body, params["embed"][tokens], params["layers"])
        return _xent(_rms(h) @ params["head"], tokens)
    return loss, (params, sd((d["B"], d["S"]), jnp.int32)), _ssd_desc("scan over layers"), d["L"]


# -- a decoder whose attention is a custom_vjp that recomputes its probabilities ------------------
FA = dict(L=12, D=2048, H=16, F=8192, V=32000, S=2048, B=4)


@jax.custom_vjp
def _attention(q, k, v):
    """Causal attention over [B, S, H, d] as memory-efficient JAX code writes it: the forward keeps
    q, k, v, the output and the log-sum-exp, and the backward recomputes the probabilities."""
    return _attention_fwd(q, k, v)[0]


def _attention_fwd(q, k, v):
    S, d = q.shape[1], q.shape[-1]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(float(d))
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
    lse = jax.nn.logsumexp(s, -1, keepdims=True)
    o = jnp.einsum("bhqk,bkhd->bqhd", jnp.exp(s - lse).astype(q.dtype), v)
    return o, (q, k, v, o, lse)


def _attention_bwd(res, do):
    q, k, v, o, lse = res
    S, d = q.shape[1], q.shape[-1]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(float(d))
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
    p = jnp.exp(s - lse)
    dv = jnp.einsum("bhqk,bqhd->bkhd", p.astype(do.dtype), do)
    dp = jnp.einsum("bqhd,bkhd->bhqk", do, v).astype(jnp.float32)
    delta = jnp.einsum("bqhd,bqhd->bhq", do.astype(jnp.float32), o.astype(jnp.float32))[..., None]
    ds = (p * (dp - delta) / jnp.sqrt(float(d))).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", ds, k), jnp.einsum("bhqk,bqhd->bkhd", ds, q), dv


_attention.defvjp(_attention_fwd, _attention_bwd)


def _attention_layer(d: dict, lead: tuple = ()) -> dict:
    D = d["D"]
    layer = {k: sd((*lead, D, D), bf) for k in ("wq", "wk", "wv", "wo")}
    layer.update(w1=sd((*lead, D, d["F"]), bf), w2=sd((*lead, d["F"], D), bf))
    return layer


def _attention_block(attention, H: int):
    """A decoder layer that calls `attention(q, k, v)` on [B, S, H, d]."""
    def block(h, p):
        B, S, D = h.shape
        x = _ln(h)
        q, k, v = ((x @ p[w]).reshape(B, S, H, D // H) for w in ("wq", "wk", "wv"))
        h = h + attention(q, k, v).reshape(B, S, D) @ p["wo"]
        return h + jax.nn.gelu(_ln(h) @ p["w1"]) @ p["w2"]
    return block


def _attention_desc(what: str, d: dict) -> str:
    return f"decoder {what}: {d['L']} layers, d_model {d['D']}, d_ff {d['F']}, seq {d['S']}, batch {d['B']}, bf16"


def _attention_decoder(attention, what: str, d: dict, policies, prevent_cse):
    """A decoder whose layers call `attention(q, k, v)` on [B, S, H, d] (`vjp_attention`,
    `inner_checkpoint`), as `_unseen`'s builders return it."""
    params = {"embed": sd((d["V"], d["D"]), bf), "layers": [_attention_layer(d) for _ in range(d["L"])],
              "head": sd((d["D"], d["V"]), bf)}
    pols = list(policies) if policies is not None else [None] * d["L"]
    return (_decoder_loss(_attention_block(attention, d["H"]), pols, prevent_cse),
            (params, sd((d["B"], d["S"]), jnp.int32)), _attention_desc(what, d), d["L"])


def vjp_attention(policies=None, prevent_cse=True):
    return _attention_decoder(_attention, "with a custom_vjp attention that recomputes its probabilities", FA,
                              policies, prevent_cse)


# -- a decoder whose author already checkpoints the attention core ------------------------------
CK = dict(L=12, D=2048, H=16, F=8192, V=32000, S=2048, B=4)
_CK_WHAT = "whose attention core its author wrapped in jax.checkpoint"


@jax.checkpoint  # the author's own: the S x S scores recomputed in the backward pass
def _checkpointed_core(q, k, v):
    S = q.shape[1]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.asarray(q.shape[-1], bf))
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, jnp.asarray(-1e4, bf))
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s.astype(jnp.float32), -1).astype(bf), v)


def inner_checkpoint(policies=None, prevent_cse=True):
    return _attention_decoder(_checkpointed_core, _CK_WHAT, CK, policies, prevent_cse)


def inner_checkpoint_scan(policies=None, prevent_cse=True):
    """`inner_checkpoint`'s layers stacked and run by `lax.scan`: the author's checkpoint is inside
    the scan's body."""
    d = CK
    params = {"embed": sd((d["V"], d["D"]), bf), "layers": _attention_layer(d, (d["L"],)),
              "head": sd((d["D"], d["V"]), bf)}
    pol = (policies or [None])[0]
    block = _attention_block(_checkpointed_core, d["H"])

    def loss(params, tokens):
        body = _wrap(lambda h, p: (block(h, p), None), pol, prevent_cse)
        h, _ = jax.lax.scan(body, params["embed"][tokens], params["layers"])
        return _xent(_ln(h) @ params["head"], tokens)
    return (loss, (params, sd((d["B"], d["S"]), jnp.int32)), _attention_desc(_CK_WHAT + " (scan over layers)", d),
            d["L"])


# -- mixed precision: float32 master weights, each layer computing in bfloat16 -------------------
MIXED = dict(L=12, D=2048, H=16, F=5632, V=32000, S=2048, B=4)


def _mixed_params(layers) -> dict:
    """float32 master weights: the embedding, `layers` (one layer's shapes -> its structs), the head."""
    d = MIXED
    f32 = jnp.float32
    return {"embed": sd((d["V"], d["D"]), f32), "layers": layers, "ln_f": sd((d["D"],), f32),
            "head": sd((d["D"], d["V"]), f32)}


def _mixed_layer(h, p):
    """A Llama layer casting its float32 weights to bfloat16 inside, as a layer with dtype=bfloat16 does."""
    from realscale import llama_layer
    return llama_layer(h, jax.tree.map(lambda w: w.astype(bf), p), MIXED["H"])


def _mixed_head(h, params, tokens):
    from realscale import rms
    return _xent(rms(h, params["ln_f"].astype(bf)) @ params["head"].astype(bf), tokens)


def mixed(policies=None, prevent_cse=True):
    from realscale import _llama_shapes
    d = MIXED
    one = {k: sd(s, jnp.float32) for k, s in _llama_shapes(d["D"], d["F"]).items()}
    params = _mixed_params([dict(one) for _ in range(d["L"])])
    pols = list(policies) if policies is not None else [None] * d["L"]

    def loss(params, tokens):
        h = params["embed"].astype(bf)[tokens]
        for p, pol in zip(params["layers"], pols):
            h = _wrap(_mixed_layer, pol, prevent_cse)(h, p)
        return _mixed_head(h, params, tokens)
    return loss, (params, sd((d["B"], d["S"]), jnp.int32)), _mixed_desc("layers unrolled"), d["L"]


def mixed_scan(policies=None, prevent_cse=True):
    from realscale import _llama_shapes
    d = MIXED
    params = _mixed_params({k: sd((d["L"], *s), jnp.float32) for k, s in _llama_shapes(d["D"], d["F"]).items()})
    body = _wrap(lambda h, p: (_mixed_layer(h, p), None), (policies or [None])[0], prevent_cse)

    def loss(params, tokens):
        h, _ = jax.lax.scan(body, params["embed"].astype(bf)[tokens], params["layers"])
        return _mixed_head(h, params, tokens)
    return loss, (params, sd((d["B"], d["S"]), jnp.int32)), _mixed_desc("scan over layers"), d["L"]


def _mixed_desc(how: str) -> str:
    d = MIXED
    return (f"Llama-style decoder in mixed precision (float32 weights, bfloat16 compute; {how}): {d['L']} "
            f"layers, d_model {d['D']}, d_ff {d['F']}, seq {d['S']}, batch {d['B']}")


# -- a GPT-2-style decoder trained with dropout: masks from a typed key split per layer --------
DR = dict(L=12, D=2048, H=16, F=8192, V=32000, S=1024, B=8, rate=0.1)


def _dropout(x, key):
    keep = jax.random.bernoulli(key, 1 - DR["rate"], x.shape)
    return jnp.where(keep, x / (1 - DR["rate"]), jnp.zeros((), x.dtype)).astype(x.dtype)


def _dropout_layer(h, p, key):
    """A GPT-2 layer (LayerNorm, causal attention, GELU MLP) with dropout on the attention
    probabilities and on both residual branches."""
    k_att, k_out, k_mlp = jax.random.split(key, 3)
    x = _ln(h)
    h = h + _dropout(_attn(x, x, p, DR["H"], True, lambda a: _dropout(a, k_att)), k_out)
    return h + _dropout(jax.nn.gelu(_ln(h) @ p["w1"]) @ p["w2"], k_mlp)


def _dropout_args(layers, d=DR) -> tuple:
    params = {"embed": sd((d["V"], d["D"]), bf), "pos": sd((d["S"], d["D"]), bf), "layers": layers,
              "head": sd((d["D"], d["V"]), bf)}
    return params, sd((d["B"], d["S"]), jnp.int32), jax.eval_shape(lambda: jax.random.key(0))


def _dropout_shapes(d=DR) -> dict:
    D, F = d["D"], d["F"]
    return {"wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D), "w1": (D, F), "w2": (F, D)}


def dropout(policies=None, prevent_cse=True):
    d = DR
    args = _dropout_args([{k: sd(s, bf) for k, s in _dropout_shapes().items()} for _ in range(d["L"])])
    pols = list(policies) if policies is not None else [None] * d["L"]

    def loss(params, tokens, key):
        h = params["embed"][tokens] + params["pos"]
        for p, pol, k in zip(params["layers"], pols, jax.random.split(key, d["L"])):
            h = _wrap(_dropout_layer, pol, prevent_cse)(h, p, k)
        return _xent(_ln(h) @ params["head"], tokens)
    return loss, args, _dropout_desc("layers unrolled"), d["L"]


def dropout_scan(policies=None, prevent_cse=True):
    d = DR
    args = _dropout_args({k: sd((d["L"], *s), bf) for k, s in _dropout_shapes().items()})
    body = _wrap(lambda h, pk: (_dropout_layer(h, *pk), None), (policies or [None])[0], prevent_cse)

    def loss(params, tokens, key):
        h = params["embed"][tokens] + params["pos"]
        h, _ = jax.lax.scan(body, h, (params["layers"], jax.random.split(key, d["L"])))
        return _xent(_ln(h) @ params["head"], tokens)
    return loss, args, _dropout_desc("scan over layers"), d["L"]


def _dropout_desc(how: str) -> str:
    d = DR
    return (f"GPT-2-style decoder trained with dropout {d['rate']} (typed PRNG key; {how}): {d['L']} layers, "
            f"d_model {d['D']}, d_ff {d['F']}, seq {d['S']}, batch {d['B']}, bf16")


# -- a GPT-2-style decoder trained with stochastic depth: each layer runs or is skipped -------
SDEPTH = dict(L=12, D=2048, H=16, F=8192, V=32000, S=1024, B=8, drop=0.2)


def _survival() -> list[float]:
    """Each layer's chance to run: from 1 down to 1 - drop at the last layer, linearly (Huang et
    al.'s rule)."""
    d = SDEPTH
    return [1 - d["drop"] * (i + 1) / d["L"] for i in range(d["L"])]


def _sdepth_layer(h, p, key, survive):
    """A GPT-2 layer (LayerNorm, causal attention, GELU MLP) that runs with probability `survive`
    (`lax.cond` on one Bernoulli draw from `key`), its branches scaled by 1 / `survive`, and is
    the identity otherwise."""
    def run(h):
        x = _ln(h)
        h = h + (_attn(x, x, p, SDEPTH["H"], True) / survive).astype(bf)
        return h + (jax.nn.gelu(_ln(h) @ p["w1"]) @ p["w2"] / survive).astype(bf)
    return jax.lax.cond(jax.random.bernoulli(key, survive), run, lambda h: h, h)


def sdepth(policies=None, prevent_cse=True):
    d = SDEPTH
    args = _dropout_args([{k: sd(s, bf) for k, s in _dropout_shapes(d).items()} for _ in range(d["L"])], d)
    pols = list(policies) if policies is not None else [None] * d["L"]

    def loss(params, tokens, key):
        h = params["embed"][tokens] + params["pos"]
        for p, pol, k, s in zip(params["layers"], pols, jax.random.split(key, d["L"]), _survival()):
            h = _wrap(functools.partial(_sdepth_layer, survive=s), pol, prevent_cse)(h, p, k)
        return _xent(_ln(h) @ params["head"], tokens)
    return loss, args, _sdepth_desc("layers unrolled"), d["L"]


def sdepth_scan(policies=None, prevent_cse=True):
    d = SDEPTH
    args = _dropout_args({k: sd((d["L"], *s), bf) for k, s in _dropout_shapes(d).items()}, d)
    body = _wrap(lambda h, pks: (_sdepth_layer(h, *pks), None), (policies or [None])[0], prevent_cse)

    def loss(params, tokens, key):
        h = params["embed"][tokens] + params["pos"]
        xs = (params["layers"], jax.random.split(key, d["L"]), jnp.asarray(_survival(), jnp.float32))
        h, _ = jax.lax.scan(body, h, xs)
        return _xent(_ln(h) @ params["head"], tokens)
    return loss, args, _sdepth_desc("scan over layers"), d["L"]


def _sdepth_desc(how: str) -> str:
    d = SDEPTH
    return (f"GPT-2-style decoder trained with stochastic depth (each layer skipped on one Bernoulli draw, "
            f"`lax.cond`, up to {d['drop']} at the last; {how}): {d['L']} layers, d_model {d['D']}, d_ff {d['F']}, "
            f"seq {d['S']}, batch {d['B']}, bf16")


def scale_batches(k: int) -> None:
    """Every model's batch times `k` (as `realscale.scale_batches`): each size table's ("B" or
    "batch"), found by name, so a family added later is scaled too (a list by hand had left out
    LoRA's, the shared-weight decoder's and the LSTM's)."""
    for d in [v for n, v in globals().items() if n.isupper() and isinstance(v, dict)]:
        for key in ("B", "batch"):
            if key in d:
                d[key] *= k


# -- LoRA fine-tuning: frozen base weights, low-rank adapters the only differentiated argument --
LORA = dict(L=16, D=2048, H=16, F=5632, V=32000, S=2048, B=4, r=16)
_LORA_TARGETS = {"wq": ("D", "D"), "wk": ("D", "D"), "wv": ("D", "D"), "wo": ("D", "D"),
                 "wg": ("D", "F"), "wu": ("D", "F"), "wd": ("F", "D")}


def _lora_linear(x, w, ad):
    """`x @ w` with a frozen `w` plus the adapter's low-rank update `(x @ a) @ b`."""
    return x @ w + (x @ ad["a"]) @ ad["b"]


def _lora_layer(h, ad, base):
    """A Llama layer (RMSNorm, causal attention, SwiGLU) whose seven projections are frozen base
    weights (`base`) with LoRA adapters (`ad`, differentiated) on each."""
    def proj(y, name):
        return _lora_linear(y, base[name], ad[name])
    x = _rms(h)
    h = h + _attn(x, x, base, LORA["H"], True, proj=proj)
    x = _rms(h)
    return h + proj(jax.nn.silu(proj(x, "wg")) * proj(x, "wu"), "wd")


def _lora_shapes(lead: tuple = ()) -> tuple[dict, dict]:
    """(adapters, base weights) of one layer, each array led by `lead` (a scan's layer axis)."""
    d = LORA
    ad = {w: {"a": sd((*lead, d[i], d["r"]), bf), "b": sd((*lead, d["r"], d[o]), bf)}
          for w, (i, o) in _LORA_TARGETS.items()}
    return ad, {w: sd((*lead, d[i], d[o]), bf) for w, (i, o) in _LORA_TARGETS.items()}


def _lora_args(layers: list | tuple) -> tuple:
    """(adapters, frozen base, tokens): `layers` is each layer's (adapters, base), or one stacked pair."""
    d = LORA
    ads, bases = ([la[0] for la in layers], [la[1] for la in layers]) if isinstance(layers, list) else layers
    base = {"embed": sd((d["V"], d["D"]), bf), "layers": bases, "head": sd((d["D"], d["V"]), bf)}
    return ads, base, sd((d["B"], d["S"]), jnp.int32)


def lora(policies=None, prevent_cse=True):
    d = LORA
    pols = list(policies) if policies is not None else [None] * d["L"]

    def loss(adapters, base, tokens):
        h = base["embed"][tokens]
        for ad, b, pol in zip(adapters, base["layers"], pols):
            h = _wrap(_lora_layer, pol, prevent_cse)(h, ad, b)
        return _xent(_rms(h) @ base["head"], tokens)
    return loss, _lora_args([_lora_shapes() for _ in range(d["L"])]), _lora_desc("layers unrolled"), d["L"]


def lora_scan(policies=None, prevent_cse=True):
    d = LORA
    body = _wrap(lambda h, ab: (_lora_layer(h, *ab), None), (policies or [None])[0], prevent_cse)

    def loss(adapters, base, tokens):
        h, _ = jax.lax.scan(body, base["embed"][tokens], (adapters, base["layers"]))
        return _xent(_rms(h) @ base["head"], tokens)
    return loss, _lora_args(_lora_shapes((d["L"],))), _lora_desc("scan over layers"), d["L"]


def _lora_desc(how: str) -> str:
    d = LORA
    return (f"Llama-style decoder fine-tuned with LoRA (rank {d['r']} on all seven projections; the base weights "
            f"a frozen, undifferentiated argument; {how}): {d['L']} layers, d_model {d['D']}, d_ff {d['F']}, "
            f"seq {d['S']}, batch {d['B']}, bf16")


# -- one layer's weights shared by every layer (ALBERT, looped transformers) -------------------
SHARED = dict(L=12, D=2048, H=16, F=8192, V=32000, S=1024, B=8)


def _shared_args() -> tuple:
    d = SHARED
    params = {"embed": sd((d["V"], d["D"]), bf), "pos": sd((d["S"], d["D"]), bf),
              "layer": {k: sd(s, bf) for k, s in _dropout_shapes(d).items()}, "head": sd((d["D"], d["V"]), bf)}
    return params, sd((d["B"], d["S"]), jnp.int32)


def _gpt_layer(h, p):
    """A GPT-2 layer (LayerNorm, causal attention, GELU MLP), no dropout."""
    x = _ln(h)
    h = h + _attn(x, x, p, SHARED["H"], True)
    return h + jax.nn.gelu(_ln(h) @ p["w1"]) @ p["w2"]


def shared(policies=None, prevent_cse=True):
    d = SHARED
    pols = list(policies) if policies is not None else [None] * d["L"]

    def loss(params, tokens):
        h = params["embed"][tokens] + params["pos"]
        for pol in pols:
            h = _wrap(_gpt_layer, pol, prevent_cse)(h, params["layer"])
        return _xent(_ln(h) @ params["head"], tokens)
    return loss, _shared_args(), _shared_desc("layers unrolled, each a call with the same weights"), d["L"]


def shared_scan(policies=None, prevent_cse=True):
    d = SHARED

    def loss(params, tokens):
        body = _wrap(lambda h, _: (_gpt_layer(h, params["layer"]), None), (policies or [None])[0], prevent_cse)
        h, _ = jax.lax.scan(body, params["embed"][tokens] + params["pos"], None, length=d["L"])
        return _xent(_ln(h) @ params["head"], tokens)
    return loss, _shared_args(), _shared_desc("a scan over layers closing over the weights"), d["L"]


def _shared_desc(how: str) -> str:
    d = SHARED
    return (f"GPT-2-style decoder whose {d['L']} layers share one layer's weights, as ALBERT's do ({how}): "
            f"d_model {d['D']}, d_ff {d['F']}, seq {d['S']}, batch {d['B']}, bf16")


# -- a stacked LSTM: every layer a scan over time ----------------------------------------------
LSTM = dict(L=4, D=2048, V=8192, S=1024, B=32)


def _lstm_cell(u, pol, cse):
    """One LSTM step on the carry (h bf16, c float32) and the step's input projection `x` (the
    input's matmul done for every step at once before the scan), under the hand-written policy:
    recurrent networks are checkpointed per step, as flax's `nn.remat` of a cell does."""
    def cell(carry, x):
        h, c = carry
        i, f, g, o = jnp.split((x + h @ u).astype(jnp.float32), 4, -1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = (jax.nn.sigmoid(o) * jnp.tanh(c)).astype(bf)
        return (h, c), h
    return _wrap(cell, pol, cse)


def _lstm_layer(h, p, pol, cse):
    B, S, D = h.shape
    xs = (_ln(h) @ p["w"] + p["b"]).swapaxes(0, 1)  # [S, B, 4D]
    init = (jnp.zeros((B, D), bf), jnp.zeros((B, D), jnp.float32))
    _, ys = jax.lax.scan(_lstm_cell(p["u"], pol, cse), init, xs)
    return h + ys.swapaxes(0, 1)


def _lstm_params(lead: tuple = ()) -> tuple:
    d, D = LSTM, LSTM["D"]
    layer = {"w": sd((*lead, D, 4 * D), bf), "u": sd((*lead, D, 4 * D), bf), "b": sd((*lead, 4 * D), bf)}
    params = {"embed": sd((d["V"], D), bf), "layers": layer if lead else [dict(layer) for _ in range(d["L"])],
              "head": sd((D, d["V"]), bf)}
    return params, sd((d["B"], d["S"]), jnp.int32)


def lstm(policies=None, prevent_cse=True):
    pols = list(policies) if policies is not None else [None] * LSTM["L"]

    def loss(params, tokens):
        h = params["embed"][tokens]
        for p, pol in zip(params["layers"], pols):
            h = _lstm_layer(h, p, pol, prevent_cse)
        return _xent(_ln(h) @ params["head"], tokens)
    return loss, _lstm_params(), _lstm_desc("unrolled"), LSTM["L"]


def lstm_scan(policies=None, prevent_cse=True):
    pol = (policies or [None])[0]

    def loss(params, tokens):
        h, _ = jax.lax.scan(lambda h, p: (_lstm_layer(h, p, pol, prevent_cse), None),
                            params["embed"][tokens], params["layers"])
        return _xent(_ln(h) @ params["head"], tokens)
    return loss, _lstm_params((LSTM["L"],)), _lstm_desc("in a scan over layers: a scan in a scan"), LSTM["L"]


def _lstm_desc(how: str) -> str:
    d = LSTM
    return (f"stacked LSTM language model, {d['L']} layers ({how}), each a scan over {d['S']} steps "
            f"(residual, LayerNorm; the cell state in float32), the hand-written policies on each "
            f"layer's cell: hidden {d['D']}, batch {d['B']}, bf16")


# -- a graph network: message passing over edges, gathers in and scatter-adds out ---------------
GNN = dict(L=12, D=512, F=512, N=16384, E=131072, B=2, IN=16, EIN=4, OUT=3)


def _gnn_mlp(x, w1, w2):
    """MeshGraphNet's MLP: Linear, SiLU, Linear, LayerNorm."""
    return _ln(jax.nn.silu(x @ w1) @ w2)


def _gnn_layer(x, e, p, senders, receivers):
    """One message-passing step on a batch of graphs (x [B, N, D] nodes, e [B, E, D] edges): each
    edge's MLP on (edge, sender, receiver), gathered from the nodes, then each node's MLP on
    (node, the sum of its incoming edges), scattered onto the nodes; both residual."""
    n = x.shape[1]
    gather = jax.vmap(lambda v, i: v[i])
    e = e + _gnn_mlp(jnp.concatenate([e, gather(x, senders), gather(x, receivers)], -1), p["e1"], p["e2"])
    agg = jax.vmap(lambda m, r: jax.ops.segment_sum(m, r, num_segments=n))(e, receivers)
    return x + _gnn_mlp(jnp.concatenate([x, agg], -1), p["n1"], p["n2"]), e


def _gnn_args(lead: tuple = ()) -> tuple:
    """(params, graphs): the graphs' input features, senders and receivers and node targets,
    not differentiated."""
    d, D, F = GNN, GNN["D"], GNN["F"]
    layer = {"e1": sd((*lead, 3 * D, F), bf), "e2": sd((*lead, F, D), bf),
             "n1": sd((*lead, 2 * D, F), bf), "n2": sd((*lead, F, D), bf)}
    params = {"enc_n": sd((d["IN"], D), bf), "enc_e": sd((d["EIN"], D), bf), "dec": sd((D, d["OUT"]), bf),
              "layers": layer if lead else [dict(layer) for _ in range(d["L"])]}
    idx = sd((d["B"], d["E"]), jnp.int32)
    graphs = {"nodes": sd((d["B"], d["N"], d["IN"]), bf), "edges": sd((d["B"], d["E"], d["EIN"]), bf),
              "senders": idx, "receivers": idx, "targets": sd((d["B"], d["N"], d["OUT"]), bf)}
    return params, graphs


def _gnn_loss(params, graphs, run_layers):
    x, e = _ln(graphs["nodes"] @ params["enc_n"]), _ln(graphs["edges"] @ params["enc_e"])
    x, e = run_layers(x, e)
    err = (x @ params["dec"]).astype(jnp.float32) - graphs["targets"].astype(jnp.float32)
    return jnp.mean(err ** 2)


def gnn(policies=None, prevent_cse=True):
    pols = list(policies) if policies is not None else [None] * GNN["L"]

    def loss(params, graphs):
        def run(x, e):
            for p, pol in zip(params["layers"], pols):
                x, e = _wrap(_gnn_layer, pol, prevent_cse)(x, e, p, graphs["senders"], graphs["receivers"])
            return x, e
        return _gnn_loss(params, graphs, run)
    return loss, _gnn_args(), _gnn_desc("layers unrolled"), GNN["L"]


def gnn_scan(policies=None, prevent_cse=True):
    pol = (policies or [None])[0]

    def loss(params, graphs):
        def body(xe, p):
            return _gnn_layer(*xe, p, graphs["senders"], graphs["receivers"]), None

        def run(x, e):
            return jax.lax.scan(_wrap(body, pol, prevent_cse), (x, e), params["layers"])[0]
        return _gnn_loss(params, graphs, run)
    return loss, _gnn_args((GNN["L"],)), _gnn_desc("scan over layers"), GNN["L"]


def _gnn_desc(how: str) -> str:
    d = GNN
    return (f"MeshGraphNet-style graph network ({d['L']} message-passing layers, {how}; each edge's MLP on "
            f"its gathered sender and receiver, each node's on the scatter-added sum of its edges): latent "
            f"{d['D']}, MLP {d['F']}, {d['N']} nodes and {d['E']} edges a graph, batch {d['B']}, bf16")


# -- a Griffin-style hybrid: RG-LRU recurrences by associative scan, local attention -----------
GRIFFIN = dict(G=4, D=2048, R=2048, H=8, HD=256, F=6144, W=1024, K=4, V=32000, S=2048, B=4)


def _rglru(x, p):
    """Griffin's Real-Gated Linear Recurrent Unit on [B, S, R]: input and recurrence gates from
    block-diagonal per-head weights (einsums with a head batch dimension), the recurrence
    h_t = a_t h_{t-1} + sqrt(1 - a_t^2) (i_t x_t) in float32 by `lax.associative_scan` over time."""
    d = GRIFFIN
    B, S, R = x.shape
    xh = x.reshape(B, S, d["H"], R // d["H"])

    def gate(w):
        return jax.nn.sigmoid(jnp.einsum("bshi,hij->bshj", xh, w).reshape(B, S, R).astype(jnp.float32))
    log_a = -8.0 * gate(p["gate_a"]) * jax.nn.softplus(p["a_param"])
    u = x.astype(jnp.float32) * gate(p["gate_x"]) * jnp.sqrt(1 - jnp.exp(2 * log_a))

    def combine(l, r):
        return l[0] * r[0], r[0] * l[1] + r[1]
    _, h = jax.lax.associative_scan(combine, (jnp.exp(log_a), u), axis=1)
    return h.astype(bf)


def _griffin_mlp(h, p):
    x = _rms(h)
    return h + (jax.nn.gelu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def _griffin_recurrent(h, p):
    """A recurrent residual block (a GeLU branch times the conv-then-RG-LRU branch), then the MLP."""
    d, S = GRIFFIN, h.shape[1]
    x = _rms(h)
    y = jax.nn.gelu(x @ p["w_y"])
    pad = jnp.pad(x @ p["w_x"], ((0, 0), (d["K"] - 1, 0), (0, 0)))
    c = sum(pad[:, k:k + S] * p["conv"][k] for k in range(d["K"])) + p["conv_b"]
    return _griffin_mlp(h + (_rglru(c, p) * y) @ p["w_o"], p)


def _griffin_attention(h, p):
    """A local (sliding-window) multi-query attention block, then the MLP."""
    d = GRIFFIN
    B, S, D = h.shape
    x = _rms(h)
    q = (x @ p["wq"]).reshape(B, S, D // d["HD"], d["HD"])
    k, v = x @ p["wk"], x @ p["wv"]  # one key/value head
    s = jnp.einsum("bqhd,bkd->bhqk", q, k) / jnp.sqrt(jnp.asarray(d["HD"], bf))
    i = jnp.arange(S)
    near = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < d["W"])
    s = jnp.where(near, s, jnp.asarray(-1e4, bf))
    o = jnp.einsum("bhqk,bkd->bqhd", jax.nn.softmax(s.astype(jnp.float32), -1).astype(bf), v)
    return _griffin_mlp(h + o.reshape(B, S, D) @ p["wo"], p)


def _griffin_params(kind: str, lead: tuple = ()) -> dict:
    d = GRIFFIN
    D, R, F, Hd = d["D"], d["R"], d["F"], d["R"] // d["H"]
    out = {"w_gate": (D, F), "w_up": (D, F), "w_down": (F, D)}
    if kind == "attention":
        out.update(wq=(D, D), wk=(D, d["HD"]), wv=(D, d["HD"]), wo=(D, D))
    else:
        out.update(w_y=(D, R), w_x=(D, R), conv=(d["K"], R), conv_b=(R,), gate_x=(d["H"], Hd, Hd),
                   gate_a=(d["H"], Hd, Hd), w_o=(R, D))
    params = {k: sd((*lead, *s), bf) for k, s in out.items()}
    if kind != "attention":
        params["a_param"] = sd((*lead, R), jnp.float32)
    return params


_GRIFFIN_GROUP = (("rec1", _griffin_recurrent), ("rec2", _griffin_recurrent), ("attn", _griffin_attention))


def _griffin_args(lead: tuple = ()) -> tuple:
    """(params, tokens); the layers as (recurrent, recurrent, attention) groups, a list of each
    layer's weights or, with `lead`, one stacked group."""
    d = GRIFFIN
    group = lambda: {k: _griffin_params("attention" if k == "attn" else "recurrent", lead) for k, _ in _GRIFFIN_GROUP}
    layers = group() if lead else [group()[k] for _ in range(d["G"]) for k, _ in _GRIFFIN_GROUP]
    params = {"embed": sd((d["V"], d["D"]), bf), "layers": layers, "head": sd((d["D"], d["V"]), bf)}
    return params, sd((d["B"], d["S"]), jnp.int32)


def griffin(policies=None, prevent_cse=True):
    n = 3 * GRIFFIN["G"]
    pols = list(policies) if policies is not None else [None] * n
    blocks = [fn for _ in range(GRIFFIN["G"]) for _, fn in _GRIFFIN_GROUP]

    def loss(params, tokens):
        h = params["embed"][tokens]
        for block, p, pol in zip(blocks, params["layers"], pols):
            h = _wrap(block, pol, prevent_cse)(h, p)
        return _xent(_rms(h) @ params["head"], tokens)
    return loss, _griffin_args(), _griffin_desc(f"{n} layers unrolled"), n


def griffin_scan(policies=None, prevent_cse=True):
    pol = (policies or [None])[0]

    def group(h, p):
        for k, fn in _GRIFFIN_GROUP:
            h = fn(h, p[k])
        return h, None

    def loss(params, tokens):
        h, _ = jax.lax.scan(_wrap(group, pol, prevent_cse), params["embed"][tokens], params["layers"])
        return _xent(_rms(h) @ params["head"], tokens)
    return loss, _griffin_args((GRIFFIN["G"],)), _griffin_desc("a scan over the groups"), GRIFFIN["G"]


def _griffin_desc(how: str) -> str:
    d = GRIFFIN
    return (f"Griffin-style hybrid ({d['G']} groups of two RG-LRU recurrent blocks and one local "
            f"multi-query attention block, {how}; the recurrence a float32 `lax.associative_scan` over "
            f"time, window {d['W']}): d_model {d['D']}, RG-LRU width {d['R']}, MLP {d['F']}, seq {d['S']}, "
            f"batch {d['B']}, bf16")


# -- the loss chunk by chunk (a checkpointed scan over the sequence); layers in a fori_loop -----
CHUNKED = dict(L=12, D=2048, H=16, F=8192, V=128256, S=2048, B=4, C=8)
FORI = dict(L=12, D=2048, H=16, F=8192, V=50304, S=1024, B=8)


def _chunked_xent(h, head, tokens):
    """The mean cross-entropy of `h @ head` against `tokens`, `CHUNKED["C"]` chunks of the sequence
    at a time: a scan whose body, under the author's `jax.checkpoint`, makes one chunk's logits."""
    B, S, D = h.shape
    C = CHUNKED["C"]
    hc, tc = h.reshape(B, C, S // C, D).swapaxes(0, 1), tokens.reshape(B, C, S // C).swapaxes(0, 1)

    @jax.checkpoint
    def chunk(total, xt):
        x, t = xt
        logits = (_ln(x) @ head).astype(jnp.float32)
        return total - jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits), t[..., None], -1)), None
    total, _ = jax.lax.scan(chunk, jnp.zeros((), jnp.float32), (hc, tc))
    return total / (B * S)


def _gpt_args(d: dict, stacked: bool) -> tuple:
    """(params, tokens) of a GPT-2-style decoder of sizes `d`: its layers' weights a list, or
    stacked along a leading axis."""
    shapes = _dropout_shapes(d)
    layers = ({k: sd((d["L"], *s), bf) for k, s in shapes.items()} if stacked
              else [{k: sd(s, bf) for k, s in shapes.items()} for _ in range(d["L"])])
    params = {"embed": sd((d["V"], d["D"]), bf), "pos": sd((d["S"], d["D"]), bf), "layers": layers,
              "head": sd((d["D"], d["V"]), bf)}
    return params, sd((d["B"], d["S"]), jnp.int32)


def chunked(policies=None, prevent_cse=True):
    d = CHUNKED
    pols = list(policies) if policies is not None else [None] * d["L"]

    def loss(params, tokens):
        h = params["embed"][tokens] + params["pos"]
        for p, pol in zip(params["layers"], pols):
            h = _wrap(_gpt_layer, pol, prevent_cse)(h, p)
        return _chunked_xent(h, params["head"], tokens)
    return loss, _gpt_args(d, False), _chunked_desc("layers unrolled"), d["L"]


def chunked_scan(policies=None, prevent_cse=True):
    d = CHUNKED
    body = _wrap(lambda h, p: (_gpt_layer(h, p), None), (policies or [None])[0], prevent_cse)

    def loss(params, tokens):
        h, _ = jax.lax.scan(body, params["embed"][tokens] + params["pos"], params["layers"])
        return _chunked_xent(h, params["head"], tokens)
    return loss, _gpt_args(d, True), _chunked_desc("a scan over layers"), d["L"]


def _chunked_desc(how: str) -> str:
    d = CHUNKED
    return (f"GPT-2-style decoder whose loss is a checkpointed scan over {d['C']} chunks of the sequence "
            f"({how}): {d['L']} layers, d_model {d['D']}, d_ff {d['F']}, vocab {d['V']}, seq {d['S']}, "
            f"batch {d['B']}, bf16")


def fori_scan(policies=None, prevent_cse=True):
    d = FORI

    def loss(params, tokens):
        def body(i, h):
            return _gpt_layer(h, jax.tree.map(lambda w: w[i], params["layers"]))
        h = jax.lax.fori_loop(0, d["L"], _wrap(body, (policies or [None])[0], prevent_cse),
                              params["embed"][tokens] + params["pos"])
        return _xent(_ln(h) @ params["head"], tokens)
    return loss, _gpt_args(d, True), (
        f"GPT-2-style decoder whose layers run in a lax.fori_loop over stacked weights, each step indexing its "
        f"own: {d['L']} layers, d_model {d['D']}, d_ff {d['F']}, seq {d['S']}, batch {d['B']}, bf16"), d["L"]


BUILDERS = {"moe": moe, "unet": unet, "encdec": encdec, "vit_nnx": vit_nnx, "alternating": alternating,
            "penzai": penzai, "penzai_scan": penzai_scan, "nnx_scan": nnx_scan, "equinox_scan": equinox_scan,
            "ssd": ssd, "ssd_scan": ssd_scan, "vjp_attention": vjp_attention,
            "inner_checkpoint": inner_checkpoint, "inner_checkpoint_scan": inner_checkpoint_scan,
            "mixed": mixed, "mixed_scan": mixed_scan, "dropout": dropout, "dropout_scan": dropout_scan,
            "sdepth": sdepth, "sdepth_scan": sdepth_scan, "lora": lora, "lora_scan": lora_scan,
            "shared": shared, "shared_scan": shared_scan, "lstm": lstm, "lstm_scan": lstm_scan,
            "gnn": gnn, "gnn_scan": gnn_scan, "griffin": griffin, "griffin_scan": griffin_scan,
            "chunked": chunked, "chunked_scan": chunked_scan, "fori_scan": fori_scan}
