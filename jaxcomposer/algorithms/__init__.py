"""Speedup methods: Composer's class names and hyperparameters, each a factory returning a ``Method``.

One file per method holds its functional form, its factory and its method card (the module docstring).
"""
from jaxcomposer.algorithms.cutout import CutOut, cutout_batch
from jaxcomposer.algorithms.ema import EMA, compute_ema
from jaxcomposer.algorithms.gradient_clipping import GradientClipping, apply_gradient_clipping
from jaxcomposer.algorithms.label_smoothing import LabelSmoothing, smooth_labels
from jaxcomposer.algorithms.mixup import MixUp, mixup_batch

__all__ = [
    "CutOut", "EMA", "GradientClipping", "LabelSmoothing", "MixUp",
    "apply_gradient_clipping", "compute_ema", "cutout_batch", "mixup_batch", "smooth_labels",
]
