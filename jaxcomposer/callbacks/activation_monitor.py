"""``ActivationMonitor``: Composer's per-module activation statistics, from one extra compiled forward.

Composer attaches a forward hook to every module at the interval's batches; the hooks log statistics of each
module's inputs and outputs during that batch's training forward. Here the train step is compiled and has no hooks,
so when the interval is due (at BATCH_END) the callback runs one more forward of the batch just trained, with the
run's current weights (after that batch's update), that returns every module's values, reduces them to the
statistics on the device and brings back only the scalars: one compiled call and one small transfer per due
batch, nothing at all on the others.

The extra forward runs in eval mode (``train=False``): it draws no dropout masks (so it needs no key and the
numbers are reproducible), and BatchNorm normalizes with its running statistics without updating them (the
forward's state is thrown away, so train mode could not update them either). Composer's hooks see the train-mode
forward: with dropout or BatchNorm the values differ accordingly.
"""
from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.core import adapters
from jaxcomposer.core.events import Callback
from jaxcomposer.core.time import Time, TimeUnit

__all__ = ["ActivationMonitor", "activation_stats"]

STATS = ("l2_norm", "average", "kurtosis", "max")


def activation_stats(x: jax.Array) -> dict[str, jax.Array] | None:
    """Composer's four statistics of one activation, over its last axis then averaged over the others: the L2 norm,
    the mean (over all values), the kurtosis (``E[(x-m)^4] / Var^2``, not excess) and the max. None for values that
    are not real floating point (Composer skips booleans; its integer outputs would fail in ``vector_norm``).
    Computed in float32 at least."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return None
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    if x.ndim == 0:
        x = x.reshape(1)
    d = x - x.mean(-1, keepdims=True)
    var = (d ** 2).mean(-1)
    return {"l2_norm": jnp.linalg.norm(x, axis=-1).mean(), "average": x.mean(),
            "kurtosis": ((d ** 4).mean(-1) / var ** 2).mean(), "max": x.max(-1).mean()}


def _add(metrics: dict, name: str, suffix: str, value) -> None:
    stats = activation_stats(value)
    if stats is not None:
        for stat, v in stats.items():
            metrics[f"activations/{stat}/{name}{suffix}"] = v


class ActivationMonitor(Callback):
    """Composer's ``ActivationMonitor(interval='25ba', ignore_module_types=None, only_log_wandb=False)``.

    At the end of every ``interval``-th batch (``'Nba'``), or of the first batch of every ``N``-th epoch (``'Nep'``,
    counting from the first), logs for every module of ``state.model``, the root included (named ``''``)::

        activations/{l2_norm,average,kurtosis,max}/<module name>_output.<i>
        activations/{l2_norm,average,kurtosis,max}/<module name>_input.<i>     (torch models)

    Composer's keys and statistics (see :func:`activation_stats`); the module name is its dotted path
    (``named_modules()``'s for a torch model, ``hidden.0`` for an NNX one). ``<i>`` numbers the module's real
    floating-point output arrays (the leaves of what it returns, a lone array being ``_output.0``); integer and
    boolean values are left out, as Composer leaves out booleans. An NNX module's ``__call__`` outputs are its
    outputs; its other public methods' outputs are logged as ``<name>.<method>_output.<i>``; NNX inputs are not
    logged. A module called more than once reports its last call.

    ``ignore_module_types``: modules to leave out, each entry a class (the module and its subclasses are left
    out) or a string, which leaves out modules whose name contains it (Composer's rule: ``['dropout', 'ln']``) or
    whose class is named so (``'Linear'``). ``only_log_wandb``: log to the run's ``WandBLogger`` destinations only
    (to every destination when there is none), as Composer.

    Differences from Composer: the values come from an eval-mode forward of the batch just trained, with the
    weights after its update, at BATCH_END (Composer: the hooks of the train-mode forward of batch
    ``k * interval``, whose weights have taken ``k * interval`` updates, so it also logs before the first update);
    a tensor output is logged whole as ``_output.0`` (Composer enumerates a lone tensor, logging each example of the
    batch as ``_output.<row>``); a sequence inside a sequence is numbered by its flat leaf index rather than by
    ``<name>_<j>`` names. The trainer refuses ``steps_per_execution > 1`` with this callback, which reads the
    weights at each batch's end.

    A torch model (the module, a ``ComposerClassifier`` or a ``ComposerModel``) is run through its bridged program
    (``torch_bridge.activations``); this needs the Trainer's task on the state (``state.task``).
    """

    needs_each_batch_state = True  # the weights at this batch's end (not after a multi-batch call)

    def __init__(self, interval: int | str | Time = "25ba", ignore_module_types: Sequence[type | str] | None = None,
                 only_log_wandb: bool = False):
        self.interval = Time.from_input(interval, TimeUnit.BATCH)
        if self.interval.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH):
            raise ValueError(f"Invalid time unit for parameter interval: {self.interval.unit}")
        if not isinstance(self.interval.value, int) or self.interval.value < 1:
            raise ValueError(f"ActivationMonitor: interval must be a positive number of batches or epochs, "
                             f"got {interval!r}")
        if self.interval.unit == TimeUnit.BATCH and self.interval.value < 10:
            warnings.warn(f"Currently the ActivationMonitor`s interval is set to {self.interval} which is below our "
                          "recommended value of 10ba. We recommend you raise the interval to at least 10ba, as the "
                          "activation monitor adds extra overhead and decreases throughput.")
        ignore = [] if ignore_module_types is None else list(ignore_module_types)
        for entry in ignore:
            if not isinstance(entry, (str, type)):
                raise TypeError(f"ActivationMonitor: ignore_module_types takes classes or strings, got {entry!r}")
        self.ignore_module_types = ignore
        self.only_log_wandb = bool(only_log_wandb)
        self.last_train_time_value_logged = -1
        self._forward: Callable | None = None  # the jitted capture-forward, built at the first due batch
        self._framework: str | None = None

    # ---- which modules ----
    def _ignored(self, name: str, cls: Any) -> bool:
        cls_name = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
        for entry in self.ignore_module_types:
            if isinstance(entry, str):
                if entry in name or entry == cls_name.rsplit(".", 1)[-1]:
                    return True
            elif isinstance(cls, type) and issubclass(cls, entry):
                return True
            elif isinstance(cls, str) and cls in (entry.__name__, f"{entry.__module__}.{entry.__qualname__}"):
                return True
        return False

    # ---- events ----
    def init(self, state, logger) -> None:
        model = state.model
        if isinstance(model, nnx.Module):
            self._framework = "nnx"
        elif adapters.model_adapter(model) is not None:
            adapter = adapters.model_adapter(model)
            if "module_activations" not in adapter.functional:
                raise NotImplementedError(f"ActivationMonitor: the adapter for {type(model).__name__} provides no "
                                          "'module_activations'")
            if getattr(getattr(state, "task", None), "pure", None) is None:
                raise NotImplementedError(
                    f"ActivationMonitor: {type(model).__name__} is a torch model, whose activations come from its "
                    "bridged program, which the callback reaches through the Trainer's task (state.task); this "
                    "Trainer does not put its task on the state")
            self._framework = "torch"
        else:
            raise TypeError(f"ActivationMonitor: state.model must be a flax.nnx.Module or a torch module, got "
                            f"{type(model).__name__}")

    def batch_end(self, state, logger) -> None:
        unit = self.interval.unit
        now = int(state.timestamp.batch) if unit == TimeUnit.BATCH else int(state.timestamp.epoch)
        if now % self.interval.value != 0 or now == self.last_train_time_value_logged:
            return
        self.last_train_time_value_logged = now
        metrics = self.compute(state)
        self._log(metrics, logger, int(state.timestamp.batch))

    # ---- the forward ----
    def compute(self, state) -> dict[str, float]:
        """This batch's statistics as ``{key: float}`` (what ``batch_end`` logs when due)."""
        if self._framework is None:
            self.init(state, None)
        batch = state.batch
        if batch is None:
            raise RuntimeError("ActivationMonitor: state.batch is not set (no batch trained yet)")
        ts = state.train_state
        if self._forward is None:
            self._forward = jax.jit(self._build_nnx(state) if self._framework == "nnx" else self._build_torch(state))
        stats = self._forward(ts.params, ts.model_state, self._inputs(state, batch))
        return {k: float(v) for k, v in jax.device_get(stats).items()}

    def _inputs(self, state, batch):
        if self._framework == "torch":
            return batch  # the task picks the model's inputs, as in the step
        task = getattr(state, "task", None)
        if task is not None and hasattr(task, "model_inputs"):
            return task.model_inputs(batch)
        if not hasattr(batch, "keys") or "input" not in batch:
            keys = sorted(batch) if hasattr(batch, "keys") else type(batch).__name__
            raise ValueError(f"ActivationMonitor: the model's inputs are taken from batch['input'], and this batch "
                             f"has no 'input' entry (it has {keys}); the Trainer's task, which knows where the "
                             "inputs are, is not on the state (state.task)")
        return batch["input"]

    def _build_nnx(self, state) -> Callable:
        graphdef, _, _ = nnx.split(state.model, nnx.Param, ...)
        types = {".".join(map(str, path)): type(m) for path, m in nnx.iter_modules(state.model)}
        skip = {name for name, cls in types.items() if self._ignored(name, cls)}

        def run(params, rest, inputs):
            live = nnx.merge(graphdef, params, rest, copy=True)
            _, captured = nnx.capture(live, nnx.Intermediate, method_outputs=nnx.Intermediate)(
                inputs, train=False, key=None)
            metrics: dict = {}
            for path, value in nnx.to_flat_state(captured):
                *module_path, method = path
                name = ".".join(map(str, module_path))
                if name in skip:
                    continue
                calls = value.get_value() if hasattr(value, "get_value") else value.value
                last = calls[-1] if isinstance(calls, tuple) and calls else calls
                label = name if method == "__call__" else f"{name}.{method}" if name else str(method)
                for i, leaf in enumerate(jax.tree_util.tree_leaves(last)):
                    _add(metrics, label, f"_output.{i}", leaf)
            return metrics

        return run

    def _build_torch(self, state) -> Callable:
        task = state.task
        pure = task.pure
        bridged = pure.bridged
        activations = adapters.model_adapter(state.model).functional["module_activations"]

        def user_name(path: str) -> str:  # the bridged module's path as state.model names it
            return task.user_param_name(f"{path}.\0" if path else "\0").removesuffix("\0").removesuffix(".")

        def run(params, buffers, batch):
            found = []

            def apply(params, buffers, inputs, *, train: bool, key=None):
                args = inputs if isinstance(inputs, tuple) else (inputs,)
                found.append(activations(bridged, params, buffers, *args, train=train, key=key))
                return None, buffers

            shadow = copy.copy(task)  # the task's own forward picks the inputs from the batch
            shadow.pure = dataclasses.replace(pure, apply=apply)
            shadow.forward(params, buffers, batch, train=False)
            metrics: dict = {}
            for path, acts in found[-1].items():
                name = user_name(path)
                if self._ignored(name, acts.module_type):
                    continue
                for group, values in (("input", acts.inputs), ("output", acts.outputs)):
                    for i, value in enumerate(values):
                        _add(metrics, name, f"_{group}.{i}", value)
            return metrics

        return run

    def _log(self, metrics: dict, logger, step: int) -> None:
        if self.only_log_wandb:
            from jaxcomposer.loggers.wandb import WandBLogger
            wandb = [d for d in getattr(logger, "destinations", []) if isinstance(d, WandBLogger)]
            if wandb:
                for destination in wandb:
                    destination.log_metrics(metrics, step)
                return
        logger.log_metrics(metrics)
