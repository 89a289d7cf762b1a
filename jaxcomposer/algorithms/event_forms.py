"""Three built-in methods written the Composer way, as :class:`~jaxcomposer.core.algorithm.Algorithm` subclasses:
one batch method (``ProgressiveResizingAlgorithm``, ``AFTER_DATALOADER``), one loss method
(``LabelSmoothingAlgorithm``, ``BEFORE_LOSS``/``AFTER_LOSS``) and one gradient method
(``GradientClippingAlgorithm``, ``AFTER_TRAIN_BATCH``).

They call the same functional forms as the slot versions (:func:`LabelSmoothing`, :func:`GradientClipping`,
:func:`ProgressiveResizing`) and train to the same bits (``tests/algorithms/test_event_forms.py``); their steps'
times side by side are in ``benchmarks/event_forms.py``. They show what a user's algorithm is here: Composer's
``match``/``apply`` code, traced into the compiled step (docs/design.md, "Users' Composer algorithms"). The slot
versions stay the built-in ones: a slot costs nothing on the host per batch, where an in-step ``apply`` is replayed
on the host before every matched batch unless it says ``trace_once`` (the two pure ones here do; progressive
resizing reads the clock, so it is replayed).
"""
from __future__ import annotations

from typing import Any

from jaxcomposer.algorithms.gradient_clipping import apply_gradient_clipping, clip_gradients
from jaxcomposer.algorithms.label_smoothing import check_smoothing, smooth_labels
from jaxcomposer.algorithms.progressive_resizing import scale_at, resize_batch
from jaxcomposer.core.algorithm import Algorithm
from jaxcomposer.core.events import Event

__all__ = ["GradientClippingAlgorithm", "LabelSmoothingAlgorithm", "ProgressiveResizingAlgorithm"]


class LabelSmoothingAlgorithm(Algorithm):
    """Composer's ``LabelSmoothing.apply``: smooth the targets before the loss, put them back after it."""

    trace_once = True  # a pure function of the outputs, the targets and ``smoothing``

    def __init__(self, smoothing: float = 0.1, target_key: Any = 1):
        self.smoothing = check_smoothing(smoothing, "LabelSmoothingAlgorithm")
        self.target_key = target_key
        self.original_labels = None

    def match(self, event: Event, state: Any) -> bool:
        return event in (Event.BEFORE_LOSS, Event.AFTER_LOSS)

    def apply(self, event: Event, state: Any, logger: Any) -> None:
        if event == Event.BEFORE_LOSS:
            labels = state.batch_get_item(self.target_key)
            self.original_labels = labels
            state.batch_set_item(self.target_key, smooth_labels(state.outputs, labels, self.smoothing))
        else:
            state.batch_set_item(self.target_key, self.original_labels)

    def __repr__(self) -> str:
        return f"LabelSmoothingAlgorithm(smoothing={self.smoothing}, target_key={self.target_key!r})"


class GradientClippingAlgorithm(Algorithm):
    """Composer's ``GradientClipping.apply`` at ``AFTER_TRAIN_BATCH``, on ``state.grads`` (NNX layout: output
    units on a weight's last axis, as the slot version's default for NNX models)."""

    trace_once = True  # a pure function of the gradients, the params and the threshold

    def __init__(self, clipping_type: str, clipping_threshold: float):
        clip_gradients(clipping_type, clipping_threshold)  # validates, as the slot version
        self.clipping_type, self.clipping_threshold = clipping_type, clipping_threshold

    def match(self, event: Event, state: Any) -> bool:
        return event == Event.AFTER_TRAIN_BATCH

    def apply(self, event: Event, state: Any, logger: Any) -> None:
        state.grads = apply_gradient_clipping(state.grads, self.clipping_type, self.clipping_threshold, state.params)

    def __repr__(self) -> str:
        return f"GradientClippingAlgorithm({self.clipping_type!r}, {self.clipping_threshold})"


class ProgressiveResizingAlgorithm(Algorithm):
    """Composer's ``ProgressiveResizing.apply`` (``mode='resize'``) at ``AFTER_DATALOADER`` on NHWC images: the
    scale follows the elapsed fraction of the run and is pinned to ``size_increment`` pixels, so each size is one
    compiled variant, as each of the slot version's stages is."""

    def __init__(self, initial_scale: float = 0.5, finetune_fraction: float = 0.2, delay_fraction: float = 0.5,
                 size_increment: int = 4):
        self.initial_scale, self.finetune_fraction = float(initial_scale), float(finetune_fraction)
        self.delay_fraction, self.size_increment = float(delay_fraction), int(size_increment)

    def match(self, event: Event, state: Any) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: Any, logger: Any) -> None:
        elapsed = int(state.timestamp.batch) / max(state.max_duration_in_batches, 1)
        scale = scale_at(elapsed, self.initial_scale, self.delay_fraction, self.finetune_fraction)
        inputs = state.batch_get_item(0)
        width = inputs.shape[2]
        factor = min(round(width * scale / self.size_increment) * self.size_increment / width, 1.0)
        if factor < 1.0:
            resized, _ = resize_batch(inputs, None, factor, mode="resize", data_format="NHWC")
            state.batch_set_item(0, resized)

    def __repr__(self) -> str:
        return (f"ProgressiveResizingAlgorithm(initial_scale={self.initial_scale}, finetune_fraction="
                f"{self.finetune_fraction}, delay_fraction={self.delay_fraction}, size_increment="
                f"{self.size_increment})")
