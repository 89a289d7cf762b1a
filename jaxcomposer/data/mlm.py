"""Host-side masking for masked-LM pretraining: the masking of Hugging Face's ``DataCollatorForLanguageModeling``
(Devlin et al. 2019, section 3.1), in numpy, for :class:`jaxcomposer.models.ComposerMaskedLM` batches.

Each non-special token is selected with probability ``mlm_probability`` (0.15); a selected token becomes
``mask_token_id`` with probability ``mask_replace_prob`` (0.8), a uniformly random token id in ``[0, vocab_size)``
with probability ``random_replace_prob`` (0.1), and stays itself otherwise. ``labels`` hold the original token at
the selected positions and ``ignore_index`` (-100) elsewhere. Special tokens ([CLS], [SEP], [PAD], ...) are never
selected.

Same draws as the collator's numpy path (``numpy_mask_tokens`` with a ``np.random.Generator``), in the same order, so
the same generator state gives the same batch. Differences: the special tokens are given as ids (or as a mask)
instead of being read off a tokenizer, and there is no whole-word masking. As in HF, the random replacement may draw
a special token id.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

__all__ = ["mask_tokens"]


def _check_prob(name: str, value: float) -> float:
    if isinstance(value, bool) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"mask_tokens: {name} must be a probability in [0, 1], got {value!r}.")
    return float(value)


def mask_tokens(input_ids: np.ndarray, rng: np.random.Generator, *, mask_token_id: int, vocab_size: int,
                special_token_ids: Iterable[int] = (), special_tokens_mask: np.ndarray | None = None,
                mlm_probability: float = 0.15, mask_replace_prob: float = 0.8, random_replace_prob: float = 0.1,
                ignore_index: int = -100) -> tuple[np.ndarray, np.ndarray]:
    """``(masked input_ids, labels)`` for a ``(B, T)`` integer batch; ``input_ids`` is not modified.

    ``rng``: a ``np.random.Generator`` (``np.random.default_rng(seed)``); it is advanced. ``special_token_ids``
    and/or ``special_tokens_mask`` (``(B, T)``, nonzero = special) say which positions are never selected.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"mask_tokens: rng must be a numpy.random.Generator (np.random.default_rng(seed)), got "
                        f"{type(rng).__name__}.")
    inputs = np.array(input_ids, copy=True)
    if inputs.ndim != 2 or not np.issubdtype(inputs.dtype, np.integer):
        raise ValueError(f"mask_tokens: input_ids must be an integer (B, T) array, got {inputs.dtype} "
                         f"{inputs.shape}.")
    mlm_probability = _check_prob("mlm_probability", mlm_probability)
    mask_replace_prob = _check_prob("mask_replace_prob", mask_replace_prob)
    random_replace_prob = _check_prob("random_replace_prob", random_replace_prob)
    if mask_replace_prob + random_replace_prob > 1.0:
        raise ValueError(f"mask_tokens: mask_replace_prob + random_replace_prob must not exceed 1, got "
                         f"{mask_replace_prob} + {random_replace_prob}.")
    special = np.isin(inputs, np.asarray(list(special_token_ids), dtype=inputs.dtype))
    if special_tokens_mask is not None:
        if np.shape(special_tokens_mask) != inputs.shape:
            raise ValueError(f"mask_tokens: special_tokens_mask must have the shape of input_ids {inputs.shape}, "
                             f"got {np.shape(special_tokens_mask)}.")
        special |= np.asarray(special_tokens_mask).astype(bool)

    labels = inputs.copy()
    probability = np.full(inputs.shape, mlm_probability)
    probability[special] = 0.0
    masked = rng.binomial(1, probability, size=probability.shape).astype(bool)
    labels[~masked] = ignore_index

    replaced = rng.binomial(1, mask_replace_prob, size=labels.shape).astype(bool) & masked
    inputs[replaced] = mask_token_id
    if mask_replace_prob == 1 or random_replace_prob == 0:
        return inputs, labels
    # the collator's scaling: of the tokens not turned into [MASK], this share becomes random
    scaled = random_replace_prob / (1 - mask_replace_prob)
    randomized = rng.binomial(1, scaled, size=labels.shape).astype(bool) & masked & ~replaced
    inputs[randomized] = rng.integers(low=0, high=vocab_size, size=np.count_nonzero(randomized), dtype=np.int64)
    return inputs, labels


def masked_lm_transform(*, mask_token_id: int, vocab_size: int, mlm_probability: float = 0.15,
                        special_token_ids: Iterable[int] = ()):
    """A loader ``transform(batch, rng)`` turning language-model windows ``{'input_ids': (B, T + 1)}`` into
    masked-LM batches ``{'input_ids', 'labels', 'attention_mask'}`` of length ``T`` (the window's last token, which
    causal LMs use as the final target, is dropped) with :func:`mask_tokens`' 80/10/10 masking; random
    replacements are drawn from ``[0, vocab_size)``, so an added [MASK] id beyond the data's vocabulary never
    appears as a random token."""
    _check_prob("mlm_probability", mlm_probability)
    special = tuple(special_token_ids)

    def transform(batch, rng: np.random.Generator):
        ids = np.asarray(batch["input_ids"])[:, :-1]
        inputs, labels = mask_tokens(ids, rng, mask_token_id=mask_token_id, vocab_size=vocab_size,
                                     special_token_ids=special, mlm_probability=mlm_probability)
        return {"input_ids": inputs, "labels": labels, "attention_mask": np.ones_like(inputs, dtype=np.int32)}

    return transform
