"""``RuntimeEstimator``: Composer's estimate of the training time left, ``time/remaining_estimate``."""
from __future__ import annotations

import time
import warnings
from typing import Callable

from jaxcomposer.core.events import Callback
from jaxcomposer.core.time import TimeUnit

__all__ = ["RuntimeEstimator"]

_DIVIDERS = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}


class RuntimeEstimator(Callback):
    """Composer's ``RuntimeEstimator(skip_batches=1, time_unit='hours')``.

    Logs ``time/remaining_estimate`` (in ``time_unit``) at every BATCH_END once the clock has started, and the
    hyperparameter ``time/remaining_estimate_unit`` at INIT. The estimate is Composer's: the training time per
    unit of progress since the clock started (evaluations excluded), times the progress left, plus, for each
    evaluator, its mean evaluation time (the first one left out when there are several: it pays for compilation)
    times the evaluations still to come at the rate seen so far.

    The clock starts at the BATCH_START after ``skip_batches`` batches have ended, so the first batches (which
    compile the step) do not count. Progress is the fraction of ``max_duration`` done, counted in batches when
    ``max_duration`` is in epochs (so it moves within an epoch). Host clock readings: averaged over batches, the host
    is held back by the device, so the rate is the device's; nothing waits for the device.

    Evaluations are told apart by the label whose ``state.eval_metrics`` entry changed at EVAL_END.
    """

    def __init__(self, skip_batches: int = 1, time_unit: str = "hours", *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if isinstance(skip_batches, bool) or not isinstance(skip_batches, int) or skip_batches < 0:
            raise ValueError(f"RuntimeEstimator: skip_batches must be an int >= 0, got {skip_batches!r}.")
        if time_unit not in _DIVIDERS:
            raise ValueError(f'Invalid time_unit: {time_unit}. Must be one of "seconds", "minutes", "hours", or '
                             f'"days".')
        self.batches_left_to_skip = skip_batches
        self.time_unit = time_unit
        self.divider = _DIVIDERS[time_unit]
        self._clock = clock
        self._enabled = True
        self.start_time: float | None = None
        self.start_dur: float | None = None
        self.total_eval_wct = 0.0
        self.eval_wct_per_label: dict[str, list[float]] = {}
        self.eval_frequency_per_label: dict[str, float] = {}
        self._eval_start: float | None = None
        self._seen_eval: dict[str, dict] = {}  # label -> the metrics dict read last (a new evaluation makes a new one)

    def _elapsed_fraction(self, state) -> float | None:
        max_duration = state.max_duration
        if max_duration is None:
            return None
        ts = state.timestamp
        if max_duration.unit == TimeUnit.EPOCH:
            per_epoch = (ts.batch - ts.batch_in_epoch) / ts.epoch if ts.epoch >= 1 else state.steps_per_epoch
            if per_epoch:
                return ts.batch / (max_duration.value * per_epoch)
        return state.elapsed_fraction()

    def init(self, state, logger) -> None:
        logger.log_hyperparameters({"time/remaining_estimate_unit": self.time_unit})

    def batch_start(self, state, logger) -> None:
        if self._enabled and self.start_time is None and self.batches_left_to_skip == 0:
            self.start_dur = self._elapsed_fraction(state)
            if self.start_dur is None:
                warnings.warn("RuntimeEstimator: max_duration is not set, so the remaining time cannot be "
                              "estimated.", stacklevel=2)
                self._enabled = False
                return
            self.start_time = self._clock()

    def batch_end(self, state, logger) -> None:
        if not self._enabled:
            return
        if self.batches_left_to_skip > 0:
            self.batches_left_to_skip -= 1
            return
        if self.start_time is None:
            return
        elapsed_dur = self._elapsed_fraction(state)
        if elapsed_dur is None or elapsed_dur <= self.start_dur:
            return
        train_time = self._clock() - self.start_time - self.total_eval_wct
        remaining = train_time / (elapsed_dur - self.start_dur) * (1.0 - elapsed_dur)
        for label, times in self.eval_wct_per_label.items():
            mean = sum(times[1:]) / (len(times) - 1) if len(times) > 1 else times[0]
            evals_total = (1.0 - self.start_dur) / self.eval_frequency_per_label[label]
            remaining += mean * (evals_total - len(times))
        logger.log_metrics({"time/remaining_estimate": remaining / self.divider})

    def eval_start(self, state, logger) -> None:
        self._eval_start = self._clock()

    def eval_end(self, state, logger) -> None:
        started, self._eval_start = self._eval_start, None
        if not self._enabled or self.start_time is None or started is None:
            return  # evaluations before the clock starts are not part of the estimate, as in Composer
        seconds = self._clock() - started
        self.total_eval_wct += seconds
        label = self._evaluated_label(state)
        times = self.eval_wct_per_label.setdefault(label, [])
        times.append(seconds)
        elapsed = self._elapsed_fraction(state)
        if elapsed is not None:
            self.eval_frequency_per_label[label] = max(elapsed - self.start_dur, 1e-12) / len(times)

    def _evaluated_label(self, state) -> str:
        for label, metrics in state.eval_metrics.items():
            if self._seen_eval.get(label) is not metrics:
                self._seen_eval[label] = metrics
                return label
        return "eval"
