"""Alibi.

Method card
-----------
**What it does.** ALiBi (Attention with Linear Biases): learned position embeddings are dropped (zeroed and frozen)
and every attention head ``h`` instead adds ``-m_h * (i - j)`` to the logit of query ``i`` for key ``j``, so nearby
tokens attend more strongly. The slopes ``m_h`` are a geometric sequence, ``2^(-8/n), 2^(-16/n), ...`` for ``n``
heads (Composer's ``get_alibi_head_slopes``; for ``n`` not a power of two, the slopes of the power of two below
``n`` followed by every other slope of twice that power). Because the bias only depends on distance, a model
trained on short sequences evaluates on longer ones (up to ``max_sequence_length``), so training can use shorter
sequences: each training batch ``(B, S)`` is reshaped to ``(B / s, S * s)`` with ``s =
train_sequence_length_scaling`` (same tokens, shorter rows).

**When it helps.** Causal LM pretraining: Composer reports 1.5-1.6x for GPT-2 125M (1.7x with SeqLengthWarmup),
mostly from training at a quarter of the sequence length while evaluating at full length. No effect on models
without attention (it warns).

**Hyperparameters** (Composer's names and defaults). ``max_sequence_length`` (required): the longest sequence the
model accepts afterwards (the zeroed position table gets this many rows; on our GPT, ``seq_len`` becomes it).
``train_sequence_length_scaling=0.25``. Addition: ``sequence_keys=('input_ids', 'attention_mask', 'labels')``, the
batch entries reshaped (those present; SeqLengthWarmup's convention).

**Exact Composer semantics.** As ``composer/algorithms/alibi``: position embeddings are replaced by zeros of shape
``(max_sequence_length, d)`` that are not trained; causal attention (GPT) gets the per-head bias, bidirectional
attention (BERT) ``-m_h * |i - j|``; the bias is added to the scaled logits before the mask and softmax;
``train_sequence_length_scaling == 1`` leaves batches alone. Differences, each for a reason:

- Causal bias: Composer adds ``m_h * j`` (one row for all queries), which equals ``-m_h * (i - j)`` after the
  causal mask because softmax ignores a per-row constant. We add ``-m_h * (i - j)`` directly: the same
  probabilities, without logits that grow with the position (``m_h * j`` reaches thousands at long lengths, where
  bf16 keeps only a few bits of the distance).
- Frozen zero table: on NNX a :class:`FrozenPositionEmbedding` variable (model state, not a ``Param``); on torch a
  persistent buffer named ``weight`` (same ``state_dict`` key), because the bridge trains every ``Parameter``
  whatever its ``requires_grad``.
- The reshape applies to ``sequence_keys`` only (Composer reshapes every dict entry and fails on others). Our
  ``ComposerCausalLM`` reads ``input_ids`` of length ``T + 1`` for ``T`` targets; where ``(T + 1) * s`` is not a
  whole number but ``T * s`` is, each row is cut into ``1/s`` overlapping windows of ``T * s + 1`` tokens (stride
  ``T * s``), so every row trains on ``T * s`` targets as Composer's Hugging Face rows of length ``S * s`` do, and no
  target is lost; entries of length ``T`` (``labels``) are reshaped plainly. Shapes that fit neither raise.
- Torch: HF GPT-2 (``GPT2Model``, ``GPT2Attention``) and our ``torch_bridge.mirrors.TorchGPT`` twin. HF's ``GPT2Attention``
  no longer has Composer's ``_attn`` (transformers 5), so its ``forward`` is replaced by one computing eager
  attention with the bias. HF BERT is not converted yet.
- Native BERT (:class:`jaxcomposer.models.BERT`): as Composer's HF BERT surgery: ``embeddings.position_embeddings``
  zeroed and frozen with ``max_sequence_length`` rows (``max_position_embeddings`` becomes it), and every
  ``BertAttention.attention_bias`` an :class:`AlibiBias` with ``symmetric=True`` (``-m_h * |i - j|``).
- ``optimizers`` is accepted and ignored: our optimizer is built after the ``model`` slot.
- On a torch-sourced task the reshape is refused (``ValueError`` from the ``model`` slot, before anything
  compiles): the bridge exports the model once, for the loader's sequence length. Use
  ``train_sequence_length_scaling=1`` there and shorter sequences from the loader.

**How it plugs in.** ``model`` slot (host, once): the surgery, in place on the user's module (NNX: the GPT's
``CausalSelfAttention.attention_bias`` hook gets an :class:`AlibiBias`; torch: the function torch_bridge registers
as ``"Alibi"``). ``batch`` slot (in jit, training only; evaluation sees full-length batches): the reshape; its
shapes are static, so one compile. Checkpoints of the surgered model need Alibi in the recipe (Composer's
``required_on_load``).

**Reference.** Press, Smith & Lewis, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation", ICLR 2022 (arXiv:2108.12409). Composer: ``composer/algorithms/alibi``.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.nnx_surgery import apply_surgery
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["Alibi", "AlibiBias", "FrozenPositionEmbedding", "alibi_head_slopes", "apply_alibi",
           "scale_sequence_length", "DEFAULT_SEQUENCE_KEYS"]

DEFAULT_SEQUENCE_KEYS = ("input_ids", "attention_mask", "labels")


def alibi_head_slopes(n_heads: int) -> list[float]:
    """Composer's ``_get_alibi_head_slopes``: ``start**(i+1)`` with ``start = 2^(-8/n)`` for ``n`` a power of two;
    otherwise the slopes of the power of two below ``n``, then every other slope of twice that power."""
    if n_heads < 1:
        raise ValueError(f"alibi_head_slopes: n_heads must be positive, got {n_heads}.")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    below = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(below) + alibi_head_slopes(2 * below)[0::2][:n_heads - below]


@dataclasses.dataclass(frozen=True)
class AlibiBias:
    """``t -> (1, n_heads, t, t)`` float32 bias ``-slope_h * (i - j)`` for causal attention (the future half is
    masked by the attention itself), or ``-slope_h * |i - j|`` with ``symmetric=True`` for bidirectional attention
    (BERT). Frozen and compared by value, so it is a static, hashable part of the module's graph
    (``CausalSelfAttention.attention_bias``, ``BertAttention.attention_bias``)."""

    slopes: tuple[float, ...]
    symmetric: bool = False

    def __call__(self, t: int) -> jax.Array:
        pos = jnp.arange(t, dtype=jnp.float32)
        distance = pos[:, None] - pos[None, :]  # query i minus key j
        if self.symmetric:
            distance = jnp.abs(distance)
        return -jnp.asarray(self.slopes, jnp.float32)[None, :, None, None] * distance[None, None]


class FrozenPositionEmbedding(nnx.Variable):
    """The zeroed position table after ALiBi: a variable that is not an ``nnx.Param``, so it is model state
    (never differentiated nor updated by the optimizer): Composer's ``requires_grad = False``."""


def _apply_nnx(model: nnx.Module, max_sequence_length: int, inplace: bool):
    from jaxcomposer.models.bert import BERT, BertAttention  # the native attentions we know
    from jaxcomposer.models.gpt import GPT, CausalSelfAttention

    new = model if inplace else nnx.clone(model)
    count = 0
    for m in [m for _, m in nnx.iter_graph(new)]:  # listed first: the loop edits the graph
        if isinstance(m, GPT):
            d = m.wpe.features
            m.wpe.embedding = FrozenPositionEmbedding(jnp.zeros((max_sequence_length, d), m.wpe.embedding.dtype))
            m.wpe.num_embeddings = max_sequence_length
            m.seq_len = max_sequence_length  # lifts the GPT's length check: positions come from the bias now
        elif isinstance(m, CausalSelfAttention) and not isinstance(m.attention_bias, AlibiBias):
            m.attention_bias = AlibiBias(tuple(alibi_head_slopes(m.n_heads)))
            count += 1
        elif isinstance(m, BERT):
            emb = m.embeddings.position_embeddings
            emb.embedding = FrozenPositionEmbedding(jnp.zeros((max_sequence_length, emb.features),
                                                              emb.embedding.dtype))
            emb.num_embeddings = max_sequence_length
            m.max_position_embeddings = max_sequence_length  # lifts BERT's length check, as for the GPT
        elif isinstance(m, BertAttention) and not isinstance(m.attention_bias, AlibiBias):
            m.attention_bias = AlibiBias(tuple(alibi_head_slopes(m.n_heads)), symmetric=True)
            count += 1
    return new, count


def _check_max_sequence_length(max_sequence_length: Any, where: str) -> int:
    if isinstance(max_sequence_length, bool) or int(max_sequence_length) != max_sequence_length \
            or max_sequence_length < 1:
        raise ValueError(f"{where}: max_sequence_length must be a positive integer (the longest sequence the model "
                         f"will see in training or evaluation), got {max_sequence_length!r}.")
    return int(max_sequence_length)


def apply_alibi(model: Any, max_sequence_length: int, optimizers: Any = None, *, inplace: bool | None = None):
    """Composer's ``apply_alibi(model, max_sequence_length, optimizers=None)``.

    A torch module is edited in place and returned (Composer returns None). A Flax NNX module is cloned and the new
    model returned unless ``inplace=True``. A torch optimizer given as ``optimizers`` holds the new layers'
    parameters afterwards, as in Composer (an NNX model's optimizer is built after the surgery: pass None). Warns
    with :class:`NoEffectWarning` when no attention was converted (Composer logs a warning). As Composer's, this
    does not shorten the training sequences: that is the :func:`Alibi` method's batch reshape.
    """
    max_sequence_length = _check_max_sequence_length(max_sequence_length, "apply_alibi")
    new, count = apply_surgery("Alibi", model, lambda m: _apply_nnx(m, max_sequence_length, bool(inplace)),
                               who="apply_alibi", optimizers=optimizers, max_sequence_length=max_sequence_length)
    if count == 0:
        what = ("no GPT CausalSelfAttention or BERT BertAttention" if isinstance(model, nnx.Module)
                else "no GPT2Attention or TorchCausalSelfAttention")
        warnings.warn(NoEffectWarning(f"Alibi did not change {type(model).__name__}: {what} was found (or ALiBi "
                                      "was applied already)."), stacklevel=2)
    return new


def _is_whole(x: float) -> bool:
    return x >= 1 and abs(x - round(x)) < 1e-9


def _scale_entry(v: jax.Array, scaling: float, key: str) -> jax.Array:
    b, s = v.shape[0], v.shape[1]
    if not _is_whole(b / scaling):
        raise ValueError(f"Alibi: batch[{key!r}] has {b} rows; train_sequence_length_scaling={scaling} needs the "
                         f"batch size divided by it, {b / scaling:g}, to be a whole number.")
    if _is_whole(s * scaling):  # Composer's reshape: (B, S) -> (B / s, S * s)
        return v.reshape((round(b / scaling), round(s * scaling)) + v.shape[2:])
    if _is_whole((s - 1) * scaling):  # next-token layout (T + 1 tokens for T targets): overlapping windows
        length = round((s - 1) * scaling)
        windows = [jax.lax.slice_in_dim(v, i * length, (i + 1) * length + 1, axis=1)
                   for i in range((s - 1) // length)]
        return jnp.stack(windows, axis=1).reshape((b * len(windows), length + 1) + v.shape[2:])
    raise ValueError(f"Alibi: batch[{key!r}] has sequence length {s}; train_sequence_length_scaling={scaling} "
                     f"needs {s} * {scaling} (or, for inputs one token longer than their targets, {s - 1} * "
                     f"{scaling}) to be a whole number. Choose a scaling that divides the sequence length.")


def scale_sequence_length(batch: Mapping[str, Any], train_sequence_length_scaling: float,
                          sequence_keys: Sequence[str] = DEFAULT_SEQUENCE_KEYS) -> dict:
    """Alibi's training-batch reshape: each present ``sequence_keys`` entry ``(B, S, ...)`` becomes ``(B / s, S *
    s, ...)`` (see the method card for inputs one token longer than their targets); other entries are kept."""
    out = dict(batch)
    if train_sequence_length_scaling == 1:
        return out
    for key in sequence_keys:
        if key in out and getattr(out[key], "ndim", 0) >= 2:
            out[key] = _scale_entry(out[key], float(train_sequence_length_scaling), key)
    return out


def Alibi(max_sequence_length: int, train_sequence_length_scaling: float = 0.25, *,
          sequence_keys: Sequence[str] = DEFAULT_SEQUENCE_KEYS) -> Method:
    """Composer's ``Alibi(max_sequence_length, train_sequence_length_scaling=0.25)`` as a :class:`Method`
    (``model`` slot: the surgery, in place; ``batch`` slot: the training reshape)."""
    max_sequence_length = _check_max_sequence_length(max_sequence_length, "Alibi")
    if isinstance(train_sequence_length_scaling, bool) or not isinstance(train_sequence_length_scaling,
                                                                         (int, float)) \
            or not train_sequence_length_scaling > 0:
        raise ValueError(f"Alibi: train_sequence_length_scaling must be a positive number (0.25 trains on rows a "
                         f"quarter as long), got {train_sequence_length_scaling!r}.")
    if isinstance(sequence_keys, str) or not all(isinstance(k, str) for k in sequence_keys):
        raise ValueError(f"Alibi: sequence_keys must be a sequence of batch key names, got {sequence_keys!r}.")
    scaling, keys = float(train_sequence_length_scaling), tuple(sequence_keys)

    def model_fn(task, ctx):
        if scaling != 1 and not isinstance(task.source, nnx.Module):
            raise ValueError(
                f"Alibi(train_sequence_length_scaling={train_sequence_length_scaling}) on a "
                f"{type(task.source).__name__}: the torch bridge exports the model for the loader's sequence "
                "length, so training batches cannot be reshaped to shorter rows. Pass "
                "train_sequence_length_scaling=1 (ALiBi surgery only) and feed shorter training sequences from the "
                "loader instead.")
        return task.with_model(apply_alibi(task.source, max_sequence_length, inplace=True))

    def batch_fn(batch, ctx):
        return scale_sequence_length(batch, scaling, keys)

    return Method(name="Alibi", model=model_fn, batch=None if scaling == 1 else batch_fn,
                  description=f"Alibi(max_sequence_length={max_sequence_length}, "
                              f"train_sequence_length_scaling={train_sequence_length_scaling})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="alibi", factory=Alibi, functional=(apply_alibi,))
