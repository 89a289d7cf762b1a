"""Composer's ``ComposerClassifier`` for torch modules: an ``nn.Module`` wrapper with ``.module``, ``.parameters()``,
``forward((input, target))`` and ``loss(outputs, batch)``, so a Composer script builds its optimizer from
``model.parameters()`` and calls ``model(batch)`` as it does with Composer.

``jaxcomposer.ComposerClassifier(torch_module, ...)`` returns this class (jaxcomposer dispatches on the module's type
through the torch adapter). In the Trainer, a classifier with Composer's default loss and metrics trains as
jaxcomposer's own classifier task around the bridged ``module`` (soft cross-entropy and the metrics computed inside
the compiled steps); one with a custom ``loss_fn`` or torchmetrics trains as any ``ComposerModel`` does (its loss
exported, its metrics updated on the host). Either way ``state.model`` is this wrapper and, after ``fit``, its
``module`` holds the trained weights.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from jaxcomposer.models.tasks import ComposerClassifier as JaxClassifier

from jaxcomposer.metrics import CrossEntropy, MulticlassAccuracy

from .composer_model import ComposerModel, TorchStyleMetric, named_metrics


def soft_cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                       ignore_index: int = -100, reduction: str = "mean") -> torch.Tensor:
    """Composer's ``soft_cross_entropy``: ``F.cross_entropy`` for class indices; for dense (soft) targets shaped
    like ``input``, ``-(target * log_softmax(input, 1)).sum(1)`` reduced by ``reduction``."""
    if target.shape != input.shape:
        return F.cross_entropy(input, target, weight=weight, ignore_index=ignore_index, reduction=reduction)
    losses = -(target * F.log_softmax(input, dim=1))
    if weight is not None:
        shape = [1, -1] + [1] * (input.ndim - 2)
        losses = losses * weight.reshape(shape)
    losses = losses.sum(dim=1)
    if reduction == "mean":
        return losses.mean()
    return losses.sum() if reduction == "sum" else losses


class ComposerClassifier(ComposerModel):
    """Composer's ``ComposerClassifier(module, num_classes=None, train_metrics=None, val_metrics=None,
    loss_fn=soft_cross_entropy)``: batches are ``(input, target)`` pairs, ``forward`` returns
    ``module(input)``. Default metrics as Composer's: train ``MulticlassAccuracy``, eval ``CrossEntropy`` and
    ``MulticlassAccuracy`` (micro average), jaxcomposer's metrics with torchmetrics' ``update``/``compute``
    (``TorchStyleMetric``; the Trainer computes them inside its eval step); ``num_classes`` is needed for the
    accuracy. ``train_metrics``/``val_metrics`` take torchmetrics objects (one, a list or a dict), as Composer's."""

    def __init__(self, module: torch.nn.Module, num_classes: int | None = None, train_metrics: Any = None,
                 val_metrics: Any = None, loss_fn: Any = soft_cross_entropy):
        super().__init__()
        self.module = module
        self.num_classes = num_classes
        self._loss_fn = loss_fn
        self.default_metrics = train_metrics is None and val_metrics is None
        if train_metrics is None:
            train_metrics = _accuracy(num_classes)
        if val_metrics is None:
            val_metrics = [TorchStyleMetric(CrossEntropy())] + \
                ([_accuracy(num_classes)] if num_classes is not None else [])
        self.train_metrics = named_metrics(train_metrics)
        self.val_metrics = named_metrics(val_metrics)

    @property
    def uses_defaults(self) -> bool:
        """Composer's default loss and metrics, which jaxcomposer computes inside its compiled steps."""
        return self._loss_fn is soft_cross_entropy and self.default_metrics

    def forward(self, batch):
        inputs, _ = _pair(batch)
        return self.module(inputs)

    def loss(self, outputs, batch, *args, **kwargs):
        _, targets = _pair(batch)
        return self._loss_fn(outputs, targets, *args, **kwargs)

    def get_metrics(self, is_train: bool = False) -> dict:
        return dict(self.train_metrics if is_train else self.val_metrics)

    def update_metric(self, batch, outputs, metric) -> None:
        _, targets = _pair(batch)
        metric.update(outputs, targets)


def _pair(batch):
    if isinstance(batch, Mapping):
        return batch["input"], batch["target"]
    inputs, targets = batch
    return inputs, targets


def _accuracy(num_classes: int | None):
    return None if num_classes is None else TorchStyleMetric(MulticlassAccuracy(num_classes))


def as_task(wrapper: ComposerClassifier):
    """The Trainer's task for a classifier with Composer's defaults: jaxcomposer's classifier around the bridged
    ``wrapper.module`` (loss and metrics in the compiled steps). None for a custom loss or metrics (the
    ComposerModel path)."""
    return WrapperClassifierTask(wrapper) if wrapper.uses_defaults else None


class WrapperClassifierTask(JaxClassifier):
    """jaxcomposer's classifier task around ``wrapper.module``: surgery edits that module (a method that replaces it
    whole puts the replacement in ``wrapper.module``, as Composer's surgery on the wrapper would), the weights go
    back into it, and ``state.model`` is the wrapper."""

    def __init__(self, wrapper: ComposerClassifier):
        super().__init__(wrapper.module, wrapper.num_classes)
        self.wrapper = wrapper

    @property
    def user_model(self) -> ComposerClassifier:
        return self.wrapper

    def user_param_name(self, name: str) -> str:
        return "module." + name  # the wrapper's named_parameters()

    def bind(self, batch) -> "WrapperClassifierTask":
        if self._pure is None:
            super().bind(batch)
            wrapper, write_module = self.wrapper, self._pure.write_back

            def write_back(params, state):  # the module gets the weights; the Trainer's model is the wrapper
                write_module(params, state)
                return wrapper

            self._pure = dataclasses.replace(self._pure, write_back=write_back)
        return self

    def with_model(self, model) -> "WrapperClassifierTask":
        if model is not self.wrapper.module:
            self.wrapper.module = model
        return super().with_model(model)
