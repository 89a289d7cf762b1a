"""Segmentation metrics: Composer's ``MIoU`` and ``Dice`` on the sum-state protocol.

``preds`` are per-pixel logits, ``target`` per-pixel class indices. Our models are channels-last, so the class axis
of the logits defaults to the last one; Composer's torch models put it at axis 1 (``class_axis=1``).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxcomposer.metrics.base import Metric, State, array_namespace, example_weight, logits_of, merge


def _predicted_classes(preds, target, class_axis: int, where: str) -> jax.Array:
    logits = logits_of(preds)
    predicted = jnp.argmax(logits, axis=class_axis)
    if predicted.shape != jnp.shape(target):
        raise ValueError(f"{where}: logits {logits.shape} with the class axis {class_axis} give predictions shaped "
                         f"{predicted.shape}, but targets are {jnp.shape(target)} (Composer's NCHW logits: "
                         "class_axis=1)")
    return predicted


@dataclasses.dataclass(frozen=True)
class MIoU(Metric):
    """Mean intersection-over-union, in percent: per class, the pixels predicted and labelled that class over the
    pixels predicted or labelled that class, summed over the whole evaluation; then the mean over the classes that
    occur (a class never predicted nor labelled has no IoU). Pixels labelled ``ignore_index`` are left out.
    """

    num_classes: int
    ignore_index: int = -1
    class_axis: int = -1

    def init(self) -> State:
        zeros = jnp.zeros((self.num_classes,), jnp.float32)
        return {"total_intersect": zeros, "total_union": zeros}

    def update(self, state, preds, target, weight):
        target = jnp.asarray(target)
        predicted = _predicted_classes(preds, target, self.class_axis, "MIoU")
        # outside [0, num_classes) counts nowhere, as Composer's histograms bin only those values
        valid = (target != self.ignore_index) & (target >= 0) & (target < self.num_classes)
        w = (example_weight(weight, target) * valid)[..., None]
        pred_hot = jax.nn.one_hot(predicted, self.num_classes) * w
        target_hot = jax.nn.one_hot(jnp.where(valid, target, 0), self.num_classes) * w
        axes = tuple(range(target.ndim))
        intersect = (pred_hot * target_hot).sum(axes)  # one-hot rows: 1 only where both name the same class
        union = pred_hot.sum(axes) + target_hot.sum(axes) - intersect
        return merge(state, {"total_intersect": intersect, "total_union": union})

    def compute(self, state):
        xp, union = array_namespace(state), state["total_union"]
        present = union > 0
        iou = xp.where(present, state["total_intersect"] / xp.where(present, union, 1.0), 0.0)
        return 100.0 * iou.sum() / xp.maximum(present.sum(), 1)


@dataclasses.dataclass(frozen=True)
class Dice(Metric):
    """Composer's Dice score, in percent: per batch and per foreground class (1 .. C-1), ``2tp / (2tp + fp + fn)``
    over the batch's pixels (or, when the batch has no pixel of that class, 1 if none is predicted either and 0
    otherwise); these are averaged over batches, then over classes, and rounded to two decimals as Composer does.

    Being per batch, the score depends on how the evaluation set is batched, as Composer's does. Padded examples
    (the filled-up last batch) are left out of their batch's counts.
    """

    num_classes: int
    class_axis: int = -1

    def init(self) -> State:
        return {"dice": jnp.zeros((self.num_classes - 1,), jnp.float32), "n_updates": jnp.zeros((), jnp.float32)}

    def update(self, state, preds, target, weight):
        target = jnp.asarray(target)
        predicted = _predicted_classes(preds, target, self.class_axis, "Dice")
        w = example_weight(weight, target)[..., None]
        classes = jnp.arange(1, self.num_classes).reshape((1,) * target.ndim + (-1,))
        is_pred, is_target = predicted[..., None] == classes, target[..., None] == classes
        axes = tuple(range(target.ndim))
        count = lambda hits: (hits * w).sum(axes)  # per class, over the batch's (unpadded) pixels
        tp, fp, fn = count(is_pred & is_target), count(is_pred & ~is_target), count(~is_pred & is_target)
        denominator = 2 * tp + fp + fn
        score = jnp.where(denominator > 0, 2 * tp / jnp.maximum(denominator, 1.0), 0.0)
        score = jnp.where(count(is_target) == 0, (count(is_pred) == 0).astype(jnp.float32), score)
        return merge(state, {"dice": score, "n_updates": jnp.ones((), jnp.float32)})

    def compute(self, state):
        xp = array_namespace(state)
        dice = 100.0 * state["dice"] / xp.maximum(state["n_updates"], 1.0)
        return xp.round(dice.mean(), 2)
