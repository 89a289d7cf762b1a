"""Classification metrics on the sum-state protocol (``jaxcomposer.metrics.base``), under Composer's names.

``preds`` are logits ``(..., C)``; ``target`` is class indices ``(...)`` or dense (one-hot, soft) targets shaped
like the logits, as MixUp, CutMix and label smoothing leave them: dense targets count as their argmax class.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxcomposer.loss import soft_cross_entropy
from jaxcomposer.metrics.base import Metric, State, array_namespace, example_weight, logits_of, merge


def class_targets(logits: jax.Array, target: jax.Array) -> jax.Array:
    """Integer class indices: dense targets shaped like the logits become their argmax (Composer decides index vs
    dense by shape, so integer one-hot targets are dense too)."""
    target = jnp.asarray(target)
    return jnp.argmax(target, axis=-1) if target.shape == logits.shape else target.astype(jnp.int32)


def _sums(**values) -> State:
    return {k: jnp.asarray(v, jnp.float32) for k, v in values.items()}


@dataclasses.dataclass(frozen=True)
class MulticlassAccuracy(Metric):
    """The share of examples whose target class is among the ``top_k`` highest logits (micro average).

    ``num_classes`` is checked against the logits when given. torchmetrics' class defaults to
    ``average='macro'``; Composer's classifiers ask for ``'micro'``, the only average offered here.
    """

    num_classes: int | None = None
    top_k: int = 1
    average: str = "micro"

    def __post_init__(self):
        if self.average != "micro":
            raise ValueError(f"MulticlassAccuracy: average={self.average!r} is not supported; only 'micro' (the share "
                             "of correct examples, what Composer's classifiers report)")
        if not (isinstance(self.top_k, int) and self.top_k >= 1):
            raise ValueError(f"MulticlassAccuracy: top_k must be a positive int, got {self.top_k!r}")

    def init(self) -> State:
        return _sums(correct=0.0, total=0.0)

    def update(self, state, preds, target, weight):
        logits = logits_of(preds)
        if self.num_classes is not None and logits.shape[-1] != self.num_classes:
            raise ValueError(f"MulticlassAccuracy(num_classes={self.num_classes}): logits have {logits.shape[-1]} "
                             "classes")
        labels = class_targets(logits, target)
        if self.top_k == 1:
            correct = jnp.argmax(logits, axis=-1) == labels
        else:  # the target's logit beats all but fewer than k others
            picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)
            correct = (logits > picked).sum(-1) < self.top_k
        w = example_weight(weight, labels)
        return merge(state, _sums(correct=(correct * w).sum(), total=w.sum()))

    def compute(self, state):
        return state["correct"] / array_namespace(state).maximum(state["total"], 1.0)


@dataclasses.dataclass(frozen=True)
class CrossEntropy(Metric):
    """Mean cross-entropy (nats) over the examples, or over the positions of a sequence target, whose target is not
    ``ignore_index``; dense targets give ``-(t * log_softmax(x)).sum(-1)``.

    Composer's ``CrossEntropy`` averages per-batch means, so an uneven last batch weighs as much as a full one; this
    averages per example (per position), which is exact for any batching.
    """

    ignore_index: int = -100

    def init(self) -> State:
        return _sums(sum_loss=0.0, total=0.0)

    def update(self, state, preds, target, weight):
        logits, target = logits_of(preds), jnp.asarray(target)
        if target.shape == logits.shape:  # dense targets (integer one-hot too, as Composer decides by shape)
            loss = soft_cross_entropy(logits, target.astype(jnp.float32))
            valid = jnp.ones(loss.shape, bool)  # nothing to ignore
        else:
            valid = target != self.ignore_index
            loss = soft_cross_entropy(logits, jnp.where(valid, target, 0).astype(jnp.int32))
        w = example_weight(weight, valid) * valid
        return merge(state, _sums(sum_loss=(jnp.where(valid, loss, 0.0) * w).sum(), total=w.sum()))

    def compute(self, state):
        return state["sum_loss"] / array_namespace(state).maximum(state["total"], 1.0)


@dataclasses.dataclass(frozen=True)
class BinaryF1Score(Metric):
    """F1 of the positive class: ``tp / (tp + (fp + fn) / 2)``, 0 when nothing is positive in targets or predictions.

    Predictions: the argmax of two-class logits ``(B, 2)``, as Composer's; or a single score ``(B,)`` read as
    torchmetrics does (probabilities in [0, 1] as they are, anything else through a sigmoid) and cut at
    ``threshold``.
    """

    threshold: float = 0.5

    def init(self) -> State:
        return _sums(true_positive=0.0, false_positive=0.0, false_negative=0.0)

    def update(self, state, preds, target, weight):
        scores = logits_of(preds)
        if scores.ndim == 2 and scores.shape[-1] == 2:
            predicted = jnp.argmax(scores, axis=-1) == 1
        elif scores.ndim == 1 or (scores.ndim == 2 and scores.shape[-1] == 1):
            scores = scores.reshape(scores.shape[0]).astype(jnp.float32)
            probs = jnp.where(jnp.all((scores >= 0) & (scores <= 1)), scores, jax.nn.sigmoid(scores))
            predicted = probs > self.threshold
        else:
            raise ValueError(f"BinaryF1Score: predictions must be (B, 2) logits or (B,) scores, got {scores.shape}")
        positive = jnp.asarray(target).reshape(predicted.shape) == 1
        w = jnp.asarray(weight, jnp.float32)
        count = lambda hits: (hits * w).sum()
        return merge(state, _sums(true_positive=count(predicted & positive),
                                  false_positive=count(predicted & ~positive),
                                  false_negative=count(~predicted & positive)))

    def compute(self, state):
        xp, tp = array_namespace(state), state["true_positive"]
        denominator = tp + 0.5 * (state["false_positive"] + state["false_negative"])
        return xp.where(denominator > 0, tp / xp.maximum(denominator, 1e-12), 0.0)
