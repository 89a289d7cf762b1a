"""Language-model metrics, per token: every position whose target is not ``ignore_index`` counts once, whatever
sequence it sits in (padding and prompt positions marked ``ignore_index`` count for nothing).

``preds`` are logits ``(B, T, V)`` (or a mapping with ``'logits'``), ``target`` the token ids ``(B, T)`` aligned with
them.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxcomposer.metrics.base import Metric, State, array_namespace, example_weight, logits_of, merge
from jaxcomposer.metrics.classification import CrossEntropy


@dataclasses.dataclass(frozen=True)
class LanguageCrossEntropy(CrossEntropy):
    """Cross-entropy (nats) summed over the non-ignored tokens of all batches, divided by their number: Composer's
    ``LanguageCrossEntropy``."""


@dataclasses.dataclass(frozen=True)
class LanguagePerplexity(LanguageCrossEntropy):
    """``exp`` of the per-token cross-entropy over the whole evaluation (not a mean of per-batch perplexities)."""

    def compute(self, state):
        return array_namespace(state).exp(super().compute(state))


@dataclasses.dataclass(frozen=True)
class MaskedAccuracy(Metric):
    """The share of non-ignored tokens whose argmax prediction is the target."""

    ignore_index: int = -100

    def init(self) -> State:
        return {"correct": jnp.zeros((), jnp.float32), "total": jnp.zeros((), jnp.float32)}

    def update(self, state, preds, target, weight):
        logits = logits_of(preds)
        target = jnp.asarray(target)
        if target.shape != logits.shape[:-1]:
            raise ValueError(f"MaskedAccuracy: targets {target.shape} must match the logits' leading axes "
                             f"{logits.shape[:-1]}")
        valid = target != self.ignore_index
        w = example_weight(weight, target) * valid
        correct = jnp.argmax(logits, axis=-1) == target
        return merge(state, {"correct": (correct * w).sum(), "total": w.sum()})

    def compute(self, state):
        return state["correct"] / array_namespace(state).maximum(state["total"], 1.0)
