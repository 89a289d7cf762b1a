"""``ProgressBarLogger``: one tqdm bar over the training steps, with loss, samples/s and tqdm's ETA.

The loss is read (``float()``, which waits for the step) at most every ``log_interval_s`` seconds, so the bar does not
turn the asynchronous training loop into a synchronous one. The latest evaluation metrics join the postfix.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from jaxcomposer.loggers.logger import LoggerDestination, format_metric

__all__ = ["ProgressBarLogger"]


class ProgressBarLogger(LoggerDestination):
    """``stream`` defaults to ``sys.stderr`` (looked up at FIT_START, so test capture works). With the default stream
    ``tqdm.auto`` is used (a widget in notebooks); with an injected stream, plain text tqdm.
    """

    def __init__(self, log_interval_s: float = 0.5, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        if log_interval_s < 0:
            raise ValueError(f"log_interval_s must be >= 0, got {log_interval_s}.")
        self.log_interval_s = log_interval_s
        self.stream = stream
        self._clock = clock
        self._bar = None
        self._postfix: dict[str, str] = {}
        self._last_read = None  # (clock time, samples) at the last loss read

    def fit_start(self, state, logger) -> None:
        if self.stream is None:
            from tqdm.auto import tqdm
            stream = sys.stderr
        else:
            from tqdm.std import tqdm
            stream = self.stream
        self._bar = tqdm(
            total=state.total_steps or None,
            initial=state.timestamp.batch,
            desc=state.run_name or "train",
            unit="ba",
            file=stream,
            dynamic_ncols=self.stream is None,
            mininterval=min(self.log_interval_s, 0.1),
            leave=True,
        )
        self._last_read = (self._clock(), state.timestamp.sample)

    def batch_end(self, state, logger) -> None:
        if self._bar is None:
            return
        now = self._clock()
        last_t, last_samples = self._last_read
        if now - last_t >= self.log_interval_s:
            loss = state.batch_metrics.get("loss")
            if loss is not None:
                self._postfix["loss"] = format_metric(float(loss))
                # float() waited for the step: take the time after it, or the wait lands in the next window
                # (which then holds one batch) and the rate alternates between far too high and far too low.
                now = self._clock()
            if now > last_t and state.timestamp.sample > last_samples:
                self._postfix["samples/s"] = f"{(state.timestamp.sample - last_samples) / (now - last_t):.1f}"
            self._last_read = (now, state.timestamp.sample)
            self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.update(state.timestamp.batch - self._bar.n)

    def eval_end(self, state, logger) -> None:
        if self._bar is None:
            return
        for label, metrics in state.eval_metrics.items():
            for name, value in metrics.items():
                self._postfix[f"{label}/{name}"] = format_metric(float(value))
        self._bar.set_postfix(self._postfix)
        # Eval time is not training throughput: restart the samples/s window after it.
        self._last_read = (self._clock(), state.timestamp.sample)

    def fit_end(self, state, logger) -> None:
        if self._bar is None:
            return
        loss = state.batch_metrics.get("loss")
        if loss is not None:
            self._postfix["loss"] = format_metric(float(loss))
        self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.update(state.timestamp.batch - self._bar.n)
        self._bar.close()
        self._bar = None

    def close(self, state, logger) -> None:
        if self._bar is not None:  # the run failed before FIT_END
            self._bar.close()
            self._bar = None
