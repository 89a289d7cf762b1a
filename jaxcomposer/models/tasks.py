"""Composer-style task wrappers: what to feed the model, the per-example loss and the evaluation metrics."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.core import adapters
from jaxcomposer.core.model import Batch, Task
from jaxcomposer.loss import soft_binary_cross_entropy, soft_cross_entropy
from jaxcomposer.metrics import (CrossEntropy, LanguageCrossEntropy, LanguagePerplexity, MaskedAccuracy, Metric,
                                 MulticlassAccuracy)
from jaxcomposer.metrics.base import check_metrics


def _infer_num_classes(module: Any) -> int | None:
    """The head width when the model says it (our native models carry ``num_classes``); None otherwise."""
    n = getattr(module, "num_classes", None) if isinstance(module, nnx.Module) else None
    return n if isinstance(n, int) else None


# a config's model.loss -> the per-example classification loss (Composer's ResNet recipes use binary cross-entropy)
CLASSIFICATION_LOSSES = {"cross_entropy": soft_cross_entropy, "binary_cross_entropy": soft_binary_cross_entropy}


def masked_sequence_ce(logits: jax.Array, targets: jax.Array, ignore_index: int) -> jax.Array:
    """Each sequence's mean cross-entropy over its positions whose target is not ``ignore_index``: ``(B,)``
    (a sequence with none contributes 0)."""
    mask = targets != ignore_index
    ce = soft_cross_entropy(logits, jnp.where(mask, targets, 0))  # (B, T)
    m = mask.astype(jnp.float32)
    return (ce * m).sum(-1) / jnp.maximum(m.sum(-1), 1.0)


class ComposerClassifier(Task):
    """Batch ``{'input': x, 'target': y}`` with ``y`` int ``(B,)`` or soft ``(B, C)``.

    ``loss_fn(logits, target) -> (B,)`` defaults to soft cross-entropy, so MixUp/CutMix/label smoothing can hand
    dense targets to the same task. ``val_metrics`` (a metric, a list or a name -> metric dict) default to
    Composer's: ``CrossEntropy`` and micro ``MulticlassAccuracy``; they always see the plain targets, whatever the
    training loss is. ``train_metrics`` (Composer's default: ``MulticlassAccuracy``) are what
    ``Trainer(compute_training_metrics=True)`` logs as ``metrics/train/<name>``.
    """

    input_key = "input"
    target_key = "target"

    def __new__(cls, module: Any = None, *args, **kwargs):
        # A torch module gets Composer's own wrapper, a torch nn.Module (model.parameters(), model(batch), ...),
        # from the torch adapter; jaxcomposer never imports torch itself
        if cls is ComposerClassifier:
            foreign = adapters.provided(module, "ComposerClassifier")
            if foreign is not None:
                return foreign(module, *args, **kwargs)
        return super().__new__(cls)

    @classmethod
    def for_module(cls, module: Any, *args, **kwargs) -> "ComposerClassifier":
        """This task around ``module`` whatever its framework: a torch module too, without Composer's torch
        wrapper (the Trainer's own path for a bare torch module, whose ``state.model`` is then the module)."""
        task = object.__new__(cls)
        task.__init__(module, *args, **kwargs)
        return task

    def __init__(self, module: Any, num_classes: int | None = None,
                 loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = soft_cross_entropy, *,
                 val_metrics: Metric | list[Metric] | Mapping[str, Metric] | None = None,
                 train_metrics: Metric | list[Metric] | Mapping[str, Metric] | None = None):
        super().__init__(module)
        self.num_classes = num_classes if num_classes is not None else _infer_num_classes(module)
        self.loss_fn = loss_fn
        if val_metrics is None:
            val_metrics = [CrossEntropy(), MulticlassAccuracy(self.num_classes)]
        self.val_metrics = check_metrics(val_metrics, "ComposerClassifier(val_metrics=...)")
        self.train_metrics = check_metrics(MulticlassAccuracy(self.num_classes) if train_metrics is None
                                           else train_metrics, "ComposerClassifier(train_metrics=...)")

    def loss(self, outputs: jax.Array, batch: Batch) -> jax.Array:
        return self.loss_fn(*self._classes_last(outputs, batch[self.target_key]))

    def get_metrics(self, is_train: bool = False) -> dict[str, Metric]:
        """Composer's: ``train_metrics`` (default ``MulticlassAccuracy``) with ``is_train``, else ``val_metrics``."""
        return dict(self.train_metrics if is_train else self.val_metrics)

    def metric_inputs(self, outputs, batch: Batch):
        return self._classes_last(outputs, batch[self.target_key])

    def _classes_last(self, outputs, target):
        """A bridged torch model keeps torch's layout, class scores on axis 1 (``(N, C, H, W)`` for segmentation,
        as Composer's ``F.cross_entropy`` reads them); the loss and metrics here read classes last. Dense targets
        shaped like the outputs (label smoothing's, MixUp's) move with them."""
        if jnp.ndim(outputs) <= 2 or self._pure is None or self._pure.bridged is None:
            return outputs, target
        if jnp.shape(target) == jnp.shape(outputs):
            target = jnp.moveaxis(target, 1, -1)
        return jnp.moveaxis(outputs, 1, -1), target


class _TokenPredictionTask(Task):
    """What the language-model tasks share: a per-token target (``ignore_index`` where none), each sequence's mean
    cross-entropy as its loss, and metrics over (logits, targets). Subclasses say where the targets are."""

    ignore_index: int
    eval_metrics: dict

    def _targets(self, logits: jax.Array, batch: Batch) -> jax.Array:
        raise NotImplementedError

    def loss(self, outputs: jax.Array, batch: Batch) -> jax.Array:
        return masked_sequence_ce(outputs, self._targets(outputs, batch), self.ignore_index)

    def get_metrics(self, is_train: bool = False) -> dict[str, Metric]:
        return dict(self.eval_metrics)

    def metric_inputs(self, outputs, batch: Batch):
        return outputs, self._targets(outputs, batch)


class ComposerCausalLM(_TokenPredictionTask):
    """Batch ``{'input_ids': (B, T+1) int}``: the model reads ``[:, :-1]`` and predicts ``[:, 1:]``.

    An optional ``'labels'`` entry ``(B, T)``, already aligned with the logits, replaces ``input_ids[:, 1:]`` as
    the targets (e.g. to mask prompt tokens with ``ignore_index``). The training loss is each sequence's mean over
    its non-ignored positions (a fully ignored sequence contributes 0). ``eval_metrics`` default to per-token
    ``LanguageCrossEntropy``, ``LanguagePerplexity`` and ``MaskedAccuracy``: every non-ignored token counts once,
    whichever sequence it is in.
    """

    input_key = "input_ids"

    def __init__(self, module: Any, ignore_index: int = -100, *,
                 eval_metrics: Metric | list[Metric] | Mapping[str, Metric] | None = None):
        super().__init__(module)
        self.ignore_index = ignore_index
        if eval_metrics is None:
            eval_metrics = [LanguageCrossEntropy(ignore_index), LanguagePerplexity(ignore_index),
                            MaskedAccuracy(ignore_index)]
        self.eval_metrics = check_metrics(eval_metrics, "ComposerCausalLM(eval_metrics=...)")

    def model_inputs(self, batch: Batch):
        return batch[self.input_key][:, :-1]

    def _targets(self, logits: jax.Array, batch: Batch) -> jax.Array:
        targets = batch["labels"] if "labels" in batch else batch[self.input_key][:, 1:]
        if targets.shape != logits.shape[:2]:
            raise ValueError(f"ComposerCausalLM: targets {targets.shape} do not match logits {logits.shape[:2]}; "
                             "'input_ids' must be (B, T+1) and 'labels', if given, (B, T).")
        return targets

    def num_tokens(self, batch: Batch) -> int:
        b, t1 = batch[self.input_key].shape
        return int(b * (t1 - 1))


class ComposerMaskedLM(_TokenPredictionTask):
    """Masked-LM pretraining (BERT): batch ``{'input_ids': (B, T) int, 'attention_mask': (B, T), 'labels': (B, T)}``
    with ``labels`` the original token at masked positions and ``ignore_index`` (-100) elsewhere, as Hugging Face's
    ``DataCollatorForLanguageModeling`` (or :func:`jaxcomposer.data.mlm.mask_tokens`) produces them.

    The model is called with one mapping ``{'input_ids', 'attention_mask', 'token_type_ids'}`` (those present;
    :class:`jaxcomposer.models.BERT` accepts it) because the pure-model protocol passes a single input; a torch
    module gets ``input_ids`` only. The training loss is each sequence's mean cross-entropy over its masked
    positions (a sequence without any contributes 0); Hugging Face's loss is the mean over all masked tokens of the
    batch, which weights sequences by their number of masked tokens. ``eval_metrics`` default to
    ``LanguageCrossEntropy`` and ``MaskedAccuracy``, per masked token over the whole evaluation, as Composer's.
    """

    input_key = "input_ids"
    target_key = "labels"
    model_input_keys = ("input_ids", "attention_mask", "token_type_ids")

    def __init__(self, module: Any, ignore_index: int = -100, *,
                 eval_metrics: Metric | list[Metric] | Mapping[str, Metric] | None = None):
        super().__init__(module)
        self.ignore_index = ignore_index
        if eval_metrics is None:
            eval_metrics = [LanguageCrossEntropy(ignore_index), MaskedAccuracy(ignore_index)]
        self.eval_metrics = check_metrics(eval_metrics, "ComposerMaskedLM(eval_metrics=...)")

    def model_inputs(self, batch: Batch):
        if adapters.is_foreign_model(self.source):
            return batch[self.input_key]
        return {k: batch[k] for k in self.model_input_keys if k in batch}

    def _targets(self, logits: jax.Array, batch: Batch) -> jax.Array:
        targets = batch[self.target_key]
        if targets.shape != logits.shape[:2]:
            raise ValueError(f"ComposerMaskedLM: batch['labels'] {targets.shape} must match the logits' "
                             f"(batch, sequence) axes {logits.shape[:2]}.")
        return targets

    def num_tokens(self, batch: Batch) -> int:
        return int(batch[self.input_key].size)
