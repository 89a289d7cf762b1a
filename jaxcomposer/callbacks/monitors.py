"""Monitors: throughput (``SpeedMonitor``), learning rate (``LRMonitor``) and non-finite loss (``NaNMonitor``).

All three run at BATCH_END, once per step, so each is written not to wait for the step just dispatched.
"""
from __future__ import annotations

import collections
import math
import time
from typing import Callable

from jaxcomposer.core.events import Callback
from jaxcomposer.errors import NonFiniteLossError
from jaxcomposer.loggers.logger import is_ready

__all__ = ["SpeedMonitor", "LRMonitor", "NaNMonitor", "NonFiniteLossError"]


class SpeedMonitor(Callback):
    """Logs ``throughput/samples_per_sec`` and ``throughput/batches_per_sec`` (and ``throughput/tokens_per_sec``
    when the timestamp counts tokens) over a sliding window of the last ``window_size`` batches.

    Times are host clock readings at BATCH_END. A single step's host time is only its dispatch time, but averaged over
    a window the host is held back by the device, so the rate is the device's. The first BATCH_END is only the start
    of the window, so the first batch (which includes compilation) never counts. Time spent in evaluation
    (EVAL_START..EVAL_END) is subtracted. Unlike Composer, values are logged as soon as two batches have ended rather
    than once the window is full, so short runs report something.
    """

    def __init__(self, window_size: int = 100, clock: Callable[[], float] = time.perf_counter):
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
            raise ValueError(f"window_size must be an int >= 1, got {window_size!r}.")
        self.window_size = window_size
        self._clock = clock
        self._window: collections.deque = collections.deque(maxlen=window_size + 1)
        self._paused_total = 0.0
        self._pause_start = None

    def _now(self) -> float:
        return self._clock() - self._paused_total

    def fit_start(self, state, logger) -> None:
        self._window.clear()

    def eval_start(self, state, logger) -> None:
        self._pause_start = self._clock()

    def eval_end(self, state, logger) -> None:
        if self._pause_start is not None:
            self._paused_total += self._clock() - self._pause_start
            self._pause_start = None

    def batch_end(self, state, logger) -> None:
        ts = state.timestamp
        self._window.append((self._now(), ts.batch, ts.sample, ts.token))
        if len(self._window) < 2:
            return
        (t0, b0, s0, k0), (t1, b1, s1, k1) = self._window[0], self._window[-1]
        dt = t1 - t0
        if dt <= 0:
            return
        metrics = {"throughput/batches_per_sec": (b1 - b0) / dt, "throughput/samples_per_sec": (s1 - s0) / dt}
        if k1 > k0:
            metrics["throughput/tokens_per_sec"] = (k1 - k0) / dt
        logger.log_metrics(metrics)


class LRMonitor(Callback):
    """Logs ``lr``: ``state.learning_rate`` if it is a number, or ``learning_rate(step)`` if it is a schedule.

    For a schedule it logs the rate the step that just ended used (optax counts from 0, so step ``batch - 1``);
    Composer logs the optimizer's rate after its scheduler stepped, i.e. the next step's rate. Nothing is logged when
    no learning rate is known.
    """

    def batch_end(self, state, logger) -> None:
        lr = state.learning_rate
        if lr is None:
            return
        if callable(lr):
            lr = lr(max(state.timestamp.batch - 1, 0))
        logger.log_metrics({"lr": float(lr)})




class NaNMonitor(Callback):
    """Raises ``NonFiniteLossError`` when ``state.batch_metrics[monitor]`` is NaN or inf (Composer checks only NaN).

    The check waits for at most the step before the one just dispatched (``max_lag`` steps behind), so the device
    keeps a step queued; the error still names the step whose loss was bad. All pending checks finish at EPOCH_END,
    EVAL_START and FIT_END.
    """

    def __init__(self, monitor: str = "loss", max_lag: int = 1):
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"monitor must be a non-empty metric name, got {monitor!r}.")
        if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0:
            raise ValueError(f"max_lag must be an int >= 0, got {max_lag!r}.")
        self.monitor = monitor
        self.max_lag = max_lag
        self._pending: collections.deque = collections.deque()

    def batch_end(self, state, logger) -> None:
        value = state.batch_metrics.get(self.monitor)
        if value is not None:
            self._pending.append((state.timestamp.batch, value))
        self._check(force=False)

    def _check(self, force: bool) -> None:
        while self._pending:
            step, value = self._pending[0]
            if not (force or len(self._pending) > self.max_lag or is_ready(value)):
                return
            self._pending.popleft()
            value = float(value)
            if not math.isfinite(value):
                self._pending.clear()
                raise NonFiniteLossError(
                    f"Training metric '{self.monitor}' is {value} at step {step}. "
                    f"Lower the learning rate, enable gradient clipping or check the data of that batch."
                )

    def epoch_end(self, state, logger) -> None:
        self._check(force=True)

    def eval_start(self, state, logger) -> None:
        self._check(force=True)

    def fit_end(self, state, logger) -> None:
        self._check(force=True)
