"""SeqLengthWarmup.

Method card
-----------
**What it does.** Trains a language model on short sequences first, growing them to full length early in training.
The length grows by ``step_size`` from ``min_seq_length`` to ``max_seq_length`` over the first ``duration`` of
training, by truncating each batch (or, with ``truncate=False``, by cutting it into more rows of shorter
sequences).

**When it helps.** Causal-LM pretraining (GPT-2 125M: 1.2-1.5x faster to the same perplexity in Composer's runs,
1.7x together with ALiBi): early steps are cheaper and more stable. Not for classification or fine-tuning on
short texts.

**Hyperparameters** (Composer's names and defaults). ``duration=0.3``; ``min_seq_length=8``;
``max_seq_length=1024``; ``step_size=8``; ``truncate=True``; ``preserve_end_of_sequence=False`` (when truncating,
copy each row's last real token, found from ``attention_mask``, into the last kept position). Additions:
``sequence_keys=('input_ids', 'attention_mask', 'labels')``, the batch entries to cut (those present; others are
left alone), and ``attention_mask_key='attention_mask'``.

**Exact Composer semantics.** With ``N`` the run's batches, ``update_every = int(N * duration) //
((max - min) // step_size)`` and ``L = clamp(step_size * (batch // update_every) + min, min, max)``. Where
Composer divides by zero we choose: no room for a step (``max - min < step_size``) or no warmup
(``int(N * duration) == 0``) gives ``max`` from the start; fewer warmup batches than steps gives ``L = min +
step_size * (batch * steps // warmup)`` (still reaching ``max`` by the end of the warmup). A batch no longer than
``L`` is left unchanged. ``truncate=False`` flattens each entry, drops the ``B*T mod L`` last tokens and reshapes to
``(B*T // L, L)`` rows, so rows can straddle two original sequences (Composer's behaviour); it needs every batch
entry to be a sequence of one shape.

**Sequence keys of different lengths.** Composer's batches have one length ``T`` and are cut to ``[:, :L]``. Our
``ComposerCausalLM`` reads ``input_ids`` ``(B, T+1)`` and aligns optional ``labels`` ``(B, T)`` with
``input_ids[:, 1:]``. Each key keeps its length offset from the longest one: ``input_ids`` is cut to ``L`` and
``labels`` to ``L - 1``, so the model reads ``L - 1`` tokens and trains on the same ``L - 1`` next-token targets
as Composer's HuggingFace model does at length ``L``. With equal lengths this is exactly Composer's cut.

**How it plugs in.** ``stage`` slot (host, every step): ``stage(batch_shapes, ctx)`` reads the clock
(``ctx.step`` batches trained, of ``ctx.run.total_steps``) and returns the current ``L`` (clamped to the batch's
length when given ``batch_shapes``, so lengths past it do not compile again). ``batch`` slot (in jit): cuts the
sequence entries to ``ctx.stage``; one compile per distinct length (choose ``step_size`` with that in mind). A
batch with none of ``sequence_keys`` raises (Composer requires a HuggingFace model and sequence-shaped tensors), as
does a missing stage. Evaluation always sees full-length batches. Composer's pre-run of a full-length
forward/backward to reserve memory is not needed: XLA allocates per compiled shape. See docs/design.md, "Methods
and slots" and "The clock".

**Reference.** Li, Zhang & He, "The Stability-Efficiency Dilemma: Investigating Sequence Length Warmup for
Training GPT Models", NeurIPS 2022 (arXiv:2108.06084). Composer: ``composer/algorithms/seq_length_warmup``.
"""
from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

import jax
import jax.numpy as jnp

from jaxcomposer.core.method import Method, MethodEntry, StepCtx, require_stage

__all__ = ["set_batch_sequence_length", "SeqLengthWarmup", "DEFAULT_SEQUENCE_KEYS"]

DEFAULT_SEQUENCE_KEYS = ("input_ids", "attention_mask", "labels")


def _keys_to_cut(batch: Mapping[str, Any], sequence_keys: Sequence[str] | None, where: str) -> list[str]:
    if sequence_keys is None:  # Composer's functional form: every entry is a sequence
        keys = list(batch)
    else:
        keys = [k for k in sequence_keys if k in batch]
        if not keys:
            raise ValueError(f"{where}: the batch has none of the sequence keys {tuple(sequence_keys)} (its keys: "
                             f"{sorted(batch)}). Sequence length warmup needs token batches; set sequence_keys to "
                             "the names your batches use.")
    for k in keys:
        if batch[k].ndim < 2:
            raise ValueError(f"{where}: batch[{k!r}] has shape {batch[k].shape}; sequence entries must be at least "
                             "(batch, sequence).")
    return keys


def _preserved_ends(batch, keys, cut: dict, longest: int, curr_seq_len: int, mask_key: str, where: str) -> dict:
    """Composer's ``preserve_end_of_sequence``: each row's last real token moves to the last kept position."""
    if mask_key not in batch:
        raise ValueError(f"{where}: preserve_end_of_sequence=True needs the batch's {mask_key!r} entry.")
    mask = batch[mask_key]
    last = mask.astype(jnp.int32).sum(axis=1) - 1
    # In the longest key's positions. An all-padding row (last == -1) reads and writes index -1, as torch's
    # negative indexing does in Composer: the last position of the original and of the cut sequence.
    end = last + (longest - mask.shape[1])
    src = jnp.where(last < 0, longest - 1, end)
    dst = jnp.where(last < 0, curr_seq_len - 1, jnp.minimum(end, curr_seq_len - 1))
    rows = jnp.arange(mask.shape[0])
    out = {}
    for k in keys:
        v, offset = batch[k], batch[k].shape[1] - longest  # a shorter key is the longest with its head dropped
        s, d = src + offset, dst + offset
        ok = (s >= 0) & (d >= 0)
        value = v[rows, jnp.maximum(s, 0)]  # (B, ...)
        hit = (jnp.arange(cut[k].shape[1])[None, :] == d[:, None]) & ok[:, None]
        hit = hit.reshape(hit.shape + (1,) * (v.ndim - 2))
        value = value.reshape(value.shape[:1] + (1,) + value.shape[1:])
        out[k] = jnp.where(hit, value, cut[k])
    return out


def set_batch_sequence_length(batch: Mapping[str, jax.Array], curr_seq_len: int, truncate: bool = True,
                              preserve_end_of_sequence: bool = False, *,
                              sequence_keys: Sequence[str] | None = None,
                              attention_mask_key: str = "attention_mask") -> dict:
    """Composer's ``set_batch_sequence_length``: the batch with its sequences at length ``curr_seq_len`` (static).

    ``sequence_keys=None`` (Composer's behaviour) treats every entry as a ``(batch, sequence, ...)`` tensor; a tuple
    names the entries to cut (those present) and leaves the rest alone. Entries shorter than the longest keep their
    offset from it (see the method card). A batch already no longer than ``curr_seq_len`` is returned unchanged.
    """
    where = "set_batch_sequence_length"
    if isinstance(curr_seq_len, bool) or int(curr_seq_len) != curr_seq_len or curr_seq_len < 1:
        raise ValueError(f"{where}: curr_seq_len must be a positive int (static), got {curr_seq_len!r}.")
    curr_seq_len = int(curr_seq_len)
    batch = dict(batch)
    keys = _keys_to_cut(batch, sequence_keys, where)
    longest = max(batch[k].shape[1] for k in keys)
    if curr_seq_len >= longest:
        return batch

    if truncate:
        new_len = {k: curr_seq_len - (longest - batch[k].shape[1]) for k in keys}
        short = {k: n for k, n in new_len.items() if n < 1}
        if short:
            raise ValueError(f"{where}: curr_seq_len={curr_seq_len} leaves no positions in {sorted(short)} (they are "
                             f"{[longest - batch[k].shape[1] for k in sorted(short)]} shorter than the longest key).")
        cut = {k: batch[k][:, :new_len[k]] for k in keys}
        if preserve_end_of_sequence:
            cut = _preserved_ends(batch, keys, cut, longest, curr_seq_len, attention_mask_key, where)
        return {**batch, **cut}

    others = sorted(set(batch) - set(keys))
    if others:
        raise ValueError(f"{where}: truncate=False makes new rows, so every batch entry must be a sequence to cut; "
                         f"{others} are not in sequence_keys.")
    shape = batch[keys[0]].shape
    bad = {k: batch[k].shape for k in keys if batch[k].shape != shape or batch[k].ndim != 2}
    if bad:
        raise ValueError(f"{where}: truncate=False needs every entry to be (batch, sequence) of one shape; "
                         f"{keys[0]!r} is {shape}, but {bad}.")
    rows = (shape[0] * shape[1]) // curr_seq_len
    return {k: batch[k].reshape(-1)[:rows * curr_seq_len].reshape(rows, curr_seq_len) for k in keys}


def _warmup_length(batch: int, total_steps: int, duration: float, min_seq_length: int, max_seq_length: int,
                   step_size: int) -> int:
    """Composer's ``curr_seq_len`` after ``batch`` batches, with its divisions by zero given a meaning."""
    num_warmup = int(total_steps * duration)
    num_updates = (max_seq_length - min_seq_length) // step_size
    if num_updates == 0 or num_warmup == 0:
        return max_seq_length
    update_every = num_warmup // num_updates
    if update_every > 0:
        length = step_size * (batch // update_every) + min_seq_length
    else:  # more length steps than warmup batches: several steps per batch, reaching max by the warmup's end
        length = step_size * (batch * num_updates // num_warmup) + min_seq_length
    return min(max(length, min_seq_length), max_seq_length)


def SeqLengthWarmup(duration: float = 0.3, min_seq_length: int = 8, max_seq_length: int = 1024, step_size: int = 8,
                    truncate: bool = True, preserve_end_of_sequence: bool = False,
                    sequence_keys: Sequence[str] = DEFAULT_SEQUENCE_KEYS,
                    attention_mask_key: str = "attention_mask") -> Method:
    """Composer's ``SeqLengthWarmup(duration=0.3, min_seq_length=8, max_seq_length=1024, step_size=8,
    truncate=True, preserve_end_of_sequence=False)`` as a :class:`Method` (``stage`` + ``batch`` slots)."""
    if not 0 <= duration <= 1:
        raise ValueError(f"SeqLengthWarmup: duration must be in [0, 1], got {duration}.")
    for name, value in (("min_seq_length", min_seq_length), ("max_seq_length", max_seq_length),
                        ("step_size", step_size)):
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ValueError(f"SeqLengthWarmup: {name} must be a positive integer, got {value!r}.")
    if max_seq_length < min_seq_length:
        raise ValueError(f"SeqLengthWarmup: max_seq_length={max_seq_length} must be >= "
                         f"min_seq_length={min_seq_length}.")
    if isinstance(sequence_keys, str) or not sequence_keys:
        raise ValueError(f"SeqLengthWarmup: sequence_keys must be a non-empty sequence of batch keys, got "
                         f"{sequence_keys!r}.")
    duration, sequence_keys = float(duration), tuple(sequence_keys)
    min_seq_length, max_seq_length, step_size = int(min_seq_length), int(max_seq_length), int(step_size)

    def stage(batch_shapes: Mapping[str, Any] | None, ctx: StepCtx) -> Hashable:
        length = _warmup_length(int(ctx.step), ctx.run.total_steps, duration, min_seq_length, max_seq_length,
                                step_size)
        if batch_shapes is not None:
            lengths = [tuple(getattr(v, "shape", v))[1] for k, v in batch_shapes.items()
                       if k in sequence_keys and len(tuple(getattr(v, "shape", v))) >= 2]
            if lengths:  # every length past the batch's own is a no-op: one stage (one compile) for all of them
                length = min(length, max(lengths))
        return length

    def batch_fn(batch: dict, ctx: StepCtx) -> dict:
        length = require_stage(ctx, "SeqLengthWarmup", "the batch slot needs the static sequence length that its stage "
                               "slot computes on the host. The Trainer passes it; in your own loop pass "
                               "method.stage(batch_shapes, ctx) as the step's static stage, or call "
                               "set_batch_sequence_length directly.")
        return set_batch_sequence_length(batch, length, truncate, preserve_end_of_sequence,
                                         sequence_keys=sequence_keys, attention_mask_key=attention_mask_key)

    return Method(name="SeqLengthWarmup", batch=batch_fn, stage=stage,
                  description=(f"SeqLengthWarmup(duration={duration}, min_seq_length={min_seq_length}, "
                               f"max_seq_length={max_seq_length}, step_size={step_size}, truncate={truncate}, "
                               f"preserve_end_of_sequence={preserve_end_of_sequence})"))


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="seq_length_warmup", factory=SeqLengthWarmup, functional=(set_batch_sequence_length,))
