"""The Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words") in Hugging Face's layout.

An image is cut into non-overlapping ``patch_size`` x ``patch_size`` patches, each linearly embedded (a conv with
kernel = stride = patch size, with bias); a learned [CLS] token is prepended, learned position embeddings (one per
patch, plus one for [CLS]) are added, and ``n_layers`` pre-LN encoder layers follow:
``x + drop(o_proj(attn(q_proj, k_proj, v_proj of layernorm_before(x))))`` then
``x + drop(fc2(gelu(fc1(layernorm_after(x)))))`` with exact (erf) GELU. A final LayerNorm and a linear classifier on
the [CLS] token give the logits. Numerically this is Hugging Face's ``ViTForImageClassification`` (transformers
5.24, eager attention); ``VIT_SIZES`` holds the standard sizes with HF's parameter counts (ViT-B/16: 86,567,656),
and ``torch_bridge.weights`` converts HF state dicts both ways.

Differences from Hugging Face's module, and why:

- NHWC images ``(B, H, W, C)`` (HF: NCHW ``pixel_values``), the layout of every image model here.
- No ``interpolate_pos_encoding`` (bicubic resizing of the position grid for other resolutions), no masked-image
  ``bool_masked_pos``, no pooler (``ViTForImageClassification`` has none either): the input must be exactly
  ``image_size``; anything else raises ``ValueError``.
- Init as HF's ``_init_weights``: linears and the patch conv normal(0.02), biases 0, LayerNorms 1/0; HF draws the
  [CLS] token and position embeddings from ``trunc_normal_(std=0.02)`` whose bounds are the absolute values +-2,
  i.e. +-100 standard deviations, so a plain normal(0.02) is the same distribution.
- Dropout as HF: ``dropout`` (HF ``hidden_dropout_prob``) on the embeddings and on each residual branch;
  ``attention_dropout`` (HF ``attention_probs_dropout_prob``) on the attention probabilities, which is why
  attention is written out here rather than through ``jax.nn.dot_product_attention`` (that API has no dropout).
  Both default to 0, as in HF's ``ViTConfig``. Random masks come from the one ``key`` given to ``__call__``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.models._keys import split_dropout_keys

INIT_STD = 0.02  # HF ViTConfig.initializer_range


def _normal(std: float = INIT_STD):
    return jax.nn.initializers.normal(stddev=std)


def _layernorm(d: int, eps: float, rngs: nnx.Rngs) -> nnx.LayerNorm:
    # two-pass variance (torch's): with eps 1e-12 nothing hides the cancellation of E[x^2] - E[x]^2
    return nnx.LayerNorm(d, epsilon=eps, use_fast_variance=False, rngs=rngs)


def gelu_erf(x: jax.Array) -> jax.Array:
    """The MLP's activation: exact GELU (HF ``hidden_act="gelu"``), not the tanh approximation."""
    return jax.nn.gelu(x, approximate=False)


class ViTAttention(nnx.Module):
    """Bidirectional multi-head self-attention with separate q/k/v projections (HF ``ViTAttention``): softmax of
    ``q k^T / sqrt(head_dim)`` in float32, dropout on the probabilities, then ``o_proj``."""

    def __init__(self, d_model: int, n_heads: int, attention_dropout: float, qkv_bias: bool, *, rngs: nnx.Rngs):
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        lin = lambda bias: nnx.Linear(d_model, d_model, use_bias=bias, kernel_init=_normal(), rngs=rngs)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = lin(qkv_bias), lin(qkv_bias), lin(qkv_bias), lin(True)
        self.drop = nnx.Dropout(attention_dropout)

    def __call__(self, x: jax.Array, *, train: bool, key: jax.Array | None = None) -> jax.Array:
        b, t, d = x.shape
        heads = lambda y: y.reshape(b, t, self.n_heads, self.head_dim)
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (self.head_dim ** -0.5)
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(q.dtype)
        probs = self.drop(probs, deterministic=not train, rngs=key)
        return self.o_proj(jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, d))


class ViTLayer(nnx.Module):
    """One pre-LN encoder layer (HF ``ViTLayer``; its ``mlp.fc1``/``mlp.fc2`` are ``fc1``/``fc2`` here)."""

    def __init__(self, d_model: int, n_heads: int, mlp_dim: int, dropout: float, attention_dropout: float,
                 eps: float, qkv_bias: bool, *, rngs: nnx.Rngs):
        self.layernorm_before = _layernorm(d_model, eps, rngs)
        self.attention = ViTAttention(d_model, n_heads, attention_dropout, qkv_bias, rngs=rngs)
        self.layernorm_after = _layernorm(d_model, eps, rngs)
        self.fc1 = nnx.Linear(d_model, mlp_dim, kernel_init=_normal(), rngs=rngs)
        self.fc2 = nnx.Linear(mlp_dim, d_model, kernel_init=_normal(), rngs=rngs)
        self.mlp_act = gelu_erf  # static, like GPT's: surgery may read or replace it
        self.drop = nnx.Dropout(dropout)

    def __call__(self, x: jax.Array, *, train: bool, keys: list) -> jax.Array:
        """``keys``: attention-probability dropout, attention-branch dropout, MLP-branch dropout (or Nones)."""
        h = self.attention(self.layernorm_before(x), train=train, key=keys[0])
        x = x + self.drop(h, deterministic=not train, rngs=keys[1])
        h = self.fc2(self.mlp_act(self.fc1(self.layernorm_after(x))))
        return x + self.drop(h, deterministic=not train, rngs=keys[2])


def _pair(value, name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 1 for v in pair):
        raise ValueError(f"ViT: {name} must be a positive int or an (height, width) pair, got {value!r}.")
    return pair


class ViT(nnx.Module):
    """NHWC images ``(B, image_size, image_size, in_channels)`` float -> logits ``(B, num_classes)`` float32.

    ``d_model`` (HF ``hidden_size``), ``n_layers``, ``n_heads``, ``mlp_dim`` (HF ``intermediate_size``);
    ``image_size`` and ``patch_size`` are ints or (height, width) pairs; as in HF, a size that is not a multiple
    of the patch size drops the remainder rows/columns. ``cls_token`` ``(1, 1, d_model)`` and
    ``position_embeddings`` ``(1, 1 + num_patches, d_model)`` have HF's shapes, so weights convert by copying.
    """

    # logical axes of each parameter (jaxcomposer.models.sharding): the patch conv's kernel is HWIO
    PARTITION_RULES = (
        (r"patch_embed/kernel", (None, None, "conv_in", "embed")),
        (r"patch_embed/bias", ("embed",)),
        (r"cls_token", (None, None, "embed")),
        (r"position_embeddings", (None, "positions", "embed")),
        (r".*attention/(q_proj|k_proj|v_proj)/kernel", ("embed", "heads")),
        (r".*attention/(q_proj|k_proj|v_proj)/bias", ("heads",)),
        (r".*attention/o_proj/kernel", ("heads", "embed")),
        (r".*/fc1/kernel", ("embed", "mlp")),
        (r".*/fc1/bias", ("mlp",)),
        (r".*/fc2/kernel", ("mlp", "embed")),
        (r".*(o_proj|fc2|layernorm_before|layernorm_after|layernorm)/(bias|scale)", ("embed",)),
        (r"classifier/kernel", ("embed", "classes")),
        (r"classifier/bias", ("classes",)),
    )

    def __init__(self, image_size: int | tuple[int, int] = 224, patch_size: int | tuple[int, int] = 16,
                 num_classes: int = 1000, d_model: int = 768, n_layers: int = 12, n_heads: int = 12,
                 mlp_dim: int = 3072, in_channels: int = 3, dropout: float = 0.0, attention_dropout: float = 0.0,
                 layer_norm_eps: float = 1e-12, qkv_bias: bool = True, *, rngs: nnx.Rngs):
        self.image_size, self.patch_size = _pair(image_size, "image_size"), _pair(patch_size, "patch_size")
        grid = tuple(i // p for i, p in zip(self.image_size, self.patch_size))
        if min(grid) < 1:
            raise ValueError(f"ViT: patch_size={patch_size!r} is larger than image_size={image_size!r}; expected "
                             "at least one patch.")
        if d_model % n_heads != 0:
            raise ValueError(f"ViT: d_model={d_model} must be divisible by n_heads={n_heads}.")
        for name, rate in (("dropout", dropout), ("attention_dropout", attention_dropout)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"ViT: {name} must be in [0, 1), got {rate}.")
        self.num_patches = grid[0] * grid[1]
        self.num_classes, self.in_channels, self.n_layers = num_classes, in_channels, n_layers
        self.dropout_rate, self.attention_dropout = dropout, attention_dropout
        self.patch_embed = nnx.Conv(in_channels, d_model, self.patch_size, self.patch_size, padding="VALID",
                                    kernel_init=_normal(), rngs=rngs)
        self.cls_token = nnx.Param(_normal()(rngs.params(), (1, 1, d_model)))
        self.position_embeddings = nnx.Param(_normal()(rngs.params(), (1, 1 + self.num_patches, d_model)))
        self.drop = nnx.Dropout(dropout)
        self.layers = nnx.List([ViTLayer(d_model, n_heads, mlp_dim, dropout, attention_dropout, layer_norm_eps,
                                         qkv_bias, rngs=rngs) for _ in range(n_layers)])
        self.layernorm = _layernorm(d_model, layer_norm_eps, rngs)
        self.classifier = nnx.Linear(d_model, num_classes, kernel_init=_normal(), rngs=rngs)

    def __call__(self, x: jax.Array, *, train: bool, key: jax.Array | None = None) -> jax.Array:
        want = (*self.image_size, self.in_channels)
        if x.ndim != 4 or tuple(x.shape[1:]) != want:
            raise ValueError(f"ViT: expected NHWC images (B, {want[0]}, {want[1]}, {want[2]}) (image_size="
                             f"{self.image_size}, in_channels={self.in_channels}), got shape {tuple(x.shape)}.")
        active = train and (self.dropout_rate > 0 or self.attention_dropout > 0)
        keys = split_dropout_keys(key, 1 + 3 * self.n_layers, active=active, where="ViT")
        patches = self.patch_embed(x)
        b, d = x.shape[0], patches.shape[-1]
        cls = jnp.broadcast_to(self.cls_token[...].astype(patches.dtype), (b, 1, d))
        h = jnp.concatenate([cls, patches.reshape(b, self.num_patches, d)], axis=1) + self.position_embeddings[...]
        h = self.drop(h, deterministic=not train, rngs=keys[0])
        for i, layer in enumerate(self.layers):
            h = layer(h, train=train, keys=keys[1 + 3 * i: 4 + 3 * i])
        # the final LayerNorm is per token, so normalizing [CLS] alone equals HF's whole-sequence one
        return self.classifier(self.layernorm(h[:, 0])).astype(jnp.float32)


# name -> (d_model, n_layers, n_heads, mlp_dim, HF ViTForImageClassification's parameter count at 1000 classes);
# all at 224x224 images and 16x16 patches
VIT_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "vit-ti16": (192, 12, 3, 768, 5_717_416),
    "vit-s16": (384, 12, 6, 1536, 22_050_664),
    "vit-b16": (768, 12, 12, 3072, 86_567_656),
    "vit-l16": (1024, 24, 16, 4096, 304_326_632),
}


def vit(size: str = "vit-b16", num_classes: int = 1000, *, rngs: nnx.Rngs | None = None, seed: int = 0,
        **kwargs) -> ViT:
    """A standard ViT (``VIT_SIZES``: ``"vit-ti16"``, ``"vit-s16"``, ``"vit-b16"``, ``"vit-l16"``) at 224x224 with
    16x16 patches, in the shapes of HF's ``ViTForImageClassification``. ``seed`` is used when ``rngs`` is None;
    other keywords go to :class:`ViT` and override the size's (``vit("vit-s16", 10, image_size=28, patch_size=4,
    in_channels=1)`` for Fashion-MNIST)."""
    if size not in VIT_SIZES:
        raise ValueError(f"vit: size must be one of {list(VIT_SIZES)}, got {size!r}; for other shapes build "
                         "ViT(d_model=..., n_layers=..., ...).")
    d_model, n_layers, n_heads, mlp_dim, _ = VIT_SIZES[size]
    return ViT(**{"image_size": 224, "patch_size": 16, "d_model": d_model, "n_layers": n_layers, "n_heads": n_heads,
                  "mlp_dim": mlp_dim, **kwargs}, num_classes=num_classes,
               rngs=rngs if rngs is not None else nnx.Rngs(seed))
