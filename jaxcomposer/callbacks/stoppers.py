"""Stopping callbacks with Composer's constructor signatures: ``EarlyStopper`` and ``ThresholdStopper``.

Both read a metric either from an evaluation (``state.eval_metrics[label][monitor]`` at EVAL_END) or, for the label
``'train'``, from the step outputs (``state.batch_metrics[monitor]``). They ask the trainer to stop through
``state.stop_training(reason)``; the reason names the metric and values so the run's summary says why it ended.
"""
from __future__ import annotations

import math
import operator
import warnings
from typing import Any, Callable

from jaxcomposer.core.events import Callback
from jaxcomposer.core.time import Time, TimeUnit

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
        return comp
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
    """Stops when ``monitor`` has not improved on its best by more than ``min_delta`` for ``patience``.

    ``patience`` as an int counts consecutive non-improving readings (evaluations, or batches for 'train'): the stop
    comes at exactly the ``patience``-th one. (Composer reads an int as epochs.) As a ``Time`` or string in 'ep' or
    'ba', it is Composer's rule: stop once more than ``patience`` has elapsed since the best reading.
    """

    def __init__(self, monitor: str, dataloader_label: str = "eval", comp: str | Callable | None = None,
                 min_delta: float = 0.0, patience: int | str | Time = 1):
        super().__init__(monitor, dataloader_label)
        self.comp = infer_comp(monitor, comp)
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not math.isfinite(min_delta):
            raise ValueError(f"min_delta must be a finite number, got {min_delta!r}.")
        self.min_delta = abs(float(min_delta))  # Composer takes abs() too
        if isinstance(patience, bool):
            raise ValueError(f"patience must be an int >= 1 or a time string like '2ep', got {patience!r}.")
        if isinstance(patience, int):
            if patience < 1:
                raise ValueError(f"patience must be >= 1 evaluations, got {patience}.")
        elif isinstance(patience, (str, Time)):
            patience = Time.from_input(patience)
            if patience.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH) or patience.value < 0:
                raise ValueError(f"patience as a time must be non-negative in 'ep' or 'ba', got "
                                 f"{patience.to_timestring()!r}.")
        else:
            raise ValueError(f"patience must be an int >= 1 or a time string like '2ep', got {patience!r}.")
        self.patience = patience
        self.best: float | None = None
        self.best_step: int | None = None
        self._best_time = None
        self.bad_readings = 0

    def _improved(self, value: float) -> bool:
        better = operator.gt if self.comp == "greater" else operator.lt if self.comp == "less" else self.comp
        return bool(better(value, self.best)) and abs(value - self.best) > self.min_delta

    def _update(self, state, value: float) -> None:
        ts = state.timestamp
        if self.best is None or (math.isnan(self.best) and not math.isnan(value)) or self._improved(value):
            self.best, self.best_step, self._best_time, self.bad_readings = value, ts.batch, ts, 0
            return
        self.bad_readings += 1
        if isinstance(self.patience, int):
            stop = self.bad_readings >= self.patience
            waited = f"{self.bad_readings} evaluations"
        else:
            unit = self.patience.unit
            elapsed = ts.get(unit).value - self._best_time.get(unit).value
            stop = elapsed > self.patience.value
            waited = f"{elapsed}{unit.value}"
        if stop:
            state.stop_training(
                f"EarlyStopper: {self._name} did not improve on its best {self.best:.6g} (step {self.best_step}) "
                f"by more than min_delta={self.min_delta:g} for {waited} (patience "
                f"{self.patience if isinstance(self.patience, int) else self.patience.to_timestring()}); "
                f"last value {value:.6g}.")

    def eval_end(self, state, logger) -> None:
        if self.dataloader_label != TRAIN_LABEL:
            value = self._read_eval(state)
            if value is not None:
                self._update(state, value)

    def batch_end(self, state, logger) -> None:
        if self.dataloader_label == TRAIN_LABEL:
            self._update(state, self._read_train(state))


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
