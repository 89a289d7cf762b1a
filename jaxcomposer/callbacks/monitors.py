"""Monitors: throughput (``SpeedMonitor``), learning rate (``LRMonitor``) and non-finite loss (``NaNMonitor``).

All three run at BATCH_END, once per step, so each is written not to wait for the step just dispatched.
"""
from __future__ import annotations

import collections
import math
import time
from typing import Any, Callable

from jaxcomposer.core.events import Callback
from jaxcomposer.errors import NonFiniteLossError
from jaxcomposer.loggers.logger import is_ready

__all__ = ["SpeedMonitor", "LRMonitor", "NaNMonitor", "NonFiniteLossError", "optimizer_name"]


class SpeedMonitor(Callback):
    """Logs ``throughput/samples_per_sec`` and ``throughput/batches_per_sec`` (and ``throughput/tokens_per_sec``
    when the timestamp counts tokens) over a sliding window of the last ``window_size`` batches.

    Every batch it also logs Composer's ``wall_clock/train`` (the fit's wall-clock time so far, evaluations left
    out), ``wall_clock/val`` (time spent evaluating) and ``wall_clock/total`` (their sum), in seconds.

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
        self._eval_total = 0.0  # Composer's wall_clock/val: not reset by fit_start, as Composer's is not

    def _now(self) -> float:
        return self._clock() - self._paused_total

    def fit_start(self, state, logger) -> None:
        self._window.clear()

    def eval_start(self, state, logger) -> None:
        self._pause_start = self._clock()

    def eval_end(self, state, logger) -> None:
        if self._pause_start is not None:
            spent = self._clock() - self._pause_start
            self._paused_total += spent
            self._eval_total += spent
            self._pause_start = None

    def batch_end(self, state, logger) -> None:
        ts = state.timestamp
        # the timestamp's clock runs through evaluations too (they happen between two batches' ends)
        train = max(ts.total_wct.total_seconds() - self._eval_total, 0.0)
        logger.log_metrics({"wall_clock/train": train, "wall_clock/val": self._eval_total,
                            "wall_clock/total": train + self._eval_total})
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
    """Logs the learning rate at every BATCH_END under Composer's key ``lr-<OptimizerName>/group<i>``.

    The optimizers are read from ``state.optimizers`` (a list, as Composer's State); each one's name is its class
    name, or for one of ``jaxcomposer.optim``'s factories (``DecoupledSGDW(...)`` returns an optax transformation)
    the factory's name, so ``DecoupledSGDW`` logs ``lr-DecoupledSGDW/group0``. An optimizer with ``param_groups``
    (a torch optimizer) logs each group's ``'lr'``; any other has one group whose rate is ``state.learning_rate``.

    Without ``state.optimizers`` the key is ``lr``. ``state.learning_rate`` is a number or a schedule
    ``step -> lr``; for a schedule it logs the rate the step that just ended used (optax counts from 0, so step
    ``batch - 1``), where Composer logs the optimizer's rate after its scheduler stepped, i.e. the next step's.
    Nothing is logged when no learning rate is known. The schedule is read from a host table (the trainer's), so
    this never waits for the device.
    """

    def __init__(self) -> None:
        self._names: tuple | None = None  # (the optimizer list, its keys): keys are built once per list

    def _rate(self, state) -> float | None:
        lr = state.learning_rate
        if callable(lr):
            lr = lr(max(state.timestamp.batch - 1, 0))
        return None if lr is None else float(lr)

    def _keys(self, optimizers) -> list[tuple[Any, list[str]]]:
        keyed = []
        for opt in optimizers:
            groups = getattr(opt, "param_groups", None)
            n = len(groups) if isinstance(groups, (list, tuple)) and groups else 1
            name = optimizer_name(opt)
            keyed.append((opt, [f"lr-{name}/group{i}" for i in range(n)]))
        return keyed

    def batch_end(self, state, logger) -> None:
        optimizers = getattr(state, "optimizers", None)
        if not optimizers:
            lr = self._rate(state)
            if lr is not None:
                logger.log_metrics({"lr": lr})
            return
        if self._names is None or self._names[0] is not optimizers:
            self._names = (optimizers, self._keys(optimizers))
        metrics = {}
        for opt, keys in self._names[1]:
            groups = getattr(opt, "param_groups", None)
            if isinstance(groups, (list, tuple)) and groups and "lr" in groups[0]:
                metrics.update({key: float(group["lr"]) for key, group in zip(keys, groups)})
            else:
                lr = self._rate(state)
                if lr is not None:
                    metrics[keys[0]] = lr
        if metrics:
            logger.log_metrics(metrics)


def optimizer_name(opt: Any) -> str:
    """``type(opt).__name__``, except for an optax transformation made by a factory of ours (``DecoupledSGDW``),
    whose type is a generic container: there, the factory's name, found in the qualname of its ``update``. An
    ``opt.name`` string wins over both."""
    explicit = getattr(opt, "name", None)
    if isinstance(explicit, str) and explicit:
        return explicit
    update = getattr(opt, "update", None)
    qualname = getattr(update, "__qualname__", "")
    if "<locals>" in qualname and getattr(update, "__module__", "").startswith("jaxcomposer."):
        return qualname.split(".", 1)[0]
    return type(opt).__name__


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
