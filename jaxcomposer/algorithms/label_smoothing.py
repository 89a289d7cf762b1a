"""Label smoothing.

Method card
-----------
**What it does.** Replaces hard targets with ``onehot(y) * (1 - smoothing) + smoothing / C`` before the loss, so the
model is pushed towards confident-but-not-infinite logits (C = number of classes, the last logit axis here).

**When it helps.** Image classification with cross-entropy (ResNets on ImageNet/CIFAR: +0.1-0.5% top-1 at no cost).
It changes the loss value (it no longer goes to 0), so compare runs by accuracy, not by training loss. Rarely useful
for language models.

**Hyperparameters.** ``smoothing`` (default ``0.1``; Composer recipes use ``0.08``-``0.1``): the probability mass
moved from the true class to the uniform distribution. Must satisfy ``0 <= smoothing < 1``.

**How it plugs in.** A ``loss`` slot wrapper, ``loss(loss_fn, ctx) -> loss_fn`` (docs/design.md, "Methods and
slots"; it reads nothing from the ctx): the target under ``target_key`` is replaced by the smoothed dense
targets for the call to the inner per-example loss (Composer's ``BEFORE_LOSS``/``AFTER_LOSS`` pair: the batch the
rest of the step sees is untouched, which in a pure step is automatic). The inner loss must accept dense targets
(``soft_cross_entropy`` does).

**Reference.** Szegedy et al., "Rethinking the Inception Architecture for Computer Vision", CVPR 2016
(arXiv:1512.00567). Composer: ``composer/algorithms/label_smoothing``.
"""
from __future__ import annotations

from typing import Callable

import jax

from jaxcomposer.core.method import Method, MethodEntry, StepCtx
from jaxcomposer.core.model import ensure_targets_one_hot

__all__ = ["smooth_labels", "LabelSmoothing"]


def smooth_labels(logits: jax.Array, target: jax.Array, smoothing: float = 0.1) -> jax.Array:
    """Composer's ``smooth_labels``: dense float targets ``onehot * (1 - smoothing) + smoothing / C``.

    ``target`` may be integer class indices (any leading shape) or already dense ``(..., C)`` targets; ``C`` is
    ``logits.shape[-1]`` (the class axis is last in our layout; Composer's torch layout has it on axis 1).
    """
    targets = ensure_targets_one_hot(logits, target)
    n_classes = logits.shape[-1]
    return targets * (1.0 - smoothing) + smoothing / n_classes


def LabelSmoothing(smoothing: float = 0.1, target_key: str = "target") -> Method:
    """Composer's ``LabelSmoothing(smoothing=0.1)`` as a :class:`Method` with a ``loss`` slot."""
    smoothing = float(smoothing)
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"LabelSmoothing: smoothing must satisfy 0 <= smoothing < 1, got {smoothing}.")

    def wrap(loss_fn: Callable, ctx: StepCtx) -> Callable:
        del ctx  # static smoothing: the wrapper reads nothing from the step

        def smoothed_loss(outputs, batch):
            # A new dict, never an edit: the caller's batch (and so metrics) keeps the original labels.
            return loss_fn(outputs, {**batch, target_key: smooth_labels(outputs, batch[target_key], smoothing)})

        return smoothed_loss

    return Method(name="LabelSmoothing", loss=wrap, description=f"LabelSmoothing(smoothing={smoothing})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="label_smoothing", factory=LabelSmoothing, functional=(smooth_labels,))
