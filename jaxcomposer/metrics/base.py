"""The metric protocol: pure ``init / update / compute`` over states that are sums.

A metric's state is a small pytree of arrays holding sums (correct predictions, summed losses, counted tokens,
per-class areas). That one rule gives everything else:

- ``update(state, preds, target, weight) -> state`` is pure and jit-safe: it adds this batch's sums to ``state``.
  ``weight`` is one value per example, 1 for a real example and 0 for the padding that fills the last batch, so
  padded examples count for nothing;
- states merge by addition (``merge``): batches add up exactly, in any order, and a batch sharded over devices sums
  over all of them inside the jitted step (the reduction is global), so no separate sync step exists;
- ``compute(state)`` turns the merged sums into the reported value, once, at the end of an evaluation; it works on
  numpy (the host's float64 sums) and on JAX arrays alike (``array_namespace``).

The Trainer's eval step returns each batch's sums (``update(init(), ...)``) and adds them on the host in float64, so
long evaluations lose nothing to float32 accumulation. ``name`` is what logs call the metric
(``metrics/eval/<name>``); the built-in metrics use Composer's class names.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

State = Any  # a pytree of arrays (sums)


class Metric(abc.ABC):
    """A metric over batches; subclasses are frozen dataclasses (hyperparameters only, never running values)."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @abc.abstractmethod
    def init(self) -> State:
        """The state before any batch: zeros."""

    @abc.abstractmethod
    def update(self, state: State, preds: Any, target: Any, weight: jax.Array) -> State:
        """``state`` plus this batch's sums; ``weight`` is ``(B,)`` with 0 for padded examples."""

    @abc.abstractmethod
    def compute(self, state: State) -> jax.Array:
        """The reported value from the merged sums."""


def merge(a: State, b: State) -> State:
    """Two states of one metric as one (their sums added)."""
    return jax.tree.map(lambda x, y: x + y, a, b)


def batch_states(metrics: Mapping[str, Metric], preds: Any, target: Any, weight: jax.Array) -> dict[str, State]:
    """Each metric's sums for one batch: what the jitted eval step returns."""
    return {name: m.update(m.init(), preds, target, weight) for name, m in metrics.items()}


def sum_states(parts: Iterable[Mapping[str, State]]) -> dict[str, State]:
    """The batches' states added up on the host, in float64 (exact counts, no float32 drift over long runs)."""
    total: dict[str, State] = {}
    for part in parts:
        part = jax.tree.map(lambda x: np.asarray(x, np.float64), dict(part))
        total = part if not total else {k: merge(total[k], v) for k, v in part.items()}
    return total


def compute_all(metrics: Mapping[str, Metric], states: Mapping[str, State]) -> dict[str, float]:
    return {name: float(m.compute(states[name])) for name, m in metrics.items()}


def array_namespace(state: State):
    """``numpy`` for the host's float64 sums (``compute`` keeps their precision), ``jax.numpy`` for device arrays
    and inside a trace."""
    return jnp if any(isinstance(x, jax.Array) for x in jax.tree.leaves(state)) else np


def example_weight(weight: jax.Array, like: jax.Array) -> jax.Array:
    """``weight`` (B,) broadcast over the trailing axes of ``like`` (B, ...): tokens and pixels of a padded example
    weigh 0."""
    w = jnp.asarray(weight, jnp.float32)
    return jnp.broadcast_to(w.reshape(w.shape + (1,) * (like.ndim - w.ndim)), like.shape)


def logits_of(preds: Any) -> jax.Array:
    """Model outputs as logits: a Hugging Face style mapping gives its ``'logits'`` entry, as Composer's metrics
    accept."""
    if isinstance(preds, Mapping):
        if "logits" not in preds:
            raise ValueError(f"metric: the model's outputs are a mapping without 'logits' (keys {sorted(preds)}); "
                             "a metric needs the logits")
        preds = preds["logits"]
    return jnp.asarray(preds)


@dataclasses.dataclass(frozen=True)
class MeanMetric(Metric):
    """The weighted mean of a per-example value ``fn(preds, target) -> (B,)`` (a loss, a custom score), logged as
    ``label``. Composer's ``LossMetric`` averages per batch; this averages per example, so an uneven last batch
    weighs what its examples weigh."""

    fn: Callable[[Any, Any], jax.Array]
    label: str = "MeanMetric"

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(f"MeanMetric: fn must be callable (preds, target) -> (B,) values, got {self.fn!r}")

    @property
    def name(self) -> str:
        return self.label

    def init(self) -> State:
        return {"sum": jnp.zeros((), jnp.float32), "count": jnp.zeros((), jnp.float32)}

    def update(self, state, preds, target, weight):
        values = jnp.asarray(self.fn(preds, target), jnp.float32)
        w = jnp.asarray(weight, jnp.float32)
        if values.shape != w.shape:
            raise ValueError(f"MeanMetric {self.label!r}: fn returned shape {values.shape}, expected one value per "
                             f"example {w.shape}")
        return merge(state, {"sum": (values * w).sum(), "count": w.sum()})

    def compute(self, state):
        return state["sum"] / array_namespace(state).maximum(state["count"], 1.0)


def check_metrics(metrics: Any, where: str) -> dict[str, Metric]:
    """``metrics`` (a Metric, a list of them, or a name -> Metric mapping) as a dict keyed by name; anything else
    (a torchmetrics object, say) is refused with the jaxcomposer metric to use instead."""
    if metrics is None:
        return {}
    if isinstance(metrics, Metric):
        metrics = [metrics]
    items = list(metrics.items()) if isinstance(metrics, Mapping) else [(getattr(m, "name", None), m) for m in metrics]
    out: dict[str, Metric] = {}
    for key, m in items:
        if not isinstance(m, Metric):
            suggestion = type(m).__name__
            raise TypeError(f"{where}: {suggestion} is not a jaxcomposer metric; metrics run inside the jitted eval "
                            f"step, so they must be jaxcomposer.metrics objects (e.g. jaxcomposer.metrics."
                            f"{suggestion if suggestion in _BUILTIN_NAMES else 'MulticlassAccuracy'}()). A torch "
                            "ComposerModel keeps its torchmetrics through get_metrics().")
        if key in out:
            raise ValueError(f"{where}: two metrics are named {key!r}; pass a dict to name them apart")
        out[key] = m
    return out


# the names of the metrics this package defines, for check_metrics' suggestion
_BUILTIN_NAMES = ("MulticlassAccuracy", "CrossEntropy", "BinaryF1Score", "LanguageCrossEntropy",
                  "LanguagePerplexity", "MaskedAccuracy", "MIoU", "Dice")
