"""BERT (Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding", NAACL
2019, arXiv:1810.04805) in the module layout of Hugging Face's ``BertModel`` / ``BertForMaskedLM`` /
``BertForSequenceClassification``, numerically equal to them (eager attention) and convertible both ways by
``torch_bridge.weights`` (the ``hf`` layout).

Structure: embeddings (word + position + token type, LayerNorm, dropout), ``n_layers`` post-LN encoder layers
(separate query/key/value, attention output dense + dropout + residual + LN, intermediate dense + exact erf GELU,
output dense + dropout + residual + LN), an optional pooler (dense + tanh on the first token), and one head:

- ``head="mlm"``: the masked-LM head (dense + GELU + LN, then the decoder tied to the word embeddings plus its own
  bias); logits ``(B, T, vocab)``. No pooler, as ``BertForMaskedLM``.
- ``head="classification"``: pooler, dropout, classifier; logits ``(B, num_labels)``.
- ``head=None``: ``BertModel``: returns ``(sequence_output (B, T, d), pooled_output (B, d))``.

Inputs: ``model(input_ids, *, train, key=None, attention_mask=None, token_type_ids=None)``; ``attention_mask`` as
Hugging Face's (1 = attend, 0 = padding; keys at padding get no attention), ``token_type_ids`` default zeros.
``input_ids`` may also be a mapping with those three entries (what a task's ``model_inputs`` can hand over in one
positional argument). Outputs are float32.

Differences from Hugging Face's modules, each for a reason:

- Attention runs through ``jax.nn.dot_product_attention`` (XLA path, float32 softmax; equal to HF's eager attention
  to float rounding) whenever attention-probability dropout is off (evaluation, or ``attention_dropout=0``). In
  training with ``attention_dropout > 0`` it runs a plain softmax attention with dropout on the probabilities, as HF
  does, because that API has no dropout.
- The word-embedding row of ``pad_token_id`` is zero at init as in HF (``padding_idx``), but it is not frozen:
  torch's ``padding_idx`` also zeroes its gradient. The row only gets a gradient where padding tokens are attended
  to (an attention mask of 1 on them), which BERT's collators never produce.
- No cross-attention, decoder mode, KV cache, ``position_ids`` / ``inputs_embeds`` inputs, or the other heads (NSP,
  token classification, QA): not needed for MLM pretraining and GLUE-style fine-tuning.
- ``BertAttention.attention_bias`` is a hook (None, or a static ``t -> bias`` added to the scaled logits before
  the mask), set by ALiBi (:mod:`jaxcomposer.algorithms.alibi`), which HF's module does not have.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.models._keys import split_dropout_keys

HEADS = ("mlm", "classification", None)


def _normal(std: float = 0.02):
    return jax.nn.initializers.normal(stddev=std)


def gelu_exact(x: jax.Array) -> jax.Array:
    """BERT's activation (HF ``"gelu"``): the exact, erf-based GELU."""
    return jax.nn.gelu(x, approximate=False)


def _dropout(x: jax.Array, rate: float, train: bool, key) -> jax.Array:
    if not train or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array | None, mask: jax.Array | None,
                      dropout: float = 0.0, train: bool = False, key=None) -> jax.Array:
    """HF's eager attention in (B, T, H, D) layout: scaled logits, ``+ bias``, masked keys to the most negative
    float, float32 softmax, dropout on the probabilities, weighted sum of values."""
    logits = jnp.einsum("bthd,bshd->bhts", q, k).astype(jnp.float32) * (q.shape[-1] ** -0.5)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = _dropout(jax.nn.softmax(logits, axis=-1), dropout, train, key).astype(v.dtype)
    return jnp.einsum("bhts,bshd->bthd", probs, v)


class BertEmbeddings(nnx.Module):
    def __init__(self, vocab_size: int, max_positions: int, type_vocab_size: int, d_model: int, eps: float,
                 dropout: float, pad_token_id: int | None, *, rngs: nnx.Rngs):
        self.word_embeddings = nnx.Embed(vocab_size, d_model, embedding_init=_normal(), rngs=rngs)
        if pad_token_id is not None:  # HF's init zeroes the padding row (nn.Embedding padding_idx)
            table = self.word_embeddings.embedding
            table.set_value(table.get_value().at[pad_token_id].set(0.0))
        self.position_embeddings = nnx.Embed(max_positions, d_model, embedding_init=_normal(), rngs=rngs)
        self.token_type_embeddings = nnx.Embed(type_vocab_size, d_model, embedding_init=_normal(), rngs=rngs)
        self.ln = nnx.LayerNorm(d_model, epsilon=eps, rngs=rngs)
        self.drop = nnx.Dropout(dropout)

    def __call__(self, input_ids, token_type_ids, *, train: bool, key) -> jax.Array:
        t = input_ids.shape[1]
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(jnp.arange(t))[None]
        return self.drop(self.ln(x), deterministic=not train, rngs=key)


class BertAttention(nnx.Module):
    """HF's ``BertSelfAttention``: separate query/key/value projections, bidirectional attention."""

    def __init__(self, d_model: int, n_heads: int, attention_dropout: float, *, rngs: nnx.Rngs):
        if d_model % n_heads != 0:
            raise ValueError(f"BERT: d_model={d_model} must be divisible by n_heads={n_heads}.")
        self.n_heads, self.attention_dropout = n_heads, attention_dropout
        self.query = nnx.Linear(d_model, d_model, kernel_init=_normal(), rngs=rngs)
        self.key = nnx.Linear(d_model, d_model, kernel_init=_normal(), rngs=rngs)
        self.value = nnx.Linear(d_model, d_model, kernel_init=_normal(), rngs=rngs)
        # None, or a static function ``t -> bias`` added to the scaled attention logits, broadcastable to
        # (B, n_heads, t, t): the hook ALiBi's surgery (jaxcomposer.algorithms.alibi) sets.
        self.attention_bias = None

    def __call__(self, x: jax.Array, mask: jax.Array | None, *, train: bool, key) -> jax.Array:
        b, t, d = x.shape
        shape = (b, t, self.n_heads, d // self.n_heads)
        q, k, v = (f(x).reshape(shape) for f in (self.query, self.key, self.value))
        bias = None if self.attention_bias is None else self.attention_bias(t).astype(q.dtype)
        if train and self.attention_dropout > 0:
            y = softmax_attention(q, k, v, bias, mask, self.attention_dropout, train, key)
        else:
            y = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask)
        return y.reshape(b, t, d)


class BertOutput(nnx.Module):
    """``LayerNorm(dropout(dense(h)) + residual)``: HF's ``BertSelfOutput`` and ``BertOutput``."""

    def __init__(self, d_in: int, d_model: int, eps: float, dropout: float, *, rngs: nnx.Rngs):
        self.dense = nnx.Linear(d_in, d_model, kernel_init=_normal(), rngs=rngs)
        self.ln = nnx.LayerNorm(d_model, epsilon=eps, rngs=rngs)
        self.drop = nnx.Dropout(dropout)

    def __call__(self, h: jax.Array, residual: jax.Array, *, train: bool, key) -> jax.Array:
        return self.ln(self.drop(self.dense(h), deterministic=not train, rngs=key) + residual)


class BertIntermediate(nnx.Module):
    """``act(dense(x))``; ``act`` is static (GatedLinearUnits reads it as its default ``act_fn``)."""

    def __init__(self, d_model: int, d_ff: int, *, rngs: nnx.Rngs):
        self.dense = nnx.Linear(d_model, d_ff, kernel_init=_normal(), rngs=rngs)
        self.act = gelu_exact

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.act(self.dense(x))


class BertLayer(nnx.Module):
    """Post-LN: ``a = attention_output(attention(x), x)`` then ``output(intermediate(a), a)``."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, eps: float, dropout: float, attention_dropout: float,
                 *, rngs: nnx.Rngs):
        self.attention = BertAttention(d_model, n_heads, attention_dropout, rngs=rngs)
        self.attention_output = BertOutput(d_model, d_model, eps, dropout, rngs=rngs)
        self.intermediate = BertIntermediate(d_model, d_ff, rngs=rngs)
        self.output = BertOutput(d_ff, d_model, eps, dropout, rngs=rngs)

    def __call__(self, x: jax.Array, mask, *, train: bool, keys: list) -> jax.Array:
        a = self.attention_output(self.attention(x, mask, train=train, key=keys[0]), x, train=train, key=keys[1])
        return self.output(self.intermediate(a), a, train=train, key=keys[2])


class BertMLMHead(nnx.Module):
    """HF's ``BertOnlyMLMHead``: ``LN(gelu(transform(x)))`` against the word embeddings, plus ``bias``."""

    def __init__(self, d_model: int, vocab_size: int, eps: float, *, rngs: nnx.Rngs):
        self.transform = nnx.Linear(d_model, d_model, kernel_init=_normal(), rngs=rngs)
        self.ln = nnx.LayerNorm(d_model, epsilon=eps, rngs=rngs)
        self.bias = nnx.Param(jnp.zeros((vocab_size,), jnp.float32))
        self.act = gelu_exact

    def __call__(self, x: jax.Array, word_embeddings: nnx.Embed) -> jax.Array:
        logits = word_embeddings.attend(self.ln(self.act(self.transform(x))))
        return logits + self.bias[...].reshape((1,) * (logits.ndim - 1) + (-1,))


class BERT(nnx.Module):
    """Token ids ``(B, T)`` with ``T <= max_position_embeddings`` -> float32 logits (see the module docstring for
    what each ``head`` returns). Init as HF's ``_init_weights``: linears and embeddings normal(0.02), biases zero,
    LayerNorms one/zero, the padding row of the word embeddings zero."""

    # logical axes of each parameter (jaxcomposer.models.sharding); "heads" is the fused head * head-size width.
    # The gated_layer/non_gated_layer/wo rules cover GatedLinearUnits' BERTGatedFFOutput.
    PARTITION_RULES = (
        (r"embeddings/word_embeddings/embedding", ("vocab", "embed")),
        (r"embeddings/position_embeddings/embedding", ("positions", "embed")),
        (r"embeddings/token_type_embeddings/embedding", (None, "embed")),
        (r".*/attention/(query|key|value)/kernel", ("embed", "heads")),
        (r".*/attention/(query|key|value)/bias", ("heads",)),
        (r".*/attention_output/dense/kernel", ("heads", "embed")),
        (r".*/intermediate/dense/kernel", ("embed", "mlp")),
        (r".*/intermediate/dense/bias", ("mlp",)),
        (r".*/output/dense/kernel", ("mlp", "embed")),
        (r".*/output/(gated_layer|non_gated_layer)/kernel", ("embed", "mlp")),
        (r".*/output/(gated_layer|non_gated_layer)/bias", ("mlp",)),
        (r".*/output/wo/kernel", ("mlp", "embed")),
        (r"(pooler|mlm/transform)/kernel", ("embed", "embed")),
        (r"mlm/bias", ("vocab",)),
        (r"classifier/kernel", ("embed", "classes")),
        (r"classifier/bias", ("classes",)),
        (r".*(ln|layernorm)/(scale|bias)", ("embed",)),
        (r".*(dense|wo|pooler|transform)/bias", ("embed",)),
    )

    def __init__(self, vocab_size: int = 30522, max_position_embeddings: int = 512, type_vocab_size: int = 2,
                 d_model: int = 768, n_layers: int = 12, n_heads: int = 12, d_ff: int = 3072,
                 dropout: float = 0.1, attention_dropout: float = 0.1, layer_norm_eps: float = 1e-12,
                 head: str | None = "mlm", num_labels: int = 2, classifier_dropout: float | None = None,
                 pad_token_id: int | None = 0, *, rngs: nnx.Rngs):
        if head not in HEADS:
            raise ValueError(f"BERT: head must be one of {HEADS}, got {head!r}.")
        for name, rate in (("dropout", dropout), ("attention_dropout", attention_dropout),
                           ("classifier_dropout", dropout if classifier_dropout is None else classifier_dropout)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"BERT: {name} must be in [0, 1), got {rate}.")
        if head == "classification" and (isinstance(num_labels, bool) or int(num_labels) != num_labels
                                         or num_labels < 1):
            raise ValueError(f"BERT: num_labels must be a positive integer, got {num_labels!r}.")
        self.head, self.n_layers = head, n_layers
        self.max_position_embeddings = max_position_embeddings
        self.num_classes = int(num_labels) if head == "classification" else None  # ComposerClassifier reads it
        self.rates = (dropout, attention_dropout, dropout if classifier_dropout is None else classifier_dropout)
        self.embeddings = BertEmbeddings(vocab_size, max_position_embeddings, type_vocab_size, d_model,
                                         layer_norm_eps, dropout, pad_token_id, rngs=rngs)
        self.layers = nnx.List([BertLayer(d_model, n_heads, d_ff, layer_norm_eps, dropout, attention_dropout,
                                          rngs=rngs) for _ in range(n_layers)])
        self.pooler = None if head == "mlm" else nnx.Linear(d_model, d_model, kernel_init=_normal(), rngs=rngs)
        self.mlm = BertMLMHead(d_model, vocab_size, layer_norm_eps, rngs=rngs) if head == "mlm" else None
        self.classifier = nnx.Linear(d_model, int(num_labels), kernel_init=_normal(), rngs=rngs) \
            if head == "classification" else None
        self.classifier_drop = nnx.Dropout(self.rates[2])

    def __call__(self, input_ids: jax.Array | Mapping[str, Any], *, train: bool, key: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, token_type_ids: jax.Array | None = None):
        if isinstance(input_ids, Mapping):
            if attention_mask is not None or token_type_ids is not None:
                raise ValueError("BERT: pass attention_mask/token_type_ids inside the input mapping or as keywords, "
                                 "not both.")
            inputs = input_ids
            input_ids = inputs["input_ids"]
            attention_mask, token_type_ids = inputs.get("attention_mask"), inputs.get("token_type_ids")
        if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
            raise ValueError(f"BERT: expected int input_ids (B, T), got {input_ids.dtype} {input_ids.shape}.")
        b, t = input_ids.shape
        if t > self.max_position_embeddings:
            raise ValueError(f"BERT: sequence length {t} exceeds max_position_embeddings="
                             f"{self.max_position_embeddings}.")
        for name, v in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if v is not None and tuple(v.shape) != (b, t):
                raise ValueError(f"BERT: {name} must have the shape of input_ids {(b, t)}, got {tuple(v.shape)}.")
        if token_type_ids is None:
            token_type_ids = jnp.zeros((b, t), jnp.int32)
        mask = None if attention_mask is None else (attention_mask != 0)[:, None, None, :]  # (B, 1, 1, T) keys
        keys = split_dropout_keys(key, 2 + 3 * self.n_layers, active=train and max(self.rates) > 0, where="BERT")
        x = self.embeddings(input_ids, token_type_ids, train=train, key=keys[0])
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, train=train, keys=keys[1 + 3 * i: 4 + 3 * i])
        if self.head == "mlm":
            return self.mlm(x, self.embeddings.word_embeddings).astype(jnp.float32)
        pooled = jnp.tanh(self.pooler(x[:, 0]))
        if self.head is None:
            return x.astype(jnp.float32), pooled.astype(jnp.float32)
        pooled = self.classifier_drop(pooled, deterministic=not train, rngs=keys[-1])
        return self.classifier(pooled).astype(jnp.float32)


# Hugging Face's BERT shapes: name -> (d_model, n_layers, n_heads, d_ff, {head: parameter count}); the
# classification count is for num_labels=2, the None count is BertModel's (with its pooler).
BERT_SIZES: dict[str, tuple[int, int, int, int, dict[str | None, int]]] = {
    "bert-base-uncased": (768, 12, 12, 3072, {"mlm": 109_514_298, "classification": 109_483_778,
                                              None: 109_482_240}),
    "bert-large-uncased": (1024, 24, 16, 4096, {"mlm": 335_174_458, "classification": 335_143_938,
                                                None: 335_141_888}),
}
BERT_VOCAB, BERT_CONTEXT, BERT_TYPE_VOCAB = 30522, 512, 2


def bert(size: str = "bert-base-uncased", head: str | None = "mlm", num_labels: int = 2, *,
         rngs: nnx.Rngs | None = None, seed: int = 0, **kwargs) -> BERT:
    """BERT in the shapes of Hugging Face's ``bert-base-uncased`` (110M) / ``bert-large-uncased`` (335M)
    (``BERT_SIZES``): WordPiece vocabulary of 30,522, 512 positions, 2 token types, LayerNorm eps 1e-12, dropout
    0.1. ``head``: ``"mlm"`` (``BertForMaskedLM``), ``"classification"`` (``BertForSequenceClassification`` with
    ``num_labels``) or None (``BertModel``). Other keywords go to :class:`BERT` (dropout, attention_dropout, ...).
    ``torch_bridge.weights`` reads and writes Hugging Face's state dicts."""
    if size not in BERT_SIZES:
        raise ValueError(f"bert: size must be one of {list(BERT_SIZES)}, got {size!r}.")
    d_model, n_layers, n_heads, d_ff, _ = BERT_SIZES[size]
    return BERT(**{"vocab_size": BERT_VOCAB, "max_position_embeddings": BERT_CONTEXT,
                   "type_vocab_size": BERT_TYPE_VOCAB, "d_model": d_model, "n_layers": n_layers, "n_heads": n_heads,
                   "d_ff": d_ff, "head": head, "num_labels": num_labels, **kwargs},
                rngs=rngs if rngs is not None else nnx.Rngs(seed))
