"""Real-scale models written with third-party libraries' own layer code (issue 14), for
`benchmarks/realscale.py`.  autoremat never saw them while it was written.

Each builder takes (policies, prevent_cse): per layer a JAX policy name or None, applied by
hand with the library's own remat wrapper (`nn.remat`, `hk.remat`, `eqx.filter_checkpoint`);
a scan's body takes the first entry.  It returns (loss, abstract args, description, layers).
Parameters are abstract (`jax.eval_shape` of the library's init) in bf16.

* `flax_scan`: flax linen decoder (`nn.RMSNorm`, `nn.MultiHeadDotProductAttention` with a
  causal mask, `nn.Dense`, GELU) stacked by `nn.scan`, MaxText's way.
* `haiku_scan`: haiku decoder (`hk.LayerNorm`, `hk.MultiHeadAttention`, `hk.Linear`) stacked
  by `hk.layer_stack`.
* `equinox`: equinox decoder (`eqx.nn.LayerNorm`, `eqx.nn.MultiheadAttention`, `eqx.nn.Linear`,
  vmapped over batch and sequence as equinox code is), layers unrolled in a Python loop.
* `resnet_flax`: ResNet-50 in flax linen (bottleneck blocks [3, 4, 6, 3], `nn.GroupNorm`),
  224 x 224 images; one "layer" per bottleneck block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

bf = jnp.bfloat16
sd = jax.ShapeDtypeStruct
# Decoder sizes shared by the three libraries: layers, d_model, heads, d_ff, vocab, seq, batch.
DEC = dict(L=12, D=2048, H=16, F=8192, V=32000, S=1024, B=8)


def _policy(pol):
    return None if pol is None else getattr(jax.checkpoint_policies, pol)


def _xent(logits, tokens):
    logits = logits.astype(jnp.float32)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1))


def _bf16(tree):
    return jax.tree.map(lambda s: sd(s.shape, bf) if jnp.issubdtype(s.dtype, jnp.floating) else s, tree)


def _dec_desc(lib: str, how: str) -> str:
    d = DEC
    n = d["L"] * (4 * d["D"] ** 2 + 2 * d["D"] * d["F"]) + 2 * d["V"] * d["D"]
    return (f"{lib} decoder ({how}): {d['L']} layers, d_model {d['D']}, d_ff {d['F']}, seq {d['S']}, "
            f"batch {d['B']}, bf16, {n / 1e9:.2f}B parameters")


# -- flax linen, nn.scan ------------------------------------------------------------------------
def flax_scan(policies=None, prevent_cse: bool = True):
    import flax.linen as nn

    d = DEC
    pol = _policy((policies or [None])[0])

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            x = nn.RMSNorm(dtype=bf, param_dtype=bf)(h)
            mask = nn.make_causal_mask(jnp.ones(h.shape[:2], jnp.int32))
            h = h + nn.MultiHeadDotProductAttention(d["H"], dtype=bf, param_dtype=bf, use_bias=False)(x, mask=mask)
            x = nn.RMSNorm(dtype=bf, param_dtype=bf)(h)
            y = nn.gelu(nn.Dense(d["F"], use_bias=False, dtype=bf, param_dtype=bf)(x))
            return h + nn.Dense(d["D"], use_bias=False, dtype=bf, param_dtype=bf)(y), None

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            h = nn.Embed(d["V"], d["D"], dtype=bf, param_dtype=bf)(tokens)
            block = Block if pol is None else nn.remat(Block, policy=pol, prevent_cse=prevent_cse)
            h, _ = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                           length=d["L"])()(h, None)
            h = nn.RMSNorm(dtype=bf, param_dtype=bf)(h)
            return _xent(nn.Dense(d["V"], use_bias=False, dtype=bf, param_dtype=bf)(h), tokens)

    tokens = sd((d["B"], d["S"]), jnp.int32)
    model = Decoder()
    params = jax.eval_shape(model.init, jax.random.key(0), tokens)

    def loss(params, tokens):
        return model.apply(params, tokens)

    return loss, (params, tokens), _dec_desc("flax linen", "nn.scan over layers"), d["L"]


# -- haiku, hk.layer_stack ----------------------------------------------------------------------
def haiku_scan(policies=None, prevent_cse: bool = True):
    import haiku as hk

    d = DEC
    pol = _policy((policies or [None])[0])

    def block(h):
        x = hk.LayerNorm(-1, True, True)(h)
        mask = jnp.tril(jnp.ones((1, 1, d["S"], d["S"]), bool))
        mha = hk.MultiHeadAttention(d["H"], d["D"] // d["H"], w_init=hk.initializers.VarianceScaling(1.0),
                                    with_bias=False, model_size=d["D"])
        h = h + mha(x, x, x, mask=mask)
        x = hk.LayerNorm(-1, True, True)(h)
        return h + hk.Linear(d["D"], with_bias=False)(jax.nn.gelu(hk.Linear(d["F"], with_bias=False)(x)))

    def forward(tokens):
        h = hk.Embed(d["V"], d["D"])(tokens)
        body = block if pol is None else hk.remat(block, policy=pol, prevent_cse=prevent_cse)
        h = hk.layer_stack(d["L"])(body)(h)
        return _xent(hk.Linear(d["V"], with_bias=False)(hk.LayerNorm(-1, True, True)(h)), tokens)

    t = hk.without_apply_rng(hk.transform(forward))
    tokens = sd((d["B"], d["S"]), jnp.int32)
    params = _bf16(jax.eval_shape(t.init, jax.random.key(0), tokens))

    def loss(params, tokens):
        return t.apply(params, tokens)

    return loss, (params, tokens), _dec_desc("haiku", "hk.layer_stack over layers"), d["L"]


# -- equinox, unrolled --------------------------------------------------------------------------
def equinox_block(d: dict, norm=None):
    """An equinox decoder block class of sizes `d` (`norm`: the norm layer, default LayerNorm),
    called on one sequence [S, D]; `_unseen.equinox_scan` stacks it."""
    import equinox as eqx

    norm = norm or eqx.nn.LayerNorm

    class Block(eqx.Module):
        ln1: eqx.Module
        attn: eqx.nn.MultiheadAttention
        ln2: eqx.Module
        up: eqx.nn.Linear
        down: eqx.nn.Linear

        def __init__(self, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.ln1, self.ln2 = norm(d["D"], dtype=bf), norm(d["D"], dtype=bf)
            self.attn = eqx.nn.MultiheadAttention(d["H"], d["D"], dtype=bf, key=k1)
            self.up = eqx.nn.Linear(d["D"], d["F"], use_bias=False, dtype=bf, key=k2)
            self.down = eqx.nn.Linear(d["F"], d["D"], use_bias=False, dtype=bf, key=k3)

        def __call__(self, h):  # one sequence, [S, D]
            x = jax.vmap(self.ln1)(h)
            h = h + self.attn(x, x, x, mask=jnp.tril(jnp.ones((d["S"], d["S"]), bool)))
            x = jax.vmap(self.ln2)(h)
            return h + jax.vmap(lambda v: self.down(jax.nn.gelu(self.up(v))))(x)

    return Block


def equinox(policies=None, prevent_cse: bool = True):
    import equinox as eqx

    d = DEC
    Block = equinox_block(d)

    class Decoder(eqx.Module):
        embed: eqx.nn.Embedding
        blocks: list
        ln: eqx.nn.LayerNorm
        head: eqx.nn.Linear

        def __init__(self, key):
            ks = jax.random.split(key, d["L"] + 2)
            self.embed = eqx.nn.Embedding(d["V"], d["D"], dtype=bf, key=ks[0])
            self.blocks = [Block(k) for k in ks[2:]]
            self.ln = eqx.nn.LayerNorm(d["D"], dtype=bf)
            self.head = eqx.nn.Linear(d["D"], d["V"], use_bias=False, dtype=bf, key=ks[1])

    pols = list(policies) if policies is not None else [None] * d["L"]
    abstract = eqx.filter_eval_shape(Decoder, jax.random.key(0))
    params, static = eqx.partition(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct))

    def loss(params, tokens):
        m = eqx.combine(params, static)
        h = jax.vmap(jax.vmap(m.embed))(tokens)
        for blk, pol in zip(m.blocks, pols):
            run = jax.vmap(lambda b, h: b(h), in_axes=(None, 0))
            if pol is not None:
                run = eqx.filter_checkpoint(run, policy=_policy(pol), prevent_cse=prevent_cse)
            h = run(blk, h)
        return _xent(jax.vmap(jax.vmap(lambda v: m.head(m.ln(v))))(h), tokens)

    tokens = sd((d["B"], d["S"]), jnp.int32)
    return loss, (params, tokens), _dec_desc("equinox", "layers unrolled"), d["L"]


# -- ResNet-50, flax linen ----------------------------------------------------------------------
RESNET = dict(stages=(3, 4, 6, 3), width=64, image=224, batch=64, classes=1000)


def resnet_flax(policies=None, prevent_cse: bool = True):
    import flax.linen as nn

    r = RESNET
    n_blocks = sum(r["stages"])
    pols = list(policies) if policies is not None else [None] * n_blocks

    class Bottleneck(nn.Module):
        features: int
        stride: int

        @nn.compact
        def __call__(self, x):
            conv = lambda f, k, s=1: nn.Conv(f, (k, k), (s, s), padding="SAME", use_bias=False, dtype=bf,
                                            param_dtype=bf)
            norm = lambda: nn.GroupNorm(32, dtype=bf, param_dtype=bf)
            y = nn.relu(norm()(conv(self.features, 1)(x)))
            y = nn.relu(norm()(conv(self.features, 3, self.stride)(y)))
            y = norm()(conv(4 * self.features, 1)(y))
            if x.shape[-1] != y.shape[-1] or self.stride != 1:
                x = norm()(conv(4 * self.features, 1, self.stride)(x))
            return nn.relu(x + y)

    class ResNet(nn.Module):
        @nn.compact
        def __call__(self, images, labels):
            x = nn.Conv(r["width"], (7, 7), (2, 2), padding="SAME", use_bias=False, dtype=bf, param_dtype=bf)(images)
            x = nn.max_pool(nn.relu(nn.GroupNorm(32, dtype=bf, param_dtype=bf)(x)), (3, 3), (2, 2), "SAME")
            k = 0
            for i, n in enumerate(r["stages"]):
                for j in range(n):
                    cls = Bottleneck if pols[k] is None else nn.remat(Bottleneck, policy=_policy(pols[k]),
                                                                      prevent_cse=prevent_cse)
                    x = cls(r["width"] * 2 ** i, 2 if (j == 0 and i > 0) else 1)(x)
                    k += 1
            logits = nn.Dense(r["classes"], dtype=bf, param_dtype=bf)(jnp.mean(x, (1, 2)))
            return _xent(logits, labels)

    images = sd((r["batch"], r["image"], r["image"], 3), bf)
    labels = sd((r["batch"],), jnp.int32)
    model = ResNet()
    params = jax.eval_shape(model.init, jax.random.key(0), images, labels)

    def loss(params, images, labels):
        return model.apply(params, images, labels)

    desc = (f"ResNet-50 in flax linen: {n_blocks} bottleneck blocks, GroupNorm, {r['image']}x{r['image']} images, "
            f"batch {r['batch']}, bf16")
    return loss, (params, images, labels), desc, n_blocks


BUILDERS = {"flax_scan": flax_scan, "haiku_scan": haiku_scan, "equinox": equinox, "resnet_flax": resnet_flax}
