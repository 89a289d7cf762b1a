"""``ConsoleLogger``: one line per evaluation and a summary at FIT_END, for logs that outlive the progress bar.

The per-batch loss is left to the progress bar; what people look for in a job log is how evaluation went and why
and when the run ended.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Mapping, TextIO

from jaxcomposer.loggers.logger import LoggerDestination, format_metric

__all__ = ["ConsoleLogger"]

_EVAL_PREFIX = "metrics/"


class ConsoleLogger(LoggerDestination):
    """``stream=None`` means ``sys.stderr`` looked up at print time (so pytest's capture and redirections work)."""

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.perf_counter):
        self.stream = stream
        self._clock = clock
        self._start = None
        self._logged_eval: dict[str, dict[str, float]] = {}
        self._best_accuracy: dict[str, float] = {}

    def _print(self, line: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        from tqdm import tqdm
        tqdm.write(line, file=stream)  # clears and redraws an active progress bar instead of writing into it
        stream.flush()

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        # Eval metrics are already host floats, so converting them here never waits for a training step.
        for key, value in metrics.items():
            if key.startswith(_EVAL_PREFIX):
                label, _, name = key[len(_EVAL_PREFIX):].partition("/")
                if name:
                    self._logged_eval.setdefault(label, {})[name] = float(value)

    def fit_start(self, state, logger) -> None:
        self._start = self._clock()

    def eval_end(self, state, logger) -> None:
        # Prefer what was logged since the last EVAL_END: it names the evaluator that just ran.
        evaluated = self._logged_eval or {k: dict(v) for k, v in state.eval_metrics.items()}
        self._logged_eval = {}
        ts = state.timestamp
        for label, metrics in evaluated.items():
            for name, value in metrics.items():
                if "accuracy" in name.lower() and value == value:  # MulticlassAccuracy, MaskedAccuracy; skip NaN
                    key = f"{label}/{name}"
                    self._best_accuracy[key] = max(value, self._best_accuracy.get(key, value))
            text = "  ".join(f"{name}={format_metric(float(v))}" for name, v in metrics.items())
            self._print(f"[epoch {ts.epoch} batch {ts.batch}] {label}: {text}")

    def fit_end(self, state, logger) -> None:
        ts = state.timestamp
        wall = self._clock() - self._start if self._start is not None else ts.total_wct.total_seconds()
        lines = [f"[fit end] {state.run_name}: {ts.batch} batches, {ts.epoch} epochs, {ts.sample} samples "
                 f"in {wall:.1f}s"]
        for label, metrics in state.eval_metrics.items():
            text = "  ".join(f"{name}={format_metric(float(v))}" for name, v in metrics.items())
            lines.append(f"  final {label}: {text}")
        for key, best in self._best_accuracy.items():
            lines.append(f"  best {key}: {format_metric(best)}")
        if state.stop_reason:
            lines.append(f"  stopped early: {state.stop_reason}")
        self._print("\n".join(lines))
