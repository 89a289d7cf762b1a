"""Composer's model protocol on torch modules: a ``ComposerModel``-style module and ``HuggingFaceModel``.

A Composer user's model is an ``nn.Module`` with ``forward(batch)`` and ``loss(outputs, batch)`` (and optionally
``eval_forward(batch, outputs=None)``, ``get_metrics(is_train)`` and ``update_metric(batch, outputs, metric)``).
:class:`TorchComposerTask` runs such a module in jaxcomposer's Trainer: the forward is exported (train graph:
``forward``; eval graph: ``eval_forward``) and so is the model's own ``loss``, which is what is differentiated. Evaluation runs the eval graph in JAX and feeds the outputs, as torch tensors, to the
model's own metrics on the host (Composer's ``update_metric``), so metrics mean exactly what they mean in Composer.

Batches reach the model as the loader made them: an ``(input, target)`` pair stays a pair, a dict stays a dict with
the same keys (a dict whose keys are exactly ``input`` and ``target`` is taken for a pair).
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree as torch_pytree

from jaxcomposer.core.model import Task
from jaxcomposer.metrics.base import Metric


def is_composer_model(module: Any) -> bool:
    """Composer's protocol: a torch module whose ``forward`` takes the whole batch and that has its own ``loss``."""
    return isinstance(module, torch.nn.Module) and callable(getattr(module, "loss", None))


class _Forward(torch.nn.Module):
    """The exported forward: the batch comes in as tensors (in the loader's order), is rebuilt into the loader's
    structure and goes through ``forward`` (train graph) or ``eval_forward`` (eval graph)."""

    def __init__(self, model: torch.nn.Module, keys: tuple[str, ...] | None):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *tensors):
        batch = _rebuild(tensors, self.keys)
        eval_forward = getattr(self.model, "eval_forward", None)
        if self.training or not callable(eval_forward):
            return self.model(batch)
        return eval_forward(batch)


class _Loss(torch.nn.Module):
    """The exported loss: ``model.loss(outputs, batch)`` on tensors in, a scalar out."""

    def __init__(self, model: torch.nn.Module, keys, out_spec, n_outputs: int):
        super().__init__()
        self.loss_of = model.loss  # a bound method: the model's parameters are not this module's
        self.keys, self.out_spec, self.n_outputs = keys, out_spec, n_outputs

    def forward(self, *tensors):
        outputs = torch_pytree.tree_unflatten(list(tensors[:self.n_outputs]), self.out_spec)
        return self.loss_of(outputs, _rebuild(tensors[self.n_outputs:], self.keys))


def _rebuild(tensors, keys):
    return tuple(tensors) if keys is None else dict(zip(keys, tensors))


def _kind(x) -> str:
    """numpy's dtype kind, with bfloat16 (amp_bf16 casts the inputs; numpy calls it kind 'V') a float."""
    return "f" if jnp.issubdtype(x.dtype, jnp.floating) else np.dtype(x.dtype).kind


def _example(x) -> torch.Tensor:
    """A zero torch tensor shaped like ``x`` (an abstract JAX value); integers as int64, torch's index type."""
    dtype = np.dtype(x.dtype)
    dtype = np.int64 if np.issubdtype(dtype, np.integer) else np.float32 if dtype.name == "bfloat16" else dtype
    return torch.from_numpy(np.zeros(x.shape, dtype))


class TorchComposerTask(Task):
    """A torch ``ComposerModel``-style module as a jaxcomposer :class:`Task` (built by the torch adapter when the
    Trainer is given a torch module with a ``loss`` method).

    The forward (train and eval graphs) is exported from the first batch. The loss is exported separately, when a
    train step is traced, for the outputs and batch it is called with there: so loss-slot methods that hand it
    other targets (LabelSmoothing's dense targets) get a loss graph for those, as Composer calls ``model.loss`` on
    the batch the methods changed. The loss must read only ``outputs`` and ``batch`` (not the parameters). It is a
    batch mean (Composer's convention), spread over the batch as a per-example value, so gradient accumulation
    over equal microbatches gives the full-batch gradient. Methods that change the batch's targets before the
    forward (MixUp, CutMix without ``interpolate_loss``) change the forward's input signature and are refused.
    """

    def __init__(self, model: torch.nn.Module):
        if not is_composer_model(model):
            raise TypeError(f"TorchComposerTask: expected a torch module with forward(batch) and loss(outputs, batch), "
                            f"got {type(model).__name__}")
        self.keys: tuple[str, ...] | None = None  # None: the loader yields (input, target) tuples
        self._losses: dict = {}  # (output structure, shapes and dtypes) -> the exported loss graph
        super().__init__(model)

    def note_raw_batch(self, raw: Any) -> None:
        """The Trainer shows the task one batch as the loader yields it, so the model gets that structure back: an
        ``(input, target)`` pair (which a wrapped torch DataLoader names ``{'input', 'target'}``) as the pair, any
        other dict as that dict."""
        pair = isinstance(raw, (tuple, list)) or (isinstance(raw, Mapping) and set(raw) == {"input", "target"})
        self.keys = None if pair else tuple(raw)

    def _tensors(self, batch: Mapping[str, Any]) -> tuple:
        return (batch["input"], batch["target"]) if self.keys is None else tuple(batch[k] for k in self.keys)

    def bind(self, batch: Mapping[str, Any]) -> "TorchComposerTask":
        if self._pure is None:
            from .module import from_torch
            example = tuple(torch.from_numpy(np.array(x)) for x in self._tensors(batch))
            bridged = from_torch(_Forward(self.source, self.keys), example, dynamic_batch=True)
            model = self.source

            def write_back(params, state):  # into the wrapper, which holds the user's module: return that module
                bridged.to_torch(params, state)
                return model

            self._pure = dataclasses.replace(bridged.as_pure_model(), write_back=write_back)
            self._signature = [(np.shape(x), _kind(x)) for x in self._tensors(batch)]
        return self

    def with_model(self, model: Any) -> "TorchComposerTask":
        new = super().with_model(model)
        new._losses = {}
        return new

    def forward(self, params, state, batch, *, train: bool, key=None):
        tensors = self._tensors(batch)
        for i, (x, (shape, kind)) in enumerate(zip(tensors, self._signature)):
            # other sizes of the same rank and kind (ProgressiveResizing's smaller images) get an export of their
            # own (BridgedModel); a new rank or kind is a method's edit the model cannot take (MixUp's dense targets)
            if np.ndim(x) != len(shape) or _kind(x) != kind:
                raise ValueError(
                    f"{type(self.source).__name__}: batch entry {i} reaches the forward as {np.shape(x)} "
                    f"{np.dtype(x.dtype)}, the model was exported for (*, {', '.join(map(str, shape[1:]))}) of kind "
                    f"{kind!r}. A method changed the batch before the forward (MixUp/CutMix make dense targets): "
                    "with a ComposerModel, use MixUp(interpolate_loss=True) or wrap the bare network in "
                    "ComposerClassifier.")
        return self.pure.apply(params, state, tensors, train=train, key=key)

    def loss(self, outputs, batch) -> jax.Array:
        from .module import from_torch
        leaves, treedef = jax.tree_util.tree_flatten(outputs)
        tensors = self._tensors(batch)
        sig = (treedef, tuple((x.shape, np.dtype(x.dtype)) for x in (*leaves, *tensors)))
        if sig not in self._losses:
            example_out = [_example(x) for x in leaves]
            out_spec = torch_pytree.tree_structure(jax.tree_util.tree_unflatten(treedef, example_out))
            graph = from_torch(_Loss(self.source, self.keys, out_spec, len(leaves)),
                               tuple(example_out) + tuple(_example(x) for x in tensors), modes=(True,))
            if graph.params:
                raise NotImplementedError(
                    f"{type(self.source).__name__}.loss reads the model's parameters ({', '.join(sorted(graph.params))}"
                    "); jaxcomposer differentiates the loss graph apart from the forward, so put such terms in "
                    "forward's outputs")
            self._losses[sig] = graph
        graph = self._losses[sig]
        loss, _ = graph.apply({}, graph.buffers, None, *leaves, *tensors, train=True)
        n = jax.tree_util.tree_leaves(tensors)[0].shape[0]
        return jnp.broadcast_to(jnp.asarray(loss, jnp.float32), (n,))

    def num_samples(self, batch) -> int:
        return int(jax.tree_util.tree_leaves(self._tensors(batch))[0].shape[0])

    def user_param_name(self, name: str) -> str:
        return name.removeprefix("model.")  # the exported forward holds the user's module as ``model``

    def host_metrics(self) -> "_HostMetrics":
        return _HostMetrics(self.source, self.keys)


class _HostMetrics:
    """Composer's evaluation: ``get_metrics(is_train=False)``, ``update_metric`` per batch, ``compute`` at the end."""

    def __init__(self, model: torch.nn.Module, keys):
        get = getattr(model, "get_metrics", None)
        self.metrics = {name: TorchStyleMetric(m) if isinstance(m, Metric) else m
                        for name, m in copy.deepcopy(dict(get(is_train=False) if callable(get) else {})).items()}
        self.model, self.keys = model, keys

    def update(self, batch: Mapping[str, Any], outputs: Any) -> None:
        tensors = tuple(torch.from_numpy(np.array(x)) for x in
                        ((batch["input"], batch["target"]) if self.keys is None else (batch[k] for k in self.keys)))
        torch_batch = tensors if self.keys is None else dict(zip(self.keys, tensors))
        torch_outputs = jax.tree.map(lambda x: torch.from_numpy(np.array(x)), outputs)
        update = getattr(self.model, "update_metric", None)
        for metric in self.metrics.values():
            if callable(update):
                update(torch_batch, torch_outputs, metric)
            else:  # ComposerClassifier's rule: the metric compares the outputs with the batch's targets
                metric.update(torch_outputs, tensors[1] if self.keys is None else torch_batch["labels"])

    def compute(self) -> dict[str, float]:
        return {name: float(m.compute()) for name, m in self.metrics.items()}


class TorchStyleMetric:
    """A jaxcomposer metric (``jaxcomposer.metrics``: pure sums) as the stateful torchmetrics-style object a
    Composer model's ``update_metric`` expects: ``update(preds, target)`` with torch tensors adds the batch's sums,
    ``compute()`` returns a tensor, ``reset()`` starts over. So ``from jaxcomposer.metrics import CrossEntropy``
    inside a torch ``ComposerModel.get_metrics`` works as Composer's ``composer.metrics.CrossEntropy`` does (the
    value is jaxcomposer's: a mean over examples, not over batches)."""

    def __init__(self, metric: Metric):
        self.metric = metric
        self.reset()

    def reset(self) -> None:
        self.state = jax.tree.map(np.asarray, self.metric.init())

    def update(self, preds: Any, target: Any) -> None:
        preds = {k: _host(v) for k, v in preds.items()} if isinstance(preds, Mapping) else _host(preds)
        target = _host(target)
        batch = self.metric.update(self.metric.init(), preds, target, np.ones((np.shape(target)[0],), np.float32))
        self.state = jax.tree.map(lambda a, b: np.asarray(a, np.float64) + np.asarray(b, np.float64), self.state,
                                  batch)

    def compute(self) -> torch.Tensor:
        return torch.tensor(float(self.metric.compute(self.state)))


def _host(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class ComposerModel(torch.nn.Module):
    """Composer's ``ComposerModel`` base class for torch models: subclass it (or any ``nn.Module`` with these
    methods) and pass the instance to jaxcomposer's ``Trainer`` as you would to Composer's.

    ``forward(batch)`` gets the batch as the loader yields it; ``loss(outputs, batch)`` returns a scalar tensor;
    ``eval_forward``, ``get_metrics`` and ``update_metric`` have Composer's defaults.
    """

    def forward(self, batch):
        raise NotImplementedError(f"{type(self).__name__}.forward(batch) must be implemented")

    def loss(self, outputs, batch, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}.loss(outputs, batch) must be implemented")

    def eval_forward(self, batch, outputs=None):
        return outputs if outputs is not None else self.forward(batch)

    def get_metrics(self, is_train: bool = False) -> dict:
        return {}

    def update_metric(self, batch, outputs, metric) -> None:
        raise NotImplementedError(f"{type(self).__name__}.update_metric(batch, outputs, metric) must be implemented "
                                  "when get_metrics returns metrics")


class HuggingFaceModel(ComposerModel):
    """Composer's ``HuggingFaceModel(model, tokenizer=None, use_logits=True, metrics=None, eval_metrics=None,
    shift_labels=None)`` for ``transformers`` models.

    Batches are dicts (``input_ids``, ``attention_mask``, ``labels``, ...) handed to ``model(**batch)``; the loss
    is the model's own ``outputs.loss`` (so ``labels`` must be in the batch); ``eval_forward`` returns the logits
    when ``use_logits``. ``metrics``/``eval_metrics`` are torchmetrics objects or ``jaxcomposer.metrics`` ones (a
    list or a dict), updated with ``(logits, labels)`` as Composer's are. ``tokenizer`` is kept for the user
    (saving, generation). ``shift_labels`` (None: True for a causal LM, as Composer infers it) shifts the labels the
    metrics see by one position, as Composer does; the loss is the model's own, which shifts them itself.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None, use_logits: bool = True,
                 metrics: Any = None, eval_metrics: Any = None, shift_labels: bool | None = None):
        super().__init__()
        self.model, self.tokenizer, self.use_logits, self.shift_labels = model, tokenizer, use_logits, shift_labels
        self.train_metrics = named_metrics(metrics)
        self.val_metrics = named_metrics(eval_metrics) if eval_metrics is not None else copy.deepcopy(self.train_metrics)

    def forward(self, batch: Mapping[str, Any]):
        if not isinstance(batch, Mapping):
            raise TypeError(f"HuggingFaceModel: batches must be dicts of tensors (input_ids, attention_mask, "
                            f"labels, ...), got {type(batch).__name__}")
        kwargs = dict(batch)
        if "use_cache" in inspect.signature(self.model.forward).parameters:
            kwargs.setdefault("use_cache", False)  # a key/value cache is for generation, not for a training step
        return self.model(**kwargs)

    def loss(self, outputs, batch):
        loss = outputs["loss"] if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
        if loss is None:
            raise ValueError("HuggingFaceModel: the model returned no loss; put 'labels' in the batch so the "
                             "Hugging Face model computes its own loss")
        return loss

    def eval_forward(self, batch, outputs=None):
        outputs = self.forward(batch) if outputs is None else outputs
        return outputs["logits"] if self.use_logits else outputs

    def get_metrics(self, is_train: bool = False) -> dict:
        return self.train_metrics if is_train else self.val_metrics

    def update_metric(self, batch, outputs, metric) -> None:
        labels = batch["labels"]
        if self._shifts_labels():  # as Composer: a causal LM's position t predicts label t + 1
            labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
        metric.update(outputs, labels)

    def _shifts_labels(self) -> bool:
        """``shift_labels``, or when None (Composer's default) whether the model is a causal LM."""
        if self.shift_labels is not None:
            return bool(self.shift_labels)
        return type(self.model).__name__.endswith(("ForCausalLM", "LMHeadModel"))


def named_metrics(metrics: Any) -> dict:
    """Metrics by name, as Composer's MetricCollection names them: a dict (or MetricCollection) keeps its keys, a
    metric or a list of them goes by class name (a ``TorchStyleMetric`` by its jaxcomposer metric's)."""
    if metrics is None:
        return {}
    if isinstance(metrics, Mapping) or hasattr(metrics, "items"):
        return dict(metrics.items())
    metrics = list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
    return {type(getattr(m, "metric", m)).__name__: m for m in metrics}
