"""Composer-style task wrappers: what to feed the model, the per-example loss and the per-example metrics."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.core.model import Batch, Task, soft_cross_entropy


def _infer_num_classes(module: Any) -> int | None:
    """The head width when the model says it (our native models carry ``num_classes``); None otherwise."""
    n = getattr(module, "num_classes", None) if isinstance(module, nnx.Module) else None
    return n if isinstance(n, int) else None


class ComposerClassifier(Task):
    """Batch ``{'input': x, 'target': y}`` with ``y`` int ``(B,)`` or soft ``(B, C)``.

    ``loss_fn(logits, target) -> (B,)`` defaults to soft cross-entropy, so MixUp/CutMix/label smoothing can hand
    dense targets to the same task. Metrics always report plain cross-entropy, whatever the training loss is.
    """

    input_key = "input"
    target_key = "target"
    eval_metric_names = ("accuracy", "cross_entropy")

    def __init__(self, module: Any, num_classes: int | None = None,
                 loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = soft_cross_entropy):
        super().__init__(module)
        self.num_classes = num_classes if num_classes is not None else _infer_num_classes(module)
        self.loss_fn = loss_fn

    def loss(self, outputs: jax.Array, batch: Batch) -> jax.Array:
        return self.loss_fn(outputs, batch[self.target_key])

    def metrics(self, outputs: jax.Array, batch: Batch) -> dict[str, jax.Array]:
        target = batch[self.target_key]
        labels = target if jnp.issubdtype(target.dtype, jnp.integer) else jnp.argmax(target, axis=-1)
        correct = (jnp.argmax(outputs, axis=-1) == labels).astype(jnp.float32)
        return {"accuracy": correct, "cross_entropy": soft_cross_entropy(outputs, target)}


class ComposerCausalLM(Task):
    """Batch ``{'input_ids': (B, T+1) int}``: the model reads ``[:, :-1]`` and predicts ``[:, 1:]``.

    An optional ``'labels'`` entry ``(B, T)``, already aligned with the logits, replaces ``input_ids[:, 1:]`` as
    the targets (e.g. to mask prompt tokens with ``ignore_index``). Loss and metrics are per-sequence means over
    the non-ignored positions (a fully ignored sequence contributes 0).
    """

    input_key = "input_ids"
    eval_metric_names = ("cross_entropy", "accuracy")

    def __init__(self, module: Any, ignore_index: int = -100):
        super().__init__(module)
        self.ignore_index = ignore_index

    def model_inputs(self, batch: Batch):
        return batch[self.input_key][:, :-1]

    def _targets(self, logits: jax.Array, batch: Batch) -> jax.Array:
        targets = batch["labels"] if "labels" in batch else batch[self.input_key][:, 1:]
        if targets.shape != logits.shape[:2]:
            raise ValueError(f"ComposerCausalLM: targets {targets.shape} do not match logits {logits.shape[:2]}; "
                             "'input_ids' must be (B, T+1) and 'labels', if given, (B, T).")
        return targets

    def _token_stats(self, logits: jax.Array, batch: Batch):
        targets = self._targets(logits, batch)
        mask = targets != self.ignore_index
        safe = jnp.where(mask, targets, 0)
        ce = soft_cross_entropy(logits, safe)  # (B, T)
        correct = (jnp.argmax(logits, axis=-1) == safe).astype(jnp.float32)
        m = mask.astype(jnp.float32)
        count = jnp.maximum(m.sum(-1), 1.0)
        return (ce * m).sum(-1) / count, (correct * m).sum(-1) / count

    def loss(self, outputs: jax.Array, batch: Batch) -> jax.Array:
        return self._token_stats(outputs, batch)[0]

    def metrics(self, outputs: jax.Array, batch: Batch) -> dict[str, jax.Array]:
        ce, acc = self._token_stats(outputs, batch)
        return {"cross_entropy": ce, "accuracy": acc}

    def finalize(self, means: Mapping[str, float]) -> dict[str, float]:
        out = dict(means)
        if "cross_entropy" in out:
            out["perplexity"] = float(jnp.exp(out["cross_entropy"]))
        return out

    def num_tokens(self, batch: Batch) -> int:
        b, t1 = batch[self.input_key].shape
        return int(b * (t1 - 1))
