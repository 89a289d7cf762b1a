"""A small byte-level GPT (nanoGPT layout): pre-LN blocks, learned positions, causal attention, tied head.

Attention goes through ``jax.nn.dot_product_attention(..., is_causal=True)`` in (B, T, H, D) layout;
``attention_impl`` is that function's ``implementation``: None (JAX's choice, today its XLA path, which runs
everywhere), ``'xla'``, or ``'cudnn'`` (cuDNN's fused flash attention: NVIDIA GPUs only, fp16/bf16 inputs, i.e.
training with ``precision='amp_bf16'``, head size <= 128; it skips the masked half of causal attention). That API
has no attention-probability dropout, so ``dropout`` applies to the embeddings and to each residual branch output
(nanoGPT's ``resid_dropout``), which is where most of its effect is anyway.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.models._keys import split_dropout_keys

ATTENTION_IMPLS = (None, "xla", "cudnn")  # jax.nn.dot_product_attention's ``implementation`` values


def _normal(std: float):
    return jax.nn.initializers.normal(stddev=std)


def gelu_tanh(x: jax.Array) -> jax.Array:
    """The MLP's activation (GPT-2's ``gelu_new``)."""
    return jax.nn.gelu(x, approximate=True)


class CausalSelfAttention(nnx.Module):
    def __init__(self, d_model: int, n_heads: int, resid_std: float, attention_impl: str | None = None,
                 *, rngs: nnx.Rngs):
        if d_model % n_heads != 0:
            raise ValueError(f"GPT: d_model={d_model} must be divisible by n_heads={n_heads}.")
        self.n_heads, self.attention_impl = n_heads, attention_impl
        self.qkv = nnx.Linear(d_model, 3 * d_model, kernel_init=_normal(0.02), rngs=rngs)
        self.proj = nnx.Linear(d_model, d_model, kernel_init=_normal(resid_std), rngs=rngs)
        # None, or a static function ``t -> bias`` added to the scaled attention logits, broadcastable to
        # (B, n_heads, t, t): the hook ALiBi's surgery (jaxcomposer.algorithms.alibi) sets.
        self.attention_bias = None

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
        shape = (b, t, self.n_heads, d // self.n_heads)
        bias = None if self.attention_bias is None else self.attention_bias(t).astype(q.dtype)
        y = jax.nn.dot_product_attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), bias=bias,
                                         is_causal=True, implementation=self.attention_impl)
        return self.proj(y.reshape(b, t, d))


class Block(nnx.Module):
    """``x + drop(attn(ln1(x)))`` then ``x + drop(fc_proj(mlp_act(fc(ln2(x)))))``."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int, dropout: float, resid_std: float,
                 attention_impl: str | None = None, *, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(d_model, epsilon=1e-5, rngs=rngs)
        self.attn = CausalSelfAttention(d_model, n_heads, resid_std, attention_impl, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d_model, epsilon=1e-5, rngs=rngs)
        self.fc = nnx.Linear(d_model, mlp_ratio * d_model, kernel_init=_normal(0.02), rngs=rngs)
        self.fc_proj = nnx.Linear(mlp_ratio * d_model, d_model, kernel_init=_normal(resid_std), rngs=rngs)
        self.mlp_act = gelu_tanh  # static; GatedLinearUnits reads it as its default act_fn and replaces it
        self.drop = nnx.Dropout(dropout)

    def __call__(self, x: jax.Array, *, train: bool, keys: list) -> jax.Array:
        x = x + self.drop(self.attn(self.ln1(x)), deterministic=not train, rngs=keys[0])
        h = self.fc_proj(self.mlp_act(self.fc(self.ln2(x))))
        return x + self.drop(h, deterministic=not train, rngs=keys[1])


class GPT(nnx.Module):
    """Tokens ``(B, T)`` int with ``T <= seq_len`` -> logits ``(B, T, vocab_size)`` float32.

    Init follows nanoGPT: every weight normal(0.02), biases zero, and the two residual projections per block
    scaled by ``1/sqrt(2 * n_layers)`` so the residual stream's variance does not grow with depth.
    """

    # logical axes of each parameter (jaxcomposer.models.sharding); "heads" is the fused head * head-size width
    PARTITION_RULES = (
        (r"wte/embedding", ("vocab", "embed")),
        (r"wpe/embedding", ("positions", "embed")),
        (r".*attn/qkv/kernel", ("embed", "heads")),
        (r".*attn/qkv/bias", ("heads",)),
        (r".*attn/proj/kernel", ("heads", "embed")),
        (r".*/fc/kernel", ("embed", "mlp")),
        (r".*/fc/bias", ("mlp",)),
        (r".*/fc_proj/kernel", ("mlp", "embed")),
        (r"lm_head/kernel", ("embed", "vocab")),
        (r".*(ln1|ln2|ln_f|proj|fc_proj)/(scale|bias)", ("embed",)),
    )

    def __init__(self, vocab_size: int = 256, seq_len: int = 128, d_model: int = 128, n_layers: int = 4,
                 n_heads: int = 4, mlp_ratio: int = 4, dropout: float = 0.0, tie_embeddings: bool = True,
                 attention_impl: str | None = None, *, rngs: nnx.Rngs):
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"GPT: dropout must be in [0, 1), got {dropout}.")
        if attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"GPT: attention_impl must be one of {ATTENTION_IMPLS}, got {attention_impl!r}.")
        self.vocab_size, self.seq_len, self.n_layers = vocab_size, seq_len, n_layers
        self.dropout_rate = dropout
        resid_std = 0.02 / math.sqrt(2 * n_layers)
        self.wte = nnx.Embed(vocab_size, d_model, embedding_init=_normal(0.02), rngs=rngs)
        self.wpe = nnx.Embed(seq_len, d_model, embedding_init=_normal(0.02), rngs=rngs)
        self.drop = nnx.Dropout(dropout)
        self.blocks = nnx.List([Block(d_model, n_heads, mlp_ratio, dropout, resid_std, attention_impl, rngs=rngs)
                                for _ in range(n_layers)])
        self.ln_f = nnx.LayerNorm(d_model, epsilon=1e-5, rngs=rngs)
        self.lm_head = None if tie_embeddings else nnx.Linear(
            d_model, vocab_size, use_bias=False, kernel_init=_normal(0.02), rngs=rngs)

    def __call__(self, tokens: jax.Array, *, train: bool, key: jax.Array | None = None) -> jax.Array:
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"GPT: expected int tokens (B, T), got {tokens.dtype} {tokens.shape}.")
        b, t = tokens.shape
        if t > self.seq_len:
            raise ValueError(f"GPT: sequence length {t} exceeds seq_len={self.seq_len}.")
        keys = split_dropout_keys(key, 1 + 2 * self.n_layers, active=train and self.dropout_rate > 0, where="GPT")
        x = self.wte(tokens) + self.wpe(jnp.arange(t))[None]
        x = self.drop(x, deterministic=not train, rngs=keys[0])
        for i, block in enumerate(self.blocks):
            x = block(x, train=train, keys=keys[1 + 2 * i: 3 + 2 * i])
        x = self.ln_f(x)
        logits = self.wte.attend(x) if self.lm_head is None else self.lm_head(x)
        return logits.astype(jnp.float32)


# Hugging Face's GPT-2 shapes: name -> (d_model, n_layers, n_heads, parameter count with tied embeddings)
GPT2_SIZES: dict[str, tuple[int, int, int, int]] = {
    "gpt2": (768, 12, 12, 124_439_808),
    "gpt2-medium": (1024, 24, 16, 354_823_168),
    "gpt2-large": (1280, 36, 20, 774_030_080),
    "gpt2-xl": (1600, 48, 25, 1_557_611_200),
}
GPT2_VOCAB, GPT2_CONTEXT = 50257, 1024


def gpt2(size: str = "gpt2", *, rngs: nnx.Rngs | None = None, seed: int = 0, **kwargs) -> GPT:
    """GPT-2 (Radford et al. 2019) in the shapes of Hugging Face's ``GPT2LMHeadModel``: ``gpt2()`` is the 124M
    model, ``gpt2("gpt2-medium")`` the 355M one (``GPT2_SIZES``). Byte-pair vocabulary of 50,257, 1,024
    positions, tied LM head, pre-LN blocks with GELU (tanh); ``torch_bridge.weights`` reads and writes Hugging
    Face's state dicts. Other keywords go to :class:`GPT` (``seq_len=256`` for shorter training contexts keeps
    the first 256 position rows when loading weights only if you slice them yourself; dropout, attention_impl).

    Differences from Hugging Face's module: no dropout on the attention probabilities (see :class:`GPT`), and
    attention through ``jax.nn.dot_product_attention``.
    """
    if size not in GPT2_SIZES:
        raise ValueError(f"gpt2: size must be one of {list(GPT2_SIZES)}, got {size!r}.")
    d_model, n_layers, n_heads, _ = GPT2_SIZES[size]
    return GPT(**{"vocab_size": GPT2_VOCAB, "seq_len": GPT2_CONTEXT, "d_model": d_model, "n_layers": n_layers,
                  "n_heads": n_heads, **kwargs}, rngs=rngs if rngs is not None else nnx.Rngs(seed))
