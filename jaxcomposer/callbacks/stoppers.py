"""Stopping callbacks with Composer's constructor signatures: ``EarlyStopper`` and ``ThresholdStopper``.

Both read a metric either from an evaluation (``state.eval_metrics[label][monitor]`` at EVAL_END) or, for the label
``'train'``, from the step outputs (``state.batch_metrics[monitor]``). They ask the trainer to stop through
``state.stop_training(reason)``; the reason names the metric and values so the run's summary says why it ended.
"""
from __future__ import annotations

import collections
import math
import operator
import warnings
from typing import Any, Callable

import numpy as np

from jaxcomposer.core import adapters
from jaxcomposer.core.events import Callback
from jaxcomposer.core.time import Time, TimeUnit
from jaxcomposer.loggers.logger import is_ready

__all__ = ["EarlyStopper", "ThresholdStopper", "infer_comp"]

TRAIN_LABEL = "train"
# Composer: less-is-better for monitors whose names contain 'loss', 'error' or 'perplexity'; we add a few more, among
# them its own CrossEntropy/LanguageCrossEntropy metrics (which Composer's rule would read as greater-is-better).
_LOWER_IS_BETTER = ("loss", "error", "perplexity", "cross_entropy", "crossentropy", "nll", "mse", "mae")
_COMP_NAMES = {"greater": "greater", "gt": "greater", "less": "less", "lt": "less"}


def infer_comp(monitor: str, comp: str | Callable | None) -> str | Callable:
    """'greater', 'less' or the user's callable. ``None`` infers from the metric name, as Composer does."""
    if comp is None:
        return "less" if any(s in monitor.lower() for s in _LOWER_IS_BETTER) else "greater"
    if callable(comp):
        adapter = adapters.function_adapter(comp)
        if adapter is None or adapter.from_array is None:
            return comp
        # Composer hands comp its metric tensors (comp=torch.less): the framework's function gets its own arrays
        as_array = lambda v: adapter.from_array(None, np.asarray(v, np.float32))  # noqa: E731
        return lambda value, reference: comp(as_array(value), as_array(reference))
    if isinstance(comp, str) and comp.lower() in _COMP_NAMES:
        return _COMP_NAMES[comp.lower()]
    raise ValueError(f"comp must be None, 'greater'/'gt', 'less'/'lt' or a callable (a, b) -> bool, got {comp!r}.")


def _check_names(monitor: Any, dataloader_label: Any) -> None:
    if not isinstance(monitor, str) or not monitor:
        raise ValueError(f"monitor must be a non-empty metric name such as 'MulticlassAccuracy', got {monitor!r}.")
    if not isinstance(dataloader_label, str) or not dataloader_label:
        raise ValueError(f"dataloader_label must be a non-empty evaluator label or 'train', got {dataloader_label!r}.")


class _MetricReader(Callback):
    """Reads ``monitor`` once per new value: one evaluation of ``dataloader_label``, or one batch for 'train'."""

    def __init__(self, monitor: str, dataloader_label: str):
        _check_names(monitor, dataloader_label)
        self.monitor = monitor
        self.dataloader_label = dataloader_label
        self._last_eval = None  # the dict read last; a new evaluation assigns a new one
        self._seen = False

    @property
    def _name(self) -> str:
        return f"{self.dataloader_label}/{self.monitor}"

    def _read_train(self, state) -> float:
        if self.monitor not in state.batch_metrics:
            raise ValueError(f"{type(self).__name__}: '{self.monitor}' is not among the step outputs "
                             f"{sorted(state.batch_metrics)} (dataloader_label='train').")
        return float(state.batch_metrics[self.monitor])

    def _read_eval(self, state) -> float | None:
        """The new evaluation's value, or None when EVAL_END belongs to another evaluator or was already read."""
        metrics = state.eval_metrics.get(self.dataloader_label)
        if metrics is None or metrics is self._last_eval:
            return None
        self._last_eval, self._seen = metrics, True
        if self.monitor not in metrics:
            raise ValueError(f"{type(self).__name__}: '{self.monitor}' is not among the metrics of evaluator "
                             f"'{self.dataloader_label}': {sorted(metrics)}.")
        return float(metrics[self.monitor])

    def fit_end(self, state, logger) -> None:
        if self.dataloader_label != TRAIN_LABEL and not self._seen and state.eval_metrics:
            warnings.warn(f"{type(self).__name__} never saw an evaluation labelled '{self.dataloader_label}'; "
                          f"labels evaluated: {sorted(state.eval_metrics)}.", stacklevel=2)


class EarlyStopper(_MetricReader):
    """Composer's ``EarlyStopper``: stops when ``monitor`` has not improved on its best by more than ``min_delta``
    for longer than ``patience``.

    ``patience`` is a time in epochs or batches; an int is epochs, as in Composer (``patience=1`` is ``'1ep'``).
    The rule is Composer's: after each reading, stop once more than ``patience`` has elapsed since the reading that
    set the best (``epoch - best_epoch > patience``), so with one evaluation per epoch ``patience=1`` stops at the
    second evaluation without improvement.

    Readings: every evaluation of ``dataloader_label`` (at EVAL_END); for ``'train'``, the step output ``monitor``
    at every EPOCH_END, and at every BATCH_END too when ``patience`` is in batches. Per-batch readings do not make
    the host wait for the step: a value is read once the device has computed it, at most one batch later (the stop
    then comes at most one batch after Composer's).
    """

    def __init__(self, monitor: str, dataloader_label: str = "eval", comp: str | Callable | None = None,
                 min_delta: float = 0.0, patience: int | str | Time = 1):
        super().__init__(monitor, dataloader_label)
        self.comp = infer_comp(monitor, comp)
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not math.isfinite(min_delta):
            raise ValueError(f"min_delta must be a finite number, got {min_delta!r}.")
        self.min_delta = abs(float(min_delta))  # Composer takes abs() too
        if isinstance(patience, bool) or not isinstance(patience, (int, str, Time)):
            raise ValueError(f"patience must be an int of epochs >= 0 or a time like '2ep' or '100ba', got "
                             f"{patience!r}.")
        patience = Time.from_input(patience, TimeUnit.EPOCH)
        if patience.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH) or patience.value < 0:
            raise ValueError(f"patience must be a non-negative time in 'ep' or 'ba' (an int is epochs), got "
                             f"{patience.to_timestring()!r}.")
        self.patience = patience
        self.best: float | None = None
        self.best_step: int | None = None
        self._best_time = None
        self.bad_readings = 0
        self._train_readings: collections.deque = collections.deque()  # (timestamp, device value) not yet read

    def _improved(self, value: float) -> bool:
        better = operator.gt if self.comp == "greater" else operator.lt if self.comp == "less" else self.comp
        return bool(better(value, self.best)) and abs(value - self.best) > self.min_delta

    def _update(self, state, ts, value: float) -> None:
        if self.best is None or (math.isnan(self.best) and not math.isnan(value)) or self._improved(value):
            self.best, self.best_step, self._best_time, self.bad_readings = value, ts.batch, ts, 0
            return
        self.bad_readings += 1
        unit = self.patience.unit
        elapsed = ts.get(unit).value - self._best_time.get(unit).value
        if elapsed > self.patience.value:
            state.stop_training(
                f"EarlyStopper: {self._name} did not improve on its best {self.best:.6g} (step {self.best_step}) "
                f"by more than min_delta={self.min_delta:g} for {elapsed}{unit.value} (patience "
                f"{self.patience.to_timestring()}); last value {value:.6g}.")

    def _read_queued(self, state, force: bool) -> None:
        while self._train_readings and not state.stop_requested:
            ts, value = self._train_readings[0]
            if not (force or len(self._train_readings) > 1 or is_ready(value)):
                return
            self._train_readings.popleft()
            self._update(state, ts, float(value))

    def eval_end(self, state, logger) -> None:
        if self.dataloader_label != TRAIN_LABEL:
            value = self._read_eval(state)
            if value is not None:
                self._update(state, state.timestamp, value)

    def batch_end(self, state, logger) -> None:
        if self.dataloader_label == TRAIN_LABEL and self.patience.unit == TimeUnit.BATCH:
            if self.monitor not in state.batch_metrics:
                self._read_train(state)  # raises, naming the step outputs there are
            self._train_readings.append((state.timestamp, state.batch_metrics[self.monitor]))
            self._read_queued(state, force=False)

    def epoch_end(self, state, logger) -> None:
        if self.dataloader_label != TRAIN_LABEL:
            return
        if self.patience.unit == TimeUnit.BATCH:
            self._read_queued(state, force=True)
        else:
            self._update(state, state.timestamp, self._read_train(state))

    def fit_end(self, state, logger) -> None:
        self._read_queued(state, force=True)
        super().fit_end(state, logger)


class ThresholdStopper(_MetricReader):
    """Stops at the first reading that reaches ``threshold`` (inclusive: ``>=`` for 'greater', ``<=`` for 'less';
    Composer compares strictly). A callable ``comp(value, threshold)`` decides by itself.

    For 'train' the step outputs are read at every BATCH_END when ``stop_on_batch`` is set, otherwise at EPOCH_END.
    """

    def __init__(self, monitor: str, dataloader_label: str = "eval", threshold: float | None = None,
                 comp: str | Callable | None = None, stop_on_batch: bool = False):
        super().__init__(monitor, dataloader_label)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or math.isnan(threshold):
            raise ValueError(f"threshold is required and must be a number, got {threshold!r}.")
        self.threshold = float(threshold)
        self.comp = infer_comp(monitor, comp)
        self.stop_on_batch = bool(stop_on_batch)

    def _reached(self, value: float) -> bool:
        if self.comp == "greater":
            return value >= self.threshold
        if self.comp == "less":
            return value <= self.threshold
        return bool(self.comp(value, self.threshold))

    def _check(self, state, value: float) -> None:
        if self._reached(value):
            state.stop_training(f"ThresholdStopper: {self._name}={value:.6g} reached the threshold "
                                f"{self.threshold:g} at step {state.timestamp.batch}.")

    def eval_end(self, state, logger) -> None:
        if self.dataloader_label != TRAIN_LABEL:
            value = self._read_eval(state)
            if value is not None:
                self._check(state, value)

    def batch_end(self, state, logger) -> None:
        if self.dataloader_label == TRAIN_LABEL and self.stop_on_batch:
            self._check(state, self._read_train(state))

    def epoch_end(self, state, logger) -> None:
        if self.dataloader_label == TRAIN_LABEL and not self.stop_on_batch:
            self._check(state, self._read_train(state))
