"""NoOpModel.

Method card
-----------
**What it does.** Replaces the whole model (the task) with a trivial one of a single parameter, so a run measures
everything but the model: data loading, host-side augmentation, the step's overhead. The replacement's forward
ignores the inputs and returns ``targets * weights`` (``weights = [1.5]``), its loss is the mean squared error
against the targets, and its evaluation metric compares the targets with themselves.

**When it helps.** Never for accuracy: it is a profiling tool. Train once with it and once without; if the
NoOpModel run is not much faster, the data pipeline is the bottleneck.

**Hyperparameters.** None.

**Exact Composer semantics.** As Composer's ``NoOpModelClass``: one parameter ``weights`` of shape ``(1,)``,
initialised to 1.5, so the loss ``mean((y * w - y) ** 2)`` is not zero and ``weights`` moves towards 1 under
gradient descent (its gradient is ``2 (w - 1) mean(y ** 2)``); outputs have the targets' shape (integer labels
are read as floats); ``num_classes`` is kept from the replaced model; evaluation feeds ``(targets, targets)`` to
its metric (Composer's ``eval_forward`` returns the targets), logged as ``BinaryAccuracy`` as Composer's.
Differences, with the reason: the per-example loss is the squared error averaged over each example's trailing
axes, so the batch mean is Composer's ``F.mse_loss``; ``BinaryAccuracy`` here is the fraction of examples whose
prediction equals the target (1.0, as Composer's on its 0/1 labels; torchmetrics' ``BinaryAccuracy`` raises on
multiclass labels); the targets are the task's ``target_key`` entry of the batch (Composer unpacks ``x, y =
batch``); a batch without it (a language model's ``{'input_ids': ...}``, which Composer's ``x, y = batch``
cannot unpack) uses what the original task feeds its model (``model_inputs(batch)``) in its place. There is no
functional form, as in Composer: the replacement is a whole task (its forward reads the batch's targets, not the
model's inputs), so no module-to-module function fits; the :class:`NoOpModelClass` task is public for direct use.

**How it plugs in.** ``model`` slot (host, once, before the optimizer is built, so the optimizer only ever sees
the one parameter: Composer re-points its optimizer with ``update_params_in_optimizer``). It works the same for
NNX and torch tasks: the replacement is native (an NNX module), so a torch module is never exported. As in
Composer, the Trainer's model (``state.model``) becomes the replacement; the user's module is left as it was.
Checkpoints of such a run hold only ``weights`` (Composer's ``required_on_load``).

**Reference.** Composer: ``composer/algorithms/no_op_model``.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.core.method import Method, MethodEntry
from jaxcomposer.core.model import Batch, Task
from jaxcomposer.metrics import MeanMetric, Metric

__all__ = ["NoOpModel", "NoOpModelClass", "NoOpModule"]


class NoOpModule(nnx.Module):
    """``targets -> targets * weights`` with one parameter, ``weights = [1.5]`` (Composer's)."""

    def __init__(self):
        self.weights = nnx.Param(jnp.array([1.5], jnp.float32))

    def __call__(self, targets: jax.Array, *, train: bool = False, key: jax.Array | None = None) -> jax.Array:
        del train, key  # no dropout, no BatchNorm
        w = self.weights[...]
        w = w.reshape((1,) * targets.ndim) if targets.ndim else w[0]  # torch broadcasts the (1,) weight; jax is strict
        return (targets.astype(w.dtype) * w).astype(jnp.float32)


def _per_example_mean(values: jax.Array) -> jax.Array:
    return values.reshape(values.shape[0], -1).mean(-1)


def _exact_match(preds: jax.Array, target: jax.Array) -> jax.Array:
    return _per_example_mean((jnp.asarray(preds) == jnp.asarray(target)).astype(jnp.float32))


class NoOpModelClass(Task):
    """Composer's ``NoOpModelClass`` as a task: the model reads the batch's targets, the loss is their squared
    error (per example), the metric ``BinaryAccuracy`` compares the targets with themselves."""

    def __init__(self, original_model: Any):
        super().__init__(NoOpModule())
        self.input_key = getattr(original_model, "input_key", "input")  # counts examples, as the original task
        self.target_key = getattr(original_model, "target_key", "target")
        self.num_classes = getattr(original_model, "num_classes", None)
        # a batch without targets (a language model's {'input_ids'}) stands in with what the original model reads
        self._original_inputs = getattr(original_model, "model_inputs", None)
        self.metric = MeanMetric(_exact_match, label="BinaryAccuracy")

    def _targets(self, batch: Batch) -> jax.Array:
        if self.target_key in batch:
            return batch[self.target_key]
        if self._original_inputs is not None:
            return self._original_inputs(batch)
        raise ValueError(f"NoOpModel: the batch has no {self.target_key!r} entry (it has {sorted(batch)}); the "
                         "replacement model returns the targets times its weight, as Composer's (x, y) batches.")

    def model_inputs(self, batch: Batch):
        return self._targets(batch)

    def loss(self, outputs: jax.Array, batch: Batch) -> jax.Array:
        return _per_example_mean((outputs - self._targets(batch).astype(jnp.float32)) ** 2)

    def get_metrics(self, is_train: bool = False) -> dict[str, Metric]:
        return {self.metric.name: self.metric}

    def metric_inputs(self, outputs, batch: Batch):
        target = self._targets(batch)
        return target, target  # Composer's eval_forward returns the targets


def NoOpModel() -> Method:
    """Composer's ``NoOpModel()`` as a :class:`Method` (``model`` slot): the task becomes a
    :class:`NoOpModelClass`."""

    def model_fn(task, ctx):
        del ctx
        return NoOpModelClass(task)

    return Method(name="NoOpModel", model=model_fn, description="NoOpModel()")


ENTRY = MethodEntry(registry_name="no_op_model", factory=NoOpModel)
